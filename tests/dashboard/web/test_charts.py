"""dashboard.web.charts: SVG geometry for the weekly bars and the sparklines (the pages that
draw them are covered in tests/dashboard/web/test_repositories.py)."""

from __future__ import annotations

from datetime import date, timedelta

from dashboard.web.charts import (
    BOTTOM,
    HEIGHT,
    LEFT,
    MAX_BAR,
    SPARK_H,
    SPARK_W,
    TOP,
    WIDTH,
    bucket_for,
    history_bars,
    spark_points,
    sparklines,
)

PLOT_H = HEIGHT - TOP - BOTTOM


def test_no_weeks_no_bars() -> None:
    assert history_bars([]) == {"bars": [], "width": WIDTH, "height": HEIGHT, "max": 0}


def test_one_week_is_one_full_height_bar_no_wider_than_the_cap() -> None:
    out = history_bars([{"week": "2024-01-01", "commits": 5}])
    assert out["first"] == out["last"] == "week of 2024-01-01"
    (bar,) = out["bars"]
    assert bar["w"] == MAX_BAR  # not a full-width slab
    assert bar["h"] == PLOT_H and bar["y"] == TOP
    assert (bar["label"], bar["value"]) == ("week of 2024-01-01", 5)
    assert out["max"] == 5 and out["base"] == TOP + PLOT_H


def test_gaps_are_filled_with_zero_weeks_and_heights_scale_to_the_peak() -> None:
    out = history_bars([{"week": "2024-01-01", "commits": 2}, {"week": "2024-01-22", "commits": 4}])
    weeks = [(b["label"], b["value"]) for b in out["bars"]]
    assert weeks == [
        ("week of 2024-01-01", 2),
        ("week of 2024-01-08", 0),
        ("week of 2024-01-15", 0),
        ("week of 2024-01-22", 4),
    ]
    assert [b["h"] for b in out["bars"]] == [PLOT_H / 2, 0, 0, PLOT_H]
    assert all(b["y"] == round(TOP + PLOT_H - b["h"], 1) for b in out["bars"])
    xs = [b["x"] for b in out["bars"]]
    assert xs == sorted(xs) and xs[0] >= LEFT
    last = out["bars"][-1]
    assert last["x"] + last["w"] <= WIDTH


def test_another_field_is_charted_with_its_unit() -> None:
    weekly = [{"week": "2024-01-01", "commits": 1, "insertions": 30, "deletions": 2}]
    out = history_bars(weekly, field="insertions", unit="line added,lines added")
    assert [b["value"] for b in out["bars"]] == [30] and out["unit"] == "line added,lines added"


def test_the_bucket_grows_with_the_range() -> None:
    d = date(2020, 1, 6)
    assert bucket_for(d, d) == "week"
    assert bucket_for(d, d + timedelta(weeks=26)) == "week"
    assert bucket_for(d, d + timedelta(weeks=27)) == "month"
    assert bucket_for(d, d + timedelta(days=6 * 366)) == "month"
    assert bucket_for(d, d + timedelta(days=6 * 366 + 1)) == "year"


def test_three_years_are_months_summed_with_empty_months_kept() -> None:
    weekly = [
        {"week": "2020-01-06", "commits": 9},
        {"week": "2020-01-27", "commits": 1},
        {"week": "2023-01-02", "commits": 3},
    ]
    out = history_bars(weekly)
    assert out["bucket"] == "month"
    assert len(out["bars"]) == 37  # Jan 2020 .. Jan 2023, every month drawn
    assert out["bars"][0]["value"] == 10  # both January weeks in one bar
    assert out["bars"][0]["label"] == "Jan 2020" and out["last"] == "Jan 2023"
    assert sum(b["value"] for b in out["bars"]) == 13 and out["max"] == 10
    assert len(out["x_labels"]) <= 7
    last = out["bars"][-1]
    assert last["x"] + last["w"] <= WIDTH


def test_spark_points() -> None:
    assert spark_points([]) == ""
    pts = [tuple(map(float, p.split(","))) for p in spark_points([0, None, 4]).split()]
    assert pts == [(0.0, SPARK_H - 2), (SPARK_W / 2, SPARK_H - 2), (SPARK_W, 2.0)]
    assert spark_points([3]) == "0.0,2.0"  # a lone value is the peak


def test_sparklines_totals_and_latest_backlog() -> None:
    out = sparklines({"throughput": [1, 2, 3], "backlog": [5, 7, None]})
    assert out["throughput_total"] == 6
    assert out["backlog_now"] == 7  # the latest sample, skipping missing ones
    assert out["throughput"] == spark_points([1, 2, 3])
    assert sparklines({"throughput": [], "backlog": [None]})["backlog_now"] == 0


def test_time_marks_sit_at_their_time_and_events_outside_the_chart_are_left_out() -> None:
    from datetime import UTC, datetime

    from dashboard.web.charts import DAY_WIDTH, time_marks

    start = datetime(2026, 12, 6, 0, 0, tzinfo=UTC)
    events = [
        {"at": start - timedelta(seconds=1), "label": "before"},
        {"at": start, "label": "a", "title": "A"},
        {"at": start + timedelta(hours=6), "label": "b"},
        {"at": start + timedelta(hours=24), "label": "after"},
    ]
    marks = time_marks(events, start, 24)
    plot_w = DAY_WIDTH - LEFT
    assert [(m["x"], m["label"], m["title"]) for m in marks] == [
        (LEFT, "a", "A"),
        (round(LEFT + plot_w / 4, 1), "b", "b"),
    ]
    assert [(m["top"], m["base"]) for m in marks] == [(TOP, HEIGHT - BOTTOM)] * 2
    assert marks[0]["label_y"] != marks[1]["label_y"]  # neighbours' labels alternate
