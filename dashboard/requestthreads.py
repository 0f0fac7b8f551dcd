"""Django's HTTP requests under ASGI on reused threads instead of a new thread each.

Django's ``ASGIHandler`` enters a fresh ``ThreadSensitiveContext`` per request, and
asgiref gives each such context a new one-thread executor: every request started a
thread for its sync middleware and view and joined it at the end (``Thread.start`` and
the join were in every request's profile: bench/webcost.py). :class:`PooledASGIHandler`
enters the same kind of context, but with an executor taken from a pool of idle
one-thread executors (asgiref's ``ThreadSensitiveContext(executor=…)``, whose caller
owns the executor), and puts it back when the request is done. What a request sees is
unchanged: its sync code runs on one thread of its own, one request per thread at a
time, requests of one process still overlap (a request waiting on the database or Redis
holds only its own thread), and nothing of a request's context outlives it (Django's
connections and our context variables are per context, not per thread; Django closes
the request's database connection at its end as before).

At most ``IDLE_LIMIT`` executors wait idle; one more is shut down when it comes back
(a burst of concurrent requests makes the pool grow, the quiet after it shrinks it).

On SQLite a request thread now also keeps its database connection for the next request
it serves (``CONN_MAX_AGE`` = ``SQLITE_CONN_MAX_AGE``, set by ``dashboard.asgi.serving`` in
the web processes ``manage.py up`` runs, and in no other process), rather than
opening the file, running the connection's pragmas and registering Django's SQL
functions for every request. Django's own rules still close it at a request's end when
it is unusable, left a transaction open, or is older than that. Not for PostgreSQL,
whose web processes draw connections from a pool (``dashboard/dbpool.py``), nor for the
workers, which must fork with no SQLite connection open (``workers/pool.py``).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import ThreadSensitiveContext
from django.core.handlers.asgi import ASGIHandler

#: Idle one-thread executors kept for the next requests.
IDLE_LIMIT = 16
#: Seconds a request thread may keep its SQLite connection between requests.
SQLITE_CONN_MAX_AGE = 60

_idle: list[ThreadPoolExecutor] = []
_lock = threading.Lock()


def take_executor() -> ThreadPoolExecutor:
    """An idle one-thread executor, or a new one (its thread starts on first use)."""
    with _lock:
        if _idle:
            return _idle.pop()
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="request")


def give_back(executor: ThreadPoolExecutor) -> None:
    """Return an executor whose request is done (its thread is idle: the request's
    context has exited, and asgiref lets no call in after that)."""
    with _lock:
        if len(_idle) < IDLE_LIMIT:
            _idle.append(executor)
            return
    executor.shutdown(wait=False)


def idle_executors() -> int:
    with _lock:
        return len(_idle)


def keep_sqlite_connections(databases: dict[str, dict[str, Any]]) -> None:
    """Persistent connections (``SQLITE_CONN_MAX_AGE``) for every SQLite database of
    ``databases`` (``settings.DATABASES``: the dicts Django's connections read)."""
    for conf in databases.values():
        if conf.get("ENGINE") == "django.db.backends.sqlite3":
            conf["CONN_MAX_AGE"] = SQLITE_CONN_MAX_AGE


class PooledASGIHandler(ASGIHandler):
    """``ASGIHandler`` whose requests run their sync code on pooled threads.

    Race: executors are taken and given back under ``_lock``, so no two requests ever
    hold the same one; a request's thread-sensitive calls run one at a time on it (the
    executor has one worker), as on the per-request thread before. A request cancelled
    mid-view (the client went away) may give its executor back while the view still
    runs on its thread: the next request's calls then queue behind it on that one
    worker, never beside it."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":  # as ASGIHandler
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        executor = take_executor()
        try:
            async with ThreadSensitiveContext(executor=executor):
                await self.handle(scope, receive, send)
        finally:
            give_back(executor)
