"""File rows' foreign keys (migration 0011): the denormalised ``repository_id`` of a file
row has no database constraint (its commit's does the work; on PostgreSQL it cost a
deferred trigger per inserted row), and deleting a repository still removes its file
rows."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.db import connection

from dashboard.locks.fencing import next_token
from dashboard.models import Chunk, Commit, FileChange, Repository
from dashboard.repositories.commits import write_chunk
from tests.support.gitrepo import GitRepo
from workers.analysis.history import stream_commits

pytestmark = pytest.mark.django_db(transaction=True)


def _foreign_keys(table: str) -> dict[str, list[str]]:
    with connection.cursor() as cursor:
        found = connection.introspection.get_constraints(cursor, table)
    return {name: info["columns"] for name, info in found.items() if info["foreign_key"]}


def _analysed(tmp_path: Path) -> Repository:
    git = GitRepo.create(tmp_path / "r")
    git.commit("one", {"a.py": "1\n", "b.md": "b\n"})
    git.commit("two", {"a.py": "2\n"})
    shas = git.git("rev-list", "--reverse", "HEAD").split()
    records = list(stream_commits(git.path / ".git", shas))
    repo = Repository.objects.create(url=str(git.path))
    chunk = Chunk.objects.create(
        repository=repo, fingerprint="fp", key=f"{shas[0]}..{shas[-1]}",
        shas="\n".join(shas), size=len(shas),
    )  # fmt: skip
    write_chunk(chunk=chunk, records=records, token=next_token(chunk.lock_key()))
    return repo


def test_deleting_a_repository_removes_its_commits_and_file_rows(tmp_path: Path) -> None:
    repo = _analysed(tmp_path)
    other = _analysed(tmp_path / "other")
    assert FileChange.objects.filter(repository=repo).count() == 3
    repo.delete()
    assert not Commit.objects.filter(repository_id=repo.pk).exists()
    assert not FileChange.objects.filter(repository_id=repo.pk).exists()
    assert FileChange.objects.filter(repository=other).count() == 3  # nothing else


def test_every_file_row_names_its_commits_repository(tmp_path: Path) -> None:
    repo = _analysed(tmp_path)
    rows = FileChange.objects.filter(commit__repository=repo)
    assert rows.count() == 3
    assert set(rows.values_list("repository_id", flat=True)) == {repo.pk}


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's constraints")
def test_file_rows_are_constrained_to_their_commit_only_and_the_migration_reverses() -> None:
    from django.db.migrations.executor import MigrationExecutor

    table = FileChange._meta.db_table
    assert sorted(_foreign_keys(table).values()) == [["commit_id"]]
    before = ("dashboard", "0010_repository_fk_indexes_covered")
    latest = ("dashboard", "0011_filechange_repository_unconstrained")
    executor = MigrationExecutor(connection)
    executor.migrate([before])
    try:
        assert sorted(_foreign_keys(table).values()) == [["commit_id"], ["repository_id"]]
        executor = MigrationExecutor(connection)
        executor.migrate([latest])
        assert sorted(_foreign_keys(table).values()) == [["commit_id"]]
    finally:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes("dashboard"))
