"""Django's HTTP requests under ASGI: the whole request on one thread in one hop
(:class:`SyncChainASGIHandler`), on reused threads instead of a new thread each
(:class:`PooledASGIHandler`).

Django's ``ASGIHandler`` loads its middleware in async mode. Every middleware here is
synchronous (Django's own and ours), so Django adapts the chain: the outer middleware
run on the request's thread, then hand the rest back to the event loop
(``async_to_sync`` around the async inner handler), which sends the view to the thread
again, and the response travels back the same way — four crossings between the thread
and the event loop per request, each a wait for a loop that is also serving every
websocket of the process. Sampled under the load test on PostgreSQL (py-spy with idle
frames, one web process), the request threads spent 42 % of their time parked in
those crossings, holding their pooled database connection (taken by the session
middleware) meanwhile, so other requests waited for a connection as well (11 %).
:class:`SyncChainASGIHandler` loads the chain in sync mode, as Django's WSGI handler
does, and runs all of it (middleware, view, template) in one ``sync_to_async`` call on
the request's thread: one crossing in, one out. The same middleware and view code runs
in the same order with the same request; only the thread hopping is gone.

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
whose web processes draw connections from a pool (``dashboard/infra/dbpool.py``), nor for the
workers, which must fork with no SQLite connection open (``workers/pool.py``).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.core.handlers import base
from django.core.handlers.asgi import ASGIHandler
from django.db import close_old_connections
from django.http import HttpRequest, HttpResponseBase

from dashboard.observability import HTTP_REQUEST_SECONDS, observe

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


class SyncChainASGIHandler(ASGIHandler):
    """``ASGIHandler`` whose middleware chain is loaded in sync mode and run, with the
    view, in one call on the request's thread (see the module docstring). Every view
    of this project is synchronous; an async one would still work (Django's sync chain
    runs it with ``async_to_sync``), only without the saving."""

    def __init__(self) -> None:
        base.BaseHandler.__init__(self)  # not ASGIHandler's: it loads the async chain
        self.load_middleware(is_async=False)

    def get_response(self, request: HttpRequest) -> HttpResponseBase:
        response = super().get_response(request)
        # Hand the request's database connections back (to the pool on PostgreSQL; an
        # SQLite one is kept, ``CONN_MAX_AGE``) here, on the request's thread, before
        # the response goes to the event loop to be sent: Django does it at
        # ``response.close()``, after the send and one more hop, holding a pool slot
        # all that time. The same rule as Django's (``close_old_connections``); that
        # later call finds nothing left to hand back. A streaming body that queries
        # while it is sent takes a connection again, which that call then returns.
        close_old_connections()
        return response

    async def get_response_async(self, request: HttpRequest) -> HttpResponseBase:
        # thread_sensitive: the request's own thread (its ThreadSensitiveContext), where
        # Django's response.close() and request_finished run afterwards, as before.
        began = time.monotonic()
        response = await sync_to_async(self.get_response, thread_sensitive=True)(request)
        # The server's share of the latency a client sees (the rest: the event loop,
        # the kernel, the network, the client), so the load test can tell them apart.
        # In memory only (dashboard.observability.counters): no I/O on the way out.
        match = getattr(request, "resolver_match", None)
        observe(
            HTTP_REQUEST_SECONDS,
            time.monotonic() - began,
            view=(match.url_name or match.view_name) if match is not None else "unmatched",
        )
        return response


class PooledASGIHandler(SyncChainASGIHandler):
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
