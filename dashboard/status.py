"""The system snapshot behind ``GET /api/status`` and the overview page."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import redis
from rq import Queue, Worker
from rq.registry import FailedJobRegistry, StartedJobRegistry

from dashboard import queues
from dashboard.models import JobRun
from dashboard.repositories import current_fingerprint
from workers.analyzer import queue_name


def redis_nodes() -> list[dict[str, Any]]:
    nodes = []
    for url in queues.redis_urls():
        client = redis.Redis.from_url(url, socket_connect_timeout=0.3, socket_timeout=0.3)
        start = time.perf_counter()
        try:
            client.ping()
            nodes.append(
                {
                    "url": _safe_url(url),
                    "up": True,
                    "latency_ms": round((time.perf_counter() - start) * 1000, 2),
                }
            )
        except redis.RedisError as exc:
            nodes.append({"url": _safe_url(url), "up": False, "error": type(exc).__name__})
        finally:
            client.close()
    return nodes


def _safe_url(url: str) -> str:
    """Redis URL without its password."""
    if "@" in url:
        scheme, _, rest = url.partition("://")
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url


def queue_stats(name: str) -> dict[str, Any]:
    conn = queues.connection()
    q = Queue(name, connection=conn)
    oldest_age = None
    first = q.get_job_ids(0, 0)
    if first:
        job = q.fetch_job(first[0])
        if job is not None and job.enqueued_at is not None:
            enq = (
                job.enqueued_at.replace(tzinfo=UTC)
                if job.enqueued_at.tzinfo is None
                else job.enqueued_at
            )
            oldest_age = round((datetime.now(UTC) - enq).total_seconds(), 1)
    return {
        "name": name,
        "backlog": q.count,
        "running": StartedJobRegistry(name, connection=conn).count,
        "failed": FailedJobRegistry(name, connection=conn).count,
        "oldest_age_s": oldest_age,
    }


def workers() -> list[dict[str, Any]]:
    out = []
    for w in Worker.all(connection=queues.connection()):
        job = w.get_current_job()
        out.append(
            {
                "name": w.name,
                "host": w.hostname,
                "pid": w.pid,
                "state": w.get_state(),
                "queues": w.queue_names(),
                "current_job": job.id if job else None,
                "last_heartbeat": w.last_heartbeat.isoformat() if w.last_heartbeat else None,
            }
        )
    return out


def snapshot() -> dict[str, Any]:
    fp = current_fingerprint()
    nodes = redis_nodes()
    up = sum(1 for n in nodes if n["up"])
    try:
        locks = queues.redlock().list_locks("locks:")
    except Exception as exc:  # a lock listing must never take the status page down
        locks = [{"error": type(exc).__name__}]
    return {
        "redis_nodes": nodes,
        "quorum": {"up": up, "total": len(nodes), "needed": len(nodes) // 2 + 1},
        "queues": [queue_stats(queues.SYNC_QUEUE), queue_stats(queue_name(fp))],
        "workers": workers(),
        "locks": locks,
        "dlq": {"dead": JobRun.objects.filter(state=JobRun.State.DEAD).count()},
        "fingerprint": fp,
    }
