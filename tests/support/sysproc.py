"""Process and HTTP helpers without Django: shared by the tests and bench/ scripts."""

from __future__ import annotations

import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
#: Debian's Chromium, headless, with nothing that reaches for the network.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    "--disable-quic",
    # Timers of a tab in the background are not throttled (latency measurements).
    "--disable-background-timer-throttling",
    "--disable-renderer-backgrounding",
]


def wait_http(url: str, proc: subprocess.Popen | None = None, timeout: float = 90) -> None:  # type: ignore[type-arg]
    """Wait until ``url`` answers 200; fail early if ``proc`` (the server) exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited early with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as res:
                if res.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} never answered")


def git_processes_under(path: Path) -> list[int]:
    """Pids of live (not zombie) git processes working on ``path``: named in their
    command line, their ``GIT_DIR`` or their working directory."""
    needle = str(path).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().split(b"\0")
            if not cmd or not cmd[0].endswith(b"git"):
                continue
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            environ = (entry / "environ").read_bytes().split(b"\0")
            cwd = os.readlink(entry / "cwd").encode()
        except OSError:
            continue
        git_dirs = [e[len(b"GIT_DIR=") :] for e in environ if e.startswith(b"GIT_DIR=")]
        if any(needle in c for c in cmd) or any(needle in g for g in git_dirs) or needle in cwd:
            found.append(int(entry.name))
    return found


def children(pid: int) -> list[int]:
    """Pids of the direct children of ``pid`` (from /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and proc_field(int(entry.name), 1) == str(pid):
            out.append(int(entry.name))
    return out


def proc_state(pid: int) -> str:
    """One-letter process state (R, S, T for stopped, Z…), or "gone"."""
    return proc_field(pid, 0) or "gone"


def proc_field(pid: int, index: int) -> str | None:
    """Field ``index`` of /proc/<pid>/stat after the command name (0 = state, 1 = ppid)."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[index]
    except (OSError, IndexError):
        return None


#: Set by tests/conftest.py in the pytest process's environment (to its pid): every
#: process a test starts inherits it, and so do theirs, unless given an environment made
#: without it. Not ``GITWARD_``-prefixed: ``worker_env`` drops those.
OWNER_VARIABLE = "PYTEST_GITWARD_OWNER"


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def processes_of(owner: str, root: int) -> dict[int, str]:
    """``{pid: command line}`` of the live (not zombie) processes started by the test
    process ``root``: below it in the process tree, or carrying ``OWNER_VARIABLE=owner``
    in their environment, which finds those re-parented to init (their parent gone) or
    put in sessions of their own too. Other users' processes are skipped unread.

    Called twice per test (tests/conftest.py's leftover check), so it reads little: one
    ``stat`` per process, and the environment only of processes started no earlier than
    ``root`` (a process that inherited the marker was started after the process that
    set it: ``root``, whose pid the marker holds; an older one cannot carry it). That
    kept the scan under 2 ms of CPU instead of 20 ms (docs/testing.md#how-long-it-takes)."""
    marker = f"{OWNER_VARIABLE}={owner}".encode()
    try:
        since = int(_read(f"/proc/{root}/stat").rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        since = 0  # root gone (or not a pid): read every environment, as before
    children: dict[int, list[int]] = {}
    marked: set[int] = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        try:
            fields = _read(f"/proc/{name}/stat").rsplit(b")", 1)[1].split()
            if fields[0] == b"Z":
                continue
            children.setdefault(int(fields[1]), []).append(pid)
            # Field 22 of stat (index 19 after the command name): start time, in clock
            # ticks since boot. Equal ticks are read too (started in root's tick).
            if int(fields[19]) >= since and marker in _read(f"/proc/{name}/environ").split(b"\0"):
                marked.add(pid)
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile, or not ours to read
    below: set[int] = set()
    todo = [root]
    while todo:
        kids = [p for p in children.get(todo.pop(), ()) if p not in below]
        below.update(kids)
        todo += kids
    found = {}
    for pid in (below | marked) - {root}:
        try:
            cmd = _read(f"/proc/{pid}/cmdline")
        except OSError:
            continue
        found[pid] = cmd.replace(b"\0", b" ").decode(errors="replace").strip()
    return found
