"""dashboard.infra.queues: queue names, idempotent enqueueing, promotion of due jobs and
pauses, on a real Redis."""

from __future__ import annotations

import threading
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


def test_a_delayed_job_id_is_scheduled_once_while_live() -> None:
    """A second delayed enqueue of a live id is refused and leaves the first job as it
    was (RQ's ``enqueue_in`` ignores ``unique`` and would overwrite its hash and time)."""
    q = queues.queue("sync")
    registry = ScheduledJobRegistry(queue=q)
    assert queues.enqueue_unique(q, FUNC, 1, 1, job_id="later-once", delay=30) is True
    first = registry.get_scheduled_time("later-once")
    assert queues.enqueue_unique(q, FUNC, 2, 2, job_id="later-once", delay=300) is False
    assert registry.get_job_ids() == ["later-once"]
    assert registry.get_scheduled_time("later-once") == first
    assert Job.fetch("later-once", connection=queues.connection()).args == (1, 1)


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


def test_a_job_is_placed_behind_the_last_job_of_its_class_or_a_more_urgent_one() -> None:
    """``enqueue_unique(priority=…)`` (docs/scheduling.md#classes): a more urgent class is
    taken first, each class stays FIFO, and a job without a class counts as class 0."""
    q = queues.queue("placing")
    pushes = [("c1", 2), ("c2", 2), ("r1", 1), ("i1", 0), ("c3", 2), ("i2", 0), ("r2", 1)]
    for job_id, priority in pushes:
        assert queues.enqueue_unique(q, "workers.jobs.analyze_chunk", 1, 1, job_id=job_id,
                                     priority=priority)  # fmt: skip
    assert q.get_job_ids() == ["i1", "i2", "r1", "r2", "c1", "c2", "c3"]
    queues.enqueue_unique(q, "workers.jobs.analyze_chunk", 1, 1, job_id="plain")
    assert q.get_job_ids() == ["i1", "i2", "plain", "r1", "r2", "c1", "c2", "c3"]


def test_a_promoted_retry_takes_its_class_place_from_its_hash() -> None:
    q = queues.queue("placing")
    queues.enqueue_unique(q, "workers.jobs.analyze_chunk", 1, 1, job_id="c1", priority=2)
    queues.enqueue_unique(q, "workers.jobs.analyze_chunk", 1, 1, job_id="i-retry", priority=0,
                          delay=0.01)  # fmt: skip
    time.sleep(1.1)  # RQ schedules by the whole second
    assert queues.promote_due_jobs(["placing"]) == 1
    assert q.get_job_ids() == ["i-retry", "c1"]


def test_placing_a_job_a_worker_already_took_leaves_the_queue_alone() -> None:
    q = queues.queue("placing")
    queues.enqueue_unique(q, "workers.jobs.analyze_chunk", 1, 1, job_id="c1", priority=2)
    queues.enqueue_unique(q, "workers.jobs.analyze_chunk", 1, 1, job_id="c2", priority=2)
    assert queues.place(q, "c1") == -1  # not at the tail: taken, or placed already
    assert q.get_job_ids() == ["c1", "c2"]


def test_the_express_take_finds_small_interactive_work_behind_a_large_backfill() -> None:
    """``take_express`` (docs/scheduling.md#the-reserved-interactive-slot): the first
    job marked express among the interactive head of the queue, wherever it stands in
    it, taken out of the list; never a job of a less urgent class, express or not."""
    q = queues.queue("express")
    func = "workers.jobs.analyze_chunk"
    for job_id, priority, express in [("big1", 0, False), ("big2", 0, False), ("small1", 0, True),
                                      ("refresh", 1, True), ("small2", 0, True)]:  # fmt: skip
        queues.enqueue_unique(q, func, 1, 1, job_id=job_id, priority=priority, express=express)
    assert q.get_job_ids() == ["big1", "big2", "small1", "small2", "refresh"]
    assert queues.take_express(q) == "small1"
    assert queues.take_express(q) == "small2"
    assert queues.take_express(q) is None  # "refresh" is express but not interactive
    assert q.get_job_ids() == ["big1", "big2", "refresh"]
    assert queues.take_express(queues.queue("express-empty")) is None


def test_a_promoted_express_retry_keeps_its_mark() -> None:
    q = queues.queue("express")
    queues.enqueue_unique(q, "workers.jobs.analyze_chunk", 1, 1, job_id="big", priority=0)
    queues.enqueue_unique(q, "workers.jobs.analyze_chunk", 1, 1, job_id="small-retry",
                          delay=0.01, express=True)  # fmt: skip
    assert queues.take_express(q) is None
    time.sleep(1.1)  # RQ schedules by the whole second
    assert queues.promote_due_jobs(["express"]) == 1
    assert queues.take_express(q) == "small-retry"
    assert q.get_job_ids() == ["big"]


def test_express_jobs_running_are_counted_until_they_end_or_their_lease_does() -> None:
    """docs/scheduling.md#bulk-writes-yield-to-express-work: ``express_begun`` / ``ended``
    count the express jobs running; an entry whose lease has ended (a killed horse never
    took itself out) is dropped by the next count."""
    assert queues.express_running() == 0
    queues.express_begun("a")
    queues.express_begun("b")
    queues.express_begun("a")  # a redelivery of the same job: one entry
    assert queues.express_running() == 2
    queues.express_ended("a")
    assert queues.express_running() == 1
    conn = queues.connection()
    conn.zadd(queues.EXPRESS_RUNNING_KEY, {"b": 1})  # its lease ended long ago
    assert queues.express_running() == 0
    assert conn.zcard(queues.EXPRESS_RUNNING_KEY) == 0


def test_an_express_enqueue_wakes_one_waiting_slot_and_a_regular_one_none() -> None:
    """docs/scheduling.md#the-reserved-interactive-slot: every express job enqueued pushes
    one token on the wake list (at most ``EXPRESS_WAKE_MAX`` kept); ``wait_for_express``
    returns True at once on a token, False after its timeout with none."""
    conn = queues.connection()
    q = queues.queue("wake")
    queues.enqueue_unique(q, "workers.jobs.analyze_chunk", 1, 1, job_id="big", priority=0)
    assert conn.llen(queues.EXPRESS_WAKE_KEY) == 0  # not express: no slot woken
    assert queues.wait_for_express(conn, 0.05) is False
    queues.enqueue_unique(q, "workers.jobs.analyze_chunk", 1, 1, job_id="small", express=True)
    assert conn.llen(queues.EXPRESS_WAKE_KEY) == 1
    # a timeout far longer than the test: only the token can end this wait
    assert queues.wait_for_express(conn, 3600) is True
    assert conn.llen(queues.EXPRESS_WAKE_KEY) == 0  # one token, one waiter
    for i in range(3 * queues.EXPRESS_WAKE_MAX):
        queues.enqueue_unique(q, "workers.jobs.analyze_chunk", 1, 1, job_id=f"s{i}", express=True)
    assert conn.llen(queues.EXPRESS_WAKE_KEY) == queues.EXPRESS_WAKE_MAX


def test_a_slot_waiting_when_an_express_job_arrives_is_woken_by_it() -> None:
    conn = queues.connection()
    woken: list[bool] = []
    waiter = threading.Thread(
        target=lambda: woken.append(queues.wait_for_express(queues.connection(), 3600)),
        daemon=True,
    )
    waiter.start()
    deadline = time.monotonic() + 30
    while int(conn.info("clients")["blocked_clients"]) < 1:  # the waiter is in BLPOP
        assert time.monotonic() < deadline, "the waiter never blocked"
        time.sleep(0.01)
    q = queues.queue("wake")
    queues.enqueue_unique(q, "workers.jobs.analyze_chunk", 1, 1, job_id="small", express=True)
    waiter.join(timeout=30)  # without the token: blocked for an hour
    assert woken == [True]
