"""The worker pool: N worker processes, each one RQ worker, supervised.

Shutdown: SIGTERM/SIGINT to the pool sends SIGTERM to every child; RQ's warm shutdown
lets each finish its current job (the job's lock is heartbeat-extended meanwhile). A
child still busy after ``grace`` seconds is killed; its job's lock then expires by TTL
and the job is retried (RQ's abandoned-job handling, and the reconciler at start-up).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def run_one_worker(queue_names: Sequence[str], *, burst: bool = False) -> None:
    """Run one RQ worker in this process until stopped (Django must be set up)."""
    import socket

    from django.db import connections
    from rq import Worker

    from dashboard import queues

    class DjangoWorker(Worker):
        """Closes database connections before forking a work horse: a forked child must
        never share its parent's socket to the database (the parent opens none between
        jobs, so this is a safety net, not a reconnect per job)."""

        def fork_work_horse(self, *args: Any, **kwargs: Any) -> Any:
            connections.close_all()
            return super().fork_work_horse(*args, **kwargs)

    import workers.jobs  # noqa: F401  (imported once here, not in every forked horse)

    connections.close_all()
    conn = queues.connection()
    name = f"{socket.gethostname()}.{os.getpid()}"
    worker = DjangoWorker([queues.queue(n) for n in queue_names], connection=conn, name=name)
    worker.work(burst=burst, with_scheduler=True, logging_level="WARNING")


class Pool:
    """Supervises ``size`` child processes running ``manage.py worker --workers 1``."""

    def __init__(
        self, size: int, *, manage_py: Path, env: dict[str, str] | None = None, grace: float = 60.0
    ) -> None:
        self.size = size
        self.manage_py = manage_py
        self.env = env
        self.grace = grace
        self.children: list[subprocess.Popen[bytes]] = []
        self.stopping = False

    def _spawn(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, str(self.manage_py), "worker", "--workers", "1"],
            env=self.env,
            stdin=subprocess.DEVNULL,
        )

    def start(self) -> None:
        self.children = [self._spawn() for _ in range(self.size)]

    def check(self) -> None:
        """Restart children that died (unless stopping)."""
        if self.stopping:
            return
        for i, child in enumerate(self.children):
            if child.poll() is not None:
                log.warning("worker pid %s exited with %s; restarting", child.pid, child.returncode)
                self.children[i] = self._spawn()

    def stop(self) -> None:
        self.stopping = True
        for child in self.children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        for child in self.children:
            remaining = max(0.1, deadline - time.monotonic())
            try:
                child.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait(timeout=10)
