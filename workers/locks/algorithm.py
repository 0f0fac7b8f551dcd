"""The Redlock algorithm: acquire, extend and release by quorum, and the held context.

Fencing (docs/locks.md): ``token_source(key, confirm)`` issues the next token for ``key``
from the database counter. It must call ``confirm(token)`` inside the transaction that
increments the counter, before committing: ``confirm`` writes the token into our stored
value on a quorum of masters, by compare-and-set on our nonce, within the lease's validity,
and raises :class:`LockLost` otherwise (the source then rolls back). So only a lock Redis
still agrees we hold can advance the counter, and a token fetched too late is never
committed: it cannot fence out the holder that acquired meanwhile.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import secrets
import socket
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import redis

from workers.locks import inspection
from workers.locks.errors import LockError, LockLost, LockNotAcquired, LockNotOwned
from workers.locks.heartbeat import Callback
from workers.locks.lock import Lock
from workers.locks.masters import Round, Vote, judge_any
from workers.locks.scripts import encode
from workers.locks.stats import Metrics
from workers.locks.transport import Transport

log = logging.getLogger("workers.locks")

#: ``token_source(key, confirm) -> token``; see the module docstring.
TokenSource = Callable[[str, Callable[[int], None]], int]


class Redlock:
    """Client for N independent Redis masters (URLs or ``redis.Redis`` clients).

    ``retry_count`` retries after the first attempt, each after ``retry_delay ±
    retry_jitter`` seconds (uniform). ``min_validity`` is the fraction of the TTL that must
    still be valid when ``acquire`` returns (after the token fetch); an attempt left with
    less is released and counts as failed.
    """

    def __init__(
        self,
        masters: Sequence[str | redis.Redis],
        *,
        retry_count: int = 3,
        retry_delay: float = 0.2,
        retry_jitter: float = 0.1,
        drift_factor: float = 0.01,
        node_timeout: float = 0.05,
        token_source: TokenSource | None = None,
        min_validity: float = 0.25,
        max_workers: int | None = None,
    ) -> None:
        if not masters:
            raise ValueError("Redlock needs at least one master")
        if not 0 <= drift_factor < 1:
            raise ValueError("drift_factor must be in [0, 1)")
        if not 0 <= min_validity < 1:
            raise ValueError("min_validity must be a fraction of the TTL in [0, 1)")
        self.transport = Transport(masters, node_timeout=node_timeout, max_workers=max_workers)
        self.nodes = self.transport.nodes
        self.quorum = len(self.nodes) // 2 + 1
        self.retry_count = retry_count
        self.retry_delay = retry_delay
        self.retry_jitter = retry_jitter
        self.drift_factor = drift_factor
        self.node_timeout = node_timeout
        self.token_source = token_source
        self.min_validity = min_validity
        self.metrics = Metrics()

    def count(self, name: str, n: int = 1) -> None:
        """Add ``n`` to counter ``name`` (see ``stats``)."""
        self.metrics.count(name, n)

    def _drift(self, ttl: float) -> float:
        return ttl * self.drift_factor + 0.002

    def extend_margin(self, ttl: float) -> float:
        """Validity kept in hand when an extension gives up: the abort (killing git) must
        happen while the lease still holds."""
        return max(2 * self.node_timeout, ttl / 10)

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
           A quorum with validity > 0 goes on to step 5; anything else fails the attempt.
        5. With a ``token_source``, fetch one token per key; each is confirmed (written into
           our value on a quorum, within the validity) inside the counter's transaction, see
           the module docstring. A source error or a failed confirmation fails the attempt.
        6. The lock is ours if at least ``min_validity · ttl`` of validity is left.
        7. A failed attempt is released everywhere: masters that answered now (waited for),
           masters whose SET is still pending by a release written behind it on the same
           connection. Sleep ``retry_delay ± jitter`` and retry with a new nonce, up to
           ``retry_count`` times.
        8. Raise :class:`LockNotAcquired` with each master's answer on the last attempt.
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
            self.count("acquire_attempts")
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
            value, prefix = encode(nonce, info)
            t0 = time.monotonic()
            valid_until = t0 + ttl - drift
            # keep_late: a master still silent when the outcome is decided keeps its
            # connection open, so a failed attempt can queue the release behind its SET.
            rnd = self.transport.broadcast_script(
                "acquire",
                key_list,
                [value, ttl_ms, prefix],
                _judge_acquire,
                deadline=valid_until,
                need=self.quorum,
                keep_late=True,
            )
            self.count("refused", sum(1 for v in rnd.votes.values() if v.reason == "refused: held"))
            reasons = self.transport.reasons(rnd)
            if rnd.yes >= self.quorum and time.monotonic() < valid_until:
                try:
                    tokens = self._fetch_tokens(key_list, nonce, prefix, info, valid_until)
                except LockLost as exc:  # the confirmation found the lease gone
                    log.warning("redlock: no confirmed token for %s: %s", key_list, exc)
                    reasons = {**reasons, "validity": f"lost while fetching the token: {exc}"}
                except Exception as exc:
                    log.warning("redlock: token_source failed for %s: %s", key_list, exc)
                    reasons = {**reasons, "token_source": f"error: {exc}"}
                else:
                    left = valid_until - time.monotonic()
                    if left >= self.min_validity * ttl:
                        self.transport.settle_late(rnd, release=None, until=time.monotonic() + ttl)
                        lock = Lock(
                            self,
                            key_list,
                            ttl=ttl,
                            nonce=nonce,
                            prefix=prefix,
                            holder={**info, "token": tokens.get(key_list[0])},
                            valid_until=valid_until,
                            tokens=tokens,
                        )
                        lock.agreeing = rnd.yes
                        self.metrics.record_acquired(time.monotonic() - started)
                        return lock
                    reasons = {
                        **reasons,
                        "validity": f"only {max(0.0, left):.3f}s left after the quorum and "
                        f"token (minimum {self.min_validity * ttl:.3f}s)",
                    }
            elif rnd.yes >= self.quorum:
                reasons = {**reasons, "validity": "expired during the attempt"}
            if attempt == self.retry_count:
                # Final failure: wait (briefly) for masters we stopped listening to once the
                # outcome was decided, so the error names what every master answered.
                self.transport.collect_late(rnd, _judge_acquire, wait=self.node_timeout)
                reasons = {**reasons, **self.transport.reasons(rnd, settle=True)}
            self._unlock_after(rnd, key_list, prefix, ttl)
        self.count("acquire_failures")
        raise LockNotAcquired(key_list, reasons, attempts)

    def _fetch_tokens(
        self,
        keys: tuple[str, ...],
        nonce: str,
        prefix: str,
        info: Mapping[str, Any],
        valid_until: float,
    ) -> dict[str, int]:
        source = self.token_source
        if source is None:
            return {}
        tokens: dict[str, int] = {}
        for key in keys:
            confirmed: list[int] = []

            def confirm(token: int, key: str = key, confirmed: list[int] = confirmed) -> None:
                self._confirm(key, int(token), nonce, prefix, info, valid_until)
                confirmed.append(int(token))

            token = int(source(key, confirm))
            if token not in confirmed:
                # A source that did not confirm inside its transaction: confirm now. This still
                # refuses a lock Redis no longer agrees on, but cannot undo the counter bump.
                confirm(token)
            tokens[key] = token
        return tokens

    def _confirm(
        self,
        key: str,
        token: int,
        nonce: str,
        prefix: str,
        info: Mapping[str, Any],
        valid_until: float,
    ) -> None:
        """Write ``token`` into our value of ``key`` on a quorum, within the validity, or
        raise :class:`LockLost`.

        Race: the token source holds the counter's row lock while this runs. If it succeeds,
        a quorum held our value at a moment inside our lease, so any later holder acquired
        after that moment and its counter increment waits for ours: its token is larger.
        """
        if time.monotonic() >= valid_until:
            raise LockLost(f"lease on {key} lapsed before fencing token {token} was confirmed")
        value, _ = encode(nonce, {**info, "token": token})
        rnd = self.transport.broadcast_script(
            "retag",
            (key,),
            [prefix, value],
            lambda result: Vote(result == 1, "retagged" if result == 1 else "not ours", result),
            deadline=valid_until,
            need=self.quorum,
        )
        if rnd.yes < self.quorum or time.monotonic() >= valid_until:
            detail = "; ".join(f"{k}: {v}" for k, v in self.transport.reasons(rnd).items())
            raise LockLost(f"could not confirm fencing token {token} for {key}: {detail}")

    def _unlock_after(self, rnd: Round, keys: tuple[str, ...], prefix: str, ttl: float) -> None:
        """Release a failed attempt on every master.

        Masters whose acquire is still pending get the release written behind it on the
        same connection (Redis runs them in order, so the SET cannot land after it). All
        others are released now and waited for (briefly), so a caller who sees
        LockNotAcquired finds nothing of ours left behind on them. Only keys holding *this
        attempt's* nonce are deleted, so this never touches a later attempt or another
        client's lock.
        """
        late = set(rnd.late)
        self.transport.settle_late(rnd, release=(keys, prefix), until=time.monotonic() + ttl)
        others = [i for i in range(len(self.nodes)) if i not in late]
        if others:
            self.transport.broadcast_script(
                "release",
                keys,
                [prefix],
                judge_any,
                deadline=time.monotonic() + self.transport.call_budget,
                need=len(others),
                wait_all=True,
                only=others,
            )

    # Extend / release (called by Lock under its mutex) --------------------------------

    def _extend(self, lock: Lock, ttl: float) -> None:
        """Extend ``lock`` by rounds until a quorum agreed, a majority said "not ours", or
        only ``extend_margin`` of validity is left.

        One slow reply or one master briefly unreachable costs a round, not the job: each
        round asks again the masters that have not granted yet (each bounded by the node
        timeout). Validity counts from the first round's start, before any PEXPIRE of any
        round could have been applied, so it stays a lower bound.
        """
        ttl_ms = max(1, int(ttl * 1000))
        t0 = time.monotonic()
        n = len(self.nodes)
        give_up = min(lock.valid_until, max(lock.valid_until - self.extend_margin(lock.ttl), t0))
        granted: set[int] = set()
        not_owner: set[int] = set()
        reasons: dict[str, str] = {}
        while True:
            self.count("extension_rounds")
            asked = [i for i in range(n) if i not in granted and i not in not_owner]
            rnd = self.transport.broadcast_script(
                "extend",
                lock.keys,
                [lock.prefix, ttl_ms],
                _judge_extend,
                deadline=max(give_up, time.monotonic() + self.node_timeout),
                need=self.quorum - len(granted),
                only=asked,
            )
            granted |= {i for i, v in rnd.votes.items() if v.ok}
            not_owner |= {i for i, v in rnd.votes.items() if v.reason == "refused: not owner"}
            reasons = {**reasons, **self.transport.reasons(rnd)}
            now = time.monotonic()
            if len(granted) >= self.quorum and now < lock.valid_until:
                lock._extended(valid_until=t0 + ttl - self._drift(ttl), ttl=ttl)
                self.count("extensions")
                return
            if len(not_owner) > n - self.quorum or now + self.node_timeout >= give_up:
                break
            # Pause before asking again, so refused connections do not spin.
            time.sleep(min(self.node_timeout / 2, max(0.0, give_up - now)))
        lock.lost.set()
        self.count("extension_failures")
        detail = "; ".join(f"{k}: {v}" for k, v in reasons.items())
        if len(not_owner) > n - self.quorum:
            raise LockNotOwned(f"lock on {list(lock.keys)} is no longer ours: {detail}")
        raise LockLost(
            f"could not extend {list(lock.keys)} on a quorum within its validity "
            f"({len(lock.keys)} key(s)): {detail}"
        )

    def _release(self, lock: Lock) -> None:
        n_keys = len(lock.keys)

        def judge(result: object) -> Vote:
            if result == n_keys:
                return Vote(True, "released", result)
            return Vote(False, f"refused: not owner ({result}/{n_keys} keys were ours)", result)

        # Sent to every master and waited for (each call is bounded by the node timeout), so
        # once release() returns no reachable master still shows us as the holder. Releasing
        # a master we never locked is a no-op, so this is always safe.
        rnd = self.transport.broadcast_script(
            "release",
            lock.keys,
            [lock.prefix],
            judge,
            deadline=time.monotonic() + self.transport.call_budget,
            need=self.quorum,
            wait_all=True,
        )
        self.count("releases")
        if rnd.yes < self.quorum:
            reasons = self.transport.reasons(rnd, settle=True)
            detail = "; ".join(f"{k}: {v}" for k, v in reasons.items())
            raise LockNotOwned(f"released {list(lock.keys)} without a quorum: {detail}")

    # Heartbeat-held context ------------------------------------------------------------

    @contextlib.contextmanager
    def hold(
        self,
        keys: str | Sequence[str],
        *,
        ttl: float = 30.0,
        holder: Mapping[str, Any] | None = None,
        on_lost: Callback[Lock] | None = None,
        on_extended: Callback[Lock] | None = None,
    ) -> Iterator[Lock]:
        """Acquire, extend from a heartbeat thread while inside, release on exit.

        The heartbeat (``workers.locks.heartbeat``) extends at ``min(ttl/3, valid_for/2)``
        into each lease. On a failed extension it sets ``lock.lost`` and calls
        ``on_lost(lock)`` on a thread of its own; after each successful one ``on_extended
        (lock)`` runs on the lock's callback thread (an observer: errors are logged, and
        notifications are dropped rather than waited for when it falls behind). On exit the
        heartbeat is stopped (bounded wait) and the lock released (release errors are
        logged, not raised); if the lease was lost before the body finished,
        :class:`LockLost` is raised unless the body is already raising.
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
            held_to_the_end = lock.released or lock.valid_for() > 0
            lock._stop_heartbeat()
            if not lock.released:  # the body may have released it itself
                try:
                    lock.release()
                except (LockError, redis.RedisError) as exc:
                    log.warning("redlock: release of %s failed: %s", list(lock.keys), exc)
        if not body_failed and not held_to_the_end:
            raise LockLost(f"lock on {list(lock.keys)} was lost while held")

    # Introspection and operator calls (workers.locks.inspection) ---------------------------

    def inspect(self, key: str) -> dict[str, Any] | None:
        """Holder, remaining TTL (ms, minimum over the agreeing masters) and how many masters
        agree on the holder (same nonce); ``None`` when no master has the key."""
        return inspection.inspect_many(self.transport, [key]).get(key)

    def list_locks(self, prefix: str = "locks:") -> list[dict[str, Any]]:
        """``inspect()`` of every key under ``prefix`` found by SCAN on any master."""
        return inspection.list_locks(self.transport, prefix)

    def force_release(self, key: str, nonce: str) -> int:
        """Delete ``key`` where ``nonce`` still holds it; return on how many masters."""
        released = inspection.force_release(self.transport, key, nonce)
        self.count("forced_releases")
        return released

    def stats(self) -> dict[str, Any]:
        """Counters, acquire latency and per-master figures (see ``Metrics.snapshot``)."""
        return self.metrics.snapshot(self.transport)

    def close(self) -> None:
        """Stop the threads and drop the connections. Held locks simply expire."""
        self.transport.close()

    def __enter__(self) -> Redlock:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _judge_acquire(result: object) -> Vote:
    if result == 1:
        return Vote(True, "acquired", result)
    if isinstance(result, int) and result < 0:
        return Vote(False, "refused: held", result)
    return Vote(False, f"error: unexpected reply {result!r}", result)


def _judge_extend(result: object) -> Vote:
    if result == 1:
        return Vote(True, "extended", result)
    return Vote(False, "refused: not owner", result)
