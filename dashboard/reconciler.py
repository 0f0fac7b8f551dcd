"""Repairs drift between the database (the truth) and Redis (the transport)."""

from __future__ import annotations

import logging

from dashboard import queues
from dashboard.models import JobRun, Repository
from dashboard.plans import complete_repository
from dashboard.runs import crash_attempt, enqueue_run, orphaned_runs

log = logging.getLogger(__name__)

BATCH = 1000


def reconcile() -> dict[str, int]:
    """One round, safe to run from any number of processes at once.

    1. Runs marked running whose worker's heartbeat is gone: the attempt is recorded as
       crashed (``worker died``) and retried, or dead-lettered after the budget.
    2. Queued or waiting runs whose RQ job is missing (Redis flushed, replaced, or the
       node restarted empty) are enqueued again. Enqueues use the attempt's id with
       RQ's ``unique`` check, so work still queued is never duplicated.
    3. Analysing repositories whose chunks have all ended are marked ready (or failed).

    Races: two reconcilers, or a reconciler and a worker finishing late, both go
    through the conditional UPDATEs of ``dashboard.runs``: one wins, the rest no-op.
    """
    crashed = sum(
        1
        for run in orphaned_runs()
        if crash_attempt(run_id=run.pk, number=run.attempts, reason="worker died (heartbeat lost)")
    )
    requeued = 0
    conn = queues.connection()
    pending = JobRun.objects.filter(state__in=[JobRun.State.QUEUED, JobRun.State.FAILED])
    last = 0
    while True:
        batch = list(pending.filter(pk__gt=last).order_by("pk")[:BATCH])
        if not batch:
            break
        last = batch[-1].pk
        with conn.pipeline(transaction=False) as pipe:
            for run in batch:
                pipe.exists(f"rq:job:{run.rq_id()}")
            present = pipe.execute()
        for run, exists in zip(batch, present, strict=True):
            if not exists and enqueue_run(run):
                requeued += 1
    completed = 0
    for repo in Repository.objects.filter(status=Repository.Status.ANALYZING):
        completed += int(complete_repository(repo_id=repo.pk, fingerprint=repo.fingerprint))
    result = {"crashed": crashed, "requeued": requeued, "completed": completed}
    if any(result.values()):
        log.info("reconciler: %s", result)
    return result
