"""The people views read from aggregates (docs/analytics.md#performance): the authors
list, ownership per file, knowledge at risk and the names and last commits they show,
with the whole months and years of their window read from per-month sums instead of
every stored row, and equal to the read-time computation.

Two kinds of sums are read. The file rows per path and author (``MonthAggregate``,
``aggregates.file_parts``) give each file's revisions and each author's credit for it.
The commits per author (``AuthorMonth``, here) give each author's commits counted once,
their lines, first and last commit: they are computed and kept current as the file sums
are (``MonthStamp`` versions bumped by every write of the month), on the stamp's own
``authors_aggregated`` and ``authors_year_aggregated`` columns.

Co-authors (docs/analytics.md#co-authors) are not in the sums: a commit credits its
author (in the sums) and each co-author through the identity map once, not twice when
they map to the author or to each other. The credits beyond the author's are read from
the stored ``CoAuthor`` rows of the window (``extra_cte``: distinct per commit and
person, the author's own person left out), so the sums plus them are the credited set
of every commit. They cost what the window's co-authored commits cost.

The authors list through a path lens counts a commit when one of its files is left in,
with the lines of those files: that is a property of each commit's whole set of files,
which no per-path or per-author sum keeps; ``authors`` then reads the stored rows."""

from __future__ import annotations

from datetime import date
from typing import Any

from django.db import connection

from dashboard.analytics.aggregates import (
    ANALYZE_AFTER,
    Split,
    _midnight,
    _months,
    compute_month,
    compute_stale,
    compute_year,
    current_months,
    current_years,
    file_parts,
    next_month,
    next_year,
    settle,
    split,
)
from dashboard.analytics.rows import Scope, as_instant, fetch
from dashboard.analytics.window import Window
from dashboard.models import (
    AuthorMonth,
    AuthorWeek,
    CoAuthor,
    Commit,
    FileChange,
    MonthAggregate,
)

__all__ = [
    "author_activity_aggregated",
    "authors_aggregated",
    "ensure_author_months",
    "ensure_author_years",
    "extra_cte",
    "file_credits_aggregated",
    "file_totals_aggregated",
    "last_seen_aggregated",
    "names_aggregated",
    "week_sql",
]

_C = Commit._meta.db_table
_F = FileChange._meta.db_table


def _compute(scope: Scope, month: date) -> None:
    """Compute one month's ``AuthorMonth`` and ``AuthorWeek`` rows unless they are current.
    Race: ``aggregates.lock_months``."""

    def replace() -> None:
        _replace(scope, 1, month, next_month(month))
        _replace_weeks(scope, month)

    compute_month(scope, month, "authors_aggregated", replace)


def _compute_year(scope: Scope, january: date) -> None:
    """Compute one calendar year's ``AuthorMonth`` rows unless they are current (the sum
    of its month versions is the one recorded on its January).
    Race: ``aggregates.lock_months``."""
    compute_year(
        scope,
        january,
        "authors_year_aggregated",
        lambda: _replace(scope, 12, january, next_year(january)),
    )


def _replace(scope: Scope, span: int, first: date, after: date) -> None:
    """Replace the ``span`` rows starting at ``first`` with the sums of the stored
    commits from ``first`` to ``after`` (the caller holds the stamp rows' lock)."""
    ops = connection.ops
    table = ops.quote_name(AuthorMonth._meta.db_table)
    day = ops.adapt_datefield_value(first)
    with connection.cursor() as cursor:
        cursor.execute(
            f"DELETE FROM {table} WHERE repository_id = %s AND fingerprint = %s "  # noqa: S608
            "AND span = %s AND month = %s",
            [scope.repo.pk, scope.fingerprint, span, day],
        )
        cursor.execute(
            f"INSERT INTO {table} (repository_id, fingerprint, span, month, "  # noqa: S608
            "author_canonical_email, author_canonical_name, commits, insertions, deletions, "
            "first_at, last_at) SELECT %s, %s, %s, %s, c.author_canonical_email, "
            "c.author_canonical_name, COUNT(*), SUM(c.insertions), SUM(c.deletions), "
            f"MIN(c.committed_at), MAX(c.committed_at) FROM {_C} c "
            "WHERE c.repository_id = %s AND c.fingerprint = %s AND c.is_merge = %s "
            "AND c.committed_at >= %s AND c.committed_at < %s "
            "GROUP BY c.author_canonical_email, c.author_canonical_name",
            [
                scope.repo.pk,
                scope.fingerprint,
                span,
                day,
                scope.repo.pk,
                scope.fingerprint,
                False,
                ops.adapt_datetimefield_value(_midnight(first)),
                ops.adapt_datetimefield_value(_midnight(after)),
            ],
        )


def week_sql(column: str) -> str:
    """The Monday (UTC) of the timestamp in ``column``, as ``YYYY-MM-DD`` text (the
    weeks of ``people.author_activity``)."""
    if connection.vendor == "sqlite":
        return f"date({column}, 'weekday 0', '-6 days')"
    return f"to_char(date_trunc('week', {column} AT TIME ZONE 'UTC'), 'YYYY-MM-DD')"


def _replace_weeks(scope: Scope, month: date) -> None:
    """Replace the month's ``AuthorWeek`` rows (the caller holds its stamp's lock)."""
    ops = connection.ops
    table = ops.quote_name(AuthorWeek._meta.db_table)
    day = ops.adapt_datefield_value(month)
    week = week_sql("c.committed_at")
    with connection.cursor() as cursor:
        cursor.execute(
            f"DELETE FROM {table} WHERE repository_id = %s AND fingerprint = %s "  # noqa: S608
            "AND month = %s",
            [scope.repo.pk, scope.fingerprint, day],
        )
        cursor.execute(
            f"INSERT INTO {table} (repository_id, fingerprint, month, week, "  # noqa: S608
            "author_canonical_email, author_canonical_name, commits, insertions, deletions, "
            f"first_at, last_at) SELECT %s, %s, %s, {week}, c.author_canonical_email, "
            "c.author_canonical_name, COUNT(*), SUM(c.insertions), SUM(c.deletions), "
            f"MIN(c.committed_at), MAX(c.committed_at) FROM {_C} c "
            "WHERE c.repository_id = %s AND c.fingerprint = %s AND c.is_merge = %s "
            "AND c.committed_at >= %s AND c.committed_at < %s "
            f"GROUP BY {week}, c.author_canonical_email, c.author_canonical_name",
            [
                scope.repo.pk,
                scope.fingerprint,
                day,
                scope.repo.pk,
                scope.fingerprint,
                False,
                ops.adapt_datetimefield_value(_midnight(month)),
                ops.adapt_datetimefield_value(_midnight(next_month(month))),
            ],
        )


def ensure_author_months(
    scope: Scope, runs: tuple[tuple[date, date], ...], busy: list[date] | None = None
) -> int:
    """Make the ``AuthorMonth`` rows of every month of ``runs`` current; returns how many
    months were computed (one query finds those that are). Busy months as
    ``aggregates.ensure_months`` (``compute_stale``)."""
    if not runs:
        return 0
    months = _months(runs)
    current = current_months(scope, months, "authors_aggregated")
    stale = [m for m in months if m not in current]
    return compute_stale(stale, lambda month: _compute(scope, month), busy)


def ensure_author_years(
    scope: Scope, years: tuple[date, ...], busy: list[date] | None = None, *, skip: bool = False
) -> int:
    """Make the ``AuthorMonth`` rows of every year of ``years`` current; returns how
    many years were computed (one query reads their months' stamps). Busy years as
    ``aggregates.ensure_years`` (``compute_stale``)."""
    if not years:
        return 0
    current = current_years(scope, years, "authors_year_aggregated")
    stale = [january for january in years if january not in current]
    return compute_stale(stale, lambda january: _compute_year(scope, january), busy, skip=skip)


def _runs_of(months: list[date]) -> tuple[tuple[date, date], ...]:
    runs: list[tuple[date, date]] = []
    for m in months:
        if runs and next_month(runs[-1][1]) == m:
            runs[-1] = (runs[-1][0], m)
        else:
            runs.append((m, m))
    return tuple(runs)


def _settle_authors(scope: Scope, parts: Split) -> tuple[Split, int]:
    """``aggregates.settle`` for the ``AuthorMonth`` rows: ``parts`` with every month or
    year whose lock a writer holds moved to the stored rows (read, never stale, never
    waited for: docs/analytics.md#performance)."""
    busy_months: list[date] = []
    busy_years: list[date] = []
    computed = ensure_author_months(scope, parts.runs, busy_months)
    computed += ensure_author_years(scope, parts.years, busy_years, skip=bool(busy_months))
    if not busy_months and not busy_years:
        return parts, computed
    raw = [
        *parts.raw,
        *(Window(_midnight(m), _midnight(next_month(m))) for m in busy_months),
        *(Window(_midnight(y), _midnight(next_year(y))) for y in busy_years),
    ]
    return (
        Split(
            _runs_of([m for m in _months(parts.runs) if m not in busy_months]),
            tuple(raw),
            tuple(y for y in parts.years if y not in busy_years),
        ),
        computed,
    )


def _buckets(scope: Scope, table: Any, alias: str) -> tuple[list[str], list[Any], list[Window]]:
    """The whole months and years of the scope's window (made current in ``table``'s
    stamps) as SQL conditions on ``alias`` with their parameters (empty: none), and the
    rest of the window as raw windows."""
    parts = split(scope)
    if table is AuthorMonth:
        parts, computed = _settle_authors(scope, parts)
    else:
        # MonthAggregate's own stamps, as aggregates.file_parts reads them: a month or
        # year whose lock a writer holds is moved to the stored rows (``settle``), never
        # read stale (docs/analytics.md#performance).
        parts, computed = settle(scope, parts)
    if computed >= ANALYZE_AFTER and connection.vendor == "postgresql":
        # Statistics for the rows just written (as aggregates.file_parts does).
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {connection.ops.quote_name(table._meta.db_table)}")
    if not parts.runs and not parts.years:
        return [], [], list(parts.raw)
    ops = connection.ops
    buckets = [f"({alias}.span = 1 AND {alias}.month >= %s AND {alias}.month <= %s)"] * len(
        parts.runs
    )
    params: list[Any] = [scope.repo.pk, scope.fingerprint]
    for a, b in parts.runs:
        params += [ops.adapt_datefield_value(a), ops.adapt_datefield_value(b)]
    if parts.years:
        marks = ", ".join(["%s"] * len(parts.years))
        buckets.append(f"({alias}.span = 12 AND {alias}.month IN ({marks}))")
        params += [ops.adapt_datefield_value(y) for y in parts.years]
    where = [
        f"{alias}.repository_id = %s AND {alias}.fingerprint = %s AND ({' OR '.join(buckets)})"
    ]
    if "bots" in scope.lens.exclude:
        where.append(
            "NOT "
            + scope.lens.bot_sql(
                f"{alias}.author_canonical_name", f"{alias}.author_canonical_email"
            )
        )
    return where, params, list(parts.raw)


def _author_parts(scope: Scope) -> tuple[str, list[Any]]:
    """``aparts(author, name, n, ins, del, first, last)``: a CTE body (without WITH) of
    the scope's commits, credited to their authors only, per author for the whole
    months and years (``AuthorMonth``) and per commit for the rest; summed per author,
    equal to the stored commits'. Only without a path lens (see the module's
    docstring)."""
    assert not scope.lens.excludes_paths
    where, params, raw = _buckets(scope, AuthorMonth, "a")
    selects: list[str] = []
    out: list[Any] = []
    if where:
        selects.append(
            f"SELECT {scope.lens.person_sql('a.author_canonical_email')} AS author, "  # noqa: S608
            "a.author_canonical_name AS name, a.commits AS n, a.insertions AS ins, "
            "a.deletions AS del, a.first_at AS first, a.last_at AS last "
            f"FROM {AuthorMonth._meta.db_table} a WHERE {' AND '.join(where)}"
        )
        out += params
    for window in raw:
        sub = scope.within(window)
        cond, cond_params = sub.commit_filter()
        selects.append(
            f"SELECT {sub.author()} AS author, c.author_canonical_name AS name, "  # noqa: S608
            "1 AS n, c.insertions AS ins, c.deletions AS del, c.committed_at AS first, "
            f"c.committed_at AS last FROM {_C} c WHERE {cond}"
        )
        out += cond_params
    return "aparts AS (" + " UNION ALL ".join(selects) + ")", out


def extra_cte(scope: Scope) -> tuple[str, list[Any]]:
    """``extra(rev, person)``: the credits of the scope's commits beyond their authors'
    (docs/analytics.md#co-authors): each co-author's person, once per commit, unless it
    is the author's person (the sums hold that credit); the ``bots`` lens credits no bot
    co-author. With ``credits`` of ``rows.Scope``: its rows are this CTE's plus one
    (commit, author's person) per commit.

    ``CROSS JOIN``: SQLite then reads the co-author rows first (few) and finds each
    one's commit by key, instead of probing every commit of the window for co-authors
    (6.5 s over 1,000,000 commits; PostgreSQL's planner picks that order itself)."""
    where, params = scope.commit_filter()
    co = scope.lens.person_sql("co.email")
    bots = ""
    if "bots" in scope.lens.exclude:
        bots = " AND NOT " + scope.lens.bot_sql("co.name", "co.email")
    sql = (
        f"extra AS (SELECT DISTINCT co.commit_id AS rev, {co} AS person "  # noqa: S608
        f"FROM {CoAuthor._meta.db_table} co CROSS JOIN {_C} c WHERE c.id = co.commit_id "
        f"AND {where}{bots} AND {co} <> {scope.author()})"
    )
    return sql, params


def authors_aggregated(scope: Scope, limit: int) -> list[tuple[Any, ...]]:
    """``people.authors``' grouped rows (person, commits, insertions, deletions, first,
    last), most commits first: the authors' sums plus the co-authors' credits."""
    parts, params = _author_parts(scope)
    extra, extra_params = extra_cte(scope)
    return fetch(
        f"WITH {parts}, {extra}, credited AS (SELECT author, n, ins, del, first, last "  # noqa: S608
        "FROM aparts UNION ALL SELECT e.person, 1, c.insertions, c.deletions, "
        f"c.committed_at, c.committed_at FROM extra e JOIN {_C} c ON c.id = e.rev) "
        "SELECT author, SUM(n), SUM(ins), SUM(del), MIN(first), MAX(last) FROM credited "
        "GROUP BY author ORDER BY SUM(n) DESC, author LIMIT %s",
        [*params, *extra_params, limit],
    )


def names_aggregated(scope: Scope) -> dict[str, str]:
    """``rows.author_names`` read from the sums: each author's largest (mailmap) name
    over the scope's commits, else a co-author's name as written. Through a path lens
    the commits are those with a file left in: the file sums' authors and names over
    the paths left in."""
    if scope.lens.excludes_paths:
        found = _file_names(scope)
    else:
        parts, params = _author_parts(scope)
        found = fetch(
            f"WITH {parts} SELECT author, MAX(name) FROM aparts GROUP BY author",  # noqa: S608
            params,
        )
    names = {email: name for email, name in found}
    where, params = scope.commit_filter()
    co = scope.lens.person_sql("co.email")
    sql = (
        f"SELECT {co}, MAX(co.name) FROM {CoAuthor._meta.db_table} co "  # noqa: S608
        f"CROSS JOIN {_C} c WHERE c.id = co.commit_id AND {where} GROUP BY {co}"
    )
    for email, name in fetch(sql, params):
        names.setdefault(email, name or email)
    return names


def _file_names(scope: Scope) -> list[tuple[Any, ...]]:
    """Each author's largest name over the commits with a file left in: the
    ``MonthAggregate`` rows of the paths left in for the whole months and years, the
    stored commits for the rest."""
    where, params, raw = _buckets(scope, MonthAggregate, "a")
    selects: list[str] = []
    out: list[Any] = []
    if where:
        files, file_params = scope.file_filter("a")
        selects.append(
            f"SELECT {scope.lens.person_sql('a.author_canonical_email')} AS author, "  # noqa: S608
            f"a.author_canonical_name AS name FROM {MonthAggregate._meta.db_table} a "
            f"WHERE {' AND '.join(where)}{files}"
        )
        out += [*params, *file_params]
    for window in raw:
        sub = scope.within(window)
        cond, cond_params = sub.commit_filter()
        selects.append(
            f"SELECT {sub.author()} AS author, c.author_canonical_name AS name "  # noqa: S608
            f"FROM {_C} c WHERE {cond}"
        )
        out += cond_params
    return fetch(
        f"SELECT author, MAX(name) FROM ({' UNION ALL '.join(selects)}) n GROUP BY author",  # noqa: S608
        out,
    )


def last_seen_aggregated(scope: Scope) -> dict[str, Any]:
    """``ownership.last_seen`` from the sums: each credited person's last commit up to
    the window's end over the whole stored history (the scope's window is taken from
    its start: the caller passes the whole history up to the end)."""
    extra, extra_params = extra_cte(scope)
    if scope.lens.excludes_paths:
        parts, params = file_parts(scope)
        head = f"{parts}, last AS (SELECT author, MAX(at) AS at FROM parts GROUP BY author)"  # noqa: S608
    else:
        parts, params = _author_parts(scope)
        head = f"{parts}, last AS (SELECT author, MAX(last) AS at FROM aparts GROUP BY author)"  # noqa: S608
    rows = fetch(
        f"WITH {head}, {extra} SELECT author, MAX(at) FROM (SELECT author, at FROM last "  # noqa: S608
        f"UNION ALL SELECT e.person, c.committed_at FROM extra e JOIN {_C} c ON c.id = e.rev) "
        "s GROUP BY author",
        [*params, *extra_params],
    )
    return {author: as_instant(at) for author, at in rows}


def file_credits_aggregated(scope: Scope) -> tuple[dict[str, dict[str, int]], dict[str, int]]:
    """``ownership._file_credits`` from the sums: per file, each credited person's
    revisions (the author's from the file sums, plus the co-authors' credits of its
    commits); and each file's revisions (one author per revision: the sum of the
    authors' revisions)."""
    parts, params = file_parts(scope)
    per: dict[str, dict[str, int]] = {}
    revs: dict[str, int] = {}
    for path, person, n in fetch(
        f"WITH {parts} SELECT path, author, SUM(revs) FROM parts GROUP BY path, author",  # noqa: S608
        params,
    ):
        per.setdefault(path, {})[person] = int(n)
        revs[path] = revs.get(path, 0) + int(n)
    extra, extra_params = extra_cte(scope)
    files, file_params = scope.file_filter()
    for path, person, n in fetch(
        f"WITH {extra} SELECT f.path, e.person, COUNT(*) FROM extra e "  # noqa: S608
        f"JOIN {_F} f ON f.commit_id = e.rev WHERE 1 = 1{files} GROUP BY f.path, e.person",
        [*extra_params, *file_params],
    ):
        counts = per.setdefault(path, {})
        counts[person] = counts.get(person, 0) + int(n)
    return per, revs


def author_activity_aggregated(scope: Scope, author: str, limit: int) -> dict[str, Any] | None:
    """``people.author_activity``'s grouped rows from the sums: ``totals`` (commits,
    insertions, deletions, first, last), ``weekly``, ``files`` and ``languages`` of one
    credited person. The weeks of the whole months come from ``AuthorWeek`` (a year is
    read as its months), the files and their languages from ``MonthAggregate`` (its
    rows carry the stored rows' language); the co-authored commits and the edges from
    the stored rows. Through a path lens only when it leaves no path out (the
    commit counts need each commit's whole set of files, see the module's docstring)."""
    assert not scope.lens.excludes_paths
    parts = split(scope)
    months = _months(parts.runs) + [y.replace(month=k) for y in parts.years for k in range(1, 13)]
    months.sort()
    busy: list[date] = []
    ensure_author_months(scope, _runs_of(months), busy)
    # A month whose lock a writer holds is read from the stored rows (never stale).
    runs = _runs_of([m for m in months if m not in busy])
    raw = [*parts.raw, *(Window(_midnight(m), _midnight(next_month(m))) for m in busy)]
    ops = connection.ops
    person = scope.lens.person_sql
    extra, extra_params = extra_cte(scope)
    selects: list[str] = []
    params: list[Any] = [*extra_params]
    if runs:
        buckets = " OR ".join(["(w.month >= %s AND w.month <= %s)"] * len(runs))
        bots = ""
        if "bots" in scope.lens.exclude:
            bots = " AND NOT " + scope.lens.bot_sql(
                "w.author_canonical_name", "w.author_canonical_email"
            )
        selects.append(
            "SELECT w.week AS week, w.commits AS n, w.insertions AS ins, "  # noqa: S608
            "w.deletions AS del, w.first_at AS first, w.last_at AS last "
            f"FROM {AuthorWeek._meta.db_table} w WHERE w.repository_id = %s "
            f"AND w.fingerprint = %s AND ({buckets}){bots} "
            f"AND {person('w.author_canonical_email')} = %s"
        )
        params += [scope.repo.pk, scope.fingerprint]
        for a, b in runs:
            params += [ops.adapt_datefield_value(a), ops.adapt_datefield_value(b)]
        params.append(author)
    for window in raw:
        sub = scope.within(window)
        cond, cond_params = sub.commit_filter()
        selects.append(
            f"SELECT {week_sql('c.committed_at')} AS week, 1 AS n, "  # noqa: S608
            "c.insertions AS ins, c.deletions AS del, c.committed_at AS first, "
            f"c.committed_at AS last FROM {_C} c WHERE {cond} AND {sub.author()} = %s"
        )
        params += [*cond_params, author]
    selects.append(
        f"SELECT {week_sql('c.committed_at')} AS week, 1 AS n, c.insertions AS ins, "  # noqa: S608
        "c.deletions AS del, c.committed_at AS first, c.committed_at AS last "
        f"FROM extra e JOIN {_C} c ON c.id = e.rev WHERE e.person = %s"
    )
    params.append(author)
    head = f"WITH {extra}, mine AS ({' UNION ALL '.join(selects)}) "
    (totals,) = fetch(
        f"{head}SELECT SUM(n), SUM(ins), SUM(del), MIN(first), MAX(last) FROM mine",  # noqa: S608
        params,
    )
    if not totals[0]:
        return None
    weekly = fetch(
        f"{head}SELECT week, SUM(n), SUM(ins), SUM(del) FROM mine "  # noqa: S608
        "GROUP BY week ORDER BY week",
        params,
    )
    files_head, file_params = _my_files(scope, author)
    files = fetch(
        f"{files_head}SELECT path, n, added, deleted FROM mine_files "  # noqa: S608
        "ORDER BY n DESC, path LIMIT %s",
        [*file_params, limit],
    )
    languages = fetch(
        f"{files_head}SELECT language, SUM(n), SUM(added + deleted) "  # noqa: S608
        "FROM mine_rows WHERE language <> '' "
        "GROUP BY language ORDER BY SUM(added + deleted) DESC, language",
        file_params,
    )
    return {"totals": totals, "weekly": weekly, "files": files, "languages": languages}


def _my_files(scope: Scope, author: str) -> tuple[str, list[Any]]:
    """``WITH … mine_rows(path, language, n, added, deleted), mine_files(path, n, added,
    deleted)``: one person's file rows (theirs as author from the file sums and the
    edges' stored rows, and those of the commits they co-authored), and the same summed
    per path. Each row keeps its language (the file sums carry the stored rows'), so
    their languages need no look-up per path."""
    where, where_params, raw = _buckets(scope, MonthAggregate, "a")
    extra, extra_params = extra_cte(scope)
    selects: list[str] = []
    out: list[Any] = [*extra_params]
    person = scope.lens.person_sql
    if where:
        files, file_params = scope.file_filter("a")
        selects.append(
            "SELECT a.path AS path, a.language AS language, a.revisions AS n, "  # noqa: S608
            f"a.added AS added, a.deleted AS deleted FROM {MonthAggregate._meta.db_table} a "
            f"WHERE {' AND '.join(where)}{files} AND {person('a.author_canonical_email')} = %s"
        )
        out += [*where_params, *file_params, author]
    for window in raw:
        sub = scope.within(window)
        cond, cond_params = sub.commit_filter()
        files, file_params = sub.file_filter()
        selects.append(
            "SELECT f.path AS path, f.language AS language, 1 AS n, f.added AS added, "  # noqa: S608
            f"f.deleted AS deleted FROM {_C} c JOIN {_F} f ON f.commit_id = c.id "
            f"WHERE {cond}{files} "
            f"AND {sub.author()} = %s"
        )
        out += [*cond_params, *file_params, author]
    files, file_params = scope.file_filter()
    selects.append(
        "SELECT f.path AS path, f.language AS language, 1 AS n, f.added AS added, "  # noqa: S608
        f"f.deleted AS deleted FROM extra e JOIN {_F} f ON f.commit_id = e.rev "
        f"WHERE e.person = %s{files}"
    )
    out += [author, *file_params]
    head = (
        f"WITH {extra}, mine_rows AS ({' UNION ALL '.join(selects)}), "  # noqa: S608
        "mine_files AS (SELECT path, SUM(n) AS n, SUM(added) AS added, "
        "SUM(deleted) AS deleted FROM mine_rows GROUP BY path) "
    )
    return head, out


def file_totals_aggregated(
    scope: Scope, path: str
) -> tuple[tuple[Any, ...], list[tuple[Any, ...]]]:
    """``people.file_history``'s totals (revisions, added, deleted) and per-person rows
    (person, revisions, added, deleted; most first) of one file, in one query: its sums
    for the whole months and years (found through their path index), its stored rows
    for the edges (found from the edges' commits: a short window's few commits, not the
    file's whole history) and the co-authors' credits of its commits (``own`` 0: in the
    per-person rows only)."""
    where, where_params, raw = _buckets(scope, MonthAggregate, "a")
    extra, extra_params = extra_cte(scope)
    selects: list[str] = []
    params: list[Any] = [*extra_params]
    if where:
        files, file_params = scope.file_filter("a")
        selects.append(
            f"SELECT {scope.lens.person_sql('a.author_canonical_email')} AS person, "  # noqa: S608
            "1 AS own, a.revisions AS n, a.added AS added, a.deleted AS deleted "
            f"FROM {MonthAggregate._meta.db_table} a WHERE {' AND '.join(where)}{files} "
            "AND a.path = %s"
        )
        params += [*where_params, *file_params, path]
    for window in raw:
        sub = scope.within(window)
        cond, cond_params = sub.commit_filter()
        files, file_params = sub.file_filter()
        selects.append(
            f"SELECT {sub.author()} AS person, 1 AS own, 1 AS n, f.added AS added, "  # noqa: S608
            f"f.deleted AS deleted FROM {_C} c JOIN {_F} f ON f.commit_id = c.id "
            f"WHERE {cond}{files} AND f.path = %s"
        )
        params += [*cond_params, *file_params, path]
    files, file_params = scope.file_filter()
    selects.append(
        "SELECT e.person AS person, 0 AS own, 1 AS n, f.added AS added, "  # noqa: S608
        f"f.deleted AS deleted FROM extra e JOIN {_F} f ON f.commit_id = e.rev "
        f"WHERE f.path = %s{files}"
    )
    params += [path, *file_params]
    found = fetch(
        f"WITH {extra} SELECT person, SUM(n), SUM(added), SUM(deleted), "  # noqa: S608
        "SUM(own * n), SUM(own * added), SUM(own * deleted) "
        f"FROM ({' UNION ALL '.join(selects)}) u "
        "GROUP BY person ORDER BY SUM(n) DESC, person",
        params,
    )
    totals = tuple(sum(int(r[k] or 0) for r in found) for k in (4, 5, 6))
    return totals, [r[:4] for r in found]
