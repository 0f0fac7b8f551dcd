"""dashboard.analytics.hotspots: revisions, churn, authors and trend per file and per
directory, against ``git log --numstat`` over the same window and its two halves."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from pathlib import Path

import pytest

from dashboard.analytics.hotspots import directory_hotspots, file_hotspots, midpoint
from dashboard.analytics.rows import Scope, directory_of
from dashboard.analytics.window import parse_window
from tests.support.analytics_history import LoggedCommit, analysed, build, git_log

pytestmark = pytest.mark.django_db(transaction=True)


def reference(log: list[LoggedCommit], mid: datetime, key) -> dict[str, dict]:
    acc: dict[str, dict] = defaultdict(
        lambda: {"revs": 0, "churn": 0, "authors": set(), "recent": 0}
    )
    for c in log:
        recent = datetime.fromisoformat(c.committed_at) >= mid
        churn: dict[str, int] = defaultdict(int)
        for p, (a, d) in c.files.items():
            churn[key(p)] += a + d
        for entity, lines in churn.items():
            row = acc[entity]
            row["revs"] += 1
            row["churn"] += lines
            row["authors"].add(c.author)
            row["recent"] += recent
    out = {}
    for entity, row in acc.items():
        earlier = row["revs"] - row["recent"]
        trend = (
            "rising"
            if row["recent"] > earlier
            else "falling"
            if row["recent"] < earlier
            else "steady"
        )
        out[entity] = {**row, "authors": len(row["authors"]), "earlier": earlier, "trend": trend}
    return out


def test_hotspots_and_trend_equal_git_log(tmp_path: Path) -> None:
    origin = build(tmp_path / "origin")
    repo = analysed(origin)
    days = sorted({c.committed_at[:10] for c in git_log(origin)})
    for since, until in [(days[0], days[-1]), (days[1], days[-2])]:
        window = parse_window(since, until)
        scope = Scope.of(repo, window)
        assert window.start is not None and window.end is not None
        mid = window.start + (window.end - window.start) / 2
        assert midpoint(scope) == mid
        logged = git_log(origin, *window.git_args())
        files = {r.pop("path"): r for r in file_hotspots(scope, limit=10_000)}
        assert files == reference(logged, mid, lambda p: p)
        dirs = {r.pop("directory"): r for r in directory_hotspots(scope, limit=10_000)}
        assert dirs == reference(logged, mid, lambda p: directory_of(p, 1))
    whole = Scope.of(repo, parse_window(days[0], days[-1]))
    top = file_hotspots(whole, limit=3)
    assert [r["path"] for r in top] == ["core/a.py", "core/b.py", "handbook/guide.md"]
    # core/ changed only after Cy's 210 days, in the window's second half; legacy/ before
    assert (top[0]["revs"], top[0]["recent"], top[0]["trend"]) == (11, 11, "rising")
    legacy = next(r for r in file_hotspots(whole, limit=100) if r["path"] == "legacy/old.py")
    assert (legacy["revs"], legacy["earlier"], legacy["trend"]) == (3, 3, "falling")
    assert file_hotspots(Scope.of(repo, parse_window("2001-01-01", "2001-12-31"))) == []


def test_an_unbounded_window_starts_at_the_first_commit(tmp_path: Path) -> None:
    origin = build(tmp_path / "origin")
    repo = analysed(origin)
    first = min(datetime.fromisoformat(c.committed_at) for c in git_log(origin))
    last_day = max(c.committed_at[:10] for c in git_log(origin))
    window = parse_window(until=last_day)
    assert window.end is not None
    assert midpoint(Scope.of(repo, window)) == (first + (window.end - first) / 2).replace(
        microsecond=0
    )
