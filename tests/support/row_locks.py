"""A writer that holds row locks from a second connection while the test reads.

What a fenced chunk write does to the month stamps while it runs: PostgreSQL holds the
rows' locks (``SELECT … FOR UPDATE``); SQLite, where ``select_for_update`` is a no-op,
holds the database's write lock, as every transaction there begins ``IMMEDIATE``
(``dashboard/settings.py``). Used by the analytics tests that check a reader
answers from the stored rows instead of waiting (docs/analytics.md#performance).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from threading import Event
from typing import Any

from django.db import connection, transaction

from tests.support.checked_threads import CheckedThread


@contextmanager
def rows_locked(rows: Any, order: str = "pk") -> Iterator[Callable[[], bool]]:
    """Lock ``rows`` (a queryset, in ``order``, as writers lock them) in a thread of its
    own for the ``with`` block; yields a function telling whether they are still locked
    (the test asserts it after its read: answered while the writer held them). The
    thread is released and joined on leaving, its failure raised."""
    holding, done = Event(), Event()
    released: list[bool] = []

    def writer() -> None:
        try:
            with transaction.atomic():
                list(rows.select_for_update().order_by(order).values_list("pk"))
                holding.set()
                done.wait(120)
            released.append(True)
        finally:
            connection.close()

    thread = CheckedThread(target=writer)
    thread.start()
    try:
        assert holding.wait(60), "the writer never took the locks"
        yield lambda: not released
    finally:
        done.set()
        thread.join()
