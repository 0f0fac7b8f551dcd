"""What gitward reads of RQ's Redis layout beneath its public API, checked against the
installed RQ (pyproject pins the range these tests were run with) on a real Redis, with real
workers. If an RQ release changes any of it, a test here fails instead of the reconciler
quietly re-enqueueing live jobs, or never re-enqueueing lost ones.

Read through RQ's public API where it is fast enough (``Job.key_for``, ``Job.exists``,
``Queue.get_job_ids``, ``Queue.intermediate_queue``, ``ScheduledJobRegistry.remove`` and
``get_scheduled_time``); read directly, batched, where it is not (docs/operations.md#rq-internals):

* a job's hash (``Job.key_for``) has the fields ``status``, ``enqueued_at``,
  ``worker_name`` and ``origin`` (``reconciler.JOB_FIELDS``, one pipelined ``HMGET`` per 1,000 runs;
  ``queue_stats`` reads ``enqueued_at`` of each queue's head): the status is a
  ``JobStatus`` value, ``enqueued_at`` an ISO 8601 UTC time, ``worker_name`` the name of
  the worker running it, ``origin`` the queue it was put on;
* a queue (``Queue.key``) is a Redis list, appended at the tail and taken from the head, so
  its head is its oldest job (``queue_stats``: ``LRANGE 0 0`` and ``LLEN`` in a pipeline),
  and ``LREM 0`` takes every copy of an id out of it (the reconciler and ``cancel_runs``);
* the started registry is a sorted set scored by lease expiry (``queue_stats``: ``ZCOUNT``
  from now, without RQ's clean-up);
* the scheduled registry's ``remove`` returns how many it removed (``promote_due_jobs``:
  exactly one promoter wins a job);
* a job whose hash is deleted is skipped by a worker that dequeues its id
  (``cancel_runs``);
* a field of gitward's own in a job's hash (``queues.PRIORITY_FIELD``, its scheduling
  class: docs/scheduling.md#classes) survives RQ's saves of the job, and a job's hash is
  ``Job.redis_job_namespace_prefix`` + its id (``queues.place`` reads it inside Lua).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import rq
from rq import Queue, SimpleWorker, get_current_job
from rq.exceptions import NoSuchJobError
from rq.job import Job, JobStatus
from rq.registry import ScheduledJobRegistry, StartedJobRegistry
from rq.utils import str_to_date

from dashboard.infra import queues
from dashboard.operations import reconciler

QUEUE = "internals"


def observe_self() -> list[Any]:
    """A job that reports, while it runs, what the reconciler and queue_stats would read."""
    job = get_current_job()
    assert job is not None
    conn = job.connection
    fields = [f.decode() if f else None for f in conn.hmget(job.key, list(reconciler.JOB_FIELDS))]
    registry = StartedJobRegistry(job.origin, connection=conn)
    return [
        fields,
        conn.type(registry.key).decode(),
        conn.zcount(registry.key, time.time(), "+inf"),
    ]


def mark(key: str) -> None:
    get_current_job().connection.set(key, "ran")  # type: ignore[union-attr]


def fail() -> None:
    raise RuntimeError("on purpose")


def _queue() -> Queue:
    return Queue(QUEUE, connection=queues.connection())


def _work(q: Queue) -> SimpleWorker:
    worker = SimpleWorker([Queue(q.name, connection=queues.worker_connection())],
                          connection=queues.worker_connection())  # fmt: skip
    worker.work(burst=True, logging_level="WARNING")
    return worker


def _hash(job_id: str) -> list[str | None]:
    raw = queues.connection().hmget(Job.key_for(job_id), list(reconciler.JOB_FIELDS))
    return [f.decode() if f else None for f in raw]


def test_the_installed_rq_is_in_the_pinned_range() -> None:
    major, minor = (int(x) for x in rq.__version__.split(".")[:2])
    assert (2, 6) <= (major, minor) < (3, 0), rq.__version__


def test_every_status_rq_knows_is_one_the_reconciler_decides_about() -> None:
    # A new status would fall through the reconciler's checks (never stale): decide first.
    assert {s.value for s in JobStatus} == {
        "created", "queued", "started", "scheduled", "deferred",
        "finished", "failed", "stopped", "canceled",
    }  # fmt: skip
    assert {"finished", "failed", "stopped", "canceled"} == reconciler._ENDED


def test_a_queued_job_hash_has_the_fields_the_reconciler_reads() -> None:
    q = _queue()
    job = q.enqueue(f"{__name__}.fail", job_id="hash-1")
    status, enqueued_at, worker, origin = _hash(job.id)
    assert (status, worker, origin) == (JobStatus.QUEUED.value, None, QUEUE)
    assert enqueued_at is not None
    stored = Job.fetch(job.id, connection=q.connection).enqueued_at
    # The reconciler's own parse (an ISO time, "Z" for UTC) and queue_stats' (RQ's).
    parsed = datetime.fromisoformat(enqueued_at.replace("Z", "+00:00"))
    assert parsed.tzinfo is not None
    assert parsed == str_to_date(enqueued_at) == stored


def test_a_running_job_is_marked_started_by_its_worker_and_counted_in_the_started_set() -> None:
    q = _queue()
    job = q.enqueue(f"{__name__}.observe_self", job_id="running-1")
    worker = _work(q)
    assert _hash(job.id)[0] == JobStatus.FINISHED.value
    fields, kind, live = Job.fetch(job.id, connection=q.connection).return_value()
    assert fields[0] == JobStatus.STARTED.value
    assert fields[2] == worker.name
    assert fields[3] == QUEUE  # the queue it was put on (a worker host's queue, or shared)
    assert kind == "zset"
    assert live == 1  # its lease expires in the future: ZCOUNT from now counts it
    assert q.connection.zcard(StartedJobRegistry(QUEUE, connection=q.connection).key) == 0


def test_a_failed_and_a_canceled_job_end_in_statuses_the_reconciler_treats_as_ended() -> None:
    q = _queue()
    failed = q.enqueue(f"{__name__}.fail", job_id="ends-failed")
    _work(q)
    canceled = q.enqueue(f"{__name__}.fail", job_id="ends-canceled")
    canceled.cancel()
    assert _hash(failed.id)[0] == JobStatus.FAILED.value
    assert _hash(canceled.id)[0] == JobStatus.CANCELED.value
    assert {_hash(failed.id)[0], _hash(canceled.id)[0]} <= reconciler._ENDED


def test_a_queue_is_a_list_whose_head_is_its_oldest_job() -> None:
    q = _queue()
    conn = q.connection
    first = q.enqueue(f"{__name__}.fail", job_id="order-1")
    second = q.enqueue(f"{__name__}.fail", job_id="order-2")
    assert conn.type(q.key) == b"list"
    assert (
        conn.lrange(q.key, 0, 0) == [first.id.encode()] == [i.encode() for i in q.get_job_ids(0, 1)]
    )
    assert conn.llen(q.key) == q.count == 2
    assert q.get_job_ids() == [first.id, second.id]
    # Two copies of one id (a redelivery): LREM 0 takes both, Queue.remove only one.
    q.push_job_id(first.id)
    assert conn.lrem(q.key, 0, first.id) == 2
    assert q.get_job_ids() == [second.id]


def test_a_dequeued_job_waits_in_the_intermediate_queue_until_it_starts() -> None:
    q = _queue()
    job = q.enqueue(f"{__name__}.fail", job_id="between-1")
    # What a worker listening on this one queue does first (a worker that died right
    # after it leaves the id here: the reconciler must not take it for lost).
    got = Queue.dequeue_any([q], None, connection=q.connection)
    assert got is not None and got[0].id == job.id
    assert q.get_job_ids() == []
    assert q.intermediate_queue.get_job_ids() == [job.id]
    assert q.connection.lrange(q.intermediate_queue_key, 0, -1) == [job.id.encode()]


def test_a_scheduled_job_has_its_due_time_in_the_scheduled_registry() -> None:
    q = _queue()
    before = time.time()
    job = q.enqueue_in(timedelta(seconds=600), f"{__name__}.fail", job_id="later-1")
    after = time.time()
    registry = ScheduledJobRegistry(queue=q)
    assert _hash(job.id)[0] == JobStatus.SCHEDULED.value
    due = registry.get_scheduled_time(job.id)
    assert due.tzinfo is not None
    assert int(before) + 600 <= due.timestamp() <= after + 600
    assert registry.get_jobs_to_schedule(int(after) + 600) == [job.id]
    # promote_due_jobs: one remover wins, every other gets 0.
    assert registry.remove(job.id) == 1
    assert registry.remove(job.id) == 0
    with pytest.raises(NoSuchJobError):
        registry.get_scheduled_time(job.id)  # the reconciler: "in no schedule"


def test_a_job_whose_hash_is_deleted_is_skipped_by_a_worker() -> None:
    q = _queue()
    conn = q.connection
    job = q.enqueue(f"{__name__}.mark", "internals:ran", job_id="gone-1")
    # cancel_runs' order: out of the queue, then the hash; a worker that took the id
    # between the two finds no job.
    assert q.get_job_ids() == [job.id]
    conn.delete(Job.key_for(job.id))
    assert not Job.exists(job.id, connection=conn)
    _work(q)
    assert conn.get("internals:ran") is None
    # The same job, its hash kept, runs (the check above can fail).
    q.enqueue(f"{__name__}.mark", "internals:ran", job_id="kept-1")
    _work(q)
    assert conn.get("internals:ran") == b"ran"


def test_enqueued_at_of_a_queue_head_reads_as_rq_reads_it() -> None:
    q = _queue()
    job = q.enqueue(f"{__name__}.fail", job_id="head-1")
    raw = q.connection.hget(Job.key_for(job.id), "enqueued_at")
    stamp = str_to_date(raw)
    assert stamp == Job.fetch(job.id, connection=q.connection).enqueued_at
    assert stamp.tzinfo is not None and stamp <= datetime.now(UTC)


def test_a_stop_job_command_marks_the_job_stopped_then_kills_the_horse() -> None:
    """``dashboard.runs.cancels`` finds a worker by ``redis_worker_namespace_prefix`` + its
    name and sends ``stop-job``; ``workers.pool`` reads ``_stopped_job_id`` in
    ``handle_job_failure`` to tell a cancelled horse from a crashed one (RQ then calls
    ``handle_job_failure``, not ``handle_work_horse_killed``)."""
    from rq.command import handle_stop_job_command
    from rq.worker import Worker

    conn = queues.worker_connection()
    worker = Worker([queues.queue(queues.SYNC_QUEUE)], connection=conn, name="pinned")
    worker.register_birth()
    try:
        found = Worker.find_by_key(Worker.redis_worker_namespace_prefix + "pinned", connection=conn)
        assert found is not None and found.name == "pinned"
        killed: list[bool] = []
        worker.kill_horse = lambda *a, **k: killed.append(True)  # type: ignore[method-assign]
        worker.get_current_job_id = lambda *a, **k: "job-1"  # type: ignore[method-assign]
        handle_stop_job_command(worker, {"job_id": "job-2"})  # not its job: ignored
        assert killed == [] and worker._stopped_job_id is None
        handle_stop_job_command(worker, {"job_id": "job-1"})
        assert killed == [True] and worker._stopped_job_id == "job-1"
    finally:
        worker.register_death()
        conn.close()


def test_a_field_of_our_own_in_a_jobs_hash_survives_rqs_saves() -> None:
    q = queues.queue("pinned")
    queues.enqueue_unique(q, "workers.jobs.analyze_chunk", 1, 1, job_id="own-field", priority=2)
    job = Job.fetch("own-field", connection=q.connection)
    assert Job.key_for("own-field") == Job.redis_job_namespace_prefix + "own-field"
    job.set_status(JobStatus.STARTED)
    job.save()
    job.save_meta()
    assert q.connection.hget(job.key, queues.PRIORITY_FIELD) == b"2"
