"""Is this process able to serve? The checks behind ``GET /readyz`` and ``manage.py ready``.

Ready means all four of:

1. ``database``: the database answers;
2. ``migrations``: every migration is applied (a process started before ``migrate``
   finished would write to tables that do not exist yet);
3. ``lock_quorum``: a strict majority of the Redlock masters (``REDIS_URLS``) answer PING
   within ``timeout`` — the quorum every lock acquisition needs; a minority down is fine;
4. ``queue``: the queue Redis (``REDIS_URL``) answers PING — without it nothing is enqueued.

Read-only: nothing is written to the database or Redis, so probing a live cluster every
few seconds is free. Where the process pools its PostgreSQL connections, the database
checks use a direct connection of their own, bounded by ``timeout`` too. Each Redis PING
uses a fresh connection bounded by ``timeout`` (no
pool shared with the app: a stalled master must not hold a request thread longer than
that), and messages name hosts and ports, never a password.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import redis
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections
from django.db.migrations.executor import MigrationExecutor

from dashboard import infra
from workers.runtime import is_sentinel_url, parse_sentinel_url

#: The checks, in the order they are reported.
CHECKS = ("database", "migrations", "lock_quorum", "queue")


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class Readiness:
    checks: tuple[Check, ...]

    @property
    def ready(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def as_dict(self) -> dict[str, Any]:
        """The JSON body of ``/readyz``: ``{ready, failed: [names], checks: {name: {ok,
        detail}}}``."""
        return {
            "ready": self.ready,
            "failed": [c.name for c in self.failed],
            "checks": {c.name: {"ok": c.ok, "detail": c.detail} for c in self.checks},
        }

    def problem_line(self) -> str:
        """Every failure on one line (probes and humans read the first line only); an
        unreachable database is named once, not again as unknown migrations."""
        failed = {c.name for c in self.failed}
        return "; ".join(
            c.detail for c in self.failed if not (c.name == "migrations" and "database" in failed)
        )


def check_readiness(*, timeout: float = 1.0) -> Readiness:
    """Run every check (none short-circuits: the answer names everything that failed)."""
    database, migrations = _database_checks(timeout=timeout)
    return Readiness(
        (
            database,
            migrations,
            _lock_quorum(list(settings.REDIS_URLS), timeout=timeout),
            queue_check(str(settings.REDIS_URL or ""), timeout=timeout),
        )
    )


def _probe_connection(timeout: float) -> Any:
    """The connection the database checks use: the request's own, or, where this
    process pools its PostgreSQL connections, a direct one of the probe's own with a
    connect timeout — like the Redis PINGs, a stopped database must answer the probe
    within ``timeout``, not after the pool's wait for a connection
    (``GITWARD_DB_POOL_TIMEOUT``), and a full pool is not an unready database."""
    own = connections[DEFAULT_DB_ALIAS]
    options = own.settings_dict.get("OPTIONS", {})
    if not options.get("pool"):
        return own
    direct = {k: v for k, v in options.items() if k != "pool"}
    direct["connect_timeout"] = max(1, math.ceil(timeout))
    settings_dict = {**own.settings_dict, "OPTIONS": direct, "CONN_HEALTH_CHECKS": False}
    return type(own)(settings_dict, alias=DEFAULT_DB_ALIAS)


def _database_checks(*, timeout: float = 1.0) -> tuple[Check, Check]:
    probe = _probe_connection(timeout)
    try:
        executor = MigrationExecutor(probe)
        plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    except DatabaseError as exc:
        detail = f"database unreachable: {_first_line(exc)}"
        # A probe on a broken connection must not poison the next one.
        probe.close_if_unusable_or_obsolete()
        return Check("database", False, detail), Check(
            "migrations", False, "migrations: unknown (database unreachable)"
        )
    finally:
        if probe is not connections[DEFAULT_DB_ALIAS]:
            probe.close()
    database = Check("database", True, "database answers")
    if plan:
        first = plan[0][0]
        return database, Check(
            "migrations",
            False,
            f"database: {len(plan)} migrations not applied (first {first.app_label}.{first.name})",
        )
    return database, Check("migrations", True, "every migration applied")


def answers_ping(url: str, *, timeout: float) -> bool:
    """One PING on a fresh connection (no pool shared with the app), bounded by ``timeout``."""
    try:
        if is_sentinel_url(url):  # the master the Sentinels name, asked through them
            client: redis.Redis = infra.build_client(
                url, socket_connect_timeout=timeout, socket_timeout=timeout
            )
        else:
            client = redis.Redis.from_url(
                url, socket_connect_timeout=timeout, socket_timeout=timeout, retry_on_timeout=False
            )
    except ValueError:  # not a redis:// URL: as good as down, and named in the message
        return False
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()


def _lock_quorum(urls: list[str], *, timeout: float) -> Check:
    if not urls:
        return Check("lock_quorum", False, "lock masters: REDIS_URLS is empty")
    down = [u for u in urls if not answers_ping(u, timeout=timeout)]
    need = len(urls) // 2 + 1
    up = len(urls) - len(down)
    if up >= need:
        return Check("lock_quorum", True, f"lock masters: {up}/{len(urls)} answer PING")
    where = ", ".join(_where(u) for u in down)
    return Check(
        "lock_quorum",
        False,
        f"lock masters: {up}/{len(urls)} answer PING (need {need}); down: {where}",
    )


def queue_check(url: str, *, timeout: float) -> Check:
    """The queue server's check (a Sentinel URL is asked through its Sentinels)."""
    if not url:
        return Check("queue", False, "queue Redis: REDIS_URL is empty")
    if answers_ping(url, timeout=timeout):
        return Check("queue", True, f"queue Redis {_where(url)} answers PING")
    return Check("queue", False, f"queue Redis {_where(url)} does not answer PING")


def _where(url: str) -> str:
    """host:port of a Redis URL (the Sentinels of a Sentinel URL), never its password."""
    if is_sentinel_url(url):
        return ",".join(f"{h}:{p}" for h, p in parse_sentinel_url(url).sentinels)
    parsed = urlparse(url)
    return f"{parsed.hostname}:{parsed.port or 6379}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
