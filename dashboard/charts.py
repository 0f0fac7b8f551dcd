"""Server-side SVG geometry for small charts (no inline styles: CSP-safe)."""

from __future__ import annotations

from datetime import date, timedelta
from typing import Any

WIDTH = 720
HEIGHT = 120


def weekly_bars(weekly: list[dict[str, Any]], *, max_weeks: int = 156) -> dict[str, Any]:
    """Bars for commits per week, gaps filled with zero weeks, last ``max_weeks``."""
    if not weekly:
        return {"bars": [], "width": WIDTH, "height": HEIGHT, "max": 0}
    counts = {date.fromisoformat(w["week"]): int(w["commits"]) for w in weekly}
    start, end = min(counts), max(counts)
    weeks = []
    cur = start
    while cur <= end:
        weeks.append(cur)
        cur += timedelta(days=7)
    weeks = weeks[-max_weeks:]
    peak = max(counts.get(w, 0) for w in weeks) or 1
    step = min(WIDTH / len(weeks), 24.0)  # a short history keeps narrow bars
    bars = []
    for i, w in enumerate(weeks):
        n = counts.get(w, 0)
        h = round((HEIGHT - 14) * n / peak, 1)
        bars.append(
            {
                "x": round(i * step, 2),
                "y": round(HEIGHT - h, 1),
                "w": max(1.0, round(step - 1, 2)),
                "h": h,
                "week": w.isoformat(),
                "commits": n,
            }
        )
    return {
        "bars": bars,
        "width": WIDTH,
        "height": HEIGHT,
        "max": peak,
        "first": weeks[0].isoformat(),
        "last": weeks[-1].isoformat(),
    }


SPARK_W = 240
SPARK_H = 40


def spark_points(values: list[int | None]) -> str:
    """SVG polyline points for a sparkline (``None`` = no sample, drawn as 0)."""
    if not values:
        return ""
    nums = [v or 0 for v in values]
    peak = max(nums) or 1
    step = SPARK_W / max(1, len(nums) - 1)
    return " ".join(
        f"{round(i * step, 1)},{round(SPARK_H - 2 - (SPARK_H - 4) * n / peak, 1)}"
        for i, n in enumerate(nums)
    )


def sparklines(series: dict[str, Any]) -> dict[str, Any]:
    thr = series["throughput"]
    backlog = series["backlog"]
    return {
        "throughput": spark_points(thr),
        "backlog": spark_points(backlog),
        "throughput_total": sum(thr),
        "backlog_now": next((b for b in reversed(backlog) if b is not None), 0),
    }
