"""A loopback TCP proxy that delays what clients send to one server (a slow network path).

``delay`` applies to every chunk a client sends, from the moment the proxy receives it;
``stall(seconds)`` holds back what the *currently open* connections send for that long (a
stuck flow: a retransmission, a full buffer), while new connections go through. Order within
one connection is always kept, as TCP keeps it. ``forwarded`` counts the chunks handed to
the server, ``queued`` the ones still held back, so tests can wait on them.
"""

from __future__ import annotations

import collections
import contextlib
import socket
import threading
import time


class _Flow:
    def __init__(self, proxy: TcpProxy, client: socket.socket, server: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.server = server
        self.hold_until = 0.0
        self.last_due = 0.0
        self.chunks: collections.deque[tuple[float, bytes]] = collections.deque()
        self.cond = threading.Condition()
        self.eof = False

    def start(self) -> None:
        for target in (self._read_client, self._write_server, self._server_to_client):
            threading.Thread(target=target, daemon=True).start()

    def _read_client(self) -> None:
        while True:
            try:
                data = self.client.recv(65536)
            except OSError:
                data = b""
            with self.cond:
                if not data:
                    self.eof = True
                    self.cond.notify_all()
                    return
                now = time.monotonic()
                due = max(now + self.proxy.delay, self.hold_until, self.last_due)
                self.last_due = due
                self.chunks.append((due, data))
                self.proxy._count(queued=1)
                self.cond.notify_all()

    def _write_server(self) -> None:
        while True:
            with self.cond:
                while not self.chunks and not self.eof:
                    self.cond.wait()
                if not self.chunks:
                    with contextlib.suppress(OSError):
                        self.server.shutdown(socket.SHUT_WR)
                    return
                due, data = self.chunks[0]
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(min(wait, 0.01))
                continue
            with self.cond:
                self.chunks.popleft()
            try:
                self.server.sendall(data)
            except OSError:
                return
            finally:
                self.proxy._count(queued=-1, forwarded=1)

    def _server_to_client(self) -> None:
        while True:
            try:
                data = self.server.recv(65536)
            except OSError:
                data = b""
            if not data:
                with contextlib.suppress(OSError):
                    self.client.shutdown(socket.SHUT_WR)
                return
            try:
                self.client.sendall(data)
            except OSError:
                return


class TcpProxy:
    """Listens on a free loopback port and forwards every connection to ``upstream``."""

    def __init__(self, upstream_port: int, *, host: str = "127.0.0.1") -> None:
        self.upstream = (host, upstream_port)
        self.delay = 0.0
        self.forwarded = 0
        self.queued = 0
        self._flows: list[_Flow] = []
        self._lock = threading.Lock()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((host, 0))
        self._listener.listen(64)
        self.port = int(self._listener.getsockname()[1])
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://{self.upstream[0]}:{self.port}/0"

    def stall(self, seconds: float) -> None:
        """Hold back, for ``seconds`` from now, what the open connections send next."""
        until = time.monotonic() + seconds
        with self._lock:
            flows = list(self._flows)
        for flow in flows:
            with flow.cond:
                flow.hold_until = until

    def _count(self, *, queued: int = 0, forwarded: int = 0) -> None:
        with self._lock:
            self.queued += queued
            self.forwarded += forwarded

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            flow = _Flow(self, client, server)
            with self._lock:
                self._flows.append(flow)
            flow.start()

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        with self._lock:
            flows = list(self._flows)
        for flow in flows:
            for s in (flow.client, flow.server):
                with contextlib.suppress(OSError):
                    s.close()
