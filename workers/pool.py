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
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connections
from rq import Queue, Worker

import workers.jobs  # noqa: F401  (imported once in the parent, not in every forked horse)
from dashboard import leases, queues, runs, workerbeats

log = logging.getLogger(__name__)


class PauseAware:
    """Worker mixin: listen only on queues that are not paused (re-read every second).

    The dequeue timeout is one second so a paused queue stops feeding this worker within
    that second; with every queue paused the worker listens on an always-empty queue.
    """

    queues: list[Any]
    connection: Any
    _ordered_queues: list[Any]

    @property
    def dequeue_timeout(self) -> int:
        return 1

    def heartbeat(self, *args: Any, **kwargs: Any) -> Any:
        result = super().heartbeat(*args, **kwargs)  # type: ignore[misc]
        self.apply_pauses()
        return result

    def apply_pauses(self) -> None:
        try:
            paused = queues.paused_queue_names()
        except Exception:  # Redis trouble: keep the current list
            return
        active = [q for q in self.queues if q.name not in paused]
        self._ordered_queues = active or [Queue(queues.IDLE_QUEUE, connection=self.connection)]


def run_one_worker(queue_names: Sequence[str], *, burst: bool = False) -> None:
    """Run one RQ worker in this process until stopped (Django must be set up).

    Besides RQ's loop, the worker keeps a heartbeat row in the database (so a dead
    worker is noticed even if Redis was flushed) and records a crashed attempt the
    moment one of its work horses is killed (SIGKILL, OOM).
    """

    class DjangoWorker(PauseAware, Worker):
        def fork_work_horse(self, *args: Any, **kwargs: Any) -> Any:
            # A forked child must never share its parent's database socket; the parent
            # only uses the database between jobs, so close it before each fork.
            connections.close_all()
            return super().fork_work_horse(*args, **kwargs)

        def handle_work_horse_killed(
            self, job: Any, retpid: int, ret_val: int, rusage: Any
        ) -> None:
            super().handle_work_horse_killed(job, retpid, ret_val, rusage)
            if runs.is_run_job(job.func_name, job.args):
                signo = os.WTERMSIG(ret_val) if os.WIFSIGNALED(ret_val) else None
                reason = f"work horse killed by signal {signo}" if signo else (
                    f"work horse exited with status {ret_val}")  # fmt: skip
                try:
                    runs.crash_attempt(run_id=int(job.args[0]), number=int(job.args[1]),
                                       reason=reason)  # fmt: skip
                    release_locks_of(retpid)
                finally:
                    connections.close_all()

    connections.close_all()
    conn = queues.worker_connection()  # RQ raises its read timeout; not the shared one
    name = f"{socket.gethostname()}.{os.getpid()}"
    stop = threading.Event()
    interval = max(0.5, float(settings.WORKER_DEAD_AFTER) / 6)

    def heartbeat() -> None:
        """Beat every ``interval``; promote due scheduled jobs every second."""
        next_beat = 0.0
        while not stop.is_set():
            try:
                if time.monotonic() >= next_beat:
                    close_old_connections()
                    workerbeats.beat(name=name, queues_=list(queue_names))
                    next_beat = time.monotonic() + interval
                queues.promote_due_jobs(list(queue_names))
            except queues.QueueUnavailable as exc:  # promotion waits; the beat went on
                log.warning("worker heartbeat: %s", exc)
            except Exception:  # the next round retries; a long gap marks us dead
                log.exception("worker heartbeat failed")
            stop.wait(1.0)
        connections.close_all()

    workerbeats.beat(name=name, queues_=list(queue_names))
    beat_thread = threading.Thread(target=heartbeat, name="gitward-heartbeat", daemon=True)
    beat_thread.start()
    worker = DjangoWorker([queues.queue(n) for n in queue_names], connection=conn, name=name)
    worker.apply_pauses()
    try:
        if burst:
            queues.promote_due_jobs(list(queue_names))
        # No RQ scheduler process: it survives a SIGKILLed worker as an orphan. Due
        # jobs are promoted by the heartbeat thread above (and the reconciler).
        worker.work(burst=burst, with_scheduler=False, logging_level="WARNING")
    finally:
        stop.set()
        beat_thread.join(timeout=5)
        workerbeats.stop_beat(name)
        connections.close_all()


def release_locks_of(pid: int) -> int:
    """Release the locks a reaped work horse held, so its retry need not wait out the
    lease. Safe: the holder is provably dead (we collected its exit status), and the
    release is a compare-and-delete on that holder's nonce (``leases.release_locks_of``)."""
    return leases.release_locks_of(host=socket.gethostname(), pid=pid)


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
