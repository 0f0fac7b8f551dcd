"""Template filters every page uses: relative times, short ids with a copy button,
counts with units and plurals, and the threshold class of a value; and the tags that
print the repository list's and the audit log's rows (``dashboard.web.prerendered_rows``).

Everything returned escapes every value as ``format_html`` does (the characters are
``format_html``'s, built without its per-argument wrappers where a table calls them per
row), so hostile job ids or repository names stay text.
"""

from __future__ import annotations

from typing import Any

from django import template
from django.utils.safestring import SafeString

from dashboard.live.snapshots import shared_render
from dashboard.web import humanize, prerendered_rows
from dashboard.web.humanize import ago_html
from dashboard.web.humanize import parse_time as _parse

register = template.Library()


@register.filter
def ago(value: Any) -> SafeString | str:
    """A ``<time>`` reading "3 s ago" with the exact UTC time on hover; the page's
    script keeps the text current. ``—`` for no time (``dashboard.web.humanize``)."""
    return ago_html(value)


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
    return prerendered_rows.copyable_html(value, link, shorten(str(value)))


@register.filter
def shortsha(value: Any, link: str = "") -> SafeString | str:
    """A commit id as its first 10 characters, with a copy button for the full one."""
    return prerendered_rows.copyable_html(value, link, str(value)[:10])


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
    """``1 repository``, ``2 repositories``, ``1,204 runs`` (``dashboard.web.humanize``)."""
    return humanize.count(value, noun)


@register.filter
def level(value: Any, limits: str) -> str:
    """The CSS class of a value against ``warn,bad`` limits: ``good``, ``warn``, ``bad``."""
    try:
        x = float(value)
        warn, bad = (float(p) for p in limits.split(","))
    except (TypeError, ValueError):
        return ""
    return "bad" if x >= bad else "warn" if x >= warn else "good"


@register.simple_tag
def repository_rows(rows: Any, filters: Any = "") -> SafeString:
    """``{% repository_rows repositories filters %}``: the list's ``<tr>``s."""
    return prerendered_rows.repository_rows(rows or (), filters)


@register.simple_tag
def audit_rows(entries: Any, filters: Any = "") -> SafeString:
    """``{% audit_rows entries filters %}``: the audit log's ``<tr>``s."""
    return prerendered_rows.audit_rows(entries or (), filters)


@register.simple_tag
def commit_rows(commits: Any, link: str = "") -> SafeString:
    """``{% commit_rows commits commit_link %}``: the repository page's commit ``<tr>``s."""
    return prerendered_rows.commit_rows(commits or (), link)


class SharedNode(template.Node):
    """``{% shared a b … %}…{% endshared %}``: see :func:`shared`."""

    def __init__(self, nodelist: template.NodeList, inputs: list[Any]) -> None:
        self.nodelist = nodelist
        self.inputs = inputs

    def render(self, context: template.Context) -> str:
        values = tuple(f.resolve(context, ignore_failures=True) for f in self.inputs)
        if any(v is None for v in values):  # an input missing: nothing to key on
            return self.nodelist.render(context)
        return shared_render(self, values, lambda: self.nodelist.render(context))


@register.tag
def shared(parser: template.base.Parser, token: template.base.Token) -> SharedNode:
    """``{% shared snapshot.locks snapshot.can.force_release %}…{% endshared %}``: the
    block is rendered once for as long as every input is the same object (or an equal
    plain value) and reused by later pages (``snapshots.shared_render``). The inputs
    must be everything the block reads: the snapshot copy's parts, a shared part, the
    viewer's permissions it draws buttons for. An input that does not resolve renders
    the block every time."""
    inputs = [parser.compile_filter(bit) for bit in token.split_contents()[1:]]
    if not inputs:
        raise template.TemplateSyntaxError("{% shared %} needs the inputs of its block")
    nodelist = parser.parse(("endshared",))
    parser.delete_first_token()
    return SharedNode(nodelist, inputs)
