"""Cancelling analysis: one run, every run of a repository, or the runs a filter selects
(docs/lifecycle.md#cancelling). Permission-checked and audited.

A cancelled run ends ``discarded`` with the error ``cancelled by <who>``:

- queued (or failed, awaiting its retry): its RQ job leaves the queue and the schedule
  (``attempts.drop_rq_job``, as ``cancel_runs`` does for closed versions);
- running: the locks its job holds are fenced (their tokens bumped) and released
  (``locks.evict_job``), so a write it still makes is refused, and the worker running it
  is told to stop the job (RQ's ``stop-job`` command): the worker SIGKILLs the work horse's
  process group, and git, started with ``--pdeathsig KILL`` (``workers.git.runner``), dies
  with the thread that started it.

The repository of a cancelled sync, or of a cancelled chunk of its served plan, is failed
with the same reason, so it never waits for work that will not come; re-analysing it
(``reanalysis.reanalyse``) starts a new generation that plans the open chunks again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import redis
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone
from rq.command import send_command
from rq.worker import Worker

from dashboard import infra, locks
from dashboard.accounts import record_audit
from dashboard.infra import publish_event
from dashboard.models import Chunk, JobAttempt, JobRun, Repository
from dashboard.runs.attempts import _event, drop_rq_job, release_parked
from dashboard.versions import served_fingerprint

log = logging.getLogger(__name__)

#: Cancelling a repository's analysis: Django's own model permission, as re-analysing.
CANCEL_REPO_PERMISSION = "dashboard.change_repository"
#: Cancelling runs (one, or by filter).
CANCEL_RUN_PERMISSION = "dashboard.change_jobrun"
#: The states a run can be cancelled from.
CANCELLABLE = (JobRun.State.QUEUED, JobRun.State.FAILED, JobRun.State.RUNNING)


class CancelRefused(Exception):
    """The user may not cancel (``status`` 403), or the filter is not one (400)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Cancelled:
    """What a cancel did: the runs it ended, the queued jobs removed, the running jobs
    stopped, the lock keys fenced."""

    runs: list[int] = field(default_factory=list)
    dequeued: int = 0
    stopped: int = 0
    fenced: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "cancelled": len(self.runs),
            "runs": self.runs,
            "dequeued": self.dequeued,
            "stopped": self.stopped,
            "fenced": self.fenced,
        }


def actor_name(user: Any) -> str:
    return str(getattr(user, "username", None) or user or "system")


def cancel_repository(repo: Repository, user: Any) -> Cancelled:
    """Cancel every queued, retrying or running run of ``repo``; fail the repository
    (if it was not ready) with "cancelled by <user>". Raises ``CancelRefused`` (403)."""
    target = f"repository {repo.name} (#{repo.pk}, {repo.shown_url})"
    _require(user, CANCEL_REPO_PERMISSION, "repo.cancel", target)
    who = actor_name(user)
    # Pushes announced before the cancel are dropped with it: a debounced push job that
    # runs later finds no push to sync (``repositories.sync_after_push``); a push after
    # the cancel starts a sync as usual.
    Repository.objects.filter(pk=repo.pk).update(pushed_at=None)
    done = cancel_runs_matching(JobRun.objects.filter(repository_id=repo.pk), by=who)
    reason = f"cancelled by {who}"
    if repo.fail(reason):  # an active repository is cancelled even with no run left
        publish_repo_failed(repo)
    record_audit(user=user, action="repo.cancel", target=target, outcome=_outcome(done),
                 detail=done.as_dict())  # fmt: skip
    return done


def cancel_run(run: JobRun, user: Any) -> Cancelled:
    """Cancel one run (nothing if it has ended already). Raises ``CancelRefused`` (403)."""
    target = f"run #{run.pk} ({run.job_id})"
    _require(user, CANCEL_RUN_PERMISSION, "run.cancel", target)
    done = cancel_runs_matching(JobRun.objects.filter(pk=run.pk), by=actor_name(user))
    record_audit(user=user, action="run.cancel", target=target, outcome=_outcome(done),
                 detail=done.as_dict())  # fmt: skip
    return done


def cancel_filtered(
    user: Any, *, state: str = "", queue: str = "", repo: int | None = None
) -> Cancelled:
    """Cancel every run the filter selects (``state`` one of queued, failed, running;
    ``queue`` a queue name; ``repo`` a repository id); at least one must be given.
    Raises ``CancelRefused`` (400 for a bad filter, 403 without permission)."""
    if state and state not in CANCELLABLE:
        raise CancelRefused(f"state must be one of {', '.join(CANCELLABLE)}", 400)
    if not (state or queue or repo is not None):
        raise CancelRefused("give at least one of state, queue, repo", 400)
    target = f"runs state={state or '*'} queue={queue or '*'} repo={repo or '*'}"
    _require(user, CANCEL_RUN_PERMISSION, "runs.cancel", target)
    qs = JobRun.objects.all()
    if state:
        qs = qs.filter(state=state)
    if queue:
        qs = qs.filter(queue=queue)
    if repo is not None:
        qs = qs.filter(repository_id=repo)
    done = cancel_runs_matching(qs, by=actor_name(user))
    record_audit(user=user, action="runs.cancel", target=target, outcome=_outcome(done),
                 detail={**done.as_dict(), "runs": done.runs[:100]})  # fmt: skip
    return done


def _require(user: Any, perm: str, action: str, target: str) -> None:
    if not getattr(user, "has_perm", lambda _p: False)(perm):
        record_audit(user=user, action=action, target=target,
                     outcome="refused: permission denied")  # fmt: skip
        raise CancelRefused("you do not have permission to cancel analysis", 403)


def _outcome(done: Cancelled) -> str:
    return (
        f"cancelled {len(done.runs)} run(s): {done.dequeued} dequeued, "
        f"{done.stopped} running stopped, {len(done.fenced)} lock(s) fenced"
    )


def cancel_runs_matching(qs: QuerySet[JobRun], *, by: str) -> Cancelled:
    """Cancel every cancellable run of ``qs`` (the core of the functions above; no
    permission check, no audit: ``manage.py cancel`` and the views call those)."""
    done = Cancelled()
    reason = f"cancelled by {by}"
    for run in qs.filter(state__in=CANCELLABLE).select_related("repository").order_by("pk"):
        _cancel_one(run, reason, done)
    _release_freed(done.runs)
    return done


def _release_freed(run_ids: list[int]) -> None:
    """A cancelled waiting analyze run frees a place in its repository's share: release
    its next parked run (docs/scheduling.md#fairness). A repository cancelled as a whole
    has no parked run left (they were cancelled too), so this releases nothing there.
    With the queue server down the reconciler's release does it later."""
    slots = set(
        JobRun.objects.filter(pk__in=run_ids, kind=JobRun.Kind.ANALYZE).values_list(
            "repository_id", "queue"
        )
    )
    for repo_id, queue in sorted(slots):
        try:
            release_parked(repo_id, queue)
        except infra.QueueUnavailable:
            log.warning("release after the cancel left to the reconciler")


def _cancel_one(run: JobRun, reason: str, done: Cancelled) -> None:
    """Move one run to discarded, then undo what its state left behind.

    Race: a worker claims the run (queued → running, attempts + 1) or finishes it while
    we cancel. The move is a conditional UPDATE on the (state, attempts) read; when it
    matches nothing the row is read again and tried once more from its new state, so a
    run is cancelled from exactly the state it was in. A worker's own outcome UPDATEs
    (``succeed_attempt``, ``_finish_failed``, ``defer_attempt``) all require the attempt
    to be running, so once the run is discarded they match nothing: the attempt's result
    is dropped, and its writes are refused by the fenced token."""
    for _ in range(3):
        moved = _discard(run, reason)
        if moved:
            break
        fresh = JobRun.objects.select_related("repository").filter(pk=run.pk).first()
        if fresh is None or fresh.state not in CANCELLABLE:
            return  # it ended by itself meanwhile
        run = fresh
    else:
        return
    done.runs.append(run.pk)
    if run.state == JobRun.State.RUNNING:
        done.fenced += locks.evict_job(
            job=run.job_id, repo_id=run.repository_id, keys=(run.lock_key,) if run.lock_key else ()
        )
        if _stop_job(run):
            done.stopped += 1
    else:
        try:
            drop_rq_job(run)
            done.dequeued += 1
        except infra.QueueUnavailable:
            # The run is discarded in the database: a worker that takes the job later
            # claims nothing (``begin_attempt`` wants queued/failed), and the reconciler
            # re-enqueues only queued runs.
            log.warning("run %s cancelled; its RQ job is left to expire", run.pk)
    _fail_repository(run, reason)


def _discard(run: JobRun, reason: str) -> bool:
    now = timezone.now()
    with transaction.atomic():
        moved = JobRun.objects.filter(pk=run.pk, state=run.state, attempts=run.attempts).update(
            state=JobRun.State.DISCARDED, error=reason[:2000], finished_at=now
        )
        if not moved:
            return False
        if run.state == JobRun.State.RUNNING:
            JobAttempt.objects.filter(run_id=run.pk, number=run.attempts).update(
                outcome=JobAttempt.Outcome.FAILED, error=reason[:2000], finished_at=now
            )
        if run.chunk_id:  # planned again by a re-analysis (``chunk_plans._runs_for``)
            Chunk.objects.filter(pk=run.chunk_id, state=Chunk.State.RUNNING).update(
                state=Chunk.State.QUEUED
            )
        _event("job.deferred", run, delay=None, reason=reason[:300])
    return True


def _stop_job(run: JobRun) -> bool:
    """Ask the worker running ``run`` to stop it; True if a command was sent.

    The RQ job that runs the attempt is the worker's current job: the run's own
    (``rq_id`` of its attempt), or the sync whose work horse analyses its first chunk
    inline (``workers.jobs.sync_repository``). Race: the worker may have finished that job
    and taken another before the command arrives; RQ's handler stops a job only when its
    id is still the worker's current one, so another job is never stopped."""
    if not run.worker:
        return False
    # A client of its own: RQ's ``Worker`` raises the socket timeout of the connection it
    # is given, which must not leak into the shared one requests use.
    conn = infra.worker_connection()
    try:
        key = Worker.redis_worker_namespace_prefix + run.worker
        worker = Worker.find_by_key(key, connection=conn)
        current = worker.get_current_job_id() if worker is not None else None
        own = run.rq_id(run.attempts)
        inline = (
            run.kind == JobRun.Kind.ANALYZE
            and bool(current)
            and str(current).startswith(f"sync-{run.repository_id}-")
        )
        if current != own and not inline:
            return False
        send_command(conn, run.worker, "stop-job", job_id=current)
    except redis.RedisError:
        log.warning("run %s cancelled; its worker could not be told (fenced anyway)", run.pk)
        return False
    finally:
        conn.close()
    return True


def _fail_repository(run: JobRun, reason: str) -> None:
    """A cancelled sync fails its generation; a cancelled chunk of the served plan fails
    the repository (as a dead letter does: ``attempts._dead_letter``)."""
    repo = run.repository
    if run.kind == JobRun.Kind.SYNC:
        changed = repo.fail(reason, generation=run.generation)
    elif run.fingerprint == served_fingerprint():
        changed = repo.fail(reason, fingerprint=run.fingerprint)
    else:
        changed = False
    if changed:
        publish_repo_failed(repo)


def publish_repo_failed(repo: Repository) -> None:
    publish_event(
        "repo.changed",
        {"repo": repo.pk, "name": repo.name, "url": repo.shown_url, "status": repo.status,
         "error": repo.error or None},
        repo_id=repo.pk,
    )  # fmt: skip
