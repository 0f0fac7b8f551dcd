"""Leases and fencing on the web side: the Redlock leases jobs and operators hold,
the fencing tokens the database checks on every guarded write, and the worker heartbeats.
See docs/locks.md."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dashboard.locks.fencing import StaleToken, check_token
    from dashboard.locks.leases import (
        contention,
        evict_job,
        force_release_lock,
        held_count,
        hold_lease,
        job_holder,
        lock_rows,
        redlock,
        release_locks_of,
        remaining_ttl,
    )
    from dashboard.locks.worker_beats import (
        beat,
        live_worker_names,
        orphaned_runs,
        set_queues,
        stop_beat,
        worker_rows,
    )

__all__ = [
    "StaleToken",
    "beat",
    "check_token",
    "contention",
    "evict_job",
    "force_release_lock",
    "held_count",
    "hold_lease",
    "job_holder",
    "live_worker_names",
    "lock_rows",
    "orphaned_runs",
    "redlock",
    "release_locks_of",
    "remaining_ttl",
    "set_queues",
    "stop_beat",
    "worker_rows",
]

#: Each public name and the module that defines it. A module loads when one of its names is
#: first read (PEP 562), so settings can import a package before Django's app registry is
#: ready, and a name is read from its module each time: a test that patches the module is
#: seen here too. See docs/architecture.md#package-surfaces.
_SURFACE: dict[str, str] = {
    "StaleToken": "dashboard.locks.fencing",
    "check_token": "dashboard.locks.fencing",
    "contention": "dashboard.locks.leases",
    "evict_job": "dashboard.locks.leases",
    "force_release_lock": "dashboard.locks.leases",
    "held_count": "dashboard.locks.leases",
    "hold_lease": "dashboard.locks.leases",
    "job_holder": "dashboard.locks.leases",
    "lock_rows": "dashboard.locks.leases",
    "redlock": "dashboard.locks.leases",
    "release_locks_of": "dashboard.locks.leases",
    "remaining_ttl": "dashboard.locks.leases",
    "beat": "dashboard.locks.worker_beats",
    "live_worker_names": "dashboard.locks.worker_beats",
    "orphaned_runs": "dashboard.locks.worker_beats",
    "set_queues": "dashboard.locks.worker_beats",
    "stop_beat": "dashboard.locks.worker_beats",
    "worker_rows": "dashboard.locks.worker_beats",
}


def __getattr__(name: str) -> object:
    try:
        module = _SURFACE[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    return getattr(importlib.import_module(module), name)
