"""Hotspots inside a window, with their trend (docs/analytics.md#hotspots): the files and
directories changed by the most non-merge commits of the window, with their churn and
authors. The trend compares the second half of the window with the first: ``recent`` and
``earlier`` revisions, and ``rising``, ``falling`` or ``steady``. An unbounded window
starts at the repository's first stored commit and ends now."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import connection

from dashboard.analytics.aggregates import file_parts
from dashboard.analytics.dir_aggregates import dir_parts
from dashboard.analytics.rows import Scope, as_instant, directory_ctes, fetch
from dashboard.models import Commit


def midpoint(scope: Scope) -> datetime | None:
    """The instant splitting the window in two halves; None when it holds no commit."""
    start = scope.window.start
    if start is None:
        where, params = scope.commit_filter()
        sql = f"SELECT MIN(c.committed_at) FROM {Commit._meta.db_table} c WHERE {where}"  # noqa: S608
        (first,) = fetch(sql, params)[0]
        if first is None:
            return None
        start = as_instant(first)
    end = scope.window.reference()
    return (start + (end - start) / 2).replace(microsecond=0)


def _trend(recent: int, earlier: int) -> str:
    return "rising" if recent > earlier else "falling" if recent < earlier else "steady"


def _rows(found: list[tuple[Any, ...]], key: str) -> list[dict[str, Any]]:
    return [
        {
            key: entity,
            "revs": int(revs),
            "churn": int(churn or 0),
            "authors": int(authors),
            "recent": int(recent),
            "earlier": int(revs) - int(recent),
            "trend": _trend(int(recent), int(revs) - int(recent)),
        }
        for entity, revs, churn, authors, recent in found
    ]


def file_hotspots(scope: Scope, *, limit: int = 50) -> list[dict[str, Any]]:
    """The most changed files of the window (revisions, then churn, then path)."""
    mid = midpoint(scope)
    if mid is None:
        return []
    head, params = file_parts(scope, mid)
    if connection.vendor == "postgresql":
        # Summed per path and author first, then per path: the authors are the groups
        # of the first step, so no COUNT(DISTINCT …) sorts every row (PostgreSQL hashes
        # both steps; SQLite groups through a temporary B-tree either way, and the one
        # step with COUNT(DISTINCT …) is the faster there, docs/analytics.md#performance).
        sql = (
            f"WITH {head}, by_author AS (SELECT path, SUM(revs) AS revs, "  # noqa: S608
            "SUM(churn) AS churn, SUM(recent) AS recent FROM parts GROUP BY path, author) "
            "SELECT path, SUM(revs), SUM(churn), COUNT(*), SUM(recent) FROM by_author "
            "GROUP BY path ORDER BY SUM(revs) DESC, SUM(churn) DESC, path LIMIT %s"
        )
    else:
        sql = (
            f"WITH {head} SELECT path, SUM(revs), SUM(churn), COUNT(DISTINCT author), "  # noqa: S608
            "SUM(recent) FROM parts GROUP BY path "
            "ORDER BY SUM(revs) DESC, SUM(churn) DESC, path LIMIT %s"
        )
    found = fetch(sql, [*params, limit])
    return _rows(found, "path")


def directory_hotspots(scope: Scope, *, depth: int = 1, limit: int = 50) -> list[dict[str, Any]]:
    """The most changed directories of the window: revisions are distinct commits that
    changed any file in the directory; churn sums its files' lines."""
    mid = midpoint(scope)
    if mid is None:
        return []
    parts = dir_parts(scope, depth, mid)
    if parts is not None:  # docs/analytics.md#performance
        found = fetch(
            f"WITH {parts.sql} SELECT dir, SUM(revs), SUM(churn), COUNT(DISTINCT author), "  # noqa: S608
            "SUM(recent) FROM dparts GROUP BY dir "
            "ORDER BY SUM(revs) DESC, SUM(churn) DESC, dir LIMIT %s",
            [*parts.params, limit],
        )
        return _rows(found, "directory")
    head, params = scope.rows_cte()
    dirs, name = directory_ctes(
        "scoped", depth, ("rev", "path", "added", "deleted", "author", "at")
    )
    found = fetch(
        f"WITH {head}, {dirs} SELECT dir, COUNT(DISTINCT rev), SUM(added + deleted), "  # noqa: S608
        "COUNT(DISTINCT author), COUNT(DISTINCT CASE WHEN at >= %s THEN rev END) "
        f"FROM {name} GROUP BY dir ORDER BY COUNT(DISTINCT rev) DESC, "
        "SUM(added + deleted) DESC, dir LIMIT %s",
        [*params, connection.ops.adapt_datetimefield_value(mid), limit],
    )
    return _rows(found, "directory")
