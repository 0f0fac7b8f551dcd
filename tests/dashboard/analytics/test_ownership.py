"""dashboard.analytics.ownership against shares counted here from ``git log --numstat``,
and the planted patterns: Ada makes 9 of handbook/'s 10 changes; Cy, silent for 200+ days, is
the only author of legacy/."""

from __future__ import annotations

from collections import Counter, defaultdict
from datetime import datetime
from pathlib import Path

import pytest

from dashboard.analytics.ownership import directory_ownership, file_ownership, knowledge_at_risk
from dashboard.analytics.rows import Scope, directory_of
from dashboard.analytics.window import parse_window
from tests.support.analytics_history import analysed, build, git_log

pytestmark = pytest.mark.django_db(transaction=True)


def expected(counts: Counter) -> dict:
    total = sum(counts.values())
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    # bus factor: the smallest k whose top-k authors hold more than half
    bus = next(k for k in range(1, len(ranked) + 1) if sum(n for _, n in ranked[:k]) * 2 > total)
    return {
        "revs": total,
        "authors": len(counts),
        "main_dev": ranked[0][0],
        "ownership": round(ranked[0][1] / total, 4),
        "fragmentation": round(1 - sum((n / total) ** 2 for n in counts.values()), 4),
        "bus_factor": bus,
    }


def pick(row: dict) -> dict:
    return {
        k: row[k]
        for k in ("revs", "authors", "main_dev", "ownership", "fragmentation", "bus_factor")
    }


def test_file_and_directory_ownership_equal_git_log(tmp_path: Path) -> None:
    origin = build(tmp_path / "origin")
    repo = analysed(origin)
    log = git_log(origin)
    days = sorted({c.committed_at[:10] for c in log})
    for since, until in [(None, None), (days[2], days[-2])]:
        window = parse_window(since, until)
        scope = Scope.of(repo, window)
        logged = git_log(origin, *window.git_args())
        per_file: dict[str, Counter] = defaultdict(Counter)
        per_dir: dict[str, Counter] = defaultdict(Counter)
        for c in logged:
            for p in c.files:
                per_file[p][c.author] += 1
            for d in {directory_of(p, 1) for p in c.files}:
                per_dir[d][c.author] += 1
        files = {r["path"]: pick(r) for r in file_ownership(scope, limit=10_000)}
        assert files == {p: expected(n) for p, n in per_file.items()}
        dirs = {r["directory"]: pick(r) for r in directory_ownership(scope)}
        assert dirs == {d: expected(n) for d, n in per_dir.items()}
    whole = Scope.of(repo, parse_window())
    docs = next(r for r in directory_ownership(whole) if r["directory"] == "handbook")
    assert (docs["main_dev"], docs["ownership"], docs["bus_factor"]) == ("ada@example.com", 0.9, 1)
    assert docs["fragmentation"] == 0.18
    assert docs["by_author"] == [
        {"author": "ada@example.com", "name": "Ada Lovelace", "revs": 9},
        {"author": "bob@example.com", "name": "Bob", "revs": 1},  # .mailmap: bobby is Bob
    ]
    assert docs["main_dev_name"] == "Ada Lovelace"


def test_knowledge_at_risk_finds_the_silent_author_and_their_files(tmp_path: Path) -> None:
    origin = build(tmp_path / "origin")
    repo = analysed(origin)
    last_day = max(c.committed_at[:10] for c in git_log(origin))
    whole = Scope.of(repo, parse_window(until=last_day))
    risk = knowledge_at_risk(whole, inactive_days=90)
    assert [a["author"] for a in risk["authors"]] == ["cy@example.com"]
    cy = risk["authors"][0]
    assert cy["files"] == ["legacy/old.py", "legacy/util.py"] and cy["name"] == "Cy"
    cy_commits = git_log(origin, "--author=cy@example.com")
    assert len(cy_commits) == 4
    assert datetime.fromisoformat(cy["last_commit_at"]) == max(
        datetime.fromisoformat(c.committed_at) for c in cy_commits
    )
    assert risk["files_at_risk"] == 2
    # Silent for 210 days: a 365-day threshold sees nobody; a window after Cy's work still
    # names Cy as inactive, with no file of the window known only to Cy.
    assert knowledge_at_risk(whole, inactive_days=365)["authors"] == []
    late = sorted({c.committed_at[:10] for c in git_log(origin)})[-5]
    later = knowledge_at_risk(Scope.of(repo, parse_window(late, last_day)), inactive_days=90)
    assert [(a["author"], a["files"]) for a in later["authors"]] == [("cy@example.com", [])]
    with pytest.raises(ValueError, match="inactive_days"):
        knowledge_at_risk(whole, inactive_days=0)
