"""The mirror's host lock, between real processes: a holder makes others wait and then
give up naming it, the lock ends with its holder even when a child of the holder lives
on, it is re-entrant in one thread only, and a lease lost while waiting stops the wait.
Through the job layer, a busy mirror defers the attempt."""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.support.gitrepo import GitRepo
from tests.support.mirror_writers import HOLDER, REPO_ID, Procs, gone, spawn, wait_for
from workers.git import host_lock
from workers.git.host_lock import MirrorBusy, hold_mirror
from workers.git.workspace import host_lock_path, mirror_path
from workers.locks import LockLost, LockNotAcquired, Redlock

#: Holds the host lock and starts a child that inherits every inheritable descriptor
#: (``close_fds=False``), prints the child's pid, then waits to be killed.
HOLDER_WITH_CHILD = """
import subprocess, sys
from pathlib import Path
from workers.git.host_lock import hold_mirror
with hold_mirror(Path(sys.argv[1]), int(sys.argv[2])):
    child = subprocess.Popen(["sleep", "600"], close_fds=False)
    print(child.pid, flush=True)
    sys.stdin.read()
"""


def test_a_held_lock_makes_another_process_wait_then_give_up_naming_the_holder(
    tmp_path: Path, processes: Procs
) -> None:
    workspace = tmp_path / "ws"
    holder = spawn(processes, [sys.executable, "-c", HOLDER, str(workspace), str(REPO_ID)])
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"

    started = time.monotonic()
    with pytest.raises(MirrorBusy) as busy, hold_mirror(workspace, REPO_ID, wait=0.3):
        pytest.fail("entered a mirror another process holds")
    assert time.monotonic() - started >= 0.3  # it waited the whole wait
    assert isinstance(busy.value, LockNotAcquired)  # the job layer defers, spends nothing
    assert f"pid {holder.pid} on {socket.gethostname()}" in str(busy.value)
    assert busy.value.lock_path == host_lock_path(workspace, REPO_ID)

    holder.communicate("", timeout=60)  # the holder lets go
    assert holder.returncode == 0
    with hold_mirror(workspace, REPO_ID, wait=0.3) as lock_path:
        assert lock_path.read_text().startswith(f"pid {os.getpid()} on ")
    # Beside the mirror, never inside it, and never deleted.
    assert lock_path.parent == mirror_path(workspace, REPO_ID).parent and lock_path.exists()


def test_the_lock_ends_with_its_holder_even_when_the_holders_child_lives_on(
    tmp_path: Path, processes: Procs
) -> None:
    """The lock is on the holder's own, non-inheritable descriptor (``O_CLOEXEC``): a
    child started without closing descriptors (``close_fds=False``) does not keep it, so
    a SIGKILLed holder frees the mirror at once whatever its children do."""
    workspace = tmp_path / "ws"
    holder = spawn(
        processes, [sys.executable, "-c", HOLDER_WITH_CHILD, str(workspace), str(REPO_ID)]
    )
    assert holder.stdout is not None
    child = int(holder.stdout.readline())
    try:
        with pytest.raises(MirrorBusy), hold_mirror(workspace, REPO_ID, wait=0.2):
            pass
        os.kill(holder.pid, signal.SIGKILL)  # the holder only; its child lives on
        holder.wait(timeout=60)
        assert not gone(child)
        with hold_mirror(workspace, REPO_ID, wait=30) as lock_path:
            assert lock_path.read_text().startswith(f"pid {os.getpid()} ")
        assert not gone(child)
    finally:
        os.kill(child, signal.SIGKILL)


def test_it_is_reentrant_in_its_thread_and_excludes_other_threads(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    outcome: list[BaseException | str] = []

    def other_thread() -> None:
        try:
            with hold_mirror(workspace, REPO_ID, wait=0.2):
                outcome.append("entered")
        except BaseException as exc:
            outcome.append(exc)

    with hold_mirror(workspace, REPO_ID, wait=0):
        with hold_mirror(workspace, REPO_ID, wait=0):  # the same thread: free
            pass
        # Still held after the inner hold ends.
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join(timeout=60)
        [busy] = outcome
        assert isinstance(busy, MirrorBusy), busy
        assert f"pid {os.getpid()} " in str(busy)
    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join(timeout=60)
    assert outcome[1:] == ["entered"]


def test_a_lease_lost_while_waiting_stops_the_wait_with_lock_lost(
    tmp_path: Path, processes: Procs, redlock: Redlock
) -> None:
    workspace = tmp_path / "ws"
    holder = spawn(processes, [sys.executable, "-c", HOLDER, str(workspace), str(REPO_ID)])
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    key = "locks:git:repo:1:mirror"
    outcome: list[BaseException | float] = []

    with pytest.raises(LockLost), redlock.hold([key], ttl=1.0) as lock:

        def wait_for_mirror() -> None:
            started = time.monotonic()
            try:
                with hold_mirror(workspace, REPO_ID, check=lock.check, wait=120):
                    outcome.append(time.monotonic() - started)
            except BaseException as exc:
                outcome.append(exc)

        waiter = threading.Thread(target=wait_for_mirror)
        waiter.start()
        # A majority suffices to lose the lease (a master may not have answered yet).
        assert redlock.force_release(key, lock.nonce) >= 2
        wait_for("the heartbeat to see the lease lost", lock.lost.is_set)
        waiter.join(timeout=60)  # far sooner than the 120 s wait
        assert not waiter.is_alive()

    [result] = outcome
    assert isinstance(result, LockLost), result
    assert holder.poll() is None  # the holder still holds; nobody got in


@pytest.mark.django_db(transaction=True)
def test_a_sync_job_that_finds_the_mirror_busy_on_its_host_is_deferred_not_failed(
    git_repo: GitRepo, processes: Procs, settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the real job layer: another process on this host holds the mirror's host
    lock (a second Redis holder), so the sync job waits, gives up with MirrorBusy, and
    its attempt is deferred (budget kept), the mirror untouched."""
    from rq import SimpleWorker

    from dashboard.infra import queues
    from dashboard.models import JobAttempt, JobRun
    from dashboard.repositories.lifecycle import submit_repository

    monkeypatch.setattr(host_lock, "HOST_LOCK_WAIT", 0.3)  # a short wait, for the test
    repo, _ = submit_repository(url=str(git_repo.path))
    workspace = Path(settings.WORKSPACE)
    holder = spawn(processes, [sys.executable, "-c", HOLDER, str(workspace), str(repo.pk)])
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"

    SimpleWorker([queues.queue(queues.SYNC_QUEUE)], connection=queues.worker_connection()).work(
        burst=True, logging_level="WARNING"
    )

    run = JobRun.objects.get(kind="sync", repository=repo)
    [attempt] = JobAttempt.objects.filter(run=run)
    assert attempt.outcome == JobAttempt.Outcome.DEFERRED, attempt.error
    assert "mirror host lock" in attempt.error and f"pid {holder.pid}" in attempt.error
    assert run.state == JobRun.State.QUEUED
    assert not mirror_path(workspace, repo.pk).exists()
