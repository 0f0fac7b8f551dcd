"""A repository's planned work: chunks planned from a sync, and each chunk's states
(``queued → running → done | failed``) as analyze jobs take them.

Emits ``job.progress`` when a chunk is stored and ``repo.changed`` when the
repository's analysis completes.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.conf import settings
from django.db import transaction
from django.db.models import F, Max
from django.utils import timezone

from dashboard.fencing import check_token
from dashboard.live import publish_event
from dashboard.models import Chunk, Commit, JobRun, Repository
from dashboard.repositories import complete_repository, publish_repo_changed
from dashboard.runs import enqueue_after_commit, ensure_run
from dashboard.summaries import repository_summary
from workers.analyzer import queue_name
from workers.chunks import chunk_key, plan_chunks

OPEN_STATES = [Chunk.State.QUEUED, Chunk.State.RUNNING]


def plan_repository(
    *,
    repo_id: int,
    generation: int,
    fingerprint: str,
    head: str,
    shas: Sequence[str],
    lock_key: str,
    token: int | None,
) -> list[int]:
    """Record the new head and plan chunks for commits not yet analysed; return the ids
    of the analyze runs enqueued after commit.

    One transaction, guarded by the mirror lock ``lock_key``: its fencing ``token`` is
    checked first (``StaleToken`` if a newer holder exists), then:

    1. Lock the repository row (serialises with ``complete_repository``).
    2. Pending = reachable commits − stored for this fingerprint − already in an open
       chunk (queued/running, e.g. from an earlier generation still in flight).
    3. Plan content-defined chunks; insert the new ones (existing keys are kept, and a
       failed one is reset to queued: a re-submission retries it).
    4. Status: analyzing while any chunk is open, else ready.
    """
    with transaction.atomic():
        check_token(lock_key, token)
        return _plan(
            repo_id=repo_id, generation=generation, fingerprint=fingerprint, head=head, shas=shas
        )


def _plan(
    *, repo_id: int, generation: int, fingerprint: str, head: str, shas: Sequence[str]
) -> list[int]:
    repo = Repository.objects.select_for_update().get(pk=repo_id)
    stored = set(
        Commit.objects.filter(repository_id=repo_id, fingerprint=fingerprint).values_list(
            "sha", flat=True
        )
    )
    in_flight: set[str] = set()
    for text in Chunk.objects.filter(
        repository_id=repo_id, fingerprint=fingerprint, state__in=OPEN_STATES
    ).values_list("shas", flat=True):
        in_flight.update(text.split())
    pending = [s for s in shas if s not in stored and s not in in_flight]
    planned = plan_chunks(pending, target=settings.CHUNK_SIZE)
    position = (
        Chunk.objects.filter(repository_id=repo_id, fingerprint=fingerprint).aggregate(
            m=Max("position")
        )["m"]
        or 0
    )
    keys = []
    new_rows = []
    for i, part in enumerate(planned, start=1):
        key = chunk_key(part)
        keys.append(key)
        new_rows.append(
            Chunk(
                repository_id=repo_id,
                fingerprint=fingerprint,
                key=key,
                shas="\n".join(part),
                size=len(part),
                position=position + i,
            )
        )
    Chunk.objects.bulk_create(new_rows, ignore_conflicts=True, batch_size=500)
    Chunk.objects.filter(
        repository_id=repo_id, fingerprint=fingerprint, key__in=keys, state=Chunk.State.FAILED
    ).update(state=Chunk.State.QUEUED, error="")
    open_chunks = list(
        Chunk.objects.filter(repository_id=repo_id, fingerprint=fingerprint, state__in=OPEN_STATES)
    )
    open_ids = [c.pk for c in open_chunks]
    run_ids = _runs_for(open_chunks, fingerprint)
    now = timezone.now()
    repo.head = head
    repo.commits_total = len(shas)
    repo.fingerprint = fingerprint
    repo.synced_at = now
    repo.error = ""
    if open_ids:
        repo.status = Repository.Status.ANALYZING
    else:
        repo.status = Repository.Status.READY
        repo.analyzed_at = now
    repo.save(
        update_fields=[
            "head",
            "commits_total",
            "fingerprint",
            "synced_at",
            "error",
            "status",
            "analyzed_at",
            "updated_at",
        ]
    )
    enqueue_after_commit(run_ids)
    return run_ids


def _runs_for(chunks: list[Chunk], fingerprint: str) -> list[int]:
    """The analyze run of every open chunk, created if missing. A dead run of a chunk
    that is planned again (the user re-submitted) gets a fresh attempt budget."""
    queue = queue_name(fingerprint)
    ids = []
    for chunk in chunks:
        run = ensure_run(
            kind=JobRun.Kind.ANALYZE,
            job_id=chunk.job_id(),
            queue=queue,
            repository_id=chunk.repository_id,
            chunk_id=chunk.pk,
            fingerprint=fingerprint,
        )
        if run.state in {JobRun.State.DEAD, JobRun.State.DISCARDED}:
            JobRun.objects.filter(pk=run.pk, state=run.state).update(
                state=JobRun.State.QUEUED, budget_base=F("attempts"), error=""
            )
        ids.append(run.pk)
    return ids


def begin_chunk(chunk_id: int) -> tuple[Chunk, str | None]:
    """Start analysing a chunk: ``(chunk, None)`` with the chunk marked running, or
    ``(chunk, reason)`` when nothing is left to do (done already, or every commit of
    it stored by an earlier attempt), after checking whether the repository is
    complete.

    Race: a redelivered or retried job whose earlier attempt committed. The commits'
    unique constraint and this check make the second run a no-op; marking running
    never moves a done chunk back (``exclude(state=done)``).
    """
    chunk = Chunk.objects.select_related("repository").get(pk=chunk_id)
    if chunk.state == Chunk.State.DONE:
        complete_repository(repo_id=chunk.repository_id, fingerprint=chunk.fingerprint)
        return chunk, "already done"
    shas = chunk.sha_list()
    stored = Commit.objects.filter(
        repository_id=chunk.repository_id, fingerprint=chunk.fingerprint, sha__in=shas
    ).count()
    if stored == len(shas):
        Chunk.objects.filter(pk=chunk.pk).update(state=Chunk.State.DONE, finished_at=timezone.now())
        complete_repository(repo_id=chunk.repository_id, fingerprint=chunk.fingerprint)
        return chunk, "already stored"
    Chunk.objects.filter(pk=chunk.pk).exclude(state=Chunk.State.DONE).update(
        state=Chunk.State.RUNNING
    )
    return chunk, None


def finish_chunk(chunk: Chunk) -> bool:
    """After a chunk's commits are stored: publish progress and, if it was the last
    open chunk, mark the repository ready, compute its aggregates once (so no page load
    pays for them) and publish the change. True if the repository completed."""
    repo = chunk.repository
    analyzed = Commit.objects.filter(repository=repo, fingerprint=chunk.fingerprint).count()
    publish_event(
        "job.progress",
        {"repo": repo.pk, "analyzed": analyzed, "total": repo.commits_total},
        repo_id=repo.pk,
    )
    if not complete_repository(repo_id=repo.pk, fingerprint=chunk.fingerprint):
        return False
    repository_summary(Repository.objects.get(pk=repo.pk), chunk.fingerprint)
    publish_repo_changed(repo.pk)
    return True
