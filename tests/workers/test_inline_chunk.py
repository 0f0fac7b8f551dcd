"""workers.jobs.sync_repository's inline chunk: the sync's work horse analyses
the first chunk it planned itself, through the same lifecycle as an RQ delivery, and
every crash window recovers. Real forking RQ workers (``manage.py worker --burst``), real
git repositories, real Redis masters; results compared with what git reports."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from rq.job import Job
from rq.registry import FailedJobRegistry, FinishedJobRegistry

from dashboard.infra import queues
from dashboard.locks import leases
from dashboard.models import Chunk, Commit, JobAttempt, JobRun, Repository
from dashboard.operations.reconciler import reconcile
from dashboard.repositories.lifecycle import current_fingerprint, submit_repository
from tests.conftest import run_workers
from tests.support.gitrepo import GitRepo, reference_commits
from tests.support.processes import run_burst_worker, worker_env
from tests.support.stored_commits import assert_matches_reference
from workers.analysis.analyzer import queue_name
from workers.locks import keys

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def make_repo(tmp_path: Path, name: str, commits: int) -> GitRepo:
    repo = GitRepo.create(tmp_path / name)
    for i in range(commits):
        repo.commit(f"{name} {i}", {f"f{i % 3}.txt": f"{name} {i}\n" * (i + 1)})
    return repo


def burst(settings: object, tmp_path: Path, **env: str) -> None:
    """One forking worker (a work horse per RQ job) drains the queues and exits."""
    result = run_burst_worker(worker_env(settings, tmp_path, **env), timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]


def burst_failing_once(settings: object, tmp_path: Path, failpoint: str, **env: str) -> Path:
    """``burst`` with ``failpoint`` (``name=action``) firing once; returns the folder
    where the failpoint leaves its marker file when it fired."""
    once = tmp_path / "once"
    once.mkdir()
    burst(
        settings, tmp_path, GITWARD_FAILPOINTS=failpoint, GITWARD_FAILPOINTS_ONCE=str(once), **env
    )
    return once


def finished(queue: str) -> list[str]:
    """The ids of the RQ jobs that ran to completion on ``queue``."""
    return FinishedJobRegistry(queue=queues.queue(queue)).get_job_ids()


def analysis_queue() -> str:
    return queue_name(current_fingerprint())


def assert_exact(repo: Repository, origin: GitRepo) -> None:
    """Ready, every commit stored once, equal to what git reports."""
    repo.refresh_from_db()
    assert repo.status == Repository.Status.READY, repo.error
    stored = Commit.objects.filter(repository=repo)
    assert stored.count() == len(origin.shas())
    assert stored.values("sha").distinct().count() == stored.count()  # nothing twice
    assert_matches_reference(repo, reference_commits(origin.path))


def sync_attempt(repo: Repository) -> JobAttempt:
    (attempt,) = JobAttempt.objects.filter(run__repository=repo, run__kind="sync")
    assert attempt.outcome == JobAttempt.Outcome.SUCCEEDED
    return attempt


def first_run(repo: Repository) -> JobRun:
    """The run of the chunk the sync analyses inline: the first of its plan, which runs
    the largest chunk first (docs/analysis.md#chunking)."""
    return (
        JobRun.objects.filter(repository=repo, kind="analyze")
        .order_by("-chunk__size", "chunk__position")
        .first()
    )


def outcomes(run: JobRun) -> list[str]:
    return list(
        JobAttempt.objects.filter(run=run).order_by("number").values_list("outcome", flat=True)
    )


def test_a_one_chunk_repository_costs_one_rq_job_the_sync(tmp_path: Path, settings) -> None:
    origin = make_repo(tmp_path, "one", 5)
    repo, _ = submit_repository(url=str(origin.path))
    burst(settings, tmp_path)
    assert_exact(repo, origin)
    sync = sync_attempt(repo)
    run = first_run(repo)
    (attempt,) = JobAttempt.objects.filter(run=run)
    assert attempt.outcome == JobAttempt.Outcome.SUCCEEDED
    # The sync's own work horse ran it: same worker, same horse pid, and it has a lock,
    # a fencing token and a trace of its own.
    assert (attempt.worker, attempt.host, attempt.pid) == (sync.worker, sync.host, sync.pid)
    assert run.state == JobRun.State.SUCCEEDED and run.token and run.lock_key
    assert run.lock_key.startswith(f"locks:git:repo:{repo.pk}:commit:")
    assert [s["name"] for s in attempt.spans][:2] == ["queued", "dequeued"]
    assert attempt.spans[0]["attrs"]["inline_after"] == f"sync-{repo.pk}-g1-a1"
    # Exactly one RQ job ran: the sync. None was ever created for the chunk.
    assert finished(queues.SYNC_QUEUE) == [f"sync-{repo.pk}-g1-a1"]
    assert finished(analysis_queue()) == []
    assert not Job.exists(run.rq_id(1), connection=queues.connection())


def test_a_multi_chunk_repository_has_its_first_chunk_inline_and_the_rest_enqueued(
    tmp_path: Path, settings
) -> None:
    origin = make_repo(tmp_path, "many", 14)
    repo, _ = submit_repository(url=str(origin.path))
    burst(settings, tmp_path, GITWARD_CHUNK_SIZE="2")
    assert_exact(repo, origin)
    sync = sync_attempt(repo)
    chunks = list(Chunk.objects.filter(repository=repo).order_by("position"))
    assert len(chunks) >= 3 and all(c.state == Chunk.State.DONE for c in chunks)
    first = first_run(repo)
    others = JobRun.objects.filter(repository=repo, kind="analyze").exclude(pk=first.pk)
    assert JobAttempt.objects.get(run=first).pid == sync.pid
    assert all(JobAttempt.objects.get(run=r).pid != sync.pid for r in others)
    # one RQ job per other chunk (each its own horse), none for the first
    assert sorted(finished(analysis_queue())) == sorted(r.rq_id(1) for r in others)
    # each chunk under its own lock, with a fencing token of that lock's
    analyze = JobRun.objects.filter(repository=repo, kind="analyze")
    assert len({r.lock_key for r in analyze}) == len(chunks) == analyze.count()
    assert all(r.token is not None for r in analyze)


def test_a_horse_killed_in_its_inline_chunk_has_the_chunk_crashed_and_retried(
    tmp_path: Path, settings
) -> None:
    """SIGKILL while the inline chunk holds its lock: the worker crashes that run too
    (not only the sync its RQ job names, which had succeeded), releases the horse's
    lock, and the retry, an RQ job of its own, stores every commit once."""
    origin = make_repo(tmp_path, "victim", 6)
    repo, _ = submit_repository(url=str(origin.path))
    started = time.monotonic()
    once = burst_failing_once(settings, tmp_path, "analyze.locked=kill", GITWARD_LOCK_TTL="30")
    # the retry did not wait out the dead horse's 30 s lease: its lock was released
    assert time.monotonic() - started < 30
    assert (once / "analyze.locked").exists()
    assert_exact(repo, origin)
    sync = sync_attempt(repo)
    run = first_run(repo)
    assert outcomes(run) == ["crashed", "succeeded"]
    crashed, retry = JobAttempt.objects.filter(run=run).order_by("number")
    assert crashed.pid == sync.pid and "signal 9" in crashed.error
    assert retry.pid != sync.pid  # the retry was an RQ job with a horse of its own
    assert finished(analysis_queue()) == [run.rq_id(2)]
    assert JobRun.objects.get(repository=repo, kind="sync").state == JobRun.State.SUCCEEDED


def test_a_horse_killed_between_the_plan_and_the_claim_leaves_the_run_to_the_reconciler(
    tmp_path: Path, settings
) -> None:
    origin = make_repo(tmp_path, "gap", 4)
    repo, _ = submit_repository(url=str(origin.path))
    once = burst_failing_once(settings, tmp_path, "sync.inline=kill")
    assert (once / "sync.inline").exists()
    sync_attempt(repo)  # recorded as succeeded before the horse died
    run = first_run(repo)
    # planned, never enqueued, never claimed
    assert run.state == JobRun.State.QUEUED and run.attempts == 0
    assert not Job.exists(run.rq_id(1), connection=queues.connection())
    assert Commit.objects.filter(repository=repo).count() == 0
    assert reconcile()["requeued"] == 1  # its RQ job is missing: enqueued again
    assert Job.exists(run.rq_id(1), connection=queues.connection())
    burst(settings, tmp_path)
    assert_exact(repo, origin)
    assert outcomes(run) == ["succeeded"]


def test_an_inline_chunk_whose_lock_is_held_is_deferred_and_done_later(
    tmp_path: Path, settings
) -> None:
    origin = make_repo(tmp_path, "busy", 3)
    repo, _ = submit_repository(url=str(origin.path))
    oldest, newest = origin.shas()[-1], origin.shas()[0]
    key = keys.chunk(repo.pk, f"{oldest}..{newest}")
    # held (heartbeat-extended) by another holder for as long as the worker runs
    with leases.redlock().hold([key], ttl=2.0, holder={"worker": "elsewhere"}) as other:
        burst(settings, tmp_path)
        assert not other.lost.is_set()
    sync = sync_attempt(repo)
    run = first_run(repo)
    assert run.lock_key == "" and outcomes(run) == ["deferred"]
    deferred = JobAttempt.objects.get(run=run)
    assert deferred.pid == sync.pid and "waiting" in deferred.error
    assert run.state == JobRun.State.QUEUED and run.budget_used == 0
    # its next attempt is an RQ job, scheduled for when the lease ends
    assert Job.exists(run.rq_id(2), connection=queues.connection())
    deadline = time.monotonic() + 60
    while JobRun.objects.get(pk=run.pk).state != JobRun.State.SUCCEEDED:
        assert time.monotonic() < deadline, "the deferred chunk was never analysed"
        queues.promote_due_jobs([analysis_queue()])
        run_workers()
        time.sleep(0.1)
    assert_exact(repo, origin)
    assert outcomes(run) == ["deferred", "succeeded"]


def test_an_inline_chunk_that_fails_is_retried_by_rq_and_the_sync_job_stays_finished(
    tmp_path: Path, settings
) -> None:
    origin = make_repo(tmp_path, "flaky", 3)
    repo, _ = submit_repository(url=str(origin.path))
    burst_failing_once(settings, tmp_path, "analyze.parsing=raise")
    assert_exact(repo, origin)
    run = first_run(repo)
    assert outcomes(run) == ["failed", "succeeded"]
    failed = JobAttempt.objects.get(run=run, number=1)
    assert failed.error.startswith("FailpointError")
    assert failed.pid == sync_attempt(repo).pid  # in the sync's horse, after the sync
    sync_id = f"sync-{repo.pk}-g1-a1"
    assert finished(queues.SYNC_QUEUE) == [sync_id]  # not failed by its chunk
    assert FailedJobRegistry(queue=queues.queue(queues.SYNC_QUEUE)).get_job_ids() == []
    assert finished(analysis_queue()) == [run.rq_id(2)]  # the retry, an RQ job


def test_with_inline_chunks_off_every_chunk_is_an_rq_job_of_its_own(
    tmp_path: Path, settings
) -> None:
    origin = make_repo(tmp_path, "off", 5)
    repo, _ = submit_repository(url=str(origin.path))
    burst(settings, tmp_path, GITWARD_INLINE_CHUNK="0")
    assert_exact(repo, origin)
    sync = sync_attempt(repo)
    run = first_run(repo)
    assert JobAttempt.objects.get(run=run).pid != sync.pid
    assert finished(queues.SYNC_QUEUE) == [f"sync-{repo.pk}-g1-a1"]
    assert finished(analysis_queue()) == [run.rq_id(1)]  # two RQ jobs, as before
