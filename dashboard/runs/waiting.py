"""Why is this waiting: a queued run's (and an in-progress repository's) place in line,
an estimate of when it starts, and what holds it (docs/scheduling.md#why-is-this-waiting).

``run_waiting(run)`` reads the run's RQ queue once (its job ids, head first), the
schedule, the pauses and the parked runs, and answers
``{position, eta_seconds, reason, class}``:

- ``position``: 1 for the next job its queue hands out. A run in the RQ list is at its
  index + 1 (a more urgent class is always ahead: ``infra.place``); a parked run is
  behind the whole list and then where the round-robin of parked runs
  (``dispatch.rotation``) releases it. None while it is in no line (a retry or lock wait
  scheduled for later, a job the reconciler still has to enqueue).
- ``eta_seconds``: position over the queue's recent throughput (runs of that queue
  finished in the last ``THROUGHPUT_WINDOW`` seconds), or the time left until a
  scheduled attempt; None when nothing finished recently.
- ``reason``: what each provider in ``REASON_PROVIDERS`` says, joined by "; ". A provider
  is a function of a ``WaitContext`` returning a sentence or None; other holds (per-host
  fetch limits, say) add theirs by appending to that list.

Reads only, and each read is one snapshot of a moving queue: a worker may take the head
between the list read and the database read, so a position can be one behind reality;
the next read is right again. Nothing here decides anything.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.db.models import Q
from django.utils import timezone
from rq.registry import ScheduledJobRegistry

from dashboard import infra, locks
from dashboard.models import JobAttempt, JobRun, Repository
from dashboard.runs import affinity, dispatch, fetch_limits

__all__ = [
    "REASON_PROVIDERS",
    "THROUGHPUT_WINDOW",
    "WaitContext",
    "repository_waiting",
    "run_waiting",
]

#: Seconds of finished runs the throughput (and so the ETA) is measured over.
THROUGHPUT_WINDOW = 600.0
#: At most this many jobs ahead are looked up to name the repositories ahead (the list
#: is short while fairness is on: at most the weight per repository).
AHEAD_LIMIT = 5000


@dataclass
class WaitContext:
    """What the providers see about one waiting run (read once per answer)."""

    run: JobRun
    klass: int
    #: The RQ queue's job ids, head first.
    queue_ids: list[str]
    #: The run's index in ``queue_ids``; None if it is not in the list.
    index: int | None
    #: Seconds until its scheduled attempt (a retry back-off, a lock wait); None if none.
    scheduled_in: float | None
    paused: bool
    #: Runs (job ids without the attempt) ahead of it in the list → (repository, class).
    ahead: list[tuple[int, int]] = field(default_factory=list)
    #: Parked: its repository's parked runs ahead of it in the same queue.
    parked_ahead: int = 0
    #: Parked: its repository's runs waiting in RQ (its share in use).
    share_used: int = 0
    weight: int = 0


Provider = Callable[[WaitContext], str | None]


def _paused(ctx: WaitContext) -> str | None:
    return f"queue {ctx.run.queue} is paused" if ctx.paused else None


def _lock(ctx: WaitContext) -> str | None:
    """A run whose last attempt was deferred because another job held its lock:
    "lock held by run 812, 8 s left" (or by whom the lease names)."""
    if ctx.scheduled_in is None:
        return None
    last = (
        JobAttempt.objects.filter(run=ctx.run).order_by("-number").values_list("outcome", flat=True)
    ).first()
    if last != JobAttempt.Outcome.DEFERRED:
        return None
    run = ctx.run
    key = run.chunk.lock_key() if run.chunk_id and run.chunk else run.repository.lock_key()
    try:
        info = locks.redlock().inspect(key)
    except Exception:  # the lock masters' trouble is shown on the Locks page, not here
        return None
    if info is None:
        return f"waiting for the lock {key}, now free"
    holder = info.get("holder") or {}
    job = str(holder.get("job") or "")
    other = JobRun.objects.filter(job_id=job.rsplit("-a", 1)[0]).values_list("pk", flat=True)
    who = f"run {other.first()}" if job and other.first() else (job or "another job")
    return f"lock held by {who}, {round(info['ttl_ms'] / 1000)} s left"


def _scheduled(ctx: WaitContext) -> str | None:
    if ctx.scheduled_in is None:
        return None
    return f"next attempt in {round(ctx.scheduled_in)} s"


def _parked(ctx: WaitContext) -> str | None:
    if not ctx.run.parked:
        return None
    return (
        f"fair share: {ctx.share_used} of its repository's runs already wait in "
        f"{ctx.run.queue} (weight {ctx.weight}); {ctx.parked_ahead} of its runs before it"
    )


def _in_line(ctx: WaitContext) -> str | None:
    if ctx.index is None and not ctx.run.parked:
        return None
    mine = ctx.run.repository_id
    same = {repo for repo, klass in ctx.ahead if klass == ctx.klass and repo != mine}
    urgent = sum(1 for _, klass in ctx.ahead if klass < ctx.klass)
    name = dispatch.CLASS_NAMES.get(ctx.klass, str(ctx.klass))
    parts = [f"behind {_count(len(same), 'repository', 'repositories')} in its class ({name})"]
    parts = parts if same else []
    if urgent:
        parts.append(f"behind {_count(urgent, 'more urgent job', 'more urgent jobs')}")
    if not parts and ctx.index is not None:
        parts.append(f"next in its class ({name})")
    return ", ".join(parts) or None


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _placement(ctx: WaitContext) -> str | None:
    """A chunk waiting on the queue of the worker host that holds its mirror
    (docs/scheduling.md#mirror-affinity)."""
    if ctx.index is not None or ctx.run.parked:
        return None
    return affinity.placement_reason(ctx.run)


def _fetch_host(ctx: WaitContext) -> str | None:
    """A sync whose fetch would wait for its git host's limit or backoff
    (docs/scheduling.md#per-host-fetch-limits)."""
    if ctx.run.kind != JobRun.Kind.SYNC:
        return None
    return fetch_limits.fetch_wait_reason(ctx.run.repository)


def _missing(ctx: WaitContext) -> str | None:
    if ctx.index is None and not ctx.run.parked and ctx.scheduled_in is None:
        if affinity.placement_reason(ctx.run) is not None:
            return None  # on a worker host's queue: _placement says where
        return "not in its queue yet: being enqueued (or the reconciler enqueues it)"
    return None


#: What may hold a waiting run, asked in order; every sentence that applies is shown.
#: Append a provider (``Callable[[WaitContext], str | None]``) to add a reason.
REASON_PROVIDERS: list[Provider] = [
    _paused,
    _lock,
    _scheduled,
    _parked,
    _in_line,
    _placement,
    _fetch_host,
    _missing,
]


def _throughput(queue: str) -> float:
    """Runs of ``queue`` finished per second over the last ``THROUGHPUT_WINDOW``."""
    since = timezone.now() - timedelta(seconds=THROUGHPUT_WINDOW)
    done = JobRun.objects.filter(queue=queue, finished_at__gte=since).count()
    return done / THROUGHPUT_WINDOW


def _eta(position: int | None, scheduled_in: float | None, rate: float) -> float | None:
    if scheduled_in is not None:
        return round(scheduled_in, 1)
    if position is None or rate <= 0:
        return None
    return round(position / rate, 1)


def _ahead_of(ids: list[str]) -> list[tuple[int, int]]:
    """(repository, class) of every run whose RQ job is in ``ids`` (other jobs: none)."""
    job_ids = [i.rsplit("-a", 1)[0] for i in ids]
    rows = JobRun.objects.filter(job_id__in=job_ids).select_related("repository")
    by_job = {r.job_id: r for r in rows}
    return [
        (run.repository_id, dispatch.run_class(run))
        for j in job_ids
        if (run := by_job.get(j)) is not None
    ]


def _parked_position(run: JobRun, klass: int, listed: int) -> tuple[int, int, int]:
    """``(position, parked runs of its repository before it, its share in use)`` of a
    parked run: behind the ``listed`` jobs of the RQ list, where the round-robin of the
    queue's parked runs of its class or a more urgent one releases it."""
    parked = (
        JobRun.objects.filter(queue=run.queue, state=JobRun.State.QUEUED, parked=True)
        .select_related("repository")
        .order_by("pk")
    )
    backlogs: dict[int, int] = {}
    weights: dict[int, int] = {}
    groups = dispatch.group_weights()  # one query, not one per parked run
    mine_before = 0
    for other in parked:
        if dispatch.run_class(other) > klass:
            continue
        if other.repository_id == run.repository_id and other.pk < run.pk:
            mine_before += 1
        backlogs[other.repository_id] = backlogs.get(other.repository_id, 0) + 1
        weights[other.repository_id] = dispatch.weight_of(other.repository, groups) or 1
    order = dispatch.rotation(backlogs, weights, rounds=mine_before + 1)
    seen = 0
    rank = len(order)
    for i, repo_id in enumerate(order):
        if repo_id == run.repository_id:
            if seen == mine_before:
                rank = i
                break
            seen += 1
    share = dispatch.waiting_count(run.repository_id, run.queue)
    return listed + rank + 1, mine_before, share


def run_waiting(run: JobRun) -> dict[str, Any] | None:
    """``{position, eta_seconds, reason, class}`` of a waiting run (queued, or failed
    awaiting its retry); None for a run that is running or has ended. Raises
    ``infra.QueueUnavailable`` while the queue server is unreachable."""
    if run.state not in dispatch.WAITING:
        return None
    klass = dispatch.run_class(run)
    q = infra.queue(run.queue)
    ids = q.get_job_ids()
    rq_id = run.rq_id()
    index = ids.index(rq_id) if rq_id in ids else None
    scheduled_in = None
    if index is None and not run.parked:
        registry = ScheduledJobRegistry(queue=q)
        if rq_id in registry:
            due = registry.get_scheduled_time(rq_id).timestamp()
            scheduled_in = max(0.0, due - time.time())
    paused = run.queue in infra.paused_queue_names()
    ctx = WaitContext(run=run, klass=klass, queue_ids=ids, index=index,
                      scheduled_in=scheduled_in, paused=paused)  # fmt: skip
    position: int | None = None
    if index is not None:
        ctx.ahead = _ahead_of(ids[: min(index, AHEAD_LIMIT)])
        position = index + 1
    elif run.parked:
        ctx.ahead = _ahead_of(ids[:AHEAD_LIMIT])
        ctx.weight = dispatch.weight_of(run.repository)
        position, ctx.parked_ahead, ctx.share_used = _parked_position(run, klass, len(ids))
    reasons = [text for provider in REASON_PROVIDERS if (text := provider(ctx))]
    return {
        "position": position,
        "eta_seconds": _eta(position, scheduled_in, _throughput(run.queue)),
        "reason": "; ".join(reasons) or "waiting",
        "class": dispatch.CLASS_NAMES.get(klass, str(klass)),
    }


_IN_PROGRESS = (Repository.Status.QUEUED, Repository.Status.SYNCING, Repository.Status.ANALYZING)


def repository_waiting(repo: Repository) -> dict[str, Any] | None:
    """The waiting of a repository in progress (queued, syncing, analysing): its first
    waiting run's position and reason, and the ETA of its last one (when the last of
    what it waits for should start); ``{"position": None, "reason": "running", …}``
    when nothing of it waits. None for a repository that is ready or failed. Raises
    ``infra.QueueUnavailable`` while the queue server is unreachable."""
    if repo.status not in _IN_PROGRESS:
        return None
    waiting = list(
        JobRun.objects.filter(repository=repo, state__in=dispatch.WAITING)
        # another version's analyze runs (verification work) do not hold it up
        .exclude(Q(kind=JobRun.Kind.ANALYZE) & ~Q(fingerprint=repo.fingerprint))
        .select_related("repository", "chunk")
        .order_by("parked", "pk")
    )
    if not waiting:
        running = JobRun.objects.filter(repository=repo, state=JobRun.State.RUNNING).count()
        return {
            "position": None,
            "eta_seconds": None,
            "reason": f"running ({running} runs)" if running else "running",
            "class": dispatch.CLASS_NAMES.get(int(repo.priority), str(repo.priority)),
        }
    answers = [(run, run_waiting(run)) for run in (waiting[0], waiting[-1])]
    first = next((a for _, a in answers if a is not None), None)
    if first is None:
        return None
    last = answers[-1][1] or first
    parked = sum(1 for run in waiting if run.parked)
    reason = first["reason"] + (f"; {parked} more of its runs parked" if parked else "")
    return {
        "position": first["position"],
        "eta_seconds": last["eta_seconds"],
        "reason": reason,
        "class": first["class"],
    }
