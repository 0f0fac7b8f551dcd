"""dashboard.runs.affinity: where a chunk's job is put, and the move of an overdue one to
the shared queue, against a real Redis queue server (docs/scheduling.md#mirror-affinity)."""

from __future__ import annotations

import pytest
from rq.job import Job

from dashboard.infra import queues
from dashboard.models import JobRun, Repository
from dashboard.runs import affinity, attempts
from tests.dashboard.runs.test_attempts import a_chunk_run, a_repo, a_sync_run

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _affinity_on(settings: object) -> None:
    settings.AFFINITY_WAIT = 10.0  # type: ignore[attr-defined]  # the harness turns it off


def test_a_chunk_goes_to_a_live_host_holding_its_mirror(settings: object) -> None:
    repo = a_repo()
    run = a_chunk_run(repo)
    assert affinity.physical_queue(run) == run.queue  # nobody holds the mirror
    affinity.record_mirror(repo.pk, "h2")
    assert affinity.physical_queue(run) == run.queue  # h2 holds it but is not alive
    affinity.beat_host("h2")
    assert affinity.physical_queue(run) == f"{run.queue}@host:h2"
    assert affinity.physical_queue(run, delay=2.0) == run.queue  # a delayed retry
    assert affinity.physical_queue(a_sync_run(repo)) == queues.SYNC_QUEUE
    affinity.forget_mirror(repo.pk, "h2")
    assert affinity.physical_queue(run) == run.queue
    assert affinity.mirror_hosts(repo.pk) == set()


def test_the_least_loaded_host_is_chosen(settings: object) -> None:
    repo, other = a_repo(), Repository.objects.create(url="https://example.com/team/other.git")
    first, second = a_chunk_run(repo), a_chunk_run(other)
    for host in ("h1", "h2"):
        affinity.record_mirror(repo.pk, host)
        affinity.record_mirror(other.pk, host)
        affinity.beat_host(host)
    assert attempts.enqueue_run(first)
    assert Job.fetch(first.rq_id(), connection=queues.connection()).origin == (
        f"{first.queue}@host:h1"
    )
    assert attempts.enqueue_run(second)
    assert Job.fetch(second.rq_id(), connection=queues.connection()).origin == (
        f"{second.queue}@host:h2"
    )
    assert not attempts.enqueue_run(second)  # the same id: one job, whichever its queue


def test_affinity_off_uses_the_shared_queue(settings: object) -> None:
    settings.AFFINITY_WAIT = 0  # type: ignore[attr-defined]
    repo = a_repo()
    run = a_chunk_run(repo)
    affinity.record_mirror(repo.pk, "h1")
    affinity.beat_host("h1")
    assert affinity.physical_queue(run) == run.queue
    assert affinity.host_queues_of(["analysis@x", "sync"], "h1") == []


def test_host_queues_listen_before_analysis_queues_only() -> None:
    assert affinity.host_queues_of(["analysis@abcd", "sync"], "h1") == ["analysis@abcd@host:h1"]
    assert affinity.base_queue("analysis@abcd@host:h1") == "analysis@abcd"
    assert affinity.base_queue("sync") == "sync"


def test_an_overdue_job_moves_once_to_the_shared_queue() -> None:
    repo = a_repo()
    run = a_chunk_run(repo)
    affinity.record_mirror(repo.pk, "h1")
    affinity.beat_host("h1")
    assert attempts.enqueue_run(run)
    conn = queues.connection()
    host_key = f"rq:queue:{run.queue}@host:h1"
    assert conn.lrange(host_key, 0, -1) == [run.rq_id().encode()]
    reason = affinity.placement_reason(run)
    assert reason is not None
    assert reason.startswith("on worker host h1's queue (it holds the mirror); any host from ")
    assert affinity.move_overdue([run.queue], wait=3600) == 0  # not waited long enough
    assert affinity.move_overdue(["sync"], wait=0) == 0  # not a queue these workers serve
    assert affinity.move_overdue([run.queue], wait=0) == 1
    assert affinity.move_overdue([run.queue], wait=0) == 0
    assert conn.llen(host_key) == 0
    assert conn.lrange(f"rq:queue:{run.queue}", 0, -1) == [run.rq_id().encode()]
    assert Job.fetch(run.rq_id(), connection=conn).origin == run.queue
    assert affinity.placement_reason(run) is None


def test_a_dead_hosts_jobs_move_at_once() -> None:
    repo = a_repo()
    run = a_chunk_run(repo)
    affinity.record_mirror(repo.pk, "h1")
    affinity.beat_host("h1")
    assert attempts.enqueue_run(run)
    queues.connection().delete("gitward:host-alive:h1")  # its heartbeats stopped
    assert affinity.move_overdue([run.queue], wait=3600) == 1
    assert JobRun.objects.get(pk=run.pk).state == JobRun.State.QUEUED


def test_a_cancelled_chunk_leaves_the_host_queue_it_waited_on() -> None:
    repo = a_repo()
    run = a_chunk_run(repo)
    affinity.record_mirror(repo.pk, "h1")
    affinity.beat_host("h1")
    assert attempts.enqueue_run(run)
    assert attempts.cancel_runs(fingerprint=run.fingerprint, reason="test") == 1
    assert queues.connection().llen(f"rq:queue:{run.queue}@host:h1") == 0
    assert not Job.exists(run.rq_id(), connection=queues.connection())
