"""Planning a repository's chunks and moving it between statuses."""

from __future__ import annotations

from collections.abc import Sequence

from django.conf import settings
from django.db import transaction
from django.db.models import F, Max
from django.utils import timezone

from dashboard.models import Chunk, Commit, JobRun, Repository
from dashboard.runs import enqueue_after_commit, ensure_run
from workers.analyzer import queue_name
from workers.chunks import chunk_key, plan_chunks

OPEN_STATES = [Chunk.State.QUEUED, Chunk.State.RUNNING]


def plan_repository(
    *, repo_id: int, generation: int, fingerprint: str, head: str, shas: Sequence[str]
) -> list[int]:
    """Record the new head and plan chunks for commits not yet analysed; return the ids
    of the analyze runs enqueued after commit. Runs inside the caller's transaction
    (which has checked the mirror lock's fencing token).

    1. Lock the repository row (serialises with ``complete_repository``).
    2. Pending = reachable commits − stored for this fingerprint − already in an open
       chunk (queued/running, e.g. from an earlier generation still in flight).
    3. Plan content-defined chunks; insert the new ones (existing keys are kept, and a
       failed one is reset to queued: a re-submission retries it).
    4. Status: analyzing while any chunk is open, else ready.
    """
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


def complete_repository(*, repo_id: int, fingerprint: str) -> bool:
    """Mark the repository ready if no chunk of this fingerprint is open or failed.

    Race: the last two chunks finish at once. Each runs this after its own commit, with
    the repository row locked, so the later one always sees both chunks done. A sync
    planning new chunks holds the same row lock (``plan_repository``), so a completion
    check never sees a half-written plan.
    """
    with transaction.atomic():
        repo = Repository.objects.select_for_update().filter(pk=repo_id).first()
        if repo is None or repo.status != Repository.Status.ANALYZING:
            return False
        if repo.fingerprint != fingerprint:
            return False
        chunks = Chunk.objects.filter(repository_id=repo_id, fingerprint=fingerprint)
        if chunks.filter(state__in=OPEN_STATES).exists():
            return False
        now = timezone.now()
        failed = chunks.filter(state=Chunk.State.FAILED).first()
        if failed is not None:
            # Every chunk has ended and one is dead: the repository shows why.
            Repository.objects.filter(pk=repo_id).update(
                status=Repository.Status.FAILED, error=failed.error, updated_at=now
            )
            return False
        Repository.objects.filter(pk=repo_id).update(
            status=Repository.Status.READY, analyzed_at=now, updated_at=now, error=""
        )
        return True


def fail_repository(*, repo_id: int, generation: int | None, reason: str) -> None:
    """Mark the repository failed with a readable reason (only the same generation,
    when given: a newer submission is not failed by an old job)."""
    qs = Repository.objects.filter(pk=repo_id)
    if generation is not None:
        qs = qs.filter(generation=generation)
    qs.exclude(status=Repository.Status.READY).update(
        status=Repository.Status.FAILED, error=reason[:2000], updated_at=timezone.now()
    )
