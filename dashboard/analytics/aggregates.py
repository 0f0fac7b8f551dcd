"""Per-month aggregates of the stored file rows (docs/analytics.md#performance): a window
is split into the whole UTC calendar years and months inside it, read from ``MonthAggregate``
rows (one per year or month, path and author), and the edges, read from the stored rows as
before.
A month's aggregates are computed from its stored rows the first time a view needs
them, and are current while the month's ``MonthStamp`` version is the one they were
computed at: every write adding or deleting commits of the month bumps it in its own
transaction (``repositories.bump_months``), so no view ever combines stale aggregates
with newer stored rows. A year's aggregates are current while the sum of its twelve
month versions is the one they were computed at. The month now running, and months after
it, are always read from the stored rows."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time
from typing import Any

from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from dashboard.analytics.rows import Scope, as_instant, fetch
from dashboard.analytics.window import Window
from dashboard.models import Commit, FileChange, MonthAggregate, MonthStamp

__all__ = ["Split", "ensure_months", "ensure_years", "file_parts", "split"]


#: A request that computed this many months and years at once refreshes the aggregate
#: table's statistics (PostgreSQL).
ANALYZE_AFTER = 12


def month_of(moment: datetime) -> date:
    """The first day of the UTC month holding ``moment``."""
    return moment.astimezone(UTC).date().replace(day=1)


def next_month(month: date) -> date:
    return date(month.year + month.month // 12, month.month % 12 + 1, 1)


def _midnight(day: date) -> datetime:
    return datetime.combine(day, time(0), tzinfo=UTC)


@dataclass(frozen=True)
class Split:
    """A window as whole calendar years (their Januaries) and runs of whole months
    (first and last month of each run, both included, none in those years) read from
    the aggregates, and the windows between them read from the stored rows; together
    they cover the window exactly once."""

    runs: tuple[tuple[date, date], ...] = ()
    raw: tuple[Window, ...] = ()
    years: tuple[date, ...] = ()
    #: The month of ``runs`` strictly holding the cut, if one does.
    cut_month: date | None = None


def _first_stored(scope: Scope) -> datetime | None:
    sql = (
        f"SELECT MIN(c.committed_at) FROM {Commit._meta.db_table} c "  # noqa: S608
        "WHERE c.repository_id = %s AND c.fingerprint = %s"
    )
    (first,) = fetch(sql, [scope.repo.pk, scope.fingerprint])[0]
    return None if first is None else as_instant(first)


def split(scope: Scope, cut: datetime | None = None) -> Split:
    """The whole months of the scope's window before the month now running, as whole
    years where all twelve months of one are there and ``cut`` (the hotspots' midpoint)
    is not inside it, and as months otherwise (``cut_month``: the one strictly holding
    ``cut``); and the rest of the window as raw windows."""
    if not scope.aggregates:
        return Split((), (scope.window,))
    start, end = scope.window.start, scope.window.end
    lo = start or _first_stored(scope)
    if lo is None:
        return Split((), (scope.window,))
    first = month_of(lo) if _midnight(month_of(lo)) == lo else next_month(month_of(lo))
    limit = month_of(timezone.now())  # the month now running is never aggregated
    months = []
    month = first
    cut_month = None
    while month < limit and (end is None or _midnight(next_month(month)) <= end):
        if cut is not None and _midnight(month) < cut < _midnight(next_month(month)):
            cut_month = month
        months.append(month)
        month = next_month(month)
    runs: list[tuple[date, date]] = []
    for m in months:
        if runs and next_month(runs[-1][1]) == m:
            runs[-1] = (runs[-1][0], m)
        else:
            runs.append((m, m))
    if not runs:
        return Split((), (scope.window,))
    whole = set(months)
    years = tuple(
        sorted(
            {
                m
                for m in months
                if m.month == 1
                and all(m.replace(month=k) in whole for k in range(2, 13))
                # a cut on a month's first midnight inside the year splits it too
                and not (cut is not None and _midnight(m) < cut < _midnight(next_year(m)))
            }
        )
    )
    rest = [m for m in months if m.replace(month=1) not in years]
    month_runs: list[tuple[date, date]] = []
    for m in rest:
        if month_runs and next_month(month_runs[-1][1]) == m:
            month_runs[-1] = (month_runs[-1][0], m)
        else:
            month_runs.append((m, m))
    raw: list[Window] = []
    edge = start
    for a, b in runs:
        if edge is None or edge < _midnight(a):
            raw.append(Window(edge, _midnight(a)))
        edge = _midnight(next_month(b))
    after = _midnight(next_month(runs[-1][1]))
    if end is None or after < end:
        raw.append(Window(after, end))
    return Split(tuple(month_runs), tuple(raw), years, cut_month)


def _months(runs: tuple[tuple[date, date], ...]) -> list[date]:
    out = []
    for a, b in runs:
        m = a
        while m <= b:
            out.append(m)
            m = next_month(m)
    return out


def _compute(scope: Scope, month: date) -> None:
    """Compute one month's aggregates from its stored rows, unless they are current.

    Race: two readers computing the same month, and a write of the month's commits.
    The stamp row is created if missing (a concurrent creation is ignored by ON CONFLICT
    DO NOTHING) and then locked (PostgreSQL FOR UPDATE; SQLite's IMMEDIATE transaction
    holds the database's write lock): the second reader waits, then finds them current
    and does nothing. A write bumps the stamp under the same lock (``bump_months``):
    committed before our lock, its rows are seen by the INSERT … SELECT below (a later
    statement); committed after, it leaves ``version`` above ``aggregated``, and the next
    reader computes the month again."""
    repo_id, fp = scope.repo.pk, scope.fingerprint
    ops = connection.ops
    stamps = connection.ops.quote_name(MonthStamp._meta.db_table)
    day = ops.adapt_datefield_value(month)
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {stamps} (repository_id, fingerprint, month, version) "  # noqa: S608
                "VALUES (%s, %s, %s, 0) ON CONFLICT (repository_id, fingerprint, month) "
                "DO NOTHING",
                [repo_id, fp, day],
            )
        stamp = (
            MonthStamp.objects.select_for_update()
            .filter(repository_id=repo_id, fingerprint=fp, month=month)
            .values_list("version", "aggregated")
            .get()
        )
        version, aggregated = stamp
        if aggregated == version:
            return
        _replace(scope, 1, month, next_month(month))
        MonthStamp.objects.filter(repository_id=repo_id, fingerprint=fp, month=month).update(
            aggregated=version
        )


def _compute_year(scope: Scope, january: date) -> None:
    """Compute one calendar year's aggregates from its stored rows, unless they are
    current (the sum of its month versions is the one recorded on its January).

    Race: as ``_compute``, over the year's twelve stamp rows: created if missing, then
    locked in ascending month order (a writer bumps its months in ascending order too,
    ``bump_months``, so the two never wait on each other in a cycle). A write committed
    before the lock is in the rows read below; one committed after raises a month's
    version, hence the sum, and the next reader computes the year again."""
    repo_id, fp = scope.repo.pk, scope.fingerprint
    ops = connection.ops
    stamps = ops.quote_name(MonthStamp._meta.db_table)
    months = [january.replace(month=k) for k in range(1, 13)]
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.executemany(
                f"INSERT INTO {stamps} (repository_id, fingerprint, month, version) "  # noqa: S608
                "VALUES (%s, %s, %s, 0) ON CONFLICT (repository_id, fingerprint, month) "
                "DO NOTHING",
                [(repo_id, fp, ops.adapt_datefield_value(m)) for m in months],
            )
        locked = list(
            MonthStamp.objects.select_for_update()
            .filter(repository_id=repo_id, fingerprint=fp, month__in=months)
            .order_by("month")
            .values_list("version", "year_aggregated")
        )
        total = sum(version for version, _ in locked)
        if locked[0][1] == total:
            return
        _replace(scope, 12, january, next_year(january))
        MonthStamp.objects.filter(repository_id=repo_id, fingerprint=fp, month=january).update(
            year_aggregated=total
        )


def _replace(scope: Scope, span: int, first: date, after: date) -> None:
    """Replace the ``span`` aggregates starting at ``first`` with sums of the stored rows
    from ``first`` to ``after`` (the caller holds the stamp rows' lock)."""
    aggs = connection.ops.quote_name(MonthAggregate._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"DELETE FROM {aggs} WHERE repository_id = %s AND fingerprint = %s "  # noqa: S608
            "AND span = %s AND month = %s",
            [scope.repo.pk, scope.fingerprint, span, connection.ops.adapt_datefield_value(first)],
        )
        _insert(cursor, scope, span, first, after)


def next_year(january: date) -> date:
    return january.replace(year=january.year + 1)


def _insert(cursor: Any, scope: Scope, span: int, first: date, after: date) -> None:
    """INSERT … SELECT the aggregates of ``[first, after)`` from the stored rows."""
    ops = connection.ops
    aggs = ops.quote_name(MonthAggregate._meta.db_table)
    cursor.execute(
        f"INSERT INTO {aggs} (repository_id, fingerprint, span, month, path, "  # noqa: S608
        "author_canonical_email, author_canonical_name, revisions, added, deleted, "
        "last_at) SELECT %s, %s, %s, %s, f.path, c.author_canonical_email, "
        "c.author_canonical_name, COUNT(*), SUM(f.added), SUM(f.deleted), "
        f"MAX(c.committed_at) FROM {Commit._meta.db_table} c "
        f"JOIN {FileChange._meta.db_table} f ON f.commit_id = c.id "
        "WHERE c.repository_id = %s AND c.fingerprint = %s AND c.is_merge = %s "
        "AND c.committed_at >= %s AND c.committed_at < %s "
        "GROUP BY f.path, c.author_canonical_email, c.author_canonical_name",
        [
            scope.repo.pk,
            scope.fingerprint,
            span,
            ops.adapt_datefield_value(first),
            scope.repo.pk,
            scope.fingerprint,
            False,
            ops.adapt_datetimefield_value(_midnight(first)),
            ops.adapt_datetimefield_value(_midnight(after)),
        ],
    )


def ensure_years(scope: Scope, years: tuple[date, ...]) -> int:
    """Make the aggregates of every year of ``years`` current; returns how many years
    were computed (one query reads their months' stamps)."""
    if not years:
        return 0
    found: dict[date, list[tuple[date, int, int | None]]] = {}
    for month, version, year_aggregated in MonthStamp.objects.filter(
        repository_id=scope.repo.pk,
        fingerprint=scope.fingerprint,
        month__gte=years[0],
        month__lt=next_year(years[-1]),
    ).values_list("month", "version", "year_aggregated"):
        found.setdefault(month.replace(month=1), []).append((month, version, year_aggregated))
    computed = 0
    for january in years:
        rows = sorted(found.get(january, []))
        if len(rows) == 12 and rows[0][2] == sum(version for _, version, _ in rows):
            continue
        _compute_year(scope, january)
        computed += 1
    return computed


def ensure_months(scope: Scope, runs: tuple[tuple[date, date], ...]) -> int:
    """Make the aggregates of every month of ``runs`` current; returns how many months
    were computed. One query finds the months that are; each other month is computed
    in its own short transaction (``_compute``)."""
    if not runs:
        return 0
    months = _months(runs)
    current = set(
        MonthStamp.objects.filter(
            repository_id=scope.repo.pk,
            fingerprint=scope.fingerprint,
            month__gte=months[0],
            month__lte=months[-1],
            aggregated=F("version"),
        ).values_list("month", flat=True)
    )
    missing = [m for m in months if m not in current]
    for month in missing:
        _compute(scope, month)
    return len(missing)


def file_parts(scope: Scope, cut: datetime | None = None) -> tuple[str, list[Any]]:
    """``parts(path, author, revs, churn, recent, at)``: a CTE body (without WITH) of the
    scope's file rows, per path and author for the whole months (from the aggregates)
    and per row for the rest (from the stored rows): ``revs``, ``churn`` and ``recent``
    (the revisions at or after ``cut``) summed over it equal those of the stored rows,
    ``at`` its last change. The lens filters both alike: paths by ``path``, bots by the
    author's canonical name and e-mail, people through the identity map."""
    parts = split(scope, cut)
    computed = ensure_months(scope, parts.runs) + ensure_years(scope, parts.years)
    if computed >= ANALYZE_AFTER and connection.vendor == "postgresql":
        # Statistics for the rows just written: until autovacuum's next ANALYZE, the
        # planner would take a table that grew from nothing at once for nearly empty
        # and sort every aggregate row to group them (measured: ×2 on a 1,000,000-
        # commit history). ANALYZE reads a sample and blocks neither reads nor writes.
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {connection.ops.quote_name(MonthAggregate._meta.db_table)}")
    ops = connection.ops
    cut_at = cut or datetime.max.replace(tzinfo=UTC)
    selects: list[str] = []
    params: list[Any] = []
    if parts.runs or parts.years:
        author = scope.lens.person_sql("a.author_canonical_email")
        buckets = ["(a.span = 1 AND a.month >= %s AND a.month <= %s)" for _ in parts.runs]
        where_params: list[Any] = [scope.repo.pk, scope.fingerprint]
        for a, b in parts.runs:
            where_params += [ops.adapt_datefield_value(a), ops.adapt_datefield_value(b)]
        if parts.years:
            marks = ", ".join(["%s"] * len(parts.years))
            buckets.append(f"(a.span = 12 AND a.month IN ({marks}))")
            where_params += [ops.adapt_datefield_value(y) for y in parts.years]
        where = f"a.repository_id = %s AND a.fingerprint = %s AND ({' OR '.join(buckets)})"
        if "bots" in scope.lens.exclude:
            where += " AND NOT " + scope.lens.bot_sql(
                "a.author_canonical_name", "a.author_canonical_email"
            )
        files, file_params = scope.file_filter("a")
        # A whole month or year is at or after ``cut`` when it starts there, except the
        # month strictly holding it (``split`` read its year as months): that month
        # counts as recent or not, whichever half of it is the shorter, and that half's
        # stored rows correct it below by -1 or +1 (the same rows, so their authors and
        # last change are already in the month's: only ``recent`` moves).
        cut_month = cut_at.date() if cut is not None else date.max
        correction: tuple[Window, int] | None = None
        if cut is not None and parts.cut_month is not None:
            first, after = _midnight(parts.cut_month), _midnight(next_month(parts.cut_month))
            if cut - first <= after - cut:
                cut_month, correction = parts.cut_month, (Window(first, cut), -1)
            else:
                cut_month, correction = next_month(parts.cut_month), (Window(cut, after), 1)
        selects.append(
            f"SELECT a.path AS path, {author} AS author, a.revisions AS revs, "  # noqa: S608
            "a.added + a.deleted AS churn, "
            "CASE WHEN a.month >= %s THEN a.revisions ELSE 0 END AS recent, a.last_at AS at "
            f"FROM {MonthAggregate._meta.db_table} a WHERE {where}{files}"
        )
        params += [ops.adapt_datefield_value(cut_month), *where_params, *file_params]
        if correction is not None:
            sub = scope.within(correction[0])
            where, where_params = sub.commit_filter()
            files, file_params = sub.file_filter()
            selects.append(
                f"SELECT f.path AS path, {sub.author()} AS author, 0 AS revs, "  # noqa: S608
                f"0 AS churn, {int(correction[1])} AS recent, c.committed_at AS at "
                f"FROM {Commit._meta.db_table} c JOIN {FileChange._meta.db_table} f "
                f"ON f.commit_id = c.id WHERE {where}{files}"
            )
            params += [*where_params, *file_params]
    for window in parts.raw:
        sub = scope.within(window)
        where, where_params = sub.commit_filter()
        files, file_params = sub.file_filter()
        selects.append(
            f"SELECT f.path AS path, {sub.author()} AS author, 1 AS revs, "  # noqa: S608
            "f.added + f.deleted AS churn, "
            "CASE WHEN c.committed_at >= %s THEN 1 ELSE 0 END AS recent, c.committed_at AS at "
            f"FROM {Commit._meta.db_table} c JOIN {FileChange._meta.db_table} f "
            f"ON f.commit_id = c.id WHERE {where}{files}"
        )
        params += [ops.adapt_datetimefield_value(cut_at), *where_params, *file_params]
    return "parts AS (" + " UNION ALL ".join(selects) + ")", params
