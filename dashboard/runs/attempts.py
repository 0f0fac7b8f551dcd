"""Job runs and their attempts: the lifecycle of docs/lifecycle.md, driven by the database.

States of a run: ``queued → running → succeeded | failed → (retry) queued … → dead``.
Every transition is a conditional UPDATE on (state, attempts): when two processes race
to move the same run (a worker finishing late, the reconciler declaring it dead, an
operator retrying it), exactly one UPDATE matches and the others do nothing.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import traceback as tb
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q, QuerySet
from django.utils import timezone
from rq.job import Job
from rq.registry import ScheduledJobRegistry

from dashboard import infra, observability
from dashboard.infra import publish_event
from dashboard.models import AnalyzerVersion, Chunk, JobAttempt, JobRun, WorkerBeat
from dashboard.runs import dead_letter_counts, dispatch
from dashboard.runs.affinity import physical_queue
from dashboard.versions import GATE_OPEN, served_fingerprint
from workers.analysis import DEFAULT, queue_name
from workers.remotes import redact
from workers.runtime import failpoint

log = logging.getLogger(__name__)

#: The RQ entry point of each kind of run (``workers.jobs``), called ``(run_id, attempt)``.
#: The one table of job functions: the worker pool recognises a run's RQ job by it.
FUNCS = {
    JobRun.Kind.SYNC: "workers.jobs.sync_repository",
    JobRun.Kind.ANALYZE: "workers.jobs.analyze_chunk",
}


def is_run_job(func_name: str, args: tuple[Any, ...] | list[Any]) -> bool:
    """Whether an RQ job (by function name and arguments) is an attempt of a run."""
    return func_name in FUNCS.values() and len(args) == 2


# ---------------------------------------------------------------------------- creating


def ensure_run(
    *,
    kind: str,
    job_id: str,
    queue: str,
    repository_id: int,
    chunk_id: int | None = None,
    generation: int = 0,
    fingerprint: str = "",
) -> JobRun:
    """Get or create the run for a deterministic job id (idempotent: a duplicate
    submission or a re-plan finds the same row)."""
    run, _ = JobRun.objects.get_or_create(
        job_id=job_id,
        defaults={
            "kind": kind,
            "queue": queue,
            "repository_id": repository_id,
            "chunk_id": chunk_id,
            "generation": generation,
            "fingerprint": fingerprint,
        },
    )
    return run


def enqueue_run(run: JobRun, *, delay: float = 0.0) -> bool:
    """Put the run's next attempt on its queue (after ``delay`` seconds). Idempotent:
    the RQ id names the attempt, and RQ refuses a second live job with that id.

    An analyze run stays on its version's physical queue (retries stay on their
    version: a chunk is planned per fingerprint). If that version's gate is closed
    (draining after a rollback or a promote) the run is cancelled instead: no worker
    would take it, and the served version has its own plan."""
    if run.kind == JobRun.Kind.ANALYZE and run.fingerprint in closed_fingerprints():
        cancel_runs(fingerprint=run.fingerprint, reason="its analyzer version is closed")
        return False
    # -- mirror affinity (docs/scheduling.md#mirror-affinity): the physical queue -----
    physical = physical_queue(run, delay=delay)
    # -- end mirror affinity ------------------------------------------------------------
    new = infra.enqueue_unique(
        infra.queue(physical),
        FUNCS[JobRun.Kind(run.kind)],
        run.pk,
        run.attempts + 1,
        job_id=run.rq_id(),
        delay=delay,
        priority=dispatch.run_class(run),
        express=dispatch.express(run),  # docs/scheduling.md#the-reserved-interactive-slot
    )
    if new:
        _event("job.queued", run, delay=delay)
    return new


def repository_name(run: JobRun) -> str:
    """The run's repository's name (``Repository.name``: from the redacted URL), as
    pages and the activity feed show it. The run's loads select the repository with it
    (``select_related``), so on the job path this costs no query; elsewhere one."""
    return run.repository.name


def _event(kind: str, run: JobRun, **extra: Any) -> None:
    observability.record_run_event(kind, run)
    publish_event(
        kind,
        {
            "run": run.pk,
            "job": run.job_id,
            "kind": run.kind,
            "queue": run.queue,
            "repo": run.repository_id,
            "repo_name": repository_name(run),
            "attempt": run.attempts,
            "trace": observability.trace_id_of(run.job_id),
            **extra,
        },
        repo_id=run.repository_id,
    )


def closed_fingerprints() -> set[str]:
    """Fingerprints of versions whose gate is closed (``versions.GATE_OPEN``)."""
    return set(
        AnalyzerVersion.objects.exclude(state__in=GATE_OPEN).values_list("fingerprint", flat=True)
    )


def cancel_runs(*, fingerprint: str, reason: str) -> int:
    """Cancel every queued (or failed, awaiting retry) analyze run of ``fingerprint``
    and take its jobs out of Redis; returns how many. A cancelled run is ``discarded``
    with its chunk left queued, so planning that fingerprint again later resumes it
    (``chunk_plans._runs_for`` gives it a fresh budget).

    Race: a worker dequeues one of these jobs meanwhile. The cancel is a conditional
    UPDATE from queued/failed, and ``begin_attempt`` claims only queued/failed runs, so
    either the worker claimed first (the run is running and finishes: drains wait for
    it) or the cancel did (the worker's claim matches nothing and the job does nothing).
    """
    pending = JobRun.objects.filter(
        kind=JobRun.Kind.ANALYZE,
        fingerprint=fingerprint,
        state__in=[JobRun.State.QUEUED, JobRun.State.FAILED],
    ).select_related("repository")
    cancelled = 0
    conn = infra.connection()
    for run in list(pending):
        moved = JobRun.objects.filter(pk=run.pk, state=run.state, attempts=run.attempts).update(
            state=JobRun.State.DISCARDED, error=f"cancelled: {reason}"[:2000],
            finished_at=timezone.now(),
        )  # fmt: skip
        if not moved:
            continue
        cancelled += 1
        drop_rq_job(run, conn=conn)
        _event("job.deferred", run, delay=None, reason=f"cancelled: {reason}")
    return cancelled


def drop_rq_job(run: JobRun, *, conn: Any = None) -> None:
    """Take the RQ job of the run's next attempt out of its queue and the schedule, and
    delete the job's hash: a worker that dequeued the id meanwhile finds no job and
    skips it (pinned, with the list layout LREM relies on, by
    tests/dashboard/operations/test_rq_internals.py). For a run already moved out of
    queued/failed by the caller's conditional UPDATE."""
    conn = conn if conn is not None else infra.connection()
    q = infra.queue(run.queue)
    conn.lrem(q.key, 0, run.rq_id())
    # and off the worker host's queue it may wait on (docs/scheduling.md#mirror-affinity)
    origin = conn.hget(Job.key_for(run.rq_id()), "origin")
    origin = origin.decode() if isinstance(origin, bytes) else origin
    if origin and origin != run.queue:
        conn.lrem(infra.queue(origin).key, 0, run.rq_id())
    ScheduledJobRegistry(queue=q).remove(run.rq_id())
    conn.delete(Job.key_for(run.rq_id()))


def sweep_closed_queues(fingerprints: set[str]) -> int:
    """Sweep the queue of every closed version in ``fingerprints`` (``sweep_queue``);
    returns how many jobs were removed."""
    return sum(sweep_queue(queue_name(fp)) for fp in sorted(fingerprints))


def sweep_queue(name: str) -> int:
    """Remove the RQ jobs left in a closed version's queue ``name`` (listed or
    scheduled) that no run waits for: a job whose run has ended (succeeded, dead,
    discarded) or is at another attempt (two deliveries of one attempt, one claimed:
    ``chunk_plans._first_fresh``; a job the reconciler re-enqueued after its run moved
    on). No worker takes a job from a closed queue, so such a job would stay there for
    ever and keep the version's drain (``rollouts.drain_counts``) from ever finding it
    empty (docs/rollouts.md#drains-and-leftover-jobs). A job its run waits for is left
    to ``cancel_runs``. Returns how many were removed. Uses RQ's public queue, registry
    and job API. Called by the reconciler for every closed version and by each drain
    check for its version.

    Race: a run of a closed version queued again meanwhile. ``enqueue_run`` cancels
    instead of enqueueing on a closed gate, and a job is removed here only when its run,
    read after the job ids were listed, is not waiting for exactly that attempt
    (queued or failed with the job's id next); a job enqueued after the listing is not
    looked at. A version re-activated meanwhile (its gate open again) has its queue
    consumed again, and the job removed here was of an attempt its run no longer waits
    for (``begin_attempt`` claims only a waiting run's next attempt: it would do
    nothing if it ran)."""
    q = infra.queue(name)
    scheduled = ScheduledJobRegistry(queue=q)
    ids = [*q.get_job_ids(), *scheduled.get_job_ids()]
    if not ids:
        return 0
    waiting = {  # the next attempt of every run on this queue that waits for one
        run.rq_id()
        for run in JobRun.objects.filter(
            queue=q.name, state__in=[JobRun.State.QUEUED, JobRun.State.FAILED]
        ).only("job_id", "attempts")
    }
    removed = 0
    for job_id in ids:
        if job_id in waiting:
            continue  # cancel_runs' (the run is waiting for it)
        q.remove(job_id)
        scheduled.remove(job_id)
        job = Job.fetch_many([job_id], connection=q.connection)[0]
        if job is not None:
            job.delete(remove_from_queue=False)
        removed += 1
    return removed


def reroute_attempt(attempt: Attempt, *, queue: str, reason: str) -> bool:
    """Hand a misrouted attempt back: the run goes to ``queue`` (its version's own)
    without spending its budget — the worker that refused it did no work."""
    with transaction.atomic():
        moved = JobRun.objects.filter(
            pk=attempt.run.pk, attempts=attempt.number, state=JobRun.State.RUNNING
        ).update(state=JobRun.State.QUEUED, queue=queue, budget_base=F("budget_base") + 1)
        if not moved:
            return False
        JobAttempt.objects.filter(run=attempt.run, number=attempt.number).update(
            outcome=JobAttempt.Outcome.DEFERRED, error=redact(reason)[:2000],
            finished_at=timezone.now(),
        )  # fmt: skip
        run = JobRun.objects.select_related("repository").get(pk=attempt.run.pk)
        _event("job.deferred", run, delay=0.0, reason=redact(reason)[:300])
        transaction.on_commit(lambda: enqueue_run(run))
    WorkerBeat.objects.filter(name=attempt.worker, current_run=attempt.run).update(current_run=None)
    return True


def enqueue_or_leave(run: JobRun, *, delay: float = 0.0) -> bool:
    """``enqueue_run``, except that an unreachable queue server leaves the run as it is
    in the database (queued, or failed awaiting its retry): the reconciler enqueues
    every such run whose RQ job is missing once the queue server answers again. For
    on-commit callbacks, which must not fail the request or job that committed."""
    try:
        return enqueue_run(run, delay=delay)
    except infra.QueueUnavailable as exc:
        log.warning("run %s left for the reconciler: %s", run.pk, exc)
        return False


def enqueue_after_commit(run_ids: list[int]) -> None:
    """After commit, enqueue the runs still queued, through the dispatcher: analyze runs
    beyond their repository's share are parked instead (``dispatch.admit``,
    docs/scheduling.md#fairness)."""

    def go() -> None:
        queued = JobRun.objects.filter(pk__in=run_ids, state__in=[JobRun.State.QUEUED])
        for run in dispatch.admit(list(queued.select_related("repository"))):
            enqueue_or_leave(run)

    transaction.on_commit(go)


def release_parked(repo_id: int, queue: str) -> int:
    """Enqueue as many of the repository's parked runs in ``queue`` as its share has
    room for (``dispatch.take_parked``); returns how many. Called when one of its
    waiting runs is claimed, and by the reconciler for every repository with parked runs.
    A run unparked here whose enqueue fails (queue server down) is queued with no RQ
    job: the reconciler's step 2 enqueues it."""
    released = 0
    for run in dispatch.take_parked(repo_id, queue):
        if run.state == JobRun.State.QUEUED and enqueue_or_leave(run):
            released += 1
    return released


def release_all_parked() -> int:
    """The reconciler's safety net: ``release_parked`` for every repository and queue
    with parked runs, so a release lost to a crash (a work horse killed between its
    claim and its release) delays that repository by one reconciler round at most."""
    return sum(release_parked(repo_id, queue) for repo_id, queue in dispatch.parked_slots())


# ---------------------------------------------------------------------------- attempts


@dataclass
class Attempt:
    run: JobRun
    number: int
    worker: str
    #: Phase timings marked (``mark_phase``) and not stored yet: the outcome's UPDATE
    #: stores them (``succeed_attempt``), or ``flush_phases`` before a failure is recorded.
    phases: dict[str, Any] = field(default_factory=dict)


def begin_attempt(
    *, run_id: int, number: int, worker: str, version: str | None = None
) -> Attempt | None:
    """Claim attempt ``number`` of the run; None if it was already claimed or the run
    moved on (a redelivered or superseded job), in which case the caller does nothing.

    Race: the same RQ job delivered twice. Both UPDATEs filter on
    ``attempts = number - 1``; the first sets ``attempts = number``, so the second
    matches no row.

    One transaction (one turn of SQLite's write lock and one commit per job, not three):
    the claim, its attempt row and the worker's current run become visible together.
    """
    with transaction.atomic():
        attempt = _claim(run_id=run_id, number=number, worker=worker, version=version)
    if attempt is not None and attempt.run.kind == JobRun.Kind.ANALYZE:
        _release_after_claim(attempt.run)
    return attempt


def _release_after_claim(run: JobRun) -> None:
    """The claimed run no longer waits: release the repository's next parked run into
    its queue (docs/scheduling.md#fairness). After the claim committed, so a crash here
    loses only the release (the reconciler's ``release_all_parked`` makes it up), never
    the claim; a failure is logged and never fails the job."""
    failpoint("dispatch.release", run.repository.name)
    try:
        release_parked(run.repository_id, run.queue)
    except Exception:
        log.exception("release after the claim of run %s left to the reconciler", run.pk)


def _claim(*, run_id: int, number: int, worker: str, version: str | None) -> Attempt | None:
    now = timezone.now()
    claimed = JobRun.objects.filter(
        pk=run_id,
        attempts=number - 1,
        state__in=[JobRun.State.QUEUED, JobRun.State.FAILED],
    ).update(
        state=JobRun.State.RUNNING,
        attempts=number,
        worker=worker,
        host=settings.HOST_ID,
        pid=_pid(),
        version=version or DEFAULT.fingerprint(),
        started_at=now,
        finished_at=None,
        lock_acquired_at=None,
        fetched_at=None,
        analysed_at=None,
        written_at=None,
        error="",
    )
    if not claimed:
        return None
    run = JobRun.objects.select_related("repository").get(pk=run_id)
    JobAttempt.objects.create(
        run=run, number=number, worker=worker, host=run.host, pid=run.pid, version=run.version
    )
    WorkerBeat.objects.filter(name=worker).update(current_run=run, last_seen=now)
    _event("job.started", run, worker=worker)
    observability.claimed(run, worker=worker)
    return Attempt(run=run, number=number, worker=worker)


def _pid() -> int:
    return os.getpid()


def record_phase(attempt: Attempt, **fields: Any) -> None:
    """Record timings (``fetched_at=…``) on the run, if this attempt is still its own."""
    JobRun.objects.filter(pk=attempt.run.pk, attempts=attempt.number).update(**fields)
    observability.phase(fields)


def mark_phase(attempt: Attempt, **fields: Any) -> None:
    """``record_phase`` without a write of its own: the trace span now, the timing stored
    with the attempt's outcome (one UPDATE fewer per phase on the analyze path)."""
    attempt.phases.update(fields)
    observability.phase(fields)


def flush_phases(attempt: Attempt) -> None:
    """Store the marked phases now (before a failure, so the run shows how far it got)."""
    if attempt.phases:
        JobRun.objects.filter(pk=attempt.run.pk, attempts=attempt.number).update(**attempt.phases)
        attempt.phases.clear()


def record_lock(attempt: Attempt, *, key: str, token: int | None) -> None:
    """The attempt holds ``key`` with fencing ``token`` (shown on the run, from now)."""
    record_phase(attempt, lock_key=key, token=token, lock_acquired_at=timezone.now())


def succeed_attempt(attempt: Attempt) -> None:
    now = timezone.now()
    with transaction.atomic():
        done = JobRun.objects.filter(
            pk=attempt.run.pk, attempts=attempt.number, state=JobRun.State.RUNNING
        ).update(state=JobRun.State.SUCCEEDED, finished_at=now, error="", **attempt.phases)
        if done:
            JobAttempt.objects.filter(run=attempt.run, number=attempt.number).update(
                outcome=JobAttempt.Outcome.SUCCEEDED, finished_at=now
            )
            _event("job.succeeded", attempt.run)
        # in the same transaction: one commit per outcome
        WorkerBeat.objects.filter(name=attempt.worker, current_run=attempt.run).update(
            current_run=None
        )


def fail_attempt(
    attempt: Attempt, exc: BaseException, *, permanent: bool = False, reason: str | None = None
) -> str:
    """Record a failed attempt; schedule the next one or dead-letter the run.

    Returns the run's new state. ``permanent`` errors (the remote does not exist, the
    repository is too large) are not retried: the run goes to the DLQ at once.
    ``reason`` is what the repository shows users (default: "Type: message").
    """
    text = redact(f"{type(exc).__name__}: {exc}")[:2000]
    trace = redact("".join(tb.format_exception(exc)))[-20000:]
    key, title = cause_of(exc)
    state = _finish_failed(
        attempt.run.pk,
        attempt.number,
        text,
        trace,
        key,
        title,
        outcome=JobAttempt.Outcome.FAILED,
        permanent=permanent,
        reason=redact(reason) if reason else None,
    )
    WorkerBeat.objects.filter(name=attempt.worker, current_run=attempt.run).update(current_run=None)
    return state


def defer_attempt(attempt: Attempt, *, delay: float, reason: str) -> bool:
    """The attempt could not start its work because another job holds the lock: put
    the run back in the queue after ``delay`` without spending its budget (waiting for
    a lock is not a failure of the job)."""
    now = timezone.now()
    with transaction.atomic():
        moved = JobRun.objects.filter(
            pk=attempt.run.pk, attempts=attempt.number, state=JobRun.State.RUNNING
        ).update(state=JobRun.State.QUEUED, budget_base=F("budget_base") + 1)
        if not moved:
            return False
        JobAttempt.objects.filter(run=attempt.run, number=attempt.number).update(
            outcome=JobAttempt.Outcome.DEFERRED, error=redact(reason)[:2000], finished_at=now
        )
        run = JobRun.objects.select_related("repository").get(pk=attempt.run.pk)
        _event("job.deferred", run, delay=delay, reason=redact(reason)[:300])
        transaction.on_commit(lambda: enqueue_or_leave(run, delay=delay))
    WorkerBeat.objects.filter(name=attempt.worker, current_run=attempt.run).update(current_run=None)
    return True


def hand_back_attempt(*, run_id: int, number: int, worker: str, reason: str) -> bool:
    """A stopping worker ran out of its grace (``GITWARD_WORKER_GRACE``) and killed the
    work horse running attempt ``number``: the run goes back to its queue at once
    without spending its budget (a shutdown is no fault of the job). False if the
    attempt had already ended (the horse finished just before it was killed).

    Safe against a double write: the caller has reaped the horse first (its open
    transaction rolled back with it), and ``defer_attempt`` moves the run only while
    that attempt is still the running one; a write the horse committed is fenced and
    idempotent for the retry like any crash's."""
    run = JobRun.objects.filter(pk=run_id).first()
    if run is None:
        return False
    return defer_attempt(Attempt(run=run, number=number, worker=worker), delay=0.0, reason=reason)


def running_runs_of(*, worker: str, pid: int) -> list[tuple[int, int]]:
    """``(run id, attempt)`` of every run still running that a work horse of ``worker``
    on this host with ``pid`` claimed (``_claim`` records host and pid): a sync's horse
    also runs the chunk it planned first (``workers.jobs.sync_repository``), which the
    RQ job's arguments do not name. For a worker that has just reaped that horse.

    Race: the pid is reused by a later horse only after this worker reaped the dead
    one, and this worker forks its next horse only after this lookup; another worker's
    horse with the same pid has another worker name."""
    return list(
        JobRun.objects.filter(
            state=JobRun.State.RUNNING, worker=worker, host=settings.HOST_ID, pid=pid
        ).values_list("pk", "attempts")
    )


def crash_attempt(*, run_id: int, number: int, reason: str) -> str | None:
    """The worker running attempt ``number`` died (its work horse was killed, or its
    heartbeat stopped). Counts as a failed attempt. None if the attempt had already
    ended (the worker finished just before it died, or someone else handled it)."""
    key = hashlib.sha1(b"WorkerDied").hexdigest()[:16]  # noqa: S324 - a grouping key
    return _finish_failed(
        run_id,
        number,
        f"WorkerDied: {reason}",
        "",
        key,
        "WorkerDied: worker died while running the job",
        outcome=JobAttempt.Outcome.CRASHED,
        permanent=False,
    )


def _finish_failed(
    run_id: int,
    number: int,
    text: str,
    trace: str,
    key: str,
    title: str,
    *,
    outcome: str,
    permanent: bool,
    reason: str | None = None,
) -> str:
    now = timezone.now()
    with transaction.atomic():
        run = (
            JobRun.objects.select_for_update()
            .filter(pk=run_id, attempts=number, state=JobRun.State.RUNNING)
            .first()
        )
        if run is None:
            return ""
        JobAttempt.objects.filter(run=run, number=number).update(
            outcome=outcome, error=text, traceback=trace, finished_at=now
        )
        dead = permanent or run.budget_used >= settings.MAX_ATTEMPTS
        run.state = JobRun.State.DEAD if dead else JobRun.State.FAILED
        run.error = text
        run.cause_key = key
        run.cause = title[:500]
        run.finished_at = now
        run.save(update_fields=["state", "error", "cause_key", "cause", "finished_at"])
        _event("job.dead" if dead else "job.failed", run, error=text[:500], cause=run.cause)
        if dead:
            _dead_letter(run, reason or text)
            dead_letter_counts.changed()
            publish_event("dlq.changed", {})
        else:
            delays = settings.RETRY_BACKOFF
            delay = delays[min(run.budget_used, len(delays)) - 1] if delays else 0.0
            transaction.on_commit(lambda: enqueue_or_leave(run, delay=delay))
    return str(run.state)


def _dead_letter(run: JobRun, text: str) -> None:
    """A run is dead: its chunk is failed and, if the run is the repository's own, its
    repository shows the reason. A sync fails only its own generation; a chunk fails
    the repository only when it is of the served version and of the repository's last
    plan: a ramping or warming version's chunk (or a closed version's) counts toward
    that version's health and shows in the dead letters, never on the repository
    (docs/lifecycle.md#statuses). Emits a slim ``repo.changed`` after commit.

    Race: a promote or rollback commits between the read of the served fingerprint and
    the UPDATE. ``fail`` filters on the repository's planned fingerprint in the same
    UPDATE, so a chunk of a version that just became served fails nothing (the
    repository's plan is still the previous version's until its catch-up), and one of a
    version that just stopped being served fails a repository the catch-up re-syncs
    anyway (``chunk_plans.needs_catch_up``: failed under a version no longer served)."""
    reason = text.strip().split("\n", 1)[0][:500]
    if run.chunk_id:
        failed = (
            Chunk.objects.filter(pk=run.chunk_id)
            .exclude(state__in=[Chunk.State.DONE, Chunk.State.DROPPED])
            .update(state=Chunk.State.FAILED, error=reason)
        )
        # A chunk a rewrite dropped (docs/analysis.md: its commits are no longer
        # reachable from the head) stays dropped, and its death fails nothing: the
        # repository analyses a history without it. Race: the rewrite's plan drops the
        # chunk after this UPDATE failed it; the plan sets ``dropped`` over ``failed``
        # in its fenced transaction (``chunk_plans``), so the chunk ends dropped either
        # way, and the repository's status is then the one that plan writes.
        if not failed and Chunk.objects.filter(pk=run.chunk_id, state=Chunk.State.DROPPED).exists():
            return
    repo = run.repository
    if run.kind == JobRun.Kind.SYNC:
        repo.fail(reason, generation=run.generation)
    elif run.fingerprint == served_fingerprint():
        repo.fail(reason, fingerprint=run.fingerprint)
    else:
        return  # another version's chunk: its repository is not touched
    # Race: if ``fail`` changed nothing (ready, or a newer generation), the status read
    # here may be overtaken by a concurrent commit; harmless, since watchers fetch a
    # fresh snapshot on every ``repo.changed``. If it failed the row, it is exact.
    publish_event(
        "repo.changed",
        {
            "repo": repo.pk,
            "name": repo.name,
            "url": repo.shown_url,
            "status": repo.status,
            "error": repo.error or None,
        },
        repo_id=repo.pk,
    )


# ---------------------------------------------------------------------------- causes

_PATTERNS = [
    (re.compile(r"(/[\w.\-]+)+"), "<path>"),
    (re.compile(r"\b[0-9a-f]{7,40}\b"), "<sha>"),
    (re.compile(r"'[^']*'|\"[^\"]*\""), "'…'"),
    (re.compile(r"\d+(\.\d+)?"), "N"),
]


def normalise_message(message: str) -> str:
    text = message.strip().split("\n", 1)[0]
    for pattern, repl in _PATTERNS:
        text = pattern.sub(repl, text)
    return text[:200]


def cause_of(exc: BaseException) -> tuple[str, str]:
    """(key, title) of the root cause: exception type + normalised message + top frame
    of our own code (where it surfaced in gitward)."""
    root: BaseException = exc
    frame = ""
    for entry in reversed(tb.extract_tb(exc.__traceback__)):
        if entry.filename.endswith("failpoints.py"):
            continue  # an injected fault: the caller is where it "happened"
        if "/workers/" in entry.filename or "/dashboard/" in entry.filename:
            module = entry.filename.rsplit("/", 2)[-2:]
            frame = f"{'/'.join(module)}:{entry.name}"
            break
    title = f"{type(root).__name__}: {normalise_message(str(root))}"
    key = hashlib.sha1(f"{title}|{frame}".encode()).hexdigest()[:16]  # noqa: S324 - grouping
    return key, f"{title} @ {frame}" if frame else title


def search_runs(
    *, state: str = "", kind: str = "", repo: int | None = None, text: str = "",
    before: int | None = None, limit: int = 50,
) -> tuple[list[JobRun], int | None]:  # fmt: skip
    """Runs newest first, filtered like ``GET /api/runs`` (state, kind, repository id,
    text in job id, cause, error or repository URL), keyset-paginated on the id. Reads
    only; the caller validates ``state`` and ``kind``. Returns the rows and the next
    cursor (None at the end)."""
    qs: QuerySet[JobRun] = JobRun.objects.select_related("repository")
    if state:
        qs = qs.filter(state=state)
    if kind:
        qs = qs.filter(kind=kind)
    if repo is not None:
        qs = qs.filter(repository_id=repo)
    if before is not None:
        qs = qs.filter(pk__lt=before)
    if text_q := run_text_filter(text):
        qs = qs.filter(text_q)
    rows = list(qs.order_by("-pk")[: limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    return rows, (rows[-1].pk if more and rows else None)


def run_text_filter(text: str) -> Q | None:
    """Runs whose job id, cause, error or repository URL holds ``text`` (None: no text)."""
    text = text.strip()[:200]
    if not text:
        return None
    return (
        Q(job_id__icontains=text)
        | Q(cause__icontains=text)
        | Q(error__icontains=text)
        | Q(repository__url__icontains=text)
    )
