"""What the operations view shows, computed for the snapshot and the pages.

Everything here reads; the only writes are ``record_samples`` (the backlog series) and
``force_release_lock`` (an audited operator action).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import redis
from django.conf import settings
from django.db.models import Count, Q
from django.db.models.functions import TruncMinute
from django.utils import timezone
from rq import Queue
from rq.registry import StartedJobRegistry

from dashboard import queues
from dashboard.models import (
    BulkAction,
    Chunk,
    JobAttempt,
    JobRun,
    QueueSample,
    Repository,
    WorkerBeat,
)
from dashboard.repositories import current_fingerprint, repository_status
from workers.analyzer import queue_name

EXTENSIONS_HASH = "gitward:lock-extensions"
HOUR = timedelta(hours=1)


# ---------------------------------------------------------------------------- redis


def redis_nodes() -> list[dict[str, Any]]:
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
    up = sum(1 for n in nodes if n["up"])
    needed = len(nodes) // 2 + 1
    state = "ok" if up == len(nodes) else "at_risk" if up >= needed else "lost"
    return {"up": up, "total": len(nodes), "needed": needed, "state": state}


# ---------------------------------------------------------------------------- queues


def queue_names() -> list[str]:
    from dashboard.deadletters import MAINTENANCE_QUEUE

    return [queues.SYNC_QUEUE, queue_name(current_fingerprint()), MAINTENANCE_QUEUE]


def queue_stats(name: str, *, now: datetime | None = None) -> dict[str, Any]:
    """Backlog, oldest job age, running, jobs/min (5 min), retries and failure rate (1 h)."""
    now = now or timezone.now()
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
    return {
        "name": name,
        "paused": name in queues.paused_queue_names(),
        "version": version,
        "current": version is not None and current_fingerprint().startswith(version),
        "backlog": q.count,
        "running": StartedJobRegistry(name, connection=conn).count,
        "oldest_age_s": oldest_age,
        "jobs_per_min": round(counts["recent"] / 5, 1),
        "retries": counts["retries"],
        "failure_rate": round(counts["bad"] / counts["total"], 3) if counts["total"] else 0.0,
    }


def record_samples() -> None:
    """Sample every queue's backlog (called by the reconciler loop); keep one day."""
    now = timezone.now()
    conn = queues.connection()
    QueueSample.objects.bulk_create(
        [
            QueueSample(
                queue=name,
                at=now,
                backlog=Queue(name, connection=conn).count,
                running=StartedJobRegistry(name, connection=conn).count,
            )
            for name in queue_names()
        ]
    )
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


# ---------------------------------------------------------------------------- workers


def live_worker_names() -> set[str]:
    cutoff = timezone.now() - timedelta(seconds=settings.WORKER_DEAD_AFTER)
    return set(
        WorkerBeat.objects.filter(stopped_at__isnull=True, last_seen__gte=cutoff).values_list(
            "name", flat=True
        )
    )


def worker_rows(*, limit: int = 200) -> list[dict[str, Any]]:
    now = timezone.now()
    cutoff = now - timedelta(seconds=settings.WORKER_DEAD_AFTER)
    rows = []
    beats = WorkerBeat.objects.select_related("current_run").order_by("-last_seen")[:limit]
    for w in beats:
        run = w.current_run
        if w.stopped_at:
            state = "stopped"
        elif w.last_seen < cutoff:
            state = "dead"
        else:
            state = "busy" if run else "idle"
        rows.append(
            {
                "name": w.name,
                "host": w.host,
                "pid": w.pid,
                "version": w.version,
                "state": state,
                "dead": state == "dead",
                "rss_mb": round(w.rss / 2**20, 1) if w.rss else None,
                "job": run.job_id if run else None,
                "job_started_at": run.started_at.isoformat() if run and run.started_at else None,
                "last_seen": w.last_seen.isoformat(),
            }
        )
    return rows


# ---------------------------------------------------------------------------- locks


def describe_resource(key: str) -> dict[str, Any]:
    """``locks:git:repo:7:commit:a..b`` → repository 7, chunk a..b (for people)."""
    parts = key.split(":")
    out: dict[str, Any] = {"key": key, "repo": None, "what": key}
    if len(parts) >= 5 and parts[1] == "git" and parts[2] == "repo" and parts[3].isdigit():
        out["repo"] = int(parts[3])
        rest = ":".join(parts[4:])
        if rest == "mirror":
            out["what"] = "mirror"
        elif rest.startswith("commit:"):
            span = rest.removeprefix("commit:")
            first, _, last = span.partition("..")
            out["what"] = f"commits {first[:8]}..{last[:8]}" if last else f"commit {first[:8]}"
    return out


def lock_rows() -> list[dict[str, Any]]:
    """Every held lock, with holder, token, masters agreeing, TTL, extensions, staleness."""
    infos = queues.redlock().list_locks("locks:")
    if not infos:
        return []
    live = live_worker_names()
    ext_raw: list[Any] = list(
        queues.connection().hmget(EXTENSIONS_HASH, [i["key"] for i in infos])  # type: ignore[arg-type]
    )
    names = dict(
        Repository.objects.filter(
            pk__in={d["repo"] for i in infos if (d := describe_resource(i["key"]))["repo"]}
        ).values_list("pk", "url")
    )
    rows = []
    for info, ext in zip(infos, ext_raw, strict=True):
        res = describe_resource(info["key"])
        holder = info.get("holder") or {}
        url = names.get(res["repo"], "")
        rows.append(
            {
                **res,
                "repo_name": url.rstrip("/").rsplit("/", 1)[-1].removesuffix(".git") if url else "",
                "worker": holder.get("worker"),
                "job": holder.get("job"),
                "host": holder.get("host"),
                "pid": holder.get("pid"),
                "token": holder.get("token"),
                "agreeing": info["agreeing"],
                "masters": info["masters"],
                "ttl_ms": info["ttl_ms"],
                "extensions": int(ext or 0),
                "stale": bool(holder.get("worker")) and holder.get("worker") not in live,
            }
        )
    return rows


def contention(*, now: datetime | None = None) -> dict[str, Any]:
    """Lock contention over the last hour, from the attempt history."""
    now = now or timezone.now()
    recent = JobAttempt.objects.filter(started_at__gte=now - HOUR)
    top = (
        recent.filter(outcome="deferred")
        .values("run__repository_id", "run__repository__url")
        .annotate(n=Count("id"))
        .order_by("-n")[:5]
    )
    return {
        "refusals": recent.filter(outcome="deferred").count(),
        "lost": recent.filter(error__startswith="LockLost").count(),
        "stale_writes_rejected": recent.filter(error__startswith="StaleToken").count(),
        "most_contended": [
            {"repo": r["run__repository_id"], "url": r["run__repository__url"], "refusals": r["n"]}
            for r in top
        ],
    }


def force_release_lock(*, key: str, user: Any) -> dict[str, Any]:
    """Release a lock whatever its holder, and bump its fencing token so that the old
    holder, if it is alive after all, has every later write rejected. Audited."""
    from dashboard.audit import record_audit
    from dashboard.fencing import next_token
    from dashboard.live import publish_event

    info = queues.redlock().inspect(key)
    if info is None or not info.get("nonce"):
        record_audit(user=user, action="lock.force_release", target=key, outcome="not held")
        return {"released": 0, "token": None}
    released = queues.redlock().force_release(key, info["nonce"])
    token = next_token(key)
    queues.connection().hdel(EXTENSIONS_HASH, key)
    holder = info.get("holder") or {}
    record_audit(
        user=user,
        action="lock.force_release",
        target=key,
        outcome=f"released on {released} masters; fencing token now {token}",
        detail={"holder": holder},
    )
    publish_event(
        "lock.released",
        {"key": key, "forced": True, "token": token},
        repo_id=describe_resource(key)["repo"],
    )
    return {"released": released, "token": token, "holder": holder}


# ---------------------------------------------------------------------------- snapshot


def user_can(user: Any) -> dict[str, bool]:
    staff = bool(getattr(user, "is_staff", False))
    return {
        "retry": staff and user.has_perm("dashboard.retry_jobrun"),
        "discard": staff and user.has_perm("dashboard.discard_jobrun"),
        "force_release": staff and user.has_perm("dashboard.force_release_lock"),
        "pause": staff and user.has_perm("dashboard.pause_queue"),
    }


def ops_snapshot(*, user: Any = None, dlq_groups: bool = True) -> dict[str, Any]:
    """Everything the operations pages show. ``dlq_groups=False`` (pages that only show
    the dead-letter totals) skips grouping every dead letter by cause."""
    from dashboard.deadletters import dead_runs, list_groups

    nodes = redis_nodes()
    q = quorum(nodes)
    try:
        locks = lock_rows() if q["up"] else []
    except Exception:  # no quorum reachable: the table says so rather than failing
        locks = []
    if dlq_groups:
        groups = list_groups()
        dlq = {
            "groups": groups[:100],
            "dead": sum(g["count"] for g in groups),
            "group_count": len(groups),
        }
    else:
        dead = dead_runs()
        dlq = {
            "groups": None,
            "dead": dead.count(),
            "group_count": dead.values("cause_key").distinct().count(),
        }
    actions = BulkAction.objects.filter(
        state__in=[BulkAction.State.QUEUED, BulkAction.State.RUNNING]
    ).order_by("-pk")[:10]
    return {
        "at": time.time(),
        "redis_nodes": nodes,
        "quorum": q,
        "queues": [queue_stats(n) for n in queue_names()],
        "series": series(),
        "locks": locks,
        "contention": contention(),
        "workers": worker_rows(),
        "dlq": dlq,
        "actions": [
            {"id": a.pk, "kind": a.kind, "state": a.state, "done": a.done, "total": a.total}
            for a in actions
        ],
        "fingerprint": current_fingerprint(),
        "can": user_can(user) if user is not None else {},
    }


# ---------------------------------------------------------------------------- repository


def repository_live(repo_id: int) -> dict[str, Any]:
    """Progress, the chunks being analysed and by whom, and why the rest waits."""
    repo = Repository.objects.get(pk=repo_id)
    state = repository_status(repo)
    prefix = f"locks:git:repo:{repo_id}:"
    holders = [r for r in lock_rows() if r["key"].startswith(prefix)]
    return {**state, "holders": holders, "waiting": why_waiting(repo)}


def why_waiting(repo: Repository, *, limit: int = 5) -> list[str]:
    """Human reasons the repository is not done yet (queue position, lock waits)."""
    reasons: list[str] = []
    if not repo.is_active:
        return reasons
    fp = repo.fingerprint or current_fingerprint()
    open_runs = JobRun.objects.filter(
        repository=repo, state__in=[JobRun.State.QUEUED, JobRun.State.FAILED]
    ).filter(Q(kind=JobRun.Kind.SYNC) | Q(fingerprint=fp))
    total_chunks = Chunk.objects.filter(repository=repo, fingerprint=fp).count()
    redlock = queues.redlock()
    for run in open_runs.select_related("chunk").order_by("pk")[:limit]:
        label = (
            "sync"
            if run.kind == JobRun.Kind.SYNC
            else (f"chunk {run.chunk.position}/{total_chunks}" if run.chunk else "chunk")
        )
        last = JobAttempt.objects.filter(run=run).order_by("-number").first()
        if last is not None and last.outcome == JobAttempt.Outcome.DEFERRED and run.chunk:
            info = redlock.inspect(run.chunk.lock_key())
            if info:
                holder = (info.get("holder") or {}).get("job", "another job")
                left = info["ttl_ms"] / 1000
                reasons.append(f"{label}: blocked, lock held by job {holder}, {left:.1f}s left")
                continue
        position = Queue(run.queue, connection=queues.connection()).get_job_position(run.rq_id())
        if position is not None:
            reasons.append(f"{label}: queued, position {position + 1}")
        elif run.state == JobRun.State.FAILED:
            reasons.append(f"{label}: waiting to retry (attempt {run.attempts + 1})")
        else:
            reasons.append(f"{label}: queued")
    return reasons


# ---------------------------------------------------------------------------- metrics


def metrics_text() -> str:
    """Prometheus text exposition (version 0.0.4) of the operations state."""
    lines: list[str] = []

    def gauge(
        name: str, help_text: str, samples: list[tuple[dict[str, str], float]], kind: str = "gauge"
    ) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            label = ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels.items())
            lines.append(f"{name}{{{label}}} {value}" if label else f"{name} {value}")

    conn = queues.connection()
    names = queue_names()
    gauge(
        "gitward_queue_backlog",
        "Jobs waiting in the queue.",
        [({"queue": n}, Queue(n, connection=conn).count) for n in names],
    )
    gauge(
        "gitward_queue_running",
        "Jobs being executed.",
        [({"queue": n}, StartedJobRegistry(n, connection=conn).count) for n in names],
    )
    paused = queues.paused_queue_names()
    gauge(
        "gitward_queue_paused",
        "1 while the queue is paused.",
        [({"queue": n}, int(n in paused)) for n in names],
    )
    runs = dict(JobRun.objects.order_by().values_list("state").annotate(n=Count("id")))
    gauge(
        "gitward_runs",
        "Job runs by state.",
        [({"state": s}, runs.get(s, 0)) for s in JobRun.State.values],
    )
    attempts = dict(JobAttempt.objects.order_by().values_list("outcome").annotate(n=Count("id")))
    gauge(
        "gitward_attempts_total",
        "Job attempts by outcome.",
        [({"outcome": o}, attempts.get(o, 0)) for o in JobAttempt.Outcome.values],
        "counter",
    )
    repos = dict(Repository.objects.order_by().values_list("status").annotate(n=Count("id")))
    gauge(
        "gitward_repositories",
        "Repositories by status.",
        [({"status": s}, repos.get(s, 0)) for s in Repository.Status.values],
    )
    workers = worker_rows()
    gauge(
        "gitward_workers",
        "Workers by state.",
        [
            ({"state": st}, sum(1 for w in workers if w["state"] == st))
            for st in ("idle", "busy", "dead", "stopped")
        ],
    )
    nodes = redis_nodes()
    gauge(
        "gitward_redis_masters_up", "Reachable Redis masters.", [({}, sum(n["up"] for n in nodes))]
    )
    gauge("gitward_redis_masters", "Configured Redis masters.", [({}, len(nodes))])
    held: float
    try:
        held = len(queues.redlock().list_locks("locks:"))
    except Exception:  # no quorum: say so with a NaN rather than a wrong zero
        held = float("nan")
    gauge("gitward_locks_held", "Locks currently held.", [({}, held)])
    return "\n".join(lines) + "\n"


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
