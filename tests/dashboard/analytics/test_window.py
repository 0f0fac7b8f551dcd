"""dashboard.analytics.window: dates, presets and refusals, and the git options that
select the same commits (checked against git in test_coupling and test_hotspots)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from dashboard.analytics.window import BadWindow, Window, parse_window


def test_dates_are_whole_utc_days_both_included() -> None:
    w = parse_window("2024-01-01", "2024-03-31")
    assert w == Window(datetime(2024, 1, 1, tzinfo=UTC), datetime(2024, 4, 1, tzinfo=UTC))
    assert w.as_dict() == {"since": "2024-01-01", "until": "2024-03-31"}
    assert w.git_args() == ["--since=2024-01-01T00:00:00Z", "--until=2024-03-31T23:59:59Z"]
    assert parse_window() == Window(None, None) == parse_window("", "", "")
    assert parse_window().git_args() == []
    assert parse_window("2024-02-02", "2024-02-02").end == datetime(2024, 2, 3, tzinfo=UTC)


@pytest.mark.parametrize("days", [30, 90, 365])
def test_presets_end_at_until_or_today(days: int) -> None:
    w = parse_window(until="2024-06-30", last=str(days))
    assert w.end == datetime(2024, 7, 1, tzinfo=UTC)
    assert w.end - w.start == timedelta(days=days)
    today = parse_window(last=days)
    assert today.end is not None and today.end - today.start == timedelta(days=days)
    assert today.end.date() == datetime.now(UTC).date() + timedelta(days=1)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("2024-13-01", None, None), "since must be an ISO date"),
        ((None, "yesterday", None), "until must be an ISO date"),
        (("2024-02-01", "2024-01-31", None), "since must not be after until"),
        (("2024-01-01", None, "30"), "not both"),
        ((None, None, "7"), "last must be one of 30, 90, 365"),
        ((None, None, "x"), "last must be one of"),
    ],
)
def test_bad_values_are_refused_with_a_reason(args: tuple, message: str) -> None:
    with pytest.raises(BadWindow, match=message):
        parse_window(*args)
