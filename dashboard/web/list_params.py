"""The query strings of the list pages (repositories, runs, audit log, dead letters):
integer parameters read leniently, and the filters rebuilt as the prefix of the pager
links. Shared by the view modules; no request state is kept."""

from __future__ import annotations

from typing import Any

from django.http import QueryDict


def positive_int(raw: str | None, default: int | None) -> Any:
    """A positive integer query parameter; ``default`` when absent or malformed (a
    hand-edited cursor shows the first page rather than an error page)."""
    # ASCII only: str.isdigit() also accepts "²", which int() refuses.
    if raw and raw.isascii() and raw.isdigit() and 0 < int(raw) < 2**62:
        return int(raw)
    return default


def query_prefix(filters: dict[str, str]) -> str:
    """The filters as a query string prefix for pager links (``a=1&b=2&`` or ``""``)."""
    pairs = QueryDict(mutable=True)
    for k, v in filters.items():
        if v:
            pairs[k] = v
    return pairs.urlencode() + "&" if pairs else ""
