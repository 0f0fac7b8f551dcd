"""dashboard.analytics.aggregates and dir_aggregates: the file and directory views read
through the per-month aggregates equal the same views read from every stored row
(``Scope.aggregates=False``), for random windows, lenses and depths, on a real analysed
history with co-authors; and still after a commit lands in an old month (a backfill) and
after a rewrite drops commits (docs/analytics.md#performance)."""

from __future__ import annotations

import dataclasses
import itertools
import math
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dashboard.analytics.age import directory_age, file_age
from dashboard.analytics.aggregates import split
from dashboard.analytics.coupling import (
    Thresholds,
    coupled_with,
    directory_coupling,
    file_coupling,
)
from dashboard.analytics.coupling_aggregates import CAP, MAX_BLOCK_YEARS, blocks
from dashboard.analytics.hotspots import directory_hotspots, file_hotspots, midpoint
from dashboard.analytics.lenses import Lens, build_lens
from dashboard.analytics.ownership import directory_ownership, file_ownership, knowledge_at_risk
from dashboard.analytics.people import author_activity, authors, file_history
from dashboard.analytics.rows import Scope
from dashboard.analytics.window import Window
from dashboard.models import (
    AuthorMonth,
    CoAuthor,
    Commit,
    CouplingAggregate,
    CouplingBlockStamp,
    CouplingStamp,
    DirAggregate,
    MonthAggregate,
    MonthStamp,
)
from dashboard.repositories.lifecycle import submit_repository
from tests.conftest import run_workers
from tests.support.analytics_history import ADA, BOB, BOB_OLD, BOT, CY, DAY, analysed
from tests.support.checked_threads import at_once
from tests.support.gitrepo import GitRepo
from tests.support.row_locks import rows_locked

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
        "src/app/deep/er/x.py",
    ]
    for i in range(80):
        repo.clock += 5 * DAY + 3 * 3600 * (i % 5)
        touched = {files[(i * k + i // 3) % len(files)] for k in (1, 3, 5)[: 1 + i % 3]}
        repo.commit(
            f"change {i}{TRAILERS[i % len(TRAILERS)]}",
            {p: f"{i}\n" * (1 + (i + len(p)) % 4) for p in touched},
            author=people[i % len(people)],
        )
        if i % 23 == 11:  # a commit with no file row, by an author under another name
            repo.commit(f"empty {i}", author=("Ada L.", ADA[1]), allow_empty=True)
    return repo


#: Co-authors (docs/analytics.md#co-authors) of every few commits: another person, one
#: mapped to the author by the identity map of ``lenses``, bots, two mapped to one person,
#: the author naming themselves (credited once).
TRAILERS = [
    "",
    "\n\nCo-authored-by: Cy <cy@example.com>",
    "",
    "\n\nCo-authored-by: Bob <bob@example.com>\nCo-authored-by: Ada <ADA@example.com>",
    "\n\nCo-authored-by: dependabot[bot] <49699333+dependabot[bot]@users.noreply.github.com>",
    "",
    "\n\nCo-authored-by: Bob <bob@example.com>",
    "\n\nCo-authored-by: Ada Lovelace <ada@example.com>\nCo-authored-by: Dee <dee@example.com>",
    "\n\nCo-authored-by: helper[bot] <helper[bot]@users.noreply.github.com>",
    "\n\nCo-authored-by: Bob <bob@example.com>\nCo-authored-by: Cy <cy@example.com>",
]


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
    ids = (("bob@example.com", "ada@example.com"),)
    mapped = dataclasses.replace(out[0], identities=ids)
    # Every lens and the identity map at once: a path lens, bots and merged people.
    return [*out, mapped, dataclasses.replace(out[-1], identities=ids)]


def views(scope: Scope, depth: int = 1) -> list:
    return [
        file_hotspots(scope, limit=10_000),
        file_hotspots(scope, limit=3),
        file_age(scope),
        directory_hotspots(scope, depth=depth, limit=10_000),
        directory_hotspots(scope, depth=depth, limit=2),
        directory_age(scope, depth=depth),
        directory_ownership(scope, depth=depth),
        # The people views (author_months.py).
        authors(scope),
        authors(scope, limit=2),
        file_ownership(scope),
        *(at_risk(scope, days) for days in (30, 90)),
        *(author_activity(scope, a[1]) for a in (ADA, BOB, CY, BOT, ("Dee", "dee@example.com"))),
        author_activity(scope, ADA[1], limit=2),
        *(file_history(scope, p) for p in ("src/lib.py", "package-lock.json", "manual/guide.md")),
    ]


def at_risk(scope: Scope, days: int) -> dict:
    """``knowledge_at_risk`` but its cutoff: without a window's end it is measured from
    now, which moves between two calls (no commit of the history is near it)."""
    return {k: v for k, v in knowledge_at_risk(scope, inactive_days=days).items() if k != "cutoff"}


def check_equal(repo, choices: list[Lens]) -> None:
    @settings(
        max_examples=40,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        database=None,
    )
    @given(window=windows(), lens=st.sampled_from(choices), depth=st.integers(1, 4))
    # The trend's midpoint on a month's first midnight inside a whole year (2024-08-01).
    @example(window=Window(at(date(2023, 11, 15)), at(date(2025, 4, 18))), lens=choices[0], depth=1)
    def same(window: Window, lens: Lens, depth: int) -> None:
        scope = Scope.of(repo, window, lens=lens)
        raw = dataclasses.replace(scope, aggregates=False)
        assert views(scope, depth) == views(raw, depth)

    same()


THRESHOLDS = st.builds(
    Thresholds,
    min_revs=st.integers(0, 6),
    min_shared_revs=st.integers(0, 4),
    min_coupling=st.integers(0, 60),
    # 2 and 3 keep different change sets of this history; above CAP: read time
    max_changeset_size=st.sampled_from([2, 3, CAP, CAP + 1]),
)
PATHS = st.sampled_from(["src/app/main.py", "src/lib.py", "README.md", "package-lock.json"])


def coupling_views(scope: Scope, t: Thresholds, depth: int, path: str) -> list:
    return [
        file_coupling(scope, t, limit=10_000),
        file_coupling(scope, t, limit=2),
        directory_coupling(scope, t, depth=depth, limit=10_000),
        coupled_with(scope, path, t, limit=10_000),
    ]


def check_coupling_equal(
    repo,
    choices: list[Lens],
    spread: st.SearchStrategy[Window] | None = None,
    examples: int = 40,
) -> None:
    """Coupling through the coupling aggregates equals coupling read from every stored
    row, for random windows (``spread``, default ``windows()``), lenses (a lens reads the
    stored rows: the same code path must still agree), thresholds, depths and files."""

    @settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        database=None,
    )
    @given(
        window=spread if spread is not None else windows(),
        lens=st.sampled_from(choices),
        t=THRESHOLDS,
        depth=st.integers(1, 3),
        path=PATHS,
    )
    @example(window=Window(), lens=choices[0], t=Thresholds(0, 0, 0, 3), depth=1, path="README.md")
    @example(window=Window(), lens=choices[0], t=Thresholds(1, 1, 0, 2), depth=2, path="src/lib.py")
    def same(window: Window, lens: Lens, t: Thresholds, depth: int, path: str) -> None:
        scope = Scope.of(repo, window, lens=lens)
        raw = dataclasses.replace(scope, aggregates=False)
        assert coupling_views(scope, t, depth, path) == coupling_views(raw, t, depth, path)

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
    check_coupling_equal(repo, choices)
    wide = Thresholds(0, 0, 0, 3)
    assert file_coupling(whole, wide) and directory_coupling(whole, wide)
    assert CouplingAggregate.objects.filter(repository=repo, span=12, depth=0).exists()
    assert CouplingAggregate.objects.filter(repository=repo, span=1, depth=1).exists()
    file_hotspots(whole)  # every whole month and year computed
    assert MonthAggregate.objects.filter(repository=repo, span=1).exists()
    assert MonthAggregate.objects.filter(repository=repo, span=12).exists()
    assert CoAuthor.objects.filter(commit__repository=repo).count() > 10
    directory_hotspots(whole)
    assert DirAggregate.objects.filter(repository=repo, span=1, depth=3).exists()
    assert DirAggregate.objects.filter(repository=repo, span=12, depth=0).exists()
    authors(whole)  # every whole month and year of the per-author sums computed
    assert AuthorMonth.objects.filter(repository=repo, span=1).exists()
    assert AuthorMonth.objects.filter(repository=repo, span=12).exists()
    old, january = date(2023, 12, 1), date(2024, 1, 1)
    before = MonthStamp.objects.get(repository=repo, fingerprint=fp, month=old)
    assert before.aggregated == before.version == before.dir_aggregated
    assert before.authors_aggregated == before.version

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
    assert stamp.dir_aggregated == before.dir_aggregated
    assert stamp.authors_aggregated == before.authors_aggregated
    assert year_sum() == (recorded, versions + 1)
    # read before any view: the one-file view of check_equal computes coupling too
    coupling = CouplingStamp.objects.get(repository=repo, fingerprint=fp, month=old, depth=0)
    assert coupling.aggregated == before.version  # stale: recomputed by the next view
    late = Scope.of(repo, Window(at(old), at(date(2024, 1, 1))))
    assert "src/lib.py" in {r["path"] for r in file_hotspots(late, limit=100)}
    check_equal(repo, choices)
    check_coupling_equal(repo, choices)
    coupling.refresh_from_db()
    assert coupling.aggregated == stamp.version

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
    check_coupling_equal(repo, choices)


def test_readers_computing_the_same_months_at_once_store_them_once(tmp_path: Path) -> None:
    """Four readers of a cold history at once: each gets the numbers of the stored
    rows, and no month or year is stored twice (the stamp row lock serializes them; the
    later ones find the aggregates current, or, the lock busy past ``LOCK_WAIT_MS``,
    read that span from the stored rows: docs/analytics.md#performance). A read after
    them finds every span it needs stored or stores it."""

    repo = analysed(build_months(tmp_path / "origin"))
    whole = Scope.of(repo, Window())
    want = file_hotspots(dataclasses.replace(whole, aggregates=False), limit=10_000)
    assert not MonthAggregate.objects.filter(repository=repo).exists()
    got = at_once(lambda _: file_hotspots(whole, limit=10_000), 4)
    assert got == [want] * 4
    assert file_hotspots(whole, limit=10_000) == want  # alone: computes what was skipped
    stored = MonthAggregate.objects.filter(repository=repo)
    keys = list(stored.values_list("span", "month", "path", "author_canonical_email"))
    assert len(keys) == len(set(keys))
    parts = split(whole, midpoint(whole))
    assert parts.years and {m for s, m, *_ in keys if s == 12} == set(parts.years)


def test_a_read_behind_a_writer_holding_the_lock_answers_from_the_stored_rows(
    tmp_path: Path,
) -> None:
    """Every month and year stale (their versions moved on, as a write of their commits
    moves them) and a writer holding the lock their recomputation needs (SQLite: the
    database's write lock, BEGIN IMMEDIATE; PostgreSQL: the stamp rows, as a fenced write
    holds them): a read still answers, with the numbers of the stored rows, while the
    writer holds it, writing nothing; the next read after the writer computes them
    (docs/analytics.md#performance). Before, the read waited for the writer (SQLite:
    up to the 60 s busy timeout, then "database is locked")."""
    from django.db.models import F

    repo = analysed(build_months(tmp_path / "origin"))
    whole = Scope.of(repo, Window())
    raw = dataclasses.replace(whole, aggregates=False)
    want = views(raw)
    assert views(whole) == want  # every whole month and year computed
    stamps = MonthStamp.objects.filter(repository=repo, fingerprint=whole.fingerprint)
    stamps.update(version=F("version") + 1)
    assert not stamps.filter(aggregated=F("version")).exists()
    with rows_locked(stamps, "month") as still_locked:
        got = views(whole)
        held_throughout = still_locked()
    assert got == want
    assert held_throughout  # answered while the writer held the lock
    assert not stamps.filter(aggregated=F("version")).exists()  # nothing written meanwhile
    assert not stamps.filter(dir_aggregated=F("version")).exists()  # nor for directories
    assert views(whole) == want  # the writer gone: computed now
    parts = split(whole)
    months = {m for a, b in parts.runs for m in _months_between(a, b)}
    current = set(stamps.filter(aggregated=F("version")).values_list("month", flat=True))
    assert months <= current
    dirs = set(stamps.filter(dir_aggregated=F("version")).values_list("month", flat=True))
    assert months <= dirs


def _months_between(first: date, last: date) -> list[date]:
    out = [first]
    while out[-1] < last:
        m = out[-1]
        out.append(date(m.year + m.month // 12, m.month % 12 + 1, 1))
    return out


def test_a_window_reaching_centuries_past_the_history_aggregates_only_its_months(
    tmp_path: Path,
) -> None:
    """A window from year 424 to year 9000 (one the API fuzzer sent) aggregates only the
    months between the first and last stored commits: the empty centuries around them are
    read as raw windows (an indexed range holding nothing), not computed month by month,
    and every view still equals the stored rows (docs/analytics.md#performance)."""
    repo = analysed(build_months(tmp_path / "origin"))
    wide = Scope.of(repo, Window(at(date(424, 9, 25)), at(date(9000, 1, 1))))
    raw = dataclasses.replace(wide, aggregates=False)
    assert views(wide, 2) == views(raw, 2)
    t = Thresholds(0, 0, 0, 3)
    assert coupling_views(wide, t, 2, "src/lib.py") == coupling_views(raw, t, 2, "src/lib.py")
    dates = Commit.objects.filter(repository=repo, fingerprint=wide.fingerprint).values_list(
        "committed_at", flat=True
    )
    first, last = (d.date().replace(day=1) for d in (min(dates), max(dates)))
    for model in (MonthStamp, CouplingStamp):
        months = set(model.objects.filter(repository=repo).values_list("month", flat=True))
        assert months and first <= min(months) and max(months) <= last, model
    assert split(wide).years and all(first <= y <= last for y in split(wide).years)


@pytest.mark.skipif(
    "sqlite" not in __import__("django.conf").conf.settings.DATABASES["default"]["ENGINE"],
    reason="counts SQLite's virtual machine steps",
)
def test_the_stored_span_reads_the_same_however_many_commits_are_stored(
    tmp_path: Path,
) -> None:
    """Every aggregated view first reads the first and last stored committer dates:
    two steps to the ends of the page index, not a scan of every commit's entry (SQLite
    reads ``MIN(…), MAX(…)`` in one SELECT as that scan: 0.5 s at 1,000,000 commits,
    docs/analytics.md#performance). Measured in SQLite virtual machine steps, the same
    for a history of 2 commits and one of 30."""
    from django.db import connection

    from dashboard.analytics.aggregates import _stored_span

    small_origin = GitRepo.create(tmp_path / "small")
    small_origin.clock = START
    for i in range(2):
        small_origin.commit(f"s {i}", {"a.py": f"{i}\n"}, author=ADA)
    big_origin = GitRepo.create(tmp_path / "big")
    big_origin.clock = START
    for i in range(30):
        big_origin.clock += DAY
        big_origin.commit(f"b {i}", {"a.py": f"{i}\n"}, author=ADA)
    small, big = analysed(small_origin), analysed(big_origin)

    def steps(repo) -> int:
        scope = Scope.of(repo, Window())
        count = [0]

        def tick() -> int:
            count[0] += 1
            return 0

        connection.ensure_connection()
        connection.connection.set_progress_handler(tick, 1)
        try:
            assert _stored_span(scope) is not None
        finally:
            connection.connection.set_progress_handler(None, 1)
        return count[0]

    assert steps(big) == steps(small)


YEARS_START = datetime(2015, 7, 3, 9, tzinfo=UTC)


def build_years(path: Path) -> GitRepo:
    """About nine years of commits, one a month or so (2015-07 to 2024-05: the whole
    years 2016-2023 make one aligned block of eight), over files at several depths,
    one to four of them a commit."""
    repo = GitRepo.create(path)
    repo.clock = int(YEARS_START.timestamp())
    files = [
        "src/app/main.py",
        "src/app/util.py",
        "src/lib.py",
        "manual/guide.md",
        "README.md",
        "src/app/deep/er/x.py",
    ]
    people = [ADA, BOB, CY]
    for i in range(104):
        repo.clock += 31 * DAY + 5 * 3600 * (i % 4)
        touched = {files[(i * k + i // 5) % len(files)] for k in (1, 2, 5, 3)[: 1 + i % 4]}
        repo.commit(
            f"change {i}",
            {p: f"{i}\n" * (1 + (i + len(p)) % 3) for p in touched},
            author=people[i % len(people)],
        )
    return repo


def year_windows() -> st.SearchStrategy[Window]:
    """Windows over ``build_years``'s history, most of them holding several whole years."""
    first = YEARS_START.date()
    bound = st.one_of(
        st.none(), st.integers(-40, 3300).map(lambda d: at(first + timedelta(days=d)))
    )
    return st.tuples(bound, bound).map(
        lambda se: (
            Window(*se)
            if se[0] is None or se[1] is None or se[0] < se[1]
            else Window(se[1], se[0] + timedelta(days=1))
        )
    )


def test_blocks_cover_the_years_once_by_the_largest_aligned_blocks() -> None:
    def cover(*years: int) -> list[tuple[int, int]]:
        return [(j.year, n) for j, n in blocks(tuple(date(y, 1, 1) for y in years))]

    assert cover(*range(2005, 2020)) == [(2005, 1), (2006, 2), (2008, 8), (2016, 4)]
    assert cover(*range(2016, 2024)) == [(2016, 8)]
    assert cover(2016, 2017, 2019, 2020, 2021) == [(2016, 2), (2019, 1), (2020, 2)]
    assert cover() == []
    assert cover(*range(1, 3000))[:3] == [(1, 1), (2, 2), (4, 4)]
    assert max(n for _, n in cover(*range(1, 3000))) == MAX_BLOCK_YEARS

    @settings(max_examples=200, deadline=None, database=None)
    @given(st.sets(st.integers(1990, 2060)), st.integers(1990, 2060), st.integers(1990, 2060))
    def once(years: set[int], lo: int, hi: int) -> None:
        found = cover(*years)
        covered = [y + k for y, n in found for k in range(n)]
        assert sorted(covered) == sorted(years)  # every year once, none outside
        assert all(y % n == 0 and n & (n - 1) == 0 for y, n in found)  # aligned
        run = set(range(min(lo, hi), max(lo, hi) + 1))
        assert len(cover(*run)) <= 2 * math.log2(len(run)) + 1
        # The blocks of a run less some of its blocks are the blocks left (settle moves
        # a busy block's years to the stored rows, coupling_ctes reads the rest).
        whole = cover(*run)
        kept = whole[::2]
        assert cover(*(y + k for y, n in kept for k in range(n))) == kept

    once()


def test_coupling_blocks_equal_the_stored_rows_over_years_and_a_backfill(
    tmp_path: Path,
) -> None:
    """Over nine years, coupling read through aligned blocks of years equals coupling
    read from every stored row, for windows spanning blocks; a commit landing in an old
    month inside an eight-year block makes the block stale, and the next view sums it
    again from its halves (docs/analytics.md#performance)."""
    origin = build_years(tmp_path / "origin")
    repo = analysed(origin)
    fp = Scope.of(repo, Window()).fingerprint
    choices = lenses(repo, fp)[:2]  # no lens, and one: read time
    whole = Scope.of(repo, Window())
    assert blocks(split(whole).years) == ((date(2016, 1, 1), 8),)
    eight = Window(at(date(2016, 1, 1)), at(date(2024, 1, 1)))
    assert blocks(split(Scope.of(repo, eight)).years) == ((date(2016, 1, 1), 8),)
    wide = Thresholds(0, 0, 0, 3)
    before = file_coupling(whole, wide, limit=10_000)
    assert before == file_coupling(dataclasses.replace(whole, aggregates=False), wide, limit=10_000)
    rows = CouplingAggregate.objects.filter(repository=repo, depth=0)
    # The block, its halves and theirs: 8, 4, 2 years (and the years under them).
    for span, month in ((96, 2016), (48, 2016), (48, 2020), (24, 2016), (24, 2022)):
        assert rows.filter(span=span, month=date(month, 1, 1)).exists(), (span, month)
    check_coupling_equal(repo, choices, year_windows(), examples=30)
    block = CouplingBlockStamp.objects.get(
        repository=repo, fingerprint=fp, depth=0, span=96, month=date(2016, 1, 1)
    )
    versions = MonthStamp.objects.filter(
        repository=repo, fingerprint=fp, month__gte=date(2016, 1, 1), month__lt=date(2024, 1, 1)
    )
    assert block.aggregated == sum(v.version for v in versions)

    # A backfill into May 2019, inside the eight-year block and its 2018-2019 quarter.
    origin.clock = int(at(date(2019, 5, 17)).timestamp())
    origin.commit("late fix", {"src/lib.py": "late\n", "README.md": "late\n"}, author=CY)
    submit_repository(url=str(origin.path))
    run_workers()
    block.refresh_from_db()
    assert block.aggregated != sum(v.version for v in versions.all())  # stale
    after = file_coupling(whole, wide, limit=10_000)
    assert after != before  # the late commit's pair is counted
    assert after == file_coupling(dataclasses.replace(whole, aggregates=False), wide, limit=10_000)
    block.refresh_from_db()
    assert block.aggregated == sum(v.version for v in versions.all())
    check_coupling_equal(repo, choices, year_windows(), examples=20)


def test_a_read_behind_a_writer_holding_a_blocks_lock_answers_from_the_stored_rows(
    tmp_path: Path,
) -> None:
    """Every month, year and block of years stale and a writer holding their lock:
    coupling over the eight whole years of one block (no month of its own, so the block
    itself is tried first) still answers, with the stored rows' numbers, while the writer
    holds it, writing no block record; after the writer, the blocks are computed again
    (docs/analytics.md#performance)."""
    from django.db.models import F

    repo = analysed(build_years(tmp_path / "origin"))
    whole = Scope.of(repo, Window(at(date(2016, 1, 1)), at(date(2024, 1, 1))))
    parts = split(whole)
    assert not parts.runs and blocks(parts.years) == ((date(2016, 1, 1), 8),)
    raw = dataclasses.replace(whole, aggregates=False)
    t = Thresholds(0, 0, 0, 3)
    want = coupling_views(raw, t, 1, "src/lib.py")
    assert coupling_views(whole, t, 1, "src/lib.py") == want  # every span computed
    fp = whole.fingerprint
    records = CouplingBlockStamp.objects.filter(repository=repo, fingerprint=fp, span=96)
    computed = dict(records.values_list("depth", "aggregated"))
    assert set(computed) == {0, 1}
    stamps = MonthStamp.objects.filter(repository=repo, fingerprint=fp)
    stamps.update(version=F("version") + 1)
    with rows_locked(stamps, "month") as still_locked:
        got = coupling_views(whole, t, 1, "src/lib.py")
        held_throughout = still_locked()
    assert got == want
    assert held_throughout  # answered while the writer held the lock
    assert dict(records.values_list("depth", "aggregated")) == computed  # nothing written
    assert coupling_views(whole, t, 1, "src/lib.py") == want  # the writer gone: computed now
    versions = stamps.filter(month__gte=date(2016, 1, 1), month__lt=date(2024, 1, 1))
    total = sum(versions.values_list("version", flat=True))
    assert dict(records.values_list("depth", "aggregated")) == {0: total, 1: total}
