"""dashboard.analytics.coupling_aggregates: where the coupling aggregates are read (no
lens, a size threshold within ``CAP``), that a lens or a larger threshold reads the stored
rows and writes no aggregate, and that readers of a cold history at once store each month
and year once (docs/analytics.md#performance). That the numbers equal the stored rows'
is the property test of tests/dashboard/analytics/test_aggregates.py."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from pathlib import Path

import pytest

from dashboard.analytics.aggregates import split
from dashboard.analytics.coupling import Thresholds, directory_coupling, file_coupling
from dashboard.analytics.coupling_aggregates import CAP, applies, coupling_ctes, ensure
from dashboard.analytics.lenses import build_lens
from dashboard.analytics.rows import Scope
from dashboard.analytics.window import Window
from dashboard.models import CouplingAggregate, CouplingStamp, MonthStamp
from tests.dashboard.analytics.test_aggregates import build_months
from tests.support.analytics_history import analysed
from tests.support.checked_threads import at_once

pytestmark = pytest.mark.django_db(transaction=True)

WIDE = Thresholds(0, 0, 0, 3)


def test_only_an_unlensed_scope_within_the_cap_reads_the_aggregates(tmp_path: Path) -> None:
    repo = analysed(build_months(tmp_path / "origin"))
    whole = Scope.of(repo, Window())
    assert applies(whole, CAP) and not applies(whole, CAP + 1)
    assert not applies(dataclasses.replace(whole, aggregates=False), 2)
    for lens in ("bots", "lock"):
        lensed = dataclasses.replace(whole, lens=build_lens({lens}, repo, whole.fingerprint))
        assert not applies(lensed, 2)
        file_coupling(lensed, WIDE)
        directory_coupling(lensed, WIDE)
    file_coupling(whole, dataclasses.replace(WIDE, max_changeset_size=CAP + 1))
    assert not CouplingAggregate.objects.filter(repository=repo).exists()
    # The identity map is no lens: coupling never looks at authors.
    mapped = dataclasses.replace(whole.lens, identities=(("bob@example.com", "ada@example.com"),))
    assert applies(dataclasses.replace(whole, lens=mapped), CAP)
    assert file_coupling(whole, WIDE)
    assert CouplingAggregate.objects.filter(repository=repo, depth=0).exists()
    assert not CouplingAggregate.objects.filter(repository=repo, depth=1).exists()


def test_a_window_inside_one_month_reads_the_stored_rows(tmp_path: Path) -> None:
    repo = analysed(build_months(tmp_path / "origin"))
    inside = Scope.of(
        repo, Window(datetime(2024, 3, 3, tzinfo=UTC), datetime(2024, 3, 20, tzinfo=UTC))
    )
    assert coupling_ctes(inside, 30) is None
    with pytest.raises(ValueError, match="depth"):
        ensure(Scope.of(repo, Window()), 7, split(Scope.of(repo, Window())))


def test_readers_computing_the_same_months_at_once_store_them_once(tmp_path: Path) -> None:
    """Four readers of a cold history at once, two of files and two of directories: each
    gets the numbers of the stored rows (a reader finding a lock busy reads that span
    from the stored rows), and each month and year of each depth is stored once (the
    stamp rows' lock serializes them; the later ones find them current)."""

    repo = analysed(build_months(tmp_path / "origin"))
    whole = Scope.of(repo, Window())
    raw = dataclasses.replace(whole, aggregates=False)
    want = [file_coupling(raw, WIDE), directory_coupling(raw, WIDE, depth=2)]
    got = at_once(
        lambda k: directory_coupling(whole, WIDE, depth=2) if k % 2 else file_coupling(whole, WIDE),
        4,
    )
    assert got == [want[k % 2] for k in range(4)]
    # A reader that found a lock busy read those spans from the stored rows and left
    # them stale (aggregates.settle); one more read of each computes what is left.
    assert file_coupling(whole, WIDE) == want[0]
    assert directory_coupling(whole, WIDE, depth=2) == want[1]
    stored = CouplingAggregate.objects.filter(repository=repo)
    keys = list(stored.values_list("depth", "span", "month", "ea", "eb"))
    assert len(keys) == len(set(keys))
    parts = split(whole)
    for depth in (0, 2):
        assert {m for d, s, m, *_ in keys if s == 12 and d == depth} == set(parts.years)
        recorded = dict(
            CouplingStamp.objects.filter(repository=repo, depth=depth).values_list(
                "month", "aggregated"
            )
        )
        versions = dict(MonthStamp.objects.filter(repository=repo).values_list("month", "version"))
        for a, b in parts.runs:
            for month in (a, b):
                assert recorded[month] == versions[month]
