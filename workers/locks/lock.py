"""A held lease (``Lock``): its validity clock, and extend/release serialised by a mutex."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Protocol

import redis

from workers.locks.errors import LockError, LockLost, LockNotOwned
from workers.locks.heartbeat import Callback, Heartbeat


class Keeper(Protocol):
    """What a lock needs of the Redlock that handed it out (``workers.locks.algorithm
    .Redlock``), named here so this module does not import the algorithm that imports it."""

    def _extend(self, lock: Lock, ttl: float) -> None: ...

    def _release(self, lock: Lock) -> None: ...

    def count(self, name: str, n: int = 1) -> None: ...


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
        redlock: Keeper,
        keys: tuple[str, ...],
        *,
        ttl: float,
        nonce: str,
        prefix: str,
        holder: dict[str, Any],
        valid_until: float,
        tokens: dict[str, int],
    ) -> None:
        self.redlock = redlock
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
        self._heartbeat: Heartbeat[Lock] | None = None

    @property
    def key(self) -> str:
        return self.keys[0]

    @property
    def prefix(self) -> str:
        """The CAS prefix of our stored value (``{"nonce":"…",``)."""
        return self._prefix

    @property
    def released(self) -> bool:
        return self._released

    @property
    def valid_until(self) -> float:
        """Monotonic instant the lease ends (client side, drift already deducted)."""
        return self._valid_until

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

        Rounds are retried (a slow or briefly unreachable master) until only the safety
        margin of validity is left. Raises :class:`LockNotOwned` when a majority no longer
        holds our value, and :class:`LockLost` when no round reached a quorum in time. Either
        way ``lost`` is set: a failed extension is treated as a lost lock.
        """
        new_ttl = self.ttl if ttl is None else float(ttl)
        # The mutex serialises extend against release and against the heartbeat: without it
        # a release could land between our compare and our PEXPIRE on one master and make a
        # successful release look like a lost lock.
        with self._mutex:
            self.check()
            self.redlock._extend(self, new_ttl)

    def _extended(self, *, valid_until: float, ttl: float) -> None:
        """Record a successful extension (called by ``Redlock._extend`` under the mutex)."""
        self._valid_until = valid_until
        self.ttl = ttl
        self.extensions += 1

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
            self.redlock._release(self)

    # Heartbeat -----------------------------------------------------------------------

    def _start_heartbeat(
        self, on_lost: Callback[Lock] | None, on_extended: Callback[Lock] | None = None
    ) -> None:
        self._heartbeat = Heartbeat(self, on_lost, on_extended)
        self._heartbeat.start()

    def _stop_heartbeat(self) -> bool:
        """Stop the heartbeat (bounded wait); whether it ended in time."""
        return self._heartbeat.stop() if self._heartbeat is not None else True

    def __enter__(self) -> Lock:
        return self

    def __exit__(self, *exc_info: object) -> None:
        with contextlib.suppress(LockError, redis.RedisError):
            self.release()
