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
from typing import Any

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


def unreported() -> list[tuple[str, BaseException]]:
    """Failures of checked threads that no ``join()``/``check()`` has raised yet, and
    forget them (each is reported once)."""
    with _GUARD:
        found = [(t.name, t.error) for t in list(_UNREPORTED) if t.error is not None]
        for thread in list(_UNREPORTED):
            thread.error = None
        _UNREPORTED.clear()
    return found
