"""dashboard.analytics.people: the authors list, one author's activity and one file's
history, against ``git log`` on the planted history."""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from dashboard.analytics import people
from dashboard.analytics.people import author_activity, authors, file_history
from dashboard.analytics.rows import Scope
from dashboard.analytics.window import parse_window
from tests.support.analytics_history import analysed, build, git_log

pytestmark = pytest.mark.django_db(transaction=True)

#: For the tests of SQLite's query plans (PostgreSQL chooses by its own statistics).
sqlite_plan = pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite's query plan")


def newest_commits_sql(captured: CaptureQueriesContext) -> list[str]:
    """The statements ``people.newest_commits`` ran while ``captured``."""
    return [q["sql"] for q in captured.captured_queries if q["sql"].startswith("SELECT c.sha")]


def sqlite_plan_of(sql: str) -> list[str]:
    """SQLite's ``EXPLAIN QUERY PLAN`` of ``sql``, a step per line."""
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN QUERY PLAN {sql}")
        return [row[3] for row in cursor.fetchall()]


def monday(iso: str) -> str:
    day = datetime.fromisoformat(iso).date()
    return (day - timedelta(days=day.weekday())).isoformat()


def inside(scope: Scope, iso: str) -> bool:
    at = datetime.fromisoformat(iso)
    start, end = scope.window.start, scope.window.end
    return (start is None or at >= start) and (end is None or at < end)


def test_authors_and_one_authors_activity_equal_git(tmp_path: Path) -> None:
    origin = build(tmp_path / "origin")
    repo = analysed(origin)
    scope = Scope.of(repo, parse_window())
    log = git_log(origin)
    got = {a["author"]: a for a in authors(scope)}
    per = Counter(c.author for c in log)
    assert {a: row["commits"] for a, row in got.items()} == dict(per)
    for email, row in got.items():
        mine = [c for c in log if c.author == email]
        assert row["insertions"] == sum(a for c in mine for a, _ in c.files.values())
        assert row["deletions"] == sum(d for c in mine for _, d in c.files.values())
    assert got["bob@example.com"]["name"] == "Bob"  # .mailmap: bobby's commit is Bob's
    assert next(iter(got)) == "ada@example.com"

    ada = author_activity(scope, "ada@example.com")
    assert ada is not None and ada["commits"] == per["ada@example.com"]
    weeks = Counter(monday(c.committed_at) for c in log if c.author == "ada@example.com")
    assert {w["week"]: w["commits"] for w in ada["weekly"]} == dict(weeks)
    files = Counter(p for c in log if c.author == "ada@example.com" for p in c.files)
    assert {f["path"]: f["revs"] for f in ada["files"]} == dict(files)
    assert {x["language"] for x in ada["languages"]} >= {"Python", "Markdown"}
    assert author_activity(scope, "nobody@example.com") is None


def test_one_files_history_equals_git(tmp_path: Path) -> None:
    origin = build(tmp_path / "origin")
    repo = analysed(origin)
    scope = Scope.of(repo, parse_window())
    got = file_history(scope, "core/a.py")
    assert got is not None
    logged = git_log(origin, "--", "core/a.py")
    assert got["revs"] == len(logged) == 11  # the 35-file sweep counts here, not in coupling
    assert [c["sha"] for c in got["commits"]] == [c.sha for c in logged]  # newest first
    assert got["added"] == sum(c.files["core/a.py"][0] for c in logged)
    by_author: dict[str, int] = defaultdict(int)
    for c in logged:
        by_author[c.author] += 1
    assert {a["author"]: a["revs"] for a in got["authors"]} == dict(by_author)
    assert [(r["coupled"], r["degree"]) for r in got["coupled"]] == [("core/b.py", 80)]
    assert file_history(scope, "no/such.py") is None


@pytest.mark.parametrize("path_row_cost", [0, 4, 10**9])
def test_one_files_newest_commits_equal_git_by_either_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path_row_cost: int
) -> None:
    """The newest commits of a file come from the window's newest commits when enough of
    them changed it, else through the path index or the whole window, whichever reads
    fewer rows on SQLite (docs/analytics.md#performance; ``PATH_ROW_COST`` 0: always the
    path index, 10**9: never): every way exactly ``git log -- <path>``'s first
    ``limit``, newest first, over windows with an end and with both ends."""
    monkeypatch.setattr(people, "PATH_ROW_COST", path_row_cost)
    origin = build(tmp_path / "origin")
    repo = analysed(origin)
    log = git_log(origin)  # newest first
    whole = Scope.of(repo, parse_window())
    older = Scope.of(repo, parse_window(until=log[3].committed_at[:10]))
    middle = Scope.of(repo, parse_window(log[-6].committed_at[:10], log[3].committed_at[:10]))
    for scope in (whole, older, middle):
        for path in ("handbook/guide.md", "core/a.py", "core/b.py", "README.md", "legacy/old.py"):
            logged = [c.sha for c in git_log(origin, "--", path) if inside(scope, c.committed_at)]
            if not logged:
                assert file_history(scope, path, coupled=False) is None
                continue
            for limit in (1, 2, 3, 100):
                got = file_history(scope, path, limit=limit, coupled=False)
                assert got is not None
                assert [c["sha"] for c in got["commits"]] == logged[:limit], (path, limit)
                raw = file_history(
                    dataclasses.replace(scope, aggregates=False), path, limit=limit, coupled=False
                )
                assert raw == got


@sqlite_plan
def test_a_busy_files_newest_commits_are_read_newest_first_through_the_page_index(
    tmp_path: Path,
) -> None:
    """Ten of the newest commits change ``handbook/guide.md``: its two newest are found
    among the window's eight newest commits, read in order through the page index and
    stopped early; not every revision of the file through the path index and then sorted
    (SQLite has no per-path statistics, and took that plan: 2.2 s for the busiest file
    of a 1,000,000-commit history, docs/analytics.md#performance)."""
    repo = analysed(build(tmp_path / "origin"))
    scope = Scope.of(repo, parse_window())
    with CaptureQueriesContext(connection) as captured:
        got = file_history(scope, "handbook/guide.md", limit=2, coupled=False)
    assert got is not None and len(got["commits"]) == 2
    newest = newest_commits_sql(captured)
    assert len(newest) == 1
    plan = sqlite_plan_of(newest[0])
    assert any("commit_page_idx" in step for step in plan), plan
    assert not any("file_repo_fp_path_idx" in step for step in plan), plan
    assert not any("TEMP B-TREE" in step for step in plan), plan


@sqlite_plan
def test_a_rare_files_newest_commits_in_a_bounded_window_are_read_through_the_path_index(
    tmp_path: Path,
) -> None:
    """``legacy/util.py`` has one stored row; the window (a start and an end) holds
    twenty commits. Its newest commits are read from its rows through the path index,
    each one's commit by key: not every commit of the window through the page index,
    each probing the path index for that file's rows (SQLite's plan for a window with
    both ends: 1.9 s for a file of six revisions in a 234,000-commit window,
    docs/analytics.md#performance)."""
    origin = build(tmp_path / "origin")
    repo = analysed(origin)
    log = git_log(origin)  # newest first
    scope = Scope.of(repo, parse_window(log[-1].committed_at[:10], log[5].committed_at[:10]))
    with CaptureQueriesContext(connection) as captured:
        got = file_history(scope, "legacy/util.py", coupled=False)
    assert got is not None
    assert [c["sha"] for c in got["commits"]] == [
        c.sha for c in git_log(origin, "--", "legacy/util.py")
    ]
    newest = newest_commits_sql(captured)
    assert len(newest) == 1
    plan = sqlite_plan_of(newest[0])
    assert "SEARCH f USING INDEX file_repo_fp_path_idx" in plan[0], plan
    assert any("SEARCH c USING INTEGER PRIMARY KEY" in step for step in plan), plan
    assert not any("commit_page_idx" in step for step in plan), plan


def test_a_busy_files_steps_in_a_window_with_a_start_bound_the_page_index_once(
    tmp_path: Path,
) -> None:
    """Each step's bound on the committer date replaces the window's start: given both
    lower bounds, SQLite ranged the page index from the window's start and filtered by
    the bound, reading the whole window at each step (docs/analytics.md#performance)."""
    origin = build(tmp_path / "origin")
    repo = analysed(origin)
    log = git_log(origin)  # newest first
    scope = Scope.of(repo, parse_window(log[-1].committed_at[:10], log[0].committed_at[:10]))
    with CaptureQueriesContext(connection) as captured:
        got = file_history(scope, "handbook/guide.md", limit=2, coupled=False)
    assert got is not None
    logged = [
        c.sha for c in git_log(origin, "--", "handbook/guide.md") if inside(scope, c.committed_at)
    ]
    assert [c["sha"] for c in got["commits"]] == logged[:2]
    newest = newest_commits_sql(captured)
    if connection.vendor == "sqlite":
        assert len(newest) == 1  # found among the window's eight newest commits
    for sql in newest:
        assert sql.count("c.committed_at >=") == 1, sql
