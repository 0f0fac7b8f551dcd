"""What dead writers leave in a mirror, removed for real: the ref lock of a SIGKILLed
gitward worker's git (young, and still removed, so the retry goes through), the young pack
of an orphaned ``index-pack`` that outlived its SIGKILLed worker (kept until old), a live
writer's lock file (kept: its host lock is held), the leftovers of SIGKILLed git processes,
the half-built clone of a SIGKILLed worker, and a lost lease stopping removal."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from tests.support.gitrepo import GitRepo
from tests.support.mirror_writers import (
    REF_WRITER,
    REPO_ID,
    Procs,
    gone,
    grow,
    incomplete_packs,
    lock_files,
    raw_fetch,
    ref_transaction,
    release,
    rev_list,
    spawn,
    stall_env,
    stalled_pid,
    stalled_worker,
    wait_for,
)
from tests.support.sysproc import proc_state
from workers.git import host_lock
from workers.git.host_lock import MirrorBusy
from workers.git.mirror import is_valid, packs_intact, sanitize_mirror, sync_mirror, update_mirror
from workers.git.runner import GitError, Runner
from workers.git.sanitation import STALE_AFTER, remove_stale_files, remove_stale_temporaries
from workers.git.workspace import mirror_path, new_temporary
from workers.locks import LockLost, Redlock


def sync(workspace: Path, origin: GitRepo, **kw: object) -> str:
    return sync_mirror(
        workspace=workspace,
        repo_id=REPO_ID,
        git_url=str(origin.path),
        branch="main",
        runner=Runner(),
        timeout=60,
        **kw,  # type: ignore[arg-type]
    )


def test_the_ref_lock_of_a_sigkilled_workers_git_is_removed_at_once_and_the_retry_succeeds(
    synced: tuple[Path, GitRepo], processes: Procs
) -> None:
    """The worker holds the host lock and its git holds the head ref's lock when the
    worker is SIGKILLed; git dies with it.  The retry comes at once (the lock file is
    seconds old) and goes through: with the host lock free, the lock file's writer is
    provably gone, whatever its age."""
    workspace, origin = synced
    path = mirror_path(workspace, REPO_ID)
    parent = rev_list(path)[1]
    writer = spawn(processes, [sys.executable, "-c", REF_WRITER, str(workspace), parent])
    assert writer.stdout is not None
    git = int(writer.stdout.readline())
    assert lock_files(path) == {"refs/gitward/head.lock", "HEAD.lock"}

    # Stopped first, so that it cannot see its stdin close and roll back in the moment
    # between its worker's death and its own (it dies mid-write, as in a crash).
    os.kill(git, signal.SIGSTOP)
    wait_for("git to stop", lambda: proc_state(git) == "T")
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait(timeout=60)
    wait_for("git to die with its worker (pdeathsig)", lambda: gone(git))
    assert lock_files(path) == {"refs/gitward/head.lock", "HEAD.lock"}
    new_head = grow(origin)
    # Left as it is, the dead git's lock fails every fetch.
    with pytest.raises(GitError, match=r"head\.lock': File exists"):
        sync(workspace, origin)

    # The retry, as the sync job runs it: sanitation first, under the same host lock.
    head = update_mirror(
        workspace=workspace,
        repo_id=REPO_ID,
        git_url=str(origin.path),
        branch="main",
        runner=Runner(),
        timeout=60,
    )
    assert head == new_head == rev_list(path)[0]
    assert lock_files(path) == set() and is_valid(path) and packs_intact(path)


def test_the_young_pack_of_an_orphaned_index_pack_is_kept_until_old(
    synced: tuple[Path, GitRepo], processes: Procs, shim: Path, tmp_path: Path
) -> None:
    """git's helpers do not inherit its death signal: the worker and its git fetch are
    SIGKILLed, but the fetch's index-pack (stopped between renaming its ``.pack`` in and
    linking its ``.idx``) lives on.  Sanitation right after keeps its young files, so it
    completes its pack when it goes on; files of that age are removed only when old."""
    workspace, origin = synced
    path = mirror_path(workspace, REPO_ID)
    before = rev_list(path)
    new_head = grow(origin)
    marker = tmp_path / "stalled"
    worker, index_pack = stalled_worker(processes, workspace, origin.path, shim, marker)
    try:
        [pack] = incomplete_packs(path)
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(timeout=60)
        # the orphan: not killed with the worker, stopped again after the kernel's SIGCONT
        wait_for("the orphan to stop again", lambda: proc_state(index_pack) == "T")

        report = sanitize_mirror(workspace=workspace, repo_id=REPO_ID, runner=Runner())
        assert report["stale"] == [] and report["recloned"] is False
        assert pack.exists(), "an orphaned index-pack's young pack was deleted"

        release(index_pack, marker)
        wait_for("the orphan to finish its pack", lambda: pack.with_suffix(".idx").exists())
        wait_for("the orphan to exit", lambda: gone(index_pack))
    finally:
        if not gone(index_pack):
            os.kill(index_pack, signal.SIGKILL)
    assert packs_intact(path) and is_valid(path) and rev_list(path) == before
    assert sync(workspace, origin) == new_head


def test_a_live_writer_keeps_its_lock_file_and_planted_leftovers_wait_for_its_host_lock(
    synced: tuple[Path, GitRepo], processes: Procs, monkeypatch: pytest.MonkeyPatch
) -> None:
    workspace, origin = synced
    path = mirror_path(workspace, REPO_ID)
    parent = rev_list(path)[1]
    writer = spawn(processes, [sys.executable, "-c", REF_WRITER, str(workspace), parent])
    assert writer.stdout is not None
    int(writer.stdout.readline())  # its git holds the head ref's lock now
    orphan = path / "objects" / "pack" / f"pack-{'ab' * 20}.pack"
    orphan.write_bytes(b"PACK half written")
    later = time.time() + STALE_AFTER + 60  # old enough, if the mirror were free

    with pytest.raises(MirrorBusy) as busy:
        sanitize_mirror(
            workspace=workspace, repo_id=REPO_ID, runner=Runner(), wait=0.3, clock=lambda: later
        )
    assert f"pid {writer.pid}" in str(busy.value)
    assert lock_files(path) == {"refs/gitward/head.lock", "HEAD.lock"} and orphan.exists()
    # Called on its own (not through sanitize_mirror), the removal takes the host lock too.
    monkeypatch.setattr(host_lock, "HOST_LOCK_WAIT", 0.3)
    with pytest.raises(MirrorBusy):
        remove_stale_files(workspace, REPO_ID, clock=lambda: later)
    assert lock_files(path) == {"refs/gitward/head.lock", "HEAD.lock"} and orphan.exists()

    # The writer finishes as if nothing had happened: its lock is still its own.
    out, _err = writer.communicate("commit\n", timeout=60)
    assert writer.returncode == 0 and out.split() == ["commit:", "ok", "0"], out
    assert rev_list(path)[0] == parent != origin.head()
    assert lock_files(path) == set()

    report = sanitize_mirror(
        workspace=workspace, repo_id=REPO_ID, runner=Runner(), wait=0.3, clock=lambda: later
    )
    assert report["stale"] == [str(orphan.relative_to(path))] and not orphan.exists()
    assert report["recloned"] is False and is_valid(path)


def test_leftovers_of_sigkilled_git_are_removed_and_only_they(
    synced: tuple[Path, GitRepo], processes: Procs, shim: Path, tmp_path: Path
) -> None:
    """A ref transaction and a fetch, both SIGKILLed with their process groups mid-write
    (a host crash): lock files go at once, object leftovers once old, complete packs and
    the head stay, and the next fetch goes through."""
    workspace, origin = synced
    path = mirror_path(workspace, REPO_ID)
    head = origin.head()
    parent = rev_list(path)[1]
    holder = ref_transaction(processes, path, parent)
    new_head = grow(origin)
    marker = tmp_path / "stalled"
    fetch = raw_fetch(processes, path, str(origin.path), stall_env(shim, marker))
    stalled_pid(marker)
    for proc in (holder, fetch):
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    pack_dir = path / "objects" / "pack"
    complete = {p.stem for p in pack_dir.glob("pack-*.idx") if p.with_suffix(".pack").exists()}
    locks = lock_files(path)
    assert locks == {"refs/gitward/head.lock", "HEAD.lock"}
    objects = {f"objects/pack/{p.name}" for p in pack_dir.iterdir() if p.stem not in complete}
    assert incomplete_packs(path)
    assert any(name.startswith("objects/pack/tmp_idx_") for name in objects), objects

    # Just after the crash: the lock files go (their git is gone), the young objects stay.
    young = sanitize_mirror(workspace=workspace, repo_id=REPO_ID, runner=Runner())
    assert set(young["stale"]) == locks and young["recloned"] is False  # type: ignore[call-overload]
    assert lock_files(path) == set() and incomplete_packs(path)

    later = time.time() + STALE_AFTER + 1
    old = sanitize_mirror(
        workspace=workspace, repo_id=REPO_ID, runner=Runner(), clock=lambda: later
    )
    assert set(old["stale"]) == objects  # type: ignore[call-overload]
    assert old["recloned"] is False  # an incomplete pack is garbage, not corruption
    assert not incomplete_packs(path) and not list(pack_dir.glob("tmp_*"))
    assert {p.stem for p in pack_dir.glob("pack-*.idx")} == complete
    assert rev_list(path)[0] == head and packs_intact(path)
    assert sync(workspace, origin) == new_head


def test_the_half_built_clone_of_a_sigkilled_worker_is_removed_and_the_next_sync_clones(
    tmp_path: Path, git_repo: GitRepo, processes: Procs, shim: Path
) -> None:
    workspace = tmp_path / "ws"
    other = new_temporary(workspace, 12)  # another repository's: "12-…", not "1-…"
    other.mkdir()
    marker = tmp_path / "stalled"
    worker, index_pack = stalled_worker(processes, workspace, git_repo.path, shim, marker)
    try:
        [clone] = (workspace / "tmp").glob(f"{REPO_ID}-*.git")
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(timeout=60)

        assert remove_stale_temporaries(workspace, REPO_ID) == 1
        assert not clone.exists() and other.is_dir()
        # The orphaned index-pack goes on, finds its folder gone, and fails: nothing of it
        # reaches the workspace.
        # (The shim stops it again before each further try to put its .idx in: resume it
        # until it has given up.)
        wait_for("the orphan to exit", lambda: gone(index_pack) or release(index_pack, marker))
    finally:
        if not gone(index_pack):
            os.kill(index_pack, signal.SIGKILL)
    assert not clone.exists() and sorted((workspace / "tmp").iterdir()) == [other]
    assert not mirror_path(workspace, REPO_ID).exists()
    assert sync(workspace, git_repo) == git_repo.head()


def test_a_lost_lease_stops_removal_before_anything_is_deleted(
    synced: tuple[Path, GitRepo], redlock: Redlock
) -> None:
    workspace, _origin = synced
    path = mirror_path(workspace, REPO_ID)
    leftovers = [path / "config.lock", path / "refs" / "gitward" / "head.lock"]
    for leftover in leftovers:
        leftover.write_text("")
    key = "locks:git:repo:1:mirror"
    with pytest.raises(LockLost), redlock.hold([key], ttl=1.0) as lock:
        assert redlock.force_release(key, lock.nonce) >= 2
        wait_for("the heartbeat to see the lease lost", lock.lost.is_set)
        with pytest.raises(LockLost):
            remove_stale_files(workspace, REPO_ID, check=lock.check)
        assert all(leftover.exists() for leftover in leftovers)
        with pytest.raises(LockLost):
            sanitize_mirror(workspace=workspace, repo_id=REPO_ID, runner=Runner(), check=lock.check)
    assert all(leftover.exists() for leftover in leftovers) and is_valid(path)
    assert remove_stale_files(workspace, REPO_ID) == sorted(
        str(leftover.relative_to(path)) for leftover in leftovers
    )
