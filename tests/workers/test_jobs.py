"""workers.jobs, each entry point step by step, called as RQ calls it (``(run_id,
attempt)``) against real git, Redis masters and the database: claim the attempt → take
the lock → work → record; a redelivered or superseded job does nothing; a held lock
defers without spending the budget; a permanent failure is dead at once, any other is
retried; a lost lease aborts the job before it writes; a job of a version this worker
did not load is handed back (misrouted) or refused (misconfigured).

End to end through RQ workers: tests/system/test_pipeline.py; lock faults with real worker
processes: tests/system/test_job_locks.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rq import SimpleWorker
from rq.job import Job
from rq.registry import FailedJobRegistry

from dashboard.infra import queues
from dashboard.locks import leases
from dashboard.models import Chunk, Commit, JobAttempt, JobRun, Repository
from dashboard.repositories.commit_counts import remove_stored
from dashboard.repositories.lifecycle import submit_repository
from dashboard.rollouts.start import DRIVER_QUEUE
from dashboard.runs.dead_letters import new_bulk
from tests.support.gitrepo import GitRepo
from tests.support.lease_thief import steal_when_held
from tests.support.lock_timing import LEASE_TTL, LOST_LEASE_WORK
from workers import jobs
from workers.analysis.analyzer import DEFAULT, AnalyzerConfig, queue_name
from workers.locks import LockLost
from workers.runtime.redis_server import RedisNode

#: Every master here answers (those killed refuse at once): the healthy masters'
#: node timeout, not 50 ms a loaded machine can exceed (tests/support/lock_timing.py).
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("healthy_masters")]
RENAMES = AnalyzerConfig.from_mapping({"detect_renames": True})


@pytest.fixture(autouse=True)
def _default_loaded(settings: Any) -> Iterator[None]:
    # Each entry point on its own: a sync leaves its chunks to analyze_chunk (the inline
    # chunk, GITWARD_INLINE_CHUNK: the tests at the end and tests/workers/test_inline_chunk.py).
    settings.INLINE_CHUNK = False
    jobs.load_versions([DEFAULT])
    yield
    jobs.load_versions([DEFAULT])


def submitted(git_repo: GitRepo) -> tuple[Repository, JobRun]:
    repo, _ = submit_repository(url=str(git_repo.path))
    return repo, JobRun.objects.get(repository=repo, kind="sync")


def synced(git_repo: GitRepo) -> tuple[Repository, JobRun]:
    """Sync done in this process; returns the repository and its (one) analyze run."""
    repo, run = submitted(git_repo)
    assert jobs.sync_repository(run.pk, 1).startswith("planned 1 chunks")
    return repo, JobRun.objects.get(repository=repo, kind="analyze")


def attempts(run: JobRun) -> list[str]:
    return list(
        JobAttempt.objects.filter(run=run).order_by("number").values_list("outcome", flat=True)
    )


def test_sync_fetches_plans_the_chunks_and_releases_its_lock(git_repo: GitRepo) -> None:
    repo, run = submitted(git_repo)
    assert jobs.sync_repository(run.pk, 1) == "planned 1 chunks over 3 commits"
    run.refresh_from_db()
    repo.refresh_from_db()
    assert run.state == JobRun.State.SUCCEEDED and attempts(run) == ["succeeded"]
    assert run.fetched_at and run.written_at and run.lock_acquired_at
    assert run.lock_key == repo.lock_key() and run.token is not None
    assert repo.head == git_repo.head() and repo.status == Repository.Status.ANALYZING
    chunk = Chunk.objects.get(repository=repo)
    assert sorted(chunk.sha_list()) == sorted(git_repo.shas())
    analyze = JobRun.objects.get(repository=repo, kind="analyze")
    assert analyze.queue == queue_name(DEFAULT.fingerprint()) and analyze.chunk == chunk
    assert leases.redlock().inspect(repo.lock_key()) is None  # released at the end


def test_a_redelivered_attempt_does_nothing(git_repo: GitRepo) -> None:
    _, run = submitted(git_repo)
    jobs.sync_repository(run.pk, 1)
    chunks = list(Chunk.objects.values_list("pk", "state"))
    assert jobs.sync_repository(run.pk, 1).startswith("superseded")
    assert jobs.sync_repository(run.pk, 3).startswith("superseded")  # not the next attempt
    assert list(Chunk.objects.values_list("pk", "state")) == chunks
    assert attempts(run) == ["succeeded"]


def test_a_sync_of_a_superseded_generation_ends_without_touching_git(git_repo: GitRepo) -> None:
    repo, run = submitted(git_repo)
    Repository.objects.filter(pk=repo.pk).update(generation=repo.generation + 1)
    assert jobs.sync_repository(run.pk, 1) == "nothing to do"
    assert not Chunk.objects.exists()
    assert not (Path(str(repo.pk))).exists()
    assert JobRun.objects.get(pk=run.pk).state == JobRun.State.SUCCEEDED


def test_a_held_lock_defers_the_run_without_spending_its_budget(
    git_repo: GitRepo, settings: Any
) -> None:
    repo, run = submitted(git_repo)
    other = leases.redlock().acquire([repo.lock_key()], ttl=30.0, holder={"job": "another"})
    try:
        result = jobs.sync_repository(run.pk, 1)
    finally:
        other.release()
    assert result.startswith("deferred") and "lock held by another job" in result
    delay = float(result.split()[1].rstrip("s:"))
    assert 0 < delay <= settings.LOCK_TTL  # the lease's remaining TTL (+ jitter), bounded
    run.refresh_from_db()
    assert run.state == JobRun.State.QUEUED and run.budget_used == 0
    assert attempts(run) == ["deferred"] and not Chunk.objects.exists()
    # The deferred attempt is back on its queue (scheduled after the delay).
    assert queues.queue(run.queue).scheduled_job_registry.get_job_ids() == [run.rq_id()]


def test_an_invalid_remote_is_permanent_dead_after_one_attempt(git_repo: GitRepo) -> None:
    repo, run = submitted(git_repo)
    Repository.objects.filter(pk=repo.pk).update(fetch_url="ftp://example.com/x.git")
    assert jobs.sync_repository(run.pk, 1).startswith("failed:")
    run.refresh_from_db()
    assert run.state == JobRun.State.DEAD and attempts(run) == ["failed"]
    assert "InvalidRemote" in run.error
    assert Repository.objects.get(pk=repo.pk).status == Repository.Status.FAILED


def test_any_other_failure_fails_the_attempt_is_raised_to_rq_and_is_retried(
    git_repo: GitRepo, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo, run = submitted(git_repo)
    monkeypatch.setenv("GITWARD_FAILPOINTS", "sync.fetched=raise")
    with pytest.raises(Exception, match=r"sync\.fetched"):
        jobs.sync_repository(run.pk, 1)
    run.refresh_from_db()
    assert run.state == JobRun.State.FAILED and attempts(run) == ["failed"]
    assert leases.redlock().inspect(repo.lock_key()) is None  # released on the way out
    monkeypatch.delenv("GITWARD_FAILPOINTS")
    assert jobs.sync_repository(run.pk, 2).startswith("planned")  # the retry goes through


@pytest.mark.parametrize("point", ["sync.locked", "sync.fetched"])  # before / after the fetch
def test_a_lease_lost_during_sync_aborts_it_before_it_plans_anything(
    point: str,
    git_repo: GitRepo, settings: Any, monkeypatch: pytest.MonkeyPatch,
    redis_nodes: list[RedisNode],
) -> None:  # fmt: skip
    repo, run = submitted(git_repo)
    settings.LOCK_TTL = LEASE_TTL  # heartbeat every TTL/3 (1 s)
    monkeypatch.setenv("GITWARD_FAILPOINTS", f"{point}=sleep:{LOST_LEASE_WORK:g}")
    seen: dict[str, Any] = {}
    thief = steal_when_held(repo.lock_key(), redis_nodes, seen)
    with pytest.raises(LockLost):
        jobs.sync_repository(run.pk, 1)
    thief.join()
    assert seen, "the job never held the lock"
    assert not Chunk.objects.exists()  # nothing planned under a lost lease
    run.refresh_from_db()
    assert run.state == JobRun.State.FAILED and "LockLost" in run.error


def test_analyze_stores_the_chunk_under_its_lock(git_repo: GitRepo) -> None:
    _, run = synced(git_repo)
    assert jobs.analyze_chunk(run.pk, 1) == "stored 3 commits"
    run.refresh_from_db()
    assert run.state == JobRun.State.SUCCEEDED and run.analysed_at and run.written_at
    assert run.lock_key == run.chunk.lock_key()  # type: ignore[union-attr]
    assert set(Commit.objects.values_list("token", flat=True)) == {run.token}
    assert Chunk.objects.get().state == Chunk.State.DONE
    assert Repository.objects.get().status == Repository.Status.READY


def test_a_lease_lost_during_analysis_writes_nothing(
    git_repo: GitRepo, settings: Any, monkeypatch: pytest.MonkeyPatch,
    redis_nodes: list[RedisNode],
) -> None:  # fmt: skip
    _, run = synced(git_repo)
    settings.LOCK_TTL = LEASE_TTL
    monkeypatch.setenv("GITWARD_FAILPOINTS", f"analyze.locked=sleep:{LOST_LEASE_WORK:g}")
    seen: dict[str, Any] = {}
    thief = steal_when_held(run.chunk.lock_key(), redis_nodes, seen)  # type: ignore[union-attr]
    with pytest.raises(LockLost):
        jobs.analyze_chunk(run.pk, 1)
    thief.join()
    assert seen and not Commit.objects.exists()
    assert JobRun.objects.get(pk=run.pk).state == JobRun.State.FAILED


def test_analyze_without_a_local_mirror_fetches_it_first(git_repo: GitRepo, settings: Any) -> None:
    """Another worker host ran the sync: this one's workspace has no mirror yet."""
    _, run = synced(git_repo)
    settings.WORKSPACE = Path(settings.WORKSPACE).parent / "other-host"
    assert jobs.analyze_chunk(run.pk, 1) == "stored 3 commits"
    assert Commit.objects.count() == 3


def test_a_job_of_a_version_not_loaded_from_its_own_queue_is_refused_permanently(
    git_repo: GitRepo,
) -> None:
    _, run = synced(git_repo)
    jobs.load_versions([RENAMES])  # misconfigured: it listens where it cannot analyse
    assert jobs.analyze_chunk(run.pk, 1).startswith("refused:")
    run.refresh_from_db()
    assert run.state == JobRun.State.DEAD and "VersionNotLoaded" in run.error
    assert not Commit.objects.exists()


def test_a_job_of_a_version_not_loaded_from_its_own_host_queue_is_refused_not_bounced(
    git_repo: GitRepo,
) -> None:
    """A worker host's queue of the job's own version (mirror affinity,
    docs/scheduling.md#mirror-affinity) is its own queue: a worker that did not load the
    version is misconfigured there too, and the job is not handed back for ever."""
    _, run = synced(git_repo)
    host_queue = queues.queue(f"{run.queue}@host:h1")
    queues.queue(run.queue).empty()
    host_queue.enqueue(jobs.analyze_chunk, run.pk, 1, job_id=run.rq_id())
    jobs.load_versions([RENAMES])
    SimpleWorker([host_queue], connection=queues.worker_connection()).work(
        burst=True, logging_level="WARNING"
    )
    run.refresh_from_db()
    assert run.state == JobRun.State.DEAD and "VersionNotLoaded" in run.error


def test_a_misrouted_job_is_handed_back_to_its_own_queue_unspent(git_repo: GitRepo) -> None:
    """Taken (by a real RQ worker) from another version's queue: back to its own."""
    _, run = synced(git_repo)
    own = run.queue
    foreign = queues.queue(queue_name(RENAMES.fingerprint()))
    queues.queue(own).empty()
    foreign.enqueue(jobs.analyze_chunk, run.pk, 1, job_id=run.rq_id())
    jobs.load_versions([RENAMES])
    SimpleWorker([foreign], connection=queues.worker_connection()).work(
        burst=True, logging_level="WARNING"
    )
    run.refresh_from_db()
    assert run.state == JobRun.State.QUEUED and run.queue == own and run.budget_used == 0
    assert attempts(run) == ["deferred"]
    assert queues.queue(own).get_job_ids() == [run.rq_id()]
    jobs.load_versions([DEFAULT])
    SimpleWorker([queues.queue(own)], connection=queues.worker_connection()).work(
        burst=True, logging_level="WARNING"
    )
    assert Commit.objects.count() == 3


def test_the_loaded_versions_are_what_a_worker_reports() -> None:
    assert jobs.loaded_fingerprints() == [DEFAULT.fingerprint()]
    jobs.load_versions([RENAMES, DEFAULT])
    assert jobs.loaded_fingerprints() == [RENAMES.fingerprint(), DEFAULT.fingerprint()]
    jobs.load_versions([])
    assert jobs.loaded_fingerprints() == [DEFAULT.fingerprint()]  # never none


def test_catch_up_of_a_version_no_longer_served_is_done_at_once() -> None:
    assert jobs.catch_up_repositories(RENAMES.fingerprint(), 0) == "catch-up done"


def test_a_bulk_action_runs_over_its_dead_letters(git_repo: GitRepo) -> None:
    repo, run = submitted(git_repo)
    Repository.objects.filter(pk=repo.pk).update(fetch_url="ftp://example.com/x.git")
    jobs.sync_repository(run.pk, 1)  # dead at once: a permanent failure
    action = new_bulk(kind="discard", selector={"runs": [run.pk]}, actor="op")
    assert jobs.run_bulk_action(action.pk) == "discard: 1/1"
    assert JobRun.objects.get(pk=run.pk).state == JobRun.State.DISCARDED


def resynced(git_repo: GitRepo, repo: Repository) -> str:
    """Re-submit after a push; run the new sync job here; its result."""
    submit_repository(url=str(git_repo.path))
    run = JobRun.objects.filter(repository=repo, kind="sync").order_by("-pk")[0]
    return jobs.sync_repository(run.pk, 1)


def analysed(repo: Repository) -> None:
    for run in JobRun.objects.filter(repository=repo, kind="analyze", state="queued"):
        assert jobs.analyze_chunk(run.pk, 1).startswith("stored")


def test_a_resync_after_a_push_lists_and_plans_only_the_new_commits(git_repo: GitRepo) -> None:
    """After a fast-forward the sync lists ``rev-list new ^old`` only, plans
    those and adds them to the total; the stored commits equal what a full plan gives."""
    repo, _ = synced(git_repo)
    analysed(repo)
    old = git_repo.shas()
    git_repo.commit("pushed", {"late.txt": "a\n"})
    git_repo.commit("pushed again", {"late.txt": "a\nb\n"})
    assert resynced(git_repo, repo) == "planned 1 chunks over 2 new commits"
    repo.refresh_from_db()
    assert repo.head == git_repo.head() and repo.commits_total == 5
    newest = Chunk.objects.filter(repository=repo).order_by("-position")[0]
    assert set(newest.sha_list()) == set(git_repo.shas()) - set(old)
    analysed(repo)
    repo.refresh_from_db()
    assert repo.status == Repository.Status.READY
    assert set(Commit.objects.filter(repository=repo).values_list("sha", flat=True)) == set(
        git_repo.shas()
    )
    # nothing new: an empty incremental plan, still ready
    assert resynced(git_repo, repo) == "planned 0 chunks over 0 new commits"
    repo.refresh_from_db()
    assert repo.status == Repository.Status.READY and repo.commits_total == 5


def test_a_force_push_or_a_failed_chunk_makes_the_resync_plan_the_whole_history(
    git_repo: GitRepo,
) -> None:
    """The incremental plan holds only when the old head is an ancestor of the new one
    (else the total is unknown) and no chunk of the previous plan failed (a full plan
    plans its commits again): otherwise the whole history is listed and planned as before."""
    repo, _ = synced(git_repo)
    analysed(repo)
    git_repo.git("reset", "--quiet", "--hard", "HEAD~1")
    git_repo.commit("rewritten", {"other.txt": "c\n"})
    assert resynced(git_repo, repo) == "planned 1 chunks over 3 commits"
    repo.refresh_from_db()
    assert repo.commits_total == 3 and repo.head == git_repo.head()
    analysed(repo)
    failed = Chunk.objects.filter(repository=repo).order_by("-position")[0]
    gone = Commit.objects.filter(repository=repo, sha__in=failed.sha_list()).delete()[1]
    remove_stored(repo.pk, failed.fingerprint, gone["dashboard.Commit"])  # the kept count too
    Chunk.objects.filter(pk=failed.pk).update(state=Chunk.State.FAILED)
    git_repo.commit("pushed", {"late.txt": "a\n"})
    assert resynced(git_repo, repo) == "planned 1 chunks over 4 commits"
    newest = Chunk.objects.filter(repository=repo).order_by("-position")[0]
    assert set(failed.sha_list()) < set(newest.sha_list())  # its commits planned again
    repo.refresh_from_db()
    assert repo.commits_total == 4
    analysed(repo)
    assert set(Commit.objects.filter(repository=repo).values_list("sha", flat=True)) == set(
        git_repo.shas()
    )
    # the failed chunk stays failed, but its commits are stored: incremental again
    git_repo.commit("pushed again", {"late.txt": "a\nb\n"})
    assert resynced(git_repo, repo) == "planned 1 chunks over 1 new commits"
    failed.refresh_from_db()
    assert failed.state == Chunk.State.FAILED


def test_a_sync_analyses_its_first_chunk_itself_through_the_whole_lifecycle(
    git_repo: GitRepo, settings: Any
) -> None:
    settings.INLINE_CHUNK = True
    repo, run = submitted(git_repo)
    assert jobs.sync_repository(run.pk, 1) == (
        "planned 1 chunks over 3 commits; first chunk inline: stored 3 commits"
    )
    analyze = JobRun.objects.get(repository=repo, kind="analyze")
    assert analyze.state == JobRun.State.SUCCEEDED and attempts(analyze) == ["succeeded"]
    assert analyze.lock_key == analyze.chunk.lock_key() and analyze.token is not None
    assert leases.redlock().inspect(analyze.lock_key) is None  # released at the end
    assert queues.queue(analyze.queue).count == 0  # never enqueued
    assert Repository.objects.get(pk=repo.pk).status == Repository.Status.READY
    assert Commit.objects.filter(repository=repo).count() == 3


def test_a_sync_of_a_worker_without_the_served_version_enqueues_every_chunk(
    git_repo: GitRepo, settings: Any
) -> None:
    """Only a worker that loaded the served version analyses inline; another one (here
    a worker of the renames version) leaves the chunk to that version's queue."""
    settings.INLINE_CHUNK = True
    jobs.load_versions([RENAMES])
    repo, run = submitted(git_repo)
    assert jobs.sync_repository(run.pk, 1) == "planned 1 chunks over 3 commits"
    analyze = JobRun.objects.get(repository=repo, kind="analyze")
    assert analyze.state == JobRun.State.QUEUED and attempts(analyze) == []
    assert queues.queue(analyze.queue).get_job_ids() == [analyze.rq_id()]


def test_a_sync_leaves_its_first_chunk_on_a_paused_analysis_queue(
    git_repo: GitRepo, settings: Any
) -> None:
    settings.INLINE_CHUNK = True
    queues.set_paused(queue_name(DEFAULT.fingerprint()), True)
    repo, run = submitted(git_repo)
    assert jobs.sync_repository(run.pk, 1) == "planned 1 chunks over 3 commits"
    analyze = JobRun.objects.get(repository=repo, kind="analyze")
    assert analyze.state == JobRun.State.QUEUED and attempts(analyze) == []
    assert queues.queue(analyze.queue).get_job_ids() == [analyze.rq_id()]


def test_a_sync_that_fails_after_its_plan_enqueues_the_chunk_it_held(
    git_repo: GitRepo, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan committed with the first chunk held for this horse, then the sync failed:
    the held run goes to its queue at once (not to the reconciler): the sync's retry
    finds the plan made and does nothing, so no one else would take it."""
    settings.INLINE_CHUNK = True
    monkeypatch.setenv("GITWARD_FAILPOINTS", "sync.planned=raise")
    repo, run = submitted(git_repo)
    with pytest.raises(Exception, match=r"sync\.planned"):
        jobs.sync_repository(run.pk, 1)
    assert JobRun.objects.get(pk=run.pk).state == JobRun.State.FAILED
    analyze = JobRun.objects.get(repository=repo, kind="analyze")
    assert analyze.state == JobRun.State.QUEUED and attempts(analyze) == []
    assert queues.queue(analyze.queue).get_job_ids() == [analyze.rq_id()]
    monkeypatch.delenv("GITWARD_FAILPOINTS")
    assert jobs.sync_repository(run.pk, 2) == "nothing to do"
    assert jobs.analyze_chunk(analyze.pk, 1) == "stored 3 commits"
    assert attempts(analyze) == ["succeeded"]
    assert Commit.objects.filter(repository=repo).count() == 3


def test_a_driver_job_queued_under_its_old_path_still_runs() -> None:
    """The rollout driver moved from ``dashboard.deploylock`` to ``workers.jobs``; a job
    queued before the move names the old path in Redis. The pool's job class runs it as
    the new function; RQ's own could not import it."""
    q = queues.queue(DRIVER_QUEUE)
    q.empty()
    job = q.enqueue("dashboard.deploylock.drive_rollout", 999_999, job_id="legacy-driver")
    assert jobs.MovedPathsJob.fetch(job.id, connection=q.connection).func is jobs.drive_rollout
    with pytest.raises((ImportError, AttributeError, ValueError)):  # RQ: ValueError
        _ = Job.fetch(job.id, connection=q.connection).func
    SimpleWorker([q], connection=queues.worker_connection(), job_class=jobs.MovedPathsJob).work(
        burst=True, logging_level="CRITICAL"
    )
    # It ran the driver, which found no such rollout (not an import error).
    failed = jobs.MovedPathsJob.fetch(job.id, connection=q.connection)
    assert failed.id in FailedJobRegistry(queue=q).get_job_ids()
    assert "DoesNotExist" in (failed.exc_info or ""), failed.exc_info


def test_a_driver_job_of_a_rollout_aborted_before_it_ran_returns_at_once() -> None:
    """A rollout aborted while pending (its driver job still queued): when the job
    runs it finds the rollout ended and returns, instead of failing on it."""
    from dashboard.rollouts.deploy_lock import abort_rollout
    from dashboard.rollouts.start import start_rollout
    from dashboard.versions.state_machine import ensure_baseline

    ensure_baseline(actor="setup")
    ro = start_rollout(config={"detect_renames": True}, actor="ci", enqueue_driver=False)
    assert abort_rollout(rollout=ro, actor="ops").state == "aborted"
    assert jobs.drive_rollout(ro.pk) == f"nothing to drive: rollout #{ro.pk} is aborted"


def test_a_chunk_holds_its_writes_back_for_at_most_its_allowance_over_all_its_slices(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/scheduling.md#bulk-writes-yield-to-express-work: with express work running all the
    while, the first slice waits out the chunk's whole allowance; every later slice of
    the same chunk then writes at once (a stream of small jobs delays a backfill's chunk
    by ``GITWARD_BULK_WRITE_YIELD`` at most, it never stalls it)."""
    settings.BULK_WRITE_YIELD = 0.2
    yielded: list[str] = []
    monkeypatch.setattr(jobs, "failpoint", lambda name, tag="": yielded.append(name))
    queues.express_begun("small")  # and it never ends during the test
    allowance = [float(settings.BULK_WRITE_YIELD)]
    jobs._yield_write("large", allowance)
    assert yielded == ["analyze.yielding"] and allowance[0] <= 0
    for _slice in range(3):
        jobs._yield_write("large", allowance)
    assert yielded == ["analyze.yielding"]  # none of them waited
    fresh = [float(settings.BULK_WRITE_YIELD)]  # the next chunk has its own
    jobs._yield_write("large", fresh)
    assert yielded == ["analyze.yielding"] * 2
