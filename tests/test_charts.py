"""dashboard.charts: SVG geometry for the weekly bars and the sparklines (the pages that
draw them are covered in tests/test_views.py)."""

from __future__ import annotations

from dashboard.charts import HEIGHT, SPARK_H, SPARK_W, WIDTH, spark_points, sparklines, weekly_bars


def test_no_weeks_no_bars() -> None:
    assert weekly_bars([]) == {"bars": [], "width": WIDTH, "height": HEIGHT, "max": 0}


def test_one_week_is_one_full_height_bar() -> None:
    out = weekly_bars([{"week": "2024-01-01", "commits": 5}])
    assert out["first"] == out["last"] == "2024-01-01"
    (bar,) = out["bars"]
    assert bar == {
        "x": 0,
        "y": 14.0,
        "w": 23.0,
        "h": HEIGHT - 14,
        "week": "2024-01-01",
        "commits": 5,
    }
    assert out["max"] == 5


def test_gaps_are_filled_with_zero_weeks_and_heights_scale_to_the_peak() -> None:
    out = weekly_bars([{"week": "2024-01-01", "commits": 2}, {"week": "2024-01-22", "commits": 4}])
    weeks = [(b["week"], b["commits"]) for b in out["bars"]]
    assert weeks == [("2024-01-01", 2), ("2024-01-08", 0), ("2024-01-15", 0), ("2024-01-22", 4)]
    heights = [b["h"] for b in out["bars"]]
    assert heights == [(HEIGHT - 14) / 2, 0, 0, HEIGHT - 14]
    assert all(b["y"] == HEIGHT - b["h"] for b in out["bars"])
    xs = [b["x"] for b in out["bars"]]
    assert xs == sorted(xs) and xs[0] == 0


def test_only_the_last_max_weeks_are_kept_and_fit_the_width() -> None:
    weekly = [{"week": "2020-01-06", "commits": 9}, {"week": "2023-01-02", "commits": 3}]
    out = weekly_bars(weekly, max_weeks=52)
    assert len(out["bars"]) == 52
    assert out["last"] == "2023-01-02"
    assert out["max"] == 3  # the dropped week's 9 does not count
    assert out["first"] == "2022-01-10"
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
