"""dashboard.samples: queue statistics from real RQ queues and the attempt history, and
the backlog samples behind the one-hour charts."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from dashboard import queues, samples
from dashboard.models import JobAttempt, JobRun, QueueSample, Repository

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
    stats = samples.queue_stats(queues.SYNC_QUEUE)
    assert stats["backlog"] == 3 and stats["running"] == 0 and stats["paused"] is True
    assert stats["oldest_age_s"] is not None and stats["oldest_age_s"] >= 0
    # Deferred attempts are not outcomes: 2 bad of 4 finished; attempts 2..4 are retries.
    assert stats["failure_rate"] == 0.5 and stats["retries"] == 3
    assert stats["jobs_per_min"] == round(2 / 5, 1)
    assert stats["version"] is None and stats["current"] is False
    analysis = next(n for n in queues.queue_names() if "@" in n)
    assert samples.queue_stats(analysis)["current"] is True


def test_samples_are_taken_per_queue_and_kept_one_day() -> None:
    QueueSample.objects.create(queue="sync", at=timezone.now() - timedelta(days=2), backlog=9)
    queues.queue(queues.SYNC_QUEUE).enqueue("workers.jobs.sync_repository", 1, 1, job_id="j")
    samples.record_samples()
    rows = {s.queue: s.backlog for s in QueueSample.objects.all()}
    assert rows == {name: int(name == queues.SYNC_QUEUE) for name in queues.queue_names()}


def test_the_series_has_one_point_per_minute_of_the_last_hour() -> None:
    now = timezone.now().replace(second=30, microsecond=0)
    attempts("sync", ["succeeded", "succeeded", "failed"])
    JobAttempt.objects.update(finished_at=now)
    QueueSample.objects.create(queue="sync", at=now, backlog=4)
    QueueSample.objects.create(queue="sync", at=now + timedelta(seconds=10), backlog=7)
    series = samples.series(now=now)
    assert len(series["minutes"]) == 61
    minute = series["minutes"].index(now.replace(second=0).isoformat())
    assert series["throughput"][minute] == 2 and series["backlog"][minute] == 7
    assert sum(series["throughput"]) == 2
