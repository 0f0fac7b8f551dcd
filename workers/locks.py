"""Redlock over N independent Redis masters, with heartbeat extension and fencing tokens.

Contract (see DESIGN.md §4):

* A lock is held only while a majority (``N // 2 + 1``) of masters store our value and the
  client-side validity ``ttl - elapsed - drift`` (monotonic clock) is positive.
* Every call goes to all masters at once, each bounded by ``node_timeout`` (far below any
  TTL), and returns as soon as its outcome is decided. The lock scripts (acquire, extend,
  release, retag) are written on idle pooled connections from the calling thread and the
  replies collected with poll(); connecting, draining late replies and the rarer calls
  (inspect, SCAN) run on one long-lived thread pool per :class:`Redlock`.
* The stored value is JSON naming the holder (nonce, worker, host, pid, job, version, token,
  acquired_at); release, extend and retag are compare-and-set Lua scripts that match the
  value's ``{"nonce":"…",`` prefix, so only the holder that wrote it can touch it.
* Fencing tokens come from ``token_source`` (the database counter, DESIGN.md §4) and are
  obtained *after* the quorum is reached. Redis alone cannot make them safe; every guarded
  write must check the token in the database. Correctness rests on that check.

* Multi-key locks are all or nothing on each master (one script). ``Lock.token`` is the
  token of the first key; ``Lock.tokens`` maps every key to its own token.

Fork-safe: a forked child (an RQ work horse) gets a fresh thread pool on fork.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import queue
import random
import secrets
import select
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.commands.core import Script
from redis.exceptions import NoScriptError
from redis.retry import Retry

__all__ = [
    "Lock",
    "LockError",
    "LockLost",
    "LockNotAcquired",
    "LockNotOwned",
    "Redlock",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

# KEYS = resources; ARGV = value, ttl_ms, nonce prefix.
# All keys or none on this master: refuse (returning -index of the first foreign key) if any
# key holds someone else's value. A key already holding *our* nonce is overwritten: that only
# happens when redis-py re-sent the script after a dropped connection, and re-setting PX then
# makes the server-side lease longer than the one the client computed from its earlier start
# time, never shorter, so the client's validity stays a lower bound.
_ACQUIRE = """
for i, key in ipairs(KEYS) do
  local v = redis.call('GET', key)
  if v and string.sub(v, 1, #ARGV[3]) ~= ARGV[3] then return -i end
end
for i, key in ipairs(KEYS) do
  redis.call('SET', key, ARGV[1], 'PX', ARGV[2])
end
return 1
"""

# KEYS = resources; ARGV = nonce prefix, ttl_ms. Extends only if every key is still ours;
# a missing key is NOT re-created (it means the lease lapsed on this master, and re-creating
# it would hide a loss from the heartbeat).
_EXTEND = """
for i, key in ipairs(KEYS) do
  local v = redis.call('GET', key)
  if (not v) or string.sub(v, 1, #ARGV[1]) ~= ARGV[1] then return -i end
end
for i, key in ipairs(KEYS) do
  redis.call('PEXPIRE', key, ARGV[2])
end
return 1
"""

# KEYS = resources; ARGV = nonce prefix. Deletes the keys that are still ours; returns count.
_RELEASE = """
local n = 0
for i, key in ipairs(KEYS) do
  local v = redis.call('GET', key)
  if v and string.sub(v, 1, #ARGV[1]) == ARGV[1] then
    redis.call('DEL', key)
    n = n + 1
  end
end
return n
"""

# KEYS = resources; ARGV = nonce prefix, then one new value per key. Rewrites our own values
# (to record the fencing token) keeping their TTL; returns how many keys were rewritten.
_RETAG = """
local n = 0
for i, key in ipairs(KEYS) do
  local v = redis.call('GET', key)
  if v and string.sub(v, 1, #ARGV[1]) == ARGV[1] then
    redis.call('SET', key, ARGV[i + 1], 'KEEPTTL')
    n = n + 1
  end
end
return n
"""


class LockError(Exception):
    """Base class of every lock failure."""


class LockNotAcquired(LockError):
    """No quorum (or no validity left) after every attempt.

    ``reasons`` maps each master to what it answered on the last attempt
    (``"acquired"``, ``"refused: held"``, ``"timeout"``, ``"connection refused"``, …).
    """

    def __init__(self, keys: Sequence[str], reasons: Mapping[str, str], attempts: int) -> None:
        self.keys = list(keys)
        self.reasons = dict(reasons)
        self.attempts = attempts
        detail = "; ".join(f"{node}: {why}" for node, why in self.reasons.items())
        super().__init__(
            f"could not lock {self.keys} after {attempts} attempt(s); last attempt: {detail}"
        )


class LockLost(LockError):
    """The lease is gone (or may be): stop writing, abort the job."""


class LockNotOwned(LockLost):
    """Release/extend found a majority of masters not holding our value."""


def _describe(exc: BaseException) -> str:
    if isinstance(exc, redis.TimeoutError):
        return "timeout"
    if isinstance(exc, redis.ConnectionError):
        text = str(exc)
        if "refused" in text.lower() or "111" in text:
            return "connection refused"
        return f"connection error: {text}"
    return f"error: {type(exc).__name__}: {exc}"


class _Vote(NamedTuple):
    ok: bool
    reason: str
    result: object


@dataclass
class _NodeStats:
    calls: int = 0
    errors: int = 0
    timeouts: int = 0
    latency_total: float = 0.0
    latency_max: float = 0.0


class _Node:
    """One master: a private client with the per-node timeout, and its scripts."""

    def __init__(self, target: str | redis.Redis, node_timeout: float) -> None:
        if isinstance(target, str):
            base = redis.ConnectionPool.from_url(target)
        else:
            base = target.connection_pool
        kwargs = dict(base.connection_kwargs)
        # Our own pool, so the caller's client keeps its settings. One immediate retry on a
        # dropped connection (a restarted master leaves stale pooled sockets) but never on a
        # timeout: a retry would double the per-node budget. Every script is idempotent for
        # our own nonce, so a re-sent command is harmless.
        kwargs.update(
            socket_timeout=node_timeout,
            socket_connect_timeout=node_timeout,
            retry=Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,)),
            retry_on_error=[],
            retry_on_timeout=False,
        )
        kwargs.pop("decode_responses", None)
        self.pool = redis.ConnectionPool(connection_class=base.connection_class, **kwargs)
        self.client = redis.Redis(connection_pool=self.pool)
        host = kwargs.get("host", kwargs.get("path", "?"))
        self.name = f"{host}:{kwargs.get('port', '')}/{kwargs.get('db', 0)}"
        self.acquire: Script = self.client.register_script(_ACQUIRE)
        self.extend: Script = self.client.register_script(_EXTEND)
        self.release: Script = self.client.register_script(_RELEASE)
        self.retag: Script = self.client.register_script(_RETAG)
        self.stats = _NodeStats()


def _encode(nonce: str, holder: Mapping[str, Any]) -> tuple[str, str]:
    """Return ``(value, prefix)``: the JSON value with ``nonce`` first, and its CAS prefix."""
    prefix = '{"nonce":"' + nonce + '",'
    body = json.dumps(
        {k: v for k, v in holder.items() if k != "nonce"},
        separators=(",", ":"),
        sort_keys=True,
        default=str,
    )
    return prefix + body[1:], prefix


def _decode(raw: bytes) -> tuple[str | None, dict[str, Any]]:
    """Return ``(nonce, holder)`` of a stored value; foreign values give ``(None, {"raw": …})``."""
    text = raw.decode("utf-8", errors="replace")
    try:
        data = json.loads(text)
    except ValueError:
        return None, {"raw": text}
    if not isinstance(data, dict):
        return None, {"raw": text}
    nonce = data.pop("nonce", None)
    return (str(nonce) if nonce is not None else None), data


class Lock:
    """A held Redlock lease on one or more keys.

    ``token`` is the fencing token of the first key (``None`` without a ``token_source``);
    ``tokens`` maps every key to its own token. ``lost`` is set once the lease is known or
    suspected gone; after that, ``check()`` always raises.
    Thread-safe: ``extend``/``release`` are serialised by an internal mutex, so the heartbeat
    and the job thread can both use the lock. Used directly as a context manager (without
    ``Redlock.hold``) it only releases on exit, ignoring release errors.
    """

    def __init__(
        self,
        redlock: Redlock,
        keys: tuple[str, ...],
        *,
        ttl: float,
        nonce: str,
        prefix: str,
        holder: dict[str, Any],
        valid_until: float,
        tokens: dict[str, int],
    ) -> None:
        self._redlock = redlock
        self.keys = keys
        self.ttl = ttl
        self.nonce = nonce
        self._prefix = prefix
        self.holder = holder
        self.tokens = tokens
        self.token: int | None = tokens.get(keys[0])
        self._valid_until = valid_until
        self._released = False
        self._mutex = threading.Lock()
        self.lost = threading.Event()
        self.extensions = 0
        #: Masters that granted the lock when it was acquired (at least the quorum).
        self.agreeing = 0
        self._hb_stop = threading.Event()
        self._hb_thread: threading.Thread | None = None

    @property
    def key(self) -> str:
        return self.keys[0]

    def __repr__(self) -> str:
        return f"<Lock {list(self.keys)} token={self.token} valid_for={self.valid_for():.3f}>"

    def valid_for(self) -> float:
        """Seconds of validity left (monotonic clock); 0 once released or lost."""
        if self._released or self.lost.is_set():
            return 0.0
        return max(0.0, self._valid_until - time.monotonic())

    def check(self) -> None:
        """Raise :class:`LockLost` unless the lease is still valid. Call before every write."""
        if self.lost.is_set():
            raise LockLost(f"lock on {list(self.keys)} was lost")
        if self._released:
            raise LockLost(f"lock on {list(self.keys)} was released")
        if self.valid_for() <= 0:
            raise LockLost(f"lock on {list(self.keys)} ran out of validity")

    def extend(self, ttl: float | None = None) -> None:
        """Reset the lease to ``ttl`` seconds on a majority, within the remaining validity.

        Raises :class:`LockNotOwned` when a majority no longer holds our value, and
        :class:`LockLost` when a quorum is not reached before the validity runs out. Either
        way ``lost`` is set: a failed extension is treated as a lost lock.
        """
        new_ttl = self.ttl if ttl is None else float(ttl)
        # The mutex serialises extend against release and against the heartbeat: without it
        # a release could land between our compare and our PEXPIRE on one master and make a
        # successful release look like a lost lock.
        with self._mutex:
            self.check()
            self._redlock._extend(self, new_ttl)

    def release(self) -> None:
        """Delete our keys on every master.

        Raises :class:`LockNotOwned` if fewer than a quorum of masters still held all our
        keys (the lease had lapsed, or was never re-established after a master restart).
        """
        with self._mutex:
            if self._released:
                raise LockNotOwned(f"lock on {list(self.keys)} was already released")
            # Mark first: from here on check() fails even if the network call hangs.
            self._released = True
            self._redlock._release(self)

    # Heartbeat -----------------------------------------------------------------------

    def _start_heartbeat(
        self,
        on_lost: Callable[[Lock], object] | None,
        on_extended: Callable[[Lock], object] | None = None,
    ) -> None:
        thread = threading.Thread(
            target=self._heartbeat,
            args=(on_lost, on_extended),
            name=f"redlock-heartbeat:{self.keys[0]}",
            daemon=True,
        )
        self._hb_thread = thread
        thread.start()

    def _stop_heartbeat(self) -> None:
        self._hb_stop.set()
        thread = self._hb_thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _heartbeat(
        self,
        on_lost: Callable[[Lock], object] | None,
        on_extended: Callable[[Lock], object] | None = None,
    ) -> None:
        """Extend every ~ttl/3; on the first failed extension set ``lost`` and call ``on_lost``.

        One failure is enough: an extension is only attempted while the lease is valid and
        fails only when a quorum is not reached within what is left of it, after which no
        write may rely on the lease any more.
        """
        while not self._hb_stop.wait(self.ttl / 3.0):
            try:
                self.extend(self.ttl)
            except Exception as exc:  # LockLost, or anything unexpected: fail safe
                if self._released:
                    # The owner released the lock itself between our wake-up and the extend
                    # (extend and release are serialised by the mutex): nothing was lost.
                    return
                self._on_heartbeat_failure(exc, on_lost)
                return
            if on_extended is not None:
                try:
                    on_extended(self)
                except Exception:  # an observer must never cost us the lease
                    log.exception("redlock: on_extended callback failed for %s", list(self.keys))

    def _on_heartbeat_failure(
        self, exc: BaseException, on_lost: Callable[[Lock], object] | None
    ) -> None:
        self.lost.set()
        self._redlock._count("losses")
        log.warning("redlock: lost %s: %s", list(self.keys), exc)
        if on_lost is not None:
            try:
                on_lost(self)
            except Exception:
                log.exception("redlock: on_lost callback failed for %s", list(self.keys))

    def __enter__(self) -> Lock:
        return self

    def __exit__(self, *exc_info: object) -> None:
        with contextlib.suppress(LockError, redis.RedisError):
            self.release()


@dataclass
class _Stats:
    counters: dict[str, int] = field(default_factory=dict)
    acquire_latencies: list[float] = field(default_factory=list)
    acquire_latency_total: float = 0.0
    acquire_latency_max: float = 0.0


class _Pending(NamedTuple):
    conn: Any  # a redis-py Connection (its I/O methods are untyped)
    script: Script
    sent: float
    node_deadline: float
    fd: int


class _Round(NamedTuple):
    votes: dict[int, _Vote]
    futures: list[Future[_Vote]]
    yes: int


class Redlock:
    """Client for N independent Redis masters (URLs or ``redis.Redis`` clients).

    ``retry_count`` retries after the first attempt, each after ``retry_delay ±
    retry_jitter`` seconds (uniform). ``token_source(key)`` returns a new fencing token for
    ``key``; it is called once per key after the quorum is reached.
    """

    _LATENCY_SAMPLES = 2048

    def __init__(
        self,
        masters: Sequence[str | redis.Redis],
        *,
        retry_count: int = 3,
        retry_delay: float = 0.2,
        retry_jitter: float = 0.1,
        drift_factor: float = 0.01,
        node_timeout: float = 0.05,
        token_source: Callable[[str], int] | None = None,
        max_workers: int | None = None,
    ) -> None:
        if not masters:
            raise ValueError("Redlock needs at least one master")
        if not 0 <= drift_factor < 1:
            raise ValueError("drift_factor must be in [0, 1)")
        self.nodes = [_Node(m, node_timeout) for m in masters]
        self.quorum = len(self.nodes) // 2 + 1
        self.retry_count = retry_count
        self.retry_delay = retry_delay
        self.retry_jitter = retry_jitter
        self.drift_factor = drift_factor
        self.node_timeout = node_timeout
        self.token_source = token_source
        # Budget for calls that have no lease to bound them (release, inspect): every call
        # is already bounded by its socket timeouts; this only guards against pool queueing.
        self._call_budget = max(1.0, 20 * node_timeout)
        # One persistent pool for the life of the Redlock. Sized for several caller threads
        # each fanning out to every master at once.
        self._max_workers = max_workers or max(8, 8 * len(self.nodes))
        self._pool = self._new_pool()
        self._stats_lock = threading.Lock()
        self._stats = _Stats()
        self._closed = False
        # Fork: RQ forks a work horse per job, and a process-wide Redlock built before the
        # fork is inherited without its pool threads (submitted work would never run) and
        # possibly with _stats_lock held by a thread that does not exist in the child. So the
        # child gets a fresh pool and lock. redis-py resets its connection pools by itself
        # (ConnectionPool._checkpid) before any inherited socket could be used.
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=functools.partial(_after_fork_in_child, ref))

    def _new_pool(self) -> ThreadPoolExecutor:
        return ThreadPoolExecutor(max_workers=self._max_workers, thread_name_prefix="redlock")

    def _after_fork(self) -> None:
        self._pool = self._new_pool()
        self._stats_lock = threading.Lock()

    # Plumbing ------------------------------------------------------------------------

    def _count(self, name: str, n: int = 1) -> None:
        with self._stats_lock:
            self._stats.counters[name] = self._stats.counters.get(name, 0) + n

    def _call(self, node: _Node, fn: Callable[[_Node], T], judge: Callable[[T], _Vote]) -> _Vote:
        start = time.monotonic()
        try:
            vote = judge(fn(node))
        except Exception as exc:
            vote = _Vote(False, _describe(exc), exc)
        self._record_call(node, vote, time.monotonic() - start)
        return vote

    def _record_call(self, node: _Node, vote: _Vote, took: float) -> None:
        with self._stats_lock:
            s = node.stats
            s.calls += 1
            s.errors += isinstance(vote.result, Exception) or vote.reason == "timeout"
            s.timeouts += vote.reason == "timeout"
            s.latency_total += took
            s.latency_max = max(s.latency_max, took)

    def _broadcast(
        self,
        fn: Callable[[_Node], T],
        judge: Callable[[T], _Vote],
        *,
        deadline: float,
        need: int,
        wait_all: bool = False,
    ) -> _Round:
        """Run ``fn`` on every master concurrently; return once ``need`` said yes, once that
        became impossible, or at ``deadline`` (masters still silent then get no vote).
        With ``wait_all``, wait for every master (until ``deadline``) regardless."""
        if self._closed:
            raise LockError("Redlock is closed")
        answers: queue.SimpleQueue[tuple[int, _Vote]] = queue.SimpleQueue()
        futures: list[Future[_Vote]] = []
        for i, node in enumerate(self.nodes):
            fut = self._pool.submit(self._call, node, fn, judge)
            # The callback may run in a pool thread after we returned; it only feeds a queue
            # nobody reads any more, which is harmless.
            fut.add_done_callback(functools.partial(_forward, answers, i))
            futures.append(fut)
        votes: dict[int, _Vote] = {}
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
        return _Round(votes, futures, yes)

    def _broadcast_script(
        self,
        name: str,
        keys: tuple[str, ...],
        args: Sequence[str | int],
        judge: Callable[[object], _Vote],
        *,
        deadline: float,
        need: int,
        wait_all: bool = False,
    ) -> _Round:
        """Run one Lua script on every master at once, without thread hand-offs when possible.

        1. For each master with an idle pooled connection, send EVALSHA on it from the calling
           thread (a small write, no waiting). A master without one (cold start, after an
           error) goes through the thread pool instead, so a slow *connect* never delays the
           others.
        2. poll() all sent sockets until the outcome is decided (as in ``_broadcast``), each
           master bounded by ``node_timeout`` from its send and all by ``deadline``.
        3. A NOSCRIPT reply (restarted master) is answered by EVAL on the same connection.
        4. A master past its node_timeout gets a "timeout" vote and its connection is closed
           (a late reply can never be read as the answer to a later command). Replies still
           outstanding once the outcome is decided are drained by a pool thread before their
           connection goes back to the pool; ``_Round.futures`` completes when they do.
        """
        if self._closed:
            raise LockError("Redlock is closed")
        n = len(self.nodes)
        futures: list[Future[_Vote] | None] = [None] * n
        votes: dict[int, _Vote] = {}
        yes = 0
        answers: queue.SimpleQueue[tuple[int, _Vote]] = queue.SimpleQueue()
        threaded = 0
        pending: dict[int, _Pending] = {}
        by_fd: dict[int, int] = {}
        poller = select.poll()

        def vote_now(i: int, vote: _Vote, took: float) -> None:
            nonlocal yes
            votes[i] = vote
            yes += vote.ok
            futures[i] = _done(vote)
            self._record_call(self.nodes[i], vote, took)

        for i, node in enumerate(self.nodes):
            script: Script = getattr(node, name)
            conn: Any = None
            start = time.monotonic()
            # Only an idle, *connected* connection is used from this thread: connecting means a
            # handshake that a stalled master would make us wait for, delaying the others.
            # The peek is racy (another thread may take that connection first, and then
            # get_connection() connects here); that only costs time, bounded by the timeouts.
            idle = getattr(node.pool, "_available_connections", None)
            if idle and getattr(idle[-1], "_sock", None) is not None:
                try:
                    conn = node.pool.get_connection()
                except Exception as exc:
                    vote_now(i, _Vote(False, _describe(exc), exc), time.monotonic() - start)
                    continue
            if conn is None:
                fut = self._pool.submit(self._call, node, _script_call(name, keys, args), judge)
                fut.add_done_callback(functools.partial(_forward, answers, i))
                futures[i] = fut
                threaded += 1
                continue
            try:
                conn.send_command("EVALSHA", script.sha, len(keys), *keys, *args)
                fd = int(conn._sock.fileno())
            except Exception as exc:
                conn.disconnect()
                node.pool.release(conn)
                vote_now(i, _Vote(False, _describe(exc), exc), time.monotonic() - start)
                continue
            pending[i] = _Pending(conn, script, start, start + self.node_timeout, fd)
            by_fd[fd] = i
            poller.register(fd, select.POLLIN)

        def decided() -> bool:
            if len(votes) == n:
                return True
            return not wait_all and (yes >= need or (len(votes) - yes) > n - need)

        while not decided():
            while threaded:  # answers from the thread-pool path
                try:
                    i, vote = answers.get_nowait()
                except queue.Empty:
                    break
                threaded -= 1
                votes[i] = vote
                yes += vote.ok
            now = time.monotonic()
            if decided() or now >= deadline:
                break
            # Read what has arrived before expiring anyone: a reply that is already waiting
            # must not be called a timeout just because this thread was slow to look.
            if pending:
                self._read_ready(pending, by_fd, poller, 0.0, keys, args, judge, vote_now)
                if decided():
                    break
            for i, p in list(pending.items()):
                if now >= p.node_deadline:
                    self._forget(pending, by_fd, poller, i)
                    p.conn.disconnect()
                    self.nodes[i].pool.release(p.conn)
                    vote_now(i, _Vote(False, "timeout", None), now - p.sent)
            if decided():
                break
            if not pending:
                if not threaded:
                    break
                try:
                    i, vote = answers.get(timeout=max(0.0, deadline - now))
                except queue.Empty:
                    break
                threaded -= 1
                votes[i] = vote
                yes += vote.ok
                continue
            wait = min(deadline, *(p.node_deadline for p in pending.values())) - now
            if threaded:
                wait = min(wait, 0.001)  # poll the thread-pool answers too
            self._read_ready(pending, by_fd, poller, wait, keys, args, judge, vote_now)
        for i, p in pending.items():
            futures[i] = self._pool.submit(self._drain, self.nodes[i], p, keys, args, judge)
        done = [f for f in futures if f is not None]
        return _Round(votes, done, yes)

    def _read_ready(
        self,
        pending: dict[int, _Pending],
        by_fd: dict[int, int],
        poller: select.poll,
        wait: float,
        keys: tuple[str, ...],
        args: Sequence[str | int],
        judge: Callable[[object], _Vote],
        vote_now: Callable[[int, _Vote, float], None],
    ) -> None:
        """Wait up to ``wait`` seconds for replies and count every one that arrived."""
        for fd, _event in poller.poll(max(0.0, wait) * 1000):
            i = by_fd[fd]
            p = pending[i]
            vote: _Vote | None = None
            try:
                vote = judge(p.conn.read_response())
            except NoScriptError:
                # The master restarted and lost its script cache: send the source on the
                # same connection and keep waiting (same per-node deadline).
                try:
                    p.conn.send_command("EVAL", p.script.script, len(keys), *keys, *args)
                except Exception as exc:
                    p.conn.disconnect()
                    vote = _Vote(False, _describe(exc), exc)
            except Exception as exc:  # read_response has already disconnected it
                vote = _Vote(False, _describe(exc), exc)
            if vote is None:
                continue  # EVAL sent, reply still to come
            self._forget(pending, by_fd, poller, i)
            self.nodes[i].pool.release(p.conn)
            vote_now(i, vote, time.monotonic() - p.sent)

    @staticmethod
    def _forget(
        pending: dict[int, _Pending], by_fd: dict[int, int], poller: select.poll, i: int
    ) -> None:
        p = pending.pop(i)
        by_fd.pop(p.fd, None)
        poller.unregister(p.fd)

    def _drain(
        self,
        node: _Node,
        p: _Pending,
        keys: tuple[str, ...],
        args: Sequence[str | int],
        judge: Callable[[object], _Vote],
    ) -> _Vote:
        """Read a reply nobody waited for (socket timeout = node_timeout), then give the
        connection back to the pool."""
        try:
            try:
                result = p.conn.read_response()
            except NoScriptError:
                p.conn.send_command("EVAL", p.script.script, len(keys), *keys, *args)
                result = p.conn.read_response()
            vote = judge(result)
        except Exception as exc:
            vote = _Vote(False, _describe(exc), exc)
        finally:
            node.pool.release(p.conn)
        self._record_call(node, vote, time.monotonic() - p.sent)
        return vote

    def _reasons(self, rnd: _Round, *, settle: bool = False) -> dict[str, str]:
        """Each master's answer. Masters we stopped waiting for once the outcome was decided
        are waited for (briefly) when ``settle``, so a final error names every master."""
        deadline = time.monotonic() + self._call_budget
        out: dict[str, str] = {}
        for i, node in enumerate(self.nodes):
            if i in rnd.votes:
                out[node.name] = rnd.votes[i].reason
                continue
            fut = rnd.futures[i]
            if settle or fut.done():
                try:
                    out[node.name] = fut.result(
                        timeout=max(0.0, deadline - time.monotonic())
                    ).reason
                except Exception:
                    out[node.name] = "timeout"
            else:
                out[node.name] = "no answer yet (outcome already decided)"
        return out

    def _drift(self, ttl: float) -> float:
        return ttl * self.drift_factor + 0.002

    # Acquire -------------------------------------------------------------------------

    def acquire(
        self,
        keys: str | Sequence[str],
        *,
        ttl: float = 30.0,
        holder: Mapping[str, Any] | None = None,
    ) -> Lock:
        """Take the lock on every key in ``keys`` (all or none) for ``ttl`` seconds.

        1. Build a fresh value for the attempt: a random 128-bit nonce plus the holder (given
           fields over defaults: worker, host, pid, job, version, token, acquired_at).
        2. Note the monotonic start time ``t0``.
        3. Send the acquire script (all keys NX, atomically, per master) to every master at
           once; stop waiting as soon as a quorum said yes, a quorum became impossible, or
           ``t0 + ttl - drift`` passed.
        4. ``validity = ttl - (now - t0) - drift`` with ``drift = drift_factor·ttl + 2 ms``.
           With a quorum and validity > 0, the lock is ours.
        5. With a ``token_source``, fetch one token per key, re-check the validity (a token
           fetched after the lease lapsed might be newer than the next holder's), and
           record the tokens in the stored values with the retag script (best effort, for
           ``inspect``; the CAS scripts match the nonce prefix, so partial retags are fine).
        6. Otherwise release every master, including those that have not answered yet (their
           release is chained after their pending call), sleep ``retry_delay ± jitter`` and
           retry with a new nonce, up to ``retry_count`` times.
        7. Raise :class:`LockNotAcquired` with each master's answer on the last attempt.
        """
        key_list = (keys,) if isinstance(keys, str) else tuple(keys)
        if not key_list or len(set(key_list)) != len(key_list):
            raise ValueError("keys must be a non-empty sequence of distinct strings")
        if ttl <= 0 or ttl - self._drift(ttl) <= 0:
            raise ValueError(f"ttl {ttl} leaves no validity after the clock drift allowance")
        ttl_ms = max(1, int(ttl * 1000))
        drift = self._drift(ttl)
        started = time.monotonic()
        reasons: dict[str, str] = {}
        attempts = 0
        for attempt in range(self.retry_count + 1):
            if attempt:
                time.sleep(
                    max(
                        0.0,
                        self.retry_delay + random.uniform(-self.retry_jitter, self.retry_jitter),
                    )
                )
            attempts += 1
            self._count("acquire_attempts")
            nonce = secrets.token_hex(16)
            info: dict[str, Any] = {
                "worker": None,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "job": None,
                "version": None,
                "acquired_at": time.time(),
                **(holder or {}),
                "token": None,
            }
            value, prefix = _encode(nonce, info)
            t0 = time.monotonic()

            def judge_acquire(result: object) -> _Vote:
                if result == 1:
                    return _Vote(True, "acquired", result)
                if isinstance(result, int) and result < 0:
                    return _Vote(False, "refused: held", result)
                return _Vote(False, f"error: unexpected reply {result!r}", result)

            rnd = self._broadcast_script(
                # Arguments passed by value, not closed over: a call still in flight when the
                # next attempt starts must send *this* attempt's value.
                "acquire",
                key_list,
                [value, ttl_ms, prefix],
                judge_acquire,
                deadline=t0 + ttl - drift,
                need=self.quorum,
            )
            refused = sum(1 for v in rnd.votes.values() if v.reason == "refused: held")
            self._count("refused", refused)
            validity = ttl - (time.monotonic() - t0) - drift
            reasons = self._reasons(rnd)
            if rnd.yes >= self.quorum and validity > 0:
                tokens: dict[str, int] = {}
                try:
                    tokens = self._fetch_tokens(key_list)
                except Exception as exc:
                    log.warning("redlock: token_source failed for %s: %s", key_list, exc)
                    reasons = {**reasons, "token_source": f"error: {exc}"}
                    self._unlock_after(rnd, key_list, prefix)
                    continue
                # Race: the token source may be slow. A token fetched while our lease is still
                # valid was issued before any later holder could get a quorum, so it is
                # smaller than theirs; a token fetched after the lease lapsed might be larger
                # than a newer holder's, which is why such a lock is discarded here.
                validity = ttl - (time.monotonic() - t0) - drift
                if validity > 0:
                    lock = Lock(
                        self,
                        key_list,
                        ttl=ttl,
                        nonce=nonce,
                        prefix=prefix,
                        holder={**info, "token": tokens.get(key_list[0])},
                        valid_until=t0 + ttl - drift,
                        tokens=tokens,
                    )
                    lock.agreeing = rnd.yes
                    if tokens:
                        self._retag(lock, info, lock._valid_until)
                    self._record_acquired(time.monotonic() - started)
                    return lock
                reasons = {**reasons, "validity": "expired while fetching the token"}
            else:
                if validity <= 0:
                    reasons = {**reasons, "validity": "expired during the attempt"}
            if attempt == self.retry_count:
                # Final failure: wait (briefly) for masters we stopped listening to once the
                # outcome was decided, so the error names what every master answered.
                reasons = {**reasons, **self._reasons(rnd, settle=True)}
            self._unlock_after(rnd, key_list, prefix)
        self._count("acquire_failures")
        raise LockNotAcquired(key_list, reasons, attempts)

    def _fetch_tokens(self, keys: tuple[str, ...]) -> dict[str, int]:
        if self.token_source is None:
            return {}
        return {key: int(self.token_source(key)) for key in keys}

    def _record_acquired(self, took: float) -> None:
        with self._stats_lock:
            st = self._stats
            st.counters["acquired"] = st.counters.get("acquired", 0) + 1
            st.acquire_latency_total += took
            st.acquire_latency_max = max(st.acquire_latency_max, took)
            st.acquire_latencies.append(took)
            if len(st.acquire_latencies) > self._LATENCY_SAMPLES:
                del st.acquire_latencies[: self._LATENCY_SAMPLES // 2]

    def _unlock_after(self, rnd: _Round, keys: tuple[str, ...], prefix: str) -> None:
        """Release a failed attempt on every master.

        Masters that answered are released now (and waited for, briefly, so a caller who
        sees LockNotAcquired finds nothing of ours left behind). Masters whose acquire is
        still in flight get their release chained after it: sending it now could overtake
        the pending SET on another connection and leave a ghost lock. Only keys holding
        *this attempt's* nonce are deleted, so this can never touch a later attempt or
        another client's lock. A SET that a stalled master applies after even the chained
        release (SIGSTOP) is a ghost that expires with its TTL; it can only cause refusals.
        """
        now: list[Future[_Vote]] = []
        for i, fut in enumerate(rnd.futures):
            node = self.nodes[i]
            if fut.done():
                now.append(self._pool.submit(self._call, node, _releaser(keys, prefix), _judge_any))
            else:
                fut.add_done_callback(
                    functools.partial(self._release_quietly, node=node, keys=keys, prefix=prefix)
                )
        deadline = time.monotonic() + self._call_budget
        for fut in now:
            with contextlib.suppress(Exception):
                fut.result(timeout=max(0.0, deadline - time.monotonic()))

    def _release_quietly(
        self, _done: Future[_Vote], *, node: _Node, keys: tuple[str, ...], prefix: str
    ) -> None:
        with contextlib.suppress(RuntimeError):  # pool shut down by close()
            self._pool.submit(self._call, node, _releaser(keys, prefix), _judge_any)

    def _retag(self, lock: Lock, info: Mapping[str, Any], deadline: float) -> None:
        values = []
        for key in lock.keys:
            value, _ = _encode(lock.nonce, {**info, "token": lock.tokens.get(key)})
            values.append(value)
        args = [lock._prefix, *values]
        self._broadcast_script(
            "retag",
            lock.keys,
            args,
            _judge_any,
            deadline=deadline,
            need=self.quorum,
        )

    # Extend / release (called by Lock under its mutex) --------------------------------

    def _extend(self, lock: Lock, ttl: float) -> None:
        ttl_ms = max(1, int(ttl * 1000))
        t0 = time.monotonic()
        n_keys = len(lock.keys)

        def judge(result: object) -> _Vote:
            if result == 1:
                return _Vote(True, "extended", result)
            return _Vote(False, "refused: not owner", result)

        # Deadline = the current validity: a quorum reached later would extend a lease that
        # another client may already have taken over.
        rnd = self._broadcast_script(
            "extend",
            lock.keys,
            [lock._prefix, ttl_ms],
            judge,
            deadline=lock._valid_until,
            need=self.quorum,
        )
        now = time.monotonic()
        if rnd.yes >= self.quorum and now < lock._valid_until:
            # Validity counts from t0, before the first PEXPIRE could have been applied.
            lock._valid_until = t0 + ttl - self._drift(ttl)
            lock.ttl = ttl
            lock.extensions += 1
            self._count("extensions")
            return
        lock.lost.set()
        self._count("extension_failures")
        detail = "; ".join(f"{k}: {v}" for k, v in self._reasons(rnd, settle=False).items())
        not_owner = sum(1 for v in rnd.votes.values() if v.reason == "refused: not owner")
        if not_owner > len(self.nodes) - self.quorum:
            raise LockNotOwned(f"lock on {list(lock.keys)} is no longer ours: {detail}")
        raise LockLost(
            f"could not extend {list(lock.keys)} on a quorum within its validity "
            f"({n_keys} key(s)): {detail}"
        )

    def _release(self, lock: Lock) -> None:
        n_keys = len(lock.keys)

        def judge(result: object) -> _Vote:
            if result == n_keys:
                return _Vote(True, "released", result)
            return _Vote(False, f"refused: not owner ({result}/{n_keys} keys were ours)", result)

        # Sent to every master and waited for (each call is bounded by the node timeout), so
        # once release() returns no reachable master still shows us as the holder. Releasing
        # a master we never locked is a no-op, so this is always safe.
        rnd = self._broadcast_script(
            "release",
            lock.keys,
            [lock._prefix],
            judge,
            deadline=time.monotonic() + self._call_budget,
            need=self.quorum,
            wait_all=True,
        )
        self._count("releases")
        if rnd.yes < self.quorum:
            detail = "; ".join(f"{k}: {v}" for k, v in self._reasons(rnd, settle=True).items())
            raise LockNotOwned(f"released {list(lock.keys)} without a quorum: {detail}")

    # Heartbeat-held context ------------------------------------------------------------

    @contextlib.contextmanager
    def hold(
        self,
        keys: str | Sequence[str],
        *,
        ttl: float = 30.0,
        holder: Mapping[str, Any] | None = None,
        on_lost: Callable[[Lock], object] | None = None,
        on_extended: Callable[[Lock], object] | None = None,
    ) -> Iterator[Lock]:
        """Acquire, extend every ~ttl/3 from a daemon thread while inside, release on exit.

        On a failed extension the heartbeat sets ``lock.lost`` and calls ``on_lost(lock)``
        (from the heartbeat thread); after each successful one it calls ``on_extended(lock)``
        (an observer: its errors are logged). On exit the heartbeat is stopped and the lock released
        (release errors are logged, not raised); if the lease was lost before the body
        finished, :class:`LockLost` is raised unless the body is already raising.
        """
        lock = self.acquire(keys, ttl=ttl, holder=holder)
        lock._start_heartbeat(on_lost, on_extended)
        body_failed = False
        held_to_the_end = False
        try:
            yield lock
        except BaseException:
            body_failed = True
            raise
        finally:
            # Judge the lease *before* stopping the heartbeat: a loss the heartbeat detects
            # after the body finished did not affect the body's writes.
            held_to_the_end = lock._released or lock.valid_for() > 0
            lock._stop_heartbeat()
            if not lock._released:  # the body may have released it itself
                try:
                    lock.release()
                except (LockError, redis.RedisError) as exc:
                    log.warning("redlock: release of %s failed: %s", list(lock.keys), exc)
        if not body_failed and not held_to_the_end:
            raise LockLost(f"lock on {list(lock.keys)} was lost while held")

    # Introspection -------------------------------------------------------------------

    def inspect(self, key: str) -> dict[str, Any] | None:
        """Holder, remaining TTL (ms, minimum over the agreeing masters) and how many masters
        agree on the holder (same nonce); ``None`` when no master has the key."""
        return self._inspect_many([key]).get(key)

    def list_locks(self, prefix: str = "locks:") -> list[dict[str, Any]]:
        """``inspect()`` of every key under ``prefix`` found by SCAN on any master."""

        def scan(node: _Node) -> set[bytes]:
            return set(node.client.scan_iter(match=_glob_escape(prefix) + "*", count=1000))

        rnd = self._broadcast(
            scan,
            lambda found: _Vote(True, "ok", found),
            deadline=time.monotonic() + self._call_budget,
            need=len(self.nodes),
            wait_all=True,
        )
        keys: set[str] = set()
        for vote in rnd.votes.values():
            if vote.ok and isinstance(vote.result, set):
                keys.update(k.decode("utf-8", errors="replace") for k in vote.result)
        found = self._inspect_many(sorted(keys))
        return [found[k] for k in sorted(found)]

    def _inspect_many(self, keys: Sequence[str]) -> dict[str, dict[str, Any]]:
        if not keys:
            return {}

        def read(node: _Node) -> list[Any]:
            pipe = node.client.pipeline(transaction=False)
            for key in keys:
                pipe.get(key)
                pipe.pttl(key)
            return list(pipe.execute(raise_on_error=False))

        rnd = self._broadcast(
            read,
            lambda replies: _Vote(True, "ok", replies),
            deadline=time.monotonic() + self._call_budget,
            need=len(self.nodes),
            wait_all=True,
        )
        out: dict[str, dict[str, Any]] = {}
        for k_index, key in enumerate(keys):
            groups: dict[str, list[tuple[dict[str, Any], int]]] = {}
            for vote in rnd.votes.values():
                replies = vote.result
                if not vote.ok or not isinstance(replies, list):
                    continue
                raw, pttl = replies[2 * k_index], replies[2 * k_index + 1]
                if not isinstance(raw, bytes) or not isinstance(pttl, int) or pttl == -2:
                    continue
                nonce, holder = _decode(raw)
                group = nonce if nonce is not None else "raw:" + raw.hex()
                groups.setdefault(group, []).append((holder, pttl))
            if not groups:
                continue
            best = max(groups.values(), key=lambda g: (len(g), min(p for _, p in g)))
            # Prefer a copy that already carries the token (retag may be partial).
            holder = max((h for h, _ in best), key=lambda h: h.get("token") is not None)
            nonce = next(iter(n for n, g in groups.items() if g is best), None)
            out[key] = {
                "key": key,
                "nonce": nonce if nonce and not nonce.startswith("raw:") else None,
                "holder": holder,
                "ttl_ms": min(p for _, p in best),
                "agreeing": len(best),
                "masters": len(self.nodes),
            }
        return out

    def force_release(self, key: str, nonce: str) -> int:
        """Delete ``key`` on every master where it is still held by ``nonce``; return on
        how many. For a holder known to be dead (its process was reaped) or an
        operator's forced release: compare-and-delete, so a newer holder's lease is never
        touched, and the caller bumps the fencing token so a late write is rejected."""
        prefix = '{"nonce":"' + nonce + '",'
        rnd = self._broadcast_script(
            "release",
            (key,),
            [prefix],
            lambda result: _Vote(result == 1, "released" if result == 1 else "not held", result),
            deadline=time.monotonic() + self._call_budget,
            need=len(self.nodes),
            wait_all=True,
        )
        self._count("forced_releases")
        return rnd.yes

    def stats(self) -> dict[str, Any]:
        """Counters (attempts, acquired, refused votes, failures, extensions, losses,
        releases), acquire latency (count/mean/p50/p99/max seconds) and per-master calls,
        errors, timeouts and latency."""
        with self._stats_lock:
            st = self._stats
            samples = sorted(st.acquire_latencies)
            n = st.counters.get("acquired", 0)
            latency = {
                "count": n,
                "mean": st.acquire_latency_total / n if n else 0.0,
                "p50": samples[len(samples) // 2] if samples else 0.0,
                "p99": samples[min(len(samples) - 1, int(len(samples) * 0.99))] if samples else 0.0,
                "max": st.acquire_latency_max,
            }
            nodes = {
                node.name: {
                    "calls": node.stats.calls,
                    "errors": node.stats.errors,
                    "timeouts": node.stats.timeouts,
                    "latency_mean": (
                        node.stats.latency_total / node.stats.calls if node.stats.calls else 0.0
                    ),
                    "latency_max": node.stats.latency_max,
                }
                for node in self.nodes
            }
            counters = {
                name: st.counters.get(name, 0)
                for name in (
                    "acquire_attempts",
                    "acquired",
                    "acquire_failures",
                    "refused",
                    "extensions",
                    "extension_failures",
                    "losses",
                    "releases",
                )
            }
            return {**counters, "acquire_latency": latency, "nodes": nodes}

    def close(self) -> None:
        """Stop the thread pool and drop the connections. Held locks simply expire."""
        self._closed = True
        self._pool.shutdown(wait=True, cancel_futures=True)
        for node in self.nodes:
            node.pool.disconnect()

    def __enter__(self) -> Redlock:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


_CANCELLED = _Vote(False, "cancelled", None)


def _after_fork_in_child(ref: weakref.ReferenceType[Redlock]) -> None:
    redlock = ref()
    if redlock is not None and not redlock._closed:
        redlock._after_fork()


def _done(vote: _Vote) -> Future[_Vote]:
    fut: Future[_Vote] = Future()
    fut.set_result(vote)
    return fut


def _forward(answers: queue.SimpleQueue[tuple[int, _Vote]], i: int, fut: Future[_Vote]) -> None:
    answers.put((i, _CANCELLED if fut.cancelled() else fut.result()))


def _judge_any(result: object) -> _Vote:
    return _Vote(True, "ok", result)


def _releaser(keys: tuple[str, ...], prefix: str) -> Callable[[_Node], object]:
    return _script_call("release", keys, [prefix])


def _script_call(
    name: str, keys: tuple[str, ...], args: Sequence[str | int]
) -> Callable[[_Node], object]:
    def call(node: _Node) -> object:
        script: Script = getattr(node, name)
        return script(keys=keys, args=args)

    return call


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
