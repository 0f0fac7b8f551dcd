"""Health of the configured Redis masters (the lock quorum and the queue server)."""

from __future__ import annotations

import time
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from dashboard import infra

#: One pinging client per master URL, kept for the process: the operations snapshot
#: pings every master each time it is built (about once a second per host), and a
#: fresh client paid a TCP connect and a two-command handshake per master per build.
#: Race: two threads may both create a URL's client; one is kept, the other is
#: garbage (a redis-py client is safe to share between threads).
_CLIENTS: dict[str, redis.Redis] = {}


def _client(url: str) -> redis.Redis:
    client = _CLIENTS.get(url)
    if client is None:
        client = _CLIENTS.setdefault(
            url,
            redis.Redis.from_url(
                url,
                socket_connect_timeout=0.3,
                socket_timeout=0.3,
                # One try: a master that does not answer is down for this ping, with
                # no silent reconnect loop hiding it (the next ping connects again).
                retry=Retry(NoBackoff(), 0),
            ),
        )
    return client


def redis_nodes() -> list[dict[str, Any]]:
    """Ping every master with a short timeout: ``{url, up, latency_ms | error}``."""
    nodes = []
    for url in infra.redis_urls():
        client = _client(url)
        start = time.perf_counter()
        try:
            client.ping()
            latency = round((time.perf_counter() - start) * 1000, 2)
            nodes.append({"url": safe_url(url), "up": True, "latency_ms": latency})
        except redis.RedisError as exc:
            # Drop the pool's broken connections so the next ping starts clean.
            client.connection_pool.disconnect()
            nodes.append({"url": safe_url(url), "up": False, "error": type(exc).__name__})
    return nodes


def safe_url(url: str) -> str:
    """A Redis URL without its password."""
    if "@" in url:
        scheme, _, rest = url.partition("://")
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url


def quorum(nodes: list[dict[str, Any]]) -> dict[str, Any]:
    """ok (every master up), at_risk (a majority up) or lost (no majority)."""
    up = sum(1 for n in nodes if n["up"])
    needed = len(nodes) // 2 + 1
    state = "ok" if up == len(nodes) else "at_risk" if up >= needed else "lost"
    return {"up": up, "total": len(nodes), "needed": needed, "state": state}
