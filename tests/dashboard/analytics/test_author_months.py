"""dashboard.analytics.author_months: the people views read through the per-author
sums count every commit once, credit co-authors once per person (the identity map
merging one with the author), keep their rows current through a backfill, and equal the
stored rows' figures (docs/analytics.md#performance; the property test over random
windows and lenses is in test_aggregates.py)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, date, datetime
from pathlib import Path

import pytest

from dashboard.analytics.aggregates import split
from dashboard.analytics.author_months import ensure_author_months, ensure_author_years
from dashboard.analytics.lenses import Lens
from dashboard.analytics.ownership import file_ownership, last_seen
from dashboard.analytics.people import author_activity, authors
from dashboard.analytics.rows import Scope
from dashboard.analytics.window import Window
from dashboard.models import AuthorMonth, MonthStamp
from dashboard.repositories.lifecycle import submit_repository
from tests.conftest import run_workers
from tests.support.analytics_history import ADA, BOB, CY, DAY, analysed
from tests.support.gitrepo import GitRepo

pytestmark = pytest.mark.django_db(transaction=True)

MARCH = int(datetime(2024, 3, 4, tzinfo=UTC).timestamp())
#: March 2024, a whole month read from the sums.
WHOLE_MARCH = Window(datetime(2024, 3, 1, tzinfo=UTC), datetime(2024, 4, 1, tzinfo=UTC))


def build(path: Path) -> GitRepo:
    """Four commits in March 2024: Ada's co-authored by Bob (twice: two spellings), Bob's,
    Cy's co-authored by Ada, and an empty one of Ada's."""
    repo = GitRepo.create(path)
    repo.clock = MARCH
    repo.commit(
        "a\n\nCo-authored-by: Bob <bob@example.com>\nCo-authored-by: B <BOB@example.com>",
        {"a.py": "1\n2\n"},
        author=ADA,
    )
    repo.clock += DAY
    repo.commit("b", {"a.py": "1\n", "b.py": "1\n"}, author=BOB)
    repo.clock += DAY
    repo.commit("c\n\nCo-authored-by: Ada <ada@example.com>", {"b.py": "2\n"}, author=CY)
    repo.clock += DAY
    repo.commit("empty", author=ADA, allow_empty=True)
    return repo


def counts(rows: list[dict]) -> dict[str, int]:
    return {r["author"]: r["commits"] for r in rows}


def test_each_commit_counts_once_per_credited_person(tmp_path: Path) -> None:
    repo = analysed(build(tmp_path / "origin"))
    scope = Scope.of(repo, WHOLE_MARCH)
    assert split(scope).runs == ((date(2024, 3, 1), date(2024, 3, 1)),)
    got = authors(scope)
    # Co-author e-mails are as written: BOB@ is someone else until the identity map.
    assert counts(got) == {
        "ada@example.com": 3,
        "bob@example.com": 2,
        "BOB@example.com": 1,
        "cy@example.com": 1,
    }
    assert got == authors(dataclasses.replace(scope, aggregates=False))
    stored = {
        (a.author_canonical_email, a.commits)
        for a in AuthorMonth.objects.filter(repository=repo, span=1, month=date(2024, 3, 1))
    }
    assert stored == {("ada@example.com", 2), ("bob@example.com", 1), ("cy@example.com", 1)}
    # The identity map (lower-cased) makes both Bobs Ada: Ada's own commit credits her
    # once, not three times.
    merged = Scope.of(
        repo, Window(), lens=Lens(identities=(("bob@example.com", "ada@example.com"),))
    )
    assert counts(authors(merged)) == {"ada@example.com": 4, "cy@example.com": 1}
    assert authors(merged) == authors(dataclasses.replace(merged, aggregates=False))
    owners = {r["path"]: (r["revs"], r["credits"]) for r in file_ownership(merged)}
    assert owners == {"a.py": (2, 2), "b.py": (2, 3)}
    assert file_ownership(merged) == file_ownership(dataclasses.replace(merged, aggregates=False))
    assert last_seen(scope) == last_seen(dataclasses.replace(scope, aggregates=False))
    page = author_activity(merged, "ada@example.com")
    assert page is not None and page["commits"] == 4
    assert {f["path"]: f["revs"] for f in page["files"]} == {"a.py": 2, "b.py": 2}
    assert sum(w["commits"] for w in page["weekly"]) == 4
    assert page == author_activity(dataclasses.replace(merged, aggregates=False), "ada@example.com")
    assert author_activity(merged, "bob@example.com") is None  # merged into Ada


def test_a_backfill_makes_the_month_stale_until_recomputed(tmp_path: Path) -> None:
    origin = build(tmp_path / "origin")
    repo = analysed(origin)
    scope = Scope.of(repo, WHOLE_MARCH)
    parts = split(scope)
    assert ensure_author_months(scope, parts.runs) == 1
    assert ensure_author_months(scope, parts.runs) == 0  # current: nothing computed
    years = (date(2021, 1, 1), date(2022, 1, 1))  # empty years, before the history
    assert ensure_author_years(scope, years) == 2
    assert ensure_author_years(scope, years) == 0
    origin.clock = MARCH + 10 * DAY
    origin.commit("late", {"c.py": "1\n"}, author=CY)
    submit_repository(url=str(origin.path))
    run_workers()
    stamp = MonthStamp.objects.get(repository=repo, month=date(2024, 3, 1))
    assert stamp.authors_aggregated is not None and stamp.authors_aggregated < stamp.version
    assert counts(authors(scope))["cy@example.com"] == 2
    stamp.refresh_from_db()
    assert stamp.authors_aggregated == stamp.version


def test_one_authors_languages_come_from_the_file_sums(tmp_path: Path) -> None:
    """The file sums carry the stored rows' language, so one author's languages are
    summed from them (with the co-authored commits' rows), equal to every stored row's,
    and no query looks up a file row per path (docs/analytics.md#performance)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from dashboard.models import FileChange, MonthAggregate

    origin = GitRepo.create(tmp_path / "origin")
    origin.clock = MARCH
    origin.commit("py", {"a.py": "1\n2\n3\n", "notes.md": "# n\n"}, author=ADA)
    origin.clock += DAY
    origin.commit(
        "js\n\nCo-authored-by: Ada <ada@example.com>",
        {"web/app.js": "x\n", "a.py": "1\n"},
        author=BOB,
    )
    origin.clock += DAY
    origin.commit("md", {"notes.md": "# n\nmore\n"}, author=ADA)
    repo = analysed(origin)
    scope = Scope.of(repo, WHOLE_MARCH)
    raw = dataclasses.replace(scope, aggregates=False)
    with CaptureQueriesContext(connection) as captured:
        page = author_activity(scope, "ada@example.com")
    assert page is not None
    assert {x["language"] for x in page["languages"]} == {"Python", "Markdown", "JavaScript"}
    assert page == author_activity(raw, "ada@example.com")
    assert author_activity(scope, "bob@example.com") == author_activity(raw, "bob@example.com")
    stored = set(FileChange.objects.filter(repository=repo).values_list("path", "language"))
    summed = set(
        MonthAggregate.objects.filter(repository=repo, span=1).values_list("path", "language")
    )
    assert summed == stored
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            for query in captured.captured_queries:
                if not query["sql"].startswith(("SELECT", "WITH")):
                    continue
                cursor.execute(f"EXPLAIN QUERY PLAN {query['sql']}")
                plan = [row[3] for row in cursor.fetchall()]
                assert not any("file_repo_fp_" in step for step in plan), (query["sql"], plan)
