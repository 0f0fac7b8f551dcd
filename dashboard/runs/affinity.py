"""Mirror affinity: a chunk prefers a worker host that already holds its repository's
mirror (docs/scheduling.md#mirror-affinity).

* Which hosts hold a mirror: a Redis set ``gitward:mirror-hosts:{repo}`` of host ids
  (``GITWARD_HOST_ID``), added to after every fetch of that mirror on a host
  (:func:`record_mirror`), removed from when a host discards it (:func:`forget_mirror`).
  Which hosts are up: ``gitward:host-alive:{host}``, set by every worker's heartbeat with
  a short expiry (:func:`beat_host`).
* Each worker host listens on ``<queue>@host:<host id>`` before ``<queue>``
  (``workers.pool``). :func:`physical_queue` (called by ``enqueue_run``) puts a chunk on
  the host queue of a live host holding its mirror, the least loaded of them.
* After ``GITWARD_AFFINITY_WAIT`` seconds on a host queue (or at once if that host is no
  longer alive) a job is moved to the shared queue by :func:`move_overdue`, which every
  worker's heartbeat runs for the queues it serves.

Nothing here decides *whether* a run is queued: the run is queued in the database and its
RQ job keeps its deterministic id (``enqueue_unique`` dedupes across queues: the id is
the job's key). The move is one Lua script (remove from the host list, push onto the
shared list, rewrite the job's ``origin``), so a crash leaves the job in exactly one of
the two lists, never in none; the reconciler re-enqueues a queued run whose job is in
no queue anyway.
"""

from __future__ import annotations

import contextlib
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from rq.utils import utcparse

from dashboard import infra
from dashboard.models import JobRun

__all__ = [
    "HOST_QUEUE_MARK",
    "base_queue",
    "beat_host",
    "forget_mirror",
    "host_queue",
    "host_queues_of",
    "mirror_hosts",
    "move_overdue",
    "physical_queue",
    "placement_reason",
    "record_mirror",
]

log = logging.getLogger(__name__)

#: Between a queue's name and a host id in a host queue's name.
HOST_QUEUE_MARK = "@host:"
MIRRORS_KEY = "gitward:mirror-hosts:{repo}"
ALIVE_KEY = "gitward:host-alive:{host}"
#: Seconds a host counts as alive after its last heartbeat.
ALIVE_FOR = 10

# KEYS: host queue list, shared queue list, job hash.  ARGV: job id, shared queue name.
# One script: the job leaves the host list and joins the shared one atomically, and only
# the caller whose LREM removed it pushes it (two movers racing: one moves, one sees 0).
_MOVE = """
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 1 then
  redis.call('RPUSH', KEYS[2], ARGV[1])
  if redis.call('EXISTS', KEYS[3]) == 1 then redis.call('HSET', KEYS[3], 'origin', ARGV[2]) end
  return 1
end
return 0
"""


def host_queue(queue: str, host: str) -> str:
    return f"{queue}{HOST_QUEUE_MARK}{host}"


def base_queue(name: str) -> str:
    """The shared queue behind a host queue (a shared queue's name is its own)."""
    return name.split(HOST_QUEUE_MARK, 1)[0]


def host_queues_of(queue_names: list[str], host: str | None = None) -> list[str]:
    """The host queues this worker host listens on before ``queue_names``: one per
    analysis queue (the only jobs placed by affinity are chunks)."""
    host = host or settings.HOST_ID
    if settings.AFFINITY_WAIT <= 0:
        return []
    return [host_queue(n, host) for n in queue_names if n.startswith("analysis@")]


def record_mirror(repo_id: int, host: str | None = None) -> None:
    """This host holds an up-to-date mirror of ``repo_id`` (after a fetch). Best effort:
    Redis away costs affinity, never the job."""
    with contextlib.suppress(Exception):
        infra.connection().sadd(MIRRORS_KEY.format(repo=repo_id), host or settings.HOST_ID)


def forget_mirror(repo_id: int, host: str | None = None) -> None:
    """This host discarded its mirror of ``repo_id``."""
    with contextlib.suppress(Exception):
        infra.connection().srem(MIRRORS_KEY.format(repo=repo_id), host or settings.HOST_ID)


def mirror_hosts(repo_id: int) -> set[str]:
    conn: Any = infra.connection()  # redis-py's sync client (its stubs also say async)
    raw = conn.smembers(MIRRORS_KEY.format(repo=repo_id))
    return {h.decode() if isinstance(h, bytes) else str(h) for h in raw}


def beat_host(host: str | None = None) -> None:
    """This worker host is up (every worker's heartbeat)."""
    infra.connection().set(ALIVE_KEY.format(host=host or settings.HOST_ID), "1", ex=ALIVE_FOR)


def _alive(hosts: list[str]) -> list[str]:
    if not hosts:
        return []
    conn: Any = infra.connection()
    flags = conn.mget([ALIVE_KEY.format(host=h) for h in hosts])
    return [h for h, f in zip(hosts, flags, strict=True) if f is not None]


def physical_queue(run: JobRun, *, delay: float = 0.0) -> str:
    """The queue ``enqueue_run`` puts the run's job on: for a chunk, the host queue of
    the least loaded live host holding its mirror; otherwise (a sync, a delayed retry —
    its scheduled job is promoted by the workers listening on its queue, which a dead
    host's are not —, affinity off, no such host, Redis trouble) ``run.queue``."""
    if run.kind != JobRun.Kind.ANALYZE or delay > 0 or settings.AFFINITY_WAIT <= 0:
        return run.queue
    try:
        hosts = _alive(sorted(mirror_hosts(run.repository_id)))
        if not hosts:
            return run.queue
        conn = infra.connection()
        loads = {h: conn.llen(f"rq:queue:{host_queue(run.queue, h)}") for h in hosts}
    except Exception:  # the enqueue itself will report a queue server that is down
        return run.queue
    return host_queue(run.queue, min(hosts, key=lambda h: (loads[h], h)))


def placement_reason(run: JobRun) -> str | None:
    """Why a queued run's job waits where it is, for "why is this waiting": ``on worker
    host h1's queue (it holds the mirror); any host from 14:05:10 UTC``; None when its job
    is not on a host queue (or the queue server does not answer)."""
    try:
        conn: Any = infra.connection()
        origin, stamp = conn.hmget(f"rq:job:{run.rq_id()}", ["origin", "enqueued_at"])
    except Exception:
        return None
    name = origin.decode() if isinstance(origin, bytes) else str(origin or "")
    if HOST_QUEUE_MARK not in name:
        return None
    host = name.split(HOST_QUEUE_MARK, 1)[1]
    reason = f"on worker host {host}'s queue (it holds the mirror)"
    if stamp:
        text = stamp.decode() if isinstance(stamp, bytes) else str(stamp)
        at = utcparse(text).replace(tzinfo=UTC) + timedelta(seconds=settings.AFFINITY_WAIT)
        reason += f"; any host from {at:%H:%M:%S} UTC"
    return reason


def move_overdue(queue_names: list[str], *, wait: float | None = None) -> int:
    """Move jobs that waited ``wait`` seconds (default ``GITWARD_AFFINITY_WAIT``) on a host
    queue of one of ``queue_names`` — or any time on the queue of a host no longer alive —
    to the shared queue. Returns how many moved. Every worker runs it each second; the
    move is one script, so each job moves once (module docstring)."""
    wait = settings.AFFINITY_WAIT if wait is None else wait
    conn: Any = infra.connection()
    now = datetime.now(UTC)
    move = conn.register_script(_MOVE)
    moved = 0
    shared = {n for n in queue_names if HOST_QUEUE_MARK not in n}
    for raw in conn.smembers("rq:queues"):
        key = raw.decode() if isinstance(raw, bytes) else str(raw)
        name = key.removeprefix("rq:queue:")
        if HOST_QUEUE_MARK not in name or base_queue(name) not in shared:
            continue
        host = name.split(HOST_QUEUE_MARK, 1)[1]
        gone = not _alive([host])
        for job_raw in conn.lrange(key, 0, 99):
            job_id = job_raw.decode() if isinstance(job_raw, bytes) else str(job_raw)
            if not gone:
                stamp = conn.hget(f"rq:job:{job_id}", "enqueued_at")
                if stamp is not None:
                    text = stamp.decode() if isinstance(stamp, bytes) else str(stamp)
                    at = utcparse(text).replace(tzinfo=UTC)
                    if (now - at).total_seconds() < wait:
                        break  # the list is in enqueue order: younger ones follow
            base = base_queue(name)
            moved += int(
                move(keys=[key, f"rq:queue:{base}", f"rq:job:{job_id}"], args=[job_id, base])
            )
    if moved:
        log.info("mirror affinity: %d job(s) moved to their shared queue", moved)
    return moved
