"""A lease taken from its holder for real: deleted from every master the moment the job
holds it (its fencing token tagged in), as when all masters restart empty."""

from __future__ import annotations

import time
from typing import Any

from dashboard import leases
from tests.threads import CheckedThread
from workers.redisnode import RedisNode


def steal_when_held(
    key: str, nodes: list[RedisNode], seen: dict[str, Any] | None = None, *, timeout: float = 30
) -> CheckedThread:
    """Start a thread that waits (up to ``timeout``) until a job holds ``key`` with its
    token, records the holder in ``seen["holder"]`` and deletes the key everywhere; the
    job's heartbeat must then notice the loss. ``join()`` the thread after the job (it
    raises what the thief raised)."""
    found = seen if seen is not None else {}

    def steal() -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = leases.redlock().inspect(key)
            # The token is tagged into the value right after quorum: wait for it.
            if info and info["holder"].get("token") is not None:
                found["holder"] = info["holder"]
                for node in nodes:
                    node.client().delete(key)
                return
            time.sleep(0.01)

    thief = CheckedThread(target=steal, name=f"steal {key}")
    thief.start()
    return thief
