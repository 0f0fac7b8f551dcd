"""Queue statistics: live counts from RQ, rates from the attempt history, and the
backlog sampled once per reconciler round (one day kept) for the one-hour charts.

A queue's backlog is every job or run waiting for it, wherever it waits
(docs/scheduling.md#where-the-backlog-is-counted): its RQ list (every class: classes are
places in that one list), its worker hosts' queues (mirror affinity) and its runs
parked in the database (fairness). ``held_backlog`` counts the latter two."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import Count, Max, Q
from django.db.models.functions import TruncHour, TruncMinute
from django.utils import timezone
from rq import Queue
from rq.job import Job
from rq.registry import StartedJobRegistry
from rq.utils import str_to_date

from dashboard import infra, runs
from dashboard.models import JobAttempt, JobRun, QueueSample
from dashboard.repositories import current_fingerprint

HOUR = timedelta(hours=1)


def queue_stats(name: str, *, now: datetime | None = None) -> dict[str, Any]:
    """One queue's statistics (see ``queues_stats``)."""
    return queues_stats([name], now=now)[0]


def queues_stats(names: list[str], *, now: datetime | None = None) -> list[dict[str, Any]]:
    """Per queue, in order: backlog, oldest job age, running, jobs/min (5 min), retries
    and failure rate (1 h). One aggregate query and two Redis round trips whatever the
    number of queues (the operations snapshot asks for all of them every second).

    With the queue server unreachable the live counts (backlog, running, oldest, paused)
    are None and ``unreachable`` is True; the rates come from the database regardless.
    """
    now = now or timezone.now()
    attempts = JobAttempt.objects.filter(run__queue__in=names, started_at__gte=now - HOUR)
    finished = attempts.exclude(outcome__in=[JobAttempt.Outcome.RUNNING, "deferred"])
    five_minutes_ago = now - timedelta(minutes=5)
    counts = {
        row["run__queue"]: row
        for row in finished.values("run__queue").annotate(
            total=Count("id"),
            bad=Count("id", filter=Q(outcome__in=["failed", "crashed"])),
            recent=Count("id", filter=Q(outcome="succeeded", finished_at__gte=five_minutes_ago)),
            retries=Count("id", filter=Q(number__gt=1)),
        )
    }
    try:
        live = _live_counts(names)
        held = held_backlog(names)
    except infra.QueueUnavailable:
        down = {"paused": None, "backlog": None, "running": None, "oldest_age_s": None}
        live = [{**down, "unreachable": True} for _ in names]
        held = {}
    for name, counted in zip(names, live, strict=True):
        if name in held and counted["backlog"] is not None:
            # Race: the reads are not one snapshot; a job moved between the lists meanwhile
            # (a host queue's overdue move, a release of a parked run) is counted twice
            # or not at all for this one second. The next snapshot is right again.
            counted["backlog_host"] = held[name]["host"]
            counted["backlog_parked"] = held[name]["parked"]
            counted["backlog"] += held[name]["host"] + held[name]["parked"]
    current = current_fingerprint()
    out = []
    for name, counted in zip(names, live, strict=True):
        c = counts.get(name, {"total": 0, "bad": 0, "recent": 0, "retries": 0})
        version = name.split("@", 1)[1] if "@" in name else None
        out.append(
            {
                "name": name,
                "version": version,
                "current": version is not None and current.startswith(version),
                "unreachable": False,
                **counted,
                "jobs_per_min": round(c["recent"] / 5, 1),
                "retries": c["retries"],
                "failure_rate": round(c["bad"] / c["total"], 3) if c["total"] else 0.0,
            }
        )
    return out


def _live_counts(names: list[str]) -> list[dict[str, Any]]:
    """What only the queue server knows, per queue, in two pipelined round trips (the
    first job id, length and running count of every queue plus the paused set; then
    the first jobs' ``enqueued_at``); raises ``QueueUnavailable``.

    Running is the started registry's entries whose lease has not expired (``ZCOUNT``
    from now): RQ's ``StartedJobRegistry.count`` would first run its clean-up (fetch
    every expired job, fail it, move it) on every call, i.e. on every snapshot; the
    workers run that clean-up themselves. RQ's public reads (``Queue.count``,
    ``get_job_ids``, ``Job.fetch``) are one round trip each and cannot share a pipeline,
    so the layouts read here (a queue is a list whose head is its oldest job, the started
    registry a sorted set scored by lease expiry, ``enqueued_at`` a job-hash field) are
    pinned by tests/dashboard/operations/test_rq_internals.py.

    Race: the pipeline is not a transaction, so a job taken between the reads may be
    counted in neither or both of backlog and running; the next snapshot (a second
    later) is right again."""
    conn = infra.connection()
    pipe = conn.pipeline(transaction=False)
    stamp = time.time()
    for name in names:
        q = Queue(name, connection=conn)
        pipe.lrange(q.key, 0, 0)  # the first job only (``get_job_ids(0, 0)`` is all of them)
        pipe.llen(q.key)
        pipe.zcount(StartedJobRegistry(name, connection=conn).key, stamp, "+inf")
    pipe.smembers(infra.PAUSED_KEY)
    replies = pipe.execute()
    paused = {m.decode() for m in replies[-1]}
    firsts = [replies[3 * i][0].decode() if replies[3 * i] else None for i in range(len(names))]
    ages: dict[str, float | None] = {}
    if any(firsts):
        pipe = conn.pipeline(transaction=False)
        for job_id in filter(None, firsts):
            pipe.hget(Job.key_for(job_id), "enqueued_at")
        stamps = iter(pipe.execute())
        moment = datetime.now(UTC)
        for job_id in filter(None, firsts):
            raw = next(stamps)
            # A job deleted between the two round trips has no hash: no age, as before.
            ages[job_id] = (
                round(max(0.0, (moment - str_to_date(raw)).total_seconds()), 1) if raw else None
            )
    return [
        {
            "paused": name in paused,
            "backlog": replies[3 * i + 1],
            "running": replies[3 * i + 2],
            "oldest_age_s": ages.get(first) if first else None,
        }
        for i, (name, first) in enumerate(zip(names, firsts, strict=True))
    ]


def held_backlog(names: list[str]) -> dict[str, dict[str, int]]:
    """Per queue of ``names``: ``host``, the jobs waiting on its worker hosts' queues
    (``<queue>@host:<id>``, docs/scheduling.md#mirror-affinity), and ``parked``, its runs
    parked in the database (docs/scheduling.md#fairness) — the backlog RQ's count of the
    queue leaves out. One ``SMEMBERS`` of RQ's queue set and one pipeline of ``LLEN``s,
    one aggregate query; raises ``QueueUnavailable``."""
    conn: Any = infra.connection()
    wanted = set(names)
    keys: list[tuple[str, str]] = []
    for raw in conn.smembers("rq:queues"):
        key = raw.decode() if isinstance(raw, bytes) else str(raw)
        name = key.removeprefix("rq:queue:")
        base = runs.base_queue(name)
        if base != name and base in wanted:
            keys.append((base, key))
    host: dict[str, int] = dict.fromkeys(names, 0)
    if keys:
        pipe = conn.pipeline(transaction=False)
        for _, key in keys:
            pipe.llen(key)
        for (base, _), length in zip(keys, pipe.execute(), strict=True):
            host[base] += int(length)
    parked = dict(
        JobRun.objects.filter(queue__in=names, state=JobRun.State.QUEUED, parked=True)
        .values("queue")
        .annotate(n=Count("id"))
        .values_list("queue", "n")
    )
    return {name: {"host": host[name], "parked": int(parked.get(name, 0))} for name in names}


def record_samples() -> None:
    """Sample every queue's backlog (called by the reconciler loop); keep one day. With
    the queue server unreachable no sample is taken (a gap in the chart, not a zero)."""
    now = timezone.now()
    conn = infra.connection()
    try:
        names = infra.queue_names()
        held = held_backlog(names)
        samples = [
            QueueSample(
                queue=name,
                at=now,
                backlog=Queue(name, connection=conn).count
                + held[name]["host"]
                + held[name]["parked"],
                running=StartedJobRegistry(name, connection=conn).count,
            )
            for name in names
        ]
    except infra.QueueUnavailable:
        return
    QueueSample.objects.bulk_create(samples)
    QueueSample.objects.filter(at__lt=now - timedelta(days=1)).delete()


def series(*, now: datetime | None = None) -> dict[str, Any]:
    """Per-minute throughput (succeeded attempts) and backlog over the last hour."""
    now = now or timezone.now()
    start = (now - HOUR).replace(second=0, microsecond=0)
    done = {
        row["minute"]: row["n"]
        for row in JobAttempt.objects.filter(outcome="succeeded", finished_at__gte=start)
        .annotate(minute=TruncMinute("finished_at"))
        .values("minute")
        .annotate(n=Count("id"))
    }
    backlog: dict[datetime, int] = {}
    for sample in QueueSample.objects.filter(at__gte=start).order_by("at"):
        minute = sample.at.replace(second=0, microsecond=0)
        backlog[minute] = backlog.get(minute, 0) if minute in backlog else 0
        backlog[minute] = max(backlog[minute], sample.backlog)
    minutes = [start + timedelta(minutes=i) for i in range(61)]
    return {
        "minutes": [m.isoformat() for m in minutes],
        "throughput": [done.get(m, 0) for m in minutes],
        "backlog": [backlog.get(m) for m in minutes],
    }


DAY = timedelta(days=1)


def day_series(*, now: datetime | None = None) -> dict[str, Any]:
    """Per hour over the last 24 hours: attempts that succeeded, attempts that failed or
    crashed, the failure rate, and the peak sampled backlog (samples are kept a day).
    Three aggregate queries; read only."""
    now = now or timezone.now()
    start = (now - DAY).replace(minute=0, second=0, microsecond=0) + HOUR
    rows = (
        JobAttempt.objects.filter(finished_at__gte=start)
        .annotate(hour=TruncHour("finished_at"))
        .values("hour")
        .annotate(
            ok=Count("id", filter=Q(outcome="succeeded")),
            bad=Count("id", filter=Q(outcome__in=["failed", "crashed"])),
        )
    )
    done = {r["hour"]: (r["ok"], r["bad"]) for r in rows}
    backlog = {
        r["hour"]: r["peak"]
        for r in QueueSample.objects.filter(at__gte=start)
        .annotate(hour=TruncHour("at"))
        .values("hour")
        .annotate(peak=Max("backlog"))
    }
    hours = [start + timedelta(hours=i) for i in range(24)]
    ok = [done.get(h, (0, 0))[0] for h in hours]
    bad = [done.get(h, (0, 0))[1] for h in hours]
    return {
        "hours": [h.isoformat() for h in hours],
        "throughput": ok,
        "failures": bad,
        "failure_pct": [
            round(100 * b / (o + b), 1) if o + b else 0.0 for o, b in zip(ok, bad, strict=True)
        ],
        "backlog": [backlog.get(h, 0) for h in hours],
    }
