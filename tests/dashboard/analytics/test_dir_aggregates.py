"""dashboard.analytics.dir_aggregates: the directory of a path at every depth as the
aggregates compute it in SQL equals ``directory_of``; the aggregates of a month count a
commit once per directory and author; a path lens reads every stored row; readers of a
cold history at once store each month and year once; a bad depth is refused
(docs/analytics.md#performance). The equality of every directory view with the stored
rows, for random windows, lenses and depths, through backfills and rewrites, is in
test_aggregates.py."""

from __future__ import annotations

import dataclasses
from datetime import UTC, date, datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dashboard.analytics.aggregates import split
from dashboard.analytics.dir_aggregates import (
    _dir_at,
    _positions,
    dir_parts,
    ensure_dir_months,
)
from dashboard.analytics.hotspots import directory_hotspots, midpoint
from dashboard.analytics.lenses import build_lens
from dashboard.analytics.ownership import directory_ownership
from dashboard.analytics.rows import MAX_DEPTH, Scope, directory_of, fetch
from dashboard.analytics.window import Window
from dashboard.models import DirAggregate, MonthStamp
from tests.support.analytics_history import ADA, BOB, DAY, analysed
from tests.support.checked_threads import at_once
from tests.support.gitrepo import GitRepo

#: March and April 2024, two whole months.
SPRING = Window(datetime(2024, 3, 1, tzinfo=UTC), datetime(2024, 5, 1, tzinfo=UTC))
SEGMENT = st.text(alphabet="ab.-_", min_size=1, max_size=3)
PATHS = st.lists(SEGMENT, min_size=1, max_size=9).map("/".join)


@pytest.mark.django_db
@settings(max_examples=60, deadline=None)
@given(paths=st.lists(PATHS, min_size=1, max_size=8))
def test_the_sql_directory_of_every_depth_is_directory_of(paths: list[str]) -> None:
    values = " UNION ALL ".join("SELECT %s AS path" for _ in paths)
    chain, last = _positions("src", ("path",), MAX_DEPTH)
    dirs = ", ".join(_dir_at(d) for d in range(1, MAX_DEPTH + 1))
    got = fetch(f"WITH src AS ({values}), {chain} SELECT path, {dirs} FROM {last}", paths)
    assert sorted(got) == sorted(
        (p, *(directory_of(p, d) for d in range(1, MAX_DEPTH + 1))) for p in paths
    )


def build(path: Path) -> GitRepo:
    """Two months a year ago: commits changing two files of one directory (counted once
    there), by two authors, at two depths."""
    repo = GitRepo.create(path)
    repo.clock = int(datetime(2024, 3, 2, tzinfo=UTC).timestamp())
    for i in range(6):
        repo.clock += 3 * DAY
        repo.commit(
            f"change {i}",
            {"src/a/x.py": f"{i}\n", "src/a/y.py": f"{i}\n", "top.md": f"{i}\n" * (i % 2)},
            author=(ADA, BOB)[i % 2],
        )
    return repo


@pytest.mark.django_db(transaction=True)
def test_a_month_counts_a_commit_once_per_directory_and_author(tmp_path: Path) -> None:
    repo = analysed(build(tmp_path / "origin"))
    whole = Scope.of(repo, SPRING)
    parts = split(whole)
    # April, after the last commit, is read from the stored rows (none), not aggregated.
    assert parts.runs == ((date(2024, 3, 1), date(2024, 3, 1)),)
    assert parts.raw == (Window(datetime(2024, 4, 1, tzinfo=UTC), SPRING.end),)
    spring = ((date(2024, 3, 1), date(2024, 4, 1)),)  # an empty month computes too
    assert ensure_dir_months(whole, spring) == 2
    assert ensure_dir_months(whole, spring) == 0  # current: nothing computed again
    march = DirAggregate.objects.filter(repository=repo, span=1, month="2024-03-01")
    src = {
        (r.depth, r.author_canonical_email): r.revisions
        for r in march.filter(dir__in=["src", "src/a"])
    }
    # Six commits from 5 to 20 March, each changing two files of src/a: 3 each (src at
    # depth 1, src/a at every depth below).
    people = ("ada@example.com", "bob@example.com")
    assert src == {(d, e): 3 for d in range(1, MAX_DEPTH + 1) for e in people}
    commits = {r.author_canonical_email: r.revisions for r in march.filter(depth=0)}
    assert commits == {"ada@example.com": 3, "bob@example.com": 3}
    stamp = MonthStamp.objects.get(repository=repo, month="2024-03-01")
    assert stamp.dir_aggregated == stamp.version and stamp.aggregated is None


@pytest.mark.django_db(transaction=True)
def test_a_path_lens_or_no_aggregates_reads_every_stored_row(tmp_path: Path) -> None:
    repo = analysed(build(tmp_path / "origin"))
    whole = Scope.of(repo, SPRING)
    assert dir_parts(whole, 1) is not None
    lensed = dataclasses.replace(whole, lens=build_lens({"lock"}, repo, whole.fingerprint))
    assert dir_parts(lensed, 1) is None
    assert dir_parts(dataclasses.replace(whole, aggregates=False), 1) is None
    for depth in (0, MAX_DEPTH + 1):
        with pytest.raises(ValueError, match="depth"):
            dir_parts(whole, depth)
        with pytest.raises(ValueError, match="depth"):
            directory_ownership(whole, depth=depth)
    assert directory_ownership(lensed) == directory_ownership(
        dataclasses.replace(lensed, aggregates=False)
    )


@pytest.mark.django_db(transaction=True)
def test_readers_computing_the_same_directories_at_once_store_them_once(
    tmp_path: Path,
) -> None:
    """Four readers of a cold history at once get the stored rows' numbers, and every
    month is stored once (the stamp row lock serializes them)."""
    repo = analysed(build(tmp_path / "origin"))
    whole = Scope.of(repo, SPRING)
    want = directory_hotspots(dataclasses.replace(whole, aggregates=False), depth=2)
    assert not DirAggregate.objects.filter(repository=repo).exists()
    got = at_once(lambda _: directory_hotspots(whole, depth=2), 4)
    assert got == [want] * 4
    keys = list(
        DirAggregate.objects.filter(repository=repo).values_list(
            "span", "month", "depth", "dir", "author_canonical_email"
        )
    )
    assert keys and len(keys) == len(set(keys))
    assert {(s, m) for s, m, *_ in keys} == {(1, date(2024, 3, 1))}
    assert split(whole, midpoint(whole)).cut_month == date(2024, 3, 1)
