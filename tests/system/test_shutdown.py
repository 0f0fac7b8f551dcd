"""Graceful SIGTERM, for real: a ``manage.py worker`` pool whose work horse is stuck
inside a job (the ``analyze.before_write=sleep:300`` failpoint) is told to stop with a
short ``GITWARD_WORKER_GRACE``. Nothing of the pool's process tree survives, the job
is run again exactly once, and every commit is stored once."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dashboard.models import Commit, JobAttempt, JobRun, Repository
from dashboard.operations.reconciler import reconcile
from dashboard.repositories.lifecycle import submit_repository
from tests.support.gitrepo import GitRepo
from tests.support.processes import (
    ROOT,
    children,
    end_tree,
    ended,
    git_processes_under,
    proc_state,
    run_burst_worker,
    worker_env,
)
from workers.pool import STOP_MARGIN
from workers.runtime.process_tree import descendants

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

COMMITS = 6


#: What the pool logs when it kills a worker tree still running past its grace.
KILLED_PAST_GRACE = "still running past its grace; killing it"


def start_frozen_pool(tmp_path: Path, settings: object) -> tuple[subprocess.Popen[bytes], int]:
    """A two-worker pool, one of whose work horses is stuck before its write; the pool
    and the stuck horse's pid. (Stuck in a sleep, not SIGSTOPped: the kernel SIGHUPs a
    stopped process whose process group is orphaned, which would kill the horse for
    the pool.)"""
    origin = GitRepo.create(tmp_path / "victim")
    for i in range(COMMITS):
        origin.commit(f"c{i}", {f"f{i % 2}.txt": f"{i}\n"})
    submit_repository(url=str(origin.path))
    once = tmp_path / "once"
    once.mkdir()
    env = worker_env(settings, tmp_path, GITWARD_FAILPOINTS="analyze.before_write=sleep:300",
                     GITWARD_FAILPOINTS_ONCE=str(once), GITWARD_WORKER_GRACE="2",
                     GITWARD_WORKER_DEAD_AFTER="2", GITWARD_LOCK_TTL="3")  # fmt: skip
    with open(tmp_path / "pool.log", "wb") as out:  # the pool's log (stderr)
        pool = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "worker", "--workers", "2"],
            env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            horses = [h for w in children(pool.pid) for h in children(w)]
            if horses and (once / "analyze.before_write").exists():
                (horse,) = horses
                return pool, horse
            assert pool.poll() is None, "the pool died"
            time.sleep(0.05)
        raise AssertionError("no work horse reached the failpoint")
    except BaseException:  # a failed wait, or pytest-timeout: the pool ends with it
        end_tree(pool)
        raise


def stop_pool(pool: subprocess.Popen[bytes], tree: list[int]) -> float:
    """SIGTERM the pool; seconds until it exited. Every process of ``tree`` is gone."""
    started = time.monotonic()
    pool.send_signal(signal.SIGTERM)
    try:
        pool.wait(timeout=60 + STOP_MARGIN)
    finally:
        if pool.poll() is None:  # the test fails below; leave nothing behind
            os.killpg(pool.pid, signal.SIGKILL)
            for pid in tree:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            pool.wait()
    took = time.monotonic() - started
    survivors = [p for p in tree if proc_state(p) not in ("gone", "Z")]
    for pid in survivors:  # the test fails; leave nothing behind
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert survivors == [], f"still running after the pool stopped: {survivors}"
    return took


def assert_stored_once() -> None:
    repo = Repository.objects.get()
    assert repo.status == Repository.Status.READY, repo.error
    stored = Commit.objects.filter(repository=repo)
    assert stored.count() == COMMITS
    assert stored.values("sha").distinct().count() == COMMITS


def test_a_job_still_running_after_the_grace_is_handed_back_and_run_once_more(
    tmp_path: Path, settings
) -> None:
    pool, horse = start_frozen_pool(tmp_path, settings)
    with ended(pool):  # whatever fails before stop_pool, no pool is left behind
        tree = [pool.pid, *descendants(pool.pid)]
        assert horse in tree and len(children(pool.pid)) == 3  # 2 workers + rollouts driver
        stop_pool(pool, tree)
    # The worker handed the job back itself after its 2 s grace; the pool had no need
    # to kill anything (its own deadline is grace + STOP_MARGIN). Read from the pool's
    # log, not from the wall clock (a loaded machine may take longer than the margin).
    assert KILLED_PAST_GRACE not in (tmp_path / "pool.log").read_text()
    assert git_processes_under(Path(settings.WORKSPACE)) == []
    run = JobRun.objects.get(kind="analyze")
    (first,) = JobAttempt.objects.filter(run=run)
    assert first.outcome == "deferred" and "handed back" in first.error
    # It was the chunk the sync's horse analysed itself (GITWARD_INLINE_CHUNK): its
    # worker handed back that run too, not only the sync its RQ job named.
    assert first.pid == JobAttempt.objects.get(run__kind="sync").pid
    assert run.state == JobRun.State.QUEUED and run.budget_used == 0  # not the job's fault

    result = run_burst_worker(worker_env(settings, tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    outcomes = list(JobAttempt.objects.filter(run=run).order_by("number").values_list(
        "outcome", flat=True))  # fmt: skip
    assert outcomes == ["deferred", "succeeded"]  # re-run exactly once
    assert_stored_once()


def test_a_wedged_worker_is_killed_with_its_work_horse_after_the_grace_and_margin(
    tmp_path: Path, settings
) -> None:
    """The worker of the stuck horse is frozen (SIGSTOP), so it cannot hand back: the
    pool kills its whole tree (the horse included, which RQ put in a process group of
    its own) once grace + STOP_MARGIN is over; the job is retried as a crash."""
    settings.WORKER_DEAD_AFTER = 2.0
    pool, horse = start_frozen_pool(tmp_path, settings)
    with ended(pool):  # whatever fails before stop_pool, no pool is left behind
        (worker,) = [p for p in children(pool.pid) if horse in children(p)]
        os.kill(worker, signal.SIGSTOP)
        tree = [pool.pid, *descendants(pool.pid)]
        took = stop_pool(pool, tree)
    assert took >= 2 + STOP_MARGIN  # the pool waited out the grace and its margin
    assert KILLED_PAST_GRACE in (tmp_path / "pool.log").read_text()
    # Dead: gone, or a zombie the container's init has not reaped yet (the horse's
    # parent died with it).
    assert proc_state(horse) in ("gone", "Z") and proc_state(worker) in ("gone", "Z")
    deadline = time.monotonic() + 30
    while (crashed := reconcile()["crashed"]) == 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert crashed == 1
    env = worker_env(settings, tmp_path, GITWARD_LOCK_TTL="3")
    deadline = time.monotonic() + 60  # the retry waits out the dead holder's 3 s lease
    while Repository.objects.get().status != Repository.Status.READY:
        assert time.monotonic() < deadline, "the retry never completed"
        result = run_burst_worker(env)
        assert result.returncode == 0, result.stderr[-2000:]
        reconcile()
    outcomes = list(JobAttempt.objects.filter(run__kind="analyze").exclude(
        outcome="deferred").order_by("number").values_list("outcome", flat=True))  # fmt: skip
    assert outcomes == ["crashed", "succeeded"]
    assert_stored_once()
