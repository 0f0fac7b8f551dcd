"""One script round (``ScriptRound``): a lock script sent to every master at once from the
calling thread, and the replies collected with poll() as they arrive.

The command is packed once (``workers.locks.wire``) and written to each master that has an
idle connected connection; a master without one gets its connection opened by the thread
pool (a slow handshake never delays the others) and the command once it is up. Each master
is bounded by ``node_timeout`` from *its own* start, the round by ``deadline``. See
``Transport.broadcast_script`` for what happens to the replies nobody waits for.
"""

from __future__ import annotations

import functools
import queue
import select
import time
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import Future
from typing import Any

from redis.exceptions import NoScriptError, ResponseError

from workers.locks import wire
from workers.locks.errors import describe
from workers.locks.late_replies import Stragglers, Transport
from workers.locks.masters import (
    CANCELLED,
    Pending,
    Round,
    Vote,
    done_future,
    fileno,
    has_idle_connection,
    stale,
)

Judge = Callable[[object], Vote]

#: Longest a decided round keeps reading the replies still on their way (seconds).
CATCH_UP = 0.0005


class ScriptRound:
    """The state of one ``broadcast_script`` call (used once, by one thread)."""

    def __init__(
        self,
        transport: Transport,
        name: str,
        keys: tuple[str, ...],
        args: Sequence[str | int],
        judge: Judge,
        *,
        need: int,
        wait_all: bool,
        only: Collection[int] | None,
        keep_late: bool,
    ) -> None:
        self.t = transport
        self.name = name
        self.keys = keys
        self.args = tuple(args)
        self.judge = judge
        self.need = need
        self.wait_all = wait_all
        self.keep_late = keep_late
        self.targets = tuple(range(len(transport.nodes))) if only is None else tuple(sorted(only))
        self.n = len(self.targets)
        # Every master registered the same source, so the SHA1 (computed locally) is one.
        sha = transport.nodes[0].scripts[name].sha
        self.command = wire.pack("EVALSHA", sha, len(keys), *keys, *self.args)
        self.votes: dict[int, Vote] = {}
        self.futures: dict[int, Future[Vote]] = {}
        self.yes = 0
        self.pending: dict[int, Pending] = {}
        self.partial: dict[int, bytes] = {}  # master -> the part of its reply read so far
        self.late: dict[int, Pending] = {}
        self.by_fd: dict[int, int] = {}
        self.poller = select.poll()
        self.connected: queue.SimpleQueue[tuple[int, Future[Any]]] = queue.SimpleQueue()
        self.connecting: dict[int, float] = {}  # master -> start, while its connection opens
        self.opened: dict[int, Future[Any]] = {}
        self.consumed: set[int] = set()
        self._stragglers: Stragglers | None = None  # made when a connection is still opening

    @property
    def stragglers(self) -> Stragglers:
        if self._stragglers is None:
            self._stragglers = Stragglers(
                self.t, self.name, self.keys, self.args, decided=not self.keep_late
            )
        return self._stragglers

    # Votes and sends ---------------------------------------------------------------------

    def vote_now(self, i: int, vote: Vote, took: float) -> None:
        self.votes[i] = vote
        self.yes += vote.ok
        self.t.record_call(self.t.nodes[i], vote, took)

    def decided(self) -> bool:
        if len(self.votes) == self.n:
            return True
        return not self.wait_all and (
            self.yes >= self.need or (len(self.votes) - self.yes) > self.n - self.need
        )

    def send(self, i: int, conn: Any, start: float) -> None:
        node = self.t.nodes[i]
        try:
            fd = fileno(conn)
            if node.raw:
                wire.write(conn, fd, self.command)
            else:  # TLS: the packed bytes go through the SSL socket
                conn.send_packed_command([self.command], check_health=False)
        except Exception as exc:
            conn.disconnect()
            node.pool.release(conn)
            self.vote_now(i, Vote(False, describe(exc), exc), time.monotonic() - start)
            return
        self.pending[i] = Pending(
            conn,
            node.scripts[self.name],
            start,
            start + self.t.node_timeout,
            fd,
            self.keys,
            self.args,
        )
        self.by_fd[fd] = i
        self.poller.register(fd, select.POLLIN)

    def start(self) -> None:
        kept: list[tuple[int, Any, float]] = []
        for i in self.targets:
            node = self.t.nodes[i]
            start = time.monotonic()
            conn = node.take_idle()
            if conn is not None:
                kept.append((i, conn, start))
            elif has_idle_connection(node.pool):
                try:
                    conn = node.pool.get_connection()  # checks the connection itself
                except Exception as exc:
                    self.vote_now(i, Vote(False, describe(exc), exc), time.monotonic() - start)
                    continue
                self.send(i, conn, start)
            else:
                self.connect(i, start)
        if not kept:
            return
        # One poll() for every kept connection: a readable one was closed by its master (a
        # restart) and is replaced by a fresh one, opened off-thread like any other.
        bad = stale([conn for _, conn, _ in kept])
        for n, (i, conn, start) in enumerate(kept):
            if n in bad:
                conn.disconnect()
                self.t.nodes[i].pool.release(conn)
                self.connect(i, start)
            else:
                self.send(i, conn, start)

    def connect(self, i: int, start: float) -> None:
        """Open a connection to master ``i`` on the thread pool; ``run`` sends once it is up."""
        fut = self.t.pool.submit(self.t.nodes[i].pool.get_connection)
        fut.add_done_callback(functools.partial(_forward_connection, self.connected, i))
        self.connecting[i] = start
        self.opened[i] = fut

    def take_connection(self, i: int, fut: Future[Any]) -> None:
        self.consumed.add(i)
        start = self.connecting.pop(i, None)
        if fut.cancelled():  # close() cancelled the connect
            if start is not None:
                self.vote_now(i, CANCELLED, time.monotonic() - start)
            return
        exc = fut.exception()
        if start is None:  # already voted "timeout": a straggler now
            self.stragglers.opened(i, fut)
            return
        if exc is not None:
            self.vote_now(i, Vote(False, describe(exc), exc), time.monotonic() - start)
            return
        self.send(i, fut.result(), start)

    def forget(self, i: int) -> Pending:
        p = self.pending.pop(i)
        self.by_fd.pop(p.fd, None)
        self.poller.unregister(p.fd)
        return p

    def give_up(self, i: int, p: Pending, now: float) -> None:
        """Master ``i`` is past its node timeout: vote "timeout". Its connection is closed
        (a late reply can never be read as the answer to a later command), or with
        ``keep_late`` kept, its reply unread, in ``late_replies`` — unless part of the reply was
        read already: then the script has run, the framing is ours, and it is closed."""
        self.forget(i)
        if self.keep_late and i not in self.partial:
            self.late[i] = p
        else:
            self.partial.pop(i, None)
            p.conn.disconnect()
            self.t.nodes[i].pool.release(p.conn)
        self.vote_now(i, Vote(False, "timeout", None), now - p.sent)

    # Replies -----------------------------------------------------------------------------

    def read_ready(self, wait: float) -> None:
        """Wait up to ``wait`` seconds for replies and count every one that arrived."""
        for fd, _event in self.poller.poll(max(0.0, wait) * 1000):
            i = self.by_fd[fd]
            p = self.pending[i]
            vote: Vote | None = None
            try:
                if self.t.nodes[i].raw:
                    buf, reply, complete = wire.read(fd, self.partial.pop(i, b""))
                    if not complete:
                        if buf:
                            self.partial[i] = buf
                        continue
                else:  # TLS: the bytes on the socket are not the reply; redis-py reads it
                    try:
                        reply = p.conn.read_response()
                    except ResponseError as exc:
                        reply = exc
                if isinstance(reply, NoScriptError):
                    # The master restarted and lost its script cache: the script did not
                    # run. Send the source on the same connection and keep waiting (same
                    # per-node deadline).
                    p.resend_as_eval()
                    continue
                if isinstance(reply, ResponseError):
                    vote = Vote(False, describe(reply), reply)
                else:
                    vote = self.judge(reply)
            except Exception as exc:
                # A broken connection or framing: nothing more can be read from it.
                self.forget(i)
                p.conn.disconnect()
                self.t.nodes[i].pool.release(p.conn)
                self.vote_now(i, Vote(False, describe(exc), exc), time.monotonic() - p.sent)
                continue
            self.forget(i)
            self.t.nodes[i].keep(p.conn)  # its one reply is read: clean for the next round
            self.vote_now(i, vote, time.monotonic() - p.sent)

    # The loop ----------------------------------------------------------------------------

    def run(self, deadline: float) -> Round:
        self.start()
        while not self.decided():
            while self.connecting:
                try:
                    i, fut = self.connected.get_nowait()
                except queue.Empty:
                    break
                self.take_connection(i, fut)
            now = time.monotonic()
            if self.decided() or now >= deadline:
                break
            # Read what has arrived before expiring anyone: a reply that is already waiting
            # must not be called a timeout just because this thread was slow to look.
            if any(now >= p.node_deadline for p in self.pending.values()):
                self.read_ready(0.0)
                if self.decided():
                    break
                for i, p in list(self.pending.items()):
                    if now >= p.node_deadline:
                        self.give_up(i, p, now)
            for i, start in list(self.connecting.items()):
                if now >= start + self.t.node_timeout:
                    del self.connecting[i]  # its connection, if it ever opens, goes back unused
                    self.vote_now(i, Vote(False, "timeout", None), now - start)
            if self.decided():
                break
            waits = [deadline]
            waits += [p.node_deadline for p in self.pending.values()]
            waits += [start + self.t.node_timeout for start in self.connecting.values()]
            wait = max(0.0, min(waits) - now)
            if self.pending:
                if self.connecting:
                    wait = min(wait, 0.001)  # look at the opening connections too
                self.read_ready(wait)
            elif self.connecting:
                try:
                    i, fut = self.connected.get(timeout=wait)
                except queue.Empty:
                    continue
                self.take_connection(i, fut)
            else:
                break
        if self.pending:
            # The outcome is decided but some masters are still answering. Give them as long
            # again as the round took so far (at most CATCH_UP, never past their own node
            # deadline): a healthy master's reply is then read here and its connection goes
            # straight back to the pool, instead of costing a thread hop (and the GIL
            # hand-offs that come with it) on every call. A stalled master costs each call at
            # most that much extra latency; validity is counted by the caller from its t0, so
            # the wait only ever shortens the validity it computes.
            now = time.monotonic()
            started = min(p.sent for p in self.pending.values())
            until = min(now + min(now - started, CATCH_UP), deadline)
            until = min([until] + [p.node_deadline for p in self.pending.values()])
            self.read_ready(0.0)
            while self.pending and (left := until - time.monotonic()) > 0:
                self.read_ready(left)
        for i, p in self.pending.items():
            if i in self.partial:
                # Half a reply read: the script ran; nobody else can parse the rest.
                p.conn.disconnect()
                self.t.nodes[i].pool.release(p.conn)
                self.futures[i] = done_future(Vote(False, "timeout", None))
            elif self.keep_late:
                self.late[i] = p
            else:
                self.futures[i] = self.t.pool.submit(self.t.drain, self.t.nodes[i], p, self.judge)
        for i, fut in self.opened.items():
            if i not in self.consumed:
                # Nothing was sent on it yet: the script goes out once it is open (unless the
                # caller settles the round with a release first), see Stragglers.
                fut.add_done_callback(functools.partial(self.stragglers.opened, i))
        return Round(self.votes, self.futures, self.yes, self.late, self._stragglers, self.targets)


def _forward_connection(
    connected: queue.SimpleQueue[tuple[int, Future[Any]]], i: int, fut: Future[Any]
) -> None:
    connected.put((i, fut))
