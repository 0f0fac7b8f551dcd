"""The rows every analysis starts from (docs/analytics.md#what-is-counted): one per file of
each non-merge commit stored for a repository under one analyzer fingerprint (by default
the served one) inside a window, as SQL common table expressions the analyses extend; and
the directory of a path at a depth, computed in SQL on SQLite and PostgreSQL alike.

Merges are left out: ``git log --numstat`` prints no diff for them, and their stored
first-parent diff repeats the side branch's changes, which would count every file of a
merged branch twice.

The SQL of this package is put together from constants, table names and the CTE names
here (hence its ``noqa: S608``); every value (repository, fingerprint, dates, paths,
thresholds) is a query parameter."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db import connection
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from dashboard.analytics.window import Window
from dashboard.models import Commit, FileChange, Repository
from dashboard.repositories import current_fingerprint

#: Directory roll-ups go at most this deep (``depth`` of the API, pages and CLI).
MAX_DEPTH = 6


@dataclass(frozen=True)
class Scope:
    """One repository's stored rows under one fingerprint inside a window."""

    repo: Repository
    fingerprint: str
    window: Window

    @classmethod
    def of(cls, repo: Repository, window: Window, fingerprint: str | None = None) -> Scope:
        return cls(repo, fingerprint or current_fingerprint(), window)

    def commit_filter(self, alias: str = "c") -> tuple[str, list[Any]]:
        """The WHERE of this scope's commits (the page index serves it: repository,
        fingerprint, committed_at)."""
        ops = connection.ops
        where = [
            f"{alias}.repository_id = %s",
            f"{alias}.fingerprint = %s",
            f"{alias}.is_merge = %s",
        ]
        params: list[Any] = [self.repo.pk, self.fingerprint, False]
        if self.window.start is not None:
            where.append(f"{alias}.committed_at >= %s")
            params.append(ops.adapt_datetimefield_value(self.window.start))
        if self.window.end is not None:
            where.append(f"{alias}.committed_at < %s")
            params.append(ops.adapt_datetimefield_value(self.window.end))
        return " AND ".join(where), params

    def rows_cte(self) -> tuple[str, list[Any]]:
        """``scoped(rev, path, added, deleted, author, at)``: a CTE body (without WITH)."""
        where, params = self.commit_filter()
        sql = (
            "scoped AS (SELECT f.commit_id AS rev, f.path AS path, f.added AS added, "  # noqa: S608
            "f.deleted AS deleted, c.author_canonical_email AS author, c.committed_at AS at "
            f"FROM {Commit._meta.db_table} c JOIN {FileChange._meta.db_table} f "
            f"ON f.commit_id = c.id WHERE {where})"
        )
        return sql, params


def directory_ctes(source: str, depth: int, columns: Sequence[str]) -> tuple[str, str]:
    """CTE bodies adding ``dir`` (the path's first ``depth`` directories; "." for a file
    at the root) to ``source``'s ``columns`` (which include ``path``); returns the bodies
    and the last CTE's name. Each step finds the next "/" after the previous one, so the
    SQL grows linearly with the depth (``instr`` on SQLite, ``strpos`` on PostgreSQL)."""
    if not 1 <= depth <= MAX_DEPTH:
        raise ValueError(f"depth must be between 1 and {MAX_DEPTH}")
    find = "instr" if connection.vendor == "sqlite" else "strpos"
    cols = ", ".join(columns)
    parts = [f"d1 AS (SELECT {cols}, {find}(path, '/') AS p1 FROM {source})"]  # noqa: S608
    carried = [*columns, "p1"]
    for k in range(2, depth + 1):
        prev = f"p{k - 1}"
        nxt = f"{find}(substr(path, {prev} + 1), '/')"
        parts.append(
            f"d{k} AS (SELECT {', '.join(carried)}, CASE WHEN {prev} > 0 AND {nxt} > 0 "  # noqa: S608
            f"THEN {prev} + {nxt} ELSE 0 END AS p{k} FROM d{k - 1})"
        )
        carried.append(f"p{k}")
    cases = " ".join(f"WHEN p{k} > 0 THEN substr(path, 1, p{k} - 1)" for k in range(depth, 0, -1))
    parts.append(f"dirs AS (SELECT {cols}, CASE {cases} ELSE '.' END AS dir FROM d{depth})")  # noqa: S608
    return ", ".join(parts), "dirs"


def directory_of(path: str, depth: int) -> str:
    """What ``directory_ctes`` computes in SQL, for one path (the tests and the pages'
    links use it)."""
    parts = path.split("/")[:-1][:depth]
    return "/".join(parts) if parts else "."


def fetch(sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, list(params))
        return list(cursor.fetchall())


def author_names(scope: Scope) -> dict[str, str]:
    """Each canonical author email of the scope's commits and its (mailmap) name."""
    where, params = scope.commit_filter()
    sql = (
        f"SELECT c.author_canonical_email, MAX(c.author_canonical_name) "  # noqa: S608
        f"FROM {Commit._meta.db_table} c WHERE {where} GROUP BY c.author_canonical_email"
    )
    return {email: name for email, name in fetch(sql, params)}


def as_instant(value: Any) -> datetime:
    """A timestamp read back from an aggregate (SQLite answers ``MAX(committed_at)`` as
    text, PostgreSQL as a datetime), as an aware UTC datetime."""
    if isinstance(value, str):
        parsed = parse_datetime(value)
        if parsed is None:
            raise ValueError(f"not a timestamp: {value!r}")
        value = parsed
    if timezone.is_naive(value):
        value = timezone.make_aware(value, UTC)
    return value.astimezone(UTC)
