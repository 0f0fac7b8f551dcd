"""A repository's planned work: chunks planned from a sync, and each chunk's states
(``queued → running → done | failed``) as analyze jobs take them.

Emits ``job.progress`` when a chunk is stored and ``repo.changed`` when the
repository's analysis completes.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, NamedTuple

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, F, Max, OuterRef, Q, QuerySet
from django.utils import timezone
from rq.registry import ScheduledJobRegistry, StartedJobRegistry

from dashboard import infra
from dashboard.infra import publish_event
from dashboard.locks import check_token
from dashboard.models import Chunk, Commit, FileChange, JobRun, Repository, Summary
from dashboard.repositories.commit_counts import remove_stored, stored_commits
from dashboard.repositories.commits import bump_months, stored_shas
from dashboard.repositories.lifecycle import (
    complete_repository,
    publish_repo_changed,
    refresh_repository,
)
from dashboard.repositories.summaries import repository_summary
from dashboard.runs import CATCH_UP, enqueue_after_commit, ensure_run
from dashboard.versions import planned_fingerprints, repository_key, served_fingerprint
from workers.analysis import ShaList, chunk_key, chunk_target, iter_weighted_chunks, queue_name

OPEN_STATES = [Chunk.State.QUEUED, Chunk.State.RUNNING]


class Plan(NamedTuple):
    """What ``plan_repository`` planned: the analyze run of every open chunk, and the
    one of them it left for the caller to analyse itself (not enqueued), if any."""

    runs: list[int]
    inline: int | None = None


def plan_repository(
    *,
    repo_id: int,
    generation: int,
    head: str,
    shas: Sequence[str],
    lock_key: str,
    token: int | None,
    fingerprint: str | None = None,
    since: str | None = None,
    inline_for: Collection[str] = (),
) -> Plan | None:
    """Record the new head and plan chunks for commits not yet analysed; return the ids
    of the open chunks' analyze runs, enqueued after commit except ``Plan.inline``.

    ``inline_for`` (the inline chunk): the fingerprints the caller can analyse
    with. If the served one is among them, the first of its open chunks whose run is
    queued and never attempted is left un-enqueued and returned as ``Plan.inline``: the
    caller (the sync's work horse) runs its first attempt itself. If the caller dies
    before it claims that attempt, the run is ``queued`` with no RQ job, which the
    reconciler's step 2 enqueues (``reconciler._stale``: a missing job is stale at once).

    ``since`` (an incremental sync): ``shas`` are only the commits reachable
    from ``head`` and not from ``since``, an ancestor of ``head`` that the repository's
    previous plan was made from (``incremental_base``). Such a plan is complete for
    what ``since`` reaches: each of those commits is stored, or in a chunk that is open
    or failed. So when, inside this transaction, ``since`` is still the recorded head,
    the served version is still the one it was planned for (and no other is ramping),
    no failed chunk holds a commit not stored and not in an open chunk, and no more
    commits are stored than the recorded total (else some are unreachable), the full plan
    would find exactly ``shas`` pending, and the total is the old one plus
    ``len(shas)``. Otherwise nothing is written and None is returned: the caller lists
    the whole history and plans again without ``since``.

    ``fingerprint`` plans for that version only; by default the fingerprints are the
    routing's (``canary.planned_fingerprints``): the served (current) one, plus the
    ramping version's when the repository's key routes to it. The served one comes
    first and decides the repository's status; the ramping one is a shadow analysis
    whose runs go to its own physical queue.

    One transaction, guarded by the mirror lock ``lock_key``: its fencing ``token`` is
    checked first (``StaleToken`` if a newer holder exists), then:

    1. Lock the repository row (serialises with ``complete_repository``).
    2. A full plan (no ``since``), per fingerprint: drop what a rewritten history left
       unreachable from ``head`` (``_drop_unreachable``): its chunks are dropped, its
       stored commits deleted and the kept count and summary adjusted, so what is
       served is exactly the commits ``head`` reaches (docs/analysis.md).
    3. Per fingerprint: pending = reachable commits − stored for this fingerprint −
       already in an open chunk (queued/running, e.g. from an earlier generation).
    4. Plan content-defined chunks; insert the new ones (existing keys are kept, and a
       failed or dropped one is reset to queued: a re-submission retries it).
    5. Status (served fingerprint): analyzing while any chunk is open, else ready.

    Race: a promote or rollback commits right after the fingerprints were read. The
    plan is then for the version that was current a moment ago; that version is
    draining, its queued runs are cancelled (``runs.cancel_runs``), and the catch-up of
    the new current version (``catch_up``) re-syncs this repository because its
    ``fingerprint`` column names the old one (if that catch-up passed it mid-sync, the
    reconciler's next one does: ``reconcile_catch_up``).
    """
    with transaction.atomic():
        check_token(lock_key, token)
        repo = Repository.objects.select_for_update().get(pk=repo_id)
        fps = [fingerprint] if fingerprint else planned_fingerprints(key=repository_key(repo_id))
        total = len(shas)
        if since is not None:
            # Race: a chunk of the previous plan failing after this check stays failed
            # until the next submission, exactly as after a full plan that found it
            # running (it was in flight then, so not re-planned either).
            # More stored than the history holds: dropped commits a plan made before
            # rewrites were pruned left behind; the full plan removes them.
            if not (
                since == repo.head
                and fps == [repo.fingerprint]
                and not _uncovered_failures(repo_id, fps[0])
                and stored_commits(repo_id, fps[0]) <= repo.commits_total
            ):
                return None
            total += repo.commits_total
        else:
            reachable = _Reachable(shas)
            for fp in fps:
                _drop_unreachable(repo_id, fp, reachable)
        run_ids, open_served = _plan_chunks(repo_id, fps[0], shas)
        inline = _first_fresh(run_ids) if fps[0] in inline_for else None
        for extra in fps[1:]:  # shadow chunks of a ramping version: always enqueued
            run_ids += _plan_chunks(repo_id, extra, shas)[0]
        _record_plan(repo, fps[0], head, total, open_served)
        enqueue_after_commit([pk for pk in run_ids if pk != inline])
        return Plan(run_ids, inline)


class _Reachable:
    """Membership in the listed history (every commit ``head`` reaches), built on first
    use: a first plan, with nothing stored and no chunk, never builds it."""

    def __init__(self, shas: Sequence[str]) -> None:
        self._shas = shas
        self._set: set[str] | None = None

    def __contains__(self, sha: object) -> bool:
        if self._set is None:
            self._set = set(self._shas)
        return sha in self._set


#: Why a chunk is dropped (its ``error``).
DROPPED = "history rewritten: a commit of this chunk is no longer reachable from the head"


def _drop_unreachable(repo_id: int, fingerprint: str, reachable: _Reachable) -> int:
    """Make the fingerprint's stored results and plan exactly what ``reachable`` holds
    (a full plan, after a force-push, a branch moved back or any rewrite); returns how
    many stored commits were deleted. In the plan's transaction:

    1. Every chunk not done (queued, running, failed) holding an unreachable commit is
       ``dropped``: never analysed again, its reachable commits are planned anew.
    2. Every stored commit that is unreachable is deleted with its files; the kept count
       is lowered by what the DELETE reported (``commit_counts.remove_stored``), the
       cached summary is deleted, and a done chunk holding such a commit is dropped too.

    Race: a chunk of step 1 being written at this moment. Its write locks the chunk row
    (``commits.write_chunk``), so the UPDATE of step 1 waits for that write to commit;
    step 2 is a later statement and sees the rows it stored. A write that comes after
    finds the chunk dropped and stores nothing. (SQLite: one write transaction at a
    time.) A done chunk is never written again, so step 2 needs no such order.

    Race: an attempt that found the chunk dropped (nothing written) and a later plan
    that puts the same commits back (the branch moved forward again) before that
    attempt recorded its success. That plan re-queues the chunk while its run is still
    running, so it does not revive the run; the run then ends succeeded with the chunk
    queued, and the next sync of the repository revives it (``_runs_for`` revives a
    succeeded run of an open chunk). The results are never wrong meanwhile, only late.
    """
    now = timezone.now()
    chunks = Chunk.objects.filter(repository_id=repo_id, fingerprint=fingerprint)
    stale_chunks = [
        pk
        for pk, text in chunks.exclude(state__in=[Chunk.State.DONE, Chunk.State.DROPPED])
        .values_list("pk", "shas")
        .iterator()
        if any(sha not in reachable for sha in text.split())
    ]
    _drop_chunks(stale_chunks, now)
    if not stored_commits(repo_id, fingerprint):
        return 0
    commits = Commit.objects.filter(repository_id=repo_id, fingerprint=fingerprint)
    gone: dict[int, str] = {}
    gone_at = []
    for pk, sha, at in commits.values_list("pk", "sha", "committed_at").iterator(chunk_size=5000):
        if sha not in reachable:
            gone[pk] = sha
            gone_at.append(at)
    if not gone:
        return 0
    # The months of the deleted commits: their aggregates stop being current with this
    # transaction's commit (docs/analytics.md#performance).
    bump_months(repo_id, fingerprint, gone_at)
    ids = list(gone)
    deleted = 0
    for i in range(0, len(ids), _PARAM_BATCH):
        batch = ids[i : i + _PARAM_BATCH]
        FileChange.objects.filter(commit_id__in=batch).delete()
        deleted += Commit.objects.filter(pk__in=batch).delete()[1].get(Commit._meta.label, 0)
    remove_stored(repo_id, fingerprint, deleted)
    Summary.objects.filter(repository_id=repo_id, fingerprint=fingerprint).delete()
    shas = set(gone.values())
    _drop_chunks(
        [
            pk
            for pk, text in chunks.filter(state=Chunk.State.DONE)
            .values_list("pk", "shas")
            .iterator()
            if any(sha in shas for sha in text.split())
        ],
        now,
    )
    return deleted


def _drop_chunks(ids: list[int], now: Any) -> None:
    for i in range(0, len(ids), _PARAM_BATCH):
        Chunk.objects.filter(pk__in=ids[i : i + _PARAM_BATCH]).update(
            state=Chunk.State.DROPPED, error=DROPPED, finished_at=now
        )


def _first_fresh(run_ids: list[int]) -> int | None:
    """The first run (in plan order: the largest chunk first) that is queued and was
    never attempted.

    Race: such a run may have an RQ job already (planned by an earlier generation and
    still waiting in the queue), or the reconciler may enqueue one for it before the
    caller claims it (a missing job is stale at once). Then two deliveries of attempt 1
    exist; ``runs.begin_attempt`` lets exactly one claim it and the other does nothing,
    so the chunk is analysed once either way.
    """
    fresh = set(
        JobRun.objects.filter(
            pk__in=run_ids[:_PARAM_BATCH], state=JobRun.State.QUEUED, attempts=0
        ).values_list("pk", flat=True)
    )
    return next((pk for pk in run_ids if pk in fresh), None)


#: Up to this many shas, the stored ones among them are looked up by sha (``stored_shas``);
#: beyond, every stored sha of the repository is read once (cheaper for a whole history).
LOOKUP_BY_SHA = 2000
_PARAM_BATCH = 500  # ids per ``IN (…)``: below SQLite's bound on query parameters


def incremental_base(repo: Repository) -> str | None:
    """The head to list new commits from (``plan_repository(since=…)``): the head the
    repository was last planned from, if any. A hint read before the fetch; the plan's
    own transaction decides whether it still holds."""
    return repo.head or None


def _in_flight(repo_id: int, fingerprint: str) -> set[str]:
    """The shas of the fingerprint's open (queued or running) chunks."""
    shas: set[str] = set()
    for text in Chunk.objects.filter(
        repository_id=repo_id, fingerprint=fingerprint, state__in=OPEN_STATES
    ).values_list("shas", flat=True):
        shas.update(text.split())
    return shas


def _uncovered_failures(repo_id: int, fingerprint: str) -> bool:
    """Whether a failed chunk holds a commit that is neither stored nor in an open chunk:
    a full plan would plan it again, an incremental one would not. (A failed chunk whose
    commits a later plan re-planned and stored, under other chunk keys, does not count:
    otherwise it would force a full plan on every later sync.)"""
    failed = [
        sha
        for text in Chunk.objects.filter(
            repository_id=repo_id, fingerprint=fingerprint, state=Chunk.State.FAILED
        ).values_list("shas", flat=True)
        for sha in text.split()
    ]
    if not failed:
        return False
    covered = _stored(repo_id, fingerprint, failed) | _in_flight(repo_id, fingerprint)
    return any(sha not in covered for sha in failed)


def _stored(repo_id: int, fingerprint: str, shas: Sequence[str]) -> set[str]:
    """The shas of ``shas`` stored under ``fingerprint`` (possibly a superset: others)."""
    if len(shas) <= LOOKUP_BY_SHA:
        return stored_shas(repo_id, fingerprint, shas)
    rows = Commit.objects.filter(repository_id=repo_id, fingerprint=fingerprint)
    return set(rows.values_list("sha", flat=True))


#: Chunk rows per INSERT while planning: the plan holds this many chunks' text at most.
_ROWS_PER_INSERT = 25


def _plan_chunks(repo_id: int, fingerprint: str, shas: Sequence[str]) -> tuple[list[int], bool]:
    """Plan one fingerprint's chunks; ``(run ids of its open chunks, any open)``.

    Streams (memory flat as histories grow): the pending shas are filtered as the chunks
    are cut, and the chunk rows are inserted ``_ROWS_PER_INSERT`` at a time, so a whole
    history costs
    ``shas`` (a compact ``ShaList`` from the sync) plus a batch of chunks, not a list of
    every pending sha and every chunk's text at once. The same rows as one INSERT: a
    batch's keys exist before the next batch is cut, and keys are unique per chunk.
    """
    stored = _stored(repo_id, fingerprint, shas)
    in_flight = _in_flight(repo_id, fingerprint)
    # Weighed by git's cost estimate (a merge heavier: workers/analysis/chunks.py) when the
    # sync listed the merges (a ShaList from ``list_commits``); else every commit weighs 1.
    weighed = shas.weights() if isinstance(shas, ShaList) else ((s, 1) for s in shas)
    pending = ((s, w) for s, w in weighed if s not in stored and s not in in_flight)
    # The target is the listed history's (``shas``), not the pending part's: a re-plan
    # of the same history (a re-submission after a failed chunk) cuts the same chunks,
    # whatever is stored by now, so a failed chunk gets its own key (and run) back.
    target = chunk_target(
        shas.weight() if isinstance(shas, ShaList) else len(shas),
        floor=settings.CHUNK_SIZE,
        ceiling=settings.CHUNK_MAX,
        spread=settings.CHUNK_SPREAD,
    )
    position = (
        Chunk.objects.filter(repository_id=repo_id, fingerprint=fingerprint).aggregate(
            m=Max("position")
        )["m"]
        or 0
    )
    batch: list[Chunk] = []
    for part in iter_weighted_chunks(pending, target=target):
        position += 1
        batch.append(
            Chunk(
                repository_id=repo_id,
                fingerprint=fingerprint,
                key=chunk_key(part),
                shas="\n".join(part),
                size=len(part),
                position=position,
            )
        )
        if len(batch) >= _ROWS_PER_INSERT:
            _insert_chunks(repo_id, fingerprint, batch)
            batch = []
    _insert_chunks(repo_id, fingerprint, batch)
    # only what _runs_for reads: not every open chunk's list of shas
    open_chunks = list(
        Chunk.objects.filter(repository_id=repo_id, fingerprint=fingerprint, state__in=OPEN_STATES)
        .only("pk", "repository_id", "fingerprint", "key")
        # Largest first (ties in history order): the runs are created, enqueued and
        # unparked in this order, and the sync analyses the first one inline, so the
        # longest chunks start first and the short ones fill in at the end: the workers
        # finish together instead of one of them running the last long chunk alone
        # (longest-processing-time-first; docs/analysis.md#chunking). A chunk's key, run
        # and job id do not depend on the order, so a re-plan finds the same ones.
        .order_by("-size", "position")
    )
    return _runs_for(open_chunks, fingerprint), bool(open_chunks)


def _insert_chunks(repo_id: int, fingerprint: str, rows: list[Chunk]) -> None:
    """Insert new chunk rows (a key that exists is kept) and reset a failed one of these
    keys to queued: a re-submission retries it. A dropped one is queued again too: the
    history reaches exactly its commits again (the branch moved back, then forward)."""
    if not rows:
        return
    Chunk.objects.bulk_create(rows, ignore_conflicts=True)
    Chunk.objects.filter(
        repository_id=repo_id,
        fingerprint=fingerprint,
        key__in=[r.key for r in rows],
        state__in=[Chunk.State.FAILED, Chunk.State.DROPPED],
    ).update(state=Chunk.State.QUEUED, error="", finished_at=None)


def _record_plan(repo: Repository, fingerprint: str, head: str, total: int, busy: bool) -> None:
    now = timezone.now()
    repo.head = head
    repo.commits_total = total
    repo.fingerprint = fingerprint
    repo.synced_at = now
    repo.error = ""
    if busy:
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


def plan_shadow(*, fingerprint: str, items: Sequence[tuple[int, str]], tag: str) -> list[int]:
    """Plan each commit of ``items`` (``[(repo_id, sha), …]``) as its own chunk keyed
    ``{tag}-{sha}`` under ``fingerprint``, on that version's physical queue, enqueued after
    commit: a rollout's shadow samples (docs/rollouts.md#shadow-samples), one run each.

    Unlike ``plan_warm_set`` a commit already stored under ``fingerprint`` is planned
    too: it is analysed again (real work on the canary) and ``write_chunk`` skips a
    stored commit, so nothing is stored twice. Idempotent per ``tag``: the key is
    unique per repository and fingerprint (an existing chunk is kept, a done one is not
    run again) and job ids are deterministic. The repositories' rows are not touched.
    """
    run_ids: list[int] = []
    with transaction.atomic():
        for repo_id, sha in items:
            key = f"{tag}-{sha}"
            position = (
                Chunk.objects.filter(repository_id=repo_id, fingerprint=fingerprint).aggregate(
                    m=Max("position")
                )["m"]
                or 0
            ) + 1
            row = Chunk(
                repository_id=repo_id, fingerprint=fingerprint, key=key, shas=sha, size=1,
                position=position,
            )  # fmt: skip
            # Race: two planners of one tag (a driver and its takeover; the caller holds
            # the warming lock, so only across a lost lease): the unique key lets one
            # INSERT through, the other keeps that row, and the run's job id is the same.
            Chunk.objects.bulk_create([row], ignore_conflicts=True)
            chunk = Chunk.objects.get(repository_id=repo_id, fingerprint=fingerprint, key=key)
            if chunk.state in OPEN_STATES:
                run_ids += _runs_for([chunk], fingerprint)
        enqueue_after_commit(run_ids)
    return run_ids


def _runs_for(chunks: list[Chunk], fingerprint: str) -> list[int]:
    """The analyze run of every open chunk, created if missing. A dead run of a chunk
    that is planned again (the user re-submitted) gets a fresh attempt budget, and so
    does a succeeded one: an open chunk's run has succeeded only when the chunk was
    dropped and is planned again (``_drop_unreachable``)."""
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
        if run.state in {JobRun.State.DEAD, JobRun.State.DISCARDED, JobRun.State.SUCCEEDED}:
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

    A dropped chunk (``_drop_unreachable``) is never analysed: its run ends at once.

    Race: a redelivered or retried job whose earlier attempt committed. The commits'
    unique constraint and this check make the second run a no-op; marking running
    never moves a done chunk back (``exclude(state=done)``).
    """
    chunk = Chunk.objects.select_related("repository").get(pk=chunk_id)
    if chunk.state == Chunk.State.DONE:
        _complete(chunk)
        return chunk, "already done"
    if chunk.state == Chunk.State.DROPPED:
        _complete(chunk)
        return chunk, "dropped: the history was rewritten"
    shas = chunk.sha_list()
    # one parameter for the chunk's shas (not one bound parameter per sha)
    stored = len(stored_shas(chunk.repository_id, chunk.fingerprint, shas))
    if stored == len(shas):
        Chunk.objects.filter(pk=chunk.pk).update(state=Chunk.State.DONE, finished_at=timezone.now())
        _complete(chunk)
        return chunk, "already stored"
    Chunk.objects.filter(pk=chunk.pk).exclude(state=Chunk.State.DONE).update(
        state=Chunk.State.RUNNING
    )
    return chunk, None


def _complete(chunk: Chunk) -> None:
    """A redelivered chunk found its work done: if that completes the repository, the
    live view must hear it too (otherwise it shows "analyzing" at 100% until a reload)."""
    if complete_repository(repo_id=chunk.repository_id, fingerprint=chunk.fingerprint):
        publish_repo_changed(chunk.repository_id)


def finish_chunk(chunk: Chunk) -> bool:
    """After a chunk's commits are stored: publish progress and, if it was the last
    open chunk, mark the repository ready, compute its aggregates once (so no page load
    pays for them) and publish the change. True if the repository completed."""
    repo = chunk.repository
    analyzed = stored_commits(repo.pk, chunk.fingerprint)
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


# ---------------------------------------------------------------------------- catch-up

#: Repositories looked at per catch-up job; the next batch is a new job.
CATCH_UP_BATCH = 50
#: A catch-up batch waits while the sync queue holds more than this many jobs, so a
#: promote on thousands of repositories never floods the workers (no stampede).
CATCH_UP_BACKLOG = 100
CATCH_UP_FUNC = "workers.jobs.catch_up_repositories"


def needs_catch_up(repo: Repository, fingerprint: str) -> bool:
    """Whether the repository's results under ``fingerprint`` are behind its last sync
    because the served version changed (docs/lifecycle.md#catch-up).

    A failed repository is re-synced only when it failed under another version (a
    chunk of its last plan, that plan another version's): it failed for its own
    reasons when its plan was under ``fingerprint`` (the served version's chunk died)
    or when its sync failed (no version change makes a fetch succeed), and re-running
    it on every promote or rollback would only add a dead letter each time."""
    if repo.status in {Repository.Status.QUEUED, Repository.Status.SYNCING}:
        return False  # its sync plans for the served fingerprint anyway
    if repo.status == Repository.Status.FAILED:
        return repo.fingerprint != fingerprint and _sync_succeeded(repo)
    if repo.fingerprint != fingerprint:
        return True
    if repo.status != Repository.Status.READY:
        return False  # analysing its plan under ``fingerprint``: nothing lags
    return stored_commits(repo.pk, fingerprint) < repo.commits_total


def _sync_succeeded_q() -> Exists:
    """The repository's current generation's sync succeeded (it planned): a failure
    since is a chunk's, not the fetch's."""
    return Exists(
        JobRun.objects.filter(
            kind=JobRun.Kind.SYNC,
            repository_id=OuterRef("pk"),
            generation=OuterRef("generation"),
            state=JobRun.State.SUCCEEDED,
        )
    )


def _sync_succeeded(repo: Repository) -> bool:
    return Repository.objects.filter(pk=repo.pk).filter(_sync_succeeded_q()).exists()


def lagging_repositories(fingerprint: str) -> QuerySet[Repository]:
    """Repositories whose last plan was another version's and that a catch-up under
    ``fingerprint`` re-syncs (``needs_catch_up`` in one query, without its check of the
    stored count, which only the catch-up job itself reads): ready or analysing under
    another version, or failed under another version after a sync that planned."""
    return Repository.objects.exclude(fingerprint=fingerprint).filter(
        Q(status__in=[Repository.Status.READY, Repository.Status.ANALYZING])
        | (Q(status=Repository.Status.FAILED) & _sync_succeeded_q())
    )


def catch_up(*, fingerprint: str, after: int = 0, batch: int = CATCH_UP_BATCH) -> int | None:
    """Bring the next ``batch`` repositories (by id, after ``after``) up to date under
    ``fingerprint`` by re-syncing those that lag (``refresh_repository``); return the
    cursor of the next batch, or None when done or when ``fingerprint`` is no longer
    served (a later promote or rollback runs its own catch-up).

    Deduplicated: a refresh is a conditional UPDATE (one new generation per repository,
    whatever the number of concurrent catch-ups) and the sync plans only commits not
    stored and not in an open chunk, under deterministic job ids.
    """
    if served_fingerprint() != fingerprint:
        return None
    rows = list(Repository.objects.filter(pk__gt=after).order_by("pk")[:batch])
    for repo in rows:
        if needs_catch_up(repo, fingerprint):
            refresh_repository(repo_id=repo.pk, fingerprint=fingerprint)
    return rows[-1].pk if len(rows) == batch else None


def reconcile_catch_up() -> int:
    """The reconciler's catch-up (docs/rollouts.md#wiring): while any repository lags the
    served version (``lagging_repositories``) and no catch-up batch of that version is
    live in Redis (queued, started or scheduled), enqueue one from the first lagging
    repository; returns how many were enqueued (0 or 1). So a catch-up that the
    promote's or rollback's after-commit hook never enqueued (the queue server blipped,
    the process died between the commit and the hook), or whose chain of batches broke
    off, is started again; and a repository a finished catch-up passed while it was
    mid-sync, whose plan then landed under the closed version, is re-synced.
    Raises ``infra.QueueUnavailable`` while the queue server is unreachable.

    Race: the hook enqueues its first batch between this check and this enqueue. Then
    two chains run over the same repositories, and each repository is still re-synced
    once: ``refresh_repository`` is one conditional UPDATE that moves a lagging row to
    queued, and the second chain finds it queued (not lagging) and skips it. The same
    batch enqueued twice is one job (``enqueue_catch_up``'s deterministic id)."""
    served = served_fingerprint()
    first = lagging_repositories(served).order_by("pk").values_list("pk", flat=True).first()
    if first is None or _catch_up_live(served):
        return 0
    return int(enqueue_catch_up(served, first - 1))


def _catch_up_live(fingerprint: str) -> bool:
    """Whether a catch-up batch of ``fingerprint`` waits or runs on the maintenance queue
    (RQ's queue and registries, by the batches' job id prefix). A batch whose worker
    died stays in the started registry until its entry expires (the job timeout); the
    reconciler starts a new chain after that."""
    q = infra.queue(infra.MAINTENANCE_QUEUE)
    prefix = f"catchup-{fingerprint[:8]}-"
    ids = [
        *q.get_job_ids(),
        *StartedJobRegistry(queue=q).get_job_ids(),
        *ScheduledJobRegistry(queue=q).get_job_ids(),
    ]
    return any(job_id.startswith(prefix) for job_id in ids)


def enqueue_catch_up(fingerprint: str, after: int = 0) -> bool:
    """Put the catch-up batch after ``after`` on the maintenance queue (deterministic id
    ``catchup-<fp8>-<after>``: a second enqueue of the same batch is a no-op), delayed
    while the sync queue is backed up."""
    backlog = infra.queue(infra.SYNC_QUEUE).count
    delay = 2.0 if backlog > CATCH_UP_BACKLOG else 0.0
    return infra.enqueue_unique(
        infra.queue(infra.MAINTENANCE_QUEUE),
        CATCH_UP_FUNC,
        fingerprint,
        after,
        job_id=f"catchup-{fingerprint[:8]}-{after}",
        delay=delay,
        priority=CATCH_UP,  # behind interactive and refresh work (docs/scheduling.md#classes)
    )


def plan_warm_set(*, fingerprint: str, items: Sequence[tuple[int, Sequence[str]]]) -> list[int]:
    """Plan the warm set's commits (``[[repo_id, [sha, …]], …]``, newest first) under
    ``fingerprint``: chunks and analyze runs on that version's physical queue, enqueued
    after commit. The repositories' rows are not touched (readers keep the served
    version). Idempotent: stored commits and open chunks are skipped and job ids are
    deterministic, so planning twice enqueues nothing new."""
    run_ids: list[int] = []
    with transaction.atomic():
        for repo_id, shas in items:
            ordered = list(reversed(shas))
            if ordered:
                run_ids += _plan_chunks(repo_id, fingerprint, ordered)[0]
        enqueue_after_commit(run_ids)
    return run_ids
