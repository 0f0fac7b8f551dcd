"""Repairs drift between the database (the truth) and Redis (the transport)."""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime

from rq import Queue
from rq.exceptions import NoSuchJobError
from rq.job import Job, JobStatus
from rq.registry import ScheduledJobRegistry

from dashboard import analytics, infra
from dashboard.locks import live_worker_names, orphaned_runs
from dashboard.models import JobRun, Repository
from dashboard.repositories import (
    complete_repository,
    publish_repo_changed,
    reconcile_catch_up,
    refresh_due,
)
from dashboard.rollouts import deliver_notifications, reconcile_drains, reconcile_pending_drivers
from dashboard.runs import (
    cancel_runs,
    closed_fingerprints,
    crash_attempt,
    enqueue_run,
    release_all_parked,
    sweep_closed_queues,
)

log = logging.getLogger(__name__)

BATCH = 1000

#: The job-hash fields step 2 reads, in one pipelined ``HMGET`` per batch of runs: RQ's
#: ``Job.fetch_many`` reads each whole hash and builds a ``Job`` (five times slower on 1,000
#: jobs, docs/operations.md#rq-internals) and fails the whole batch on a hash that has no
#: ``data`` field. The names are pinned by tests/dashboard/operations/test_rq_internals.py.
JOB_FIELDS = ("status", "enqueued_at", "worker_name", "origin")


def reconcile() -> dict[str, int]:
    """One round, safe to run from any number of processes at once.

    1. Runs marked running whose worker's heartbeat is gone: the attempt is recorded as
       crashed (``worker died``) and retried, or dead-lettered after the budget.
    2. Queued or waiting runs whose RQ job cannot run any more are enqueued again: the
       job is missing (Redis flushed, a node restarted empty), ended (its horse was
       killed before it claimed the attempt), marked queued but in no queue (its worker
       died between dequeue and start), started by a dead worker, or scheduled and long
       overdue. The attempt is claimed in the database, so even a false alarm here
       cannot run the work twice. Parked runs (docs/scheduling.md#fairness) are not
       missing their job: every repository with parked runs and room in its share gets
       them released (``runs.release_all_parked``), so a release lost to a crash
       between a claim and its release costs one round, never a wedged repository.
    3. Analysing repositories whose chunks have all ended are marked ready (or failed).
    4. Queued runs of closed analyzer versions are cancelled (a retry scheduled just
       before a rollback), and every draining version gets a drain check
       (``rollouts.reconcile_drains``: drained after two empty checks).
       Before the drain checks, RQ jobs left in a closed version's queue whose run has
       ended or moved past them are removed (``runs.sweep_closed_queues``): no worker
       takes a job from a closed queue, so such a job would keep the drain from ever
       finding it empty.
    5. Pending rollouts owed a driver whose driver job is missing get it enqueued
       (``rollouts.reconcile_pending_drivers``): one started while the queue server
       was unreachable is driven once it returns.
    6. While any repository lags the served version (its last plan another version's)
       and no catch-up of that version is live, a catch-up is enqueued
       (``repositories.reconcile_catch_up``): the reconciler owns the catch-up after a
       promote or rollback; the after-commit hook that also enqueues it is only the
       fast path (docs/rollouts.md#wiring).

    7. Rollout notifications due in the webhook outbox are sent
       (``rollouts.deliver_notifications``: in order per rollout, retried with backoff;
       docs/rollouts.md#notifications). Database and HTTP only: it runs with the queue
       server down too.
    8. Repositories whose scheduled refresh is due are refreshed, a batch per round
       (``repositories.refresh_due``, docs/lifecycle.md#scheduled-refresh).
    9. Repositories whose scheduled verification is due get a pass enqueued on the
       maintenance queue, a batch per round, one in flight per repository
       (``analytics.schedule_verifications``, docs/analytics.md#verification).

    With the queue server unreachable, steps 1 and 3 (database only) still run and
    steps 2, 4, 5, 6, 8 and 9 wait for the next round (``queue_unreachable: 1`` in the
    result): a run
    submitted meanwhile is committed ``queued`` with no RQ job, which step 2 treats as
    missing and enqueues once the server is back.

    Races: two reconcilers, or a reconciler and a worker finishing late, both go
    through the conditional UPDATEs of ``dashboard.runs.attempts``: one wins, the rest no-op.
    """
    crashed = sum(
        1
        for run in orphaned_runs()
        if crash_attempt(run_id=run.pk, number=run.attempts, reason="worker died (heartbeat lost)")
    )
    try:
        promoted, requeued = _requeue_stale()
        released = release_all_parked()
        closed = closed_fingerprints()
        cancelled = sum(
            cancel_runs(fingerprint=fp, reason="its analyzer version is closed") for fp in closed
        )
        swept = sweep_closed_queues(closed)
        drained = reconcile_drains()
        drivers = reconcile_pending_drivers()
        caught_up = reconcile_catch_up()
        refreshed = refresh_due()["refreshed"]
        verifications = analytics.schedule_verifications()["enqueued"]
        queue_down = 0
    except infra.QueueUnavailable as exc:
        # The database keeps every queued run; the next round (once the queue server
        # answers) finds their RQ jobs missing and enqueues them; cancels, drain checks
        # and the catch-up (which read and edit the queues) wait for it too.
        log.warning("reconciler: %s; queued runs wait for it", exc)
        promoted = requeued = released = cancelled = swept = drained = drivers = 0
        caught_up = refreshed = verifications = 0
        queue_down = 1
    completed = 0
    for repo in Repository.objects.filter(status=Repository.Status.ANALYZING):
        if complete_repository(repo_id=repo.pk, fingerprint=repo.fingerprint):
            completed += 1
            publish_repo_changed(repo.pk)  # watchers see "ready" without a reload
    notified = deliver_notifications()
    result = {
        "crashed": crashed,
        "requeued": requeued,
        "released": released,
        "completed": completed,
        "promoted": promoted,
        "cancelled": cancelled,
        "swept": swept,
        "drained": drained,
        "drivers": drivers,
        "caught_up": caught_up,
        "refreshed": refreshed,
        "verifications": verifications,
        "queue_unreachable": queue_down,
        "notified": notified["delivered"],
        "notify_failed": notified["failed"],
    }
    if any(result.values()):
        log.info("reconciler: %s", result)
    return result


def _requeue_stale() -> tuple[int, int]:
    """Step 2 of ``reconcile``: promote due scheduled jobs, enqueue stale runs again.
    Raises ``QueueUnavailable`` while the queue server is unreachable."""
    requeued = 0
    conn = infra.connection()
    promoted = infra.promote_due_jobs(
        sorted(
            set(
                JobRun.objects.filter(
                    state__in=[JobRun.State.QUEUED, JobRun.State.FAILED]
                ).values_list("queue", flat=True)
            )
        )
    )
    # A parked run has no RQ job on purpose (docs/scheduling.md#fairness): the release
    # below (``release_all_parked``) is what enqueues it.
    pending = JobRun.objects.filter(
        state__in=[JobRun.State.QUEUED, JobRun.State.FAILED], parked=False
    )
    live = live_worker_names()
    in_queue: dict[str, set[str]] = {}
    last = 0
    while True:
        batch = list(pending.filter(pk__gt=last).order_by("pk")[:BATCH])
        if not batch:
            break
        last = batch[-1].pk
        with conn.pipeline(transaction=False) as pipe:
            for run in batch:
                pipe.hmget(Job.key_for(run.rq_id()), list(JOB_FIELDS))
            states = pipe.execute()
        for run, fields in zip(batch, states, strict=True):
            if _stale(run, fields, conn, live, in_queue):
                q = infra.queue(run.queue)
                conn.lrem(q.key, 0, run.rq_id())  # never two copies of one attempt
                origin = fields[3].decode() if fields[3] else ""
                if origin and origin != run.queue:  # a worker host's queue (mirror affinity)
                    conn.lrem(infra.queue(origin).key, 0, run.rq_id())
                ScheduledJobRegistry(queue=q).remove(run.rq_id())
                conn.delete(Job.key_for(run.rq_id()))  # the stale hash, if any
                if enqueue_run(run):
                    requeued += 1
    return promoted, requeued


#: A job younger than this is never judged stale (it may be between two Redis steps).
GRACE_SECONDS = 10.0


def _queued_ids(conn: object, name: str, cache: dict[str, set[str]]) -> set[str]:
    """Every job id in a queue and its intermediate list (where a worker's dequeue moves
    a job until it starts it), read once per round."""
    if name not in cache:
        q = Queue(name, connection=conn)  # type: ignore[arg-type]
        cache[name] = set(q.get_job_ids()) | set(q.intermediate_queue.get_job_ids())
    return cache[name]


def _stale(
    run: JobRun,
    fields: list[bytes | None],
    conn: object,
    live: set[str],
    cache: dict[str, set[str]],
) -> bool:
    status, enqueued_at, worker, origin = (f.decode() if f else None for f in fields)
    if status is None:
        return True  # missing: Redis lost it
    if status in _ENDED:
        return True  # ended without the run moving on (killed before the claim)
    age = GRACE_SECONDS + 1
    if enqueued_at:
        try:
            stamp = datetime.fromisoformat(enqueued_at.replace("Z", "+00:00"))
            stamp = stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)
            age = (datetime.now(UTC) - stamp).total_seconds()
        except ValueError:
            pass
    if age < GRACE_SECONDS:
        return False
    if status == JobStatus.QUEUED.value:
        # the queue it was put on: a chunk may wait on a worker host's queue first
        # (docs/scheduling.md#mirror-affinity)
        return run.rq_id() not in _queued_ids(conn, origin or run.queue, cache)
    if status == JobStatus.STARTED.value:
        return worker not in live
    if status == JobStatus.SCHEDULED.value:
        registry = ScheduledJobRegistry(queue=infra.queue(run.queue))
        try:
            due = registry.get_scheduled_time(run.rq_id())
        except NoSuchJobError:
            return True  # marked scheduled but in no schedule
        return due.timestamp() < time.time() - 30
    return False


#: RQ's ends of a job: it will not run again unless enqueued anew.
_ENDED = {
    s.value for s in (JobStatus.FINISHED, JobStatus.FAILED, JobStatus.STOPPED, JobStatus.CANCELED)
}
