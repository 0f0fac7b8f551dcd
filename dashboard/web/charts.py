"""Server-side SVG geometry for the charts (no inline styles: CSP-safe).

Every chart has a y axis (0, half and the peak, with the unit), x labels, and a
``<title>`` per bar or sample so the value shows on hover. History charts bucket by
week, month or year so one week and twenty years both read.
"""

from __future__ import annotations

from datetime import date, datetime, timedelta
from typing import Any

WIDTH = 600  # about the drawn width in a two-column card at 1280 px: text stays ~11 px
DAY_WIDTH = 400  # the three 24-hour charts share a row
HEIGHT = 160
LEFT = 44  # room for the y labels
BOTTOM = 20  # room for the x labels
TOP = 8
MAX_BAR = 48.0  # one week of history is one labelled bar, not a full-width slab


def bucket_for(first: date, last: date) -> str:
    """``week`` up to half a year of history, ``month`` up to six years, else ``year``."""
    days = (last - first).days
    if days <= 26 * 7:
        return "week"
    if days <= 6 * 366:
        return "month"
    return "year"


def _bucket_start(d: date, bucket: str) -> date:
    if bucket == "week":
        return d - timedelta(days=d.weekday())
    if bucket == "month":
        return d.replace(day=1)
    return d.replace(month=1, day=1)


def _next(d: date, bucket: str) -> date:
    if bucket == "week":
        return d + timedelta(days=7)
    if bucket == "month":
        return date(d.year + (d.month == 12), d.month % 12 + 1, 1)
    return date(d.year + 1, 1, 1)


def bucket_label(d: date, bucket: str) -> str:
    if bucket == "week":
        return f"week of {d.isoformat()}"
    if bucket == "month":
        return d.strftime("%b %Y")
    return str(d.year)


def _short_label(d: date, bucket: str) -> str:
    if bucket == "week":
        return d.strftime("%d %b")
    if bucket == "month":
        return d.strftime("%b %Y")
    return str(d.year)


def y_ticks(peak: float, plot_h: float) -> list[dict[str, Any]]:
    """0, half and the peak, with their y positions."""
    ticks = []
    for frac in (0.0, 0.5, 1.0):
        value = peak * frac
        label = f"{value:,.0f}" if peak >= 10 or frac != 0.5 else f"{value:,.1f}"
        ticks.append({"y": round(TOP + plot_h * (1 - frac), 1), "label": label})
    return ticks


def history_bars(weekly: list[dict[str, Any]], *, field: str = "commits",
                 unit: str = "commit") -> dict[str, Any]:  # fmt: skip
    """Bars of ``field`` summed per week, month or year (``bucket_for`` the range),
    empty buckets included, with axes and hover titles. ``unit`` is a noun for the
    ``|count`` filter: ``"commit"`` or ``"singular,plural"``."""
    points = [(date.fromisoformat(w["week"]), int(w.get(field, 0) or 0)) for w in weekly]
    if not points:
        return {"bars": [], "width": WIDTH, "height": HEIGHT, "max": 0}
    bucket = bucket_for(min(p[0] for p in points), max(p[0] for p in points))
    sums: dict[date, int] = {}
    for d, n in points:
        key = _bucket_start(d, bucket)
        sums[key] = sums.get(key, 0) + n
    keys = []
    cur, end = min(sums), max(sums)
    while cur <= end:
        keys.append(cur)
        cur = _next(cur, bucket)
    peak = max(sums.values()) or 1
    plot_w, plot_h = WIDTH - LEFT, HEIGHT - TOP - BOTTOM
    step = plot_w / len(keys)
    bar_w = min(MAX_BAR, max(1.0, step - 1))
    bars: list[dict[str, Any]] = []
    for i, k in enumerate(keys):
        n = sums.get(k, 0)
        h = round(plot_h * n / peak, 1)
        bars.append(
            {
                "x": round(LEFT + i * step + (step - bar_w) / 2, 2),
                "y": round(TOP + plot_h - h, 1),
                "w": round(bar_w, 2),
                "h": h,
                "label": bucket_label(k, bucket),
                "value": n,
            }
        )
    every = max(1, len(keys) // 6)
    x_labels = [
        {"x": round(b["x"] + bar_w / 2, 1), "text": _short_label(keys[i], bucket)}
        for i, b in enumerate(bars)
        if i % every == 0
    ]
    return {
        "bars": bars,
        "width": WIDTH,
        "height": HEIGHT,
        "left": LEFT,
        "base": TOP + plot_h,
        "max": peak,
        "unit": unit,
        "bucket": bucket,
        "y_ticks": y_ticks(peak, plot_h),
        "x_labels": x_labels,
        "x_label_y": HEIGHT - 4,
        "first": bucket_label(keys[0], bucket),
        "last": bucket_label(keys[-1], bucket),
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


def spark_samples(values: list[int | None], minutes: list[str], unit: str) -> list[dict[str, Any]]:
    """One hover target per sample: its x band and its title (``14:05 · 3 jobs``)."""
    step = SPARK_W / max(1, len(values))
    return [
        {
            "x": round(i * step, 1),
            "w": round(step, 2),
            "title": f"{m[11:16]} UTC · {'no sample' if v is None else f'{v} {unit}'}",
        }
        for i, (v, m) in enumerate(zip(values, minutes, strict=False))
    ]


#: The last ``sparklines`` call: ``(series, its sparklines)``.
_LAST_SPARKS: list[tuple[dict[str, Any], dict[str, Any]]] = []


def sparklines(series: dict[str, Any]) -> dict[str, Any]:
    """The overview's and the Workers page's two sparklines of ``series`` (a snapshot's).
    The same series object (a snapshot copy is never changed once built) gives the same
    result object, computed once: the pages share it, and ``{% shared %}`` can key the
    queues fragment on it. Race: two threads with different series both compute and
    one's result stays; each checks the series is its own before reusing it."""
    last = _LAST_SPARKS[-1] if _LAST_SPARKS else None
    if last is not None and last[0] is series:
        return last[1]
    sparks = _sparklines(series)
    _LAST_SPARKS[:] = [(series, sparks)]
    return sparks


def _sparklines(series: dict[str, Any]) -> dict[str, Any]:
    thr = series["throughput"]
    backlog = series["backlog"]
    minutes = series.get("minutes", [])
    return {
        "throughput": spark_points(thr),
        "backlog": spark_points(backlog),
        "throughput_total": sum(thr),
        "throughput_peak": max(thr, default=0),
        "backlog_peak": max((b or 0 for b in backlog), default=0),
        "backlog_now": next((b for b in reversed(backlog) if b is not None), 0),
        "throughput_samples": spark_samples(thr, minutes, "jobs/min"),
        "backlog_samples": spark_samples(backlog, minutes, "queued"),
    }


def labelled_bars(
    values: list[float], labels: list[str], *, unit: str, ticks: list[str] | None = None,
    warn: float | None = None, bad: float | None = None, width: int = DAY_WIDTH,
) -> dict[str, Any]:  # fmt: skip
    """Bars for a fixed series (e.g. the 24 hours of ``queue_stats.day_series``): one per
    value, ``labels`` in the hover titles, ``ticks`` (same length, "" to skip) under the
    axis. With ``warn``/``bad`` limits each bar gets the class ``good``/``warn``/``bad``."""
    if not values:
        return {"bars": [], "width": width, "height": HEIGHT, "max": 0}
    peak = max(values) or 1
    plot_w, plot_h = width - LEFT, HEIGHT - TOP - BOTTOM
    step = plot_w / len(values)
    bar_w = min(MAX_BAR, max(1.0, step - 2))
    bars: list[dict[str, Any]] = []
    for i, v in enumerate(values):
        h = round(plot_h * v / peak, 1)
        level = ""
        if warn is not None and bad is not None:
            level = "bad" if v >= bad else "warn" if v >= warn else "good"
        bars.append(
            {
                "x": round(LEFT + i * step + (step - bar_w) / 2, 2),
                "y": round(TOP + plot_h - h, 1),
                "w": round(bar_w, 2),
                "h": h,
                "label": labels[i],
                "value": v,
                "level": level,
            }
        )
    x_labels = [
        {"x": round(b["x"] + bar_w / 2, 1), "text": t}
        for b, t in zip(bars, ticks or [""] * len(bars), strict=True)
        if t
    ]
    return {
        "bars": bars,
        "width": width,
        "height": HEIGHT,
        "left": LEFT,
        "max": peak,
        "unit": unit,
        "bucket": "hour",
        "y_ticks": y_ticks(peak, plot_h),
        "x_labels": x_labels,
        "x_label_y": HEIGHT - 4,
        "first": labels[0],
        "last": labels[-1],
    }


def time_marks(marks: list[dict[str, Any]], start: datetime, hours: int,
               width: int = DAY_WIDTH) -> list[dict[str, Any]]:  # fmt: skip
    """Vertical marks (``{x, top, base, label, title, label_y}``) for events ``{at, label,
    title}`` on a chart of ``hours`` hourly bars from ``start``: an event at 14:30 sits
    half-way across the 14:00 bar. Events outside the chart are left out. Labels take
    turns at two heights so two marks close together stay readable."""
    plot_w, plot_h = width - LEFT, HEIGHT - TOP - BOTTOM
    span = hours * 3600.0
    out: list[dict[str, Any]] = []
    for m in marks:
        offset = (m["at"] - start).total_seconds()
        if not 0 <= offset < span:
            continue
        out.append(
            {
                "x": round(LEFT + plot_w * offset / span, 1),
                "top": TOP,
                "base": TOP + plot_h,
                "label": m["label"],
                "title": m.get("title", m["label"]),
                "label_y": TOP + 9 + 11 * (len(out) % 2),
            }
        )
    return out


def day_charts(day: dict[str, Any], marks: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The three 24-hour charts of the Overview from ``queue_stats.day_series``; ``marks``
    (``rollouts.transition_marks``) are drawn on the throughput and failure charts."""
    labels = [f"{h[11:16]} UTC" for h in day["hours"]]
    ticks = [lab[:5] if i % 6 == 0 else "" for i, lab in enumerate(labels)]
    drawn = (
        time_marks(marks or [], datetime.fromisoformat(day["hours"][0]), len(day["hours"]))
        if day["hours"]
        else []
    )
    return {
        "throughput": {
            **labelled_bars(day["throughput"], labels, unit="job", ticks=ticks),
            "marks": drawn,
        },
        "failure_pct": {
            **labelled_bars(
                day["failure_pct"], labels, unit="% failed,% failed", ticks=ticks, warn=5, bad=20
            ),
            "marks": drawn,
        },
        "backlog": labelled_bars(day["backlog"], labels, unit="queued,queued", ticks=ticks),
    }
