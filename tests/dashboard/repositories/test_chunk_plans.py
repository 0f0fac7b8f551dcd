"""dashboard.repositories.chunk_plans: planning a repository's chunks under the mirror lock's
fencing token, and each chunk's start and finish, against the real database and Redis."""

from __future__ import annotations

import hashlib
import tracemalloc
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any, overload

import pytest
from django.conf import settings
from django.db.models import Sum

from dashboard.infra import queues
from dashboard.locks.fencing import StaleToken, next_token
from dashboard.models import Chunk, Commit, JobRun, Repository, Summary
from dashboard.repositories import chunk_plans
from dashboard.repositories.commit_counts import add_stored
from dashboard.versions.state_machine import served_fingerprint
from tests.support.live_tap import Tap
from workers.analysis.analyzer import queue_name
from workers.analysis.chunks import ShaList, chunk_key, chunk_target, plan_chunks

pytestmark = pytest.mark.django_db(transaction=True)

FP = "0123456789abcdef"
SHAS = [f"{i:040x}" for i in range(1, 8)]


def a_repo(status: str = Repository.Status.SYNCING) -> Repository:
    return Repository.objects.create(url="https://example.com/team/tool.git", status=status)


def plan(repo: Repository, shas: Sequence[str] = SHAS, token: int | None = None) -> list[int]:
    key = repo.lock_key()
    planned = chunk_plans.plan_repository(
        repo_id=repo.pk,
        generation=repo.generation,
        fingerprint=FP,
        head=shas[-1],
        shas=shas,
        lock_key=key,
        token=token if token is not None else next_token(key),
    )
    assert planned is not None and planned.inline is None  # no inline_for: all enqueued
    return planned.runs


def store(repo: Repository, sha: str) -> None:
    """One stored commit, counted as ``write_chunk`` counts what it inserts."""
    now = datetime(2024, 1, 1, tzinfo=UTC)
    add_stored(repo.pk, FP, 1)
    Commit.objects.create(
        repository=repo,
        fingerprint=FP,
        sha=sha,
        author_name="a",
        author_email="a@x",
        author_canonical_name="a",
        author_canonical_email="a@x",
        authored_at=now,
        committer_name="a",
        committer_email="a@x",
        committed_at=now,
        subject="s",
    )


def test_a_stale_token_plans_nothing() -> None:
    repo = a_repo()
    key = repo.lock_key()
    old = next_token(key)
    next_token(key)  # a newer holder of the mirror lock exists
    with pytest.raises(StaleToken):
        plan(repo, token=old)
    assert Chunk.objects.count() == 0 and JobRun.objects.count() == 0
    repo.refresh_from_db()
    assert repo.status == Repository.Status.SYNCING and repo.head == ""


def test_it_plans_every_pending_commit_once_and_enqueues_after_commit() -> None:
    repo = a_repo()
    run_ids = plan(repo)
    chunks = list(Chunk.objects.filter(repository=repo).order_by("position"))
    assert [s for c in chunks for s in c.sha_list()] == SHAS
    assert sorted(run_ids) == sorted(
        JobRun.objects.filter(kind=JobRun.Kind.ANALYZE).values_list("pk", flat=True)
    )
    # The dispatcher's share (docs/scheduling.md#fairness): the first GITWARD_FAIR_WEIGHT
    # runs go to RQ, the others wait parked in the database.
    weight = settings.FAIR_WEIGHT
    runs = list(JobRun.objects.filter(kind=JobRun.Kind.ANALYZE).order_by("pk"))
    assert queues.queue(queue_name(FP)).job_ids == [r.rq_id() for r in runs[:weight]]
    assert [r.parked for r in runs] == [False] * weight + [True] * (len(chunks) - weight)
    repo.refresh_from_db()
    assert repo.status == Repository.Status.ANALYZING and repo.head == SHAS[-1]
    assert repo.commits_total == len(SHAS) and repo.fingerprint == FP
    # Planning again (a redelivered sync) finds the same chunks and runs.
    assert sorted(plan(repo)) == sorted(run_ids)
    assert Chunk.objects.count() == len(chunks)


def test_runs_are_created_enqueued_and_inlined_largest_chunk_first(settings: Any) -> None:
    """Longest first (docs/analysis.md#chunking): chunks of 2, 6, 1 and 3 commits in
    history order get their runs, RQ jobs, parked releases and the inline attempt in the
    order 6, 3, 2, 1, so the workers end together on the short ones."""
    settings.CHUNK_SIZE = settings.CHUNK_MAX = 3  # a fixed target: cap 6
    settings.FAIR_WEIGHT = 2

    def sha(i: int, cut: bool) -> str:  # int(sha[:8], 16) % 3: 0 a cut point, 1 not
        return f"{0 if cut else 1:08x}{i:032x}"

    cuts = [False, True] + [False] * 6 + [True] + [False, False, True]
    shas = [sha(i, cut) for i, cut in enumerate(cuts)]
    assert [len(c) for c in plan_chunks(shas, target=3)] == [2, 6, 1, 3]
    repo = a_repo()
    key = repo.lock_key()
    planned = chunk_plans.plan_repository(
        repo_id=repo.pk,
        generation=repo.generation,
        fingerprint=FP,
        head=shas[-1],
        shas=shas,
        lock_key=key,
        token=next_token(key),
        inline_for=[FP],
    )
    assert planned is not None
    runs = list(JobRun.objects.filter(kind=JobRun.Kind.ANALYZE).order_by("pk"))
    sizes = {c.pk: c.size for c in Chunk.objects.filter(repository=repo)}
    assert [sizes[r.chunk_id] for r in runs] == [6, 3, 2, 1]  # created in this order
    assert planned.runs == [r.pk for r in runs]
    assert planned.inline == runs[0].pk  # the sync's work horse takes the largest
    # the repository's share of 2 waiting runs: the inline one and the next largest;
    # the two shortest parked, released in pk order (so, size order) as runs are claimed
    assert queues.queue(queue_name(FP)).job_ids == [runs[1].rq_id()]
    assert [r.parked for r in runs] == [False, False, True, True]


def test_stored_commits_are_not_planned_and_nothing_pending_is_ready() -> None:
    repo = a_repo()
    for sha in SHAS:
        store(repo, sha)
    assert plan(repo) == []
    repo.refresh_from_db()
    assert repo.status == Repository.Status.READY and repo.analyzed_at is not None


def test_a_failed_chunk_planned_again_is_queued_with_a_fresh_budget() -> None:
    repo = a_repo()
    plan(repo)
    chunk = Chunk.objects.first()
    assert chunk is not None
    Chunk.objects.filter(pk=chunk.pk).update(state=Chunk.State.FAILED, error="boom")
    JobRun.objects.filter(chunk=chunk).update(state=JobRun.State.DEAD, attempts=3)
    plan(repo)
    chunk.refresh_from_db()
    run = JobRun.objects.get(chunk=chunk)
    assert chunk.state == Chunk.State.QUEUED and chunk.error == ""
    assert run.state == JobRun.State.QUEUED and run.budget_used == 0


def test_a_grown_target_cuts_the_same_chunks_when_the_same_history_is_planned_again(
    settings: Any,
) -> None:
    """The target comes from the listed history, not from what is still pending: after
    most chunks are stored and one failed, re-planning the history finds that chunk's
    key again (queued with its run), instead of cutting its commits anew."""
    settings.CHUNK_SIZE, settings.CHUNK_MAX, settings.CHUNK_SPREAD = 2, 16, 2
    shas = [hashlib.sha1(b"grown %d" % i).hexdigest() for i in range(200)]
    repo = a_repo()
    plan(repo, shas)
    chunks = list(Chunk.objects.filter(repository=repo).order_by("position"))
    assert [s for c in chunks for s in c.sha_list()] == shas  # each commit once, in order
    assert all(c.size <= 2 * 16 for c in chunks)
    assert max(c.size for c in chunks) > 2 * 2  # the target grew past the floor's cap
    failed = next(c for c in chunks if 16 < c.size < 32)
    # planned on its own, it would get a smaller target whose cap would split it
    assert failed.size > 2 * chunk_target(failed.size, floor=2, ceiling=16, spread=2)
    for chunk in chunks:
        if chunk.pk == failed.pk:
            Chunk.objects.filter(pk=chunk.pk).update(state=Chunk.State.FAILED, error="boom")
            JobRun.objects.filter(chunk=chunk).update(state=JobRun.State.DEAD, attempts=3)
            continue
        for sha in chunk.sha_list():
            store(repo, sha)
        Chunk.objects.filter(pk=chunk.pk).update(state=Chunk.State.DONE)
    run_ids = plan(repo, shas)
    failed.refresh_from_db()
    assert failed.state == Chunk.State.QUEUED
    assert Chunk.objects.filter(repository=repo).count() == len(chunks)  # no new cut
    assert run_ids == [JobRun.objects.get(chunk=failed).pk]


def test_beginning_a_chunk_marks_it_running_unless_its_work_is_done() -> None:
    repo = a_repo()
    plan(repo)
    first, second = Chunk.objects.order_by("position")[:2]
    chunk, reason = chunk_plans.begin_chunk(first.pk)
    assert chunk.pk == first.pk and reason is None
    assert Chunk.objects.get(pk=first.pk).state == Chunk.State.RUNNING
    for sha in second.sha_list():
        store(repo, sha)
    assert chunk_plans.begin_chunk(second.pk)[1] == "already stored"
    assert Chunk.objects.get(pk=second.pk).state == Chunk.State.DONE
    assert chunk_plans.begin_chunk(second.pk)[1] == "already done"


def test_finishing_the_last_chunk_completes_the_repository_once() -> None:
    repo = a_repo()
    plan(repo, SHAS[:2])
    chunks = list(Chunk.objects.order_by("position"))
    tap = Tap()
    for i, chunk in enumerate(chunks):
        for sha in chunk.sha_list():
            store(repo, sha)
        Chunk.objects.filter(pk=chunk.pk).update(state=Chunk.State.DONE)
        chunk.refresh_from_db()
        assert chunk_plans.finish_chunk(chunk) is (i == len(chunks) - 1)
    repo.refresh_from_db()
    assert repo.status == Repository.Status.READY
    assert Summary.objects.filter(repository=repo, fingerprint=FP).exists()
    events = tap.until(lambda evs: any(e["type"] == "repo.changed" for e in evs))
    progress = [e for e in events if e["type"] == "job.progress"]
    assert progress[-1]["analyzed"] == 2 and progress[-1]["total"] == 2
    changed = next(e for e in events if e["type"] == "repo.changed")
    assert changed["status"] == "ready" and changed["repo"] == repo.pk


def test_a_redelivered_chunk_that_completes_the_repository_tells_the_live_view() -> None:
    # The last chunk's work was committed by an attempt that died before finish_chunk;
    # its redelivery finds it stored and completes the repository: watchers must hear it.
    repo = a_repo()
    plan(repo, SHAS[:2])
    Repository.objects.filter(pk=repo.pk).update(status=Repository.Status.ANALYZING)
    repo.refresh_from_db()
    chunks = list(Chunk.objects.order_by("position"))
    for chunk in chunks:
        for sha in chunk.sha_list():
            store(repo, sha)
    Chunk.objects.filter(pk=chunks[0].pk).update(state=Chunk.State.DONE)
    tap = Tap()
    assert chunk_plans.begin_chunk(chunks[-1].pk)[1] == "already stored"
    assert Repository.objects.get(pk=repo.pk).status == Repository.Status.READY
    events = tap.until(lambda evs: any(e["type"] == "repo.changed" for e in evs))
    changed = next(e for e in events if e["type"] == "repo.changed")
    assert changed["status"] == "ready" and changed["repo"] == repo.pk


def test_an_incremental_plan_writes_nothing_unless_the_previous_plan_still_covers_the_rest() -> (
    None
):
    """``since`` must still be the recorded head and the plan must be for the version the
    previous one was made for; otherwise None (the caller plans the whole history)."""
    repo = a_repo()
    key = repo.lock_key()
    plan(repo, SHAS[:4])
    repo.refresh_from_db()
    assert repo.head == SHAS[3] and repo.commits_total == 4
    chunks = Chunk.objects.filter(repository=repo).count()

    def incremental(since: str, fingerprint: str = FP) -> chunk_plans.Plan | None:
        return chunk_plans.plan_repository(
            repo_id=repo.pk,
            generation=repo.generation,
            fingerprint=fingerprint,
            head=SHAS[-1],
            shas=SHAS[4:],
            lock_key=key,
            token=next_token(key),
            since=since,
        )

    assert incremental(SHAS[2]) is None  # not the head the last plan was made from
    assert incremental(SHAS[3], fingerprint="fedcba9876543210") is None  # another version
    repo.refresh_from_db()
    assert repo.head == SHAS[3] and Chunk.objects.filter(repository=repo).count() == chunks
    assert incremental(SHAS[3])
    repo.refresh_from_db()
    assert repo.head == SHAS[-1] and repo.commits_total == len(SHAS)
    new = Chunk.objects.filter(repository=repo).order_by("position")[chunks:]
    assert sorted(sha for c in new for sha in c.sha_list()) == SHAS[4:]


class _Watched(Sequence[str]):
    """A sync's shas that note, as each one is read, how many chunk rows exist."""

    def __init__(self, shas: ShaList) -> None:
        self.shas = shas
        self.rows_seen: list[int] = []

    def __len__(self) -> int:
        return len(self.shas)

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> list[str]: ...
    def __getitem__(self, index: int | slice) -> str | list[str]:
        return self.shas[index]

    def __iter__(self) -> Iterator[str]:
        for sha in self.shas:
            self.rows_seen.append(Chunk.objects.count())
            yield sha


def _hex_shas(n: int) -> ShaList:
    return ShaList(hashlib.sha1(str(i).encode()).hexdigest() for i in range(n))


def test_a_long_history_is_planned_while_it_is_read_into_the_same_chunks(settings: Any) -> None:
    settings.CHUNK_SIZE = settings.CHUNK_MAX = 2  # a fixed target: many small chunks
    repo = a_repo()
    shas = _Watched(_hex_shas(160))
    plan(repo, shas)
    expected = plan_chunks(list(shas.shas), target=2)
    assert len(expected) > 2 * chunk_plans._ROWS_PER_INSERT
    chunks = list(Chunk.objects.filter(repository=repo).order_by("position"))
    assert [c.sha_list() for c in chunks] == expected
    assert [c.key for c in chunks] == [chunk_key(part) for part in expected]
    assert [c.position for c in chunks] == list(range(1, len(expected) + 1))
    # rows were inserted before the last sha was read: not one list of every chunk
    assert shas.rows_seen[0] == 0 and shas.rows_seen[-1] >= chunk_plans._ROWS_PER_INSERT
    # a failed chunk of a later batch is queued again by the next plan
    last = chunks[-1]
    Chunk.objects.filter(pk=last.pk).update(state=Chunk.State.FAILED, error="boom")
    plan(repo, shas)
    last.refresh_from_db()
    assert last.state == Chunk.State.QUEUED and Chunk.objects.count() == len(expected)


def test_planning_a_whole_history_allocates_less_than_its_text_once(settings: Any) -> None:
    """The sync horse's memory stays flat as histories grow. Planning
    40,000 commits from a ShaList may not hold every sha as text (1.6 MB)."""
    settings.CHUNK_SIZE = settings.CHUNK_MAX = 400
    repo = a_repo()
    shas = _hex_shas(40_000)
    tracemalloc.start()
    try:
        plan(repo, shas)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert Chunk.objects.filter(repository=repo).aggregate(n=Sum("size"))["n"] == 40_000
    assert peak < 40_000 * 41, f"peak {peak} bytes"


# ---------------------------------------------------------------------------- catch-up


def a_synced_repo(status: str, fingerprint: str, sync: str = JobRun.State.SUCCEEDED) -> Repository:
    """A repository whose last plan was ``fingerprint``'s, its current generation's
    sync ended as ``sync``."""
    repo = Repository.objects.create(
        url=f"https://example.com/team/{status}-{fingerprint[:4]}-{sync}.git",
        status=status,
        fingerprint=fingerprint,
    )
    JobRun.objects.create(
        kind=JobRun.Kind.SYNC,
        job_id=repo.sync_job_id(),
        queue=queues.SYNC_QUEUE,
        repository=repo,
        generation=repo.generation,
        state=sync,
    )
    return repo


OLD = "fedcba9876543210"
SERVED = "served"  # stands for the served fingerprint in the rows below
LAGGING = [
    (Repository.Status.READY, OLD, JobRun.State.SUCCEEDED),
    (Repository.Status.ANALYZING, OLD, JobRun.State.SUCCEEDED),
    (Repository.Status.FAILED, OLD, JobRun.State.SUCCEEDED),  # a chunk of OLD died
]
NOT_LAGGING = [
    (Repository.Status.READY, SERVED, JobRun.State.SUCCEEDED),
    (Repository.Status.ANALYZING, SERVED, JobRun.State.SUCCEEDED),
    (Repository.Status.FAILED, SERVED, JobRun.State.SUCCEEDED),  # its own chunk died
    (Repository.Status.FAILED, OLD, JobRun.State.DEAD),  # its fetch failed
    (Repository.Status.FAILED, "", JobRun.State.DEAD),  # its first fetch failed
    (Repository.Status.QUEUED, OLD, JobRun.State.QUEUED),
    (Repository.Status.SYNCING, OLD, JobRun.State.RUNNING),
]


def test_a_catch_up_re_syncs_what_lags_and_no_repository_failed_for_its_own_reasons() -> None:
    """docs/lifecycle.md#catch-up, row by row: the reconciler's query and the batch's
    check agree, and a batch moves exactly the lagging rows to a new sync."""
    served = served_fingerprint()  # no version yet: the deployed default's

    def made(rows: list[tuple[str, str, str]]) -> list[Repository]:
        return [a_synced_repo(st, served if fp == SERVED else fp, sync) for st, fp, sync in rows]

    lagging, others = made(LAGGING), made(NOT_LAGGING)
    assert [r.pk for r in chunk_plans.lagging_repositories(served).order_by("pk")] == [
        r.pk for r in lagging
    ]
    assert [chunk_plans.needs_catch_up(r, served) for r in lagging + others] == [True] * len(
        lagging
    ) + [False] * len(others)
    assert chunk_plans.catch_up(fingerprint=served) is None
    for repo in lagging:
        before = repo.generation
        repo.refresh_from_db()
        assert (repo.status, repo.generation) == (Repository.Status.QUEUED, before + 1)
    for repo, (status, _, _) in zip(others, NOT_LAGGING, strict=True):
        before = repo.generation
        repo.refresh_from_db()
        assert (repo.status, repo.generation) == (status, before)


def test_the_reconciler_enqueues_one_catch_up_while_a_repository_lags() -> None:
    served = served_fingerprint()  # no version yet: the deployed default's
    a_synced_repo(Repository.Status.READY, served)
    assert chunk_plans.reconcile_catch_up() == 0  # nothing lags
    lagging = a_synced_repo(Repository.Status.READY, OLD)
    maintenance = queues.queue(queues.MAINTENANCE_QUEUE)
    assert chunk_plans.reconcile_catch_up() == 1
    assert maintenance.get_job_ids() == [f"catchup-{served[:8]}-{lagging.pk - 1}"]
    assert chunk_plans.reconcile_catch_up() == 0  # one is queued: not another
    assert chunk_plans.enqueue_catch_up(served) is True  # the hook's, racing: a second chain
    assert chunk_plans.reconcile_catch_up() == 0
    assert chunk_plans.catch_up(fingerprint=served) is None  # what the batch does
    lagging.refresh_from_db()
    assert lagging.status == Repository.Status.QUEUED
    for job_id in maintenance.get_job_ids():
        maintenance.remove(job_id)
    assert chunk_plans.reconcile_catch_up() == 0  # nothing lags any more


def test_a_full_plan_drops_what_a_rewritten_history_left_unreachable() -> None:
    """A force-push kept SHAS[:3] and replaced the rest: the stored commits it dropped are
    deleted in the plan's transaction, the kept count and the cached summary follow, the
    chunks holding them are dropped, and the reachable commits of a dropped chunk are
    planned anew (docs/analysis.md)."""
    from dashboard.repositories.commit_counts import pruned_commits, stored_commits

    repo = a_repo()
    plan(repo)
    for sha in SHAS[:5]:
        store(repo, sha)
    Summary.objects.create(repository=repo, fingerprint=FP, commits=5, data={})
    holding_dropped = {c.pk for c in Chunk.objects.all() if set(c.sha_list()) & set(SHAS[3:])}
    rewritten = [*SHAS[:3], *(f"{i:040x}" for i in range(100, 103))]
    plan(repo, rewritten)
    stored = set(Commit.objects.filter(repository=repo).values_list("sha", flat=True))
    assert stored == set(SHAS[:3])
    assert stored_commits(repo.pk, FP) == 3 and pruned_commits(repo.pk, FP) == 2
    assert not Summary.objects.exists()
    dropped = Chunk.objects.filter(state=Chunk.State.DROPPED)
    assert set(dropped.values_list("pk", flat=True)) == holding_dropped
    assert all(c.error == chunk_plans.DROPPED for c in dropped)
    open_shas = {s for c in Chunk.objects.filter(state=Chunk.State.QUEUED) for s in c.sha_list()}
    # every pending commit is planned, and no open chunk holds an unreachable one
    assert set(rewritten) - stored <= open_shas <= set(rewritten)
    repo.refresh_from_db()
    assert repo.commits_total == 6 and repo.status == Repository.Status.ANALYZING
    # a queued run of a dropped chunk ends at once, without touching git
    chunk, reason = chunk_plans.begin_chunk(dropped[0].pk)
    assert reason == "dropped: the history was rewritten"
    chunk.refresh_from_db()
    assert chunk.state == Chunk.State.DROPPED


def test_a_dropped_chunk_is_planned_again_when_the_history_comes_back() -> None:
    """The branch moved back, then forward to the same head: the dropped chunk's key is
    planned again, so the chunk is queued once more and its run revived, even one that
    ended (succeeded) on finding the chunk dropped."""
    repo = a_repo()
    plan(repo)
    plan(repo, SHAS[:1])
    assert set(Chunk.objects.values_list("state", flat=True)) >= {Chunk.State.DROPPED}
    JobRun.objects.update(state=JobRun.State.SUCCEEDED, attempts=1)
    runs = plan(repo, SHAS)
    open_shas = {s for c in Chunk.objects.filter(state=Chunk.State.QUEUED) for s in c.sha_list()}
    assert open_shas == set(SHAS)
    assert set(JobRun.objects.filter(pk__in=runs).values_list("state", flat=True)) == {
        JobRun.State.QUEUED
    }


def test_an_incremental_plan_drops_nothing() -> None:
    repo = a_repo()
    plan(repo)
    for sha in SHAS:
        store(repo, sha)
    Chunk.objects.update(state=Chunk.State.DONE)
    planned = chunk_plans.plan_repository(
        repo_id=repo.pk, generation=repo.generation, fingerprint=FP, head="f" * 40,
        shas=["f" * 40], since=SHAS[-1], lock_key=repo.lock_key(),
        token=next_token(repo.lock_key()),
    )  # fmt: skip
    assert planned is not None
    assert Commit.objects.count() == len(SHAS)
    assert not Chunk.objects.filter(state=Chunk.State.DROPPED).exists()


def test_more_stored_than_the_history_holds_makes_the_next_plan_full() -> None:
    """Commits a rewrite dropped before plans pruned them (stored 8 of a 7-commit total):
    an incremental plan declines, and the full plan that follows removes them."""
    repo = a_repo()
    plan(repo)
    for sha in [*SHAS, "e" * 40]:  # "e…" was dropped by an earlier rewrite, still stored
        store(repo, sha)
    Chunk.objects.update(state=Chunk.State.DONE)
    new = "f" * 40

    def incremental(since: str, head: str) -> object:
        return chunk_plans.plan_repository(
            repo_id=repo.pk, generation=repo.generation, fingerprint=FP, head=head,
            shas=[head], since=since, lock_key=repo.lock_key(),
            token=next_token(repo.lock_key()),
        )  # fmt: skip

    assert incremental(SHAS[-1], new) is None
    plan(repo, [*SHAS, new])
    assert set(Commit.objects.values_list("sha", flat=True)) == set(SHAS)
    assert incremental(new, "d" * 40) is not None  # exact again: incremental from here on
