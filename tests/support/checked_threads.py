"""Threads whose failure is the test's failure.

A plain ``threading.Thread`` whose target raises (an ``assert`` included) only hands the
exception to ``threading.excepthook``: pytest turns it into a warning and the test
passes. A ``CheckedThread`` keeps what its target raised and raises it again in the
thread that calls ``join()`` (once the thread has ended) or ``check()``; the test then
fails with the thread's own traceback.

A failure nobody joined or checked is not lost either: ``unreported()`` lists it, and
an autouse fixture in ``tests/conftest.py`` fails the test that left it behind.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

#: Held strongly: a failed thread the test dropped without joining is still reported.
_UNREPORTED: set[CheckedThread] = set()
_GUARD = threading.Lock()


class CheckedThread(threading.Thread):
    """A ``threading.Thread`` that re-raises its target's exception in the joiner.

    ``join(timeout)`` has the usual meaning (it returns with the thread still alive if
    the timeout passed: check ``is_alive()``); once the thread has ended it raises what
    the target raised, ``BaseException`` included (``SystemExit``, ``KeyboardInterrupt``,
    which a plain thread drops silently). The exception is raised once: a second
    ``join()`` or ``check()`` returns normally.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            super().run()
        except BaseException as exc:  # kept for the joiner, never left to excepthook
            exc.add_note(f"(raised in thread {self.name!r}, re-raised by CheckedThread)")
            self.error = exc
            with _GUARD:
                _UNREPORTED.add(self)

    def check(self) -> None:
        """Raise what the target raised, if it has raised (the thread may still run)."""
        with _GUARD:
            error, self.error = self.error, None
            _UNREPORTED.discard(self)
        if error is not None:
            raise error

    def join(self, timeout: float | None = None) -> None:
        super().join(timeout)
        if not self.is_alive():
            self.check()


def at_once(target: Callable[[int], T], n: int) -> list[T]:
    """Call ``target(0)`` … ``target(n - 1)`` in ``n`` checked threads released together
    by one barrier (the race under test starts in all of them at once); each closes its
    own database connection at the end. Returns the results in index order and raises
    what any of them raised."""
    from django.db import connection

    barrier = threading.Barrier(n)
    got: dict[int, T] = {}

    def run(k: int) -> None:
        try:
            barrier.wait()
            got[k] = target(k)
        finally:
            connection.close()

    threads = [CheckedThread(target=run, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [got[k] for k in range(n)]


def unreported() -> list[tuple[str, BaseException]]:
    """Failures of checked threads that no ``join()``/``check()`` has raised yet, and
    forget them (each is reported once)."""
    with _GUARD:
        found = [(t.name, t.error) for t in list(_UNREPORTED) if t.error is not None]
        for thread in list(_UNREPORTED):
            thread.error = None
        _UNREPORTED.clear()
    return found
