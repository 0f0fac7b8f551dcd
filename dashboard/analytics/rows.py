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
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.db import connection
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from dashboard.analytics.lenses import Lens
from dashboard.analytics.window import Window
from dashboard.models import CoAuthor, Commit, FileChange, Repository
from dashboard.repositories import current_fingerprint

#: Directory roll-ups go at most this deep (``depth`` of the API, pages and CLI).
MAX_DEPTH = 6


@dataclass(frozen=True)
class Scope:
    """One repository's stored rows under one fingerprint inside a window, seen through
    a lens (docs/analytics.md#lenses: what is left out, and the identity map)."""

    repo: Repository
    fingerprint: str
    window: Window
    lens: Lens = field(default_factory=Lens)
    #: Read whole months from the per-month aggregates (docs/analytics.md#performance);
    #: False reads every row as stored (the tests compare the two).
    aggregates: bool = True

    @classmethod
    def of(
        cls,
        repo: Repository,
        window: Window,
        fingerprint: str | None = None,
        lens: Lens | None = None,
    ) -> Scope:
        return cls(repo, fingerprint or current_fingerprint(), window, lens or Lens())

    def within(self, window: Window) -> Scope:
        """The same repository, fingerprint and lens over another window."""
        return Scope(self.repo, self.fingerprint, window, self.lens, self.aggregates)

    def author(self, alias: str = "c") -> str:
        """The SQL of a commit's credited author: its canonical e-mail through the
        identity map (no parameters)."""
        return self.lens.person_sql(f"{alias}.author_canonical_email")

    def file_filter(self, alias: str = "f") -> tuple[str, list[Any]]:
        """`` AND <the file row is not left out>`` (empty without a path lens)."""
        if not self.lens.excludes_paths:
            return "", []
        sql, params = self.lens.excluded_sql(f"{alias}.path")
        return f" AND NOT {sql}", params

    def commit_filter(self, alias: str = "c") -> tuple[str, list[Any]]:
        """The WHERE of this scope's commits (the page index serves it: repository,
        fingerprint, committed_at). With the ``bots`` lens a bot's commit is left out;
        with a path lens, a commit none of whose files is left in (as ``git log --
        <pathspec>`` drops it)."""
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
        if "bots" in self.lens.exclude:
            where.append(
                "NOT "
                + self.lens.bot_sql(
                    f"{alias}.author_canonical_name", f"{alias}.author_canonical_email"
                )
            )
        if self.lens.excludes_paths:
            kept, kept_params = self.file_filter("lf")
            where.append(
                f"EXISTS (SELECT 1 FROM {FileChange._meta.db_table} lf "  # noqa: S608
                f"WHERE lf.commit_id = {alias}.id{kept})"
            )
            params += kept_params
        return " AND ".join(where), params

    def rows_cte(self) -> tuple[str, list[Any]]:
        """``scoped(rev, path, added, deleted, author, at)``: a CTE body (without WITH)."""
        where, params = self.commit_filter()
        files, file_params = self.file_filter()
        sql = (
            "scoped AS (SELECT f.commit_id AS rev, f.path AS path, f.added AS added, "  # noqa: S608
            f"f.deleted AS deleted, {self.author()} AS author, c.committed_at AS at "
            f"FROM {Commit._meta.db_table} c JOIN {FileChange._meta.db_table} f "
            f"ON f.commit_id = c.id WHERE {where}{files})"
        )
        return sql, [*params, *file_params]

    def commits_cte(self) -> tuple[str, list[Any]]:
        """``commits(id, author, name, at, ins, del, files)``: the scope's commits with
        their lines and files, counted over the file rows left in when a path lens
        leaves some out (else as stored)."""
        where, params = self.commit_filter()
        if not self.lens.excludes_paths:
            sql = (
                f"commits AS (SELECT c.id AS id, {self.author()} AS author, "  # noqa: S608
                "c.author_canonical_name AS name, c.committed_at AS at, c.insertions AS ins, "
                "c.deletions AS del, c.files_changed AS files "
                f"FROM {Commit._meta.db_table} c WHERE {where})"
            )
            return sql, params
        files, file_params = self.file_filter()
        sql = (
            f"commits AS (SELECT c.id AS id, MAX({self.author()}) AS author, "  # noqa: S608
            "MAX(c.author_canonical_name) AS name, MAX(c.committed_at) AS at, "
            "SUM(f.added) AS ins, SUM(f.deleted) AS del, COUNT(*) AS files "
            f"FROM {Commit._meta.db_table} c JOIN {FileChange._meta.db_table} f "
            f"ON f.commit_id = c.id WHERE {where}{files} GROUP BY c.id)"
        )
        return sql, [*params, *file_params]

    def credits_cte(self) -> tuple[str, list[Any]]:
        """``credits(rev, person)``: who is credited with each of the scope's commits
        (docs/analytics.md#co-authors): its author and each ``Co-authored-by:`` co-author,
        through the identity map, once each (UNION drops the author named again as a
        co-author); the ``bots`` lens credits no bot co-author."""
        where, params = self.commit_filter()
        co = self.lens.person_sql("co.email")
        bots = ""
        if "bots" in self.lens.exclude:
            bots = " AND NOT " + self.lens.bot_sql("co.name", "co.email")
        sql = (
            f"credits AS (SELECT c.id AS rev, {self.author()} AS person "  # noqa: S608
            f"FROM {Commit._meta.db_table} c WHERE {where} UNION "
            f"SELECT co.commit_id AS rev, {co} AS person FROM {CoAuthor._meta.db_table} co "
            f"JOIN {Commit._meta.db_table} c ON c.id = co.commit_id WHERE {where}{bots})"
        )
        return sql, [*params, *params]


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
    """Each credited identity of the scope's commits (authors through the identity map,
    and co-authors) and its name: an author's (mailmap) name, else a co-author's."""
    where, params = scope.commit_filter()
    sql = (
        f"SELECT {scope.author()}, MAX(c.author_canonical_name) "  # noqa: S608
        f"FROM {Commit._meta.db_table} c WHERE {where} GROUP BY {scope.author()}"
    )
    names = {email: name for email, name in fetch(sql, params)}
    co = scope.lens.person_sql("co.email")
    sql = (
        f"SELECT {co}, MAX(co.name) FROM {CoAuthor._meta.db_table} co "  # noqa: S608
        f"JOIN {Commit._meta.db_table} c ON c.id = co.commit_id WHERE {where} GROUP BY {co}"
    )
    for email, name in fetch(sql, params):
        names.setdefault(email, name or email)
    return names


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
