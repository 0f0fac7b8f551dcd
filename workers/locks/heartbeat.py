"""The heartbeat: a daemon thread that extends a held lock until told to stop.

Contract:

* The heartbeat thread does no I/O but the extension itself. Observers (``on_extended``)
  run on a separate callback thread fed by a bounded queue: when it is full (an observer is
  stuck on a stalled Redis, say) new notifications are dropped and counted, never waited
  for. ``on_lost`` runs on its own one-shot thread, so a stuck observer cannot delay the
  abort either.
* Every wake-up is placed on the lease, not after the previous wake-up: right after the
  lock was acquired or extended, the next extension is due at
  ``now + min(ttl / 3, valid_for() / 2)`` and the thread waits for that instant, so time
  spent anywhere else can never push an extension past the lease's end.
* One failed extension sets ``lock.lost`` and calls ``on_lost`` (an extension keeps retrying
  rounds until only its safety margin of validity is left, see ``Redlock._extend``).
* ``stop()`` is bounded: it never waits longer than the extension in flight can take.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

log = logging.getLogger("workers.locks")


class Counts(Protocol):
    def count(self, name: str, n: int = 1) -> None: ...


class Beating(Protocol):
    """What a heartbeat needs of the lock it extends (``workers.locks.lock.Lock``), named
    here so this module does not import the lock that imports it."""

    keys: tuple[str, ...]
    ttl: float
    lost: threading.Event

    @property
    def redlock(self) -> Counts: ...

    @property
    def released(self) -> bool: ...

    def valid_for(self) -> float: ...

    def extend(self, ttl: float | None = None) -> None: ...


L = TypeVar("L", bound=Beating)
T = TypeVar("T")

#: ``on_lost`` / ``on_extended``: called with the lock, on the callback thread.
Callback = Callable[[L], object]

#: Notifications waiting for the callback thread; more are dropped (they only say "extended").
QUEUE_SIZE = 8


def first_wait(ttl: float, valid_for: float) -> float:
    """Seconds from now to the next extension: a third of the TTL, or half of what is left
    of the lease if that is sooner (a lock handed out with little validity left)."""
    return max(0.0, min(ttl / 3.0, valid_for / 2.0))


class Heartbeat(Generic[L]):
    """Extends ``lock`` from a daemon thread; see the module docstring."""

    def __init__(
        self, lock: L, on_lost: Callback[L] | None, on_extended: Callback[L] | None
    ) -> None:
        self._lock = lock
        self._on_lost = on_lost
        self._on_extended = on_extended
        self._stop = threading.Event()
        self._calls: queue.Queue[Callback[L] | None] = queue.Queue(maxsize=QUEUE_SIZE)
        self._thread = threading.Thread(
            target=self._run, name=f"redlock-heartbeat:{lock.keys[0]}", daemon=True
        )
        self._callback_thread: threading.Thread | None = None
        self.dropped = 0  # notifications dropped because the callback thread was behind

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> bool:
        """Stop extending; return whether the heartbeat thread ended within its bound.

        The thread is either waiting (it wakes at once) or inside one extension, which ends
        by the lease's validity; the bound is that validity plus a little. Notifications not
        yet delivered are discarded; a callback still running is not waited for.
        """
        self._stop.set()
        with_calls = self._callback_thread
        if with_calls is not None:
            _put_nowait(self._calls, None)
        if self._thread is threading.current_thread() or not self._thread.is_alive():
            return True
        bound = min(self._lock.ttl, self._lock.valid_for()) + 0.25
        self._thread.join(timeout=bound)
        if self._thread.is_alive():
            log.warning(
                "redlock: heartbeat of %s did not stop within %.2fs", self._lock.keys, bound
            )
            return False
        return True

    def _run(self) -> None:
        lock = self._lock
        wake_at = time.monotonic() + first_wait(lock.ttl, lock.valid_for())
        while not self._stop.wait(max(0.0, wake_at - time.monotonic())):
            try:
                lock.extend(lock.ttl)
            except Exception as exc:  # LockLost, or anything unexpected: fail safe
                if lock.released:
                    # The owner released the lock itself between our wake-up and the extend
                    # (extend and release are serialised by the lock's mutex): nothing lost.
                    return
                self._lost(exc)
                return
            # Anchored on the lease just renewed: its end minus what we keep in hand.
            wake_at = time.monotonic() + first_wait(lock.ttl, lock.valid_for())
            if self._on_extended is not None:
                self._notify(self._on_extended)

    def _notify(self, callback: Callback[L]) -> None:
        if self._callback_thread is None:
            self._callback_thread = threading.Thread(
                target=self._deliver,
                name=f"redlock-callbacks:{self._lock.keys[0]}",
                daemon=True,
            )
            self._callback_thread.start()
        if not _put_nowait(self._calls, callback):
            # Race: the callback thread is stuck (or slow) in an earlier observer. Dropping is
            # safe because every notification says the same thing ("extended"; the observer
            # reads the lock's current state) and the next one will say it again.
            self.dropped += 1
            self._lock.redlock.count("callbacks_dropped")

    def _deliver(self) -> None:
        while True:
            callback = self._calls.get()
            if callback is None or self._stop.is_set():
                return
            try:
                callback(self._lock)
            except Exception:  # an observer must never cost us the lease
                log.exception("redlock: on_extended callback failed for %s", list(self._lock.keys))

    def _lost(self, exc: BaseException) -> None:
        lock = self._lock
        lock.lost.set()
        lock.redlock.count("losses")
        log.warning("redlock: lost %s: %s", list(lock.keys), exc)
        if self._on_lost is None:
            return
        on_lost = self._on_lost

        def abort() -> None:
            try:
                on_lost(lock)
            except Exception:
                log.exception("redlock: on_lost callback failed for %s", list(lock.keys))

        # Its own thread: the abort (killing git) must not wait behind a stuck observer, and
        # whatever I/O the hook does after that is off the heartbeat too.
        threading.Thread(target=abort, name=f"redlock-on-lost:{lock.keys[0]}", daemon=True).start()


def _put_nowait(q: queue.Queue[T], item: T) -> bool:
    try:
        q.put_nowait(item)
    except queue.Full:
        return False
    return True
