"""Fan-out to N masters: every call goes to all of them at once, each bounded by a timeout.

The lock scripts (acquire, extend, release, retag) are written on pooled connections from
the calling thread and their replies collected with poll() (``workers.locks.script_rounds``, the
bytes on the wire in ``workers.locks.wire``); the thread pool only opens
connections (a slow handshake never delays the other masters) and runs the rarer calls
(inspect, SCAN). Replies nobody waits for any more are read by one ``LateReplies`` thread
(``workers.locks.late_replies``), which also carries the releases queued behind a failed attempt's
pending SET.
"""

from __future__ import annotations

import contextlib
import functools
import os
import queue
import select
import threading
import time
import weakref
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

import redis
from redis.exceptions import NoScriptError

from workers.locks.errors import LockError, describe
from workers.locks.late_replies import LateReplies
from workers.locks.masters import CANCELLED, Node, Pending, Round, Vote, judge_any, releaser
from workers.locks.script_rounds import ScriptRound
from workers.locks.scripts import RELEASE

T = TypeVar("T")

# The fan-out -------------------------------------------------------------------------------


class Transport:
    """The masters, one long-lived thread pool and the late-reply reader."""

    def __init__(
        self,
        masters: Sequence[str | redis.Redis],
        *,
        node_timeout: float,
        max_workers: int | None = None,
    ) -> None:
        self.nodes = [Node(m, node_timeout) for m in masters]
        self.node_timeout = node_timeout
        # Budget for calls that have no lease to bound them (release, inspect): every call
        # is already bounded by its socket timeouts; this only guards against pool queueing.
        self.call_budget = max(1.0, 20 * node_timeout)
        self.max_workers = max_workers or max(8, 8 * len(self.nodes))
        self.pool = self._new_pool()
        self.stats_lock = threading.Lock()
        self.late = LateReplies(self)
        self.closed = False
        # Fork: RQ forks a work horse per job, and a process-wide Redlock built before the
        # fork is inherited without its pool threads (submitted work would never run) and
        # possibly with stats_lock held by a thread that does not exist in the child. So the
        # child gets a fresh pool, lock and late-reply reader. redis-py resets its connection
        # pools by itself (ConnectionPool._checkpid) before any inherited socket is used.
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=functools.partial(_after_fork_in_child, ref))

    def _new_pool(self) -> ThreadPoolExecutor:
        return ThreadPoolExecutor(max_workers=self.max_workers, thread_name_prefix="redlock")

    def after_fork(self) -> None:
        self.pool = self._new_pool()
        self.stats_lock = threading.Lock()
        self.late = LateReplies(self)
        for node in self.nodes:
            node.forget_idle()  # the parent's sockets: never written from the child

    def close(self) -> None:
        self.closed = True
        self.late.close()
        self.pool.shutdown(wait=True, cancel_futures=True)
        for node in self.nodes:
            node.pool.disconnect()  # the kept connections too: they count as in use there
            node.forget_idle()

    # Calls through the thread pool -------------------------------------------------------

    def call(self, node: Node, fn: Callable[[Node], T], judge: Callable[[T], Vote]) -> Vote:
        start = time.monotonic()
        try:
            vote = judge(fn(node))
        except Exception as exc:
            vote = Vote(False, describe(exc), exc)
        self.record_call(node, vote, time.monotonic() - start)
        return vote

    def record_call(self, node: Node, vote: Vote, took: float) -> None:
        with self.stats_lock:
            s = node.stats
            s.calls += 1
            s.errors += isinstance(vote.result, Exception) or vote.reason == "timeout"
            s.timeouts += vote.reason == "timeout"
            s.latency_total += took
            s.latency_max = max(s.latency_max, took)

    def broadcast(
        self,
        fn: Callable[[Node], T],
        judge: Callable[[T], Vote],
        *,
        deadline: float,
        need: int,
        wait_all: bool = False,
    ) -> Round:
        """Run ``fn`` on every master concurrently (thread pool); return once ``need`` said
        yes, once that became impossible, or at ``deadline`` (masters still silent then get no
        vote). With ``wait_all``, wait for every master (until ``deadline``) regardless."""
        if self.closed:
            raise LockError("Redlock is closed")
        answers: queue.SimpleQueue[tuple[int, Vote]] = queue.SimpleQueue()
        futures: dict[int, Future[Vote]] = {}
        for i, node in enumerate(self.nodes):
            fut = self.pool.submit(self.call, node, fn, judge)
            # The callback may run in a pool thread after we returned; it only feeds a queue
            # nobody reads any more, which is harmless.
            fut.add_done_callback(functools.partial(_forward, answers, i))
            futures[i] = fut
        votes: dict[int, Vote] = {}
        yes = 0
        n = len(self.nodes)
        while len(votes) < n and (wait_all or (yes < need and (len(votes) - yes) <= n - need)):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                i, vote = answers.get(timeout=remaining)
            except queue.Empty:
                break
            votes[i] = vote
            yes += vote.ok
        return Round(votes, futures, yes)

    # Scripts from the calling thread -----------------------------------------------------

    def broadcast_script(
        self,
        name: str,
        keys: tuple[str, ...],
        args: Sequence[str | int],
        judge: Callable[[object], Vote],
        *,
        deadline: float,
        need: int,
        wait_all: bool = False,
        only: Collection[int] | None = None,
        keep_late: bool = False,
    ) -> Round:
        """Run one Lua script on every master (or ``only`` those) at once.

        1. A master with an idle connected connection gets EVALSHA on it from the calling
           thread (a small write, no waiting). Any other master gets a connection opened by
           the thread pool, and EVALSHA once it is up, so a slow *connect* never delays the
           others. Each master is bounded by ``node_timeout`` from its start, all by
           ``deadline``.
        2. poll() all sent sockets until the outcome is decided (``need`` yes, or that became
           impossible; with ``wait_all`` every master answered).
        3. A NOSCRIPT reply (restarted master) is answered by EVAL on the same connection.
        4. A master past its node_timeout gets a "timeout" vote. Its connection is closed (a
           late reply can never be read as the answer to a later command) unless
           ``keep_late``: then it stays open in ``Round.late`` with its reply unread, so the
           caller can queue a command *behind* the pending one (``settle_late``). Replies
           still outstanding once the outcome is decided are likewise kept (``keep_late``) or
           drained by a pool thread (``Round.futures`` completes when they are).
        """
        if self.closed:
            raise LockError("Redlock is closed")
        return ScriptRound(
            self,
            name,
            keys,
            args,
            judge,
            need=need,
            wait_all=wait_all,
            only=only,
            keep_late=keep_late,
        ).run(deadline)

    def drain(self, node: Node, p: Pending, judge: Callable[[object], Vote]) -> Vote:
        """Read a reply nobody waited for (socket timeout = node_timeout), then give the
        connection back to the pool."""
        try:
            try:
                result = p.conn.read_response()
            except NoScriptError:
                p.resend_as_eval()
                result = p.conn.read_response()
            vote = judge(result)
        except Exception as exc:
            vote = Vote(False, describe(exc), exc)
        finally:
            node.pool.release(p.conn)
        self.record_call(node, vote, time.monotonic() - p.sent)
        return vote

    def settle_late(
        self, rnd: Round, *, release: tuple[tuple[str, ...], str] | None, until: float
    ) -> None:
        """Hand ``rnd.late`` to the late-reply reader.

        With ``release=(keys, prefix)`` a release script is first written on each of those
        connections, *behind* the pending script: Redis runs one connection's commands in
        order, so a delayed SET that lands after the attempt gave up is deleted right after
        it, instead of blocking everyone for a full TTL. (A release on another connection
        could overtake the pending SET.) If that connection breaks before the release's
        reply is read, the release is retried on a fresh connection.
        """
        if rnd.stragglers is not None:
            rnd.stragglers.settle(release=release, until=until)
        for i, p in rnd.late.items():
            node = self.nodes[i]
            replies = 1
            if release is not None:
                keys, prefix = release
                try:
                    # EVAL, not EVALSHA: the master may not have the release script cached.
                    p.conn.send_command("EVAL", RELEASE, len(keys), *keys, prefix)
                    replies = 2
                except Exception:
                    p.conn.disconnect()
                    node.pool.release(p.conn)
                    self.release_later(node, keys, prefix)
                    continue
            if release is None:
                # Nothing queued behind it: a pool thread reads the reply (bounded by the
                # socket timeout) and hands the connection back, as for any other round.
                self.pool.submit(self._drain_quietly, node, p)
            else:
                self.late.add(node, p, replies=replies, until=until, release=release)
        rnd.late.clear()

    def _drain_quietly(self, node: Node, p: Pending) -> None:
        """Read the reply of a won round's straggler, then give the connection back.

        A NOSCRIPT reply means the script did not run on that (restarted) master: it is sent
        again as EVAL, so the lock (or extension) still lands on every master that can take
        it, as ``_drain`` does for any round without ``keep_late``. Swallowing it left the
        key on a bare quorum after a restart.
        """
        try:
            try:
                p.conn.read_response()
            except NoScriptError:
                p.resend_as_eval()
                p.conn.read_response()
        except redis.ResponseError:
            pass  # another error reply: the connection is fine
        except Exception:
            p.conn.disconnect()  # read_response has usually done so already
        node.pool.release(p.conn)

    def collect_late(self, rnd: Round, judge: Callable[[object], Vote], *, wait: float) -> None:
        """Wait up to ``wait`` seconds for the replies still pending in ``rnd.late``; each one
        that arrives becomes a vote and its connection goes back to the pool (its script has
        run, so anything sent later on any connection runs after it)."""
        deadline = time.monotonic() + wait
        while rnd.late:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            by_fd = {p.fd: i for i, p in rnd.late.items()}
            poller = select.poll()
            for fd in by_fd:
                poller.register(fd, select.POLLIN)
            for fd, _event in poller.poll(left * 1000):
                i = by_fd[fd]
                p = rnd.late.pop(i)
                try:
                    vote = judge(p.conn.read_response())
                except Exception as exc:  # NOSCRIPT included: that script did not run
                    p.conn.disconnect()
                    vote = Vote(False, describe(exc), exc)
                self.nodes[i].pool.release(p.conn)
                rnd.votes[i] = vote
                rnd.yes += vote.ok
                self.record_call(self.nodes[i], vote, time.monotonic() - p.sent)

    def release_later(self, node: Node, keys: tuple[str, ...], prefix: str) -> None:
        """Release on a fresh connection from the pool (a best-effort retry)."""
        with contextlib.suppress(RuntimeError):  # pool shut down by close()
            self.pool.submit(self.call, node, releaser(keys, prefix), judge_any)

    def reasons(self, rnd: Round, *, settle: bool = False) -> dict[str, str]:
        """Each master's answer. Masters we stopped waiting for once the outcome was decided
        are waited for (briefly) when ``settle``, so a final error names every master."""
        deadline = time.monotonic() + self.call_budget
        out: dict[str, str] = {}
        for i, node in enumerate(self.nodes):
            if i in rnd.votes:
                out[node.name] = rnd.votes[i].reason
                continue
            fut = rnd.futures.get(i)
            if fut is not None and (settle or fut.done()):
                try:
                    out[node.name] = fut.result(
                        timeout=max(0.0, deadline - time.monotonic())
                    ).reason
                except Exception:
                    out[node.name] = "timeout"
            elif fut is not None or i in rnd.late or i in rnd.targets:
                out[node.name] = "no answer yet (outcome already decided)"
        return out


def _after_fork_in_child(ref: weakref.ReferenceType[Transport]) -> None:
    transport = ref()
    if transport is not None and not transport.closed:
        transport.after_fork()


def _forward(answers: queue.SimpleQueue[tuple[int, Vote]], i: int, fut: Future[Vote]) -> None:
    answers.put((i, CANCELLED if fut.cancelled() else fut.result()))
