"""What a command prints is text, never terminal control (docs/cli.md).

Repository data (author names, paths, subjects, errors that quote them) is chosen by
whoever pushed the commits: an ESC sequence in an author's name would move the cursor,
retitle the window or rewrite what the operator sees (CSI 8-bit ``\\x9b`` too), and a
bidi override would reorder a line. Commands print such characters escaped: ``plain``
for text lines, ``json_text`` for JSON.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["json_text", "plain"]

#: C0 controls (a command joins its own lines; a value needs none), DEL, C1 controls
#: (``\x9b`` is CSI on 8-bit terminals), and the bidi embeddings, overrides, isolates.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def plain(text: str) -> str:
    """``text`` with every control character written as a Python escape (``\\x1b``,
    ``\\u202e``): the line reads the same on any terminal and shows what was there."""
    return _CONTROL.sub(_escape, text)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def json_text(value: Any) -> str:
    """``json.dumps(value, ensure_ascii=False)`` with the control characters JSON leaves
    raw (DEL, C1, bidi) written as ``\\uXXXX`` too: the same JSON value, safe to print."""
    return _CONTROL.sub(lambda m: f"\\u{ord(m.group()):04x}", json.dumps(value, ensure_ascii=False))
