"""The ground every context stands on: environment parsing, Django system checks,
the database connection pool, the Redis queues, live events and the activity feed.
See docs/architecture.md#layers."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dashboard.infra.activity_feed import recent
    from dashboard.infra.dbpool import close_thread_connections, use_direct_connections
    from dashboard.infra.env import env_bool, env_float, env_int, env_list, env_mapping, env_str
    from dashboard.infra.events import (
        EVENT_TYPES,
        OPS_GROUP,
        OWN_EVENTS,
        REPOS_GROUP,
        ROLLOUTS_GROUP,
        close_user_sockets,
        coalesce_key,
        dropped_events,
        publish_event,
        published_count,
        repo_group,
        served_request,
        serving_request,
        user_group,
    )
    from dashboard.infra.inputs import (
        DB_INT_MAX,
        MAX_JSON_DEPTH,
        BadInput,
        IdConverter,
        has_nul,
        is_db_id,
        parse_json,
    )
    from dashboard.infra.queues import (
        IDLE_QUEUE,
        MAINTENANCE_QUEUE,
        PAUSED_KEY,
        QUEUE_DOWN,
        SYNC_QUEUE,
        QueueUnavailable,
        RedisUnavailable,
        build_client,
        connection,
        enqueue_unique,
        express_begun,
        express_ended,
        express_running,
        express_writing,
        is_express,
        paused_queue_names,
        promote_due_jobs,
        queue,
        queue_names,
        queue_server,
        redis_urls,
        set_paused,
        take_express,
        wait_for_express,
        worker_connection,
    )

__all__ = [
    "DB_INT_MAX",
    "EVENT_TYPES",
    "IDLE_QUEUE",
    "MAINTENANCE_QUEUE",
    "MAX_JSON_DEPTH",
    "OPS_GROUP",
    "OWN_EVENTS",
    "PAUSED_KEY",
    "QUEUE_DOWN",
    "REPOS_GROUP",
    "ROLLOUTS_GROUP",
    "SYNC_QUEUE",
    "BadInput",
    "IdConverter",
    "QueueUnavailable",
    "RedisUnavailable",
    "build_client",
    "close_thread_connections",
    "close_user_sockets",
    "coalesce_key",
    "connection",
    "dropped_events",
    "enqueue_unique",
    "env_bool",
    "env_float",
    "env_int",
    "env_list",
    "env_mapping",
    "env_str",
    "express_begun",
    "express_ended",
    "express_running",
    "express_writing",
    "has_nul",
    "install_hooks",
    "is_db_id",
    "is_express",
    "parse_json",
    "paused_queue_names",
    "promote_due_jobs",
    "publish_event",
    "published_count",
    "queue",
    "queue_names",
    "queue_server",
    "recent",
    "redis_urls",
    "repo_group",
    "served_request",
    "serving_request",
    "set_paused",
    "take_express",
    "use_direct_connections",
    "user_group",
    "wait_for_express",
    "worker_connection",
]

#: Each public name and the module that defines it. A module loads when one of its names is
#: first read (PEP 562), so settings can import a package before Django's app registry is
#: ready, and a name is read from its module each time: a test that patches the module is
#: seen here too. See docs/architecture.md#package-surfaces.
_SURFACE: dict[str, str] = {
    "recent": "dashboard.infra.activity_feed",
    "close_thread_connections": "dashboard.infra.dbpool",
    "use_direct_connections": "dashboard.infra.dbpool",
    "env_bool": "dashboard.infra.env",
    "env_float": "dashboard.infra.env",
    "env_int": "dashboard.infra.env",
    "env_list": "dashboard.infra.env",
    "env_mapping": "dashboard.infra.env",
    "env_str": "dashboard.infra.env",
    "EVENT_TYPES": "dashboard.infra.events",
    "OPS_GROUP": "dashboard.infra.events",
    "OWN_EVENTS": "dashboard.infra.events",
    "REPOS_GROUP": "dashboard.infra.events",
    "ROLLOUTS_GROUP": "dashboard.infra.events",
    "close_user_sockets": "dashboard.infra.events",
    "coalesce_key": "dashboard.infra.events",
    "dropped_events": "dashboard.infra.events",
    "publish_event": "dashboard.infra.events",
    "published_count": "dashboard.infra.events",
    "repo_group": "dashboard.infra.events",
    "served_request": "dashboard.infra.events",
    "serving_request": "dashboard.infra.events",
    "user_group": "dashboard.infra.events",
    "DB_INT_MAX": "dashboard.infra.inputs",
    "MAX_JSON_DEPTH": "dashboard.infra.inputs",
    "BadInput": "dashboard.infra.inputs",
    "IdConverter": "dashboard.infra.inputs",
    "has_nul": "dashboard.infra.inputs",
    "is_db_id": "dashboard.infra.inputs",
    "parse_json": "dashboard.infra.inputs",
    "IDLE_QUEUE": "dashboard.infra.queues",
    "MAINTENANCE_QUEUE": "dashboard.infra.queues",
    "PAUSED_KEY": "dashboard.infra.queues",
    "QUEUE_DOWN": "dashboard.infra.queues",
    "QueueUnavailable": "dashboard.infra.queues",
    "RedisUnavailable": "dashboard.infra.queues",
    "SYNC_QUEUE": "dashboard.infra.queues",
    "build_client": "dashboard.infra.queues",
    "connection": "dashboard.infra.queues",
    "enqueue_unique": "dashboard.infra.queues",
    "is_express": "dashboard.infra.queues",
    "express_begun": "dashboard.infra.queues",
    "express_ended": "dashboard.infra.queues",
    "express_running": "dashboard.infra.queues",
    "express_writing": "dashboard.infra.queues",
    "take_express": "dashboard.infra.queues",
    "wait_for_express": "dashboard.infra.queues",
    "paused_queue_names": "dashboard.infra.queues",
    "promote_due_jobs": "dashboard.infra.queues",
    "queue": "dashboard.infra.queues",
    "queue_names": "dashboard.infra.queues",
    "queue_server": "dashboard.infra.queues",
    "redis_urls": "dashboard.infra.queues",
    "set_paused": "dashboard.infra.queues",
    "worker_connection": "dashboard.infra.queues",
}


def __getattr__(name: str) -> object:
    try:
        module = _SURFACE[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    return getattr(importlib.import_module(module), name)


def install_hooks() -> None:
    """Load the modules that hook into Django and the process when imported: gitward's
    system checks (``system_checks``) and the database pool's at-fork hook (``dbpool``).
    The app's ``ready()`` calls it; the package itself loads nothing eagerly."""
    importlib.import_module("dashboard.infra.system_checks")
    importlib.import_module("dashboard.infra.dbpool")
