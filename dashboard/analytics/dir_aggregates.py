"""Per-month aggregates per directory (docs/analytics.md#performance): the directory
hotspots, age and ownership read the whole UTC calendar months and years of their window
from ``DirAggregate`` rows (per month or year, depth, directory and author: the distinct
commits that changed a file in the directory, their lines and the last one) and the
rest from the stored rows, as the file views do with ``MonthAggregate``
(``dashboard/analytics/aggregates.py``: same ``split``, same month stamps).

A directory's revisions are distinct commits, which sums of per-path rows cannot give;
per author they can be summed again (a commit has one author, and one month or year),
so the rows here are the distinct commits per directory *and author*. They are current
while ``MonthStamp.dir_aggregated`` (a year's ``dir_year_aggregated``, on its January)
is the version they were computed at: the same versions the fenced write and the
rewrite prune bump, with records of their own beside the file aggregates'.

A path lens is not applied to these rows (a directory's distinct commits cannot be
recounted without a left-out file): with any path lens the views read every stored row
(``parts`` returns None). The ``bots`` lens and the identity map apply as to the file
aggregates: by the author's canonical name and e-mail."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any

from django.db import connection

from dashboard.analytics.aggregates import (
    ANALYZE_AFTER,
    Split,
    _months,
    compute_month,
    compute_stale,
    compute_year,
    current_months,
    current_years,
    next_month,
    next_year,
    settle,
    split,
)
from dashboard.analytics.rows import MAX_DEPTH, Scope, fetch
from dashboard.analytics.window import Window
from dashboard.models import CoAuthor, Commit, DirAggregate, FileChange

__all__ = [
    "DirParts",
    "co_credits",
    "dir_names",
    "dir_parts",
    "ensure_dir_months",
    "ensure_dir_years",
]


def _midnight(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


def _positions(source: str, columns: tuple[str, ...], depth: int) -> tuple[str, str]:
    """CTE bodies adding ``p1`` … ``p{depth}`` (the position of the path's k-th "/", 0
    when it has fewer) to ``source``'s ``columns``; returns them and the last CTE's name.
    As ``rows.directory_ctes``, but each step is ``MATERIALIZED``: inlined, every step
    would repeat the previous one's expression three times, and the SQL (and its cost)
    would grow as 3^depth (measured: 0.1 s at depth 1, 0.8 s at depth 6 for a month of
    22,000 file rows on SQLite)."""
    find = "instr" if connection.vendor == "sqlite" else "strpos"
    cols = ", ".join(columns)
    parts = [f"q1 AS MATERIALIZED (SELECT {cols}, {find}(path, '/') AS p1 FROM {source})"]  # noqa: S608
    carried = [*columns, "p1"]
    for k in range(2, depth + 1):
        prev = f"p{k - 1}"
        nxt = f"{find}(substr(path, {prev} + 1), '/')"
        parts.append(
            f"q{k} AS MATERIALIZED (SELECT {', '.join(carried)}, CASE WHEN {prev} > 0 "  # noqa: S608
            f"AND {nxt} > 0 THEN {prev} + {nxt} ELSE 0 END AS p{k} FROM q{k - 1})"
        )
        carried.append(f"p{k}")
    return ", ".join(parts), f"q{depth}"


def _dir_at(depth: int) -> str:
    """The SQL of the directory at ``depth`` over the columns of ``_positions``: as
    ``rows.directory_ctes`` computes it ("." for a file at the root)."""
    cases = " ".join(f"WHEN p{k} > 0 THEN substr(path, 1, p{k} - 1)" for k in range(depth, 0, -1))
    return f"CASE {cases} ELSE '.' END"


def _compute_month(scope: Scope, month: date) -> None:
    """Compute one month's directory aggregates from its stored rows, unless current.
    Race: ``aggregates.lock_months``."""
    compute_month(
        scope, month, "dir_aggregated", lambda: _replace(scope, 1, month, next_month(month))
    )


def _compute_year(scope: Scope, january: date) -> None:
    """Compute one calendar year's directory aggregates, unless current (the sum of its
    month versions is the one recorded on its January's ``dir_year_aggregated``).
    Race: ``aggregates.lock_months``."""
    compute_year(
        scope,
        january,
        "dir_year_aggregated",
        lambda: _replace(scope, 12, january, next_year(january)),
    )


def _replace(scope: Scope, span: int, first: date, after: date) -> None:
    """Replace the directory aggregates of ``span`` starting at ``first`` with those of
    the stored rows from ``first`` to ``after``: every depth, and depth 0 (each author's
    commits, for their names). The caller holds the stamp rows' lock."""
    ops = connection.ops
    aggs = ops.quote_name(DirAggregate._meta.db_table)
    cols = (
        "repository_id, fingerprint, span, month, depth, dir, author_canonical_email, "
        "author_canonical_name, revisions, added, deleted, last_at"
    )
    head = [scope.repo.pk, scope.fingerprint, span, ops.adapt_datefield_value(first)]
    where = [
        scope.repo.pk,
        scope.fingerprint,
        False,
        ops.adapt_datetimefield_value(_midnight(first)),
        ops.adapt_datetimefield_value(_midnight(after)),
    ]
    commits = (
        "c.repository_id = %s AND c.fingerprint = %s AND c.is_merge = %s "
        "AND c.committed_at >= %s AND c.committed_at < %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(
            f"DELETE FROM {aggs} WHERE repository_id = %s AND fingerprint = %s "  # noqa: S608
            "AND span = %s AND month = %s",
            head,
        )
        cursor.execute(
            f"INSERT INTO {aggs} ({cols}) SELECT %s, %s, %s, %s, 0, '', "  # noqa: S608
            "c.author_canonical_email, c.author_canonical_name, COUNT(*), 0, 0, "
            f"MAX(c.committed_at) FROM {Commit._meta.db_table} c WHERE {commits} "
            "GROUP BY c.author_canonical_email, c.author_canonical_name",
            [*head, *where],
        )
        rows = (
            "src AS (SELECT f.commit_id AS rev, f.path AS path, f.added AS added, "  # noqa: S608
            "f.deleted AS deleted, c.author_canonical_email AS email, "
            "c.author_canonical_name AS name, c.committed_at AS at "
            f"FROM {Commit._meta.db_table} c JOIN {FileChange._meta.db_table} f "
            f"ON f.commit_id = c.id WHERE {commits})"
        )
        chain, last = _positions(
            "src", ("rev", "path", "added", "deleted", "email", "name", "at"), MAX_DEPTH
        )
        groups = " UNION ALL ".join(
            f"SELECT {depth} AS depth, {_dir_at(depth)} AS dir, email, name, "  # noqa: S608
            "COUNT(DISTINCT rev) AS revs, SUM(added) AS added, SUM(deleted) AS deleted, "
            f"MAX(at) AS at FROM {last} GROUP BY {_dir_at(depth)}, email, name"
            for depth in range(1, MAX_DEPTH + 1)
        )
        cursor.execute(
            f"WITH {rows}, {chain} INSERT INTO {aggs} ({cols}) "  # noqa: S608
            "SELECT %s, %s, %s, %s, depth, dir, email, name, revs, added, deleted, at "
            f"FROM ({groups}) g",
            [*where, *head],
        )


def ensure_dir_years(
    scope: Scope, years: tuple[date, ...], busy: list[date] | None = None, *, skip: bool = False
) -> int:
    """Make the directory aggregates of every year of ``years`` current; returns how
    many years were computed. Busy years as ``aggregates.ensure_years``
    (``compute_stale``, docs/analytics.md#performance)."""
    if not years:
        return 0
    current = current_years(scope, years, "dir_year_aggregated")
    stale = [january for january in years if january not in current]
    return compute_stale(stale, lambda january: _compute_year(scope, january), busy, skip=skip)


def ensure_dir_months(
    scope: Scope, runs: tuple[tuple[date, date], ...], busy: list[date] | None = None
) -> int:
    """Make the directory aggregates of every month of ``runs`` current; returns how
    many months were computed (each in its own short transaction). Busy months as
    ``aggregates.ensure_months`` (``compute_stale``)."""
    if not runs:
        return 0
    months = _months(runs)
    current = current_months(scope, months, "dir_aggregated")
    stale = [m for m in months if m not in current]
    return compute_stale(stale, lambda month: _compute_month(scope, month), busy)


@dataclass(frozen=True)
class DirParts:
    """What :func:`dir_parts` gives: a CTE body ``dparts(dir, author, revs, churn,
    recent, at)`` and its parameters, and ``names`` with theirs: ``names(email, name)``
    rows whose greatest name per person is that person's (every commit of the window
    is in them)."""

    sql: str
    params: list[Any]
    names: str
    name_params: list[Any]


def _buckets(scope: Scope, parts: Split, depth: int) -> tuple[str, list[Any]]:
    """The WHERE of the aggregate rows of ``parts``' whole months and years at ``depth``,
    through the ``bots`` lens."""
    ops = connection.ops
    buckets = ["(a.span = 1 AND a.month >= %s AND a.month <= %s)" for _ in parts.runs]
    params: list[Any] = [scope.repo.pk, scope.fingerprint, depth]
    for a, b in parts.runs:
        params += [ops.adapt_datefield_value(a), ops.adapt_datefield_value(b)]
    if parts.years:
        marks = ", ".join(["%s"] * len(parts.years))
        buckets.append(f"(a.span = 12 AND a.month IN ({marks}))")
        params += [ops.adapt_datefield_value(y) for y in parts.years]
    where = (
        f"a.repository_id = %s AND a.fingerprint = %s AND a.depth = %s AND ({' OR '.join(buckets)})"
    )
    if "bots" in scope.lens.exclude:
        where += " AND NOT " + scope.lens.bot_sql(
            "a.author_canonical_name", "a.author_canonical_email"
        )
    return where, params


def dir_parts(scope: Scope, depth: int, cut: datetime | None = None) -> DirParts | None:
    """The scope's directories at ``depth`` per author from the aggregates (whole months
    and years) and per commit from the stored rows (the rest): ``revs`` summed per
    directory is its distinct commits, ``churn`` its lines, ``recent`` the commits at
    or after ``cut``, ``at`` the last change. None when the scope reads every stored row
    (``Scope.aggregates`` off, or a path lens: see the module's docstring)."""
    if not 1 <= depth <= MAX_DEPTH:
        raise ValueError(f"depth must be between 1 and {MAX_DEPTH}")
    if not scope.aggregates or scope.lens.excludes_paths:
        return None
    # A span whose lock a writer holds is read from the stored rows (``settle``).
    parts, computed = settle(scope, split(scope, cut), ensure_dir_months, ensure_dir_years)
    if computed >= ANALYZE_AFTER and connection.vendor == "postgresql":
        # Statistics for the rows just written (as for the file aggregates,
        # docs/analytics.md#performance): ANALYZE reads a sample, blocks nobody.
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {connection.ops.quote_name(DirAggregate._meta.db_table)}")
    ops = connection.ops
    table = DirAggregate._meta.db_table
    cut_at = cut or datetime.max.replace(tzinfo=UTC)
    selects: list[str] = []
    params: list[Any] = []
    names: list[str] = []
    name_params: list[Any] = []
    # Raw rows: per file row of the windows read from the stored rows (kind 0) and of
    # the half-month correcting ``recent`` around the cut (kind -1 or +1, see below).
    raw: list[str] = []
    raw_params: list[Any] = []
    if parts.runs or parts.years:
        author = scope.lens.person_sql("a.author_canonical_email")
        where, where_params = _buckets(scope, parts, depth)
        # As ``aggregates.file_parts``: a whole month or year is recent when it starts at
        # or after the cut, except the month strictly holding it, read as recent or not
        # by whichever side is the shorter; that side's stored commits move by -1 or +1.
        cut_month = cut_at.date() if cut is not None else date.max
        if cut is not None and parts.cut_month is not None:
            first, after = _midnight(parts.cut_month), _midnight(next_month(parts.cut_month))
            if cut - first <= after - cut:
                cut_month, window, kind = parts.cut_month, Window(first, cut), -1
            else:
                cut_month, window, kind = next_month(parts.cut_month), Window(cut, after), 1
            sub = scope.within(window)
            cw, cw_params = sub.commit_filter()
            raw.append(
                "SELECT f.commit_id AS rev, f.path AS path, 0 AS churn, "  # noqa: S608
                f"{sub.author()} AS author, c.committed_at AS at, {int(kind)} AS kind "
                f"FROM {Commit._meta.db_table} c JOIN {FileChange._meta.db_table} f "
                f"ON f.commit_id = c.id WHERE {cw}"
            )
            raw_params += cw_params
        selects.append(
            f"SELECT a.dir AS dir, {author} AS author, a.revisions AS revs, "  # noqa: S608
            "a.added + a.deleted AS churn, "
            "CASE WHEN a.month >= %s THEN a.revisions ELSE 0 END AS recent, a.last_at AS at "
            f"FROM {table} a WHERE {where}"
        )
        params += [ops.adapt_datefield_value(cut_month), *where_params]
        nwhere, nparams = _buckets(scope, parts, 0)
        names.append(
            "SELECT a.author_canonical_email AS email, a.author_canonical_name AS name "  # noqa: S608
            f"FROM {table} a WHERE {nwhere}"
        )
        name_params += nparams
    for window in parts.raw:
        sub = scope.within(window)
        cw, cw_params = sub.commit_filter()
        raw.append(
            "SELECT f.commit_id AS rev, f.path AS path, f.added + f.deleted AS churn, "  # noqa: S608
            f"{sub.author()} AS author, c.committed_at AS at, 0 AS kind "
            f"FROM {Commit._meta.db_table} c JOIN {FileChange._meta.db_table} f "
            f"ON f.commit_id = c.id WHERE {cw}"
        )
        raw_params += cw_params
        names.append(
            "SELECT c.author_canonical_email AS email, c.author_canonical_name AS name "  # noqa: S608
            f"FROM {Commit._meta.db_table} c WHERE {cw}"
        )
        name_params += cw_params
    head = ""
    if raw:
        chain, name = _positions("rawrows", ("rev", "path", "churn", "author", "at", "kind"), depth)
        head = f"rawrows AS ({' UNION ALL '.join(raw)}), {chain}, "
        # One row per directory and commit (and kind): the commit counts once.
        selects.append(
            f"SELECT {_dir_at(depth)} AS dir, MAX(author) AS author, "  # noqa: S608
            "CASE WHEN kind = 0 THEN 1 ELSE 0 END AS revs, "
            "SUM(churn) AS churn, CASE WHEN kind <> 0 THEN kind "
            "WHEN MAX(at) >= %s THEN 1 ELSE 0 END AS recent, MAX(at) AS at "
            f"FROM {name} GROUP BY {_dir_at(depth)}, rev, kind"
        )
        params = [*raw_params, *params, ops.adapt_datetimefield_value(cut_at)]
    if not selects:
        return None
    sql = f"{head}dparts AS ({' UNION ALL '.join(selects)})"
    return DirParts(sql, params, " UNION ALL ".join(names), name_params)


def co_credits(scope: Scope, depth: int) -> list[tuple[str, str, int]]:
    """Per directory and person, the scope's commits that credit the person only as a
    co-author (not as the commit's author, through the identity map): what
    ``Scope.credits_cte`` adds to the authors' own commits (docs/analytics.md#co-authors).
    Read from the stored rows: only commits with a ``CoAuthor`` row are visited (SQLite
    joins in the order written after ``CROSS JOIN``: from the co-author rows, each
    commit by its key, instead of every commit of the window probing the co-author
    rows; PostgreSQL plans the same join by its statistics)."""
    where, params = scope.commit_filter()
    person = scope.lens.person_sql("co.email")
    bots = ""
    if "bots" in scope.lens.exclude:
        bots = " AND NOT " + scope.lens.bot_sql("co.name", "co.email")
    co = (
        f"co_only AS (SELECT DISTINCT co.commit_id AS rev, {person} AS person "  # noqa: S608
        f"FROM {CoAuthor._meta.db_table} co CROSS JOIN {Commit._meta.db_table} c "
        f"WHERE c.id = co.commit_id AND {where}{bots} AND {person} <> {scope.author()}), "
        "co_rows AS (SELECT f.commit_id AS rev, f.path AS path "
        f"FROM {FileChange._meta.db_table} f WHERE f.commit_id IN (SELECT rev FROM co_only))"
    )
    dirs, name = _positions("co_rows", ("rev", "path"), depth)
    return [
        (d, p, int(n))
        for d, p, n in fetch(
            f"WITH {co}, {dirs} SELECT {_dir_at(depth)}, o.person, COUNT(DISTINCT d.rev) "  # noqa: S608
            f"FROM {name} d JOIN co_only o ON o.rev = d.rev GROUP BY {_dir_at(depth)}, o.person",
            params,
        )
    ]


def dir_names(scope: Scope, parts: DirParts) -> dict[str, str]:
    """What ``rows.author_names`` gives, with the authors' names read from ``parts``'
    depth-0 aggregates and edges instead of every commit of the window (the co-authors'
    names joined from the co-author rows first, as in ``co_credits``)."""
    person = scope.lens.person_sql("n.email")
    names = {
        email: name
        for email, name in fetch(
            f"SELECT {person}, MAX(n.name) FROM ({parts.names}) n GROUP BY {person}",  # noqa: S608
            parts.name_params,
        )
    }
    where, params = scope.commit_filter()
    co = scope.lens.person_sql("co.email")
    sql = (
        f"SELECT {co}, MAX(co.name) FROM {CoAuthor._meta.db_table} co "  # noqa: S608
        f"CROSS JOIN {Commit._meta.db_table} c WHERE c.id = co.commit_id AND {where} "
        f"GROUP BY {co}"
    )
    for email, name in fetch(sql, params):
        names.setdefault(email, name or email)
    return names
