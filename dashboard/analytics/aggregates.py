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
it, are always read from the stored rows.

A read never waits long for the database's writers (docs/analytics.md#performance): a
stale month or year is computed in its own short transaction that waits at most
``LOCK_WAIT_MS`` for its lock (SQLite's write lock, taken at BEGIN IMMEDIATE; on
PostgreSQL the stamp rows a fenced write holds); a busy one is read from the stored rows
this time, like the month now running, and computed by a later read."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, time
from typing import Any

from django.db import OperationalError, connection, transaction
from django.db.models import F
from django.utils import timezone

from dashboard.analytics.rows import Scope, as_instant, fetch
from dashboard.analytics.window import Window
from dashboard.models import Commit, FileChange, MonthAggregate, MonthStamp

__all__ = [
    "LOCK_WAIT_MS",
    "Split",
    "compute_stale",
    "current_months",
    "current_years",
    "ensure_months",
    "ensure_years",
    "file_parts",
    "settle",
    "split",
]


#: A request that computed this many months and years at once refreshes the aggregate
#: table's statistics (PostgreSQL).
ANALYZE_AFTER = 12
#: How long a read waits for the lock to compute one stale month or year before it
#: reads that span from the stored rows instead (docs/analytics.md#performance).
LOCK_WAIT_MS = 50


class Busy(Exception):
    """The lock to compute a month or year was not free within ``LOCK_WAIT_MS``."""


@contextlib.contextmanager
def _short_wait() -> Iterator[None]:
    """One computation's transaction, waiting at most ``LOCK_WAIT_MS`` for its lock, else
    ``Busy`` (nothing written: the transaction is rolled back, or never began).

    SQLite: BEGIN IMMEDIATE waits the connection's busy timeout (60 s,
    dashboard/settings.py) for the write lock, so it is lowered around the BEGIN and the
    transaction, then set back. PostgreSQL: ``SET LOCAL lock_timeout`` bounds the stamp
    rows' locks (a fenced write holds them until it commits) and ends with the
    transaction. Inside a caller's transaction (a savepoint) nothing is bounded: that
    caller already holds SQLite's write lock, or chose to wait. Race: a writer taking the
    lock between our check and our BEGIN is what the bound is for; the month is then
    read from the stored rows, never from stale aggregates."""
    nested = connection.in_atomic_block
    if nested or connection.vendor not in ("sqlite", "postgresql"):
        with transaction.atomic():
            yield
        return
    try:
        if connection.vendor == "sqlite":
            with connection.cursor() as cursor:
                cursor.execute("PRAGMA busy_timeout")
                (before,) = cursor.fetchone()
                cursor.execute(f"PRAGMA busy_timeout = {int(LOCK_WAIT_MS)}")
            try:
                with transaction.atomic():
                    yield
            finally:
                with connection.cursor() as cursor:
                    cursor.execute(f"PRAGMA busy_timeout = {int(before)}")
        else:
            with transaction.atomic():
                with connection.cursor() as cursor:
                    cursor.execute(f"SET LOCAL lock_timeout = '{int(LOCK_WAIT_MS)}ms'")
                yield
    except OperationalError as exc:
        # SQLite "database is locked"; PostgreSQL LockNotAvailable (55P03).
        text = str(exc).lower()
        if "locked" in text or "lock timeout" in text or "lock_timeout" in text:
            raise Busy(str(exc)) from exc
        raise


def month_of(moment: datetime) -> date:
    """The first day of the UTC month holding ``moment``."""
    return moment.astimezone(UTC).date().replace(day=1)


def next_month(month: date) -> date:
    return date(month.year + month.month // 12, month.month % 12 + 1, 1)


def next_month_or_max(month: date) -> date:
    """``next_month``, or ``date.max`` after the last month a date holds."""
    return date.max if month >= date(9999, 12, 1) else next_month(month)


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


def _stored_span(scope: Scope) -> tuple[datetime, datetime] | None:
    """The first and last committer dates stored for the scope (one query, two index
    look-ups).

    MIN and MAX are two scalar subqueries: SQLite reads a lone MIN or MAX from one end of
    the index on (repository, fingerprint, committed_at), but both in one SELECT made it
    read every commit of the scope (measured: 390 ms against 0.1 ms at 1,000,000 commits,
    docs/analytics.md#performance), on every view reading the aggregates."""
    table = Commit._meta.db_table
    where = "c.repository_id = %s AND c.fingerprint = %s"
    sql = (
        f"SELECT (SELECT MIN(c.committed_at) FROM {table} c WHERE {where}), "  # noqa: S608
        f"(SELECT MAX(c.committed_at) FROM {table} c WHERE {where})"
    )
    first, last = fetch(sql, [scope.repo.pk, scope.fingerprint] * 2)[0]
    if first is None:
        return None
    return as_instant(first), as_instant(last)


def split(scope: Scope, cut: datetime | None = None) -> Split:
    """The whole months of the scope's window before the month now running, as whole
    years where all twelve months of one are there and ``cut`` (the hotspots' midpoint)
    is not inside it, and as months otherwise (``cut_month``: the one strictly holding
    ``cut``); and the rest of the window as raw windows.

    Only the months from the first stored commit's to the last one's are aggregated: a
    window reaching centuries before or after the history (``since=0424-09-25``) must not
    compute a row per empty month. The empty stretches outside are raw windows, read
    from the stored rows (an indexed range holding nothing, or what a later write added),
    so the answer stays exact."""
    if not scope.aggregates:
        return Split((), (scope.window,))
    start, end = scope.window.start, scope.window.end
    stored = _stored_span(scope)
    if stored is None:
        return Split((), (scope.window,))
    # a window starting before the first stored commit's month starts with that month
    whole_first = _midnight(month_of(stored[0]))
    lo = max(start, whole_first) if start else whole_first
    # the month now running is never aggregated, nor any after the last stored commit's
    limit = min(month_of(timezone.now()), next_month_or_max(month_of(stored[1])))
    if month_of(lo) >= limit:  # nothing whole before it (and no month after 9999-12)
        return Split((), (scope.window,))
    first = month_of(lo) if _midnight(month_of(lo)) == lo else next_month(month_of(lo))
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


def lock_months(scope: Scope, months: list[date], field: str) -> list[tuple[int, Any]]:
    """The months' stamp rows, created if missing and locked, in ascending month order:
    (``version``, ``field``) of each. Called inside ``_short_wait``.

    Race: two readers computing the same span, and a write of the span's commits. A
    concurrent creation is ignored by ON CONFLICT DO NOTHING; the rows are then locked
    (PostgreSQL FOR UPDATE; SQLite's IMMEDIATE transaction holds the database's write
    lock) in ascending month order, the order a writer bumps them in (``bump_months``), so
    the two never wait on each other in a cycle. The second reader waits, then finds the
    span current. A writer's bump takes the same lock: committed before ours, its rows are
    in what the caller reads next (a later statement); committed after, it leaves a
    version above what the caller records, and the next reader computes the span again."""
    repo_id, fp = scope.repo.pk, scope.fingerprint
    ops = connection.ops
    stamps = ops.quote_name(MonthStamp._meta.db_table)
    with connection.cursor() as cursor:
        cursor.executemany(
            f"INSERT INTO {stamps} (repository_id, fingerprint, month, version) "  # noqa: S608
            "VALUES (%s, %s, %s, 0) ON CONFLICT (repository_id, fingerprint, month) "
            "DO NOTHING",
            [(repo_id, fp, ops.adapt_datefield_value(m)) for m in months],
        )
    return list(
        MonthStamp.objects.select_for_update()
        .filter(repository_id=repo_id, fingerprint=fp, month__in=months)
        .order_by("month")
        .values_list("version", field)
    )


def compute_month(scope: Scope, month: date, field: str, replace: Callable[[], None]) -> None:
    """Run ``replace`` (recompute one month's rows from the stored rows) unless the
    month's stamp records its version in ``field``; then record it. At most
    ``LOCK_WAIT_MS`` behind a writer (``Busy``). Race: ``lock_months``."""
    with _short_wait():
        ((version, done),) = lock_months(scope, [month], field)
        if done == version:
            return
        replace()
        MonthStamp.objects.filter(
            repository_id=scope.repo.pk, fingerprint=scope.fingerprint, month=month
        ).update(**{field: version})


def compute_year(scope: Scope, january: date, field: str, replace: Callable[[], None]) -> None:
    """Run ``replace`` (recompute one calendar year's rows from the stored rows) unless
    its January's ``field`` records the sum of its twelve month versions; then record it.
    At most ``LOCK_WAIT_MS`` behind a writer (``Busy``). Race: ``lock_months`` (a write
    after the lock raises a month's version, hence the sum)."""
    months = [january.replace(month=k) for k in range(1, 13)]
    with _short_wait():
        locked = lock_months(scope, months, field)
        total = sum(version for version, _ in locked)
        if locked[0][1] == total:
            return
        replace()
        MonthStamp.objects.filter(
            repository_id=scope.repo.pk, fingerprint=scope.fingerprint, month=january
        ).update(**{field: total})


def _compute(scope: Scope, month: date) -> None:
    """Compute one month's file aggregates from its stored rows, unless they are current."""
    compute_month(scope, month, "aggregated", lambda: _replace(scope, 1, month, next_month(month)))


def _compute_year(scope: Scope, january: date) -> None:
    """Compute one calendar year's file aggregates from its stored rows, unless current."""
    compute_year(
        scope,
        january,
        "year_aggregated",
        lambda: _replace(scope, 12, january, next_year(january)),
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
        "last_at, language) SELECT %s, %s, %s, %s, f.path, c.author_canonical_email, "
        "c.author_canonical_name, COUNT(*), SUM(f.added), SUM(f.deleted), "
        f"MAX(c.committed_at), f.language FROM {Commit._meta.db_table} c "
        f"JOIN {FileChange._meta.db_table} f ON f.commit_id = c.id "
        "WHERE c.repository_id = %s AND c.fingerprint = %s AND c.is_merge = %s "
        "AND c.committed_at >= %s AND c.committed_at < %s "
        "GROUP BY f.path, c.author_canonical_email, c.author_canonical_name, f.language",
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


def current_years(scope: Scope, years: tuple[date, ...], field: str) -> set[date]:
    """The Januaries of ``years`` whose ``field`` (on the January's ``MonthStamp``) records
    the sum of their twelve month versions: the years whose aggregates of that kind are
    current (one query reads their months' stamps)."""
    found: dict[date, list[tuple[date, int, int | None]]] = {}
    for month, version, done in MonthStamp.objects.filter(
        repository_id=scope.repo.pk,
        fingerprint=scope.fingerprint,
        month__gte=years[0],
        month__lt=next_year(years[-1]),
    ).values_list("month", "version", field):
        found.setdefault(month.replace(month=1), []).append((month, version, done))
    current = set()
    for january in years:
        rows = sorted(found.get(january, []))
        if len(rows) == 12 and rows[0][2] == sum(version for _, version, _ in rows):
            current.add(january)
    return current


def current_months(scope: Scope, months: list[date], field: str) -> set[date]:
    """The months of ``months`` (ascending) whose ``field`` records their version: those
    whose aggregates of that kind are current (one query)."""
    return set(
        MonthStamp.objects.filter(
            repository_id=scope.repo.pk,
            fingerprint=scope.fingerprint,
            month__gte=months[0],
            month__lte=months[-1],
            **{field: F("version")},
        ).values_list("month", flat=True)
    )


def compute_stale(
    stale: Iterable[date],
    compute: Callable[[date], None],
    busy: list[date] | None = None,
    *,
    skip: bool = False,
) -> int:
    """Compute each stale span (a month or a year) with ``compute``, each in its own short
    transaction; returns how many were computed. A span whose lock stayed busy
    (``_short_wait``) is left stale and added to ``busy`` (raised as ``Busy`` without a
    list), and so is every stale span after it, or every one with ``skip``, untried: the
    lock a writer holds is held for all of them (the database's on SQLite), and a read
    pays the wait once, not once per span. Shared by every kind of aggregate."""
    computed = 0
    for span in stale:
        if busy is not None and (busy or skip):
            busy.append(span)
            continue
        try:
            compute(span)
        except Busy:
            if busy is None:
                raise
            busy.append(span)
            continue
        computed += 1
    return computed


def ensure_years(
    scope: Scope, years: tuple[date, ...], busy: list[date] | None = None, *, skip: bool = False
) -> int:
    """Make the aggregates of every year of ``years`` current; returns how many years
    were computed. Busy years: ``compute_stale``."""
    if not years:
        return 0
    current = current_years(scope, years, "year_aggregated")
    stale = [january for january in years if january not in current]
    return compute_stale(stale, lambda january: _compute_year(scope, january), busy, skip=skip)


def ensure_months(
    scope: Scope, runs: tuple[tuple[date, date], ...], busy: list[date] | None = None
) -> int:
    """Make the aggregates of every month of ``runs`` current; returns how many months
    were computed. One query finds the months that are; each other month is computed
    in its own short transaction (``_compute``). Busy months: ``compute_stale``."""
    if not runs:
        return 0
    months = _months(runs)
    current = current_months(scope, months, "aggregated")
    stale = [m for m in months if m not in current]
    return compute_stale(stale, lambda month: _compute(scope, month), busy)


def settle(
    scope: Scope,
    parts: Split,
    compute_months: Callable[..., int] | None = None,
    compute_years: Callable[..., int] | None = None,
) -> tuple[Split, int]:
    """Make the aggregates ``parts`` reads current, and return the split to read with
    how many months and years were computed: ``parts`` itself, or, where a month's or a
    year's lock stayed busy (a writer holds it; ``_short_wait``), ``parts`` with that
    span moved from the aggregates to the stored rows (``raw``), so the read neither
    waits for the writer nor combines stale aggregates with newer rows. The numbers are
    the same either way: a span's stored rows are what its aggregates sum.
    ``compute_months`` and ``compute_years`` make another family of aggregates current
    the same way (default: ``ensure_months`` and ``ensure_years``; the directory
    aggregates pass theirs)."""
    busy_months: list[date] = []
    busy_years: list[date] = []
    computed = (compute_months or ensure_months)(scope, parts.runs, busy_months)
    computed += (compute_years or ensure_years)(
        scope, parts.years, busy_years, skip=bool(busy_months)
    )
    if not busy_months and not busy_years:
        return parts, computed
    months = [m for m in _months(parts.runs) if m not in busy_months]
    runs: list[tuple[date, date]] = []
    for m in months:
        if runs and next_month(runs[-1][1]) == m:
            runs[-1] = (runs[-1][0], m)
        else:
            runs.append((m, m))
    raw = [
        *parts.raw,
        *(Window(_midnight(m), _midnight(next_month(m))) for m in busy_months),
        *(Window(_midnight(y), _midnight(next_year(y))) for y in busy_years),
    ]
    cut_month = parts.cut_month if parts.cut_month not in busy_months else None
    years = tuple(y for y in parts.years if y not in busy_years)
    return replace(parts, runs=tuple(runs), raw=tuple(raw), years=years, cut_month=cut_month), (
        computed
    )


def file_parts(scope: Scope, cut: datetime | None = None) -> tuple[str, list[Any]]:
    """``parts(path, author, revs, churn, recent, at)``: a CTE body (without WITH) of the
    scope's file rows, per path and author for the whole months (from the aggregates)
    and per row for the rest (from the stored rows): ``revs``, ``churn`` and ``recent``
    (the revisions at or after ``cut``) summed over it equal those of the stored rows,
    ``at`` its last change. The lens filters both alike: paths by ``path``, bots by the
    author's canonical name and e-mail, people through the identity map."""
    parts, computed = settle(scope, split(scope, cut))
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
