"""dashboard.runs.attempts: the run lifecycle of docs/lifecycle.md against the real
database and a real Redis queue (no worker: each transition is driven and checked directly)."""

from __future__ import annotations

import pytest
from django.utils import timezone
from rq.job import Job
from rq.registry import ScheduledJobRegistry

from dashboard.infra import queues
from dashboard.models import Chunk, JobAttempt, JobRun, Repository, WorkerBeat
from dashboard.runs import attempts
from dashboard.runs.dead_letters import dead_runs
from dashboard.versions.state_machine import served_fingerprint
from tests.support.live_tap import Tap
from workers.analysis.analyzer import queue_name

pytestmark = pytest.mark.django_db(transaction=True)


def a_repo(**fields: object) -> Repository:
    return Repository.objects.create(url="https://example.com/team/tool.git", **fields)


def a_sync_run(repo: Repository) -> JobRun:
    return attempts.ensure_run(
        kind=JobRun.Kind.SYNC,
        job_id=repo.sync_job_id(),
        queue=queues.SYNC_QUEUE,
        repository_id=repo.pk,
        generation=repo.generation,
    )


def a_chunk_run(repo: Repository, fingerprint: str | None = None) -> JobRun:
    """A chunk's run under ``fingerprint`` (default: the repository's planned one)."""
    chunk = Chunk.objects.create(
        repository=repo,
        fingerprint=fingerprint or repo.fingerprint,
        key="aaaa1111..bbbb2222",
        shas="aaaa1111",
        size=1,
    )
    return attempts.ensure_run(
        kind=JobRun.Kind.ANALYZE,
        job_id=chunk.job_id(),
        queue="analysis",
        repository_id=repo.pk,
        chunk_id=chunk.pk,
        fingerprint=chunk.fingerprint,
    )


def started(run: JobRun, worker: str = "w1") -> attempts.Attempt:
    attempt = attempts.begin_attempt(run_id=run.pk, number=run.attempts + 1, worker=worker)
    assert attempt is not None
    return attempt


def test_it_returns_the_same_run_for_the_same_job_id() -> None:
    repo = a_repo()
    assert a_sync_run(repo).pk == a_sync_run(repo).pk
    assert JobRun.objects.count() == 1


def test_enqueueing_puts_the_next_attempt_on_the_queue_once() -> None:
    repo = a_repo()
    run = a_sync_run(repo)
    tap = Tap()
    assert attempts.enqueue_run(run) is True
    assert attempts.enqueue_run(run) is False  # the same attempt is already waiting
    job = Job.fetch(run.rq_id(), connection=queues.connection())
    assert job.func_name == attempts.FUNCS[JobRun.Kind.SYNC] and job.args == (run.pk, 1)
    assert queues.queue(queues.SYNC_QUEUE).job_ids == [run.rq_id()]
    tap.until(lambda evs: any(e["type"] == "job.queued" for e in evs))
    assert attempts.is_run_job(job.func_name, job.args)
    assert not attempts.is_run_job("workers.jobs.run_bulk_action", (1,))


def test_an_attempt_is_claimed_once_and_recorded() -> None:
    repo = a_repo()
    run = a_sync_run(repo)
    WorkerBeat.objects.create(name="w1", host="h", pid=1, last_seen=timezone.now())
    attempt = started(run)
    assert attempts.begin_attempt(run_id=run.pk, number=1, worker="w2") is None  # redelivery
    run.refresh_from_db()
    assert run.state == JobRun.State.RUNNING and run.attempts == 1 and run.worker == "w1"
    assert JobAttempt.objects.get(run=run).outcome == JobAttempt.Outcome.RUNNING
    assert WorkerBeat.objects.get(name="w1").current_run_id == run.pk
    attempts.record_lock(attempt, key="locks:git:repo:1:mirror", token=7)
    run.refresh_from_db()
    assert run.lock_key == "locks:git:repo:1:mirror" and run.token == 7
    assert run.lock_acquired_at is not None
    attempts.succeed_attempt(attempt)
    run.refresh_from_db()
    assert run.state == JobRun.State.SUCCEEDED
    assert JobAttempt.objects.get(run=run).outcome == JobAttempt.Outcome.SUCCEEDED
    assert WorkerBeat.objects.get(name="w1").current_run_id is None


def test_a_failed_attempt_is_retried_then_dead_lettered_with_its_chunk_and_repository(
    settings,
) -> None:
    settings.MAX_ATTEMPTS = 2
    repo = a_repo(status=Repository.Status.ANALYZING, fingerprint=served_fingerprint())
    run = a_chunk_run(repo)
    assert attempts.fail_attempt(started(run), ValueError("bad byte at offset 12")) == "failed"
    run.refresh_from_db()
    assert run.state == JobRun.State.FAILED
    # The next attempt is on the queue (backoff 0 in the tests).
    assert queues.queue("analysis").job_ids == [run.rq_id()]
    tap = Tap()
    assert attempts.fail_attempt(started(run), ValueError("bad byte at offset 99")) == "dead"
    run.refresh_from_db()
    assert run.state == JobRun.State.DEAD and run.error.startswith("ValueError: bad byte")
    chunk = Chunk.objects.get(pk=run.chunk_id)
    assert chunk.state == Chunk.State.FAILED and chunk.error.startswith("ValueError")
    repo.refresh_from_db()
    assert repo.status == Repository.Status.FAILED and repo.error == chunk.error
    events = tap.until(
        lambda evs: {"job.dead", "dlq.changed", "repo.changed"} <= {e["type"] for e in evs}
    )
    changed = next(e for e in events if e["type"] == "repo.changed")
    assert changed["repo"] == repo.pk and changed["status"] == "failed"
    assert changed["error"] == repo.error
    # Both failures share one root cause: the numbers are normalised away.
    first, second = JobAttempt.objects.filter(run=run).order_by("number")
    assert first.outcome == second.outcome == JobAttempt.Outcome.FAILED
    assert run.cause == "ValueError: bad byte at offset N"
    assert attempts.cause_of(ValueError("bad byte at offset 12")) == attempts.cause_of(
        ValueError("bad byte at offset 99")
    )


@pytest.mark.parametrize("status", [Repository.Status.ANALYZING, Repository.Status.QUEUED])
def test_a_dead_chunk_of_another_version_leaves_its_repository_alone(status: str) -> None:
    """A canary's (or warming version's) chunk dead-lettered while the repository
    analyses its served version's chunks, or waits for its next sync: the dead letter
    is listed, the chunk failed, the repository's status and error untouched
    (docs/lifecycle.md#statuses)."""
    repo = a_repo(status=status, fingerprint=served_fingerprint())
    run = a_chunk_run(repo, fingerprint="c" * 16)  # a ramping version's shadow chunk
    assert attempts.fail_attempt(started(run), ValueError("x"), permanent=True) == "dead"
    assert Chunk.objects.get(pk=run.chunk_id).state == Chunk.State.FAILED
    assert list(dead_runs().values_list("pk", flat=True)) == [run.pk]
    repo.refresh_from_db()
    assert (repo.status, repo.error) == (status, "")


def test_a_dead_chunk_of_a_superseded_plan_leaves_its_repository_alone() -> None:
    """The served version's chunk, but the repository's last plan was another
    version's (it lags until its catch-up re-plans it): not its own failure either."""
    repo = a_repo(status=Repository.Status.ANALYZING, fingerprint="o" * 16)
    run = a_chunk_run(repo, fingerprint=served_fingerprint())
    assert attempts.fail_attempt(started(run), ValueError("x"), permanent=True) == "dead"
    repo.refresh_from_db()
    assert (repo.status, repo.error) == (Repository.Status.ANALYZING, "")


def test_a_dead_chunk_a_rewrite_dropped_stays_dropped_and_fails_nothing() -> None:
    """An attempt that was running when a rewrite dropped its chunk (its commits are no
    longer reachable from the head: docs/analysis.md) dies later: the dead letter is
    listed, but the chunk stays ``dropped`` (so the branch coming back re-queues it) and
    the repository, analysing its new head, is not failed by commits it no longer has."""
    repo = a_repo(status=Repository.Status.ANALYZING, fingerprint=served_fingerprint())
    run = a_chunk_run(repo)
    attempt = started(run)
    Chunk.objects.filter(pk=run.chunk_id).update(state=Chunk.State.DROPPED)
    assert attempts.fail_attempt(attempt, ValueError("x"), permanent=True) == "dead"
    assert Chunk.objects.get(pk=run.chunk_id).state == Chunk.State.DROPPED
    assert list(dead_runs().values_list("pk", flat=True)) == [run.pk]
    repo.refresh_from_db()
    assert (repo.status, repo.error) == (Repository.Status.ANALYZING, "")


def test_a_permanent_failure_is_dead_at_once_and_shows_the_reason() -> None:
    repo = a_repo(status=Repository.Status.SYNCING)
    run = a_sync_run(repo)
    state = attempts.fail_attempt(started(run), LookupError("x"), permanent=True, reason="no repo")
    assert state == "dead"
    repo.refresh_from_db()
    assert repo.status == Repository.Status.FAILED and repo.error == "no repo"


def test_a_dead_sync_of_an_old_generation_does_not_fail_the_newer_one() -> None:
    repo = a_repo(status=Repository.Status.SYNCING)
    run = a_sync_run(repo)
    attempt = started(run)
    Repository.objects.filter(pk=repo.pk).update(generation=2, status=Repository.Status.QUEUED)
    attempts.fail_attempt(attempt, LookupError("gone"), permanent=True)
    repo.refresh_from_db()
    assert repo.status == Repository.Status.QUEUED and repo.error == ""


def test_waiting_for_a_lock_defers_without_spending_the_budget() -> None:
    repo = a_repo()
    run = a_sync_run(repo)
    assert attempts.defer_attempt(started(run), delay=30.0, reason="lock held by job x") is True
    run.refresh_from_db()
    assert run.state == JobRun.State.QUEUED and run.attempts == 1 and run.budget_used == 0
    attempt = JobAttempt.objects.get(run=run)
    assert attempt.outcome == JobAttempt.Outcome.DEFERRED and "lock held" in attempt.error
    registry = ScheduledJobRegistry(queue=queues.queue(queues.SYNC_QUEUE))
    assert registry.get_job_ids() == [run.rq_id()]  # attempt 2, in 30 s


def test_a_crash_counts_as_an_attempt_once() -> None:
    repo = a_repo()
    run = a_sync_run(repo)
    started(run)
    assert attempts.crash_attempt(run_id=run.pk, number=1, reason="signal 9") == "failed"
    assert attempts.crash_attempt(run_id=run.pk, number=1, reason="signal 9") == ""  # handled
    attempt = JobAttempt.objects.get(run=run)
    assert attempt.outcome == JobAttempt.Outcome.CRASHED and "signal 9" in attempt.error
    run.refresh_from_db()
    assert run.cause.startswith("WorkerDied")


def test_root_causes_group_by_type_message_shape_and_frame() -> None:
    assert attempts.normalise_message("file /tmp/a/b.txt line 12 sha 1a2b3c4d") == (
        "file <path> line N sha <sha>"
    )
    assert attempts.cause_of(KeyError("a"))[0] != attempts.cause_of(ValueError("a"))[0]


def test_sweeping_a_closed_queue_removes_only_the_jobs_no_run_waits_for() -> None:
    """A closed version's queue holds the job of a run still waiting for it (left for
    ``cancel_runs``), a leftover delivery of a run that has since succeeded, and a
    scheduled retry of a run that is dead: the sweep removes the last two, job hashes
    included, and keeps the first."""
    fp = "c" * 16
    repo = a_repo()
    runs = []
    for n in range(3):
        chunk = Chunk.objects.create(
            repository=repo, fingerprint=fp, key=f"{n:08x}", shas=f"{n:08x}", size=1
        )
        runs.append(
            attempts.ensure_run(
                kind=JobRun.Kind.ANALYZE,
                job_id=chunk.job_id(),
                queue=queue_name(fp),
                repository_id=repo.pk,
                chunk_id=chunk.pk,
                fingerprint=fp,
            )
        )
    waiting, finished, dead = runs
    for run in runs:
        assert attempts.enqueue_run(run)
    attempts.succeed_attempt(started(finished))  # another delivery of attempt 1 ran it
    q = queues.queue(queue_name(fp))
    scheduled = ScheduledJobRegistry(queue=q)
    q.remove(dead.rq_id())
    analyze = attempts.FUNCS[JobRun.Kind.ANALYZE]
    queues.enqueue_unique(q, analyze, dead.pk, 2, job_id=dead.rq_id(2), delay=60.0)
    JobRun.objects.filter(pk=dead.pk).update(state=JobRun.State.DEAD, attempts=1)
    assert scheduled.get_job_ids() == [dead.rq_id(2)]

    assert attempts.sweep_closed_queues({fp}) == 2
    assert q.get_job_ids() == [waiting.rq_id()]
    assert scheduled.get_job_ids() == []
    for job_id in (finished.rq_id(1), dead.rq_id(2)):
        assert not Job.exists(job_id, connection=queues.connection())
    assert attempts.sweep_closed_queues({fp}) == 0


def test_cancelling_takes_a_queued_job_and_a_scheduled_retry_out_of_redis() -> None:
    repo = a_repo()
    fp = "f" * 16
    queued, waiting = a_chunk_run(repo, fp), a_chunk_run(a_repo(branch="dev"), fp)
    assert attempts.enqueue_run(queued)
    assert attempts.defer_attempt(started(waiting), delay=600.0, reason="lock held by job x")
    q = queues.queue("analysis")
    registry = ScheduledJobRegistry(queue=q)
    conn = queues.connection()
    waiting.refresh_from_db()
    assert q.job_ids == [queued.rq_id()] and registry.get_job_ids() == [waiting.rq_id()]
    assert attempts.cancel_runs(fingerprint=fp, reason="closed") == 2
    assert q.job_ids == [] and registry.get_job_ids() == []
    assert not Job.exists(queued.rq_id(), connection=conn)
    assert not Job.exists(waiting.rq_id(), connection=conn)
    assert set(JobRun.objects.values_list("state", flat=True)) == {JobRun.State.DISCARDED}
    assert attempts.cancel_runs(fingerprint=fp, reason="closed") == 0
