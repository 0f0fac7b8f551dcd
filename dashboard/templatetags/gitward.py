"""Template filters every page uses: relative times, short ids with a copy button,
counts with units and plurals, and the threshold class of a value.

Everything returned is built with ``format_html``: values are escaped, so hostile job
ids or repository names stay text.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from django import template
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from dashboard import plurals

register = template.Library()


def _parse(value: Any) -> datetime | None:
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


@register.filter
def ago(value: Any) -> SafeString | str:
    """A ``<time>`` reading "3 s ago" with the exact UTC time on hover; the page's
    script keeps the text current. ``—`` for no time."""
    when = _parse(value)
    if when is None:
        return "—"
    if timezone.is_naive(when):
        when = timezone.make_aware(when, UTC)
    exact = when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    text = relative((timezone.now() - when).total_seconds())
    return format_html(
        '<time class="ago" datetime="{}" title="{}">{}</time>', when.isoformat(), exact, text
    )


def shorten(value: str, keep: int = 22) -> str:
    """The head and tail of a long id: ``analyze-3-0c1d2e…a1b2c3``."""
    if len(value) <= keep:
        return value
    return f"{value[: keep - 7]}…{value[-6:]}"


@register.filter
def shortid(value: Any, link: str = "") -> SafeString | str:
    """A long id shortened, the full one on hover, with a copy button; linked to
    ``link`` + the id (percent-encoded) when ``link`` is given, e.g. ``"/runs/?q="``;
    a ``{}`` in ``link`` marks where the id goes, e.g. ``"/runs/job/{}/"`` (the run page)."""
    return _copyable(value, link, shorten(str(value)))


@register.filter
def shortsha(value: Any, link: str = "") -> SafeString | str:
    """A commit id as its first 10 characters, with a copy button for the full one."""
    return _copyable(value, link, str(value)[:10])


def _copyable(value: Any, link: str, short: str) -> SafeString | str:
    if value in (None, ""):
        return "—"
    full = str(value)
    if link:
        quoted = quote(full, safe="")
        href = link.replace("{}", quoted) if "{}" in link else link + quoted
        cls = "run-link" if link.startswith("/runs/job/") else "id-link"
        label = format_html('<a class="{}" href="{}"><code>{}</code></a>', cls, href, short)
    else:
        label = format_html("<code>{}</code>", short)
    return format_html(
        '<span class="id" title="{}">{}<button type="button" class="copy" data-copy="{}" '
        'aria-label="copy {}">copy</button></span>',
        full,
        label,
        full,
        full,
    )


def span(seconds: float) -> str:
    """A duration: ``850 ms``, ``12 s``, ``3 min 5 s``, ``2 h 10 min``."""
    if seconds < 1:
        return f"{round(seconds * 1000)} ms"
    if seconds < 90:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60)} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"


@register.filter
def took(start: Any, end: Any) -> str:
    """How long from ``start`` to ``end`` (``—`` unless both are known)."""
    a, b = _parse(start), _parse(end)
    if a is None or b is None:
        return "—"
    return span(max(0.0, (b - a).total_seconds()))


@register.filter
def count(value: Any, noun: str) -> str:
    """``1 repository``, ``2 repositories``, ``1,204 runs`` (``dashboard.plurals``)."""
    return plurals.count(value, noun)


@register.filter
def level(value: Any, limits: str) -> str:
    """The CSS class of a value against ``warn,bad`` limits: ``good``, ``warn``, ``bad``."""
    try:
        x = float(value)
        warn, bad = (float(p) for p in limits.split(","))
    except (TypeError, ValueError):
        return ""
    return "bad" if x >= bad else "warn" if x >= warn else "good"
