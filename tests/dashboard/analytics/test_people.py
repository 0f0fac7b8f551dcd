"""dashboard.analytics.people: the authors list, one author's activity and one file's
history, against ``git log`` on the planted history."""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from dashboard.analytics.people import author_activity, authors, file_history
from dashboard.analytics.rows import Scope
from dashboard.analytics.window import parse_window
from tests.support.analytics_history import analysed, build, git_log

pytestmark = pytest.mark.django_db(transaction=True)


def monday(iso: str) -> str:
    day = datetime.fromisoformat(iso).date()
    return (day - timedelta(days=day.weekday())).isoformat()


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


def test_one_files_newest_commits_equal_git_by_either_index(tmp_path: Path) -> None:
    """The newest commits of a file come from the window's newest commits when enough of
    them changed it, else through the path index (docs/analytics.md#performance): either
    way exactly ``git log -- <path>``'s first ``limit``, newest first."""
    origin = build(tmp_path / "origin")
    repo = analysed(origin)
    whole = Scope.of(repo, parse_window())
    older = Scope.of(repo, parse_window(until=git_log(origin)[3].committed_at[:10]))
    for scope in (whole, older):
        for path in ("handbook/guide.md", "core/a.py", "core/b.py", "README.md"):
            logged = [
                c.sha
                for c in git_log(origin, "--", path)
                if scope.window.end is None
                or datetime.fromisoformat(c.committed_at) < scope.window.end
            ]
            for limit in (1, 2, 3, 100):
                got = file_history(scope, path, limit=limit, coupled=False)
                assert got is not None
                assert [c["sha"] for c in got["commits"]] == logged[:limit], (path, limit)
                raw = file_history(
                    dataclasses.replace(scope, aggregates=False), path, limit=limit, coupled=False
                )
                assert raw == got


@pytest.mark.skipif(
    "sqlite" not in __import__("django.conf").conf.settings.DATABASES["default"]["ENGINE"],
    reason="SQLite's query plan",
)
def test_a_busy_files_newest_commits_are_read_newest_first_through_the_page_index(
    tmp_path: Path,
) -> None:
    """Ten of the newest commits change ``handbook/guide.md``: its two newest are found
    among the window's eight newest commits, read in order through the page index and
    stopped early; not every revision of the file through the path index and then sorted
    (SQLite has no per-path statistics, and took that plan: 2.2 s for the busiest file
    of a 1,000,000-commit history, docs/analytics.md#performance)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    repo = analysed(build(tmp_path / "origin"))
    scope = Scope.of(repo, parse_window())
    with CaptureQueriesContext(connection) as captured:
        got = file_history(scope, "handbook/guide.md", limit=2, coupled=False)
    assert got is not None and len(got["commits"]) == 2
    newest = [q["sql"] for q in captured.captured_queries if q["sql"].startswith("SELECT c.sha")]
    assert len(newest) == 1
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN QUERY PLAN {newest[0]}")
        plan = [row[3] for row in cursor.fetchall()]
    assert any("commit_page_idx" in step for step in plan), plan
    assert not any("file_repo_fp_path_idx" in step for step in plan), plan
    assert not any("TEMP B-TREE" in step for step in plan), plan
