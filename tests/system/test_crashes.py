"""Crashes, for real: forking RQ workers whose work horses SIGKILL themselves at chosen
points, and whole workers killed from outside. Nothing submitted is lost, nothing is
written twice, and no lock file or git process is left behind."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.db import connection

from dashboard.infra import queues
from dashboard.models import Commit, JobAttempt, JobRun, Repository, WorkerBeat
from dashboard.operations.reconciler import reconcile
from dashboard.repositories.lifecycle import submit_repository
from tests.conftest import run_workers
from tests.support.gitrepo import GitRepo, reference_commits
from tests.support.processes import (
    ROOT,
    children,
    end_tree,
    git_processes_under,
    proc_state,
    run_burst_worker,
    worker_env,
)
from tests.support.stored_commits import assert_counts_exact, assert_matches_reference
from workers.git.workspace import mirror_path

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

POINTS = [
    "sync.locked",  # before the fetch
    "sync.fetched",  # after the fetch, before the plan is written
    "analyze.before_lock",
    "analyze.locked",
    "analyze.parsing",  # git is streaming
    "analyze.before_write",
    "analyze.writing",  # inside the write transaction
]


def make_repo(tmp_path: Path, name: str, commits: int) -> GitRepo:
    repo = GitRepo.create(tmp_path / name)
    for i in range(commits):
        repo.commit(f"{name} {i}", {f"f{i % 3}.txt": f"{name} {i}\n" * (i + 1)})
    return repo


def assert_complete_and_exactly_once(repos: dict[str, tuple[Repository, int]]) -> None:
    for name, (repo, commits) in repos.items():
        repo.refresh_from_db()
        assert repo.status == Repository.Status.READY, (name, repo.error)
        stored = Commit.objects.filter(repository=repo)
        assert stored.count() == commits, name
        assert stored.values("sha").distinct().count() == commits, name


def test_work_horses_killed_at_random_points_lose_nothing_and_write_nothing_twice(
    tmp_path: Path, settings
) -> None:
    """24 trials: each repository's work horse SIGKILLs itself once at a random point."""
    settings.CHUNK_SIZE = 3
    rng = random.Random(20261130)
    trials = {f"t{i}": rng.choice(POINTS) for i in range(24)}
    repos = {}
    for name in trials:
        commits = rng.randint(2, 7)
        repos[name] = (
            submit_repository(url=str(make_repo(tmp_path, name, commits).path))[0],
            commits,
        )
    failpoints = ",".join(f"{point}#{name}=kill" for name, point in trials.items())
    once = tmp_path / "once"
    once.mkdir()
    env = worker_env(settings, tmp_path, GITWARD_FAILPOINTS=failpoints,
                     GITWARD_FAILPOINTS_ONCE=str(once), GITWARD_CHUNK_SIZE="3")  # fmt: skip
    result = run_burst_worker(env, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    # Every trial really crashed once: its marker exists and a crashed attempt is recorded.
    assert len(list(once.iterdir())) == len(trials)
    crashed = JobAttempt.objects.filter(outcome="crashed")
    assert crashed.count() == len(trials)
    assert all("signal 9" in a.error for a in crashed)
    assert_complete_and_exactly_once(repos)
    assert not JobRun.objects.exclude(state=JobRun.State.SUCCEEDED).exists()
    workspace = Path(settings.WORKSPACE)
    assert not list(workspace.rglob("*.lock"))
    assert not list((workspace / "tmp").glob("*")) if (workspace / "tmp").exists() else True
    assert git_processes_under(workspace) == []


@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite writes a large chunk in slices")
def test_a_work_horse_killed_between_two_slices_of_its_write_loses_and_doubles_nothing(
    tmp_path: Path, settings
) -> None:
    """docs/scheduling.md#bulk-writes-in-slices-on-sqlite: slices of 2 rows (one commit
    and its file each), one bulk chunk of 6 commits (``GITWARD_INTERACTIVE_MAX_COMMITS=0``:
    the sync's inline chunk is not express). The horse is held just before its write
    (SIGSTOP), express work begins (an entry in the express set), and it goes on: after
    its first slice it commits for the express work and SIGKILLs itself there. The retry
    stores the other five, the count stays exact and the rows are git's."""
    origin = make_repo(tmp_path, "sliced", 6)
    repo = submit_repository(url=str(origin.path))[0]
    once = tmp_path / "once"
    once.mkdir()
    env = worker_env(settings, tmp_path,
                     GITWARD_FAILPOINTS="analyze.before_write=stop,analyze.between_slices=kill",
                     GITWARD_FAILPOINTS_ONCE=str(once), GITWARD_SQLITE_WRITE_SLICE="2",
                     GITWARD_CHUNK_SIZE="100", GITWARD_INTERACTIVE_MAX_COMMITS="0",
                     GITWARD_BULK_WRITE_YIELD="1")  # fmt: skip
    worker = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "worker", "--burst"], env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while True:
            pids = [p for p in JobAttempt.objects.values_list("pid", flat=True) if p]
            held = [p for p in pids if proc_state(p) == "T"]
            if held:
                break
            assert time.monotonic() < deadline, "no horse stopped before its write"
            time.sleep(0.05)
        queues.express_begun("interactive-work")
        os.kill(held[0], signal.SIGCONT)
        _, err = worker.communicate(timeout=180)
        assert worker.returncode == 0, err[-2000:]
    finally:
        queues.express_ended("interactive-work")
        if worker.returncode is None:
            end_tree(worker)
    assert (once / "analyze.between_slices").exists()
    crashed = JobAttempt.objects.filter(outcome="crashed")
    assert crashed.count() == 1 and "signal 9" in crashed[0].error
    assert_complete_and_exactly_once({"sliced": (repo, 6)})
    assert_counts_exact()
    assert_matches_reference(repo, reference_commits(origin.path))


def test_a_poison_repository_is_dead_lettered_after_three_crashes(tmp_path: Path, settings) -> None:
    poison = submit_repository(url=str(make_repo(tmp_path, "poison", 3).path))[0]
    healthy = submit_repository(url=str(make_repo(tmp_path, "healthy", 4).path))[0]
    env = worker_env(settings, tmp_path, GITWARD_FAILPOINTS="analyze.parsing#poison=kill")
    result = run_burst_worker(env, timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    run = JobRun.objects.get(repository=poison, kind="analyze")
    assert run.state == JobRun.State.DEAD and run.attempts == 3  # no infinite crash loop
    assert (
        list(JobAttempt.objects.filter(run=run).values_list("outcome", flat=True))
        == ["crashed"] * 3
    )
    assert run.cause.startswith("WorkerDied")
    poison.refresh_from_db()
    assert poison.status == Repository.Status.FAILED
    assert poison.error == "WorkerDied: work horse killed by signal 9"
    assert_complete_and_exactly_once({"healthy": (healthy, 4)})


def test_a_whole_worker_killed_mid_job_is_detected_by_its_heartbeat(
    tmp_path: Path, settings
) -> None:
    settings.WORKER_DEAD_AFTER = 2.0
    origin = make_repo(tmp_path, "victim", 4)
    # One commit touching 5,000 files: more numstat output than a pipe buffer holds, so
    # git is still alive, blocked mid-stream, when the worker is killed.
    for i in range(5000):
        origin.write(f"many/file{i:05d}.txt", f"{i}\n")
    origin.git("add", "many")
    origin.commit("five thousand files")
    repo = submit_repository(url=str(origin.path))[0]
    env = worker_env(settings, tmp_path, GITWARD_LOCK_TTL="2", GITWARD_WORKER_DEAD_AFTER="2",
                     GITWARD_FAILPOINTS="analyze.parsing=sleep:60")  # fmt: skip
    worker = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "worker", "--workers", "1"], env=env
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if JobRun.objects.filter(kind="analyze", state="running").exists():
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the analyze job never started")
        # Inside the failpoint: git is streaming (blocked on the full pipe), the lock held.
        mirror = mirror_path(Path(settings.WORKSPACE), repo.pk)
        while not git_processes_under(mirror) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert git_processes_under(mirror), "git never started streaming"
        # The sync's horse runs the chunk itself (GITWARD_INLINE_CHUNK): the worker's
        # heartbeat row names that run, not the sync that finished before it.
        analyze = JobRun.objects.get(kind="analyze")
        assert WorkerBeat.objects.get(name=analyze.worker).current_run_id == analyze.pk
        assert analyze.pid == JobRun.objects.get(kind="sync").pid
        # The host dies: worker and work horse are killed at once, no handler runs.
        victims = [worker.pid, *children(worker.pid)]
        for pid in victims:
            try:
                import os

                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        worker.wait(timeout=10)
    finally:
        end_tree(worker)  # still running when the test failed: its whole tree
    # git died with its parent (no orphan keeps streaming or fetching).
    deadline = time.monotonic() + 10
    while git_processes_under(Path(settings.WORKSPACE)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert git_processes_under(Path(settings.WORKSPACE)) == []
    assert reconcile()["crashed"] == 0  # the heartbeat is still fresh: not yet dead
    # Once the heartbeat is older than GITWARD_WORKER_DEAD_AFTER (2 s) a round finds it.
    deadline = time.monotonic() + 30
    while (crashed := reconcile()["crashed"]) == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert crashed == 1
    attempt = JobAttempt.objects.get(run__kind="analyze", number=1)
    assert attempt.outcome == "crashed" and "heartbeat lost" in attempt.error
    run_workers()  # the retry takes the lock once the dead holder's lease expired
    assert_complete_and_exactly_once({"victim": (repo, 5)})
    assert Commit.objects.get(repository=repo, subject="five thousand files").files_changed == 5000
