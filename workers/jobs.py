"""RQ entry points. Each one: claim the attempt → take the lock → call core → record.

Arguments are ids only: ``(run_id, attempt)``. The attempt is claimed in the database
first (``dashboard.runs.attempts.begin_attempt``), so a redelivered job does nothing; the work
itself is idempotent too, so a retry after a crash finds the work done (or half done
and not yet committed) and does exactly what is still missing.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import random
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.utils import timezone
from rq import get_current_job
from rq.job import Job
from rq.utils import import_attribute

from dashboard import analytics, infra, locks, observability, repositories, rollouts, runs
from dashboard.models import JobRun, Repository
from dashboard.repositories import (
    claim_sync,
    current_fingerprint,
    publish_repo_changed,
    validate_remote,
    write_chunk,
)
from dashboard.runs import run_bulk
from workers.analysis import (
    DEFAULT,
    AnalyzerConfig,
    CommitRecord,
    CommitTooLarge,
    VersionNotLoaded,
    config_for,
    list_commits,
    queue_name,
    stream_commits,
)
from workers.git import (
    GitError,
    HostBusy,
    ProcessGroups,
    RepositoryUnavailable,
    Runner,
    mirror_head,
    mirror_path,
    pins_for,
    update_mirror,
)
from workers.locks import Lock, LockLost, LockNotAcquired
from workers.remotes import InvalidRemote, Remote
from workers.runtime import altered, failpoint, perturbs

log = logging.getLogger(__name__)


#: Failures that retrying cannot fix: the run is dead-lettered after one attempt.
PERMANENT: tuple[type[BaseException], ...] = (
    RepositoryUnavailable,
    InvalidRemote,
    CommitTooLarge,
)


#: The analyzer versions this process analyses with (``load_versions``; the pool's
#: worker of a version loads exactly that version's config). Forked work horses
#: inherit it.
_LOADED: list[AnalyzerConfig] = [DEFAULT]


def load_versions(configs: list[AnalyzerConfig]) -> None:
    """Set the versions this worker process loaded (before it takes any job)."""
    _LOADED[:] = list(configs) or [DEFAULT]


def loaded_fingerprints() -> list[str]:
    return [c.fingerprint() for c in _LOADED]


#: Whether this process is a reserved interactive slot's worker
#: (docs/scheduling.md#the-reserved-interactive-slot); forked work horses inherit it.
_EXPRESS: list[bool] = [False]


def serve_express(on: bool) -> None:
    """Mark this worker process as the reserved interactive slot's (before any job): its
    syncs analyse no large first chunk inline (``_inline_fingerprints``)."""
    _EXPRESS[0] = bool(on)


def sync_repository(run_id: int, attempt: int) -> str:
    """The sync attempt, then the first attempt of the chunk its plan left
    for this work horse (``plans.Plan.inline``), through the same lifecycle as an RQ
    delivery of it (``_execute``: claim, lease, fencing token, outcome).

    Order and crash windows:

    1. The plan commits with that run ``queued`` and no RQ job; the sync's attempt is
       recorded as succeeded. A horse that dies after the plan and before step 2 leaves
       the run queued with no job: the reconciler enqueues it (its step 2).
    2. The inline attempt is claimed in the database with this horse's host and pid.
       A horse killed from now on (SIGKILL, OOM, a cold shutdown) has the run crashed
       or handed back by its worker, which looks up every run this horse still runs
       (``workers.pool``: ``runs.running_runs_of``), not only the sync named in the RQ
       job's arguments; a dead worker's runs are the reconciler's (by worker name).
    3. Its outcome is recorded by ``_execute``; a failure is logged and never fails
       the sync's RQ job (the run's retry is an RQ job of its own, as for any attempt).

    The sync's RQ job timeout (``GITWARD_JOB_TIMEOUT``) covers both attempts.
    """
    with _express_marked():
        held = _Held()
        try:
            result = _execute(run_id, attempt, functools.partial(_sync, held=held))
        except BaseException:
            _enqueue_held(held.runs)  # the plan committed, the sync then failed
            raise
        if not held.synced:  # the body ended in a recorded failure or deferral after its plan
            _enqueue_held(held.runs)
            return result
        if held.runs and held.listed > settings.INTERACTIVE_MAX_COMMITS:
            _express_over()
        for inline in held.runs:
            failpoint("sync.inline", held.name)
            result += f"; first chunk inline: {_analyze_inline(inline)}"
        return result


@dataclass
class _Held:
    """The run a sync's plan left un-enqueued, and whether the sync body got to its end
    (then the horse analyses it; otherwise it is enqueued like the others)."""

    runs: list[int] = field(default_factory=list)
    synced: bool = False
    #: How many commits the plan listed, and the repository's name (a failpoint's tag).
    listed: int = 0
    name: str = ""


def _analyze_inline(run_id: int) -> str:
    """Attempt 1 of the held analyze run (``chunk_plans._first_fresh``: never attempted)."""
    try:
        return _execute(run_id, 1, _analyze)
    except Exception:  # recorded by _execute (fail_attempt: retried or dead-lettered)
        log.exception("inline analysis of run %s failed; recorded on the run", run_id)
        return "failed (recorded on its run)"


def _enqueue_held(held: list[int]) -> None:
    """Enqueue held runs still queued; on any trouble leave them to the reconciler, which
    enqueues a queued run with no RQ job (this is called on the way out of a failure)."""
    if not held:
        return
    try:
        for run in JobRun.objects.filter(pk__in=held, state=JobRun.State.QUEUED).select_related(
            "repository"
        ):
            runs.enqueue_or_leave(run)
    except Exception:
        log.exception("held runs %s left for the reconciler", held)


def analyze_chunk(run_id: int, attempt: int) -> str:
    with _express_marked():
        return _execute(run_id, attempt, _analyze)


def catch_up_repositories(fingerprint: str, after: int) -> str:
    """One catch-up batch after a promote or rollback (``chunk_plans.catch_up``), then the next."""
    cursor = repositories.catch_up(fingerprint=fingerprint, after=after)
    if cursor is not None:
        repositories.enqueue_catch_up(fingerprint, cursor)
    return f"caught up to repository {cursor}" if cursor else "catch-up done"


def sync_after_push(repo_id: int, step: int = 0) -> str:
    """RQ entry point (queue ``maintenance``): a push webhook's debounced sync
    (``repositories.sync_after_push``, docs/api.md#push-webhooks)."""
    return repositories.sync_after_push(repo_id, step)


def drive_rollout(rollout_id: int, takeover: bool = False, actor: str = "system") -> str:
    """RQ entry point (queue ``rollouts``): take the rollout's deploy lock and drive it
    to its end; returns the final state. A second delivery of the same job finds the
    rollout no longer pending and stops (``RolloutError``); so does the first one when
    the rollout was aborted before it ran (it returns the state: nothing to drive). See
    docs/rollouts.md."""
    ended = rollouts.ended_state(rollout_id)
    if ended and not takeover:
        return f"nothing to drive: rollout #{rollout_id} is {ended}"
    driver = rollouts.RolloutDriver(rollout_id, warmer=rollouts.warm_rollout)
    driver.acquire(actor=actor, takeover=takeover, reason="driver started")
    return driver.run()


#: RQ stores a job's function as a dotted path in Redis. A function that moved is found
#: under its old path too, for the jobs queued before the move (docs/architecture.md#rq).
MOVED_FUNCTIONS = {"dashboard.deploylock.drive_rollout": "workers.jobs.drive_rollout"}


class MovedPathsJob(Job):
    """RQ's job, which reads a moved function's old path as its new one (the pool's
    workers use it: ``workers.pool``)."""

    @property
    def func(self) -> Any:
        moved = MOVED_FUNCTIONS.get(self.func_name or "")
        return import_attribute(moved) if moved else super().func


def run_bulk_action(action_id: int) -> str:
    action = run_bulk(action_id)
    return f"{action.kind}: {action.done}/{action.total}"


def _sync(attempt: runs.Attempt, *, held: _Held | None = None) -> str:
    """Fetch the mirror, plan the chunks still to analyse, enqueue them — except the
    first one, appended to ``held`` for this horse to analyse (``sync_repository``)
    when ``GITWARD_INLINE_CHUNK`` is on and this worker loaded the served version.

    Holds ``locks:git:repo:{id}:mirror`` (heartbeat-extended) for the fetch and for the
    database write that records the new head and plan; that write checks the lock's
    fencing token in its own transaction.
    """
    run = attempt.run
    repo = claim_sync(repo_id=run.repository_id, generation=run.generation)
    if repo is None:  # a job of a superseded generation ends here
        return "nothing to do"
    groups, remote = ProcessGroups(), validate_remote(repo.fetch_url or repo.url)
    with _locked(repo.lock_key(), attempt, groups) as lock:
        failpoint("sync.locked", repo.name)
        head, path = _fetch(repo, remote, groups, lock)
        runs.mark_phase(attempt, fetched_at=timezone.now())  # stored by succeed_attempt
        failpoint("sync.fetched", repo.name)
        git = Runner(git_dir=path, groups=groups)
        planned: repositories.Plan | None = None
        new = "new "
        since = repositories.incremental_base(repo)
        # a shallow mirror's reachable set can shrink when a fetch moves its roots
        shallow = (path / "shallow").exists()
        if since is not None and not shallow and _is_ancestor(git, path, since, head):
            # Only the new commits (an incremental sync): the plan checks that the previous one
            # still covers the rest, else it writes nothing and we list everything.
            planned, shas = _plan(repo, run.generation, head, path, git, lock, since=since)
            _hold(held, planned)
        if planned is None:
            new = ""
            planned, shas = _plan(repo, run.generation, head, path, git, lock)
            assert planned is not None  # only an incremental plan declines
            _hold(held, planned)
        failpoint("sync.planned", repo.name)  # the plan committed, the sync not ended
    runs.mark_phase(attempt, written_at=timezone.now())
    publish_repo_changed(repo.pk)
    if held is not None:
        held.synced = True
        held.listed, held.name = len(shas), repo.name
    return f"planned {len(planned.runs)} chunks over {len(shas)} {new}commits"


def _hold(held: _Held | None, planned: repositories.Plan | None) -> None:
    """Right after the plan committed: from now on the caller owns the inline run."""
    if held is not None and planned is not None and planned.inline is not None:
        held.runs.append(planned.inline)


def _plan(
    repo: Repository,
    generation: int,
    head: str,
    path: Path,
    git: Runner,
    lock: Lock,
    *,
    since: str | None = None,
) -> tuple[repositories.Plan | None, Sequence[str]]:
    """List the commits reachable from ``head`` (only those ``since`` does not reach,
    when given), then plan them under the mirror ``lock``'s fencing token. Returns the
    plan (None: an incremental plan declined, see ``chunk_plans.plan_repository``) and the
    listed shas."""
    shas = list_commits(path, head, exclude=() if since is None else [since], git=git)
    lock.check()
    planned = repositories.plan_repository(
        repo_id=repo.pk,
        generation=generation,
        head=head,
        shas=shas,
        lock_key=repo.lock_key(),
        token=lock.token,
        since=since,
        inline_for=_inline_fingerprints(len(shas)),
    )
    return planned, shas


def _inline_fingerprints(listed: int = 0) -> list[str]:
    """The versions whose first chunk this sync's horse may analyse itself: those it
    loaded, unless their analysis queue is paused (an operator's pause stops the inline
    chunk too: it is then enqueued on the paused queue and waits there like the rest).
    None on the reserved interactive slot when the sync listed more than
    ``GITWARD_INTERACTIVE_MAX_COMMITS`` commits: a new large submission's sync (its size
    unknown when it was enqueued, so express) then enqueues its first chunk for the
    regular workers instead of holding the slot with it
    (docs/scheduling.md#the-reserved-interactive-slot).

    Race: a pause right after this read lets one chunk run, as a worker that dequeued
    just before the pause would."""
    if not settings.INLINE_CHUNK:
        return []
    if _EXPRESS[0] and listed > settings.INTERACTIVE_MAX_COMMITS:
        return []
    try:
        paused = infra.paused_queue_names()
    except infra.QueueUnavailable:
        # enqueueing it would fail too (left for the reconciler): analysing it now is
        # better, and pauses are honoured as a worker honours them with Redis away
        paused = set()
    return [fp for fp in loaded_fingerprints() if queue_name(fp) not in paused]


def _analyze(attempt: runs.Attempt) -> str:
    """Analyse one chunk with one streaming git process; write it fenced, in one
    transaction (on SQLite a bulk chunk commits part of it when express work waits for
    the write lock, and goes on after: ``write_chunk``, ``_write_wanted``).

    Holds ``locks:git:repo:{id}:commit:{first}..{last}``; if the lock is lost the
    heartbeat kills git's process group and ``lock.check()``/the fencing check stop any
    write. A chunk whose commits are all stored ends at once without touching git.
    """
    chunk, nothing_to_do = repositories.begin_chunk(attempt.run.chunk_id)
    if nothing_to_do:
        return nothing_to_do
    repo, shas, groups = chunk.repository, chunk.sha_list(), ProcessGroups()
    # exactly the version it was planned for, or refuse (VersionNotLoaded, see _execute)
    config = config_for(chunk.fingerprint, loaded=_LOADED)
    failpoint("analyze.before_lock", repo.name)
    path = _ensure_mirror(repo, attempt=attempt, groups=groups, need=shas[-1])
    with _locked(chunk.lock_key(), attempt, groups) as lock:
        failpoint("analyze.locked", repo.name)
        records = []
        for record in stream_commits(
            path, shas, config=config, git=Runner(git_dir=path, groups=groups)
        ):
            records.append(record)
            if len(records) == 1:
                failpoint("analyze.parsing", repo.name)
        runs.mark_phase(attempt, analysed_at=timezone.now())
        # A fault test's stand-in for a code version that silently stores other numbers
        # (docs/rollouts.md#result-contract); unarmed, it changes nothing.
        records = [_perturbed(r) if perturbs("analyze.perturb", chunk.fingerprint, r.sha)
                   else r for r in records]  # fmt: skip
        allowance = [float(settings.BULK_WRITE_YIELD)]  # for the whole chunk (_yield_write)
        _yield_write(repo.name, allowance)
        lock.check()
        failpoint("analyze.before_write", repo.name)
        if altered("analyze.alter_row", repo.name):
            records = _alter_one_row(records)

        def between_slices() -> None:  # SQLite: a large chunk's write let express work in
            failpoint("analyze.between_slices", repo.name)
            _yield_write(repo.name, allowance)
            lock.check()

        written = write_chunk(
            chunk=chunk,
            records=records,
            token=lock.token,
            wanted=lambda: _write_wanted(allowance),
            pause=between_slices,
        )
    runs.mark_phase(attempt, written_at=timezone.now())  # stored by succeed_attempt
    if repositories.finish_chunk(chunk):
        _enqueue_precompute(repo.pk, chunk.fingerprint)
    return f"stored {written} commits"


def _enqueue_precompute(repo_id: int, fingerprint: str) -> None:
    """The analysis of the served fingerprint completed (``finish_chunk``: the
    repository is ready under it): precompute its aggregates in the background
    (docs/analytics.md#precomputation). Never fails the chunk: with the queue server away the
    first reader computes them, as without precomputation."""
    try:
        analytics.enqueue_precompute(repo_id, fingerprint)
    except Exception:
        log.warning(
            "aggregates precomputation of repository %s not enqueued", repo_id, exc_info=True
        )


def _perturbed(record: CommitRecord) -> CommitRecord:
    """``record`` with one more insertion in its first text file (the failpoint
    ``analyze.perturb``, docs/testing.md#failpoints); a commit with none is left alone."""
    files = list(record.files)
    for i, f in enumerate(files):
        if not f.binary:
            files[i] = f._replace(added=f.added + 1)
            return record._replace(files=tuple(files))
    return record


def _alter_one_row(records: list[CommitRecord]) -> list[CommitRecord]:
    """The ``analyze.alter_row`` failpoint: the first file row of the chunk's first
    non-merge commit that has one gets one line added more than git counted, as a bug
    or a bit flip would store it; what the verifier must catch
    (docs/analytics.md#verification)."""
    for i, record in enumerate(records):
        if record.files and not record.is_merge:
            first = record.files[0]._replace(added=record.files[0].added + 1)
            altered_record = record._replace(files=(first, *record.files[1:]))
            return [*records[:i], altered_record, *records[i + 1 :]]
    return records


def verify_repository(repo_id: int, fingerprint: str) -> str:
    """RQ entry point (queue ``maintenance``): one scheduled verification pass of a
    repository's stored results (``analytics.run_verification``,
    docs/analytics.md#verification)."""
    return analytics.run_verification(repo_id, fingerprint)


def precompute_aggregates(repo_id: int, fingerprint: str, pending: str | None = None) -> str:
    """RQ entry point (queue ``maintenance``, the last class): compute the aggregates the
    whole-history views read (``analytics.run_precompute``, docs/analytics.md#precomputation)."""
    return analytics.run_precompute(repo_id, fingerprint, pending)


# ---------------------------------------------------------------------------- steps


@contextlib.contextmanager
def _express_marked() -> Iterator[None]:
    """Around a whole RQ job (a sync with its inline chunk, or a chunk): an express job
    (docs/scheduling.md#the-reserved-interactive-slot) is recorded as running
    (``infra.express_begun``) from before its first claim to after its last outcome, so
    a bulk chunk holds its write back meanwhile (``_yield_write``)."""
    job = get_current_job()
    express = _express_job(job)
    _RUNNING_EXPRESS[0] = express
    if express and job is not None:
        with contextlib.suppress(Exception):  # Redis trouble: bulk writes do not yield
            infra.express_begun(job.id)
    try:
        yield
    finally:
        if express and job is not None:
            # Race: a horse killed before this line leaves its entry; it holds bulk
            # writes back until its lease ends (infra.EXPRESS_LEASE_MS), never longer.
            with contextlib.suppress(Exception):
                infra.express_ended(job.id)


def _express_over() -> None:
    """The rest of this job is bulk work: an express sync (a new submission's, its size
    unknown when it was enqueued) that listed more than
    ``GITWARD_INTERACTIVE_MAX_COMMITS`` commits goes on to analyse its first chunk
    inline, the largest chunk of a backfill. It stops counting as express before that
    chunk (``infra.express_ended``), so the other workers' chunks of the same backfill
    do not hold their writes back for it (``_yield_write``: they waited for the whole
    inline chunk, 0.5–5 s on one real history's end to end, BENCHMARKS.md), and the
    chunk yields its own write to real express work and runs at the bulk niceness, as
    when a regular worker takes it from the queue.

    Race: a bulk write that looked just before this still waits, at most one
    ``WRITE_YIELD_POLL``; one that looks after writes at once. No correctness rests on
    the mark (``_yield_write``)."""
    if not _RUNNING_EXPRESS[0]:
        return
    _RUNNING_EXPRESS[0] = False
    job = get_current_job()
    if job is not None:
        with contextlib.suppress(Exception):  # Redis trouble: its lease ends it
            infra.express_ended(job.id)
    nice = int(settings.BULK_NICE)
    if not _EXPRESS[0] and nice > 0:  # never on the reserved slot (it runs no large inline)
        with contextlib.suppress(OSError):
            os.nice(nice)


#: Whether the job this work horse runs is express (``_express_marked``).
_RUNNING_EXPRESS: list[bool] = [False]


def _express_job(job: Job | None) -> bool:
    """Whether ``job`` is express: every job of the reserved slot's worker, and a job
    marked express that a regular worker took (docs/scheduling.md#the-reserved-interactive-slot)."""
    if _EXPRESS[0]:
        return True
    if job is None:
        return False
    try:
        return infra.is_express(job.id)
    except Exception:  # Redis trouble: counted as bulk, which only means it does not yield
        return False


def _yield_write(repo_name: str, allowance: list[float]) -> None:
    """Before a chunk's write transaction, and before it goes on after committing part
    of its write for express work (``_write_wanted``): a chunk that is not express
    waits while an express job runs, up to ``GITWARD_BULK_WRITE_YIELD`` seconds over
    all its slices (``allowance``: the seconds it has left, one list per chunk, lowered
    here by each wait), so a stream of small jobs delays a backfill's chunk by that much
    at most and never stalls it (docs/scheduling.md#bulk-writes-yield-to-express-work).
    On SQLite (one writer at a time) a large chunk's write started beside a small job
    holds up every write of that job, for one slice at most
    (docs/scheduling.md#bulk-writes-in-slices-on-sqlite), as the rest waits here. On
    PostgreSQL the write's COPY, index maintenance and foreign-key checks run in the
    database server at full priority, whatever the horse's niceness, and took the CPU
    from the small job's every step; there the chunk is one transaction, so the yield
    happens before it only.
    The chunk's lock stays held and renewed while it waits, and its fencing token is
    checked after (``lock.check``, ``write_chunk``).

    Race: an express job that begins just after this returned finds the write under
    way and waits for it, as without the yield; the yield only orders the writes, no
    correctness rests on it."""
    if allowance[0] <= 0 or _RUNNING_EXPRESS[0]:
        return
    start = time.monotonic()
    deadline = start + allowance[0]
    told = False
    try:
        while time.monotonic() < deadline:
            try:
                if not infra.express_running():
                    return
            except Exception:  # Redis trouble: write now
                return
            if not told:
                failpoint("analyze.yielding", repo_name)
                told = True
            time.sleep(WRITE_YIELD_POLL)
    finally:
        allowance[0] -= time.monotonic() - start


def _write_wanted(allowance: list[float]) -> bool:
    """Asked by ``write_chunk`` after each slice of a chunk's write on SQLite: whether to
    commit now and let express work write (``_yield_write`` then holds the next slice
    back), i.e. whether an express job runs while this bulk chunk still has yield
    allowance. With nobody waiting the chunk stays one transaction: committing after
    every slice cost a backfill alone half again its write time (two bulk writers
    handing the lock back and forth; BENCHMARKS.md, "On an idle machine"). Redis
    trouble: no (the write goes on)."""
    if allowance[0] <= 0 or _RUNNING_EXPRESS[0]:
        return False
    try:
        return infra.express_running() > 0
    except Exception:
        return False


#: Seconds between two looks of a yielding bulk write at the express jobs running.
WRITE_YIELD_POLL = 0.05


@observability.traced  # spans, log context: dashboard/observability/traces.py
def _execute(run_id: int, number: int, body: Callable[[runs.Attempt], str]) -> str:
    """Claim the attempt, run ``body``, record the outcome (docs/lifecycle.md). The retry
    policy is the job's: a held lock defers the run (no attempt spent), a permanent
    failure dead-letters it at once, anything else fails the attempt."""
    job = get_current_job()
    worker = (job.worker_name if job else None) or f"{socket.gethostname()}.{os.getpid()}"
    attempt = runs.begin_attempt(
        run_id=run_id, number=number, worker=str(worker), version=loaded_fingerprints()[0]
    )
    if attempt is None:
        return "superseded: this attempt was already claimed or the run moved on"
    try:
        try:
            result = body(attempt)
        except BaseException:
            runs.flush_phases(attempt)  # marked phases are stored with success otherwise
            raise
    except HostBusy as exc:
        # the remote git host's limit or backoff (docs/scheduling.md#per-host-fetch-limits):
        # deferred like a held lock, no attempt spent, the reason on the run
        delay = round(exc.retry_after + random.uniform(0, 0.25), 3)
        observability.count_fetch_host_deferral(exc.host, why=exc.why)
        runs.defer_attempt(attempt, delay=delay, reason=f"waiting {delay:.1f}s: {exc.reason}")
        return f"deferred {delay:.1f}s: {exc.reason}"
    except LockNotAcquired as exc:
        delay = _lock_wait(exc)
        runs.defer_attempt(attempt, delay=delay, reason=f"waiting {delay:.1f}s for a lock: {exc}")
        return f"deferred {delay:.1f}s: lock held by another job"
    except VersionNotLoaded as exc:
        return _refuse(attempt, exc, origin=job.origin if job else "")
    except PERMANENT as exc:
        runs.fail_attempt(attempt, exc, permanent=True, reason=str(exc))
        return f"failed: {exc}"
    except Exception as exc:
        runs.fail_attempt(attempt, exc)
        raise
    runs.succeed_attempt(attempt)
    return result


def _refuse(attempt: runs.Attempt, exc: VersionNotLoaded, *, origin: str) -> str:
    """A job of a version this worker did not load. Taken from another version's
    queue (misrouted): handed back to its own queue, no attempt spent. Taken from its
    own version's queue, the worker is misconfigured (``run_one_worker`` refuses to
    start that way): a permanent failure, so it is dead-lettered, never retried
    three times on the wrong analyzer."""
    own = queue_name(attempt.run.fingerprint)
    # a worker host's queue of its own version is its own version's queue
    # (docs/scheduling.md#mirror-affinity)
    if origin and runs.base_queue(origin) != own:
        runs.reroute_attempt(attempt, queue=own, reason=f"misrouted from {origin}: {exc}")
        return f"handed back to {own}"
    runs.fail_attempt(attempt, exc, permanent=True, reason=str(exc))
    return f"refused: {exc}"


def _lock_wait(exc: LockNotAcquired) -> float:
    """Seconds until the contended lease ends (its remaining TTL), plus jitter."""
    remaining = locks.remaining_ttl(list(exc.keys))
    base = remaining if remaining is not None else settings.LOCK_TTL / 3
    return round(min(float(settings.LOCK_TTL), base + 0.05 + random.uniform(0, 0.25)), 3)


@contextlib.contextmanager
def _locked(key: str, attempt: runs.Attempt, groups: ProcessGroups) -> Iterator[Lock]:
    """Hold ``key`` for this attempt (``dashboard.locks.leases.hold_lease``): a lost lease
    kills the job's git process groups at once, and a failure inside it is a LockLost."""
    holder = locks.job_holder(
        worker=attempt.worker,
        job=attempt.run.job_id,
        attempt=attempt.number,
        version=attempt.run.fingerprint or current_fingerprint(),
    )

    def record(lock: Lock) -> None:
        runs.record_lock(attempt, key=key, token=lock.token)

    with (
        locks.hold_lease(
            key,
            holder=holder,
            on_lost=groups.kill_all,
            on_acquired=record,
            repo_name=runs.repository_name(attempt.run),
        ) as lock,
        _abort_on_loss(lock),
    ):
        yield lock


@contextlib.contextmanager
def _abort_on_loss(lock: Lock) -> Iterator[None]:
    """Report a failure inside a lost lease as what it is: the heartbeat lost the lock
    and killed git (so the git error is a symptom), and the job must write nothing."""
    try:
        yield
    except LockLost:
        raise
    except Exception as exc:
        if lock.lost.is_set():
            raise LockLost(f"lock lost while working ({type(exc).__name__}); job aborted") from exc
        raise


def _fetch(repo: Repository, remote: Remote, groups: ProcessGroups, lock: Lock) -> tuple[str, Path]:
    """Sanitise and fetch (or clone) the mirror under the host lock (``update_mirror``);
    the caller holds the Redis mirror lock, whose lease is checked before every
    destructive step. Returns the fetched head and the mirror's path."""
    workspace = Path(settings.WORKSPACE)
    host = (remote.host or "").strip("[]").lower()
    gate = runs.fetch_gate() if host else None
    try:
        head = update_mirror(
            workspace=workspace,
            repo_id=repo.pk,
            git_url=remote.git_url(),
            branch=repo.branch,
            runner=Runner(groups=groups),
            timeout=settings.GIT_TIMEOUT,
            pinned=pins_for(remote),
            check=lock.check,
            # per-git-host fetch limits (docs/scheduling.md#per-host-fetch-limits)
            fetch_slot=(lambda: gate.slot(host)) if gate is not None else None,
        )
    except RepositoryUnavailable:
        runs.forget_mirror(repo.pk)  # a refused mirror (too large) is not kept
        raise
    # mirror affinity: this host now holds the mirror (docs/scheduling.md#mirror-affinity)
    runs.record_mirror(repo.pk)
    return head, mirror_path(workspace, repo.pk)


def _ensure_mirror(
    repo: Repository, *, attempt: runs.Attempt, groups: ProcessGroups, need: str | None = None
) -> Path:
    """The local mirror, fetched under the mirror lock if missing or lacking ``need``.

    Each worker host has its own workspace, so an analyze job may run where no sync
    ran: it then brings the mirror up to date itself, holding the same lock a sync would.

    The usual case costs no git process: the mirror's head ref (read from its ref files,
    ``mirror_head``) is the head the repository was last planned from, so every commit
    of the plan is in it. Otherwise (another host synced, the mirror is behind or gone)
    one ``cat-file -e`` asks git for ``need``. A chunk of an older plan whose commits a
    force-push dropped passes the first check as it passed ``cat-file`` before: nothing
    is ever pruned (``gc.auto=0``), so its objects are still there. Retries always
    take the git check.
    """
    path = mirror_path(Path(settings.WORKSPACE), repo.pk)
    head = mirror_head(path)
    # A retry asks git: if the first attempt failed on a damaged mirror whose ref is
    # intact, the check below finds the object missing and the fetch repairs it
    # (``update_mirror`` sanitises first), as every attempt did before.
    if head is not None and attempt.number == 1 and (need is None or head == repo.head):
        return path
    runner = Runner(groups=groups)
    if head is not None and need is not None and _has_commit(runner, path, need):
        return path
    remote = validate_remote(repo.fetch_url or repo.url)
    with _locked(repo.lock_key(), attempt, groups) as lock:
        _fetch(repo, remote, groups, lock)
        lock.check()
    return path


def _is_ancestor(git: Runner, path: Path, old: str, new: str) -> bool:
    """Whether ``old`` is ``new`` or an ancestor of it (a fast-forward): then the
    commits ``new`` reaches are those ``old`` reaches plus ``rev-list new ^old``. False
    also when git cannot tell (``old`` missing from a re-cloned mirror): a full plan."""
    if old == new:
        return True
    try:
        git.run(["--git-dir", str(path), "merge-base", "--is-ancestor", old, new], timeout=60)
    except GitError:
        return False
    return True


def _has_commit(runner: Runner, path: Path, sha: str) -> bool:
    try:
        runner.run(["--git-dir", str(path), "cat-file", "-e", f"{sha}^{{commit}}"], timeout=60)
    except GitError:
        return False
    return True
