"""Several web processes on one port, each with a listening socket of its own.

Uvicorn's supervisor (``uvicorn.supervisors.Multiprocess``) hands one listening socket
to every web process, and whichever process's event loop wakes first accepts the next
connection. The live view's connections last the whole visit (a websocket, and the
browser's keep-alive HTTP connection beside it), so an early imbalance stays: under the
load test on PostgreSQL the four processes held 149, 148, 76 and 47 of the 420
connections, and the two busiest, each on one interpreter lock, set every page's
latency (p95 1–5 s where balanced runs gave 0.2–0.3 s).

Here each process gets its own socket bound to the same address with ``SO_REUSEPORT``:
Linux then spreads new connections over the sockets by a hash of their addresses and
ports, independent of which process happens to be awake, so 420 connections land about
105 ± 9 on each of four. The supervisor keeps every socket open, so a process that dies
and is replaced loses no connection: those arriving meanwhile wait in its socket's
backlog for the replacement (which inherits that socket). Only processes of the same
user may bind a port alongside (a Linux rule for ``SO_REUSEPORT``).

A process that dies is seen at once, even while the supervisor waits for its answer to a
health ping (``WebProcess``): uvicorn's ping waits on the pipe alone, and as the
supervisor holds the pipe's other end too, a dead process's pipe never reads as closed,
so a process killed mid-ping stayed unreaped and unreplaced, its socket's connections
waiting, for the whole ping timeout (60 s here: ``up``).
"""

from __future__ import annotations

import pickle
import socket
import sys
from multiprocessing.connection import wait

from uvicorn import Config
from uvicorn.server import STARTUP_FAILURE
from uvicorn.supervisors.multiprocess import Multiprocess, Process


def bind_sockets(host: str, port: int, count: int) -> list[socket.socket]:
    """``count`` listening sockets on ``host:port`` (0: a free port, the same for all)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host, port))
            port = sock.getsockname()[1]
            sock.set_inheritable(True)
    except OSError as exc:
        for sock in sockets:
            sock.close()
        print(f"cannot listen on {host}:{port}: {exc.strerror or exc}", file=sys.stderr)
        sys.exit(STARTUP_FAILURE)
    return sockets


class WebProcess(Process):
    """Uvicorn's web process, whose health ping also ends when the process dies."""

    def _healthcheck(self, timeout: float) -> bool | None:
        # As uvicorn's, waiting on the process's sentinel beside the pipe: a process that
        # dies while we wait ends the wait (None: not alive), instead of the timeout.
        try:
            self.parent_conn.send(b"ping")
            ready = wait([self.parent_conn, self.process.sentinel], timeout)
            if self.parent_conn in ready:
                started: bool = self.parent_conn.recv()
                return started
            return None
        except (OSError, EOFError, pickle.UnpicklingError):
            return None


class BalancedMultiprocess(Multiprocess):
    """Uvicorn's supervisor, with process ``i`` always serving socket ``i``."""

    def __init__(self, config: Config, sockets: list[socket.socket]) -> None:
        super().__init__(config, sockets)
        self.processes_num = len(sockets)

    def _spawn(self, idx: int) -> Process:
        process = WebProcess(self.config, [self.sockets[idx]])
        process.start()
        return process

    def init_processes(self) -> None:
        self.processes = [self._spawn(idx) for idx in range(self.processes_num)]

    def keep_subprocess_alive(self) -> None:
        # As uvicorn's own, but the replacement serves the dead process's socket.
        if self.should_exit.is_set():
            return
        for idx, process in enumerate(self.processes):
            if process.is_alive(timeout=self.config.timeout_worker_healthcheck):
                continue
            process.kill()  # hung: it missed the health ping
            process.join()
            if process.exitcode == STARTUP_FAILURE:
                # Broken before serving (app, settings): every restart would fail alike.
                self.should_exit.set()
                return
            if self.should_exit.is_set():
                return
            self.processes[idx] = self._spawn(idx)

    def restart_all(self) -> None:
        # SIGHUP: replace each process in turn, the new one serving before the old goes.
        for idx, old in enumerate(self.processes):
            if self.should_exit.is_set():
                return
            new = self._spawn(idx)
            if not new.wait_until_ready(self.config.timeout_worker_healthcheck, self.should_exit):
                new.kill()
                new.join()
                return
            old.terminate()
            old.join()
            self.processes[idx] = new
