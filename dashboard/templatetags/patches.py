"""``patch_lines``: a file's patch as escaped lines, classed by their first character
(added, removed, hunk header, file header) and nothing else: no syntax highlighting, no
markup from the file survives (every line goes through ``escape``)."""

from __future__ import annotations

from django import template
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

register = template.Library()

_CLASSES = {"+": "p-add", "-": "p-del", "@": "p-hunk", " ": "", "\\": "p-note"}


@register.filter
def patch_lines(text: str) -> SafeString:
    out = []
    in_hunks = False
    for line in str(text).split("\n"):
        if line.startswith("@@"):
            in_hunks = True
        cls = _CLASSES.get(line[:1], "") if in_hunks else "p-head"
        out.append(f'<span class="{cls}">{escape(line)}</span>' if cls else escape(line))
    return mark_safe("\n".join(out))  # noqa: S308 - every line is escaped above
