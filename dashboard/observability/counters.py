"""Counters and histograms that add up across processes and hosts: recorded in memory,
aggregated in one Redis hash on the queue server, rendered by ``dashboard.operations.prometheus``.

Why Redis, not prometheus-client's own registries or its multiprocess mode: RQ runs each
job in a work horse forked for that job alone, which exits (``os._exit``) right after —
in-process counters die with it — and workers run on many hosts, while Prometheus scrapes
the web process. Multiprocess mode shares counters through files in one directory, so
it only adds up processes of one host, and each host would need its own scrape target;
the Redis hash adds up every process of every host (and survives process restarts),
read in one ``HGETALL`` at scrape time by a custom prometheus-client Collector.

Recording never does I/O: ``count``/``observe`` add to a bounded in-process buffer
(thread-safe; the lock heartbeat thread records through it). The buffer is flushed to
Redis (one pipelined ``MULTI``/``HINCRBYFLOAT…``/``EXEC``) by ``flush()`` — called at the start
and end of every job attempt (``dashboard.observability.traces``), so a killed work horse loses at
most what it counted since its last flush — and by a daemon thread every ``FLUSH_INTERVAL`` seconds
in long-lived processes (web, worker main processes). A buffer that grows past
``MAX_FIELDS`` distinct series drops new series and counts them in
``gitward_metrics_dropped_total``: memory stays bounded if Redis is gone for long.

Fork safety: a forked child starts with an empty buffer and a fresh lock (the parent's
unflushed increments are the parent's to flush: counting them in the child too would
count them twice) and its own flusher thread on first use.

Field encoding in the hash: JSON ``[series, [[label, value], …]]``; a histogram ``h``
keeps ``h_bucket`` per upper bound (label ``le``, not cumulative), ``h_sum`` and ``h_count``.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import redis
from django.conf import settings
from django.db import transaction
from django.utils import timezone
from rq import get_current_job

from dashboard import infra
from workers import locks
from workers.locks import COUNTERS as LOCK_COUNTER_NAMES
from workers.locks import Redlock

log = logging.getLogger(__name__)

HASH = "gitward:metrics"
MAX_FIELDS = 2048
FLUSH_INTERVAL = 2.0

# ---------------------------------------------------------------------------- definitions


@dataclass(frozen=True)
class Counter:
    name: str  # without the ``_total`` suffix (prometheus-client adds it)
    help: str
    labels: tuple[str, ...] = ()


@dataclass(frozen=True)
class Histogram:
    name: str
    help: str
    buckets: tuple[float, ...]
    labels: tuple[str, ...] = ()


JOB_LABELS = ("queue", "version")
_JOB_SECONDS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)

JOBS_ENQUEUED = Counter("gitward_jobs_enqueued", "Job attempts put on a queue.", JOB_LABELS)
JOBS_STARTED = Counter("gitward_jobs_started", "Job attempts claimed by a worker.", JOB_LABELS)
JOBS_SUCCEEDED = Counter("gitward_jobs_succeeded", "Job attempts that succeeded.", JOB_LABELS)
JOBS_FAILED = Counter(
    "gitward_jobs_failed", "Job attempts that failed (crashes included).", JOB_LABELS
)
JOBS_CRASHED = Counter(
    "gitward_jobs_crashed", "Job attempts whose worker died (SIGKILL, OOM, host loss).", JOB_LABELS
)
JOBS_DEAD = Counter("gitward_jobs_dead", "Runs sent to the dead-letter queue.", JOB_LABELS)
JOBS_RETRIES = Counter("gitward_jobs_retries", "Failed attempts retried.", JOB_LABELS)
JOBS_DEFERRED = Counter(
    "gitward_jobs_deferred", "Attempts put back because another job held the lock.", JOB_LABELS
)
JOB_RUN_SECONDS = Histogram(
    "gitward_job_run_seconds",
    "Run time of a job attempt (claimed to ended).",
    _JOB_SECONDS,
    JOB_LABELS,
)
JOB_WAIT_SECONDS = Histogram(
    "gitward_job_wait_seconds",
    "Time a job attempt waited in its queue before a worker took it.",
    _JOB_SECONDS,
    JOB_LABELS,
)
LOCK_ACQUIRE_SECONDS = Histogram(
    "gitward_lock_acquire_seconds",
    "Time to acquire a Redlock lock (retries and the fencing token included).",
    (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
HTTP_REQUEST_SECONDS = Histogram(
    "gitward_http_request_seconds",
    "Server time of an HTTP request in a web process, from Django taking it (its body"
    " read) to its response ready to send: the wait for a request thread, the"
    " middleware and the view. By URL name (bounded: one per route).",
    (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    ("view",),
)
#: ``workers.locks.stats.COUNTERS`` → Prometheus counters.
LOCK_COUNTERS = {
    name: Counter(f"gitward_lock_{name}", f"Redlock {name.replace('_', ' ')}.")
    for name in (*LOCK_COUNTER_NAMES, "forced_releases")
}
LOCK_COUNTERS["refused"] = Counter(
    "gitward_lock_refusals", "Masters that refused an acquire because the key was held."
)
LOCK_COUNTERS["losses"] = Counter(
    "gitward_lock_lost", "Held locks lost (an extension found no quorum within the validity)."
)
FENCING_REJECTIONS = Counter(
    "gitward_fencing_rejections",
    "Writes rejected because their fencing token was no longer the newest.",
    ("lock",),
)
MASTER_LABELS = ("master",)
MASTER_CALLS = Counter("gitward_lock_master_calls", "Calls to a lock master.", MASTER_LABELS)
MASTER_ERRORS = Counter(
    "gitward_lock_master_errors", "Calls to a lock master that failed or timed out.", MASTER_LABELS
)
MASTER_TIMEOUTS = Counter(
    "gitward_lock_master_timeouts", "Calls to a lock master that timed out.", MASTER_LABELS
)
MASTER_SECONDS = Counter(
    "gitward_lock_master_seconds",
    "Seconds spent in calls to a lock master (divide by calls for the mean latency).",
    MASTER_LABELS,
)
DROPPED = Counter("gitward_metrics_dropped", "Increments dropped by a full metrics buffer.")
ROLLOUT_HEARTBEAT_ERRORS = Counter(
    "gitward_rollout_heartbeat_errors",
    "Rollout driver heartbeats that failed (other than a lost lease) and were retried.",
)

FETCH_HOST_DEFERRALS = Counter(
    "gitward_fetch_host_deferrals",
    "Attempts put back because their git host was at its fetch limit (why=limit), out of "
    "tokens (why=rate) or backed off after a rate-limit refusal (why=backoff).",
    ("host", "why"),
)

PRECOMPUTE_SECONDS = Histogram(
    "gitward_precompute_seconds",
    "Run time of one aggregates precompute job (docs/analytics.md#precomputation), by outcome"
    " (current, superseded, gone).",
    _JOB_SECONDS,
    ("outcome",),
)
PRECOMPUTE_SPANS = Counter(
    "gitward_precompute_spans",
    "Months and years a precompute job computed (result=computed) or skipped because a writer"
    " held their lock (result=busy), per kind of aggregates (files, authors, directories,"
    " coupling-N).",
    ("family", "result"),
)

COUNTER_DEFS: dict[str, Counter] = {
    c.name: c
    for c in (
        JOBS_ENQUEUED,
        JOBS_STARTED,
        JOBS_SUCCEEDED,
        JOBS_FAILED,
        JOBS_CRASHED,
        JOBS_DEAD,
        JOBS_RETRIES,
        JOBS_DEFERRED,
        *LOCK_COUNTERS.values(),
        FENCING_REJECTIONS,
        MASTER_CALLS,
        MASTER_ERRORS,
        MASTER_TIMEOUTS,
        MASTER_SECONDS,
        DROPPED,
        ROLLOUT_HEARTBEAT_ERRORS,
        FETCH_HOST_DEFERRALS,
        PRECOMPUTE_SPANS,
    )
}
HISTOGRAM_DEFS: dict[str, Histogram] = {
    h.name: h
    for h in (
        JOB_RUN_SECONDS,
        JOB_WAIT_SECONDS,
        LOCK_ACQUIRE_SECONDS,
        HTTP_REQUEST_SECONDS,
        PRECOMPUTE_SECONDS,
    )
}

# ---------------------------------------------------------------------------- the buffer


def _field(series: str, labels: Iterable[tuple[str, str]]) -> str:
    return json.dumps([series, [list(kv) for kv in labels]], separators=(",", ":"))


def parse_field(field: str | bytes) -> tuple[str, dict[str, str]]:
    series, labels = json.loads(field)
    return str(series), {str(k): str(v) for k, v in labels}


class _Buffer:
    def __init__(self) -> None:
        self.redlocks: list[Redlock] = []
        #: The totals last counted, per (Redlock, master): two Redlocks over the same
        #: masters (another configuration in one process) each keep their own running
        #: totals; keyed by name alone, each flush counted one's totals against the
        #: other's — increments that cancelled out or went negative.
        self.node_seen: dict[tuple[int, str], tuple[int, int, int, float]] = {}
        self._reset()
        os.register_at_fork(after_in_child=self._after_fork_in_child)

    def _reset(self) -> None:
        self.lock = threading.Lock()
        self.values: dict[str, float] = {}
        self.dropped = 0
        self.flusher: threading.Thread | None = None
        self.failing = False

    def _after_fork_in_child(self) -> None:
        self._reset()
        # Per-master calls: the child counts from the totals it inherited.
        for rl in self.redlocks:
            for node in rl.nodes:
                self.node_seen[(id(rl), node.name)] = _node_totals(node)

    def add(self, field: str, n: float) -> None:
        with self.lock:
            if field in self.values:
                self.values[field] += n
            elif len(self.values) < MAX_FIELDS:
                self.values[field] = n
            else:
                self.dropped += 1
            if self.flusher is None:
                self._start_flusher()

    def _start_flusher(self) -> None:
        # Called with the lock held; one thread per process (a forked child starts its own).
        self.flusher = threading.Thread(target=self._flush_forever, name="metrics", daemon=True)
        self.flusher.start()

    def _flush_forever(self) -> None:
        me = threading.current_thread()
        while True:
            time.sleep(FLUSH_INTERVAL)
            # A forked child's reset, or ``stop_flushing``, detaches this thread: it then
            # ends without another flush (checked after the sleep, not before it).
            if self.flusher is not me:
                return
            flush()

    def take(self) -> dict[str, float]:
        with self.lock:
            values, self.values = self.values, {}
            if self.dropped:
                values[_field(DROPPED.name, ())] = float(self.dropped)
                self.dropped = 0
            return values

    def give_back(self, values: dict[str, float]) -> None:
        for field, n in values.items():
            self.add(field, n)


_buffer = _Buffer()


def recording() -> bool:
    """``GITWARD_METRICS_RECORDING=false`` turns every recording below into a no-op (to
    measure what recording costs: ``bench/analysis.py --metrics-ab``)."""
    return bool(settings.METRICS_RECORDING)


def count(metric: Counter, n: float = 1, /, **labels: str) -> None:
    """Add ``n`` to the counter's series ``labels`` (every label of its definition)."""
    if n and recording():
        _buffer.add(_field(metric.name, _labels(metric.labels, labels)), n)


def observe(metric: Histogram, value: float, /, **labels: str) -> None:
    """Record one observation of ``value`` (seconds) in the histogram's series."""
    if not recording():
        return
    pairs = _labels(metric.labels, labels)
    bound = next((b for b in metric.buckets if value <= b), float("inf"))
    _buffer.add(_field(f"{metric.name}_bucket", [*pairs, ("le", _le(bound))]), 1)
    _buffer.add(_field(f"{metric.name}_sum", pairs), max(0.0, value))
    _buffer.add(_field(f"{metric.name}_count", pairs), 1)


def _labels(names: tuple[str, ...], given: dict[str, str]) -> list[tuple[str, str]]:
    if set(given) != set(names):
        raise ValueError(f"labels {sorted(given)} do not match {sorted(names)}")
    return [(name, str(given[name])) for name in names]


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


def flush() -> bool:
    """Send the buffer to Redis in one transaction; True if it was sent (or empty).

    On a Redis error the increments go back into the buffer for the next flush. Race: if
    the error came after Redis applied the EXEC (the reply was lost), they are counted
    twice; undercounting every Redis blip would be worse for rates and alerts.
    """
    if not recording():
        return True
    _collect_master_stats()
    values = _buffer.take()
    if not values:
        return True
    try:
        pipe = infra.connection().pipeline(transaction=True)
        for field, n in values.items():
            # Always HINCRBYFLOAT: a series that ever got a fraction (seconds, sums) holds
            # a float, and HINCRBY on it is refused ("hash value is not an integer") —
            # which failed the whole flush whenever such a series' increment happened to
            # be whole (0.0 s of master time), every flush after it too. HINCRBYFLOAT
            # also adds to an integer field, exactly below 2**53.
            pipe.hincrbyfloat(HASH, field, n)
        pipe.execute()
    except (redis.RedisError, OSError) as exc:
        if not _buffer.failing:  # once per outage, not every FLUSH_INTERVAL
            log.warning("metrics: flush to Redis failed (%s); kept for the next flush", exc)
        _buffer.failing = True
        _buffer.give_back(values)
        return False
    _buffer.failing = False
    return True


def stop_flushing() -> None:
    """Detach the flusher thread: it ends at its next wake-up without flushing. For a
    host that is closing its log streams (pytest at the end of a session) — what is
    still buffered goes out with the exit-time flush."""
    with _buffer.lock:
        _buffer.flusher = None


# A short-lived process (``manage.py submit``, a burst worker) flushes what the daemon
# thread had no time to; work horses leave by ``os._exit`` and flush per attempt instead.
def _flush_at_exit() -> None:
    # At interpreter exit log streams may already be closed (pytest closes its capture
    # first): a last flush that cannot reach Redis is dropped without logging about it.
    logging.disable(logging.CRITICAL)
    with contextlib.suppress(Exception):  # nothing left to report to
        flush()


atexit.register(_flush_at_exit)


def read_all() -> dict[str, float]:
    """Every aggregated series (``HGETALL``): encoded field → value."""
    raw: Any = infra.connection().hgetall(HASH)
    return {(k.decode() if isinstance(k, bytes) else str(k)): float(v) for k, v in raw.items()}


# ---------------------------------------------------------------------------- locks


class _LockObserver:
    """The ``workers.locks.stats.MetricsObserver`` gitward plugs into its Redlock."""

    def counted(self, name: str, n: int) -> None:
        metric = LOCK_COUNTERS.get(name)
        if metric is not None:
            count(metric, n)

    def acquired(self, took: float) -> None:
        observe(LOCK_ACQUIRE_SECONDS, took)


_LOCK_OBSERVER = _LockObserver()


def watch_redlock(redlock: Redlock) -> None:
    """Export ``redlock``'s counters, acquire latency and per-master calls."""
    redlock.metrics.observe(_LOCK_OBSERVER)
    with _buffer.lock:
        if redlock not in _buffer.redlocks:
            _buffer.redlocks.append(redlock)
            # Only what happens from now on is ours to count.
            for node in redlock.nodes:
                _buffer.node_seen[(id(redlock), node.name)] = _node_totals(node)


def _collect_master_stats() -> None:
    """Per-master deltas since the last flush. The transport keeps running totals
    (no observer on its hot path); a forked child inherits them, and starts from them."""
    with _buffer.lock:
        redlocks = list(_buffer.redlocks)
    for rl in redlocks:
        with rl.transport.stats_lock:
            current = {n.name: _node_totals(n) for n in rl.nodes}
        for name, now in current.items():
            with _buffer.lock:
                # id() is stable: a watched Redlock stays in _buffer.redlocks for good.
                before = _buffer.node_seen.get((id(rl), name), (0, 0, 0, 0.0))
                _buffer.node_seen[(id(rl), name)] = now
            master = name.rsplit("/", 1)[0]
            count(MASTER_CALLS, now[0] - before[0], master=master)
            count(MASTER_ERRORS, now[1] - before[1], master=master)
            count(MASTER_TIMEOUTS, now[2] - before[2], master=master)
            count(MASTER_SECONDS, round(now[3] - before[3], 6), master=master)


def count_fencing_rejection(resource: str) -> None:
    count(FENCING_REJECTIONS, lock=locks.parse(resource).kind)


def count_rollout_heartbeat_error() -> None:
    """A rollout driver's heartbeat failed and will be retried (docs/rollouts.md)."""
    count(ROLLOUT_HEARTBEAT_ERRORS)


def count_fetch_host_deferral(host: str, *, why: str) -> None:
    """An attempt deferred by its git host's fetch limit (``limit``), token bucket
    (``rate``) or backoff (``backoff``): docs/scheduling.md."""
    count(FETCH_HOST_DEFERRALS, host=host, why=why)


def observe_precompute(seconds: float, *, outcome: str) -> None:
    """One aggregates precompute job ended (docs/analytics.md#precomputation)."""
    observe(PRECOMPUTE_SECONDS, seconds, outcome=outcome)


def count_precompute_spans(family: str, result: str, n: int) -> None:
    """``n`` spans of ``family`` a precompute job ``computed`` or found ``busy``."""
    count(PRECOMPUTE_SPANS, n, family=family, result=result)


def _node_totals(node: Any) -> tuple[int, int, int, float]:
    s = node.stats
    return (s.calls, s.errors, s.timeouts, s.latency_total)


# ---------------------------------------------------------------------------- job runs


def version_label(fingerprint: str) -> str:
    return fingerprint[:12]


def queue_wait(run: Any) -> float | None:
    """Seconds the current RQ job (this attempt) waited on its queue: from being put on
    it (after any back-off delay) to now, when a worker claims it. A chunk a sync's work
    horse analyses itself (``workers.jobs.sync_repository``) runs under the sync's RQ
    job: it waited from its plan (the run row's creation) to the claim."""
    job = get_current_job()
    if job is None or job.enqueued_at is None:
        return None
    if job.id != run.rq_id(run.attempts):  # claimed: attempts is this attempt's number
        return max(0.0, (timezone.now() - run.enqueued_at).total_seconds())
    return max(0.0, (timezone.now() - job.enqueued_at).total_seconds())


def record_run_event(kind: str, run: Any) -> None:
    """Count one lifecycle event of a job run (``dashboard.runs.attempts`` events): ``job.queued``,
    ``job.started``, ``job.succeeded``, ``job.failed``, ``job.dead``, ``job.deferred``.

    Counted when the surrounding transaction commits (a rolled-back transition did not
    happen); at once outside a transaction.
    """
    if not recording():
        return
    labels = {"queue": str(run.queue), "version": version_label(run.version or run.fingerprint)}
    waited = queue_wait(run) if kind == "job.started" else None

    def go() -> None:
        if kind == "job.queued":
            count(JOBS_ENQUEUED, **labels)
        elif kind == "job.started":
            count(JOBS_STARTED, **labels)
            if waited is not None:
                observe(JOB_WAIT_SECONDS, waited, **labels)
        elif kind in {"job.succeeded", "job.failed", "job.dead"}:
            if kind == "job.succeeded":
                count(JOBS_SUCCEEDED, **labels)
            else:
                count(JOBS_FAILED, **labels)
                if str(run.error).startswith("WorkerDied"):
                    count(JOBS_CRASHED, **labels)
                count(JOBS_DEAD if kind == "job.dead" else JOBS_RETRIES, **labels)
            if run.started_at is not None:
                took = ((run.finished_at or timezone.now()) - run.started_at).total_seconds()
                observe(JOB_RUN_SECONDS, took, **labels)
        elif kind == "job.deferred":
            count(JOBS_DEFERRED, **labels)
        if kind != "job.queued":
            # An attempt's start and end: what the job counted so far (its lock figures
            # included) reaches Redis before a work horse can be killed or exit. Enqueues
            # (bulk retries enqueue thousands) are left to the flusher thread.
            flush()

    transaction.on_commit(go)


def discard() -> None:
    """Forget this process's unflushed increments (tests start from a clean slate)."""
    _buffer.take()
