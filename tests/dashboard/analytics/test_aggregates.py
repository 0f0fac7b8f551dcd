"""dashboard.analytics.aggregates: the file views read through the per-month aggregates
equal the same views read from every stored row (``Scope.aggregates=False``), for random
windows and lenses, on a real analysed history; and still after a commit lands in an
old month (a backfill) and after a rewrite drops commits (docs/analytics.md#performance)."""

from __future__ import annotations

import dataclasses
import itertools
import threading
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dashboard.analytics.age import file_age
from dashboard.analytics.aggregates import split
from dashboard.analytics.hotspots import file_hotspots, midpoint
from dashboard.analytics.lenses import Lens, build_lens
from dashboard.analytics.rows import Scope
from dashboard.analytics.window import Window
from dashboard.models import Commit, MonthAggregate, MonthStamp
from dashboard.repositories.lifecycle import submit_repository
from tests.conftest import run_workers
from tests.support.analytics_history import ADA, BOB, BOB_OLD, BOT, CY, DAY, analysed
from tests.support.checked_threads import CheckedThread
from tests.support.gitrepo import GitRepo

pytestmark = pytest.mark.django_db(transaction=True)

START = 1_700_000_000  # 2023-11-14


def build_months(path: Path) -> GitRepo:
    """About sixteen months of commits (2024 whole), some days apart: several per month, by several
    authors (a bot and a ``.mailmap`` alias among them), over lens files and plain ones
    at several depths."""
    repo = GitRepo.create(path)
    repo.clock = START
    repo.commit("init", {".mailmap": "Bob <bob@example.com> <bob@old.example.org>\n"}, author=ADA)
    people = [ADA, BOB, BOB_OLD, CY, BOT]
    files = [
        "src/app/main.py",
        "src/app/util.py",
        "src/lib.py",
        "manual/guide.md",
        "node_modules/x/index.js",
        "package-lock.json",
        "static/app.min.js",
        "README.md",
    ]
    for i in range(80):
        repo.clock += 5 * DAY + 3 * 3600 * (i % 5)
        touched = {files[(i * k + i // 3) % len(files)] for k in (1, 3, 5)[: 1 + i % 3]}
        repo.commit(
            f"change {i}",
            {p: f"{i}\n" * (1 + (i + len(p)) % 4) for p in touched},
            author=people[i % len(people)],
        )
    return repo


def at(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


FIRST = datetime.fromtimestamp(START, UTC).date()
DAYS = st.integers(min_value=-20, max_value=520)


def windows() -> st.SearchStrategy[Window]:
    bound = st.one_of(st.none(), DAYS.map(lambda d: at(FIRST + timedelta(days=d))))
    return st.tuples(bound, bound).map(
        lambda se: (
            Window(*se)
            if se[0] is None or se[1] is None or se[0] < se[1]
            else Window(se[1], se[0] + timedelta(days=1))
        )
    )


def lenses(repo, fp: str) -> list[Lens]:
    names = ("vendored", "lock", "minified", "bots")
    out = []
    for n in range(len(names) + 1):
        for combo in itertools.combinations(names, n):
            out.append(build_lens(set(combo), repo, fp))
    mapped = dataclasses.replace(out[0], identities=(("bob@example.com", "ada@example.com"),))
    return [*out, mapped]


def views(scope: Scope) -> list:
    return [
        file_hotspots(scope, limit=10_000),
        file_hotspots(scope, limit=3),
        file_age(scope),
    ]


def check_equal(repo, choices: list[Lens]) -> None:
    @settings(
        max_examples=40,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        database=None,
    )
    @given(window=windows(), lens=st.sampled_from(choices))
    # The trend's midpoint on a month's first midnight inside a whole year (2024-08-01).
    @example(window=Window(at(date(2023, 11, 15)), at(date(2025, 4, 18))), lens=choices[0])
    def same(window: Window, lens: Lens) -> None:
        scope = Scope.of(repo, window, lens=lens)
        raw = dataclasses.replace(scope, aggregates=False)
        assert views(scope) == views(raw)

    same()


def test_the_aggregates_equal_the_stored_rows_through_backfills_and_rewrites(
    tmp_path: Path,
) -> None:
    origin = build_months(tmp_path / "origin")
    repo = analysed(origin)
    fp = Scope.of(repo, Window()).fingerprint
    choices = lenses(repo, fp)
    whole = Scope.of(repo, Window())
    parts = split(whole)
    assert parts.runs and date(2024, 1, 1) in parts.years, parts
    check_equal(repo, choices)
    file_hotspots(whole)  # every whole month and year computed
    assert MonthAggregate.objects.filter(repository=repo, span=1).exists()
    assert MonthAggregate.objects.filter(repository=repo, span=12).exists()
    old, january = date(2023, 12, 1), date(2024, 1, 1)
    before = MonthStamp.objects.get(repository=repo, fingerprint=fp, month=old)
    assert before.aggregated == before.version

    def year_sum() -> tuple[int | None, int]:
        year = list(MonthStamp.objects.filter(repository=repo, fingerprint=fp, month__year=2024))
        recorded = next(s.year_aggregated for s in year if s.month == january)
        return recorded, sum(s.version for s in year)

    recorded, versions = year_sum()
    assert recorded == versions

    # Backfills: new commits whose committer dates are in an old month and in an old
    # year, both aggregated.
    for day in (date(2023, 12, 20), date(2024, 3, 9)):
        origin.clock = int(at(day).timestamp())
        origin.commit(
            f"late fix {day}", {"src/lib.py": f"{day}\n", "README.md": "late\n"}, author=CY
        )
    submit_repository(url=str(origin.path))
    run_workers()
    stamp = MonthStamp.objects.get(repository=repo, fingerprint=fp, month=old)
    assert stamp.version == before.version + 1 and stamp.aggregated == before.aggregated
    assert year_sum() == (recorded, versions + 1)
    late = Scope.of(repo, Window(at(old), at(date(2024, 1, 1))))
    assert "src/lib.py" in {r["path"] for r in file_hotspots(late, limit=100)}
    check_equal(repo, choices)

    # A rewrite: the branch moved back four commits (the backfills among them).
    stored = Commit.objects.filter(repository=repo, fingerprint=fp).count()
    origin.git("reset", "--hard", "-q", "HEAD~4")
    submit_repository(url=str(origin.path))
    run_workers()
    assert Commit.objects.filter(repository=repo, fingerprint=fp).count() == stored - 4
    assert MonthStamp.objects.get(repository=repo, fingerprint=fp, month=old).version == (
        stamp.version + 1
    )
    check_equal(repo, choices)


def test_readers_computing_the_same_months_at_once_store_them_once(tmp_path: Path) -> None:
    """Four readers of a cold history at once: each gets the numbers of the stored
    rows, and every month and year is stored once (the stamp row lock serializes
    them; the later ones find the aggregates current)."""
    from django.db import connection

    repo = analysed(build_months(tmp_path / "origin"))
    whole = Scope.of(repo, Window())
    want = file_hotspots(dataclasses.replace(whole, aggregates=False), limit=10_000)
    assert not MonthAggregate.objects.filter(repository=repo).exists()
    barrier = threading.Barrier(4)
    got: list[list] = []

    def read() -> None:
        try:
            barrier.wait()
            got.append(file_hotspots(whole, limit=10_000))
        finally:
            connection.close()

    threads = [CheckedThread(target=read) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [want] * 4
    stored = MonthAggregate.objects.filter(repository=repo)
    keys = list(stored.values_list("span", "month", "path", "author_canonical_email"))
    assert len(keys) == len(set(keys))
    parts = split(whole, midpoint(whole))
    assert parts.years and {m for s, m, *_ in keys if s == 12} == set(parts.years)
