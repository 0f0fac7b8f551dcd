"""dashboard.infra.queues: queue names, idempotent enqueueing, promotion of due jobs and
pauses, on a real Redis."""

from __future__ import annotations

import time
from typing import Any

import pytest
from rq.job import Job
from rq.registry import ScheduledJobRegistry

from dashboard.infra import queues
from workers.analysis.analyzer import DEFAULT, queue_name

FUNC = "workers.jobs.sync_repository"


@pytest.mark.django_db
def test_workers_listen_on_sync_this_versions_analysis_queue_and_maintenance() -> None:
    # Before any rollout: the deployed default's queue (with versions, see
    # tests/dashboard/rollouts/test_routing.py).
    assert queues.queue_names() == ["sync", queue_name(DEFAULT.fingerprint()), "maintenance"]


def test_a_job_id_is_enqueued_once_while_live_and_again_once_it_ended() -> None:
    q = queues.queue("sync")
    assert queues.enqueue_unique(q, FUNC, 1, 1, job_id="x-a1") is True
    assert queues.enqueue_unique(q, FUNC, 1, 1, job_id="x-a1") is False
    assert q.job_ids == ["x-a1"]
    job = Job.fetch("x-a1", connection=queues.connection())
    q.remove(job)
    job.set_status("finished")  # a leftover of an earlier round is replaced
    assert queues.enqueue_unique(q, FUNC, 1, 1, job_id="x-a1") is True
    assert q.job_ids == ["x-a1"]


def test_due_scheduled_jobs_are_promoted_once() -> None:
    q = queues.queue("sync")
    assert queues.enqueue_unique(q, FUNC, 1, 1, job_id="later", delay=0.2)
    assert q.job_ids == [] and ScheduledJobRegistry(queue=q).get_job_ids() == ["later"]
    deadline = time.monotonic() + 10
    moved = 0
    while not moved and time.monotonic() < deadline:
        moved = queues.promote_due_jobs(["sync"])
        time.sleep(0.05)
    assert moved == 1 and q.job_ids == ["later"]
    assert queues.promote_due_jobs(["sync"]) == 0


def test_pausing_is_recorded_and_reported_once() -> None:
    assert queues.set_paused("sync", True) is True
    assert queues.set_paused("sync", True) is False
    assert queues.paused_queue_names() == {"sync"}
    assert queues.set_paused("sync", False) is True and queues.paused_queue_names() == set()


def test_a_changed_queue_timeout_gets_a_client_with_that_timeout(settings: Any) -> None:
    """The shared client is cached; one built under an old ``QUEUE_TIMEOUT`` must not
    serve after the setting changed (a stalled server then cost the old, longer timeout
    per call: the stalled-node test waited 8 s in a full run)."""
    # Timeouts no other test uses: a client cached by an earlier test may have had its
    # socket timeout raised by an RQ worker it was lent to.
    settings.QUEUE_TIMEOUT = 0.71
    before = queues.connection()
    settings.QUEUE_TIMEOUT = 0.37
    after = queues.connection()
    assert after is not before
    assert after.connection_pool.connection_kwargs["socket_timeout"] == 0.37
    assert before.connection_pool.connection_kwargs["socket_timeout"] == 0.71
    assert queues.connection() is after  # still one shared client per setting
