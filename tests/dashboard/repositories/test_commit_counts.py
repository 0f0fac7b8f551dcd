"""dashboard.repositories.commit_counts: the kept number of stored commits equals ``COUNT(*)`` after
every way commits get stored (a whole analysis through real RQ workers, a re-analysis
after a push, a retried chunk overlapping a re-planned one, a stale write, two
overlapping writers at once) and pages read it instead of counting.

Runs on whichever database ``DATABASE_URL`` names (SQLite by default); run it once more
with a PostgreSQL URL for COPY's row count and the row-locked upsert. Rollouts to a new
fingerprint and rollbacks check the same through ``tests.support.rollout_workers``'s
``assert_complete_under``."""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from dashboard.locks.fencing import StaleToken, next_token
from dashboard.models import Chunk, Commit, CommitCount, Repository
from dashboard.repositories import commits as commits_module
from dashboard.repositories.commit_counts import add_stored, stored_commits
from dashboard.repositories.commits import write_chunk
from dashboard.repositories.lifecycle import current_fingerprint, repository_rows, submit_repository
from dashboard.repositories.reanalysis import reanalyse
from tests.conftest import run_workers
from tests.support.gitrepo import GitRepo
from tests.support.stored_commits import assert_counts_exact
from workers.analysis.history import stream_commits
from workers.analysis.numstat import CommitRecord
from workers.runtime import failpoints

pytestmark = pytest.mark.django_db(transaction=True)


def _history(path: Path, n: int) -> GitRepo:
    repo = GitRepo.create(path)
    for i in range(n):
        repo.commit(f"change {i}", {f"f{i % 3}.txt": f"line {i}\n" * (i + 1)})
    return repo


def _records(git: GitRepo) -> tuple[list[str], list[CommitRecord]]:
    shas = git.git("rev-list", "--reverse", "--topo-order", "HEAD").split()
    return shas, list(stream_commits(git.path / ".git", shas))


def _chunk(repo: Repository, shas: list[str], fp: str) -> Chunk:
    return Chunk.objects.create(
        repository=repo, fingerprint=fp, key=f"{shas[0]}..{shas[-1]}",
        shas="\n".join(shas), size=len(shas),
    )  # fmt: skip


def _write(repo: Repository, shas: list[str], records: list[CommitRecord], fp: str) -> int:
    chunk = _chunk(repo, shas, fp)
    by_sha = {r.sha: r for r in records}
    return write_chunk(
        chunk=chunk, records=[by_sha[s] for s in shas], token=next_token(chunk.lock_key())
    )


def test_a_whole_analysis_and_a_reanalysis_after_a_push_keep_the_count_exact(
    git_repo: GitRepo, settings
) -> None:
    settings.CHUNK_SIZE = 2  # several chunks, each adding what it stored
    for i in range(5):
        git_repo.commit(f"change {i}", {f"f{i}.txt": "x\n"})
    repo, _ = submit_repository(url=str(git_repo.path))
    run_workers()
    repo.refresh_from_db()
    assert repo.status == Repository.Status.READY, repo.error
    fp = current_fingerprint()
    assert stored_commits(repo.pk, fp) == repo.commits_total == 8
    assert_counts_exact()
    # a push, then the page's re-analyse button: only the new commits are added
    git_repo.commit("pushed later", {"late.txt": "new\n"})
    git_repo.commit("pushed later 2", {"late.txt": "new\nnewer\n"})
    status, _ = reanalyse(repo, User.objects.create_superuser("ops", password="pw-ops-12345"))
    assert status == 202
    run_workers()
    repo.refresh_from_db()
    assert repo.status == Repository.Status.READY, repo.error
    assert stored_commits(repo.pk, fp) == repo.commits_total == 10
    assert_counts_exact()
    assert repository_rows(Repository.objects.filter(pk=repo.pk))[0]["commits_analyzed"] == 10


def test_a_retried_chunk_overlapping_a_replanned_one_adds_only_what_it_inserted(
    tmp_path: Path,
) -> None:
    git = _history(tmp_path / "h", 8)
    shas, records = _records(git)
    repo = Repository.objects.create(url=str(git.path))
    # The first plan's chunk 0..3 died after storing nothing; the re-plan cut 2..7.
    assert _write(repo, shas[2:], records, "fp") == 6
    assert stored_commits(repo.pk, "fp") == 6
    # The dead chunk's retry overlaps it: two of its four commits are new.
    dead = _chunk(repo, shas[:4], "fp")
    token = next_token(dead.lock_key())
    assert write_chunk(chunk=dead, records=records[:4], token=token) == 2
    assert stored_commits(repo.pk, "fp") == 8
    # The same chunk once more (a redelivery): nothing new, nothing added.
    assert write_chunk(chunk=dead, records=records[:4], token=token) == 0
    assert stored_commits(repo.pk, "fp") == 8
    # Another fingerprint (a rollout's new version) counts on its own row.
    assert _write(repo, shas[:3], records, "other") == 3
    assert (stored_commits(repo.pk, "fp"), stored_commits(repo.pk, "other")) == (8, 3)
    assert_counts_exact()


def test_a_write_refused_or_rolled_back_adds_nothing(tmp_path: Path) -> None:
    git = _history(tmp_path / "h", 4)
    shas, records = _records(git)
    repo = Repository.objects.create(url=str(git.path))
    chunk = _chunk(repo, shas, "fp")
    old = next_token(chunk.lock_key())
    next_token(chunk.lock_key())  # a newer holder exists
    with pytest.raises(StaleToken):
        write_chunk(chunk=chunk, records=records, token=old)
    assert stored_commits(repo.pk, "fp") == 0
    assert_counts_exact()


def test_two_overlapping_writers_at_once_count_each_commit_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writer A stops inside its transaction after inserting (rows written, count not
    yet bumped) while writer B writes an overlapping chunk. SQLite: B waits for A's
    write lock and then skips A's commits. PostgreSQL: B's COPY waits on A's unique-index
    entries and then fails on the duplicate, rolling back its rows and its bump; its
    retry adds only the rest. Either way the count is exact."""
    git = _history(tmp_path / "h", 6)
    shas, records = _records(git)
    repo = Repository.objects.create(url=str(git.path))
    a_inside, a_go = threading.Event(), threading.Event()
    real_failpoint = failpoints.failpoint

    def pause_writer_a(name: str, tag: str = "") -> None:
        if threading.current_thread().name == "writer-a":
            a_inside.set()
            assert a_go.wait(30), "writer A was never released"
        real_failpoint(name, tag)

    monkeypatch.setattr(commits_module, "failpoint", pause_writer_a)
    chunk_a, chunk_b = _chunk(repo, shas[:4], "fp"), _chunk(repo, shas[2:], "fp")
    out: dict[str, Any] = {}

    def write(name: str, chunk: Chunk, recs: list[CommitRecord]) -> None:
        try:
            out[name] = write_chunk(chunk=chunk, records=recs, token=next_token(chunk.lock_key()))
        except Exception as exc:  # COPY raises psycopg's own error, not Django's
            out[name] = exc
        finally:
            connection.close()

    a = threading.Thread(target=write, args=("a", chunk_a, records[:4]), name="writer-a")
    a.start()
    assert a_inside.wait(30), "writer A never reached its insert"
    b = threading.Thread(target=write, args=("b", chunk_b, records[2:]), name="writer-b")
    b.start()
    if connection.vendor == "postgresql":
        _wait_until_blocked(repo)  # B is waiting on A's rows, not done before A commits
    a_go.set()
    a.join(60)
    b.join(60)
    assert not a.is_alive() and not b.is_alive()
    assert out["a"] == 4
    if isinstance(out["b"], Exception):  # PostgreSQL: B's retry writes the rest
        assert connection.vendor == "postgresql", out["b"]
        assert "commit_repo_fp_sha_unique" in str(out["b"])
        assert stored_commits(repo.pk, "fp") == 4
        out["b"] = write_chunk(
            chunk=chunk_b, records=records[2:], token=next_token(chunk_b.lock_key())
        )
    assert out["b"] == 2
    assert stored_commits(repo.pk, "fp") == 6 == Commit.objects.filter(fingerprint="fp").count()
    assert_counts_exact()


def _wait_until_blocked(repo: Repository) -> None:
    """Until some PostgreSQL backend waits on a lock (writer B on writer A's rows)."""
    for _ in range(3000):
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database()"
            )
            if cursor.fetchone()[0]:
                return
        threading.Event().wait(0.01)
    raise AssertionError("writer B never blocked on writer A")


def test_the_count_is_upserted_per_repository_and_fingerprint() -> None:
    repo = Repository.objects.create(url="https://example.com/a/b.git")
    add_stored(repo.pk, "fp", 0)
    assert not CommitCount.objects.exists()  # nothing inserted: no row
    add_stored(repo.pk, "fp", 3)
    add_stored(repo.pk, "fp", 4)
    add_stored(repo.pk, "other", 1)
    assert (stored_commits(repo.pk, "fp"), stored_commits(repo.pk, "other")) == (7, 1)
    assert stored_commits(repo.pk, "none") == 0
    repo.delete()
    assert not CommitCount.objects.exists()  # cascades with the repository


COUNT_OVER_COMMITS = re.compile(r"COUNT\([^)]*\).*FROM \"?dashboard_commit\"?\s", re.I | re.S)


def test_the_repository_page_counts_no_commits_and_its_queries_do_not_grow(
    tmp_path: Path, settings
) -> None:
    settings.CHUNK_SIZE = 5
    small = _history(tmp_path / "small", 3)
    big = _history(tmp_path / "big", 40)
    repos = [submit_repository(url=str(g.path))[0] for g in (small, big)]
    run_workers()
    client = Client()
    client.force_login(User.objects.create_superuser("ops", password="pw-ops-12345"))
    captured = []
    for repo in repos:
        path = f"/repos/{repo.pk}/"
        assert client.get(path).status_code == 200  # warm: session, summary
        with CaptureQueriesContext(connection) as queries:
            assert client.get(path).status_code == 200
            assert client.get(f"/api/repos/{repo.pk}?summary=1").status_code == 200
            assert client.get("/repos/").status_code == 200
        sqls = [q["sql"] for q in queries.captured_queries]
        assert not [s for s in sqls if COUNT_OVER_COMMITS.search(s)], sqls
        captured.append(len(sqls))
    assert captured[0] == captured[1]  # 3 or 40 commits: the same queries


def test_the_migration_back_fills_the_count_of_what_is_stored(tmp_path: Path) -> None:
    from django.db.migrations.executor import MigrationExecutor

    git = _history(tmp_path / "h", 5)
    shas, records = _records(git)
    repos = [Repository.objects.create(url=f"{git.path}?{i}") for i in range(2)]
    _write(repos[0], shas, records, "fp")
    _write(repos[0], shas[:2], records, "other")
    _write(repos[1], shas[:3], records, "fp")
    before, latest = ("dashboard", "0008_observe"), ("dashboard", "0009_commit_counts")
    executor = MigrationExecutor(connection)
    executor.migrate([before])  # the table is dropped, the commits stay
    try:
        executor = MigrationExecutor(connection)
        executor.migrate([latest])
        assert {
            (r, fp): n
            for r, fp, n in CommitCount.objects.values_list(
                "repository_id", "fingerprint", "commits"
            )
        } == {(repos[0].pk, "fp"): 5, (repos[0].pk, "other"): 2, (repos[1].pk, "fp"): 3}
        assert_counts_exact()
    finally:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes("dashboard"))
