"""Keep a process's background threads out of the way of ``os.fork()``.

A worker process forks a work horse per job (RQ) while its heartbeat thread talks to the
database and Redis. ``fork()`` copies only the forking thread: if another thread was
inside SQLite (or any C library with a global mutex, such as its allocator) at that
moment, the child inherits that mutex locked, and the child's first query blocks on it
for ever (seen under load: a work horse hung in SQLite's allocator, kept alive by RQ's
own job heartbeat, so nothing noticed until the job timeout).

``ForkGuard`` is a lock the background thread holds around each unit of work; installed
with ``os.register_at_fork``, every ``os.fork()`` in the process first takes it, so a
fork happens only between two units of work, never inside one. ``subprocess`` does not
run at-fork handlers (it execs at once), so git and other children are unaffected.
"""

from __future__ import annotations

import os
import threading
from types import TracebackType


class ForkGuard:
    """A lock that ``os.fork()`` waits for once :meth:`install` has run."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._installed = False

    def install(self) -> ForkGuard:
        """Register the at-fork hooks (once; they cannot be unregistered)."""
        if not self._installed:
            os.register_at_fork(
                before=self._lock.acquire,
                after_in_parent=self._lock.release,
                after_in_child=self._reset,
            )
            self._installed = True
        return self

    def _reset(self) -> None:
        # The child's copy is held by the forking thread (now the child's only thread):
        # a fresh lock is simpler than reasoning about who releases the copy.
        self._lock = threading.Lock()

    def __enter__(self) -> ForkGuard:
        self._lock.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._lock.release()
