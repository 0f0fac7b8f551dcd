"""A lease taken from its holder for real: deleted from every master the moment the job
holds it (its fencing token recorded on the run), as when all masters restart empty."""

from __future__ import annotations

import time
from typing import Any

from django.db import connection

from dashboard.locks import leases
from dashboard.models import JobRun
from tests.support.checked_threads import CheckedThread
from workers.runtime.redis_server import RedisNode


def steal_when_held(
    key: str, nodes: list[RedisNode], seen: dict[str, Any] | None = None, *, timeout: float = 30
) -> CheckedThread:
    """Start a thread that waits (up to ``timeout``) until a job holds ``key`` with its
    token, records the holder in ``seen["holder"]`` and deletes the key everywhere; the
    job's heartbeat must then notice the loss. ``join()`` the thread after the job (it
    raises what the thief raised).

    "Holds" is what the job records once ``acquire`` returned (``runs.record_lock``: the
    run's ``lock_key`` and ``token``), not a token seen on the masters. Race: the token
    is written into the masters' values during ``acquire`` (the fencing confirmation),
    one master before the others; ``inspect`` already shows it from the first. Stolen
    then, the confirmation failed on the other two, ``acquire`` retried with a fresh
    attempt nobody took away, and the job ran to the end under a lease it never lost
    (seen under load: the test's lost lock was never lost). Once the run names the
    token, ``acquire`` has returned and only the heartbeat can find the lease gone.
    """
    found = seen if seen is not None else {}

    def held() -> dict[str, Any] | None:
        token = (
            JobRun.objects.filter(lock_key=key, token__isnull=False)
            .values_list("token", flat=True)
            .first()
        )
        info = leases.redlock().inspect(key) if token is not None else None
        if info and info["holder"].get("token") == token:
            return dict(info["holder"])
        return None

    def steal() -> None:
        try:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                holder = held()
                if holder is not None:
                    found["holder"] = holder
                    for node in nodes:
                        node.client().delete(key)
                    return
                time.sleep(0.01)
        finally:
            connection.close()  # this thread's own database connection

    thief = CheckedThread(target=steal, name=f"steal {key}")
    thief.start()
    return thief
