"""Mirror writes under the host lock, for real: live git processes holding lock files, a
fetch stopped between writing its ``.pack`` and its ``.idx``, two worker processes on one
host syncing one repository with the Redis lock out of the picture, a lease lost in the
middle of a clone, and the leftovers of SIGKILLed git processes.

A fetch is stopped at the exact instant git's own writing order makes it look corrupt (the
``.pack`` renamed in, the ``.idx`` not yet) by a tiny ``LD_PRELOAD`` shim, compiled here,
that makes the git process stop itself (SIGSTOP) just before it links the ``.idx`` into
``objects/pack``; the test resumes it with SIGCONT.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.gitrepo import GitRepo
from tests.sysproc import proc_state
from workers.gitproc import Runner
from workers.locks import LockLost, Redlock
from workers.mirror import (
    HEAD_REF,
    STALE_AFTER,
    MirrorBusy,
    host_lock_path,
    is_valid,
    mirror_path,
    packs_intact,
    sanitize_mirror,
    sync_mirror,
)
from workers.redisnode import RedisNode

ROOT = Path(__file__).resolve().parent.parent
REPO_ID = 1
Procs = list[subprocess.Popen[str]]

SHIM_SOURCE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Stop (SIGSTOP) just before a pack index is linked or renamed into objects/pack. */
static void maybe_stall(const char *target) {
    const char *marker = getenv("GW_STALL_MARKER");
    size_t n = strlen(target);
    if (!marker || n < 4 || strcmp(target + n - 4, ".idx") || !strstr(target, "/pack/pack-"))
        return;
    int fd = open(marker, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
        dprintf(fd, "%d\n", (int)getpid());
        close(fd);
    }
    raise(SIGSTOP);
}

int link(const char *from, const char *to) {
    static int (*real)(const char *, const char *);
    if (!real) real = (int (*)(const char *, const char *))dlsym(RTLD_NEXT, "link");
    maybe_stall(to);
    return real(from, to);
}

int rename(const char *from, const char *to) {
    static int (*real)(const char *, const char *);
    if (!real) real = (int (*)(const char *, const char *))dlsym(RTLD_NEXT, "rename");
    maybe_stall(to);
    return real(from, to);
}
"""

#: Worker process: sanitise and sync one mirror with the core functions only (no Redis:
#: the lease check is the default no-op, as if the Redis lock had been force-released).
WORKER = """
import json, logging, sys
from pathlib import Path
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s: %(message)s")
from workers.gitproc import Runner
from workers.mirror import update_mirror
workspace, url, extra_env, wait = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
head = update_mirror(workspace=Path(workspace), repo_id=1, git_url=url, branch="main",
                     runner=Runner(extra_env=extra_env), timeout=120, wait=float(wait))
print(head, flush=True)
"""

#: Holds the mirror's host lock until stdin closes (another worker in the middle of a sync).
HOLDER = """
import sys
from pathlib import Path
from workers.mirror import hold_mirror
with hold_mirror(Path(sys.argv[1]), int(sys.argv[2])):
    print("held", flush=True)
    sys.stdin.read()
"""


@pytest.fixture(scope="session")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:  # pragma: no cover
        pytest.skip("a C compiler is needed to stop git between its .pack and its .idx")
    base = tmp_path_factory.mktemp("shim")
    (base / "stall.c").write_text(SHIM_SOURCE)
    out = base / "stall.so"
    subprocess.run(
        [cc, "-shared", "-fPIC", "-O2", "-o", str(out), str(base / "stall.c"), "-ldl"], check=True
    )
    return out


def stall_env(shim: Path, marker: Path) -> dict[str, str]:
    """Environment for git that stops index-pack before its ``.idx`` goes in; objects
    always arrive as a pack (never as loose objects)."""
    return {
        "LD_PRELOAD": str(shim),
        "GW_STALL_MARKER": str(marker),
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": "fetch.unpackLimit",
        "GIT_CONFIG_VALUE_0": "1",
    }


def wait_for(what: str, condition: Callable[[], object], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def stalled_pid(marker: Path) -> int:
    """Wait until the shim has stopped a git process; return its pid."""
    wait_for("git to stop before its .idx", lambda: marker.exists() and marker.read_text())
    pid = int(marker.read_text())
    wait_for("the stop to take effect", lambda: proc_state(pid) == "T")
    return pid


def incomplete_packs(path: Path) -> list[Path]:
    packs = (path / "objects" / "pack").glob("pack-*.pack")
    return [p for p in packs if not p.with_suffix(".idx").exists()]


def grow(origin: GitRepo, n: int = 3) -> str:
    for i in range(n):
        origin.commit(f"more {i}", {f"more/{i}.txt": f"{i}\n" * (i + 50)})
    return origin.head()


def rev_list(path: Path) -> list[str]:
    return Runner().run(["--git-dir", str(path), "rev-list", HEAD_REF]).split()


@pytest.fixture
def synced(tmp_path: Path, git_repo: GitRepo) -> Iterator[tuple[Path, GitRepo]]:
    """A workspace whose mirror of ``git_repo`` is synced and valid."""
    workspace = tmp_path / "ws"
    head = sync_mirror(
        workspace=workspace,
        repo_id=REPO_ID,
        git_url=str(git_repo.path),
        branch="main",
        runner=Runner(),
        timeout=60,
    )
    assert head == git_repo.head()
    yield workspace, git_repo


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    """Processes a test starts; killed (by pid, with their process group) at the end."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # each runs in its own process group
        proc.wait()


def spawn(processes: Procs, args: list[str], **kw: object) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **kw.pop("env", {})}  # type: ignore[dict-item]
    proc = subprocess.Popen(
        args,
        env=env,
        cwd=ROOT,
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        **kw,  # type: ignore[call-overload]
    )
    processes.append(proc)
    return proc


def raw_fetch(processes: Procs, path: Path, url: str, env: dict[str, str]) -> subprocess.Popen[str]:
    """A plain ``git fetch`` into the mirror (a writer outside gitward's host lock)."""
    return spawn(
        processes,
        [
            "git",
            "--git-dir",
            str(path),
            "fetch",
            "--quiet",
            "--no-tags",
            url,
            f"+refs/heads/main:{HEAD_REF}",
        ],
        env=env,
    )


def ref_transaction(processes: Procs, path: Path, sha: str) -> subprocess.Popen[str]:
    """A live ``git update-ref --stdin`` that has prepared (locked) an update of the head
    ref and waits for ``commit``: it holds ``refs/gitward/head.lock`` meanwhile."""
    proc = spawn(processes, ["git", "--git-dir", str(path), "update-ref", "--stdin"])
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(f"start\nupdate {HEAD_REF} {sha}\nprepare\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "start: ok"
    assert proc.stdout.readline().strip() == "prepare: ok"
    return proc


# ---------------------------------------------------------------------------- (a)


def test_a_live_git_holding_a_lock_file_keeps_it_through_sanitation(
    synced: tuple[Path, GitRepo], processes: Procs
) -> None:
    workspace, origin = synced
    path = mirror_path(workspace, REPO_ID)
    old_head = origin.head()
    parent = rev_list(path)[1]
    holder = ref_transaction(processes, path, parent)
    lock = path / "refs" / "gitward" / "head.lock"
    assert lock.exists() and proc_state(holder.pid) != "gone"
    made = lock.stat().st_ctime

    # One second after git took it: far younger than STALE_AFTER.
    report = sanitize_mirror(
        workspace=workspace, repo_id=REPO_ID, runner=Runner(), clock=lambda: made + 1.0
    )

    assert lock.exists(), "a live git's lock file was deleted"
    assert report["stale"] == [] and report["recloned"] is False
    # The writer finishes as if nothing had happened: its lock is still its own.
    out, err = holder.communicate("commit\n", timeout=60)
    assert holder.returncode == 0, err
    assert "commit: ok" in out
    assert rev_list(path)[0] == parent != old_head
    assert not lock.exists()


def test_a_process_holding_the_host_lock_makes_sanitation_wait_and_touch_nothing(
    synced: tuple[Path, GitRepo], processes: Procs
) -> None:
    workspace, _origin = synced
    path = mirror_path(workspace, REPO_ID)
    # Leftovers that would be removed at once if the mirror were free, and old enough.
    lock = path / "refs" / "gitward" / "head.lock"
    lock.write_text("")
    orphan = path / "objects" / "pack" / f"pack-{'ab' * 20}.pack"
    orphan.write_bytes(b"PACK half written")
    later = time.time() + STALE_AFTER + 60

    holder = spawn(processes, [sys.executable, "-c", HOLDER, str(workspace), str(REPO_ID)])
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"

    with pytest.raises(MirrorBusy) as busy:
        sanitize_mirror(
            workspace=workspace, repo_id=REPO_ID, runner=Runner(), wait=0.3, clock=lambda: later
        )
    assert f"pid {holder.pid}" in str(busy.value)
    assert lock.exists() and orphan.exists() and is_valid(path)

    holder.communicate("", timeout=60)  # the other worker is done
    assert holder.returncode == 0
    report = sanitize_mirror(
        workspace=workspace, repo_id=REPO_ID, runner=Runner(), wait=0.3, clock=lambda: later
    )
    assert sorted(report["stale"]) == sorted(  # type: ignore[call-overload]
        [str(lock.relative_to(path)), str(orphan.relative_to(path))]
    )
    assert report["recloned"] is False and is_valid(path)
    assert host_lock_path(workspace, REPO_ID).exists()  # beside the mirror, never removed
    assert host_lock_path(workspace, REPO_ID).parent == path.parent


# ---------------------------------------------------------------------------- (b)


def test_a_pack_without_its_idx_of_a_live_fetch_survives_and_readers_keep_reading(
    synced: tuple[Path, GitRepo], processes: Procs, shim: Path, tmp_path: Path
) -> None:
    workspace, origin = synced
    path = mirror_path(workspace, REPO_ID)
    before = rev_list(path)
    new_head = grow(origin)
    marker = tmp_path / "stalled"
    fetch = raw_fetch(processes, path, str(origin.path), stall_env(shim, marker))
    stalled_pid(marker)
    [pack] = incomplete_packs(path)

    report = sanitize_mirror(workspace=workspace, repo_id=REPO_ID, runner=Runner())

    assert pack.exists(), "the live fetch's pack was deleted"
    assert report["recloned"] is False and report["stale"] == []
    assert path.is_dir() and packs_intact(path)
    # A reader during the fetch sees the old head, complete.
    assert rev_list(path) == before

    os.kill(int(marker.read_text()), signal.SIGCONT)
    _out, err = fetch.communicate(timeout=60)
    assert fetch.returncode == 0, err
    assert rev_list(path)[0] == new_head
    assert pack.with_suffix(".idx").exists() and packs_intact(path) and is_valid(path)


# ---------------------------------------------------------------------------- (c)


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
    a = spawn(
        processes,
        [
            sys.executable,
            "-c",
            WORKER,
            str(workspace),
            url,
            json.dumps(stall_env(shim, marker)),
            "120",
        ],
    )
    stalled_pid(marker)
    [pack] = incomplete_packs(path)

    b = spawn(processes, [sys.executable, "-c", WORKER, str(workspace), url, "{}", "120"])
    assert b.stderr is not None
    line = b.stderr.readline()  # B's first word: it found the mirror busy
    assert "waiting" in line and f"pid {a.pid}" in line, line
    assert b.poll() is None and a.poll() is None
    assert pack.exists() and is_valid(path)

    os.kill(int(marker.read_text()), signal.SIGCONT)  # A's index-pack goes on
    out_a, err_a = a.communicate(timeout=120)
    out_b, err_b = b.communicate(timeout=120)
    assert a.returncode == 0, err_a
    assert b.returncode == 0, err_b
    assert out_a.strip() == out_b.strip() == new_head
    assert pack.exists() and pack.with_suffix(".idx").exists()
    assert is_valid(path) and packs_intact(path) and rev_list(path)[0] == new_head


# ---------------------------------------------------------------------------- (d)


@pytest.fixture
def redlock(redis_nodes: list[RedisNode]) -> Iterator[Redlock]:
    rl = Redlock([n.url for n in redis_nodes])
    yield rl
    rl.close()


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

    with pytest.raises(LockLost), redlock.hold([key], ttl=1.0) as lock:

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
        os.kill(pid, signal.SIGCONT)
        worker.join(timeout=120)
        assert not worker.is_alive()

    [result] = outcome
    assert isinstance(result, LockLost), result
    assert (path / "kept").read_text() == "the previous holder's mirror\n"
    assert not is_valid(path)  # not replaced by the clone
    assert list((workspace / "tmp").iterdir()) == []  # our own temporary is gone

    # A lost lease also stops sanitation before it deletes anything.
    (path / "config.lock").write_text("")
    later = time.time() + STALE_AFTER + 60
    with pytest.raises(LockLost):
        sanitize_mirror(
            workspace=workspace, repo_id=REPO_ID, runner=Runner(), check=lock.check,
            clock=lambda: later,
        )  # fmt: skip
    assert (path / "config.lock").exists() and (path / "kept").exists()


# ---------------------------------------------------------------------------- (e)


def test_leftovers_of_sigkilled_git_are_removed_once_stale_and_the_mirror_is_kept(
    synced: tuple[Path, GitRepo], processes: Procs, shim: Path, tmp_path: Path
) -> None:
    workspace, origin = synced
    path = mirror_path(workspace, REPO_ID)
    head = origin.head()
    parent = rev_list(path)[1]
    # A ref transaction and a fetch, both SIGKILLed mid-write (a worker host crash).
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
    # The transaction locked the head ref and HEAD, the symbolic ref naming it.
    locks = {str(p.relative_to(path)) for p in path.rglob("*.lock")}
    assert locks == {"refs/gitward/head.lock", "HEAD.lock"}
    leftovers = locks | {
        f"objects/pack/{p.name}" for p in pack_dir.iterdir() if p.stem not in complete
    }
    assert incomplete_packs(path) and (path / "refs/gitward/head.lock").exists()
    assert any(name.startswith("objects/pack/tmp_idx_") for name in leftovers), leftovers

    # Just after the crash they are young: kept (their writer might be a live git).
    young = sanitize_mirror(workspace=workspace, repo_id=REPO_ID, runner=Runner())
    assert young["stale"] == [] and young["recloned"] is False
    assert (path / "refs/gitward/head.lock").exists()

    # Later (the clock moved past STALE_AFTER): removed, and only they.
    later = time.time() + STALE_AFTER + 1
    report = sanitize_mirror(
        workspace=workspace, repo_id=REPO_ID, runner=Runner(), clock=lambda: later
    )
    assert set(report["stale"]) == leftovers  # type: ignore[call-overload]
    assert report["recloned"] is False  # an incomplete pack is garbage, not corruption
    assert not incomplete_packs(path) and not list(path.rglob("*.lock"))
    assert not list(path.glob("objects/pack/tmp_*"))
    assert rev_list(path)[0] == head and packs_intact(path)
    # The next fetch goes through (it would fail on the dead writer's head.lock).
    assert (
        sync_mirror(
            workspace=workspace,
            repo_id=REPO_ID,
            git_url=str(origin.path),
            branch="main",
            runner=Runner(),
            timeout=60,
        )
        == new_head
    )


# ---------------------------------------------------------------------------- jobs


@pytest.mark.django_db(transaction=True)
def test_a_sync_job_that_finds_the_mirror_busy_on_its_host_is_deferred_not_failed(
    git_repo: GitRepo, processes: Procs, settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the real job layer: another process on this host holds the mirror's host
    lock (a second Redis holder), so the sync job waits, gives up with MirrorBusy, and
    its attempt is deferred (budget kept), the mirror untouched."""
    from rq import SimpleWorker

    import workers.mirror
    from dashboard import queues
    from dashboard.models import JobAttempt, JobRun
    from dashboard.repositories import submit_repository

    monkeypatch.setattr(workers.mirror, "HOST_LOCK_WAIT", 0.3)  # a short wait, for the test
    repo, _ = submit_repository(url=str(git_repo.path))
    workspace = Path(settings.WORKSPACE)
    holder = spawn(processes, [sys.executable, "-c", HOLDER, str(workspace), str(repo.pk)])
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"

    SimpleWorker([queues.queue(queues.SYNC_QUEUE)], connection=queues.connection()).work(
        burst=True, logging_level="WARNING"
    )

    run = JobRun.objects.get(kind="sync", repository=repo)
    [attempt] = JobAttempt.objects.filter(run=run)
    assert attempt.outcome == JobAttempt.Outcome.DEFERRED, attempt.error
    assert "mirror host lock" in attempt.error and f"pid {holder.pid}" in attempt.error
    assert run.state == JobRun.State.QUEUED
    assert not mirror_path(workspace, repo.pk).exists()
