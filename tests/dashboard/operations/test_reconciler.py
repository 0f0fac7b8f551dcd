"""dashboard.operations.reconciler, one repair at a time (whole recoveries after a flushed or
restarted Redis are in tests/system/test_lifecycle.py and tests/system/test_queuedown.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.utils import timezone
from rq import Queue
from rq.job import Job
from rq.registry import ScheduledJobRegistry

from dashboard.infra import queues
from dashboard.models import JobAttempt, JobRun, Repository, WorkerBeat
from dashboard.operations.reconciler import reconcile
from dashboard.repositories.lifecycle import submit_repository
from dashboard.runs import affinity
from dashboard.runs.attempts import begin_attempt, enqueue_run
from tests.conftest import run_workers
from tests.dashboard.runs.test_attempts import a_chunk_run, a_repo
from tests.support.gitrepo import GitRepo

pytestmark = pytest.mark.django_db(transaction=True)


def _queued_sync(tmp_path: Path) -> JobRun:
    origin = GitRepo.create(tmp_path / "origin")
    origin.commit("one", {"a.py": "x = 1\n"})
    submit_repository(url=str(origin.path))
    run = JobRun.objects.get(kind="sync")
    assert run.state == JobRun.State.QUEUED
    return run


def _queue_ids(run: JobRun) -> list[bytes]:
    conn = queues.connection()
    return conn.lrange(queues.queue(run.queue).key, 0, -1)


def test_a_fresh_queued_run_is_left_alone(tmp_path: Path) -> None:
    run = _queued_sync(tmp_path)
    assert reconcile()["requeued"] == 0
    assert _queue_ids(run) == [run.rq_id().encode()]


def test_a_queued_run_missing_from_redis_is_enqueued_again_once(tmp_path: Path) -> None:
    run = _queued_sync(tmp_path)
    conn = queues.connection()
    conn.delete(f"rq:job:{run.rq_id()}")
    conn.lrem(queues.queue(run.queue).key, 0, run.rq_id())
    assert _queue_ids(run) == []
    assert reconcile()["requeued"] == 1
    assert _queue_ids(run) == [run.rq_id().encode()]
    assert conn.hget(f"rq:job:{run.rq_id()}", "status") == b"queued"
    assert reconcile()["requeued"] == 0  # not twice
    run_workers()
    assert Repository.objects.get().status == Repository.Status.READY


def test_a_job_marked_queued_but_in_no_queue_is_enqueued_after_the_grace(tmp_path: Path) -> None:
    run = _queued_sync(tmp_path)
    conn = queues.connection()
    conn.lrem(queues.queue(run.queue).key, 0, run.rq_id())  # its worker died mid-dequeue
    assert reconcile()["requeued"] == 0  # young: may be between two Redis steps
    old = (datetime.now(UTC) - timedelta(seconds=60)).isoformat().replace("+00:00", "Z")
    conn.hset(f"rq:job:{run.rq_id()}", "enqueued_at", old)
    assert reconcile()["requeued"] == 1
    assert _queue_ids(run) == [run.rq_id().encode()]


def test_a_running_run_of_a_dead_worker_is_crashed_and_retried(tmp_path: Path, settings) -> None:
    run = _queued_sync(tmp_path)
    old = timezone.now() - timedelta(seconds=settings.WORKER_DEAD_AFTER + 5)
    WorkerBeat.objects.create(name="ghost.1", host="ghost", pid=1, last_seen=timezone.now())
    assert begin_attempt(run_id=run.pk, number=1, worker="ghost.1")
    JobRun.objects.filter(pk=run.pk).update(started_at=old)
    assert reconcile()["crashed"] == 0  # its heartbeat is fresh
    WorkerBeat.objects.filter(name="ghost.1").update(last_seen=old)
    assert reconcile()["crashed"] == 1
    attempt = JobAttempt.objects.get(run=run, number=1)
    assert attempt.outcome == "crashed" and "worker died" in attempt.error
    assert reconcile()["crashed"] == 0  # once
    run_workers()
    run.refresh_from_db()
    assert (run.state, run.attempts) == (JobRun.State.SUCCEEDED, 2)


def test_a_running_run_of_a_live_worker_is_not_touched(tmp_path: Path) -> None:
    run = _queued_sync(tmp_path)
    WorkerBeat.objects.create(name="w.1", host="h", pid=1, last_seen=timezone.now())
    assert begin_attempt(run_id=run.pk, number=1, worker="w.1")
    JobRun.objects.filter(pk=run.pk).update(started_at=timezone.now() - timedelta(hours=1))
    result = reconcile()
    assert result["crashed"] == 0
    run.refresh_from_db()
    assert run.state == JobRun.State.RUNNING


def test_a_job_started_by_a_dead_worker_is_enqueued_again(tmp_path: Path) -> None:
    run = _queued_sync(tmp_path)
    conn = queues.connection()
    key = f"rq:job:{run.rq_id()}"
    old = (datetime.now(UTC) - timedelta(seconds=60)).isoformat().replace("+00:00", "Z")
    # RQ moved it off the queue and marked it started by a worker that heartbeats...
    conn.lrem(queues.queue(run.queue).key, 0, run.rq_id())
    conn.hset(key, mapping={"status": "started", "worker_name": "w.1", "enqueued_at": old})
    WorkerBeat.objects.create(name="w.1", host="h", pid=1, last_seen=timezone.now())
    assert reconcile()["requeued"] == 0
    # ...until that worker is gone (the run was never claimed in the database).
    WorkerBeat.objects.filter(name="w.1").update(last_seen=timezone.now() - timedelta(hours=1))
    assert reconcile()["requeued"] == 1
    assert _queue_ids(run) == [run.rq_id().encode()]


def _aged(run: JobRun, **fields: str) -> None:
    """The run's RQ job, enqueued a minute ago (past the grace), with ``fields`` set."""
    old = (datetime.now(UTC) - timedelta(seconds=60)).isoformat().replace("+00:00", "Z")
    queues.connection().hset(Job.key_for(run.rq_id()), mapping={"enqueued_at": old, **fields})


def test_a_job_a_worker_dequeued_but_has_not_started_is_left_alone(tmp_path: Path) -> None:
    run = _queued_sync(tmp_path)
    q = queues.queue(run.queue)
    # A worker of this one queue moved it to the intermediate list (and may start it yet).
    assert Queue.dequeue_any([q], None, connection=q.connection) is not None
    _aged(run)
    assert reconcile()["requeued"] == 0
    assert q.intermediate_queue.get_job_ids() == [run.rq_id()]
    q.connection.delete(q.intermediate_queue_key)  # ...until its worker died with it
    assert reconcile()["requeued"] == 1
    assert _queue_ids(run) == [run.rq_id().encode()]


def test_a_scheduled_job_is_left_until_due_then_promoted_and_one_in_no_schedule_requeued(
    tmp_path: Path,
) -> None:
    run = _queued_sync(tmp_path)
    q = queues.queue(run.queue)
    registry = ScheduledJobRegistry(queue=q)
    q.remove(run.rq_id())
    _aged(run, status="scheduled")
    registry.schedule(Job.fetch(run.rq_id(), connection=q.connection),
                      datetime.now(UTC) + timedelta(minutes=10))  # fmt: skip
    result = reconcile()
    assert (result["requeued"], result["promoted"]) == (0, 0)  # due later
    registry.schedule(Job.fetch(run.rq_id(), connection=q.connection),
                      datetime.now(UTC) - timedelta(minutes=10))  # fmt: skip
    result = reconcile()
    assert (result["requeued"], result["promoted"]) == (0, 1)  # overdue: promoted first
    assert _queue_ids(run) == [run.rq_id().encode()] and registry.get_job_ids() == []
    q.remove(run.rq_id())
    _aged(run, status="scheduled")  # marked scheduled, in no schedule
    assert reconcile()["requeued"] == 1
    assert _queue_ids(run) == [run.rq_id().encode()]


@pytest.mark.parametrize("status", ["finished", "failed", "stopped", "canceled"])
def test_a_job_that_ended_without_its_run_moving_on_is_enqueued_again(
    tmp_path: Path, status: str
) -> None:
    run = _queued_sync(tmp_path)
    queues.queue(run.queue).remove(run.rq_id())
    queues.connection().hset(Job.key_for(run.rq_id()), "status", status)
    assert reconcile()["requeued"] == 1  # at once: an ended job is never between two steps
    assert _queue_ids(run) == [run.rq_id().encode()]
    assert queues.connection().hget(Job.key_for(run.rq_id()), "status") == b"queued"


def test_a_chunk_waiting_on_a_worker_hosts_queue_is_not_stale(settings: object) -> None:
    """Mirror affinity (docs/scheduling.md#mirror-affinity): a job on ``<queue>@host:<id>``
    is in a queue; only once it is in none is it enqueued again, and then only once."""
    settings.AFFINITY_WAIT = 10.0  # type: ignore[attr-defined]  # the harness turns it off
    run = a_chunk_run(a_repo())
    affinity.record_mirror(run.repository_id, "h1")
    affinity.beat_host("h1")
    assert enqueue_run(run)
    host_key = queues.queue(f"{run.queue}@host:h1").key
    _aged(run)
    assert reconcile()["requeued"] == 0
    assert queues.connection().lrange(host_key, 0, -1) == [run.rq_id().encode()]
    queues.connection().lrem(host_key, 0, run.rq_id())  # Redis lost it
    assert reconcile()["requeued"] == 1
    assert queues.connection().lrange(host_key, 0, -1) == [run.rq_id().encode()]
