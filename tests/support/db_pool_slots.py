"""Slots of this test process's PostgreSQL pool that something other than the main
thread has taken and not given back (dashboard/infra/dbpool.py).

A thread that queries takes a pooled connection and keeps it until it closes it (Django
does for requests, Channels for ``database_sync_to_async``, our own background threads
with ``close_thread_connections``). One that never does holds the slot for the life of
the process, and one that ends holding it loses the slot for good: psycopg's pool
counts a connection out until ``putconn``, and a connection dropped with its thread is
never put back (psycopg warns about an unclosed connection, but not about a pooled one).
Leaks add up over the suite: 6 of the 8 slots were gone by test_lifecycle, and a run
that leaked two more waited out the pool timeout in every later test. The main thread's
own connection (the test's transaction, kept across tests by pytest-django) is not
counted.

Two harness parts keep connections on purpose, for the test's transaction: Channels'
``ApplicationCommunicator`` (``WebsocketCommunicator``) turns off the
``close_old_connections`` of ``database_sync_to_async``, and Django's ``AsyncClient``
the one at the end of a request. Both run sync code on asgiref's one thread for
thread-sensitive calls outside any ``async_to_sync`` (shared by every test of the
process); ``hand_back_asgi_thread`` closes what that thread kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connections

from dashboard.infra.dbpool import close_thread_connections


def pool() -> Any | None:
    """The default database's psycopg pool if this process has opened one (reading
    ``connections["default"].pool`` would open it), else None (SQLite, no pool)."""
    pools = getattr(type(connections["default"]), "_connection_pools", None)
    return None if pools is None else pools.get("default")


def pool_settings() -> tuple[Any, Any]:
    """The default database's pool option and health-check flag, as the process's new
    connections read them."""
    default = settings.DATABASES["default"]
    return default.get("OPTIONS", {}).get("pool"), default.get("CONN_HEALTH_CHECKS")


def restore_pool_settings(saved: tuple[Any, Any]) -> bool:
    """Put ``pool_settings()`` back as ``saved`` (closing this thread's connections, so
    the next query opens one as they say); True if they had changed. A worker run in the
    test process (``workers.pool.run_one_worker`` calls
    ``dashboard.infra.use_direct_connections``) turns the pool off for the rest of the
    process: every later test then ran on direct connections, and the pool-slot checks
    counted nothing (tests/support/test_harness.py failed under pytest-xdist, where such
    a test could run before it)."""
    if pool_settings() == saved:
        return False
    pool, health = saved
    default = settings.DATABASES["default"]
    options = default.setdefault("OPTIONS", {})
    if pool is None:
        options.pop("pool", None)
    else:
        options["pool"] = pool
    default["CONN_HEALTH_CHECKS"] = health
    for conn in connections.all(initialized_only=True):
        if not conn.in_atomic_block:
            conn.close()
    return True


def taken_by_others(of: Any) -> int:
    """Connections of pool ``of`` lent out to threads other than the calling one (call it
    from the main thread). Race: a connection being added for a waiting thread counts
    from the moment the pool decides to add it; polled, the figure settles."""
    stats = of.get_stats()
    lent = int(stats.get("pool_size", 0)) - int(stats.get("pool_available", 0))
    mine = connections["default"].connection
    return lent - (1 if mine is not None and getattr(mine, "_pool", None) is of else 0)


def hand_back_asgi_thread(*, grace: float) -> None:
    """Close the connections asgiref's thread-sensitive thread kept (see the module
    docstring). Outside any event loop, a thread-sensitive ``sync_to_async`` runs on
    that very thread; if it is still busy with the test's work after ``grace`` seconds
    it keeps them (and the caller's count says so)."""

    async def hand_back() -> None:
        with contextlib.suppress(TimeoutError):
            closing = sync_to_async(close_thread_connections, thread_sensitive=True)
            await asyncio.wait_for(closing(), grace)

    asyncio.run(hand_back())


def slots_left(of: Any, *, before: int, grace: float) -> int:
    """Slots taken by other threads above ``before``, once they have had ``grace``
    seconds to give them back (0 as soon as they have)."""
    deadline = time.monotonic() + grace
    while True:
        left = taken_by_others(of) - before
        if left <= 0 or time.monotonic() >= deadline:
            return max(left, 0)
        time.sleep(0.05)


class StartedThreads:
    """Names of the threads started between ``start()`` and ``stop()``, those that have
    ended too (a thread that ended holding a connection is the usual culprit). Each new
    thread runs the ``threading.setprofile`` hook once, which notes it and removes itself
    from that thread."""

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []
        self._previous: Any = None

    def _note(self, frame: Any, event: str, arg: Any) -> None:
        self.threads.append(threading.current_thread())  # list.append: atomic
        sys.setprofile(None)

    def start(self) -> None:
        self._previous = threading.getprofile()
        threading.setprofile(self._note)

    def stop(self) -> None:
        threading.setprofile(self._previous)

    def describe(self) -> str:
        alive = [t.name for t in self.threads if t.is_alive()]
        ended = [t.name for t in self.threads if not t.is_alive()]
        older = [
            t.name
            for t in threading.enumerate()
            if t is not threading.main_thread() and t not in self.threads
        ]
        return (
            f"threads it started, still running: {alive or 'none'}; ended: {ended or 'none'}"
            f"; older threads: {older or 'none'}"
        )
