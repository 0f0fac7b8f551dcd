"""dashboard.locks.worker_beats: worker heartbeat rows, who is live, and the runs of workers
that are gone — real database and channel layer."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
from django.utils import timezone

from dashboard.locks import worker_beats
from dashboard.models import JobRun, Repository, WorkerBeat
from tests.support.live_tap import Tap

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_beat_creates_then_refreshes_the_row_and_is_announced() -> None:
    tap = Tap()
    worker_beats.beat(name="h.1", queues_=["sync", "maintenance"])
    row = WorkerBeat.objects.get(name="h.1")
    assert row.pid == os.getpid() and row.queues == "sync,maintenance"
    WorkerBeat.objects.filter(pk=row.pk).update(last_seen=timezone.now() - timedelta(hours=1))
    worker_beats.beat(name="h.1", queues_=["sync"])
    row.refresh_from_db()
    assert timezone.now() - row.last_seen < timedelta(minutes=1) and row.rss > 0
    (event, *_) = tap.until(lambda evs: len(evs) == 2)
    assert event["type"] == "worker.heartbeat" and event["worker"] == "h.1"


def test_live_workers_exclude_stopped_and_silent_ones(settings) -> None:
    settings.WORKER_DEAD_AFTER = 30
    now = timezone.now()
    for name, seen, stopped in [
        ("live", now, None),
        ("silent", now - timedelta(seconds=60), None),
        ("stopped", now, now),
    ]:
        WorkerBeat.objects.create(name=name, host="h", pid=1, last_seen=seen, stopped_at=stopped)
    assert worker_beats.live_worker_names() == {"live"}
    states = {r["name"]: r["state"] for r in worker_beats.worker_rows()}
    assert states == {"live": "idle", "silent": "dead", "stopped": "stopped"}
    worker_beats.stop_beat("live")
    assert worker_beats.live_worker_names() == set()


def test_runs_of_a_gone_worker_are_orphaned_and_those_of_a_live_one_are_not(settings) -> None:
    settings.WORKER_DEAD_AFTER = 30
    now, long_ago = timezone.now(), timezone.now() - timedelta(minutes=5)
    repo = Repository.objects.create(url="https://example.com/t/x.git")
    WorkerBeat.objects.create(name="live", host="h", pid=1, last_seen=now)
    mine = JobRun.objects.create(
        job_id="a",
        kind="sync",
        queue="sync",
        repository=repo,
        state="running",
        worker="live",
        started_at=long_ago,
    )
    gone = JobRun.objects.create(
        job_id="b",
        kind="sync",
        queue="sync",
        repository=repo,
        state="running",
        worker="gone",
        started_at=long_ago,
    )
    fresh = JobRun.objects.create(
        job_id="c",
        kind="sync",
        queue="sync",
        repository=repo,
        state="running",
        worker="new",
        started_at=now,
    )
    assert [r.pk for r in worker_beats.orphaned_runs()] == [gone.pk]
    WorkerBeat.objects.filter(name="live").update(current_run=mine)
    assert {r["name"]: r["state"] for r in worker_beats.worker_rows()}["live"] == "busy"
    assert fresh.pk not in [r.pk for r in worker_beats.orphaned_runs()]
