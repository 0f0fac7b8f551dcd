"""Per-month (and per-year) change-coupling aggregates (docs/analytics.md#performance): for
the files (depth 0) and the directories of each depth, per month or calendar year, each
entity's revisions and each pair's shared revisions among the change sets of at most K
files, one column per K from 2 to ``CAP`` (``CouplingAggregate.le2`` … ``le30``): one row
per entity or pair and period, whatever the sizes of its change sets. Beside months and
years, aligned **blocks** of 2, 4, 8, … years (an 8-year block starts on a year that is a
multiple of 8) hold the sums of their two halves, so a window's whole years are read as
at most two blocks per size instead of one span per year (``blocks``). Coupling over a
window then sums the whole blocks, years and months inside it, reading the threshold's column,
with the pairs of the rest of the window (its partial edge months, the month now
running) read from the stored rows, as ``dashboard.analytics.aggregates`` splits a window
for the file views.

Exact where used: no lens leaves anything out (a path lens changes change-set sizes and
``bots`` whole revisions, so both are read from the stored rows; the identity map does
not touch coupling) and ``max_changeset_size`` is at most ``CAP``. Elsewhere the caller
computes at read time (``applies``).

Kept current by the same ``MonthStamp`` versions as the file aggregates, with the
coupling's own record of the version each month and depth was computed at
(``CouplingStamp``), and of the sum of its months' versions each block was
(``CouplingBlockStamp``)."""

from __future__ import annotations

from datetime import UTC, date, datetime, time
from typing import Any

from django.db import connection

from dashboard.analytics.aggregates import (
    Busy,
    Split,
    _short_wait,
    compute_stale,
    lock_months,
    next_month,
    next_year,
    settle,
    split,
)
from dashboard.analytics.rows import MAX_DEPTH, Scope, directory_ctes
from dashboard.models import (
    Commit,
    CouplingAggregate,
    CouplingBlockStamp,
    CouplingStamp,
    FileChange,
    MonthStamp,
)

__all__ = [
    "CAP",
    "MAX_BLOCK_YEARS",
    "applies",
    "blocks",
    "coupling_ctes",
    "ensure",
    "ensure_blocks",
    "ensure_months",
    "ensure_years",
]

#: The largest change set (in files) the aggregates count: code-maat's and the API's
#: default ``max_changeset_size``. A pair table grows with the square of the change-set
#: size, so larger thresholds are computed at read time.
CAP = 30

#: The longest aligned block of years read as one span (a power of two; 1 reads years
#: only, the layout before blocks). Its span in months, 12 × this, must fit
#: ``CouplingAggregate.span`` (a SmallIntegerField).
MAX_BLOCK_YEARS = 1024

#: A request that computed this many months and years at once refreshes the table's
#: statistics (PostgreSQL), as ``aggregates.ANALYZE_AFTER``.
ANALYZE_AFTER = 12

_C = Commit._meta.db_table
_F = FileChange._meta.db_table
_A = CouplingAggregate._meta.db_table


#: The per-threshold columns, ``le2`` … ``le30``.
_COLUMNS = ", ".join(f"le{k}" for k in range(2, CAP + 1))


def _sums(size: str) -> str:
    """Per column ``leK`` the rows whose change-set size (the SQL ``size``) is at most K."""
    return ", ".join(f"SUM(CASE WHEN {size} <= {k} THEN 1 ELSE 0 END)" for k in range(2, CAP + 1))


def applies(scope: Scope, max_changeset_size: int) -> bool:
    """Whether coupling over ``scope`` may read the aggregates: aggregates on, no lens
    leaving anything out, the size threshold within ``CAP``."""
    return scope.aggregates and not scope.lens.exclude and max_changeset_size <= CAP


def _midnight(day: date) -> datetime:
    return datetime.combine(day, time(0), tzinfo=UTC)


def _months(parts: Split) -> list[date]:
    out = []
    for a, b in parts.runs:
        m = a
        while m <= b:
            out.append(m)
            m = next_month(m)
    return out


def _insert(scope: Scope, depth: int, span: int, first: date, after: date) -> None:
    """INSERT … SELECT the counts of ``[first, after)`` at ``depth`` from the stored rows:
    the revisions of each entity and the shared revisions of each pair, per size limit."""
    ops = connection.ops
    head = [scope.repo.pk, scope.fingerprint, depth, span, ops.adapt_datefield_value(first)]
    where = (
        "c.repository_id = %s AND c.fingerprint = %s AND c.is_merge = %s "
        "AND c.committed_at >= %s AND c.committed_at < %s AND c.files_changed <= %s"
    )
    where_params = [
        scope.repo.pk,
        scope.fingerprint,
        False,
        ops.adapt_datetimefield_value(_midnight(first)),
        ops.adapt_datetimefield_value(_midnight(after)),
        CAP,
    ]
    cols = f"repository_id, fingerprint, depth, span, month, ea, eb, {_COLUMNS}"
    if depth == 0:
        sql = (
            f"INSERT INTO {_A} ({cols}) "  # noqa: S608
            "SELECT %s, %s, %s, %s, %s, f.path, CAST(NULL AS TEXT), "
            f"{_sums('c.files_changed')} "
            f"FROM {_C} c JOIN {_F} f ON f.commit_id = c.id WHERE {where} "
            "GROUP BY f.path "
            "UNION ALL SELECT %s, %s, %s, %s, %s, a.path, b.path, "
            f"{_sums('c.files_changed')} "
            f"FROM {_C} c JOIN {_F} a ON a.commit_id = c.id "
            f"JOIN {_F} b ON b.commit_id = c.id AND b.path > a.path WHERE {where} "
            "GROUP BY a.path, b.path"
        )
        params = [*head, *where_params, *head, *where_params]
    else:
        dirs, name = directory_ctes("paths", depth, ("path",))
        sql = (
            f"INSERT INTO {_A} ({cols}) "  # noqa: S608
            "WITH kept AS MATERIALIZED (SELECT f.commit_id AS rev, c.files_changed AS size, "
            f"f.path AS path FROM {_C} c JOIN {_F} f ON f.commit_id = c.id WHERE {where}), "
            f"paths AS (SELECT DISTINCT path FROM kept), {dirs}, "
            f"dirmap AS MATERIALIZED (SELECT path, dir FROM {name}), "
            "ents AS MATERIALIZED (SELECT DISTINCT k.rev AS rev, k.size AS size, m.dir AS e "
            "FROM kept k JOIN dirmap m ON m.path = k.path) "
            f"SELECT %s, %s, %s, %s, %s, e, CAST(NULL AS TEXT), {_sums('size')} FROM ents "
            "GROUP BY e UNION ALL "
            f"SELECT %s, %s, %s, %s, %s, a.e, b.e, {_sums('a.size')} FROM ents a "
            "JOIN ents b ON b.rev = a.rev AND b.e > a.e GROUP BY a.e, b.e"
        )
        params = [*where_params, *head, *head]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def _compute(scope: Scope, depth: int, span: int, first: date) -> None:
    """Compute one month's (``span`` 1) or calendar year's (12) counts at ``depth`` from
    the stored rows, unless they are current.

    Race: two readers computing the same month, and a write of its commits. As
    ``aggregates._compute``: the months' ``MonthStamp`` rows are created if missing
    (ON CONFLICT DO NOTHING) and locked in ascending month order (PostgreSQL FOR UPDATE;
    SQLite's write transaction holds the database's lock), the order writers bump them
    in (``repositories.bump_months``), so no cycle. A write committed before the lock is
    in the rows the INSERT … SELECT reads (a later statement); one committed after raises
    a version, and the next reader computes again. The second of two readers waits on
    the lock, then finds the ``CouplingStamp`` record current (created and updated only
    under that lock, so its get-or-create never races). The lock is waited for at most
    ``aggregates.LOCK_WAIT_MS`` (``Busy``: the caller reads that span from the stored
    rows, ``aggregates.settle``), so a read never queues behind a writer."""
    repo_id, fp = scope.repo.pk, scope.fingerprint
    months = [first] if span == 1 else [first.replace(month=k) for k in range(1, 13)]
    with _short_wait():
        record = sum(version for version, _ in lock_months(scope, months, "month"))
        field = "aggregated" if span == 1 else "year_aggregated"
        stamp, _ = CouplingStamp.objects.get_or_create(
            repository_id=repo_id, fingerprint=fp, month=first, depth=depth
        )
        if getattr(stamp, field) == record:
            return
        CouplingAggregate.objects.filter(
            repository_id=repo_id, fingerprint=fp, depth=depth, span=span, month=first
        ).delete()
        _insert(scope, depth, span, first, next_month(first) if span == 1 else next_year(first))
        CouplingStamp.objects.filter(pk=stamp.pk).update(**{field: record})


def _stamps(
    scope: Scope, depth: int, lo: date, hi: date
) -> tuple[dict[date, int], dict[date, tuple[int | None, int | None]]]:
    """The months' versions and this depth's records from ``lo`` to ``hi`` (two queries)."""
    base = {"repository_id": scope.repo.pk, "fingerprint": scope.fingerprint}
    versions = dict(
        MonthStamp.objects.filter(**base, month__gte=lo, month__lte=hi).values_list(
            "month", "version"
        )
    )
    mine = {
        m: (a, y)
        for m, a, y in CouplingStamp.objects.filter(
            **base, depth=depth, month__gte=lo, month__lte=hi
        ).values_list("month", "aggregated", "year_aggregated")
    }
    return versions, mine


def ensure_months(
    scope: Scope, depth: int, runs: tuple[tuple[date, date], ...], busy: list[date] | None = None
) -> int:
    """Make the counts at ``depth`` of every month of ``runs`` current; returns how many
    were computed. A month whose lock stayed busy is left stale and added to ``busy``
    (raised as ``Busy`` without a list), and so is every stale month after it, as
    ``aggregates.ensure_months`` does (docs/analytics.md#performance)."""
    months = _months(Split(runs))
    if not months:
        return 0
    versions, mine = _stamps(scope, depth, months[0], months[-1])
    stale = [m for m in months if m not in versions or mine.get(m, (None, None))[0] != versions[m]]
    return compute_stale(stale, lambda month: _compute(scope, depth, 1, month), busy)


def ensure_years(
    scope: Scope,
    depth: int,
    years: tuple[date, ...],
    busy: list[date] | None = None,
    *,
    skip: bool = False,
) -> int:
    """Make the counts at ``depth`` of every year of ``years`` current; returns how many
    were computed. A busy year is left stale and added to ``busy``, and so is every
    stale year after it (or every one, with ``skip``), as ``aggregates.ensure_years``."""
    if not years:
        return 0
    versions, mine = _stamps(scope, depth, years[0], years[-1].replace(month=12))

    def current(january: date) -> bool:
        year = [versions.get(january.replace(month=k)) for k in range(1, 13)]
        recorded = mine.get(january, (None, None))[1]
        return None not in year and recorded == sum(v for v in year if v is not None)

    stale = [january for january in years if not current(january)]
    return compute_stale(
        stale, lambda january: _compute(scope, depth, 12, january), busy, skip=skip
    )


def blocks(years: tuple[date, ...]) -> tuple[tuple[date, int], ...]:
    """``years`` (Januaries) as the fewest aligned blocks, in order: from each year on,
    the longest block of 2^k years (at most ``MAX_BLOCK_YEARS``) that starts on a year
    divisible by 2^k and holds only years of ``years``; each as (its first January, its
    number of years). A run of Y consecutive years takes at most 2·log2(Y) + 1 blocks, and
    the years of some of a run's blocks, taken out, leave the run's other blocks as the
    blocks of the years left (``settle`` moves a busy block's years to the stored rows)."""
    have = {y.year for y in years}
    out: list[tuple[date, int]] = []
    year = min(have, default=0)
    while have:
        if year not in have:
            year = min(have)
        n = 1
        while (
            n * 2 <= MAX_BLOCK_YEARS
            and year % (n * 2) == 0
            and all(year + k in have for k in range(n, n * 2))
        ):
            n *= 2
        out.append((date(year, 1, 1), n))
        have -= set(range(year, year + n))
        year += n
    return tuple(out)


def _block_months(january: date, n: int) -> list[date]:
    return [date(january.year + y, k, 1) for y in range(n) for k in range(1, 13)]


def _halves(january: date, n: int) -> tuple[tuple[date, int], tuple[date, int]]:
    half = n // 2
    return (january, half), (january.replace(year=january.year + half), half)


class _Records:
    """The months' versions and this depth's year and block records over a range, read
    once (three queries) to tell which blocks are current without a lock."""

    def __init__(self, scope: Scope, depth: int, lo: date, hi: date) -> None:
        self.versions, mine = _stamps(scope, depth, lo, hi)
        self.years = {m: y for m, (_, y) in mine.items()}
        self.blocks = {
            (span, month): value
            for span, month, value in CouplingBlockStamp.objects.filter(
                repository_id=scope.repo.pk,
                fingerprint=scope.fingerprint,
                depth=depth,
                month__gte=lo,
                month__lte=hi,
            ).values_list("span", "month", "aggregated")
        }

    def current(self, january: date, n: int) -> bool:
        found = [self.versions.get(m) for m in _block_months(january, n)]
        if None in found:
            return False
        total = sum(v for v in found if v is not None)
        if n == 1:
            return self.years.get(january) == total
        return self.blocks.get((12 * n, january)) == total


def _compute_block(scope: Scope, depth: int, january: date, n: int) -> None:
    """Compute one aligned block of ``n`` years (``n`` ≥ 2) at ``depth`` as the sum of its
    two halves' rows (each a block of ``n``/2 years, or a year), unless it is current: its
    ``CouplingBlockStamp`` records the sum of the versions of all its ``12·n`` months.

    Race: as ``_compute`` for a year, over all the block's months: their ``MonthStamp``
    rows are created if missing and locked in ascending month order, the order writers
    bump them in and readers computing a month, year or smaller block lock theirs, so no
    cycle. Under those locks no month of the block can change: a half whose record is the
    sum of its months' versions (read under the lock) holds exactly the stored rows of
    its months, and the block sums them; a half that is not current (a write committed
    between the caller's computing it and this lock) is computed again here, inside this
    transaction (nested: its own locks are already ours). A write committed after the lock
    raises a month's version, hence the block's sum, and the next reader computes it
    again. The second of two readers waits on the lock, then finds the record current
    (created and updated only under the lock). The lock is waited for at most
    ``aggregates.LOCK_WAIT_MS`` (``Busy``), as for a month."""
    repo_id, fp = scope.repo.pk, scope.fingerprint
    ops = connection.ops
    months = _block_months(january, n)
    with _short_wait():
        versions = {month: version for version, month in lock_months(scope, months, "month")}
        stamp, _ = CouplingBlockStamp.objects.get_or_create(
            repository_id=repo_id, fingerprint=fp, depth=depth, span=12 * n, month=january
        )
        total = sum(versions.values())
        if stamp.aggregated == total:
            return
        for first, size in _halves(january, n):
            record: int | None
            if size == 1:
                record = (
                    CouplingStamp.objects.filter(
                        repository_id=repo_id, fingerprint=fp, month=first, depth=depth
                    )
                    .values_list("year_aggregated", flat=True)
                    .first()
                )
            else:
                record = (
                    CouplingBlockStamp.objects.filter(
                        repository_id=repo_id,
                        fingerprint=fp,
                        depth=depth,
                        span=12 * size,
                        month=first,
                    )
                    .values_list("aggregated", flat=True)
                    .first()
                )
            if record != sum(versions[m] for m in _block_months(first, size)):
                if size == 1:
                    _compute(scope, depth, 12, first)
                else:
                    _compute_block(scope, depth, first, size)
        CouplingAggregate.objects.filter(
            repository_id=repo_id, fingerprint=fp, depth=depth, span=12 * n, month=january
        ).delete()
        (a, size), (b, _) = _halves(january, n)
        sums = ", ".join(f"SUM(le{k})" for k in range(2, CAP + 1))
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {_A} (repository_id, fingerprint, depth, span, month, ea, eb, "  # noqa: S608
                f"{_COLUMNS}) SELECT %s, %s, %s, %s, %s, ea, eb, {sums} FROM {_A} "
                "WHERE repository_id = %s AND fingerprint = %s AND depth = %s AND span = %s "
                "AND month IN (%s, %s) GROUP BY ea, eb",
                [
                    repo_id,
                    fp,
                    depth,
                    12 * n,
                    ops.adapt_datefield_value(january),
                    repo_id,
                    fp,
                    depth,
                    12 * size,
                    ops.adapt_datefield_value(a),
                    ops.adapt_datefield_value(b),
                ],
            )
        CouplingBlockStamp.objects.filter(pk=stamp.pk).update(aggregated=total)


def _make(scope: Scope, depth: int, january: date, n: int, records: _Records) -> int:
    """Make one block (or year) current, its halves first, each in its own short
    transaction (a writer waits for one span's computation, never for a whole block's
    years); returns how many spans were computed. ``Busy`` propagates."""
    if records.current(january, n):
        return 0
    if n == 1:
        _compute(scope, depth, 12, january)
        return 1
    computed = sum(_make(scope, depth, first, size, records) for first, size in _halves(january, n))
    _compute_block(scope, depth, january, n)
    return computed + 1


def ensure_blocks(
    scope: Scope,
    depth: int,
    years: tuple[date, ...],
    busy: list[date] | None = None,
    *,
    skip: bool = False,
) -> int:
    """Make the counts at ``depth`` of the aligned blocks covering ``years`` (``blocks``)
    current; returns how many years and blocks were computed. A block found current is
    not looked into; a stale one is summed from its halves, made current first. A block
    whose lock (or one of its halves') stayed busy is left stale and each of its years
    added to ``busy`` (raised as ``Busy`` without a list), and so is every stale block
    after it (or every one, with ``skip``), as ``ensure_years``: the caller reads those
    years from the stored rows (``aggregates.settle``); the blocks of the years left are
    the same blocks (``blocks`` of a part of a run)."""
    if not years:
        return 0
    wanted = blocks(years)
    last, n = wanted[-1]
    records = _Records(scope, depth, wanted[0][0], date(last.year + n - 1, 12, 1))
    computed = 0
    for january, n in wanted:
        if records.current(january, n):
            continue
        inside = [date(january.year + k, 1, 1) for k in range(n)]
        if busy is not None and (busy or skip):
            busy.extend(inside)
            continue
        try:
            computed += _make(scope, depth, january, n, records)
        except Busy:
            if busy is None:
                raise
            busy.extend(inside)
    return computed


def ensure(scope: Scope, depth: int, parts: Split) -> tuple[Split, int]:
    """Make the counts at ``depth`` of every whole month of ``parts`` and of the blocks
    covering its whole years (``blocks``) current; returns the split to read (a span whose
    lock a writer holds moved to the stored rows, ``aggregates.settle``) and how many
    were computed."""
    if not 0 <= depth <= MAX_DEPTH:
        raise ValueError(f"depth must be between 0 and {MAX_DEPTH}")
    settled, computed = settle(
        scope,
        parts,
        lambda sc, runs, busy: ensure_months(sc, depth, runs, busy),
        lambda sc, years, busy, skip=False: ensure_blocks(sc, depth, years, busy, skip=skip),
    )
    if computed >= ANALYZE_AFTER and connection.vendor == "postgresql":
        # Statistics for the rows just written (as aggregates.file_parts does): ANALYZE
        # reads a sample and blocks neither reads nor writes.
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {connection.ops.quote_name(_A)}")
    return settled, computed


def coupling_ctes(
    scope: Scope, max_changeset_size: int, *, depth: int = 0, path: str | None = None
) -> tuple[str, list[Any]] | None:
    """``shared(ea, eb, shared)`` and ``revs(e, n)``: CTE bodies (without WITH) summing the
    aggregates of the window's whole months and years and the stored rows of the rest,
    equal to what ``coupling`` counts at read time; files (``depth`` 0, and with ``path``
    only its pairs, ``ea`` = ``path``) or directories ``depth`` deep. None when the window
    holds no whole month (read it from the stored rows)."""
    parts = split(scope)
    if not (parts.runs or parts.years):
        return None
    parts, _ = ensure(scope, depth, parts)
    if not (parts.runs or parts.years):
        return None  # every whole span's lock was busy: all of it from the stored rows
    ops = connection.ops
    # One branch per kind of span, each searching the index on (repository, fingerprint,
    # depth, span, month) for its own span and months: with the spans OR-ed in one WHERE,
    # SQLite searched the index on (repository, fingerprint, depth) alone and filtered
    # every row of the depth (measured: ×5 on 1,000,000 commits, docs/analytics.md#performance).
    buckets: list[tuple[str, list[Any]]] = [
        (
            "a.span = 1 AND a.month >= %s AND a.month <= %s",
            [ops.adapt_datefield_value(lo), ops.adapt_datefield_value(hi)],
        )
        for lo, hi in parts.runs
    ]
    # The whole years as the blocks ``ensure`` made current: those of the years left
    # after ``settle`` moved a busy block's years to the stored rows.
    spans: dict[int, list[date]] = {}
    for january, n in blocks(parts.years):
        spans.setdefault(12 * n, []).append(january)
    for span, januaries in sorted(spans.items()):
        marks = ", ".join(["%s"] * len(januaries))
        buckets.append(
            (
                f"a.span = {int(span)} AND a.month IN ({marks})",
                [ops.adapt_datefield_value(y) for y in januaries],
            )
        )
    if not 2 <= max_changeset_size <= CAP:
        raise ValueError(f"max_changeset_size must be between 2 and {CAP}")
    # The column of the threshold: an integer checked just above, never a value from
    # the request's text.
    column = f"a.le{int(max_changeset_size)}"

    def agg(
        select: str, select_params: list[Any], rest: str, rest_params: list[Any]
    ) -> tuple[str, list[Any]]:
        """``SELECT select FROM`` the aggregate rows of every bucket ``AND rest``."""
        sqls: list[str] = []
        params: list[Any] = []
        for bucket, bucket_params in buckets:
            sqls.append(
                f"SELECT {select} FROM {_A} a WHERE a.repository_id = %s "  # noqa: S608
                f"AND a.fingerprint = %s AND a.depth = %s AND {bucket} AND {column} > 0 "
                f"AND {rest}"
            )
            params += [
                *select_params,
                scope.repo.pk,
                scope.fingerprint,
                depth,
                *bucket_params,
                *rest_params,
            ]
        return " UNION ALL ".join(sqls), params

    head: list[str] = []
    head_params: list[Any] = []
    pair_selects: list[tuple[str, list[Any]]] = []
    rev_selects: list[tuple[str, list[Any]]] = [
        agg(f"a.ea AS e, {column} AS n", [], "a.eb IS NULL", [])
    ]
    if path is None:
        pair_selects.append(
            agg(f"a.ea AS ea, a.eb AS eb, {column} AS n", [], "a.eb IS NOT NULL", [])
        )
    else:
        pair_selects.append(
            agg(
                f"%s AS ea, CASE WHEN a.ea = %s THEN a.eb ELSE a.ea END AS eb, {column} AS n",
                [path, path],
                "a.eb IS NOT NULL AND (a.ea = %s OR a.eb = %s)",
                [path, path],
            )
        )
    if parts.raw:
        # The rest of the window from the stored rows, as coupling._kept reads them
        # (no lens here, so a change set's size is ``files_changed``).
        wheres, where_params = [], []
        for window in parts.raw:
            w, p = scope.within(window).commit_filter()
            wheres.append(f"({w})")
            where_params += p
        head.append(
            "kept AS MATERIALIZED (SELECT f.commit_id AS rev, f.path AS path "  # noqa: S608
            f"FROM {_C} c JOIN {_F} f ON f.commit_id = c.id "
            f"WHERE ({' OR '.join(wheres)}) AND c.files_changed <= %s)"
        )
        head_params += [*where_params, max_changeset_size]
        if depth == 0:
            rev_selects.append(("SELECT path AS e, 1 AS n FROM kept", []))
            if path is None:
                join, join_params = "b.path > a.path", []
            else:
                join, join_params = "a.path = %s AND b.path <> a.path", [path]
            pair_selects.append(
                (
                    "SELECT a.path AS ea, b.path AS eb, 1 AS n FROM kept a "  # noqa: S608
                    f"JOIN {_F} b ON b.commit_id = a.rev AND {join}",
                    join_params,
                )
            )
        else:
            dirs, name = directory_ctes("paths", depth, ("path",))
            head.append(
                "paths AS (SELECT DISTINCT path FROM kept), "  # noqa: S608
                f"{dirs}, dirmap AS MATERIALIZED (SELECT path, dir FROM {name}), "
                "rents AS MATERIALIZED (SELECT DISTINCT kept.rev AS rev, dirmap.dir AS e "
                "FROM kept JOIN dirmap ON dirmap.path = kept.path)"
            )
            rev_selects.append(("SELECT e, 1 AS n FROM rents", []))
            pair_selects.append(
                (
                    "SELECT a.e AS ea, b.e AS eb, 1 AS n FROM rents a "
                    "JOIN rents b ON b.rev = a.rev AND b.e > a.e",
                    [],
                )
            )
    pairs_sql = " UNION ALL ".join(s for s, _ in pair_selects)
    revs_sql = " UNION ALL ".join(s for s, _ in rev_selects)
    head.append(
        f"allpairs AS ({pairs_sql}), "  # noqa: S608
        "shared AS (SELECT ea, eb, SUM(n) AS shared FROM allpairs GROUP BY ea, eb), "
        f"allrevs AS ({revs_sql}), revs AS (SELECT e, SUM(n) AS n FROM allrevs GROUP BY e)"
    )
    params = [
        *head_params,
        *(p for _, ps in pair_selects for p in ps),
        *(p for _, ps in rev_selects for p in ps),
    ]
    return ", ".join(head), params
