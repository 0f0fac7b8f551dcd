"""Real writers of a mirror for the mirror, host-lock and leftover tests: gitward worker
processes, live and SIGKILLed git processes, and a fetch stopped between its ``.pack`` and
its ``.idx``.

The stop is made by a tiny ``LD_PRELOAD`` shim, compiled here, that makes the git process
that links a pack's ``.idx`` into ``objects/pack`` (``index-pack``) stop itself (SIGSTOP)
just before; the test lets it on with ``release``.  The fixtures are registered in conftest.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.gitrepo import GitRepo
from tests.support.sysproc import proc_state
from workers.git.mirror import HEAD_REF, sync_mirror
from workers.git.runner import Runner
from workers.locks import Redlock
from workers.runtime.redis_server import RedisNode

ROOT = Path(__file__).resolve().parents[2]
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
    /* Stopped until the test says go (the marker's path + ".go", ``release``): SIGCONT
       alone does not let it on. When the worker that started git is SIGKILLed, git's
       process group is orphaned with a stopped member, and the kernel sends the group
       SIGHUP and SIGCONT: ignoring the one and stopping again after the other keeps the
       orphan alive and stopped, as a running index-pack would live on. */
    signal(SIGHUP, SIG_IGN);
    char go[4096];
    snprintf(go, sizeof go, "%s.go", marker);
    do raise(SIGSTOP); while (access(go, F_OK) != 0);
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
from workers.git.runner import Runner
from workers.git.mirror import update_mirror
workspace, url, extra_env, wait = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
head = update_mirror(workspace=Path(workspace), repo_id=1, git_url=url, branch="main",
                     runner=Runner(extra_env=extra_env), timeout=120, wait=float(wait))
print(head, flush=True)
"""

#: A gitward writer of the head ref: holds the host lock, starts ``git update-ref --stdin``
#: through gitward's Runner (so it dies with this process), prepares the update (git now
#: holds ``refs/gitward/head.lock`` and ``HEAD.lock``), prints git's pid and waits for a
#: line on stdin; then commits and prints git's answer and exit status.
REF_WRITER = """
import subprocess, sys
from pathlib import Path
from workers.git.runner import Runner
from workers.git.host_lock import hold_mirror
from workers.git.mirror import HEAD_REF, mirror_path
workspace, sha = Path(sys.argv[1]), sys.argv[2]
with hold_mirror(workspace, 1):
    git = Runner()(["--git-dir", str(mirror_path(workspace, 1)), "update-ref", "--stdin"],
                   stdin=subprocess.PIPE)
    git.stdin.write(f"start\\nupdate {HEAD_REF} {sha}\\nprepare\\n".encode())
    git.stdin.flush()
    assert git.stdout.readline().strip() == b"start: ok"
    assert git.stdout.readline().strip() == b"prepare: ok"
    print(git.pid, flush=True)
    sys.stdin.readline()
    out, _err = git.communicate(b"commit\\n")
    print(out.decode().strip(), git.returncode, flush=True)
"""


def gone(pid: int) -> bool:
    """The process has exited (reaped, or a zombie nobody reaps: it runs no more)."""
    return proc_state(pid) in ("gone", "Z")


def lock_files(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*.lock")}


#: Holds the mirror's host lock until stdin closes (another worker in the middle of a sync).
HOLDER = """
import sys
from pathlib import Path
from workers.git.host_lock import hold_mirror
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


def release(pid: int, marker: Path) -> bool:
    """Let the git the shim stopped (its pid written to ``marker``) go on; ``False``, for
    use in a ``wait_for`` condition."""
    marker.with_name(marker.name + ".go").touch()
    os.kill(pid, signal.SIGCONT)
    return False


def stalled_worker(
    processes: Procs, workspace: Path, origin: Path, shim: Path, marker: Path
) -> tuple[subprocess.Popen[str], int]:
    """A gitward worker process syncing ``origin`` into ``workspace`` whose fetch the
    shim stops before its ``.idx`` goes in; returns the worker and the stopped git's pid."""
    args = [sys.executable, "-c", WORKER, str(workspace), str(origin)]
    worker = spawn(processes, [*args, json.dumps(stall_env(shim, marker)), "120"])
    return worker, stalled_pid(marker)


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


@pytest.fixture
def redlock(redis_nodes: list[RedisNode]) -> Iterator[Redlock]:
    """A Redlock client over the session's three masters (leases to lose for real)."""
    rl = Redlock([n.url for n in redis_nodes])
    yield rl
    rl.close()
