"""What the live views show: the operations snapshot (every operations page and the
``/ws/ops/`` socket), and one repository's live state (its page and ``/ws/repos/N/``).

Everything here reads. A snapshot is sent on connect and on request; events keep it
fresh in between (``dashboard.live``).
"""

from __future__ import annotations

import time
from typing import Any

from django.db.models import Q
from rq import Queue

from dashboard import activity, leases, queues
from dashboard.deadletters import dead_runs, list_groups
from dashboard.live import dropped_events
from dashboard.models import BulkAction, Chunk, JobAttempt, JobRun, Repository
from dashboard.nodes import quorum, redis_nodes
from dashboard.repositories import current_fingerprint, repository_status
from dashboard.samples import queue_stats, series
from dashboard.workerbeats import worker_rows


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
    the dead-letter totals) skips grouping every dead letter by cause.

    Never fails on Redis: an unreachable queue server is ``queue_server: {ok: false,
    error: "queue server unreachable"}`` (its queue counts None), locks come from the
    lock masters that answer, and no quorum is an empty lock table with ``quorum``
    saying why."""
    nodes = redis_nodes()
    q = quorum(nodes)
    server = queues.queue_server()
    try:
        locks = leases.lock_rows() if q["up"] else []
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
        "queue_server": server,
        "live_events_dropped": dropped_events(),
        "queues": [queue_stats(n) for n in queues.queue_names()],
        "series": series(),
        "locks": locks,
        "contention": leases.contention(),
        "workers": worker_rows(),
        "dlq": dlq,
        "actions": [
            {"id": a.pk, "kind": a.kind, "state": a.state, "done": a.done, "total": a.total}
            for a in actions
        ],
        "fingerprint": current_fingerprint(),
        "activity": activity.recent(),
        "can": user_can(user) if user is not None else {},
    }


def repository_live(repo_id: int) -> dict[str, Any]:
    """Progress, the chunks being analysed and by whom, and why the rest waits."""
    repo = Repository.objects.get(pk=repo_id)
    state = repository_status(repo)
    holders = leases.lock_rows(repo_id=repo_id)
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
    redlock = leases.redlock()
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
        try:
            position = Queue(run.queue, connection=queues.connection()).get_job_position(
                run.rq_id()
            )
        except queues.QueueUnavailable:
            reasons.append(f"{label}: queued ({queues.QUEUE_DOWN}; enqueued when it returns)")
            continue
        if position is not None:
            reasons.append(f"{label}: queued, position {position + 1}")
        elif run.state == JobRun.State.FAILED:
            reasons.append(f"{label}: waiting to retry (attempt {run.attempts + 1})")
        else:
            reasons.append(f"{label}: queued")
    return reasons
