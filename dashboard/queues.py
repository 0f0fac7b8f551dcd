"""Redis connections and RQ queues: names, enqueueing, scheduled jobs, pauses.

The process-wide Redlock lives in ``dashboard.leases``; this module knows no lock.
"""

from __future__ import annotations

import functools
import logging
import time
from datetime import timedelta

import redis
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from rq import Queue
from rq.exceptions import DuplicateJobError, NoSuchJobError
from rq.job import Job, JobStatus
from rq.registry import ScheduledJobRegistry

from dashboard.models import AnalyzerVersion
from workers.analyzer import DEFAULT, queue_name

log = logging.getLogger(__name__)

SYNC_QUEUE = "sync"
#: Bulk dead-letter actions (``dashboard.deadletters``) run here, never in a request.
MAINTENANCE_QUEUE = "maintenance"


def queue_names() -> list[str]:
    """The queues the operations view shows (and pause/resume accept): sync, the
    physical queue of every staffed analyzer version (the current one first; the
    deployed default's before any rollout), maintenance and, once a rollout exists, the
    ``rollouts`` driver queue."""
    rows = list(
        AnalyzerVersion.objects.filter(state__in=_STAFFED)
        .order_by("-state_changed_at")
        .values_list("fingerprint", "state")
    )
    current = [fp for fp, st in rows if st == AnalyzerVersion.State.CURRENT]
    fps = current or [DEFAULT.fingerprint()]
    fps += [fp for fp, _ in rows if fp not in fps]
    names = [SYNC_QUEUE, *(queue_name(fp) for fp in fps), MAINTENANCE_QUEUE]
    return names + (["rollouts"] if rows else [])


#: ``dashboard.versions.STAFFED`` (that module imports this one).
_STAFFED = ("warming", "verified", "ramping", "current", "draining")


class RedisUnavailable(ImproperlyConfigured):
    pass


def redis_urls() -> list[str]:
    urls = list(settings.REDIS_URLS)
    if not urls:
        raise RedisUnavailable(
            "no Redis configured: start `make run` (embedded nodes) or set REDIS_URLS"
        )
    return urls


def redis_url() -> str:
    return str(settings.REDIS_URL or redis_urls()[0])


@functools.cache
def _connection(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=10)


def connection() -> redis.Redis:
    return _connection(redis_url())


def queue(name: str) -> Queue:
    return Queue(name, connection=connection(), default_timeout=settings.JOB_TIMEOUT)


def analysis_queue(fingerprint: str) -> Queue:
    return queue(queue_name(fingerprint))


def _put(q: Queue, func: str, args: tuple[object, ...], job_id: str, delay: float) -> None:
    options: dict[str, object] = {
        "job_id": job_id,
        "unique": True,
        "result_ttl": 3600,
        "failure_ttl": 7 * 24 * 3600,
    }
    if delay > 0:
        q.enqueue_in(timedelta(seconds=delay), func, *args, **options)
    else:
        q.enqueue(func, *args, **options)


def enqueue_unique(q: Queue, func: str, *args: object, job_id: str, delay: float = 0.0) -> bool:
    """Enqueue under a deterministic id; False if that job already exists in Redis.

    Two processes enqueuing the same id concurrently: RQ's ``unique`` enqueue is one Lua
    script (check-and-save), so exactly one succeeds and the other gets
    DuplicateJobError. The job itself is idempotent too, so a redelivery is harmless.
    """
    try:
        _put(q, func, args, job_id, delay)
    except DuplicateJobError:
        pass
    else:
        return True
    # The id exists. A live job (queued, started, scheduled) is the same work: done.
    # A finished or failed one is a leftover of an earlier round: replace it. Two
    # replacers racing both delete, then both enqueue with ``unique``: one wins.
    try:
        existing = Job.fetch(job_id, connection=q.connection)
        status = existing.get_status(refresh=True)
    except NoSuchJobError:
        status = None
    if status in {JobStatus.QUEUED, JobStatus.STARTED, JobStatus.SCHEDULED, JobStatus.DEFERRED}:
        return False
    if status is not None:
        existing.delete()
    try:
        _put(q, func, args, job_id, delay)
    except DuplicateJobError:
        return False
    return True


def promote_due_jobs(queue_names: list[str]) -> int:
    """Move scheduled jobs (retry back-offs, lock waits) whose time has come onto their
    queues. Workers call this every second instead of running RQ's scheduler process,
    which outlives a SIGKILLed worker as an orphan and, once dead, holds its lock.

    Race: every worker promotes; ``ZREM`` removes a job id for exactly one caller, and
    only that caller enqueues it.
    """
    conn = connection()
    moved = 0
    for name in queue_names:
        q = queue(name)
        registry = ScheduledJobRegistry(queue=q)
        for job_id in registry.get_jobs_to_schedule(int(time.time())):
            if not conn.zrem(registry.key, job_id):
                continue
            try:
                job = Job.fetch(job_id, connection=conn)
            except NoSuchJobError:
                continue
            q.enqueue_job(job)
            moved += 1
    return moved


PAUSED_KEY = "gitward:paused-queues"
#: What a worker listens on while every one of its queues is paused (always empty).
IDLE_QUEUE = "gitward-idle"


def paused_queue_names() -> set[str]:
    return {m.decode() for m in connection().smembers(PAUSED_KEY)}  # type: ignore[union-attr]


def set_paused(name: str, paused: bool) -> bool:
    """Pause or resume a queue; returns whether anything changed. Workers stop taking
    jobs from a paused queue within a second; jobs already running finish."""
    conn = connection()
    changed = conn.sadd(PAUSED_KEY, name) if paused else conn.srem(PAUSED_KEY, name)
    return bool(changed)
