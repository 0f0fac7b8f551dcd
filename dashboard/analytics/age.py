"""Code age (docs/analytics.md#code-age): months since each file's and each directory's
last change inside the window, measured at the window's end (else now), in whole calendar
months as code-maat's ``age`` analysis counts them.

A path is every path a non-merge commit of the window changed, deleted files included:
the stored rows are diffs, not trees (as for code-maat, which reads the same log)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from dashboard.analytics.aggregates import file_parts
from dashboard.analytics.dir_aggregates import dir_parts
from dashboard.analytics.rows import Scope, as_instant, directory_ctes, fetch


def whole_months(start: datetime, end: datetime) -> int:
    """Complete calendar months from ``start`` to ``end`` (0 when ``end`` is not later)."""
    months = (end.year - start.year) * 12 + end.month - start.month
    if (end.day, end.time()) < (start.day, start.time()):
        months -= 1
    return max(0, months)


def _rows(found: list[tuple[Any, ...]], key: str, now: datetime) -> list[dict[str, Any]]:
    rows = []
    for entity, last, revs in found:
        at = as_instant(last)
        rows.append(
            {
                key: entity,
                "last_change_at": at.isoformat(),
                "age_months": whole_months(at, now),
                "revs": int(revs),
            }
        )
    rows.sort(key=lambda r: (-r["age_months"], r["last_change_at"], r[key]))
    return rows


def file_age(scope: Scope) -> list[dict[str, Any]]:
    """Every file of the window: its last change, age in months and revisions; oldest first."""
    head, params = file_parts(scope)
    found = fetch(f"WITH {head} SELECT path, MAX(at), SUM(revs) FROM parts GROUP BY path", params)  # noqa: S608
    return _rows(found, "path", scope.window.reference())


def directory_age(scope: Scope, *, depth: int = 1) -> list[dict[str, Any]]:
    """Per directory: the last change of any of its files, its age, and its changes
    (distinct commits); oldest first."""
    parts = dir_parts(scope, depth)
    if parts is not None:  # docs/analytics.md#performance
        found = fetch(
            f"WITH {parts.sql} SELECT dir, MAX(at), SUM(revs) FROM dparts GROUP BY dir",  # noqa: S608
            parts.params,
        )
        return _rows(found, "directory", scope.window.reference())
    head, params = scope.rows_cte()
    dirs, name = directory_ctes("scoped", depth, ("rev", "path", "at"))
    found = fetch(
        f"WITH {head}, {dirs} SELECT dir, MAX(at), COUNT(DISTINCT rev) FROM {name} GROUP BY dir",  # noqa: S608
        params,
    )
    return _rows(found, "directory", scope.window.reference())
