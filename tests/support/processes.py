"""Helpers for tests that run real worker processes against the test database."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from django.db import connection

from workers.runtime.process_tree import kill_tree

ROOT = Path(__file__).resolve().parents[2]


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
        # mirror affinity as this test process has it (the harness turns it off:
        # tests/conftest.py)
        GITWARD_AFFINITY_WAIT=str(settings.AFFINITY_WAIT),  # type: ignore[attr-defined]
        # the reserved interactive slot as this test process has it (off by default)
        GITWARD_INTERACTIVE_WORKERS=str(settings.INTERACTIVE_WORKERS),  # type: ignore[attr-defined]
        **extra,
    )
    return env


def up_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """Environment for a ``manage.py up`` subprocess of its own: a var directory and
    SQLite database under ``tmp_path``, none of this shell's gitward or Redis settings."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("REDIS_URL", "GITWARD_", "DATABASE_URL"))
    }
    env.update(
        GITWARD_VAR_DIR=str(tmp_path / "var"),
        DATABASE_URL=f"sqlite:///{tmp_path / 'var' / 'db.sqlite3'}",
        GITWARD_LOCAL_ROOTS=str(tmp_path),
        GITWARD_ADMIN_PASSWORD="admin-pass-123",
        PYTHONUNBUFFERED="1",
        **extra,
    )
    return env


def wait_answering(url: str, proc: subprocess.Popen[str], timeout: float = 90) -> None:
    try:
        wait_http(url, proc, timeout)
    except RuntimeError as exc:
        raise AssertionError(
            f"{exc}: {proc.stdout.read() if proc.stdout and proc.poll() is not None else ''}"
        ) from None


def start_up(env: dict[str, str], port: int, workers: int) -> subprocess.Popen[str]:
    """``manage.py up`` on ``port`` with ``workers`` workers, returned once its login page
    answers (ended, with its whole group, if it never does)."""
    proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "manage.py"),
            "up",
            "--port",
            str(port),
            "--workers",
            str(workers),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its group is its own: ended as one if the test fails
    )
    try:
        wait_answering(f"http://127.0.0.1:{port}/login/", proc)
    except BaseException:  # never answered, or pytest-timeout: nothing of it stays
        end_tree(proc)
        raise
    return proc


def run_burst_worker(env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """One forking RQ worker that drains the queues and exits."""
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "worker", "--burst"],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def end_tree(proc: subprocess.Popen) -> None:  # type: ignore[type-arg]
    """SIGKILL ``proc``, every process below it and its process group, then reap it.

    Only while ``proc`` is not reaped yet (``returncode`` is None): until then its pid,
    a zombie's included, and so its process group id, cannot belong to anyone else. Once
    reaped, what it left is for the leftover check in tests/conftest.py to find."""
    if proc.returncode is not None:
        return
    kill_tree(proc.pid)  # stopped first, so it cannot fork between the scan and the kill
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # members no longer below it (re-parented)
    proc.wait()


@contextlib.contextmanager
def ended(proc: subprocess.Popen) -> Iterator[subprocess.Popen]:  # type: ignore[type-arg]
    """``proc`` for the block; however the block ends (an assertion, an exception,
    pytest-timeout's), ``end_tree`` ends whatever of it still runs. Start ``proc`` with
    ``start_new_session=True`` so its group is its own."""
    try:
        yield proc
    finally:
        end_tree(proc)


from tests.support.sysproc import (  # noqa: E402, F401
    children,
    git_processes_under,
    proc_field,
    proc_state,
    wait_http,
)
