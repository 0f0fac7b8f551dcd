"""Helpers for tests that run real worker processes against the test database."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from django.db import connection

ROOT = Path(__file__).resolve().parent.parent


def worker_env(settings: object, tmp_path: Path, **extra: str) -> dict[str, str]:
    """Environment for a ``manage.py worker`` subprocess sharing this test's database,
    Redis masters, workspace and local roots."""
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        db_url = f"sqlite:///{db['NAME']}"
    else:
        db_url = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITWARD_", "REDIS_URL"))}
    env.update(
        DATABASE_URL=db_url,
        REDIS_URLS=",".join(settings.REDIS_URLS),  # type: ignore[attr-defined]
        GITWARD_WORKSPACE=str(settings.WORKSPACE),  # type: ignore[attr-defined]
        GITWARD_LOCAL_ROOTS=str(tmp_path),
        GITWARD_VAR_DIR=str(tmp_path / "worker-var"),
        GITWARD_RETRY_BACKOFF="0",
        **extra,
    )
    return env


def run_burst_worker(env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """One forking RQ worker that drains the queues and exits."""
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "worker", "--burst"],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


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
