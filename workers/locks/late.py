"""Replies nobody waits for: read by one thread per Redlock, then the connection goes back
to its pool (or is closed at its deadline or on an error, and a queued release retried)."""

from __future__ import annotations

import contextlib
import os
import queue
import select
import threading
import time
import weakref
from typing import TYPE_CHECKING

import redis

from workers.locks.nodes import Node, Pending

if TYPE_CHECKING:
    from workers.locks.transport import Transport


class _LateEntry:
    def __init__(
        self,
        node: Node,
        p: Pending,
        replies: int,
        until: float,
        release: tuple[tuple[str, ...], str] | None,
    ) -> None:
        self.node = node
        self.p = p
        self.left = replies
        self.until = until
        self.release = release


class LateReplies:
    """One thread per Redlock that reads replies nobody waits for, then gives each
    connection back to its pool (or closes it at its deadline, or on an error).

    Started on first use; multiplexed with poll(), so any number of stalled masters costs
    one thread, never the thread pool. A self-pipe wakes it the moment an entry is added, so
    a connection is back in its pool as soon as its reply has arrived.
    """

    def __init__(self, transport: Transport) -> None:
        self._transport = weakref.ref(transport)
        self._new: queue.SimpleQueue[_LateEntry | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self.outstanding = 0  # entries not finished yet (for tests and stats)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)

    def add(
        self,
        node: Node,
        p: Pending,
        *,
        replies: int,
        until: float,
        release: tuple[tuple[str, ...], str] | None = None,
    ) -> None:
        with self._start_lock:
            self.outstanding += 1
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="redlock-late-replies", daemon=True
                )
                self._thread.start()
        self._new.put(_LateEntry(node, p, replies, until, release))
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):  # a full pipe is awake already
            os.write(self._wake_w, b"x")

    def close(self) -> None:
        self._new.put(None)
        self._wake()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=1.0)

    def _finish(self, entry: _LateEntry, *, broken: bool) -> None:
        if broken:
            entry.p.conn.disconnect()
            transport = self._transport()
            if entry.release is not None and transport is not None and not transport.closed:
                # The release behind the SET may not have been applied: retry it.
                transport.release_later(entry.node, *entry.release)
        entry.node.pool.release(entry.p.conn)
        with self._start_lock:
            self.outstanding -= 1

    def _run(self) -> None:
        entries: dict[int, _LateEntry] = {}
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        while True:
            closing = False
            while True:
                try:
                    item = self._new.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    closing = True
                    continue
                entries[item.p.fd] = item
                poller.register(item.p.fd, select.POLLIN)
            if closing:
                for entry in entries.values():
                    self._finish(entry, broken=True)
                return
            now = time.monotonic()
            for fd, entry in list(entries.items()):
                if now >= entry.until:
                    poller.unregister(fd)
                    del entries[fd]
                    self._finish(entry, broken=True)
            timeout = None
            if entries:
                timeout = max(0.0, min(e.until for e in entries.values()) - now) * 1000
            for fd, _event in poller.poll(timeout):
                if fd == self._wake_r:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_r, 4096)
                    continue
                entry = entries[fd]
                broken = False
                try:
                    entry.p.conn.read_response()
                    entry.left -= 1
                except redis.ResponseError:
                    entry.left -= 1  # an error *reply* (NOSCRIPT, …): the connection is fine
                except Exception:
                    broken = True
                if broken or entry.left <= 0:
                    poller.unregister(fd)
                    del entries[fd]
                    self._finish(entry, broken=broken)
