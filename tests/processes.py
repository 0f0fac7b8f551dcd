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


from tests.sysproc import children, git_processes_under, proc_field, proc_state  # noqa: E402, F401
