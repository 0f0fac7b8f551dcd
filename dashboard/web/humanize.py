"""Numbers and times as people read them, one rule for the pages and the terminal:
``1 run``, ``1,204 repositories`` (``count``), and "3 s ago" in a ``<time>`` with the exact
UTC time on hover (``ago_html``, ``relative``). The templates' filters
(``dashboard.templatetags.gitward``), the rows rendered in Python
(``dashboard.web.prerendered_rows``) and the CLI share it, so they print the same characters."""

from __future__ import annotations

from datetime import UTC, datetime
from html import escape
from typing import Any

from django.utils import timezone
from django.utils.safestring import SafeString, mark_safe

__all__ = ["ago_html", "count", "parse_time", "relative"]


def parse_time(value: Any) -> datetime | None:
    """A datetime, an ISO 8601 string (the API and event shapes), else None."""
    if isinstance(value, datetime):
        return value
    if isinstance(value, str) and value:
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            return None
    return None


def relative(seconds: float) -> str:
    """``3 s ago``, ``5 min ago``, ``2 h ago``, ``4 d ago``, ``5 mo ago``, ``3 y ago``
    (``in …`` for the future). gitward.js has the same rule for live updates."""
    future = seconds < 0
    s = abs(seconds)
    if s < 90:
        text = f"{round(s)} s"
    elif s < 90 * 60:
        text = f"{round(s / 60)} min"
    elif s < 36 * 3600:
        text = f"{round(s / 3600)} h"
    elif s < 45 * 86400:
        text = f"{round(s / 86400)} d"
    elif s < 365 * 86400:
        text = f"{round(s / (30.44 * 86400))} mo"
    else:
        text = f"{s / (365.25 * 86400):.1f} y".replace(".0 y", " y")
    return f"in {text}" if future else f"{text} ago"


def ago_html(value: Any) -> SafeString | str:
    """A ``<time>`` reading "3 s ago" with the exact UTC time on hover; the page's
    script keeps the text current. ``—`` for no time."""
    when = parse_time(value)
    if when is None:
        return "—"
    if timezone.is_naive(when):
        when = timezone.make_aware(when, UTC)
    exact = when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    text = relative((timezone.now() - when).total_seconds())
    # format_html's characters (it escapes each argument with html.escape), without
    # its lazy-string wrappers per argument: the 50-row tables call this per row.
    return mark_safe(  # noqa: S308 - every argument escaped
        f'<time class="ago" datetime="{escape(when.isoformat())}" title="{escape(exact)}">'
        f"{escape(text)}</time>"
    )


def count(value: Any, noun: str) -> str:
    """``value`` with ``noun`` singular or plural: ``noun`` is ``singular,plural`` or a
    singular that takes an ``s``. Thousands are separated; a non-number counts as 0."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        x = 0.0
    singular, _, plural = noun.partition(",")
    number = f"{int(x):,}" if x == int(x) else f"{x:,.1f}"
    return f"{number} {singular if x == 1 else (plural or singular + 's')}"
