"""What the live views show: the operations snapshot (every operations page and the
``/ws/ops/`` socket), and one repository's live state (its page and ``/ws/repos/N/``).

Everything here reads. A snapshot is sent on connect and on request; events keep it
fresh in between (``dashboard.infra.events``).

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
the TTL stale (twice the TTL while another request of the process is building the
next copy: it gets the current one instead of waiting, unless that copy may predate an
action of the same user served here, ``live.OWN_EVENTS``); its socket's first snapshot,
built after the join, corrects it.

The web processes of one host share their copies through the queue server
(``SHARED_KEY``): a process that needs a new copy first reads the host's latest one
(one ``GET``) and builds only if that is too old for it by the same rules, then stores
what it built. So a host builds about once per TTL, not once per TTL per process. Times
stored there are wall-clock (``time.time``), comparable between the processes of one
host, which is why the key is per host: another host's clock may differ.
"""

from __future__ import annotations

import contextlib
import json
import pickle
import socket
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any, TypeVar, cast

from django.conf import settings
from django.db import connection
from django.db.models import Q
from rq import Queue

from dashboard import analytics, infra
from dashboard import locks as dashboard_locks
from dashboard.infra import OWN_EVENTS, QueueUnavailable, dropped_events, published_count
from dashboard.locks import worker_rows
from dashboard.models import BulkAction, Chunk, JobAttempt, JobRun, Repository
from dashboard.operations import queues_stats, quorum, redis_nodes, series
from dashboard.repositories import current_fingerprint, repository_status
from dashboard.runs import dead_runs, fetch_host_rows, list_groups
from workers import locks as workers_locks

T = TypeVar("T")


def user_can(user: Any) -> dict[str, bool]:
    staff = bool(getattr(user, "is_staff", False))
    return {
        "retry": staff and user.has_perm("dashboard.retry_jobrun"),
        "discard": staff and user.has_perm("dashboard.discard_jobrun"),
        "force_release": staff and user.has_perm("dashboard.force_release_lock"),
        "pause": staff and user.has_perm("dashboard.pause_queue"),
    }


#: ``{dlq_groups: (build started (wall clock), events published here by then, snapshot)}``
_SHARED: dict[bool, tuple[float, int, dict[str, Any]]] = {}
#: Single flight: one thread builds while the others wait for its copy rather than
#: building the same one (each HTTP request runs its sync view on a thread of its own,
#: dashboard/server/request_threads.py, and the consumers' and the reconciler's threads ask too).
#: One per variant, so a slow dead-letter grouping does not hold up the other pages.
_SHARED_LOCKS = {True: threading.Lock(), False: threading.Lock()}
#: The host's latest copy of each variant on the queue server: a pickle of
#: ``(build started (wall clock), snapshot)``. Pickle, like RQ's own jobs on the same
#: server (which is trusted with code to run), so the pages get the same types a local
#: build gives them.
SHARED_KEY = "gitward:snapshot:{host}:{variant}"
#: ``published_count()`` as last seen, and the wall-clock time it was first seen so: an
#: event this process published is older than that moment.
_SEEN = {"count": 0, "at": 0.0}


def ops_snapshot(
    *, user: Any = None, dlq_groups: bool = True, not_before: float = 0.0
) -> dict[str, Any]:
    """Everything the operations pages show (the shared part at most
    ``GITWARD_SNAPSHOT_TTL`` old, and built after ``not_before`` (``time.monotonic``);
    see the module docstring) with this user's ``can`` and this process's count of
    dropped live events. The shared part is one dict for every caller: read it, never
    change it."""
    viewer = int(user.pk) if user is not None and user.is_authenticated else None
    shared = shared_snapshot(dlq_groups=dlq_groups, not_before=not_before, viewer=viewer)
    return {
        **shared,
        "live_events_dropped": dropped_events(),
        "can": user_can(user) if user is not None else {},
    }


def shared_snapshot(
    *, dlq_groups: bool, not_before: float = 0.0, viewer: int | None = None
) -> dict[str, Any]:
    """The user-independent part of the operations snapshot, cached per process and
    shared between the processes of a host (see the module docstring). ``viewer``: the
    user asking, whose own actions the copy must show (``_stale_copy``)."""
    ttl = float(settings.SNAPSHOT_TTL)
    if ttl <= 0:
        return build_shared_snapshot(dlq_groups=dlq_groups)
    # Freshness is measured from the request's arrival, not from when it gets the lock:
    # a copy whose build started at most ``ttl`` before the request came is good for
    # it, so everyone who queued behind a slow build shares that build rather than
    # each building anew once the copy has aged (on a busy host a build can outlast
    # the TTL). In wall-clock time, so that other processes' copies compare.
    arrived = time.time()
    need = max(arrived - ttl, arrived - (time.monotonic() - not_before) if not_before else 0.0)
    lock = _SHARED_LOCKS[dlq_groups]
    if not lock.acquire(blocking=False):
        # Another thread builds. A page or ``/api/status`` (no ``not_before``) takes
        # this process's copy if it is at most twice the TTL old and began after every
        # event published here for this viewer (their own actions, and those of
        # nobody in particular), rather than waiting for the build: under the load
        # test on PostgreSQL, requests spent a third of their time parked here.
        # Sockets (``not_before``) still wait: they must not get a copy older than
        # what they already showed.
        stale = _stale_copy(dlq_groups, need=need - ttl, viewer=viewer) if not not_before else None
        if stale is not None:
            return stale
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
        published = published_count()
        if published != _SEEN["count"]:
            # This process published an event since we last looked, at some moment
            # before now: only a copy started after now is sure to include it. Race:
            # the two variants' builders may both get here (different locks); each
            # writes a moment after the event, so either value is safe.
            _SEEN.update(count=published, at=time.time())
        need = max(need, _SEEN["at"])
        hit = _SHARED.get(dlq_groups)
        if hit is not None:
            started, count, data = hit
            if need <= started and count == published:
                return data
        stored = _read_host_copy(dlq_groups)
        if stored is not None and need <= stored[0]:
            _SHARED[dlq_groups] = (stored[0], published, stored[1])
            return stored[1]
        # The start time, not the end: whatever happened after this moment may be
        # missing from the copy, so only callers that need nothing newer may reuse it.
        started = time.time()
        data = build_shared_snapshot(dlq_groups=dlq_groups)
        # Race: an event published while we built bumps the count past ``published``,
        # so the next caller rebuilds rather than trusting a copy that may predate it.
        _SHARED[dlq_groups] = (started, published, data)
        _store_host_copy(dlq_groups, started, data, ttl)
        return data
    finally:
        lock.release()


def _stale_copy(dlq_groups: bool, *, need: float, viewer: int | None) -> dict[str, Any] | None:
    """This process's copy, if its build started at ``need`` or later and after the
    latest event published here that ``viewer`` must see (``live.OWN_EVENTS``: their
    own, or nobody's in particular; another user's action may be missing from it, as an
    action served by another web process may be from any copy). Read without the lock:
    ``_SHARED`` entries are replaced whole, never changed, so the tuple read is one
    consistent copy. Race: an event of the viewer's published after this check belongs
    to a request of theirs still running, so no later page of theirs got this copy."""
    hit = _SHARED.get(dlq_groups)
    if hit is None:
        return None
    started, _count, data = hit
    if started < need or OWN_EVENTS.last_for(viewer) >= started:
        return None
    return data


def _host_key(dlq_groups: bool) -> str:
    return SHARED_KEY.format(
        host=socket.gethostname(), variant="groups" if dlq_groups else "totals"
    )


def _read_host_copy(dlq_groups: bool) -> tuple[float, dict[str, Any]] | None:
    """The host's latest copy, or None (none yet, expired, or the queue server down:
    then this process builds its own, as before sharing)."""
    try:
        raw = infra.connection().get(_host_key(dlq_groups))
    except QueueUnavailable:
        return None
    if not raw:
        return None
    started, data = pickle.loads(raw)  # type: ignore[arg-type]  # noqa: S301 (ours)
    return float(started), data


def _store_host_copy(dlq_groups: bool, started: float, data: dict[str, Any], ttl: float) -> None:
    """Share a fresh build with the host's other processes. Race: two processes that
    build at once both store, the slower last, so the stored copy may be older than the
    newest build; a reader checks the start time against what it needs either way, so
    that costs a build, never a stale page. Kept twice the TTL: no reader wants older."""
    # Queue server down: this process keeps its copy; the others build their own.
    with contextlib.suppress(QueueUnavailable):
        infra.connection().set(
            _host_key(dlq_groups),
            pickle.dumps((started, data), protocol=pickle.HIGHEST_PROTOCOL),
            px=max(1, int(ttl * 2000)),
        )


#: ``{name: (built (monotonic), events published here by then, value)}``
_PARTS: dict[Hashable, tuple[float, int, Any]] = {}


def copy_generation() -> tuple[Any, ...]:
    """Which copies this process holds now (their build start times): changes whenever
    it takes a newer copy of either variant, built here or read from the host's.
    ``dashboard.web.page_cache`` reuses a page only while this is what it was rendered with."""
    return tuple(sorted((variant, hit[0]) for variant, hit in _SHARED.items()))


def shared_part(name: Hashable, build: Callable[[], T], *, fresh: bool = False) -> T:
    """A part of a page that is the same for every viewer (the overview's day charts,
    the unfiltered dead-letter groups, …), reused by this process for
    ``GITWARD_SNAPSHOT_TTL`` like the snapshot, and dropped when this process publishes
    an event (an operator's action served here shows at once). 0 builds it every time.
    Read the value, never change it. ``name`` must come from a small set (the cache is
    never pruned): the callers use it only for unfiltered, low page numbers.

    ``fresh`` builds it anew (and keeps that): a live region's refetch
    (``page_cache.FRESH_HEADER``) is for an event or a snapshot newer than the page,
    and an event another process published (a worker's dead letter) drops no copy here.

    Race: two threads that miss at once both build and the last one's value stays;
    both values are as fresh as the rules ask, so nothing stale is served."""
    ttl = float(settings.SNAPSHOT_TTL)
    if ttl <= 0:
        return build()
    now = time.monotonic()
    published = published_count()
    hit = _PARTS.get(name)
    if not fresh and hit is not None and now - hit[0] <= ttl and hit[1] == published:
        return cast(T, hit[2])
    value = build()
    _PARTS[name] = (now, published, value)
    return value


#: ``{fragment: (the inputs it was rendered from, its HTML)}``: the latest rendering of
#: each fragment only (a template node's, so the set is the templates' fragments).
_FRAGMENTS: dict[Hashable, tuple[tuple[Any, ...], str]] = {}
_PLAIN = (str, int, float, bool, type(None))


def _same_inputs(old: tuple[Any, ...], new: tuple[Any, ...]) -> bool:
    """The same objects (a snapshot's lists and dicts, a shared part), or equal plain
    values (a permission, a filter text). Identity, not equality, for the rest: a copy
    is never changed after it is built (see ``ops_snapshot``), so the same object means
    the same content, and comparing it whole would cost what rendering costs. The
    stored entry keeps its inputs alive, so a new object cannot take an old one's id."""
    return len(old) == len(new) and all(
        a is b or (type(a) is type(b) and isinstance(a, _PLAIN) and a == b)
        for a, b in zip(old, new, strict=True)
    )


def shared_render(fragment: Hashable, inputs: tuple[Any, ...], render: Callable[[], str]) -> str:
    """A page fragment rendered once for as long as ``inputs`` stay the same objects:
    the tables drawn from a snapshot copy (locks, workers, queues, masters), the shared
    parts (``shared_part``), with the viewer's permissions among the inputs when the
    fragment draws buttons. Every operator's page then reuses the HTML of the copy it
    shows instead of rendering the same rows again (the ``{% shared %}`` template tag).

    Only with a snapshot TTL (``GITWARD_SNAPSHOT_TTL`` > 0; 0 renders every time), and
    the HTML is exactly what rendering would give for those inputs, with one
    exception: a relative time in it ("3 s ago") is as of the first rendering, so up to
    the copy's life (the TTL) older, as the copy's data is; the page's script keeps
    those texts current anyway. Never around anything of the request itself (the CSRF
    token, messages, the user) unless it is among the inputs.

    Race: two threads rendering one fragment at once both render and the last stores;
    a reader compares the stored inputs with its own before using the HTML, so it never
    gets another copy's rows."""
    if float(settings.SNAPSHOT_TTL) <= 0:
        return render()
    hit = _FRAGMENTS.get(fragment)
    if hit is not None and _same_inputs(hit[0], inputs):
        return hit[1]
    html = render()
    _FRAGMENTS[fragment] = (inputs, html)
    return html


def build_shared_snapshot(*, dlq_groups: bool) -> dict[str, Any]:
    """Everything the operations pages show but the user's ``can``. ``dlq_groups=False``
    (pages that only show the dead-letter totals) skips grouping every dead letter.

    Never fails on Redis: an unreachable queue server is ``queue_server: {ok: false,
    error: "queue server unreachable"}`` (its queue counts None), locks come from the
    lock masters that answer, and no quorum is an empty lock table with ``quorum``
    saying why."""
    nodes = redis_nodes()
    q = quorum(nodes)
    server = infra.queue_server()
    try:
        locks = dashboard_locks.lock_rows() if q["up"] else []
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
        "queues": queues_stats(infra.queue_names()),
        "series": series(),
        "locks": locks,
        "contention": dashboard_locks.contention(),
        "workers": worker_rows(),
        "dlq": dlq,
        # the integrity group beside the dead letters (docs/analytics.md#verification):
        # its count, and the marks the Dead letters page compares to redraw the group
        "integrity": analytics.open_mismatch_count(),
        "integrity_marks": analytics.open_mismatch_marks(),
        # the Workers page's Git hosts table (docs/scheduling.md#per-host-fetch-limits)
        "fetch_hosts": fetch_host_rows(),
        "actions": [
            {"id": a.pk, "kind": a.kind, "state": a.state, "done": a.done, "total": a.total}
            for a in actions
        ],
        "fingerprint": current_fingerprint(),
        "activity": infra.recent(),
    }


def fresh_locks() -> list[dict[str, Any]] | None:
    """The lock table of a snapshot copy this process already holds, if that copy is as
    fresh as a page may be (its build started at most ``GITWARD_SNAPSHOT_TTL`` ago, and
    no event was published here since) and was read with a quorum of masters up; else
    None. Never builds and never reads the host's stored copy: a host where nobody opens
    an operations page keeps asking the masters, as before. Read the rows, never change
    them (they are the copy's).

    Race: ``list(_SHARED.values())`` copies the dict's entries in one step under the
    interpreter lock, so a builder storing a new copy meanwhile only means this call
    sees the old or the new entry, each checked against the same freshness rule."""
    ttl = float(settings.SNAPSHOT_TTL)
    if ttl <= 0:
        return None
    oldest = time.time() - ttl
    published = published_count()
    best: tuple[float, list[dict[str, Any]]] | None = None
    for started, count, data in list(_SHARED.values()):
        if started < oldest or count != published or not data["quorum"].get("up"):
            continue
        if best is None or started > best[0]:
            best = (started, data["locks"])
    return best[1] if best is not None else None


def repository_locks(repo_id: int, *, shared: bool = False) -> list[dict[str, Any]]:
    """The held locks of one repository (``leases.lock_rows(repo_id=…)``). With
    ``shared`` (the repository page), the rows of a fresh snapshot copy this process
    holds (``fresh_locks``) when there is one: the same rows, keys under the same prefix
    in the same order, at most the TTL old like any page drawn from the copy, without a
    SCAN and an inspection round on every master per view; the page's socket sends a
    fresh reading (``shared=False``) once it joins."""
    rows = fresh_locks() if shared else None
    if rows is None:
        return dashboard_locks.lock_rows(repo_id=repo_id)
    prefix = workers_locks.repo_prefix(repo_id)
    return [row for row in rows if row["key"].startswith(prefix)]


def repository_live(
    repo_id: int,
    *,
    repo: Repository | None = None,
    state: dict[str, Any] | None = None,
    shared_locks: bool = False,
    marks: bool = False,
) -> dict[str, Any]:
    """Progress, the chunks being analysed and by whom, and why the rest waits. The
    repository page passes the row and ``repository_status`` it has just read, which
    are then not read again (the status counts the stored commits), and
    ``shared_locks`` (see ``repository_locks``). ``marks``: with ``results_marks`` (the
    socket's snapshots, for the analytics pages; two more queries)."""
    repo = repo if repo is not None else Repository.objects.get(pk=repo_id)
    state = state if state is not None else repository_status(repo)
    holders = repository_locks(repo_id, shared=shared_locks)
    out = {**state, "holders": holders, "waiting": why_waiting(repo)}
    if marks:
        out["results_marks"] = results_marks(state, analytics.verification_status(repo))
    return out


def results_marks(state: dict[str, Any], verification: dict[str, Any] | None) -> str:
    """What a repository's served results depend on, as one JSON string: the served
    fingerprint, the analysed head, how many commits are stored and when the analysis
    ended (``repository_status``), and the verification's state, pass time and whether
    it withholds them (``analytics.verification_status``). An analytics page carries the
    marks it was rendered from (``#analytics-results[data-marks]``); a snapshot of
    ``/ws/repos/N/`` with other marks, once the repository is not being analysed, makes
    gitward.js fetch the page again and swap its results in (docs/live-view.md): a push
    analysed, a re-analysis, a verification pass or a clear. Times are ISO strings, so
    the page's and the snapshot's marks of the same rows are the same text."""
    v = verification
    return json.dumps(
        [
            state["fingerprint"],
            state["head"],
            state["commits_analyzed"],
            state["analyzed_at"],
            [v["state"], v["checked_at"], v["withheld"]] if v is not None else None,
        ],
        separators=(",", ":"),
    )


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
    redlock = dashboard_locks.redlock()
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
            position = Queue(run.queue, connection=infra.connection()).get_job_position(run.rq_id())
        except infra.QueueUnavailable:
            reasons.append(f"{label}: queued ({infra.QUEUE_DOWN}; enqueued when it returns)")
            continue
        if position is not None:
            reasons.append(f"{label}: queued, position {position + 1}")
        elif run.state == JobRun.State.FAILED:
            reasons.append(f"{label}: waiting to retry (attempt {run.attempts + 1})")
        else:
            reasons.append(f"{label}: queued")
    return reasons
