"""What a round leaves behind: replies nobody waits for (read by one thread per Redlock,
then the connection goes back to its pool, or is closed at its deadline or on an error and
a queued release retried), and masters whose connection was still opening (``Stragglers``)."""

from __future__ import annotations

import contextlib
import os
import queue
import select
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

import redis

from workers.locks.masters import Node, Pending, Round, Vote, fileno
from workers.locks.scripts import SCRIPTS


class Transport(Protocol):
    """What the late-reply reader and a script round need of the transport
    (``workers.locks.transport.Transport``), named here so neither imports the transport
    that imports them."""

    closed: bool
    call_budget: float
    node_timeout: float
    nodes: list[Node]
    late: LateReplies
    pool: ThreadPoolExecutor

    def record_call(self, node: Node, vote: Vote, took: float) -> None: ...

    def drain(self, node: Node, p: Pending, judge: Callable[[object], Vote]) -> Vote: ...

    def release_later(self, node: Node, keys: tuple[str, ...], prefix: str) -> None: ...

    def settle_late(
        self, rnd: Round, *, release: tuple[tuple[str, ...], str] | None, until: float
    ) -> None: ...


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
        # Race: ``add`` assigns and starts the thread under ``_start_lock``; read it under
        # the same lock so a thread seen here has finished ``start()``. A thread that never
        # ran (its start failed, or it belongs to the process we were forked from) is not
        # alive and is not joined: joining it would raise.
        with self._start_lock:
            thread = self._thread
        if thread is not None and thread.is_alive():
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


class Stragglers:
    """Masters whose connection was still opening when a round's outcome was decided.

    The script is still sent once the connection is up, so a lock (or an extension) ends up
    on every master that can take it; the reply is read by the late-reply reader. An
    ``acquire`` round is *undecided* until the caller settles it: a connection that opens
    before that is sent the SET and held; settling with a release then writes the release
    behind it, and a connection that opens after a release-settle sends nothing at all.
    """

    def __init__(
        self,
        transport: Transport,
        name: str,
        keys: tuple[str, ...],
        args: Sequence[str | int],
        *,
        decided: bool,
    ) -> None:
        self._transport = transport
        self._name = name
        self._script = SCRIPTS[name]
        self._keys = keys
        self._args = list(args)
        self._mutex = threading.Lock()
        self._decided = decided
        self._release: tuple[tuple[str, ...], str] | None = None
        self._until = time.monotonic() + transport.call_budget
        self._held: list[tuple[int, Pending]] = []

    def opened(self, i: int, fut: Future[Any]) -> None:
        if fut.cancelled() or fut.exception() is not None:
            return
        node = self._transport.nodes[i]
        conn = fut.result()
        with self._mutex:
            if self._decided and self._release is not None:
                node.pool.release(conn)  # the attempt failed before we sent anything
                return
            try:
                # EVAL, not EVALSHA: a fresh connection may lead to a restarted master.
                conn.send_command("EVAL", self._script, len(self._keys), *self._keys, *self._args)
                fd = fileno(conn)
            except Exception:
                conn.disconnect()
                node.pool.release(conn)
                return
            now = time.monotonic()
            # Sent as EVAL already, so it can never be answered NOSCRIPT.
            p = Pending(conn, node.scripts[self._name], now, now, fd, self._keys, tuple(self._args))
            if not self._decided:
                self._held.append((i, p))
                return
        self._transport.late.add(node, p, replies=1, until=self._until)

    def settle(self, *, release: tuple[tuple[str, ...], str] | None, until: float) -> None:
        with self._mutex:
            self._decided = True
            self._release = release
            self._until = until
            held, self._held = self._held, []
        for i, p in held:
            self._transport.settle_late(Round({}, {}, 0, {i: p}), release=release, until=until)
