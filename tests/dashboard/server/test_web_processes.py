"""``manage.py up --web-workers N``: each web process listens on a socket of its own
(``SO_REUSEPORT``), so the kernel spreads long-lived connections over them evenly, and a
process that dies is replaced on its socket without a connection refused."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from dashboard.server.web_processes import WebProcess, bind_sockets
from tests.support.checked_threads import CheckedThread
from tests.support.mirror_writers import wait_for
from tests.support.processes import ended, up_env
from tests.support.sysproc import wait_http
from workers.runtime.redis_server import free_port

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.slow


def _web_processes(up: psutil.Process) -> list[psutil.Process]:
    found = []
    for child in up.children():
        try:  # a short-lived child (a git, a migration) may be gone by now
            if any("spawn_main" in part for part in child.cmdline()):
                found.append(child)
        except psutil.Error:
            continue
    return found


def _listens(proc: psutil.Process, port: int) -> bool:
    return any(
        c.status == psutil.CONN_LISTEN and c.laddr.port == port
        for c in proc.net_connections(kind="tcp")
    )


def _listening_socket(proc: psutil.Process, port: int) -> str:
    """The inode (``socket:[N]``) of the socket ``proc`` listens on at ``port``."""
    (conn,) = [
        c
        for c in proc.net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == port
    ]
    return os.readlink(f"/proc/{proc.pid}/fd/{conn.fd}")


def _served_by(procs: list[psutil.Process], port: int) -> dict[int, int]:
    """Established connections to ``port`` held by each process."""
    return {
        p.pid: sum(
            1
            for c in p.net_connections(kind="tcp")
            if c.status == psutil.CONN_ESTABLISHED and c.laddr.port == port
        )
        for p in procs
    }


def _get(sock: socket.socket, path: str = "/healthz") -> bytes:
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        assert chunk, "connection closed before a response"
        data += chunk
    return data.split(b"\r\n", 1)[0]


def test_the_sockets_share_one_port_and_refuse_a_port_already_taken() -> None:
    sockets = bind_sockets("127.0.0.1", 0, 3)
    try:
        ports = {s.getsockname()[1] for s in sockets}
        assert len(ports) == 1 and 0 not in ports
        assert len({s.fileno() for s in sockets}) == 3
        # A plain listener (no SO_REUSEPORT) holding the port: we exit, we do not share.
        with socket.socket() as other:
            other.bind(("127.0.0.1", 0))
            other.listen()
            taken = other.getsockname()[1]
            with pytest.raises(SystemExit) as exc:
                bind_sockets("127.0.0.1", taken, 2)
            assert exc.value.code == 3
    finally:
        for s in sockets:
            s.close()


def test_each_web_process_listens_on_its_own_socket_and_gets_its_share(tmp_path: Path) -> None:
    port = free_port()
    cmd = [sys.executable, str(ROOT / "manage.py"), "up", "--port", str(port),
           "--workers", "0", "--web-workers", "2"]  # fmt: skip
    proc = subprocess.Popen(
        cmd,
        env=up_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    with ended(proc):
        wait_http(f"http://127.0.0.1:{port}/login/", proc, 120)
        up = psutil.Process(proc.pid)
        wait_for("two web processes", lambda: len(_web_processes(up)) == 2)
        web = _web_processes(up)
        wait_for("both web processes listening", lambda: all(_listens(p, port) for p in web))
        inodes = {p.pid: _listening_socket(p, port) for p in web}
        # One socket each (uvicorn's own supervisor hands both the same socket).
        assert len(set(inodes.values())) == 2, inodes

        # 64 connections kept open, as the live view's are: the kernel hashes them over
        # the two sockets (a 16/48 split or worse has odds of about 1 in 10,000).
        clients = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(64)]
        try:
            for client in clients:
                assert _get(client).endswith(b"200 OK")
            held = _served_by(web, port)
            assert sum(held.values()) == 64, held
            assert min(held.values()) >= 16, held
        finally:
            for client in clients:
                client.close()

        # A web process killed outright: its replacement serves the same socket, and a
        # connection made meanwhile waits in that socket's backlog instead of failing.
        victim = web[0]
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=60)  # reaped by the supervisor (a zombie until then)
        waiting = [socket.create_connection(("127.0.0.1", port), timeout=60) for _ in range(16)]
        try:
            for client in waiting:
                assert _get(client).endswith(b"200 OK")
        finally:
            for client in waiting:
                client.close()
        wait_for(
            "a replacement web process",
            lambda: len([p for p in _web_processes(up) if p.pid != victim.pid]) == 2,
        )
        replacement = next(p for p in _web_processes(up) if p.pid not in inodes)
        wait_for("the replacement listening", lambda: _listens(replacement, port))
        # The same socket (the supervisor kept it open), not a new one.
        assert _listening_socket(replacement, port) == inodes[victim.pid]
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, out


def test_a_web_process_that_dies_during_its_health_ping_is_seen_dead_at_once() -> None:
    """The supervisor pings each web process and waits up to 60 s for the answer
    (``up``). A process killed during that wait used to keep it waiting the whole 60 s
    (the supervisor holds the pipe's other end, so the pipe never reads as closed): the
    dead process stayed unreaped and its socket unserved. Here the process never answers
    and the ping's timeout is an hour: the ping ends when the process is killed."""
    import multiprocessing
    import time

    context = multiprocessing.get_context("spawn")
    web = WebProcess.__new__(WebProcess)  # uvicorn's pipe, a process that never answers
    web.parent_conn, web.child_conn = context.Pipe()
    web.process = context.Process(target=time.sleep, args=(3600,), daemon=True)
    web.process.start()
    answers: list[bool] = []
    ping = CheckedThread(target=lambda: answers.append(web.ping(timeout=3600)))
    ping.start()
    try:
        ping.join(timeout=1)
        assert ping.is_alive(), "the ping returned before the process died"
    finally:
        web.process.kill()
    ping.join(timeout=60)  # with the pipe alone it would wait the hour
    assert not ping.is_alive(), "the ping still waits for a dead process"
    assert answers == [False]
    web.process.join(timeout=10)
    assert web.process.exitcode == -signal.SIGKILL
