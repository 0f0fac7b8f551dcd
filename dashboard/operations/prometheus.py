"""``GET /metrics``: the Prometheus exposition, built with prometheus-client.

Two kinds of figures, both computed at scrape time by one custom ``Collector``:

* **counters and histograms** recorded by every process of every host (jobs started,
  succeeded, failed, dead, retried, deferred; run and wait times; lock attempts, refusals,
  extensions, losses, fencing rejections, acquire latency, per-master calls/errors/time),
  aggregated in one Redis hash by ``dashboard.observability.counters`` and read here in one
  ``HGETALL``;
* **gauges** of the state right now: queue backlog, running and paused, oldest job age,
  runs by state, dead letters per root-cause group, repositories by status, workers per
  version and state, lock masters up and the quorum, locks held, analyzer versions and
  the rollout (current/ramping version, ramp %, warming gate), per-git-host fetch slots,
  waiters and backoffs.

Every query is an aggregate over an index or O(1) per queue, so a scrape stays cheap at
100,000 runs and dead letters (BENCHMARKS.md). A figure whose source is down is left out
(a NaN for locks held), never reported as a wrong zero.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import redis
from django.conf import settings
from django.db.models import Count, Q
from django.utils import timezone
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from rq import Queue
from rq.job import Job
from rq.registry import StartedJobRegistry

from dashboard import analytics, infra, locks, observability, rollouts
from dashboard import runs as dashboard_runs
from dashboard.infra import dropped_events
from dashboard.models import (
    AnalyzerVersion,
    JobRun,
    Repository,
    Rollout,
    RolloutNotification,
    WorkerBeat,
)
from dashboard.operations.queue_stats import held_backlog
from dashboard.operations.redis_health import quorum, redis_nodes
from dashboard.repositories import results_lag
from workers.analysis import DEFAULT, queue_name

log = logging.getLogger(__name__)

#: Dead-letter groups exported one by one; the rest are summed under ``group="other"``.
DLQ_GROUPS = 50

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def metrics_text() -> str:
    """The exposition text of every gitward metric (this process's buffer flushed first,
    so what it counted itself is included)."""
    observability.flush()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GitwardCollector())
    return generate_latest(registry).decode()


class GitwardCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        """Every family; what lives on the queue server (aggregated counters, queue
        lengths) is left out while it is unreachable, and ``gitward_queue_server_up``
        says so: absent series rather than wrong zeros."""
        server_up = 1
        try:
            # Materialised here so an unreachable server fails before anything is yielded.
            from_redis = [*_aggregated(), *_queues(), *_fetch_hosts()]
        except (infra.QueueUnavailable, redis.RedisError, OSError):
            from_redis, server_up = [], 0
        up = GaugeMetricFamily(
            "gitward_queue_server_up", "1 while the queue server (REDIS_URL) answers."
        )
        up.add_metric([], server_up)
        yield up
        dropped = CounterMetricFamily(
            "gitward_live_events_dropped",
            "Live events this web process dropped (channel layer unreachable).",
        )
        dropped.add_metric([], dropped_events())
        yield dropped
        yield from from_redis
        yield from _runs()
        yield from _workers()
        yield from _masters()
        yield from _rollouts()
        yield from _release_gates()
        yield from _verification()


# ---------------------------------------------------------------------------- from Redis


def _fetch_hosts() -> Iterator[Metric]:
    """Per-git-host fetch limits (docs/scheduling.md#per-host-fetch-limits): slots in
    use and allowed, fetches waiting, seconds of backoff left, per ``host``."""
    labels = ["host"]
    in_use = GaugeMetricFamily(
        "gitward_fetch_host_slots_in_use", "Clones and fetches running per git host.", labels=labels
    )
    limit = GaugeMetricFamily(
        "gitward_fetch_host_slots_limit", "Concurrent fetches allowed per git host.", labels=labels
    )
    waiting = GaugeMetricFamily(
        "gitward_fetch_host_waiting", "Fetches waiting for a slot per git host.", labels=labels
    )
    backoff = GaugeMetricFamily(
        "gitward_fetch_host_backoff_seconds",
        "Seconds left of a git host's rate-limit backoff (0: none).",
        labels=labels,
    )
    now = time.time()
    for status in dashboard_runs.host_statuses():
        key = [status.host]
        in_use.add_metric(key, status.in_use)
        limit.add_metric(key, status.limit.concurrency)
        waiting.add_metric(key, status.waiting)
        left = 0.0 if status.backoff_until is None else max(0.0, status.backoff_until - now)
        backoff.add_metric(key, round(left, 3))
    yield from (in_use, limit, waiting, backoff)


def _aggregated() -> Iterator[Metric]:
    """Counters and histograms from the Redis hash, every definition present (a series
    nobody incremented yet is simply absent; the family is still there)."""
    values = observability.read_all()
    counters: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    hist: dict[str, dict[tuple[tuple[str, str], ...], dict[str, Any]]] = defaultdict(dict)
    for field, value in values.items():
        try:
            series, labels = observability.parse_field(field)
        except ValueError:
            continue
        if series in observability.COUNTER_DEFS:
            counters[series].append((labels, value))
            continue
        base, _, part = series.rpartition("_")
        if base not in observability.HISTOGRAM_DEFS:
            continue
        le = labels.pop("le", None)
        entry = hist[base].setdefault(
            tuple(sorted(labels.items())), {"buckets": {}, "sum": 0.0, "count": 0.0}
        )
        if part == "bucket" and le is not None:
            entry["buckets"][le] = entry["buckets"].get(le, 0.0) + value
        elif part in {"sum", "count"}:
            entry[part] = value
    for name, c in observability.COUNTER_DEFS.items():
        cf = CounterMetricFamily(name, c.help, labels=list(c.labels))
        for labels, value in sorted(counters[name], key=lambda lv: sorted(lv[0].items())):
            cf.add_metric([labels.get(k, "") for k in c.labels], value)
        if not c.labels and not counters[name]:
            cf.add_metric([], 0.0)  # a label-less counter nobody incremented yet is 0
        yield cf
    for name, h in observability.HISTOGRAM_DEFS.items():
        hf = HistogramMetricFamily(name, h.help, labels=list(h.labels))
        if not h.labels and not hist[name]:
            hist[name][()] = {"buckets": {}, "sum": 0.0, "count": 0.0}
        for key, entry in sorted(hist[name].items()):
            labels = dict(key)
            running, buckets = 0.0, []
            for bound in (*h.buckets, float("inf")):
                le = "+Inf" if bound == float("inf") else repr(float(bound))
                running += entry["buckets"].get(le, 0.0)
                buckets.append((le, running))
            # The +Inf bucket is the count by definition (a sum and count flushed in the
            # same transaction as the buckets, so they agree).
            hf.add_metric([labels.get(k, "") for k in h.labels], buckets, sum_value=entry["sum"])
        yield hf


# ---------------------------------------------------------------------------- gauges


def _queue_list() -> dict[str, str]:
    """Every queue to report → its ``version`` label: the version label of the job
    counters (``counters.version_label``, 12 hex digits) for a version's analysis queue,
    so the gauges and counters of one version join in PromQL; "" for a queue every
    version's workers share (sync, maintenance, rollouts)."""
    rows = list(
        AnalyzerVersion.objects.exclude(
            state__in=[AnalyzerVersion.State.RETIRED, AnalyzerVersion.State.DRAINED]
        ).values_list("fingerprint", flat=True)
    )
    version_of = {
        queue_name(fp): observability.version_label(fp) for fp in [DEFAULT.fingerprint(), *rows]
    }
    names = {name: version_of.get(name, "") for name in infra.queue_names()}
    for fp in rows:  # versions not yet staffed (queued work may already wait for them)
        names.setdefault(queue_name(fp), observability.version_label(fp))
    return names


def _queues() -> Iterator[Metric]:
    conn = infra.connection()
    labels = ["queue", "version"]
    backlog = GaugeMetricFamily(
        "gitward_queue_backlog",
        "Jobs and runs waiting for the queue: its list, its worker hosts' queues, parked runs.",
        labels=labels,
    )
    running = GaugeMetricFamily("gitward_queue_running", "Jobs being executed.", labels=labels)
    paused_f = GaugeMetricFamily(
        "gitward_queue_paused", "1 while the queue is paused.", labels=labels
    )
    oldest = GaugeMetricFamily(
        "gitward_queue_oldest_job_age_seconds",
        "Age of the job at the head of the queue (0 when empty).",
        labels=labels,
    )
    paused = infra.paused_queue_names()
    now = timezone.now()
    listed = _queue_list()
    # what waits on worker hosts' queues and parked in the database counts too
    # (docs/scheduling.md#where-the-backlog-is-counted)
    held = held_backlog(list(listed))
    for name, version in listed.items():
        q = Queue(name, connection=conn)
        key = [name, version]
        backlog.add_metric(key, q.count + held[name]["host"] + held[name]["parked"])
        running.add_metric(key, StartedJobRegistry(name, connection=conn).count)
        paused_f.add_metric(key, int(name in paused))
        age = 0.0
        head = q.get_job_ids(0, 1)  # O(1): the head of the list is the oldest job
        if head:
            try:
                job = Job.fetch(head[0], connection=conn)
            except Exception:  # gone between the two reads: the queue moved on
                job = None
            if job is not None and job.enqueued_at is not None:
                age = max(0.0, (now - job.enqueued_at).total_seconds())
        oldest.add_metric(key, age)
    yield from (backlog, running, paused_f, oldest)


#: Run states counted by ``gitward_runs``: the live ones (small index ranges) and dead
#: (the dead-letter groups' sum). Succeeded and discarded runs only accumulate — counting
#: them scans the whole table at every scrape; ``rate(gitward_jobs_succeeded_total)`` is
#: the figure that matters for them.
RUN_STATES = (JobRun.State.QUEUED, JobRun.State.RUNNING, JobRun.State.FAILED)


def _runs() -> Iterator[Metric]:
    runs = dict(
        JobRun.objects.filter(state__in=RUN_STATES)
        .order_by()
        .values_list("state")
        .annotate(n=Count("id"))
    )
    groups, causes = dashboard_runs.groups(DLQ_GROUPS)  # cached while unchanged
    family = GaugeMetricFamily(
        "gitward_runs", "Job runs by state (queued, running, failed, dead).", labels=["state"]
    )
    for state in RUN_STATES:
        family.add_metric([state], runs.get(state, 0))
    family.add_metric([JobRun.State.DEAD], sum(g["n"] for g in groups))
    yield family
    top, rest = groups[:DLQ_GROUPS], groups[DLQ_GROUPS:]
    dlq = GaugeMetricFamily(
        "gitward_dead_letters",
        f"Dead letters per root-cause group (the {DLQ_GROUPS} largest; the rest as other).",
        labels=["group", "cause"],
    )
    for g in top:
        dlq.add_metric([g["cause_key"], causes[g["cause_key"]][:120]], g["n"])
    if rest:
        dlq.add_metric(["other", ""], sum(g["n"] for g in rest))
    yield dlq
    repos = dict(Repository.objects.order_by().values_list("status").annotate(n=Count("id")))
    family = GaugeMetricFamily("gitward_repositories", "Repositories by status.", labels=["status"])
    for status in Repository.Status.values:
        family.add_metric([status], repos.get(status, 0))
    yield family
    yield from _lag()


def _lag() -> Iterator[Metric]:
    """How far results lag the remote head a push webhook announced
    (``repositories.results_lag``): the largest lag, how many repositories lag, and the
    50 most lagging one by one (bounded: a label per repository only while it lags)."""
    rows, lagging = results_lag(limit=50)
    worst = GaugeMetricFamily(
        "gitward_results_lag_max_seconds",
        "Seconds since the oldest push webhook not yet reflected in a repository's results.",
    )
    worst.add_metric([], rows[0][2] if rows else 0.0)
    yield worst
    yield GaugeMetricFamily(
        "gitward_repositories_lagging",
        "Repositories whose results do not reflect their last push webhook yet.",
        value=lagging,
    )
    each = GaugeMetricFamily(
        "gitward_repository_results_lag_seconds",
        "Seconds since this repository's last push webhook not yet reflected (the 50 most).",
        labels=["repo", "repo_name"],
    )
    for pk, name, seconds in rows:
        each.add_metric([str(pk), name], seconds)
    yield each


def _workers() -> Iterator[Metric]:
    """Workers per version and state (live = beating within ``WORKER_DEAD_AFTER``)."""
    cutoff = timezone.now() - timedelta(seconds=settings.WORKER_DEAD_AFTER)
    rows = (
        WorkerBeat.objects.filter(stopped_at__isnull=True)
        .order_by()
        .values("version")
        .annotate(
            busy=Count("id", filter=Q(last_seen__gte=cutoff, current_run__isnull=False)),
            idle=Count("id", filter=Q(last_seen__gte=cutoff, current_run__isnull=True)),
            dead=Count("id", filter=Q(last_seen__lt=cutoff)),
        )
    )
    family = GaugeMetricFamily(
        "gitward_workers", "Worker processes by version and state.", labels=["version", "state"]
    )
    for row in rows:
        for state in ("busy", "idle", "dead"):
            family.add_metric(
                [observability.version_label(row["version"] or ""), state], row[state]
            )
    yield family


def _masters() -> Iterator[Metric]:
    nodes = redis_nodes()
    q = quorum(nodes)
    up = GaugeMetricFamily(
        "gitward_redis_master_up", "1 when the lock master answers PING.", labels=["master"]
    )
    for node in nodes:
        up.add_metric([node["url"]], int(node["up"]))
    yield up
    yield GaugeMetricFamily("gitward_redis_masters_up", "Reachable lock masters.", value=q["up"])
    yield GaugeMetricFamily("gitward_redis_masters", "Configured lock masters.", value=q["total"])
    yield GaugeMetricFamily(
        "gitward_lock_quorum_needed", "Masters a lock needs (a majority).", value=q["needed"]
    )
    state = GaugeMetricFamily(
        "gitward_lock_quorum_state",
        "1 for the quorum's state: ok (all up), at_risk (a bare majority), lost.",
        labels=["state"],
    )
    for s in ("ok", "at_risk", "lost"):
        state.add_metric([s], int(q["state"] == s))
    yield state
    held: float
    try:
        held = locks.held_count()
    except Exception:  # no quorum: say so with a NaN rather than a wrong zero
        held = float("nan")
    yield GaugeMetricFamily("gitward_locks_held", "Locks currently held.", value=held)


def _rollouts() -> Iterator[Metric]:
    labels = ["queue", "version"]
    info = GaugeMetricFamily(
        "gitward_analyzer_version_state",
        "1 for each analyzer version's rollout state.",
        labels=[*labels, "state"],
    )
    ramp = GaugeMetricFamily(
        "gitward_analyzer_version_ramp_percent",
        "Share of new work routed to the version (ramping only).",
        labels=labels,
    )
    gate = GaugeMetricFamily(
        "gitward_analyzer_version_gate_open",
        "1 when the version passed its warming gate (routable).",
        labels=labels,
    )
    versions = AnalyzerVersion.objects.exclude(state=AnalyzerVersion.State.RETIRED)
    for v in versions.only("queue", "fingerprint", "state", "ramp_percent", "verified_at"):
        key = [v.queue, observability.version_label(v.fingerprint)]
        info.add_metric([*key, v.state], 1)
        ramp.add_metric(key, v.ramp_percent)
        gate.add_metric(key, int(v.verified_at is not None))
    yield from (info, ramp, gate)
    active = GaugeMetricFamily(
        "gitward_rollout_active",
        "1 while a rollout of the version is active (holds the queue's deploy lock).",
        labels=[*labels, "state"],
    )
    for r in Rollout.objects.filter(state__in=Rollout.ACTIVE_STATES).select_related("version"):
        active.add_metric([r.queue, observability.version_label(r.version.fingerprint), r.state], 1)
    yield active


def _release_gates() -> Iterator[Metric]:
    """The freeze in force and the webhook outbox (docs/rollouts.md#freeze-windows,
    docs/rollouts.md#notifications): alert on a long freeze, or on deliveries that pile up
    behind an endpoint that does not answer."""
    frozen = GaugeMetricFamily(
        "gitward_rollout_frozen",
        "1 while a freeze window or stop-the-line refuses starting, ramping up and promoting "
        "rollouts (window: its name, or stop-the-line).",
        labels=["window"],
    )
    active = rollouts.active_freeze()
    frozen.add_metric([active.name if active is not None else ""], int(active is not None))
    yield frozen
    pending = GaugeMetricFamily(
        "gitward_rollout_notifications_pending",
        "Rollout webhook deliveries not yet acknowledged with a 2xx, per endpoint.",
        labels=["endpoint"],
    )
    counts = dict(
        RolloutNotification.objects.filter(delivered_at__isnull=True)
        .values_list("endpoint")
        .annotate(n=Count("id"))
        .values_list("endpoint", "n")
    )
    for endpoint in settings.ROLLOUT_WEBHOOKS:
        pending.add_metric([endpoint["name"]], counts.get(endpoint["name"], 0))
    yield pending


def _verification() -> Iterator[Metric]:
    """The scheduled verifier (docs/analytics.md#verification): commits re-derived and
    mismatches found (running totals kept on the rows), open mismatches and withheld
    versions, and the age of the stalest verification of a ready repository."""
    m = analytics.verification_metrics()
    yield CounterMetricFamily(
        "gitward_verify_sampled", "Stored commits re-derived by the verifier.", value=m["sampled"]
    )
    yield CounterMetricFamily(
        "gitward_verify_mismatches",
        "Mismatches the verifier found (commits, and the totals, per pass).",
        value=m["mismatches"],
    )
    yield GaugeMetricFamily(
        "gitward_verify_open_mismatches",
        "Verification mismatches open in the integrity group.",
        value=m["open"],
    )
    yield GaugeMetricFamily(
        "gitward_verify_withheld", "Versions whose results are withheld.", value=m["withheld"]
    )
    yield GaugeMetricFamily(
        "gitward_verify_unverified",
        "Ready repositories scheduled but not verified yet under the served version.",
        value=m["unverified"],
    )
    yield GaugeMetricFamily(
        "gitward_verify_last_age_seconds",
        "Seconds since the stalest last verification of a ready repository (served version).",
        value=m["oldest_age"],
    )
