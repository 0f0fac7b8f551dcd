"""Background precomputation of the per-month aggregates (docs/analytics.md#precomputation).

The aggregates are computed lazily by the first view that needs them
(docs/analytics.md#performance); over a long history that first view pays for every
month and year at once. When an analysis of a repository's served fingerprint completes
(``workers.jobs``: the last chunk of a plan made the repository ready), ``enqueue_precompute``
puts one low-priority job on the maintenance queue (the verifier's class, the last one:
docs/scheduling.md#classes), deduplicated per repository and fingerprint by a Redis key.
The job (``precompute``) computes, through the views' own ``ensure_*`` functions, every whole
month and year the whole-history views read:

- file aggregates (``MonthAggregate``) and directory aggregates (``DirAggregate``, every
  depth at once): the whole-history split, and the split at the hotspots' midpoint (that
  year read as months);
- the people sums (``AuthorMonth``/``AuthorWeek``): the whole-history split's years, and
  every month (one author's page reads a year as its months);
- change coupling (``CouplingAggregate``) at ``COUPLING_DEPTHS``: the whole-history split,
  then the aligned blocks of years the whole-history read sums its years from.

Each span is its own short transaction under the stamp locks the readers take; a span
whose lock stays busy past ``LOCK_WAIT_MS`` is skipped and left to the reader. No
Redlock is held, so analysis never waits for a precompute job; a fingerprint that is no
longer served stops the job before its next span."""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from functools import partial
from typing import Any

import redis
from django.conf import settings
from django.db import connection
from django.db.models import Sum
from django.utils import timezone

from dashboard import infra, observability, runs
from dashboard.analytics import aggregates, author_months, coupling_aggregates, dir_aggregates
from dashboard.analytics.aggregates import ANALYZE_AFTER, month_of, split
from dashboard.analytics.hotspots import midpoint
from dashboard.analytics.rows import Scope
from dashboard.analytics.window import Window
from dashboard.models import (
    AuthorMonth,
    AuthorWeek,
    CouplingAggregate,
    DirAggregate,
    MonthAggregate,
    MonthStamp,
    Repository,
)
from dashboard.repositories import current_fingerprint

__all__ = [
    "COUPLING_DEPTHS",
    "PRECOMPUTE_FUNC",
    "Family",
    "PrecomputeResult",
    "enqueue_precompute",
    "families",
    "precompute",
    "precompute_status",
    "run_precompute",
]

log = logging.getLogger(__name__)

#: The RQ entry point of one precompute job (its dotted path is stored in Redis).
PRECOMPUTE_FUNC = "workers.jobs.precompute_aggregates"

#: The coupling depths precomputed: the files (0) and the directory coupling at the pages'
#: default depth (1). Deeper directory coupling is computed by its first reader.
COUPLING_DEPTHS = (0, 1)

#: On SQLite a computation holds the database's write lock; a writer waiting for it
#: retries every 100 ms at most (SQLite's busy handler). After each computed span the
#: job pauses as long as the span took, up to this: the lock is free at least half the
#: time, and after a long span for longer than one retry, so a waiting writer gets in
#: instead of being starved by span after span.
SQLITE_PAUSE = 0.12

_PENDING = "gitward:precompute:pending:{repo}:{fp}"
_RUNNING = "gitward:precompute:running:{repo}:{fp}"
_DONE = "gitward:precompute:done:{repo}:{fp}"
#: How long a finished precompute's record is kept (the status reads it).
_DONE_TTL = 30 * 86400

#: Delete the pending key only if it still holds this job's token.
_CLAIM = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


@dataclass(frozen=True)
class Family:
    """One kind of aggregates and the whole months and years precomputation makes current:
    ``months(scope, month, busy)`` and ``years(scope, january, busy)`` compute one span
    unless it is current (the view's own ``ensure_*`` functions)."""

    name: str
    months: tuple[date, ...]
    years: tuple[date, ...]
    month_fn: Callable[[Scope, date, list[date]], int]
    year_fn: Callable[[Scope, date, list[date]], int]
    table: Any
    #: Change coupling's aligned blocks of more than one year (``coupling_aggregates.blocks``)
    #: the whole-history read sums its years from, as (first January, years); computed
    #: last, once their years are current, each counted as one span.
    blocks: tuple[tuple[date, int], ...] = ()
    block_fn: Callable[[Scope, tuple[date, int], list[date]], int] | None = None


@dataclass
class PrecomputeResult:
    """What one precompute did: ``outcome`` (``current``, ``superseded``, ``gone``), spans
    computed and skipped busy per family, seconds."""

    repo_id: int
    fingerprint: str
    outcome: str = "current"
    computed: dict[str, int] = field(default_factory=dict)
    busy: dict[str, int] = field(default_factory=dict)
    spans: int = 0
    seconds: float = 0.0

    @property
    def total_computed(self) -> int:
        return sum(self.computed.values())

    @property
    def total_busy(self) -> int:
        return sum(self.busy.values())

    def line(self) -> str:
        if self.outcome != "current":
            return f"repository {self.repo_id}: {self.outcome}, nothing computed"
        parts = ", ".join(f"{k} {v}" for k, v in self.computed.items() if v) or "nothing"
        busy = f"; {self.total_busy} busy, left to readers" if self.total_busy else ""
        return (
            f"repository {self.repo_id}: {self.spans} spans, computed {parts}{busy} "
            f"in {self.seconds:.1f}s"
        )


def _all_months(parts: aggregates.Split) -> list[date]:
    return aggregates._months(parts.runs)


def _one_month(fn: Callable[..., int]) -> Callable[[Scope, date, list[date]], int]:
    return lambda scope, m, busy: fn(scope, ((m, m),), busy)


def _one_year(fn: Callable[..., int]) -> Callable[[Scope, date, list[date]], int]:
    return lambda scope, y, busy: fn(scope, (y,), busy)


def _coupling_month(depth: int) -> Callable[[Scope, date, list[date]], int]:
    def one(scope: Scope, month: date, busy: list[date]) -> int:
        return coupling_aggregates.ensure_months(scope, depth, ((month, month),), busy)

    return one


def _coupling_year(depth: int) -> Callable[[Scope, date, list[date]], int]:
    def one(scope: Scope, january: date, busy: list[date]) -> int:
        return coupling_aggregates.ensure_years(scope, depth, (january,), busy)

    return one


def _coupling_block(depth: int) -> Callable[[Scope, tuple[date, int], list[date]], int]:
    def one(scope: Scope, block: tuple[date, int], busy: list[date]) -> int:
        january, n = block
        inside = tuple(date(january.year + k, 1, 1) for k in range(n))
        # The block and the smaller blocks inside it it is summed from: one span here.
        return min(1, coupling_aggregates.ensure_blocks(scope, depth, inside, busy))

    return one


def families(scope: Scope) -> list[Family]:
    """The aggregates the whole-history views of ``scope`` read, as of now (the month now
    running and the hotspots' midpoint move with the clock)."""
    whole = split(scope)
    mid = midpoint(scope)
    cut = split(scope, mid) if mid is not None else whole
    months = tuple(sorted(set(_all_months(whole)) | set(_all_months(cut))))
    years = tuple(sorted(set(whole.years) | set(cut.years)))
    in_years = {y.replace(month=k) for y in whole.years for k in range(1, 13)}
    people = tuple(sorted(set(_all_months(whole)) | in_years))
    found = [
        Family(
            "files",
            months,
            years,
            _one_month(aggregates.ensure_months),
            _one_year(aggregates.ensure_years),
            MonthAggregate,
        ),
        Family(
            "authors",
            people,
            whole.years,
            _one_month(author_months.ensure_author_months),
            _one_year(author_months.ensure_author_years),
            AuthorMonth,
        ),
        Family(
            "directories",
            months,
            years,
            _one_month(dir_aggregates.ensure_dir_months),
            _one_year(dir_aggregates.ensure_dir_years),
            DirAggregate,
        ),
    ]
    for depth in COUPLING_DEPTHS:
        found.append(
            Family(
                f"coupling-{depth}",
                tuple(_all_months(whole)),
                whole.years,
                _coupling_month(depth),
                _coupling_year(depth),
                CouplingAggregate,
                tuple(b for b in coupling_aggregates.blocks(whole.years) if b[1] > 1),
                _coupling_block(depth),
            )
        )
    return found


def precompute(repo_id: int, fingerprint: str) -> PrecomputeResult:
    """Make every whole month and year the whole-history views of the repository read
    under ``fingerprint`` current (``families``); years first, then months, one span per
    transaction. Does nothing for a repository that is gone or a fingerprint that is not
    (or no longer) the served one: checked before each span, so a promote stops it.

    Race: readers and writers run beside it. Every span is computed by the readers' own
    ``ensure_*`` under the month stamps' row locks (docs/analytics.md#performance): a
    reader computing the same span waits for it and finds it current, or it finds the
    reader's work current; a write committed before the lock is in the rows read, one
    committed after bumps a version and the span is stale again for the next reader or
    precompute. A span whose lock stays busy (a writer holds it) is skipped, never waited for."""
    started = time.monotonic()
    result = PrecomputeResult(repo_id, fingerprint)
    repo = Repository.objects.filter(pk=repo_id).first()
    if repo is None:
        result.outcome = "gone"
    elif current_fingerprint() != fingerprint:
        result.outcome = "superseded"
    else:
        scope = Scope.of(repo, Window(), fingerprint)
        _precompute_families(scope, result)
    result.seconds = time.monotonic() - started
    observability.observe_precompute(result.seconds, outcome=result.outcome)
    for name, n in result.computed.items():
        observability.count_precompute_spans(name, "computed", n)
    for name, n in result.busy.items():
        observability.count_precompute_spans(name, "busy", n)
    return result


def _precompute_families(scope: Scope, result: PrecomputeResult) -> None:
    tables: dict[Any, int] = {}
    for family in families(scope):
        result.computed.setdefault(family.name, 0)
        result.busy.setdefault(family.name, 0)
        spans: list[Callable[[list[date]], int]] = []
        spans += [partial(family.year_fn, scope, y) for y in family.years]
        spans += [partial(family.month_fn, scope, m) for m in family.months]
        if family.block_fn is not None:
            spans += [partial(family.block_fn, scope, b) for b in family.blocks]
        result.spans += len(spans)
        for fn in spans:
            if current_fingerprint() != scope.fingerprint:
                result.outcome = "superseded"
                return
            busy: list[date] = []
            took = time.monotonic()
            n = fn(busy)
            took = time.monotonic() - took
            result.computed[family.name] += n
            result.busy[family.name] += 1 if busy else 0
            if n:
                tables[family.table] = tables.get(family.table, 0) + n
                if connection.vendor == "sqlite":
                    time.sleep(min(took, SQLITE_PAUSE))
    if connection.vendor == "postgresql":
        # Statistics for the rows just written, as a reader computing as many does
        # (aggregates.file_parts): the readers after a precompute compute nothing, so they
        # would not refresh them. ANALYZE reads a sample and blocks nobody.
        if AuthorMonth in tables:
            tables[AuthorWeek] = tables[AuthorMonth]
        with connection.cursor() as cursor:
            for table, n in tables.items():
                if n >= ANALYZE_AFTER:
                    cursor.execute(f"ANALYZE {connection.ops.quote_name(table._meta.db_table)}")


def _versions(repo_id: int, fingerprint: str) -> int:
    """The sum of the repository's month versions: it grows with every write of its
    commits (versions only grow), so an unchanged sum means nothing was written."""
    total = MonthStamp.objects.filter(repository_id=repo_id, fingerprint=fingerprint).aggregate(
        n=Sum("version")
    )["n"]
    return int(total or 0)


def enqueue_precompute(repo_id: int, fingerprint: str, *, force: bool = False) -> bool:
    """Enqueue one precompute job of the repository under ``fingerprint`` unless one is
    pending (queued and not started); True if this call enqueued it. Off with
    ``GITWARD_PRECOMPUTE_AGGREGATES=false`` (``force``: enqueue all the same, for the
    operator's ``manage.py precompute --enqueue``). Raises ``QueueUnavailable`` while the queue
    server is unreachable (the pending key is given back first).

    Race: a burst of completions (many quick pushes). The pending key is set with
    ``SET NX``: exactly one caller sets it and enqueues; the others find it set and
    return, which is safe because their commits were committed before this call and
    the pending job has not started yet (it deletes the key first, ``run_precompute``), so
    it reads them. A completion after that deletion sets the key again and enqueues a
    new job (its id carries its token, so RQ never refuses it as the running one's).
    The key expires after twice the job timeout (at least an hour), so a job lost with
    its queue never blocks precomputation for good; a pending job older than that makes a
    second one, which finds its spans current (cheap: stamp reads)."""
    if not (settings.PRECOMPUTE_AGGREGATES or force):
        return False
    conn = infra.connection()
    key = _PENDING.format(repo=repo_id, fp=fingerprint)
    token = uuid.uuid4().hex
    value = json.dumps({"token": token, "since": timezone.now().isoformat()})
    ttl = max(3600, 2 * int(settings.JOB_TIMEOUT))
    if not conn.set(key, value, nx=True, ex=ttl):
        return False
    try:
        infra.enqueue_unique(
            infra.queue(infra.MAINTENANCE_QUEUE),
            PRECOMPUTE_FUNC,
            repo_id,
            fingerprint,
            value,
            job_id=f"precompute-{repo_id}-{token[:16]}",
            priority=runs.VERIFICATION,  # the last class (docs/scheduling.md#classes)
        )
    except infra.QueueUnavailable:
        with contextlib.suppress(infra.QueueUnavailable, redis.RedisError):
            conn.delete(key)  # else it expires
        raise
    return True


def run_precompute(repo_id: int, fingerprint: str, pending: str | None = None) -> str:
    """One precompute job (the body of ``workers.jobs.precompute_aggregates`` and of
    ``manage.py precompute``): give back the pending key (``pending``: the value this job
    was enqueued with), mark it running, ``precompute``, then record what it made current
    for ``precompute_status``. The bookkeeping in Redis is best effort: with the queue
    server away the precompute still runs and only its status is not shown."""
    running = _RUNNING.format(repo=repo_id, fp=fingerprint)
    if pending is not None:
        # Before any read: a completion from now on enqueues a new job (enqueue_precompute).
        _redis(lambda c: c.eval(_CLAIM, 1, _PENDING.format(repo=repo_id, fp=fingerprint), pending))
    _redis(lambda c: c.set(running, timezone.now().isoformat(), ex=int(settings.JOB_TIMEOUT)))
    # Taken before any span is computed: a write during the precompute changes the sum, so
    # the status says ``stale`` rather than claim a month the write left stale is precompute.
    versions = _versions(repo_id, fingerprint)
    try:
        result = precompute(repo_id, fingerprint)
    finally:
        _redis(lambda c: c.delete(running))
    if result.outcome == "current":
        record = {
            "at": timezone.now().isoformat(),
            "month": month_of(timezone.now()).isoformat(),
            "versions": versions,
            "spans": result.spans,
            "computed": result.total_computed,
            "busy": result.total_busy,
            "seconds": round(result.seconds, 3),
        }
        done = _DONE.format(repo=repo_id, fp=fingerprint)
        _redis(lambda c: c.set(done, json.dumps(record), ex=_DONE_TTL))
    return result.line()


def _redis(call: Callable[[Any], object]) -> None:
    try:
        call(infra.connection())
    except (infra.QueueUnavailable, redis.RedisError) as exc:
        log.warning("aggregates precomputation: status not recorded (%s)", exc)


def _text(raw: Any) -> str | None:
    if raw is None:
        return None
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def precompute_status(repo: Repository, *, fingerprint: str | None = None) -> dict[str, Any] | None:
    """Whether the whole-history aggregates of ``repo`` are precompute, from the last precompute's
    record (one Redis read; one database query when a record exists): ``state``
    ``queued``/``precomputation`` (with ``since``), ``precompute`` (nothing written and no month
    became whole since: ``spans``, ``busy``, ``at``), ``stale`` (written since, or a
    month became whole: its first reader computes what changed), or ``cold`` (never
    precomputed). None while the queue server is unreachable."""
    fp = fingerprint or current_fingerprint()
    keys = [k.format(repo=repo.pk, fp=fp) for k in (_PENDING, _RUNNING, _DONE)]
    try:
        found: Any = infra.connection().mget(keys)
        pending, running, done = (_text(v) for v in found)
    except (infra.QueueUnavailable, redis.RedisError):
        return None
    status: dict[str, Any] = {"state": "cold", "since": None, "at": None, "spans": None}
    if done is not None:
        record = json.loads(done)
        current = record["month"] == month_of(timezone.now()).isoformat() and record[
            "versions"
        ] == _versions(repo.pk, fp)
        status.update(
            state="current" if current else "stale",
            at=record["at"],
            spans=record["spans"],
            busy=record["busy"],
        )
    if running is not None:
        status.update(state="computing", since=running)
    elif pending is not None:
        status.update(state="queued", since=json.loads(pending)["since"])
    status["text"] = _status_text(status)
    return status


def _status_text(status: dict[str, Any]) -> str:
    state = status["state"]
    if state in {"computing", "queued"}:
        since = datetime.fromisoformat(status["since"]).astimezone(UTC)
        return f"aggregates: {state} since {since:%Y-%m-%d %H:%M} UTC"
    if state == "current":
        busy = f", {status['busy']} left to readers" if status.get("busy") else ""
        return f"aggregates: precomputed, {status['spans']} months and years{busy}"
    if state == "stale":
        return "aggregates: partly precomputed (written since the last precomputation)"
    if not settings.PRECOMPUTE_AGGREGATES:
        return "aggregates: precomputation off (the first view computes them)"
    return "aggregates: not precomputed (the first view computes them)"
