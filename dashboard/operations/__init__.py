"""Keeping the running system honest and visible: the reconciler that repairs what a
crash or a lost Redis left behind, queue statistics, the health of the Redis lock masters,
the Prometheus exposition and the readiness checks. See docs/operations.md."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dashboard.operations.prometheus import CONTENT_TYPE, metrics_text
    from dashboard.operations.queue_stats import (
        day_series,
        held_backlog,
        queues_stats,
        record_samples,
        series,
    )
    from dashboard.operations.readiness import check_readiness
    from dashboard.operations.reconciler import reconcile
    from dashboard.operations.redis_health import quorum, redis_nodes

__all__ = [
    "CONTENT_TYPE",
    "check_readiness",
    "day_series",
    "held_backlog",
    "metrics_text",
    "queues_stats",
    "quorum",
    "reconcile",
    "record_samples",
    "redis_nodes",
    "series",
]

#: Each public name and the module that defines it. A module loads when one of its names is
#: first read (PEP 562), so settings can import a package before Django's app registry is
#: ready, and a name is read from its module each time: a test that patches the module is
#: seen here too. See docs/architecture.md#package-surfaces.
_SURFACE: dict[str, str] = {
    "CONTENT_TYPE": "dashboard.operations.prometheus",
    "metrics_text": "dashboard.operations.prometheus",
    "day_series": "dashboard.operations.queue_stats",
    "held_backlog": "dashboard.operations.queue_stats",
    "queues_stats": "dashboard.operations.queue_stats",
    "record_samples": "dashboard.operations.queue_stats",
    "series": "dashboard.operations.queue_stats",
    "check_readiness": "dashboard.operations.readiness",
    "reconcile": "dashboard.operations.reconciler",
    "quorum": "dashboard.operations.redis_health",
    "redis_nodes": "dashboard.operations.redis_health",
}


def __getattr__(name: str) -> object:
    try:
        module = _SURFACE[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    return getattr(importlib.import_module(module), name)
