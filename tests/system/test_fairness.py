"""Fair scheduling end to end (docs/scheduling.md), with real RQ workers, real Redis and
real git repositories: small repositories submitted after a large history finish before
its backlog does (and, as a control, not without fairness); an interactive submission
queued after a scheduled refresh runs first; a work horse SIGKILLed between claiming a
chunk and releasing the next one wedges nothing. Order is read from the attempts' ids
(claim order), never from the clock."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from dashboard.models import Commit, JobAttempt, JobRun, Repository
from dashboard.operations.reconciler import reconcile
from dashboard.repositories.lifecycle import submit_repository
from dashboard.repositories.refresh_schedule import refresh_due
from tests.conftest import run_workers
from tests.support.gitrepo import GitRepo
from tests.support.processes import run_burst_worker, worker_env

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def make_repo(tmp_path: Path, name: str, commits: int) -> GitRepo:
    repo = GitRepo.create(tmp_path / name)
    add_commits(repo, name, 0, commits)
    return repo


def add_commits(repo: GitRepo, name: str, start: int, n: int) -> None:
    for i in range(start, start + n):
        repo.commit(f"{name} {i}", {f"f{i % 3}.txt": f"{name} {i}\n"})


def claims(repo: Repository, kind: str = JobRun.Kind.ANALYZE) -> list[int]:
    """Attempt ids (claim order) of the repository's runs of ``kind``."""
    return sorted(
        JobAttempt.objects.filter(run__repository=repo, run__kind=kind).values_list("pk", flat=True)
    )


def submit_large_then_small(tmp_path: Path) -> tuple[Repository, list[Repository]]:
    large = submit_repository(url=str(make_repo(tmp_path, "large", 48).path))[0]
    smalls = [
        submit_repository(url=str(make_repo(tmp_path, f"small{i}", 4).path))[0] for i in range(4)
    ]
    return large, smalls


def assert_complete(repo: Repository, commits: int) -> None:
    repo.refresh_from_db()
    assert repo.status == Repository.Status.READY, (repo.name, repo.error)
    stored = Commit.objects.filter(repository=repo)
    assert stored.count() == commits and stored.values("sha").distinct().count() == commits


@pytest.fixture
def small_chunks(settings) -> None:
    settings.CHUNK_SIZE = 2
    settings.CHUNK_MAX = 2


def test_small_repositories_finish_before_a_large_backlog_does(
    tmp_path: Path, settings, small_chunks
) -> None:
    settings.FAIR_WEIGHT = 1
    large, smalls = submit_large_then_small(tmp_path)
    run_workers()
    assert_complete(large, 48)
    for small in smalls:
        assert_complete(small, 4)
    large_claims = claims(large)
    assert len(large_claims) >= 12  # a backlog: many chunks
    last_small = max(claims(small)[-1] for small in smalls)
    # Every small repository's last chunk was claimed while most of the large one's
    # chunks still waited: round-robin lets each small one in after at most one large
    # chunk per small repository ahead of it.
    large_before = sum(1 for pk in large_claims if pk < last_small)
    assert large_before <= 1 + len(smalls), (large_before, len(large_claims))
    assert not JobRun.objects.filter(parked=True).exists()


def test_without_fairness_the_same_fleet_waits_for_the_whole_backlog(
    tmp_path: Path, settings, small_chunks
) -> None:
    """The control of the test above: with ``GITWARD_FAIR_WEIGHT=0`` (plain FIFO) the small
    repositories' chunks run after every chunk of the large one, so that test's
    assertion would fail here."""
    settings.FAIR_WEIGHT = 0
    large, smalls = submit_large_then_small(tmp_path)
    run_workers()
    large_claims = claims(large)
    inline_smalls = {claims(small)[0] for small in smalls}  # run by their syncs' horses
    rest = [pk for small in smalls for pk in claims(small) if pk not in inline_smalls]
    assert rest, "the small repositories have chunks of their own in the queue"
    assert min(rest) > large_claims[-1]


def test_an_interactive_submission_runs_before_a_scheduled_refresh_queued_first(
    tmp_path: Path, settings, small_chunks
) -> None:
    settings.FAIR_WEIGHT = 1
    settings.REFRESH_INTERVAL = 3600.0
    origin = make_repo(tmp_path, "scheduled", 2)
    scheduled = submit_repository(url=str(origin.path))[0]
    run_workers()
    add_commits(origin, "scheduled", 2, 12)
    Repository.objects.filter(pk=scheduled.pk).update(
        next_refresh_at=timezone.now() - timedelta(seconds=1), refresh_interval=3600.0
    )
    assert refresh_due()["refreshed"] == 1  # the scheduler's round queues its sync first
    scheduled.refresh_from_db()
    assert scheduled.priority == 1
    clicked = submit_repository(url=str(make_repo(tmp_path, "clicked", 12).path))[0]
    run_workers()
    assert_complete(scheduled, 14)
    assert_complete(clicked, 12)
    assert claims(clicked, JobRun.Kind.SYNC)[-1] < claims(scheduled, JobRun.Kind.SYNC)[-1]
    # The refresh's chunks: the first is analysed by its sync's horse right after the
    # sync; each one after it waited in the queue behind every interactive chunk.
    queued_refresh = [
        pk for pk in claims(scheduled) if pk > claims(scheduled, JobRun.Kind.SYNC)[-1]
    ][1:]
    assert len(queued_refresh) >= 3
    assert claims(clicked)[-1] < min(queued_refresh)


def test_a_horse_killed_between_its_claim_and_its_release_wedges_nothing(
    tmp_path: Path, settings
) -> None:
    """SIGKILL at ``dispatch.release`` (the claim committed, the next parked run not
    released yet), once, in a forking worker: the attempt is recorded as crashed and
    retried, the repository's parked runs are released (by the retry's claim or the
    reconciler's round) and everything is stored exactly once."""
    settings.FAIR_WEIGHT = 1
    large = submit_repository(url=str(make_repo(tmp_path, "large", 16).path))[0]
    small = submit_repository(url=str(make_repo(tmp_path, "small", 4).path))[0]
    once = tmp_path / "once"
    once.mkdir()
    env = worker_env(settings, tmp_path, GITWARD_FAILPOINTS="dispatch.release#large=kill",
                     GITWARD_FAILPOINTS_ONCE=str(once), GITWARD_CHUNK_SIZE="2",
                     GITWARD_CHUNK_MAX="2", GITWARD_FAIR_WEIGHT="1")  # fmt: skip
    for _ in range(3):  # a release the crash lost is the reconciler's
        result = run_burst_worker(env, timeout=300)
        assert result.returncode == 0, result.stderr[-2000:]
        if not JobRun.objects.filter(state__in=["queued", "failed", "running"]).exists():
            break
        reconcile()
    assert [p.name for p in once.iterdir()] == ["dispatch.release#large"]
    crashed = JobAttempt.objects.filter(outcome="crashed")
    assert crashed.count() == 1 and crashed.get().run.repository_id == large.pk
    assert_complete(large, 16)
    assert_complete(small, 4)
    assert not JobRun.objects.filter(parked=True).exists()
