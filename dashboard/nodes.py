"""Health of the configured Redis masters (the lock quorum and the queue server)."""

from __future__ import annotations

import time
from typing import Any

import redis

from dashboard import queues


def redis_nodes() -> list[dict[str, Any]]:
    """Ping every master with a short timeout: ``{url, up, latency_ms | error}``."""
    nodes = []
    for url in queues.redis_urls():
        client = redis.Redis.from_url(url, socket_connect_timeout=0.3, socket_timeout=0.3)
        start = time.perf_counter()
        try:
            client.ping()
            latency = round((time.perf_counter() - start) * 1000, 2)
            nodes.append({"url": safe_url(url), "up": True, "latency_ms": latency})
        except redis.RedisError as exc:
            nodes.append({"url": safe_url(url), "up": False, "error": type(exc).__name__})
        finally:
            client.close()
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
