"""write_chunk's bulk paths (SQLite executemany, PostgreSQL COPY) store exactly the rows
Django's ORM stores for the same commits, byte for byte in the database's own columns.

Runs on whichever database ``DATABASE_URL`` names (SQLite by default); run it once more
with a PostgreSQL URL to cover COPY. The reference rows are written by ``bulk_create``
from the parsed records, spelled out here, not with write_chunk's helpers.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from dashboard.locks.fencing import StaleToken, next_token
from dashboard.models import Chunk, Commit, FileChange, Repository
from dashboard.repositories.commits import write_chunk
from tests.support import history_quirks
from tests.support.gitrepo import GitRepo
from workers.analysis.history import stream_commits
from workers.analysis.numstat import CommitRecord

pytestmark = pytest.mark.django_db(transaction=True)

REFERENCE = "reference"


def _clean(value: str, limit: int | None = None) -> str:
    value = value.replace("\x00", "\ufffd")  # the contract: PostgreSQL refuses NUL
    return value[:limit] if limit else value


def _minutes(moment: Any) -> int:
    return int(moment.utcoffset().total_seconds() // 60)


def store_reference(repo: Repository, records: list[CommitRecord], token: int) -> None:
    commits = Commit.objects.bulk_create(
        [
            Commit(
                repository=repo,
                fingerprint=REFERENCE,
                sha=r.sha,
                parents=" ".join(r.parents),
                author_name=_clean(r.author_name),
                author_email=_clean(r.author_email),
                author_canonical_name=_clean(r.author_canonical_name),
                author_canonical_email=_clean(r.author_canonical_email),
                authored_at=r.authored_at,
                author_tz=_minutes(r.authored_at),
                committer_name=_clean(r.committer_name),
                committer_email=_clean(r.committer_email),
                committed_at=r.committed_at,
                committer_tz=_minutes(r.committed_at),
                subject=_clean(r.subject),
                is_merge=len(r.parents) > 1,
                files_changed=len(r.files),
                insertions=sum(f.added for f in r.files),
                deletions=sum(f.deleted for f in r.files),
                token=token,
            )
            for r in records
        ]
    )
    ids = {c.sha: c.pk for c in Commit.objects.filter(repository=repo, fingerprint=REFERENCE)}
    assert len(commits) == len(ids)
    FileChange.objects.bulk_create(
        [
            FileChange(
                commit_id=ids[r.sha],
                repository=repo,
                fingerprint=REFERENCE,
                path=_clean(f.path),
                added=f.added,
                deleted=f.deleted,
                binary=f.binary,
                language=f.language,
            )
            for r in records
            for f in r.files
        ]
    )


def raw_rows(fingerprint: str) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Every stored column as the database holds it (raw SQL, no ORM conversion),
    except ids and the fingerprint; file rows keyed by their commit's sha."""
    commit_cols = [
        f.column for f in Commit._meta.concrete_fields if f.column not in ("id", "fingerprint")
    ]
    file_cols = [
        f.column
        for f in FileChange._meta.concrete_fields
        if f.column not in ("id", "fingerprint", "commit_id")
    ]
    c_tab, f_tab = Commit._meta.db_table, FileChange._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {', '.join(commit_cols)} FROM {c_tab} WHERE fingerprint = %s ORDER BY sha",
            [fingerprint],
        )
        commits = list(cursor.fetchall())
        cursor.execute(
            f"SELECT c.sha, {', '.join('f.' + c for c in file_cols)} FROM {f_tab} f "
            f"JOIN {c_tab} c ON c.id = f.commit_id WHERE f.fingerprint = %s "
            "ORDER BY c.sha, f.id",
            [fingerprint],
        )
        files = list(cursor.fetchall())
    return commits, files


def _chunk(repo: Repository, shas: list[str], fingerprint: str) -> Chunk:
    return Chunk.objects.create(
        repository=repo,
        fingerprint=fingerprint,
        key=f"{shas[0]}..{shas[-1]}",
        shas="\n".join(shas),
        size=len(shas),
    )


def _linear_with_files(tmp: Path) -> history_quirks.Quirk:
    repo = GitRepo.create(tmp / "files")
    repo.commit("root", {"README.md": "hello\n", "src/app.py": "print(1)\n"})
    repo.commit("binary and unicode", {"img/logo.png": b"\x89PNG\0\1\2", "docs/ñandú.md": "ñ\n"})
    repo.commit("edit", {"src/app.py": "print(2)\nprint(3)\n", "Makefile": "all:\n"})
    # what COPY's text format must escape (tab, newline, backslash) and what SQL quotes
    awkward = ["tab\there.md", "new\nline.py", "back\\slash.c", "quote'd \\N.txt", "\x1esep"]
    repo.commit("awkward\tsubject \\N", {name: f"{i}\n" for i, name in enumerate(awkward)})
    return history_quirks.Quirk(repo.path / ".git")


BUILDERS: list[Callable[[Path], history_quirks.Quirk]] = [
    _linear_with_files,
    history_quirks.odd_time_zones,
    history_quirks.odd_dates,
    history_quirks.odd_emails,
    history_quirks.legacy_encodings,
    history_quirks.long_octopus,
]


@pytest.mark.parametrize("build", BUILDERS, ids=lambda b: b.__name__.strip("_"))
def test_bulk_write_stores_exactly_the_orm_rows(
    build: Callable[[Path], history_quirks.Quirk], tmp_path: Path
) -> None:
    quirk = build(tmp_path)
    git_dir = quirk.path
    repo = Repository.objects.create(url=str(git_dir))
    shas = GitRepo(git_dir).git("rev-list", "--reverse", "--topo-order", "HEAD").split()
    records = list(stream_commits(git_dir, shas))
    chunk = _chunk(repo, shas, "bulk")
    token = next_token(chunk.lock_key())
    assert write_chunk(chunk=chunk, records=records, token=token) == len(shas)
    store_reference(repo, records, token)

    bulk_commits, bulk_files = raw_rows("bulk")
    ref_commits, ref_files = raw_rows(REFERENCE)
    assert len(bulk_commits) == len(shas)
    assert bulk_commits == ref_commits
    assert bulk_files == ref_files
    # file rows point at their own commit
    for c in Commit.objects.filter(fingerprint="bulk"):
        assert c.files.count() == c.files_changed
    chunk.refresh_from_db()
    assert chunk.state == Chunk.State.DONE and chunk.token == token


def test_commits_already_stored_are_skipped_with_their_files(git_repo: GitRepo) -> None:
    git_dir = git_repo.path / ".git"
    repo = Repository.objects.create(url=str(git_repo.path))
    shas = git_repo.git("rev-list", "--reverse", "HEAD").split()
    records = list(stream_commits(git_dir, shas))
    first = _chunk(repo, shas[:2], "fp")
    assert write_chunk(chunk=first, records=records[:2], token=next_token(first.lock_key())) == 2
    before = dict(Commit.objects.values_list("sha", "pk"))
    whole = _chunk(repo, shas, "fp")
    token = next_token(whole.lock_key())
    assert write_chunk(chunk=whole, records=records, token=token) == len(shas) - 2
    assert Commit.objects.filter(fingerprint="fp").count() == len(shas)
    assert FileChange.objects.filter(fingerprint="fp").count() == sum(len(r.files) for r in records)
    after = dict(Commit.objects.values_list("sha", "pk"))
    assert {sha: after[sha] for sha in before} == before  # the stored ones were left alone
    # each fresh commit got its own files, not those of the commit at its index in the
    # chunk (the fresh ones are re-numbered by their position among themselves)
    for r in records:
        stored = Commit.objects.get(fingerprint="fp", sha=r.sha)
        paths = list(stored.files.order_by("id").values_list("path", flat=True))
        assert paths == [f.path for f in r.files], r.sha
    # a second write of the same chunk stores nothing more
    assert write_chunk(chunk=whole, records=records, token=token) == 0
    assert FileChange.objects.filter(fingerprint="fp").count() == sum(len(r.files) for r in records)


def test_a_fingerprint_is_stored_verbatim_on_the_bulk_path(git_repo: GitRepo) -> None:
    # SQLite's file rows take the fingerprint as a literal of the statement: quoted
    git_dir = git_repo.path / ".git"
    repo = Repository.objects.create(url=str(git_repo.path))
    shas = git_repo.git("rev-list", "--reverse", "HEAD").split()
    records = list(stream_commits(git_dir, shas))
    odd = "it's ' a \\ fp"
    chunk = _chunk(repo, shas, odd)
    assert write_chunk(chunk=chunk, records=records, token=next_token(chunk.lock_key())) == len(
        shas
    )
    files = sum(len(r.files) for r in records)
    assert files and FileChange.objects.filter(fingerprint=odd, repository=repo).count() == files
    assert FileChange.objects.exclude(fingerprint=odd).count() == 0


def test_a_stale_token_writes_nothing_on_the_bulk_path(git_repo: GitRepo) -> None:
    git_dir = git_repo.path / ".git"
    repo = Repository.objects.create(url=str(git_repo.path))
    shas = git_repo.git("rev-list", "--reverse", "HEAD").split()
    records = list(stream_commits(git_dir, shas))
    chunk = _chunk(repo, shas, "fp")
    old = next_token(chunk.lock_key())
    next_token(chunk.lock_key())
    with pytest.raises(StaleToken):
        write_chunk(chunk=chunk, records=records, token=old)
    assert Commit.objects.count() == 0 and FileChange.objects.count() == 0


def test_commit_ids_are_never_handed_out_twice(git_repo: GitRepo) -> None:
    """The SQLite path picks the commit ids itself: after the newest id ever used (also
    one whose row is deleted), and the ORM's next insert still gets a fresh one."""
    git_dir = git_repo.path / ".git"
    repo = Repository.objects.create(url=str(git_repo.path))
    shas = git_repo.git("rev-list", "--reverse", "HEAD").split()
    records = list(stream_commits(git_dir, shas))
    first = _chunk(repo, shas, "one")
    write_chunk(chunk=first, records=records, token=next_token(first.lock_key()))
    used = max(Commit.objects.values_list("pk", flat=True))
    Commit.objects.filter(pk=used).delete()  # the newest row gone: its id stays used
    second = _chunk(repo, shas, "two")
    write_chunk(chunk=second, records=records, token=next_token(second.lock_key()))
    ids = sorted(Commit.objects.filter(fingerprint="two").values_list("pk", flat=True))
    assert len(ids) == len(shas) and ids[0] > used
    # every file row points at the commit of its own sha
    for c in Commit.objects.filter(fingerprint="two"):
        assert c.files.count() == c.files_changed
    again = Commit.objects.create(
        repository=repo, fingerprint="orm", sha="0" * 40, authored_at=records[0].authored_at,
        committed_at=records[0].committed_at,
    )  # fmt: skip
    assert again.pk > ids[-1]


def test_a_chunk_dropped_while_it_was_analysed_writes_nothing(git_repo: GitRepo) -> None:
    """A plan after a rewrite dropped the chunk between its analysis and its write: the
    write, in its own transaction, finds the chunk dropped and stores nothing, so no
    unreachable commit comes back after the plan deleted them."""
    git_dir = git_repo.path / ".git"
    repo = Repository.objects.create(url=str(git_repo.path))
    shas = git_repo.git("rev-list", "--reverse", "HEAD").split()
    records = list(stream_commits(git_dir, shas))
    chunk = _chunk(repo, shas, "fp")
    Chunk.objects.filter(pk=chunk.pk).update(state=Chunk.State.DROPPED)
    assert write_chunk(chunk=chunk, records=records, token=next_token(chunk.lock_key())) == 0
    assert Commit.objects.count() == 0 and FileChange.objects.count() == 0
    chunk.refresh_from_db()
    assert chunk.state == Chunk.State.DROPPED
