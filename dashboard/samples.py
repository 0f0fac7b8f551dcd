"""Queue statistics: live counts from RQ, rates from the attempt history, and the
backlog sampled once per reconciler round (one day kept) for the one-hour charts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import Count, Max, Q
from django.db.models.functions import TruncHour, TruncMinute
from django.utils import timezone
from rq import Queue
from rq.registry import StartedJobRegistry

from dashboard import queues
from dashboard.models import JobAttempt, QueueSample
from dashboard.repositories import current_fingerprint

HOUR = timedelta(hours=1)


def queue_stats(name: str, *, now: datetime | None = None) -> dict[str, Any]:
    """Backlog, oldest job age, running, jobs/min (5 min), retries and failure rate (1 h).

    With the queue server unreachable the live counts (backlog, running, oldest, paused)
    are None and ``unreachable`` is True; the rates come from the database regardless.
    """
    now = now or timezone.now()
    attempts = JobAttempt.objects.filter(run__queue=name, started_at__gte=now - HOUR)
    finished = attempts.exclude(outcome__in=[JobAttempt.Outcome.RUNNING, "deferred"])
    five_minutes_ago = now - timedelta(minutes=5)
    counts = finished.aggregate(
        total=Count("id"),
        bad=Count("id", filter=Q(outcome__in=["failed", "crashed"])),
        recent=Count("id", filter=Q(outcome="succeeded", finished_at__gte=five_minutes_ago)),
        retries=Count("id", filter=Q(number__gt=1)),
    )
    version = name.split("@", 1)[1] if "@" in name else None
    try:
        live = _live_counts(name)
    except queues.QueueUnavailable:
        live = {"paused": None, "backlog": None, "running": None, "oldest_age_s": None}
        live["unreachable"] = True
    return {
        "name": name,
        "version": version,
        "current": version is not None and current_fingerprint().startswith(version),
        "unreachable": False,
        **live,
        "jobs_per_min": round(counts["recent"] / 5, 1),
        "retries": counts["retries"],
        "failure_rate": round(counts["bad"] / counts["total"], 3) if counts["total"] else 0.0,
    }


def _live_counts(name: str) -> dict[str, Any]:
    """What only the queue server knows; raises ``QueueUnavailable``."""
    conn = queues.connection()
    q = Queue(name, connection=conn)
    oldest_age = None
    first = q.get_job_ids(0, 0)
    if first:
        job = q.fetch_job(first[0])
        if job is not None and job.enqueued_at is not None:
            enq = job.enqueued_at
            enq = enq.replace(tzinfo=UTC) if enq.tzinfo is None else enq
            oldest_age = round(max(0.0, (datetime.now(UTC) - enq).total_seconds()), 1)
    return {
        "paused": name in queues.paused_queue_names(),
        "backlog": q.count,
        "running": StartedJobRegistry(name, connection=conn).count,
        "oldest_age_s": oldest_age,
    }


def record_samples() -> None:
    """Sample every queue's backlog (called by the reconciler loop); keep one day. With
    the queue server unreachable no sample is taken (a gap in the chart, not a zero)."""
    now = timezone.now()
    conn = queues.connection()
    try:
        samples = [
            QueueSample(
                queue=name,
                at=now,
                backlog=Queue(name, connection=conn).count,
                running=StartedJobRegistry(name, connection=conn).count,
            )
            for name in queues.queue_names()
        ]
    except queues.QueueUnavailable:
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
