"""Mirror syncs for real, with git's writing order and gitward's locks in the way: a fetch
stopped between writing its ``.pack`` and its ``.idx`` (readers, sanitation and a second
worker meanwhile), two worker processes on one host syncing one repository with the Redis
lock out of the picture, and a lease lost in the middle of a clone.

The host lock alone: ``tests/workers/git/test_host_lock.py``; the leftovers of dead writers:
``tests/workers/git/test_sanitation.py``; the processes and the stall shim:
``tests/support/mirror_writers.py``.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.support.gitrepo import GitRepo
from tests.support.mirror_writers import (
    REPO_ID,
    WORKER,
    Procs,
    grow,
    incomplete_packs,
    release,
    rev_list,
    spawn,
    stall_env,
    stalled_pid,
    stalled_worker,
    wait_for,
)
from workers.git.host_lock import MirrorBusy
from workers.git.mirror import is_valid, mirror_head, packs_intact, sanitize_mirror, sync_mirror
from workers.git.runner import Runner
from workers.git.workspace import mirror_path
from workers.locks import LockLost, Redlock


def test_a_fetch_stopped_between_its_pack_and_idx_leaves_readers_the_old_head_complete(
    synced: tuple[Path, GitRepo], processes: Procs, shim: Path, tmp_path: Path
) -> None:
    """A worker's fetch has renamed its ``.pack`` in, not yet its ``.idx``: readers see the
    old head, complete; the mirror passes every check; sanitation waits for the worker's
    host lock and touches nothing; resumed, the fetch ends with the new head."""
    workspace, origin = synced
    path = mirror_path(workspace, REPO_ID)
    before = rev_list(path)
    new_head = grow(origin)
    marker = tmp_path / "stalled"
    worker, pid = stalled_worker(processes, workspace, origin.path, shim, marker)
    [pack] = incomplete_packs(path)

    assert rev_list(path) == before  # a reader during the fetch: the old head, complete
    assert packs_intact(path) and is_valid(path)  # a pack without its index is not corruption
    with pytest.raises(MirrorBusy):
        sanitize_mirror(workspace=workspace, repo_id=REPO_ID, runner=Runner(), wait=0.3)
    assert pack.exists(), "the live fetch's pack was deleted"

    release(pid, marker)
    out, err = worker.communicate(timeout=120)
    assert worker.returncode == 0, err
    assert out.strip() == new_head == rev_list(path)[0]
    assert pack.with_suffix(".idx").exists() and packs_intact(path) and is_valid(path)


def test_two_workers_on_one_host_without_redis_never_delete_each_others_work(
    synced: tuple[Path, GitRepo], processes: Procs, shim: Path, tmp_path: Path
) -> None:
    """Worker A is stopped mid-fetch (its pack in, its index not yet); worker B starts
    the same sync with the Redis lock out of the picture. B waits on the host lock and
    touches nothing until A is done; then both end with the same, complete mirror."""
    workspace, origin = synced
    path = mirror_path(workspace, REPO_ID)
    new_head = grow(origin)
    marker = tmp_path / "stalled"
    url = str(origin.path)
    a, _ = stalled_worker(processes, workspace, origin.path, shim, marker)
    [pack] = incomplete_packs(path)

    b = spawn(processes, [sys.executable, "-c", WORKER, str(workspace), url, "{}", "120"])
    assert b.stderr is not None
    line = b.stderr.readline()  # B's first word: it found the mirror busy
    assert "waiting" in line and f"pid {a.pid}" in line, line
    assert b.poll() is None and a.poll() is None
    assert pack.exists() and is_valid(path)

    release(int(marker.read_text()), marker)  # A's index-pack goes on
    out_a, err_a = a.communicate(timeout=120)
    out_b, err_b = b.communicate(timeout=120)
    assert a.returncode == 0, err_a
    assert b.returncode == 0, err_b
    assert out_a.strip() == out_b.strip() == new_head
    assert pack.exists() and pack.with_suffix(".idx").exists()
    assert is_valid(path) and packs_intact(path) and rev_list(path)[0] == new_head


def test_a_lease_lost_during_a_clone_stops_it_before_the_rename_and_the_mirror_stays(
    tmp_path: Path, git_repo: GitRepo, shim: Path, redlock: Redlock
) -> None:
    workspace = tmp_path / "ws"
    path = mirror_path(workspace, REPO_ID)
    # What is at the real path is not a valid mirror (no analysed ref), so the sync clones
    # aside and would replace it: only the lease holder may.
    subprocess.run(["git", "init", "--quiet", "--bare", str(path)], check=True)
    (path / "kept").write_text("the previous holder's mirror\n")
    marker = tmp_path / "stalled"
    outcome: list[BaseException | str] = []
    key = "locks:git:repo:1:mirror"

    # TTL 5 s: the heartbeat keeps the lease through a slow clone on a loaded machine
    # (at 1 s it could expire before the operator's release, which then found nothing).
    with pytest.raises(LockLost), redlock.hold([key], ttl=5.0) as lock:

        def sync() -> None:
            try:
                outcome.append(
                    sync_mirror(
                        workspace=workspace,
                        repo_id=REPO_ID,
                        git_url=str(git_repo.path),
                        branch="main",
                        runner=Runner(extra_env=stall_env(shim, marker)),
                        timeout=60,
                        check=lock.check,
                    )
                )
            except BaseException as exc:
                outcome.append(exc)

        worker = threading.Thread(target=sync)
        worker.start()
        pid = stalled_pid(marker)  # the clone's pack is in, in workspace/tmp
        # An operator force-releases the lease of this (live) holder; its heartbeat
        # finds out on the next extension.
        assert redlock.force_release(key, lock.nonce) == 3
        wait_for("the heartbeat to see the lease lost", lock.lost.is_set)
        release(pid, marker)
        worker.join(timeout=120)
        assert not worker.is_alive()

    [result] = outcome
    assert isinstance(result, LockLost), result
    assert (path / "kept").read_text() == "the previous holder's mirror\n"
    assert not is_valid(path)  # not replaced by the clone
    assert list((workspace / "tmp").iterdir()) == []  # our own temporary is gone


def test_mirror_head_reads_the_ref_files_loose_or_packed(synced: tuple[Path, GitRepo]) -> None:
    """``mirror_head`` (the analyze job's no-git check) names what git resolves, whether
    the ref is loose or packed, and nothing for a mirror that is not one."""
    workspace, _origin = synced
    path = mirror_path(workspace, REPO_ID)
    want = rev_list(path)[0]
    assert mirror_head(path) == want
    subprocess.run(["git", "--git-dir", str(path), "pack-refs", "--all"], check=True)
    assert not (path / "refs" / "gitward" / "head").exists()
    assert mirror_head(path) == want
    (path / "HEAD").unlink()
    assert mirror_head(path) is None
    assert mirror_head(workspace / "nothing-here") is None
