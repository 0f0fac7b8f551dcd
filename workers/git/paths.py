"""A path git printed as bytes, as the text gitward stores and shows (docs/analysis.md).

git paths are bytes: most are UTF-8, some are not (a Latin-1 ``café`` from an old
system, any byte but NUL and ``/`` in a name). Text must hold each path so that two
different names stay two names, and so that the database (PostgreSQL refuses lone
surrogates and NUL) and every page can hold it. So:

- a path that is valid UTF-8 is its text, as git prints it with ``core.quotePath=off``;
- any other path is git's own C-quoted form, exactly what git prints with
  ``core.quotePath=on``: ``"caf\\351.txt"`` (ASCII only);
- a valid UTF-8 path that itself starts and ends with ``"`` (the shape of every quoted
  form) is quoted too (``"a"`` → ``"\\"a\\""``), so a quoted form is never another
  file's real name: the mapping is one-to-one, and every other name is kept as it reads.

The analysis (``workers.analysis.numstat``) and the commit page's patch
(``workers.git.commit_view``) both go through :func:`path_text`, so a stored path and
the patch of that file always match.
"""

from __future__ import annotations

__all__ = ["path_text", "quote_c_style"]

_NAMED = {7: "\\a", 8: "\\b", 9: "\\t", 10: "\\n", 11: "\\v", 12: "\\f", 13: "\\r",
          34: '\\"', 92: "\\\\"}  # fmt: skip


def path_text(raw: bytes) -> str:
    """``raw`` as text: itself when it is UTF-8 and not shaped like a quoted form
    (``"…"``), else :func:`quote_c_style`."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return quote_c_style(raw)
    looks_quoted = len(text) >= 2 and text.startswith('"') and text.endswith('"')
    return quote_c_style(raw) if looks_quoted else text


def quote_c_style(raw: bytes) -> str:
    """git's ``quote_c_style`` with ``core.quotePath=on``: in double quotes, ``"`` and
    ``\\`` and the control characters backslash-escaped, every byte from 0x7f up as
    three octal digits."""
    out = ['"']
    for byte in raw:
        named = _NAMED.get(byte)
        if named is not None:
            out.append(named)
        elif byte < 0x20 or byte >= 0x7F:
            out.append(f"\\{byte:03o}")
        else:
            out.append(chr(byte))
    out.append('"')
    return "".join(out)
