"""dashboard.analytics.coupling against code-maat's algorithm applied, here, to what
``git log --numstat`` prints for the same real repository and window, and against the
planted pair (8 shared of 10 revisions each: degree 80)."""

from __future__ import annotations

import math
from collections import Counter
from itertools import combinations
from pathlib import Path

import pytest

from dashboard.analytics.coupling import Thresholds, coupled_with, directory_coupling, file_coupling
from dashboard.analytics.rows import Scope, directory_of
from dashboard.analytics.window import parse_window
from tests.support.analytics_history import LoggedCommit, analysed, build, git_log

pytestmark = pytest.mark.django_db(transaction=True)


def maat(change_sets: list[set[str]], t: Thresholds) -> list[tuple[str, str, int, int, int]]:
    """code-maat's coupling (coupling_algos.clj): drop change sets over the size limit,
    count each entity's revisions and each pair's shared ones, keep what passes."""
    kept = [cs for cs in change_sets if len(cs) <= t.max_changeset_size]
    revs = Counter(e for cs in kept for e in cs)
    shared = Counter(p for cs in kept for p in combinations(sorted(cs), 2))
    out = []
    for (a, b), s in shared.items():
        average = (revs[a] + revs[b]) / 2
        degree = 100 * s / average
        if average >= t.min_revs and s >= t.min_shared_revs and degree >= t.min_coupling:
            out.append((a, b, int(degree), math.ceil(average), s))
    return sorted(out)


def files_of(log: list[LoggedCommit]) -> list[set[str]]:
    return [set(c.files) for c in log]


def table(rows: list[dict]) -> list[tuple[str, str, int, int, int]]:
    return sorted(
        (r["entity"], r["coupled"], r["degree"], r["average_revs"], r["shared_revs"]) for r in rows
    )


THRESHOLDS = [
    Thresholds(),
    Thresholds(min_revs=1, min_shared_revs=1, min_coupling=0),
    Thresholds(min_revs=2, min_shared_revs=2, min_coupling=10, max_changeset_size=40),
    Thresholds(min_revs=1, min_shared_revs=1, min_coupling=50, max_changeset_size=2),
]


def test_coupling_equals_code_maat_over_git_log_in_every_window(tmp_path: Path) -> None:
    origin = build(tmp_path / "origin")
    repo = analysed(origin)
    whole = Scope.of(repo, parse_window())
    # The planted pair, with code-maat's defaults: nothing else passes them.
    assert table(file_coupling(whole)) == [("core/a.py", "core/b.py", 80, 10, 8)]
    log = git_log(origin)
    for t in THRESHOLDS:
        assert table(file_coupling(whole, t, limit=10_000)) == maat(files_of(log), t), t
    # A window: the same commits as git log --since/--until selects.
    days = sorted({c.committed_at[:10] for c in log})
    for since, until in [(days[1], days[-3]), (days[0], days[0]), (days[-4], None)]:
        window = parse_window(since, until)
        windowed = git_log(origin, *window.git_args())
        assert windowed, (since, until)
        scope = Scope.of(repo, window)
        for t in THRESHOLDS[1:]:
            assert table(file_coupling(scope, t, limit=10_000)) == maat(files_of(windowed), t)


def test_what_changes_with_a_file_and_directories(tmp_path: Path) -> None:
    origin = build(tmp_path / "origin")
    repo = analysed(origin)
    scope = Scope.of(repo, parse_window())
    loose = Thresholds(min_revs=1, min_shared_revs=1, min_coupling=0)
    got = coupled_with(scope, "core/a.py", loose)
    assert [(r["coupled"], r["degree"], r["shared_revs"]) for r in got] == [
        ("core/b.py", 80, 8),
        ("core/c.py", 33, 2),  # 2 shared; a has 10 revisions, c 2: 2 / 6
    ]
    assert all(r["entity"] == "core/a.py" for r in got)
    # Every row of the per-file view is a row of the repository view, mirrored.
    pairs = {(r["entity"], r["coupled"]): r for r in file_coupling(scope, loose, limit=10_000)}
    for r in got:
        key = tuple(sorted((r["entity"], r["coupled"])))
        assert pairs[key]["degree"] == r["degree"]
    assert coupled_with(scope, "no/such/file.py", loose) == []
    # Directories: each change set becomes its distinct directories.
    log = git_log(origin)
    for depth in (1, 2):
        dir_sets = [
            {directory_of(p, depth) for p in c.files}
            for c in log
            if len(c.files) <= loose.max_changeset_size
        ]
        got_dirs = table(directory_coupling(scope, loose, depth=depth, limit=10_000))
        assert got_dirs == maat(dir_sets, loose)
    assert ("core", "gen") not in {r[:2] for r in got_dirs}  # the 35-file sweep is left out


def test_thresholds_refuse_nonsense() -> None:
    with pytest.raises(ValueError, match="min_coupling"):
        Thresholds(min_coupling=101)
    with pytest.raises(ValueError, match="max_changeset_size"):
        Thresholds(max_changeset_size=1)
    with pytest.raises(ValueError, match="min_revs"):
        Thresholds(min_revs=-1)


def test_code_maats_rounding_and_thresholds_on_a_hand_built_history(tmp_path: Path) -> None:
    """x changes in 3 revisions, y in 4, 2 of them together: average 3.5 revisions,
    degree 100 * 2 / 3.5 = 57.1. code-maat prints the degree truncated (57) and the
    average rounded up (4), but compares the unrounded average with min-revs: 3.5 < 4."""
    from tests.support.analytics_history import analysed
    from tests.support.gitrepo import GitRepo

    origin = GitRepo.create(tmp_path / "origin")
    origin.commit("both", {"x.txt": "1\n", "y.txt": "1\n"})
    origin.commit("both again", {"x.txt": "2\n", "y.txt": "2\n"})
    origin.commit("x", {"x.txt": "3\n"})
    origin.commit("y", {"y.txt": "3\n"})
    origin.commit("y again", {"y.txt": "4\n"})
    scope = Scope.of(analysed(origin), parse_window())
    loose = Thresholds(min_revs=3, min_shared_revs=2, min_coupling=57)
    assert file_coupling(scope, loose) == [
        {"entity": "x.txt", "coupled": "y.txt", "degree": 57, "average_revs": 4,
         "shared_revs": 2, "revs": 3, "coupled_revs": 4}
    ]  # fmt: skip
    assert file_coupling(scope, Thresholds(min_revs=4, min_shared_revs=2, min_coupling=0)) == []
    assert file_coupling(scope, Thresholds(min_revs=3, min_shared_revs=3, min_coupling=0)) == []
    assert file_coupling(scope, Thresholds(min_revs=3, min_shared_revs=2, min_coupling=58)) == []
