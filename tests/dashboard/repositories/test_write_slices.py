"""dashboard.repositories.commits.write_chunk on SQLite stores a large chunk in slices, each
its own fenced transaction, and calls the caller's pause between two of them
(docs/scheduling.md#bulk-writes-in-slices-on-sqlite); PostgreSQL writes any chunk in one
transaction. Whatever the cut: every file row belongs to its commit, the stored count is
exact, the chunk is done only with every row, and a lease lost, a crash or a drop between
two slices leaves whole commits that the next attempt completes."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.db import connection

from dashboard.locks.fencing import StaleToken, next_token
from dashboard.models import Chunk, Commit, FileChange, Repository
from dashboard.repositories.commit_counts import stored_commits
from dashboard.repositories.commits import write_chunk
from tests.support.gitrepo import GitRepo
from tests.support.stored_commits import assert_counts_exact
from workers.analysis.history import stream_commits
from workers.analysis.numstat import CommitRecord

pytestmark = pytest.mark.django_db(transaction=True)

SQLITE = connection.vendor == "sqlite"


def _history(path: Path, n: int) -> tuple[list[str], list[CommitRecord]]:
    """``n`` commits, commit ``i`` touching ``i % 3 + 1`` files: slices of uneven size."""
    repo = GitRepo.create(path)
    for i in range(n):
        repo.commit(f"change {i}", {f"d{k}/f{i % 4}.txt": f"{i} {k}\n" * (i + k + 1)
                                   for k in range(i % 3 + 1)})  # fmt: skip
    shas = repo.git("rev-list", "--reverse", "--topo-order", "HEAD").split()
    return shas, list(stream_commits(repo.path / ".git", shas))


def _chunk(repo: Repository, shas: list[str]) -> Chunk:
    return Chunk.objects.create(
        repository=repo, fingerprint="fp", key=f"{shas[0]}..{shas[-1]}",
        shas="\n".join(shas), size=len(shas),
    )  # fmt: skip


def _assert_rows_are_git(records: list[CommitRecord], shas: list[str]) -> None:
    """Every stored commit of ``shas`` carries exactly its own file rows, as git gave them."""
    by_sha = {r.sha: r for r in records}
    for c in Commit.objects.filter(fingerprint="fp", sha__in=shas):
        files = sorted((f.path, f.added, f.deleted) for f in FileChange.objects.filter(commit=c))
        assert files == sorted((f.path, f.added, f.deleted) for f in by_sha[c.sha].files), c.sha
        assert c.files_changed == len(files)


def _assert_whole(
    chunk: Chunk, repo: Repository, records: list[CommitRecord], shas: list[str]
) -> None:
    """The chunk is done with every commit stored once, its rows git's, the count exact."""
    chunk.refresh_from_db()
    assert chunk.state == Chunk.State.DONE
    assert stored_commits(repo.pk, "fp") == Commit.objects.count() == len(shas)
    _assert_rows_are_git(records, shas)
    assert_counts_exact()


def test_a_large_chunk_is_written_in_slices_on_sqlite_and_in_one_transaction_elsewhere(
    tmp_path: Path, settings
) -> None:
    settings.SQLITE_WRITE_SLICE = 5  # rows: a commit and its files
    shas, records = _history(tmp_path / "h", 12)
    repo = Repository.objects.create(url=str(tmp_path / "h"))
    chunk = _chunk(repo, shas)
    seen: list[tuple[int, str, bool]] = []  # (stored, chunk state, in a transaction)

    def pause() -> None:
        chunk.refresh_from_db()
        # between two transactions: each slice committed, the write lock free
        seen.append((stored_commits(repo.pk, "fp"), chunk.state, connection.in_atomic_block))

    assert write_chunk(chunk=chunk, records=records, token=next_token(chunk.lock_key()),
                       wanted=lambda: True, pause=pause) == 12  # fmt: skip
    if SQLITE:
        # commits of 1, 2, 3 files (2, 3, 4 rows) repeating: cut at 5 rows or more
        # → [2+3], [4+2], [3+4], [2+3], [4+2], [3+4]: six slices, each committed
        # before the next pause, none but the last marking the chunk done
        assert seen == [(n, "queued", False) for n in (2, 4, 6, 8, 10)]
    else:
        assert seen == []
    _assert_whole(chunk, repo, records, shas)


@pytest.mark.skipif(not SQLITE, reason="PostgreSQL writes a chunk in one transaction")
def test_with_nobody_waiting_the_slices_stay_one_transaction_and_commit_when_asked(
    tmp_path: Path, settings
) -> None:
    """``wanted`` is asked after each slice; the write commits only when it says so (a
    backfill alone keeps one transaction: committing every slice cost it half again its
    write time), and goes on in a new transaction after ``pause``."""
    settings.SQLITE_WRITE_SLICE = 5
    shas, records = _history(tmp_path / "h", 12)
    repo = Repository.objects.create(url=str(tmp_path / "h"))
    alone = _chunk(repo, shas[:6])
    asked: list[int] = []
    paused: list[int] = []
    assert write_chunk(chunk=alone, records=records[:6], token=next_token(alone.lock_key()),
                       wanted=lambda: bool(asked.append(1)),
                       pause=lambda: paused.append(1)) == 6  # fmt: skip
    assert (len(asked), paused) == (2, [])  # three slices, two boundaries, one transaction
    busy = _chunk(repo, shas[6:])
    answers = iter([False, True, False])  # someone waits after the second slice only
    seen: list[tuple[int, bool]] = []
    assert write_chunk(chunk=busy, records=records[6:], token=next_token(busy.lock_key()),
                       wanted=lambda: next(answers),
                       pause=lambda: seen.append((stored_commits(repo.pk, "fp"),
                                                  connection.in_atomic_block))) == 6  # fmt: skip
    assert seen == [(6 + 4, False)]  # two slices committed, then the rest in another
    busy.refresh_from_db()
    assert busy.state == Chunk.State.DONE
    _assert_rows_are_git(records, shas)
    assert_counts_exact()


@pytest.mark.skipif(not SQLITE, reason="PostgreSQL writes a chunk in one transaction")
def test_a_lease_lost_between_slices_keeps_whole_commits_and_the_next_holder_completes(
    tmp_path: Path, settings
) -> None:
    settings.SQLITE_WRITE_SLICE = 5
    shas, records = _history(tmp_path / "h", 12)
    repo = Repository.objects.create(url=str(tmp_path / "h"))
    chunk = _chunk(repo, shas)
    calls: list[int] = []
    newer: list[int] = []

    def lose_the_lease() -> None:  # a newer holder takes the chunk's lock after 2 slices
        calls.append(1)
        if len(calls) == 2:
            newer.append(next_token(chunk.lock_key()))

    with pytest.raises(StaleToken):
        write_chunk(chunk=chunk, records=records, token=next_token(chunk.lock_key()),
                    wanted=lambda: True, pause=lose_the_lease)  # fmt: skip
    chunk.refresh_from_db()
    assert chunk.state == Chunk.State.QUEUED  # never done without every row
    assert stored_commits(repo.pk, "fp") == Commit.objects.count() == 4
    assert set(Commit.objects.values_list("sha", flat=True)) == set(shas[:4])
    _assert_rows_are_git(records, shas)
    assert_counts_exact()
    # the new holder's attempt skips the four and stores the rest, in slices again
    assert write_chunk(chunk=chunk, records=records, token=newer[0], wanted=lambda: True) == 8
    _assert_whole(chunk, repo, records, shas)


@pytest.mark.skipif(not SQLITE, reason="PostgreSQL writes a chunk in one transaction")
def test_commits_already_stored_inside_a_slice_are_skipped_and_the_rest_keep_their_rows(
    tmp_path: Path, settings
) -> None:
    """A slice whose fresh commits are not one run (an overlapping chunk stored some of
    them): its file rows are numbered by position among the fresh ones."""
    settings.SQLITE_WRITE_SLICE = 9
    shas, records = _history(tmp_path / "h", 12)
    repo = Repository.objects.create(url=str(tmp_path / "h"))
    other = _chunk(repo, shas[1:2] + shas[4:6])  # inside the first and second slices
    by_sha = {r.sha: r for r in records}
    assert write_chunk(chunk=other, records=[by_sha[s] for s in other.sha_list()],
                       token=next_token(other.lock_key())) == 3  # fmt: skip
    chunk = _chunk(repo, shas)
    pauses: list[int] = []
    assert write_chunk(chunk=chunk, records=records, token=next_token(chunk.lock_key()),
                       wanted=lambda: True, pause=lambda: pauses.append(1)) == 9  # fmt: skip
    assert len(pauses) == 3  # rows 2, 3, 4 repeating: four slices of 9 rows
    assert stored_commits(repo.pk, "fp") == Commit.objects.count() == 12
    _assert_rows_are_git(records, shas)
    assert_counts_exact()


@pytest.mark.skipif(not SQLITE, reason="PostgreSQL writes a chunk in one transaction")
def test_a_chunk_dropped_between_slices_stores_nothing_more(tmp_path: Path, settings) -> None:
    settings.SQLITE_WRITE_SLICE = 5
    shas, records = _history(tmp_path / "h", 12)
    repo = Repository.objects.create(url=str(tmp_path / "h"))
    chunk = _chunk(repo, shas)

    def drop() -> None:  # what a plan after a rewritten history does to the chunk's row
        Chunk.objects.filter(pk=chunk.pk).update(state=Chunk.State.DROPPED)

    assert write_chunk(chunk=chunk, records=records, token=next_token(chunk.lock_key()),
                       wanted=lambda: True, pause=drop) == 2  # fmt: skip
    chunk.refresh_from_db()
    assert chunk.state == Chunk.State.DROPPED
    assert stored_commits(repo.pk, "fp") == Commit.objects.count() == 2
    assert_counts_exact()


def test_a_submission_counts_as_express_work_while_it_writes(
    git_repo: GitRepo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bulk chunk holds its write back (on SQLite: begins no further slice) while
    express work runs
    (``_yield_write`` reads ``express_running``); a submission from the form, the API or
    the CLI is such work while its transaction runs, and is not once it returned."""
    from dashboard.infra import queues
    from dashboard.repositories import lifecycle

    seen: list[int] = []
    real = lifecycle.get_or_create_repository

    def inside(**kwargs: object) -> object:
        seen.append(queues.express_running())
        return real(**kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(lifecycle, "get_or_create_repository", inside)
    git_repo.commit("one", {"a.txt": "a\n"})
    assert queues.express_running() == 0
    _repo, created = lifecycle.submit_repository(url=str(git_repo.path))
    assert created and seen == [1]
    assert queues.express_running() == 0
