"""Bulk export of a repository's stored rows (docs/analytics.md#export): every commit, or
every file change row, of the served fingerprint inside a window and through the lenses,
as CSV or NDJSON, for one repository or several; and any report table as NDJSON.

The rows are read in batches of ``BATCH`` by keyset pagination on the primary key
(``id > last ORDER BY id LIMIT BATCH``), each batch its own short query, and written as
they are read: the memory an export holds is one batch, whatever the number of rows
(docs/analytics.md#export measures it). No transaction is held open between batches.

The SQL is put together from table names and the lens's SQL (hence ``noqa: S608``);
every value is a query parameter."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import connection

from dashboard.analytics.lenses import Lens, build_lens, is_bot
from dashboard.analytics.reports import BadParameter, parse_params
from dashboard.analytics.rows import as_instant
from dashboard.analytics.window import Window
from dashboard.models import CoAuthor, Commit, FileChange, Repository
from dashboard.repositories import current_fingerprint

__all__ = [
    "BATCH",
    "EXPORT_COLUMNS",
    "FORMATS",
    "MAX_REPOSITORIES",
    "WHATS",
    "Export",
    "content_type",
    "export_lines",
    "export_rows",
    "ndjson_lines",
    "parse_export",
    "parse_repository_ids",
]

#: What can be exported, and how.
WHATS = ("commits", "files")
FORMATS = ("csv", "ndjson")

#: Rows per query: each batch is one indexed range read of the primary key.
BATCH = 2000

#: Repositories one export may name (``repos=1,2,3``).
MAX_REPOSITORIES = 100

#: The columns of each export, in order (the CSV header; the NDJSON keys).
EXPORT_COLUMNS: dict[str, tuple[str, ...]] = {
    "commits": (
        "repository",
        "name",
        "sha",
        "author_name",
        "author_email",
        "committed_at",
        "insertions",
        "deletions",
        "files",
        "merge",
        "co_authors",
    ),
    "files": ("repository", "name", "sha", "path", "added", "deleted", "binary"),
}


@dataclass(frozen=True)
class Export:
    """What to export (``commits`` or ``files``), in which format, over which window,
    leaving out which lenses (docs/analytics.md#lenses)."""

    what: str = "commits"
    format: str = "csv"
    window: Window = field(default_factory=Window)
    exclude: frozenset[str] = frozenset()

    def filename(self, repos: Sequence[Repository]) -> str:
        """The download's name: the repository's for one, else ``gitward``."""
        stem = repos[0].name if len(repos) == 1 else "gitward"
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in stem)[:100]
        return f"{safe or 'repository'}-{self.what}.{self.format}"


def parse_export(values: Mapping[str, Any]) -> Export:
    """An ``Export`` from a query dict or a command's options: ``what`` (required),
    ``format`` (default csv), and the window and lenses as every analysis reads them
    (``BadParameter`` names the first one that is wrong)."""
    what = str(values.get("what") or "").strip()
    if what not in WHATS:
        raise BadParameter(f"what must be one of {', '.join(WHATS)}")
    fmt = str(values.get("format") or "csv").strip()
    if fmt not in FORMATS:
        raise BadParameter(f"format must be one of {', '.join(FORMATS)}")
    params = parse_params(
        {k: values.get(k) for k in ("since", "until", "last", "exclude") if k in values}
    )
    return Export(what=what, format=fmt, window=params.window, exclude=params.exclude)


def parse_repository_ids(raw: str | None) -> list[int]:
    """``repos=1,2,3``: distinct ids in the order given (``BadParameter`` otherwise)."""
    items = [p.strip() for p in (raw or "").split(",") if p.strip()]
    if not items:
        raise BadParameter("repos must be a comma-separated list of repository ids")
    ids: list[int] = []
    for item in items[: MAX_REPOSITORIES + 1]:
        if not item.isdigit() or not 1 <= int(item) <= 2**63 - 1:
            raise BadParameter(f"repos: {item[:30]!r} is not a repository id")
        if int(item) not in ids:
            ids.append(int(item))
    if len(ids) > MAX_REPOSITORIES or len(items) > MAX_REPOSITORIES:
        raise BadParameter(f"repos: at most {MAX_REPOSITORIES} repositories")
    return ids


def content_type(fmt: str) -> str:
    return "text/csv; charset=utf-8" if fmt == "csv" else "application/x-ndjson; charset=utf-8"


# ------------------------------------------------------------------------------ reading


def _commit_where(
    repo: Repository, fingerprint: str, window: Window, lens: Lens, *, merges: bool
) -> tuple[str, list[Any]]:
    """The WHERE of the exported commits (alias ``c``): the repository and fingerprint,
    the window on the committer date, without merges unless ``merges``, without a bot's
    commit under the ``bots`` lens; the path lenses are applied by the callers."""
    ops = connection.ops
    where = [f"{_sqlite_no_index('c.repository_id')} = %s", "c.fingerprint = %s"]
    params: list[Any] = [repo.pk, fingerprint]
    if not merges:
        where.append("c.is_merge = %s")
        params.append(False)
    if window.start is not None:
        where.append("c.committed_at >= %s")
        params.append(ops.adapt_datetimefield_value(window.start))
    if window.end is not None:
        where.append("c.committed_at < %s")
        params.append(ops.adapt_datetimefield_value(window.end))
    if "bots" in lens.exclude:
        where.append("NOT " + lens.bot_sql("c.author_canonical_name", "c.author_canonical_email"))
    return " AND ".join(where), params


def _file_filter(lens: Lens) -> tuple[str, list[Any]]:
    """`` AND <the file row f is not left out>`` (empty without a path lens)."""
    if not lens.excludes_paths:
        return "", []
    sql, params = lens.excluded_sql("f.path")
    return f" AND NOT {sql}", params


def _fetch(sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, list(params))
        return list(cursor.fetchall())


def _last_id(model: type[Commit] | type[FileChange]) -> int:
    """The highest id now: the export reads no row written after it started."""
    found = _fetch(f"SELECT MAX(id) FROM {model._meta.db_table}", [])  # noqa: S608
    return int(found[0][0] or 0)


def _sqlite_no_index(column: str) -> str:
    """``column`` such that SQLite will not drive the batch query from an index on it
    (its unary ``+``), so the primary key's range drives it and ``ORDER BY id LIMIT``
    stops after one batch instead of sorting all the repository's rows each time.
    PostgreSQL's planner costs the LIMIT and needs no hint."""
    return f"+{column}" if connection.vendor == "sqlite" else column


def _commit_rows(repo: Repository, fingerprint: str, export: Export, lens: Lens) -> Iterator[tuple]:
    """Every exported commit as a tuple of ``EXPORT_COLUMNS["commits"]``, in id order. Merges are
    included (``merge`` says which); their lines are their first-parent diff's, as stored.
    With a path lens, a commit none of whose files is left in is left out, and its lines
    and files are counted over the file rows left in (as the reports count them)."""
    where, params = _commit_where(repo, fingerprint, export.window, lens, merges=True)
    files_sql, file_params = _file_filter(lens)
    c_table, f_table = Commit._meta.db_table, FileChange._meta.db_table
    co_table = CoAuthor._meta.db_table
    if lens.excludes_paths:
        where += f" AND EXISTS (SELECT 1 FROM {f_table} f WHERE f.commit_id = c.id{files_sql})"  # noqa: S608
        params = [*params, *file_params]
    sql = (
        "SELECT c.id, c.sha, c.author_canonical_name, c.author_canonical_email, "  # noqa: S608
        "c.committed_at, c.insertions, c.deletions, c.files_changed, c.is_merge "
        f"FROM {c_table} c WHERE {where} AND c.id > %s AND c.id <= %s ORDER BY c.id LIMIT {BATCH:d}"
    )
    # Race: chunks may be written or deleted (a rewrite) while the export runs. Rows
    # written after it started are past ``ceiling`` and left out; each batch starts after
    # the last id read, so no row is read twice; a row a rewrite deletes before its batch
    # is read is not exported (docs/analytics.md#export: an export is not a snapshot).
    ceiling = _last_id(Commit)
    last = 0
    while True:
        batch = _fetch(sql, [*params, last, ceiling])
        if not batch:
            return
        lo, hi = batch[0][0], batch[-1][0]
        ids = {row[0] for row in batch}
        co_authors: dict[int, list[str]] = {}
        for commit_id, name, email in _fetch(
            f"SELECT co.commit_id, co.name, co.email FROM {co_table} co "  # noqa: S608
            "WHERE co.commit_id >= %s AND co.commit_id <= %s ORDER BY co.id",
            [lo, hi],
        ):
            if commit_id not in ids:
                continue
            if "bots" in lens.exclude and is_bot(name, email, lens.bot_patterns):
                continue
            co_authors.setdefault(commit_id, []).append(f"{name} <{email}>")
        counted: dict[int, tuple[int, int, int]] = {}
        if lens.excludes_paths:
            for commit_id, added, deleted, n in _fetch(
                f"SELECT f.commit_id, SUM(f.added), SUM(f.deleted), COUNT(*) FROM {f_table} f "  # noqa: S608
                f"WHERE f.commit_id >= %s AND f.commit_id <= %s{files_sql} GROUP BY f.commit_id",
                [lo, hi, *file_params],
            ):
                counted[commit_id] = (int(added or 0), int(deleted or 0), int(n))
        for cid, sha, name, email, at, ins, dels, files, merge in batch:
            if cid in counted:
                ins, dels, files = counted[cid]
            yield (
                repo.pk,
                repo.name,
                sha,
                name,
                email,
                as_instant(at).isoformat(),
                ins,
                dels,
                files,
                bool(merge),
                co_authors.get(cid, []),
            )
        last = hi
        if len(batch) < BATCH:
            return


def _file_rows(repo: Repository, fingerprint: str, export: Export, lens: Lens) -> Iterator[tuple]:
    """Every exported file change row as a tuple of ``EXPORT_COLUMNS["files"]``, in id order:
    the files of the non-merge commits (docs/analytics.md#what-is-counted: ``git log
    --numstat`` prints none for a merge), through the window and the lenses."""
    where, params = _commit_where(repo, fingerprint, export.window, lens, merges=False)
    files_sql, file_params = _file_filter(lens)
    c_table, f_table = Commit._meta.db_table, FileChange._meta.db_table
    # CROSS JOIN keeps the file rows as SQLite's outer loop (the primary key range drives
    # it, see _sqlite_no_index); PostgreSQL plans it as the inner join it is.
    sql = (
        "SELECT f.id, c.sha, f.path, f.added, f.deleted, f.binary "  # noqa: S608
        f"FROM {f_table} f CROSS JOIN {c_table} c WHERE c.id = f.commit_id "
        f"AND {_sqlite_no_index('f.repository_id')} = %s "
        f"AND {_sqlite_no_index('f.fingerprint')} = %s AND {where}{files_sql} "
        f"AND f.id > %s AND f.id <= %s ORDER BY f.id LIMIT {BATCH:d}"
    )
    params = [repo.pk, fingerprint, *params, *file_params]
    # Race: as for the commits (_commit_rows): nothing past the ceiling, nothing twice.
    ceiling = _last_id(FileChange)
    last = 0
    while True:
        batch = _fetch(sql, [*params, last, ceiling])
        if not batch:
            return
        for _fid, sha, path, added, deleted, binary in batch:
            yield (repo.pk, repo.name, sha, path, added, deleted, bool(binary))
        last = batch[-1][0]
        if len(batch) < BATCH:
            return


def export_rows(repos: Iterable[Repository], export: Export) -> Iterator[tuple]:
    """The export's rows (tuples of ``EXPORT_COLUMNS[export.what]``), repository by repository in
    the order given, each through its own lens (the ``.gitattributes`` at its head)."""
    fingerprint = current_fingerprint()
    for repo in repos:
        lens = build_lens(export.exclude, repo, fingerprint)
        if export.what == "commits":
            yield from _commit_rows(repo, fingerprint, export, lens)
        else:
            yield from _file_rows(repo, fingerprint, export, lens)


# ------------------------------------------------------------------------------ writing


def _batched(rows: Iterator[tuple], size: int) -> Iterator[list[tuple]]:
    batch: list[tuple] = []
    for row in rows:
        batch.append(row)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def export_lines(repos: Sequence[Repository], export: Export) -> Iterator[str]:
    """The export as text, one chunk per batch of rows: CSV (a header, then a line per
    row; co-authors as ``Name <email>`` joined by ``; ``) or NDJSON (a JSON object per
    line, co-authors a list)."""
    columns = EXPORT_COLUMNS[export.what]
    rows = export_rows(repos, export)
    if export.format == "ndjson":
        dumps = json.JSONEncoder(ensure_ascii=False).encode
        for batch in _batched(rows, BATCH):
            yield "".join(dumps(dict(zip(columns, row, strict=True))) + "\n" for row in batch)
        return
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)
    yield buffer.getvalue()
    lists = export.what == "commits"
    for batch in _batched(rows, BATCH):
        buffer.seek(0)
        buffer.truncate()
        if lists:
            batch = [(*row[:-1], "; ".join(row[-1])) for row in batch]
        writer.writerows(batch)
        yield buffer.getvalue()


def ndjson_lines(rows: Iterable[Mapping[str, Any]]) -> Iterator[str]:
    """A report table (``analytics.tables``) as NDJSON: one JSON object per line."""
    for row in rows:
        yield json.dumps(row, ensure_ascii=False, default=str) + "\n"
