"""Repairs drift between the database (the truth) and Redis (the transport)."""

from __future__ import annotations

import logging

from dashboard.models import Chunk, Repository
from dashboard.plans import OPEN_STATES, complete_repository
from dashboard.repositories import enqueue_sync

log = logging.getLogger(__name__)


def reconcile() -> dict[str, int]:
    """Re-enqueue every unfinished piece of work whose job is missing from Redis.

    Enqueues use deterministic ids with RQ's ``unique`` check, so work still queued or
    running is not duplicated; a job left finished or failed in Redis while the database
    says otherwise is replaced (``queues.enqueue_unique``).
    """
    from workers.jobs import enqueue_chunks

    syncs = chunks = completed = 0
    for repo in Repository.objects.filter(
        status__in=[Repository.Status.QUEUED, Repository.Status.SYNCING]
    ):
        syncs += int(enqueue_sync(repo.pk, repo.generation))
    for repo in Repository.objects.filter(status=Repository.Status.ANALYZING):
        ids = list(
            Chunk.objects.filter(
                repository=repo, fingerprint=repo.fingerprint, state__in=OPEN_STATES
            ).values_list("pk", flat=True)
        )
        if ids:
            chunks += enqueue_chunks(ids)
        elif complete_repository(repo_id=repo.pk, fingerprint=repo.fingerprint):
            completed += 1
    result = {"syncs": syncs, "chunks": chunks, "completed": completed}
    if any(result.values()):
        log.info("reconciler re-enqueued %s", result)
    return result
