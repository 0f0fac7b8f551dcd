"""Database connections per process: the PostgreSQL pool of a web process, direct
connections for workers, and nothing shared across ``fork``.

A web process on PostgreSQL draws its connections from one psycopg pool
(``GITWARD_DB_POOL_SIZE``, Django's ``OPTIONS["pool"]``): Django gives each in-flight
request a thread of its own, and without the pool each opened a connection (a server
backend forked per request) and held it to the end of the request, so 200 browsing users
on two web processes held ~200 connections and PostgreSQL (``max_connections`` 100)
refused the rest — "too many clients already", a 500 on every page. With the pool a
process holds at most that many; a request that finds them all taken waits up to
``GITWARD_DB_POOL_TIMEOUT`` for one (then a 503, ``dashboard.middleware``), and a
connection goes back to the pool at the end of each request (Django's
``close_old_connections`` on ``request_finished``), of each Channels
``database_sync_to_async`` call, and of each round of our own background threads (each
closes its own: see ``close_thread_connections``).

Workers use direct connections (``use_direct_connections``): RQ forks a work horse per
job, and a pool's connections and its filler threads must not cross a fork. Any forked
child (a work horse, or whatever else forks) forgets the connections and pools it
inherited without closing them (``_after_fork_in_child``): closing would send the
server a Terminate on the parent's socket and end the parent's session; psycopg itself
leaves a connection made by another process alone when it is garbage-collected, and
the inherited objects are kept referenced here so that they never are.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from django.conf import settings
from django.db import connections

#: What a forked child inherited and must neither use nor close (see the docstring).
_INHERITED: list[Any] = []


def pool_enabled() -> bool:
    """Whether this process draws its PostgreSQL connections from a pool."""
    return bool(settings.DATABASES["default"].get("OPTIONS", {}).get("pool"))


def use_direct_connections() -> None:
    """From now on this process opens its own connections (no pool): for workers,
    whose work horses are forked. Call before the process's first query; a pool already
    opened here is closed (this process made it, so its connections are its own)."""
    options = settings.DATABASES["default"].get("OPTIONS", {})
    if not options.pop("pool", None):
        return
    settings.DATABASES["default"]["CONN_HEALTH_CHECKS"] = False
    for conn in connections.all(initialized_only=True):
        conn.close()
        close_pool = getattr(conn, "close_pool", None)
        if close_pool is not None:
            close_pool()


def close_thread_connections() -> None:
    """Hand back this thread's connections (to the pool, or closed): for threads of
    our own that query outside a request, at the end of each round. Django only does it
    for requests and Channels for ``database_sync_to_async``; a thread that kept one
    would hold a pool slot for ever. Not inside a transaction, whose connection must stay."""
    for conn in connections.all(initialized_only=True):
        if not conn.in_atomic_block:
            conn.close()


def _after_fork_in_child() -> None:
    """In a forked child: forget the parent's connections and pools (never close them:
    see the module docstring) and use direct connections of its own."""
    for conn in connections.all(initialized_only=True):
        if conn.connection is not None:
            _INHERITED.append(conn.connection)
            conn.connection = None
        conn.in_atomic_block = False
        conn.savepoint_ids = []
        conn.needs_rollback = False
    backend = sys.modules.get("django.db.backends.postgresql.base")
    if backend is not None:
        pools = backend.DatabaseWrapper._connection_pools
        _INHERITED.extend(pools.values())
        pools.clear()
    options = settings.DATABASES["default"].get("OPTIONS", {})
    if options.pop("pool", None):
        settings.DATABASES["default"]["CONN_HEALTH_CHECKS"] = False
    if "application_name" in options:
        options["application_name"] = application_name()


def application_name() -> str:
    """What ``pg_stat_activity.application_name`` shows for this process's connections:
    which process holds them (``gitward 1234 up``, ``gitward 2345 worker``)."""
    command = next((a for a in sys.argv[1:] if not a.startswith("-")), "")
    return f"gitward {os.getpid()} {command}".strip()[:63]


os.register_at_fork(after_in_child=_after_fork_in_child)
