"""What the live views show: the operations snapshot (every operations page and the
``/ws/ops/`` socket), and one repository's live state (its page and ``/ws/repos/N/``).

Everything here reads. A snapshot is sent on connect and on request; events keep it
fresh in between (``dashboard.live``).

The operations snapshot is the same for every operator except the buttons they may
press (``can``), and costs tens of queries and Redis calls across every lock master. A
web process builds its shared part at most once per ``GITWARD_SNAPSHOT_TTL`` (default
1 s) and gives that copy to every page, ``/api/status`` and socket asking meanwhile;
``can`` is computed per user on every call. Who may see a snapshot at all is decided
by the caller before it asks (``dashboard.view_jobrun``), so sharing changes what
nobody sees. An event this process publishes (an operator's action served here) drops
the copy, so that operator's next page shows the action at once. A socket asks for a
copy built after it joined its groups and after the last event it received
(``not_before``): a copy older than an event the socket already showed would undo it,
and one older than the join could miss an event sent in between. A page may be up to
the TTL stale; its socket's first snapshot, built after the join, corrects it.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Q
from rq import Queue

from dashboard import activity, leases, queues
from dashboard.deadletters import dead_runs, list_groups
from dashboard.live import dropped_events, published_count
from dashboard.models import BulkAction, Chunk, JobAttempt, JobRun, Repository
from dashboard.nodes import quorum, redis_nodes
from dashboard.repositories import current_fingerprint, repository_status
from dashboard.samples import queues_stats, series
from dashboard.workerbeats import worker_rows


def user_can(user: Any) -> dict[str, bool]:
    staff = bool(getattr(user, "is_staff", False))
    return {
        "retry": staff and user.has_perm("dashboard.retry_jobrun"),
        "discard": staff and user.has_perm("dashboard.discard_jobrun"),
        "force_release": staff and user.has_perm("dashboard.force_release_lock"),
        "pause": staff and user.has_perm("dashboard.pause_queue"),
    }


#: ``{dlq_groups: (build started (monotonic), events published here by then, snapshot)}``
_SHARED: dict[bool, tuple[float, int, dict[str, Any]]] = {}
#: Single flight: one thread builds while the others wait for its copy rather than
#: building the same one (Django runs sync views in one thread per process under ASGI,
#: but the consumers' and the reconciler's threads ask too).
#: One per variant, so a slow dead-letter grouping does not hold up the other pages.
_SHARED_LOCKS = {True: threading.Lock(), False: threading.Lock()}


def ops_snapshot(
    *, user: Any = None, dlq_groups: bool = True, not_before: float = 0.0
) -> dict[str, Any]:
    """Everything the operations pages show (the shared part at most
    ``GITWARD_SNAPSHOT_TTL`` old, and built after ``not_before`` (``time.monotonic``);
    see the module docstring) with this user's ``can``. The shared part is one dict
    for every caller: read it, never change it."""
    shared = shared_snapshot(dlq_groups=dlq_groups, not_before=not_before)
    return {**shared, "can": user_can(user) if user is not None else {}}


def shared_snapshot(*, dlq_groups: bool, not_before: float = 0.0) -> dict[str, Any]:
    """The user-independent part of the operations snapshot, cached per process."""
    ttl = float(settings.SNAPSHOT_TTL)
    if ttl <= 0:
        return build_shared_snapshot(dlq_groups=dlq_groups)
    # Freshness is measured from the request's arrival, not from when it gets the lock:
    # a copy whose build started at most ``ttl`` before the request came is good for
    # it, so everyone who queued behind a slow build shares that build rather than
    # each building anew once the copy has aged (on a busy host a build can outlast
    # the TTL).
    arrived = time.monotonic()
    lock = _SHARED_LOCKS[dlq_groups]
    if not lock.acquire(blocking=False):
        # Another thread builds. Django gives each in-flight request a thread and a
        # database connection of its own: dozens of requests queued here would hold
        # dozens of idle connections (every page answered 500 on PostgreSQL, 100
        # connections, under the load test until this). Hand ours back while we wait;
        # the next query opens one again. Not inside a transaction, whose connection
        # must stay.
        if not connection.in_atomic_block:
            connection.close()
        lock.acquire()
    try:
        hit = _SHARED.get(dlq_groups)
        published = published_count()
        if hit is not None:
            started, count, data = hit
            if max(not_before, arrived - ttl) <= started and count == published:
                return data
        # The start time, not the end: whatever happened after this moment may be
        # missing from the copy, so only callers that need nothing newer may reuse it.
        started = time.monotonic()
        data = build_shared_snapshot(dlq_groups=dlq_groups)
        # Race: an event published while we built bumps the count past ``published``,
        # so the next caller rebuilds rather than trusting a copy that may predate it.
        _SHARED[dlq_groups] = (started, published, data)
        return data
    finally:
        lock.release()


def build_shared_snapshot(*, dlq_groups: bool) -> dict[str, Any]:
    """Everything the operations pages show but the user's ``can``. ``dlq_groups=False``
    (pages that only show the dead-letter totals) skips grouping every dead letter.

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
        "queues": queues_stats(queues.queue_names()),
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
