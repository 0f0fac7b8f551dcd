"""dashboard.operations.queue_stats: queue statistics from real RQ queues and the attempt history,
and the backlog samples behind the one-hour charts."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from dashboard.infra import queues
from dashboard.models import JobAttempt, JobRun, QueueSample, Repository
from dashboard.operations import queue_stats

pytestmark = pytest.mark.django_db(transaction=True)


def attempts(queue: str, outcomes: list[str]) -> None:
    repo = Repository.objects.create(url=f"https://example.com/t/{queue}.git")
    run = JobRun.objects.create(job_id=f"r-{queue}", kind="sync", queue=queue, repository=repo)
    now = timezone.now()
    for number, outcome in enumerate(outcomes, start=1):
        JobAttempt.objects.create(run=run, number=number, outcome=outcome, finished_at=now)


def test_queue_stats_count_the_backlog_rates_and_pauses() -> None:
    q = queues.queue(queues.SYNC_QUEUE)
    for i in range(3):
        q.enqueue("workers.jobs.sync_repository", i, 1, job_id=f"j{i}")
    attempts(queues.SYNC_QUEUE, ["succeeded", "failed", "crashed", "succeeded", "deferred"])
    queues.set_paused(queues.SYNC_QUEUE, True)
    stats = queue_stats.queue_stats(queues.SYNC_QUEUE)
    assert stats["backlog"] == 3 and stats["running"] == 0 and stats["paused"] is True
    assert stats["oldest_age_s"] is not None and stats["oldest_age_s"] >= 0
    # Deferred attempts are not outcomes: 2 bad of 4 finished; attempts 2..4 are retries.
    assert stats["failure_rate"] == 0.5 and stats["retries"] == 3
    assert stats["jobs_per_min"] == round(2 / 5, 1)
    assert stats["version"] is None and stats["current"] is False
    analysis = next(n for n in queues.queue_names() if "@" in n)
    assert queue_stats.queue_stats(analysis)["current"] is True


def test_samples_are_taken_per_queue_and_kept_one_day() -> None:
    QueueSample.objects.create(queue="sync", at=timezone.now() - timedelta(days=2), backlog=9)
    queues.queue(queues.SYNC_QUEUE).enqueue("workers.jobs.sync_repository", 1, 1, job_id="j")
    queue_stats.record_samples()
    rows = {s.queue: s.backlog for s in QueueSample.objects.all()}
    assert rows == {name: int(name == queues.SYNC_QUEUE) for name in queues.queue_names()}


def test_the_series_has_one_point_per_minute_of_the_last_hour() -> None:
    now = timezone.now().replace(second=30, microsecond=0)
    attempts("sync", ["succeeded", "succeeded", "failed"])
    JobAttempt.objects.update(finished_at=now)
    QueueSample.objects.create(queue="sync", at=now, backlog=4)
    QueueSample.objects.create(queue="sync", at=now + timedelta(seconds=10), backlog=7)
    series = queue_stats.series(now=now)
    assert len(series["minutes"]) == 61
    minute = series["minutes"].index(now.replace(second=0).isoformat())
    assert series["throughput"][minute] == 2 and series["backlog"][minute] == 7
    assert sum(series["throughput"]) == 2


class _RoundTrips:
    """Counts Redis round trips of this process (a pipeline of any length is one)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import redis.connection

        self.n = 0
        cls = redis.connection.AbstractConnection
        original = cls.send_packed_command

        def counted(conn: Any, command: Any, check_health: bool = True) -> Any:
            self.n += 1
            return original(conn, command, check_health)

        monkeypatch.setattr(cls, "send_packed_command", counted)


def test_every_queue_costs_the_same_two_round_trips_and_one_query(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    names = [f"q{i}" for i in range(8)]
    for name in names:
        for j in range(3):
            queues.queue(name).enqueue("workers.jobs.sync_repository", j, 1, job_id=f"{name}-{j}")
        attempts(name, ["succeeded", "failed"])
    trips = _RoundTrips(monkeypatch)
    costs = []
    for count in (1, 8):
        queues.connection().ping()  # the client's connection is open before counting
        before = trips.n
        with CaptureQueriesContext(connection) as ctx:
            stats = queue_stats.queues_stats(names[:count])
        costs.append((trips.n - before, len(ctx.captured_queries)))
        assert [s["backlog"] for s in stats] == [3] * count
        assert all(s["oldest_age_s"] is not None for s in stats)
        assert [s["failure_rate"] for s in stats] == [0.5] * count
    # One pipeline for the lists, counts and paused set, one for the first jobs' ages,
    # one SMEMBERS of RQ's queue set for the host queues (their LLENs would be one more
    # pipeline: there are none here); the fingerprint query is cached per process after
    # the first call, the parked runs are one aggregate.
    assert costs[1] == costs[0] and costs[1][0] == 3, costs
    # Empty queues need no round trip for their ages.
    before = trips.n
    assert queue_stats.queues_stats(["empty"])[0]["oldest_age_s"] is None
    assert trips.n - before == 2


def test_running_counts_live_leases_and_leaves_the_registry_to_the_workers() -> None:
    from rq.registry import StartedJobRegistry

    conn = queues.connection()
    key = StartedJobRegistry("sync", connection=conn).key
    now = time.time()
    conn.zadd(key, {"alive:1": now + 60, "abandoned:1": now - 60})
    stats = queue_stats.queue_stats("sync")
    assert stats["running"] == 1
    # RQ's ``count`` would have moved the abandoned entry out on every snapshot.
    assert conn.zcard(key) == 2


def test_the_backlog_counts_host_queues_and_parked_runs_everywhere_it_is_shown() -> None:
    """docs/scheduling.md#where-the-backlog-is-counted: a queue's backlog is its RQ list,
    its worker hosts' queues (mirror affinity) and its runs parked in the database
    (fairness), in the queue statistics (Overview, Workers page, live view), the sampled
    backlog of the charts and the ``gitward_queue_backlog`` gauge."""
    from dashboard.operations.prometheus import metrics_text

    name = queues.SYNC_QUEUE
    func = "workers.jobs.analyze_chunk"
    queues.queue(name).enqueue(func, 1, 1, job_id="listed")
    for host, n in (("h1", 2), ("h2", 1)):
        for i in range(n):
            queues.queue(f"{name}@host:{host}").enqueue(func, i, 1, job_id=f"{host}-{i}")
    queues.queue("elsewhere@host:h1").enqueue(func, 9, 1, job_id="not-ours")
    repo = Repository.objects.create(url="https://example.com/t/parked.git")
    for i, parked in enumerate([True, True, True, True, False]):
        JobRun.objects.create(job_id=f"p{i}", kind="analyze", queue=name, repository=repo,
                              parked=parked)  # fmt: skip
    JobRun.objects.create(job_id="done", kind="analyze", queue=name, repository=repo,
                          parked=True, state="succeeded")  # fmt: skip
    assert queue_stats.held_backlog([name, "other"]) == {
        name: {"host": 3, "parked": 4}, "other": {"host": 0, "parked": 0}}  # fmt: skip
    stats = queue_stats.queue_stats(name)
    assert (stats["backlog"], stats["backlog_host"], stats["backlog_parked"]) == (8, 3, 4)
    queue_stats.record_samples()
    assert QueueSample.objects.get(queue=name).backlog == 8
    text = metrics_text()
    assert f'gitward_queue_backlog{{queue="{name}",version=""}} 8.0' in text
