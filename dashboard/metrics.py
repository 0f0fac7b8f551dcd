"""The Prometheus text exposition (version 0.0.4) of ``GET /metrics``."""

from __future__ import annotations

from django.db.models import Count
from rq import Queue
from rq.registry import StartedJobRegistry

from dashboard import leases, queues
from dashboard.live import dropped_events
from dashboard.models import JobAttempt, JobRun, Repository
from dashboard.nodes import redis_nodes
from dashboard.workerbeats import worker_rows


def metrics_text() -> str:
    """Prometheus text exposition (version 0.0.4) of the operations state."""
    lines: list[str] = []

    def gauge(
        name: str, help_text: str, samples: list[tuple[dict[str, str], float]], kind: str = "gauge"
    ) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            label = ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels.items())
            lines.append(f"{name}{{{label}}} {value}" if label else f"{name} {value}")

    names = queues.queue_names()
    Rows = list[tuple[dict[str, str], float]]
    backlog: Rows
    running: Rows
    paused_rows: Rows
    try:
        conn = queues.connection()
        backlog = [({"queue": n}, Queue(n, connection=conn).count) for n in names]
        running = [({"queue": n}, StartedJobRegistry(n, connection=conn).count) for n in names]
        paused = queues.paused_queue_names()
        paused_rows = [({"queue": n}, int(n in paused)) for n in names]
        server_up = 1
    except queues.QueueUnavailable:  # unknown, not zero: NaN until it answers again
        backlog = running = paused_rows = [({"queue": n}, float("nan")) for n in names]
        server_up = 0
    gauge(
        "gitward_queue_server_up",
        "1 while the queue server (REDIS_URL) answers.",
        [({}, server_up)],
    )
    gauge("gitward_queue_backlog", "Jobs waiting in the queue.", backlog)
    gauge("gitward_queue_running", "Jobs being executed.", running)
    gauge("gitward_queue_paused", "1 while the queue is paused.", paused_rows)
    gauge(
        "gitward_live_events_dropped_total",
        "Live events this web process dropped (channel layer unreachable).",
        [({}, dropped_events())],
        "counter",
    )
    runs = dict(JobRun.objects.order_by().values_list("state").annotate(n=Count("id")))
    gauge(
        "gitward_runs",
        "Job runs by state.",
        [({"state": s}, runs.get(s, 0)) for s in JobRun.State.values],
    )
    attempts = dict(JobAttempt.objects.order_by().values_list("outcome").annotate(n=Count("id")))
    gauge(
        "gitward_attempts_total",
        "Job attempts by outcome.",
        [({"outcome": o}, attempts.get(o, 0)) for o in JobAttempt.Outcome.values],
        "counter",
    )
    repos = dict(Repository.objects.order_by().values_list("status").annotate(n=Count("id")))
    gauge(
        "gitward_repositories",
        "Repositories by status.",
        [({"status": s}, repos.get(s, 0)) for s in Repository.Status.values],
    )
    workers = worker_rows()
    gauge(
        "gitward_workers",
        "Workers by state.",
        [
            ({"state": st}, sum(1 for w in workers if w["state"] == st))
            for st in ("idle", "busy", "dead", "stopped")
        ],
    )
    nodes = redis_nodes()
    gauge(
        "gitward_redis_masters_up", "Reachable Redis masters.", [({}, sum(n["up"] for n in nodes))]
    )
    gauge("gitward_redis_masters", "Configured Redis masters.", [({}, len(nodes))])
    held: float
    try:
        held = leases.held_count()
    except Exception:  # no quorum: say so with a NaN rather than a wrong zero
        held = float("nan")
    gauge("gitward_locks_held", "Locks currently held.", [({}, held)])
    return "\n".join(lines) + "\n"


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
