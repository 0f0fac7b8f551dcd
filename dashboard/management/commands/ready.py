"""``manage.py ready``: is this process able to serve? Exit 0, or one line and exit 1.

Ready means all three of:

1. the database answers and every migration is applied (a process started before
   ``migrate`` finished would write to tables that do not exist yet);
2. a majority of the Redlock masters (``REDIS_URLS``) answer PING within
   ``--timeout`` — the quorum every lock acquisition needs; a minority down is fine;
3. the queue Redis (``REDIS_URL``) answers PING — without it nothing is enqueued.

Used by the image's HEALTHCHECK and the Kubernetes readiness probe. A ``/readyz``
endpoint doing the same checks over HTTP can replace it there. Read-only: it never
writes to the database or Redis, so probing a live cluster every few seconds is free.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

import redis
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError, connection
from django.db.migrations.executor import MigrationExecutor

from dashboard import queues
from workers.redisurls import is_sentinel_url, parse_sentinel_url


def database_problem() -> str | None:
    """None when the database answers and has no unapplied migration."""
    try:
        executor = MigrationExecutor(connection)
        plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    except DatabaseError as exc:
        return f"database unreachable: {_first_line(exc)}"
    if plan:
        first = plan[0][0]
        return (
            f"database: {len(plan)} migrations not applied (first {first.app_label}.{first.name})"
        )
    return None


def answers_ping(url: str, *, timeout: float) -> bool:
    """One PING on a fresh connection (no pool shared with the app), bounded by ``timeout``."""
    try:
        if is_sentinel_url(url):  # the master the Sentinels name, asked through them
            client: redis.Redis = queues.build_client(
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


def lock_masters_problem(urls: list[str], *, timeout: float) -> str | None:
    """None when a strict majority of ``urls`` answer PING."""
    if not urls:
        return "lock masters: REDIS_URLS is empty"
    down = [u for u in urls if not answers_ping(u, timeout=timeout)]
    need = len(urls) // 2 + 1
    up = len(urls) - len(down)
    if up >= need:
        return None
    where = ", ".join(_where(u) for u in down)
    return f"lock masters: {up}/{len(urls)} answer PING (need {need}); down: {where}"


def queue_problem(url: str, *, timeout: float) -> str | None:
    if not url:
        return "queue Redis: REDIS_URL is empty"
    return (
        None
        if answers_ping(url, timeout=timeout)
        else f"queue Redis {_where(url)} does not answer PING"
    )


def _where(url: str) -> str:
    """host:port of a Redis URL (the Sentinels of a Sentinel URL), never its password."""
    if is_sentinel_url(url):
        return ",".join(f"{h}:{p}" for h, p in parse_sentinel_url(url).sentinels)
    parsed = urlparse(url)
    return f"{parsed.hostname}:{parsed.port or 6379}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class Command(BaseCommand):
    help = "Exit 0 when the database, a majority of lock masters and the queue Redis are ready."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--timeout", type=float, default=1.0, help="seconds per Redis PING (default 1)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        timeout = options["timeout"]
        if timeout <= 0:
            raise CommandError("--timeout must be positive")
        problems = [
            p
            for p in (
                database_problem(),
                lock_masters_problem(list(settings.REDIS_URLS), timeout=timeout),
                queue_problem(str(settings.REDIS_URL or ""), timeout=timeout),
            )
            if p
        ]
        if problems:
            # One line, whatever failed: probes and humans read the first line only.
            raise CommandError("not ready: " + "; ".join(problems))
        if options["verbosity"] >= 1:
            self.stdout.write("ready")
