"""dashboard.analytics.age: each file's and directory's last change and age in whole
months, against ``git log -1`` per path."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from dashboard.analytics.age import directory_age, file_age, whole_months
from dashboard.analytics.rows import Scope, directory_of
from dashboard.analytics.window import parse_window
from tests.support.analytics_history import analysed, build, git_log

pytestmark = pytest.mark.django_db(transaction=True)


def months_by_stepping(start: datetime, end: datetime) -> int:
    """Whole months counted one calendar month at a time (clamping to the month's end is
    not needed: the fixture's days are below 29)."""
    n = 0
    while True:
        y, m = divmod(start.month - 1 + n + 1, 12)
        step = start.replace(year=start.year + y, month=m + 1)
        if step > end:
            return n
        n += 1


def test_whole_months() -> None:
    t = datetime(2024, 1, 31, 12, tzinfo=UTC)
    assert whole_months(t, datetime(2024, 2, 29, tzinfo=UTC)) == 0
    assert whole_months(t, datetime(2024, 3, 31, 12, tzinfo=UTC)) == 2
    assert whole_months(t, datetime(2024, 3, 31, 11, tzinfo=UTC)) == 1
    assert whole_months(t, t) == 0 and whole_months(t, datetime(2023, 1, 1, tzinfo=UTC)) == 0


def test_age_per_file_and_directory_equals_git(tmp_path: Path) -> None:
    origin = build(tmp_path / "origin")
    repo = analysed(origin)
    log = git_log(origin)
    last_day = max(c.committed_at[:10] for c in log)
    window = parse_window(until=last_day)
    end = window.end
    assert end is not None
    got = {r["path"]: r for r in file_age(Scope.of(repo, window))}
    assert set(got) == {p for c in log for p in c.files}
    for path, row in got.items():
        (last,) = git_log(origin, "-1", "--", path)  # newest non-merge commit of the path
        at = datetime.fromisoformat(last.committed_at)
        assert datetime.fromisoformat(row["last_change_at"]) == at, path
        assert row["age_months"] == months_by_stepping(at, end), path
        assert row["revs"] == len(git_log(origin, "--", path)), path
    assert got["legacy/util.py"]["age_months"] == 7  # Cy's 210 silent days and then some
    assert list(got)[:3] == [".mailmap", "legacy/old.py", "legacy/util.py"]  # oldest first
    dirs = {r["directory"]: r for r in directory_age(Scope.of(repo, window))}
    for directory, row in dirs.items():
        touching = [c for c in log if any(directory_of(p, 1) == directory for p in c.files)]
        newest = max(datetime.fromisoformat(c.committed_at) for c in touching)
        assert datetime.fromisoformat(row["last_change_at"]) == newest
        assert row["revs"] == len(touching)
    assert dirs["legacy"]["age_months"] == 7 and dirs["handbook"]["age_months"] == 0
