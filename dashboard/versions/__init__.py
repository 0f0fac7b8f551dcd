"""Analyzer versions: the state machine every version moves through (checked against
the deploy lock's fencing token) and the canary that routes a share of repositories to a
ramping version, and the code versions learned from the workers that run
(docs/rollouts.md#code-rollouts-bluegreen). See docs/rollouts.md#states."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dashboard.versions.canary import canary_health, planned_fingerprints, repository_key
    from dashboard.versions.code_versions import (
        find_version,
        learn_code_version,
        live_workers,
        no_workers_reason,
        version_rows,
    )
    from dashboard.versions.state_machine import (
        ALLOWED,
        GATE_OPEN,
        QUEUE,
        RETIRABLE,
        ROUTABLE,
        STAFFED,
        TOKENLESS,
        InvalidConfig,
        InvalidTransition,
        RolloutBusy,
        RolloutConflict,
        RolloutError,
        VersionNotFound,
        actor_name,
        check_fence,
        closed_queue_names,
        current_version,
        describe_lock,
        do_transition,
        ensure_baseline,
        fingerprint_config,
        physical_queue,
        publish_rollout_event,
        ramping_version,
        record_event,
        register_version,
        retire_version,
        served_fingerprint,
    )

__all__ = [
    "ALLOWED",
    "GATE_OPEN",
    "QUEUE",
    "RETIRABLE",
    "ROUTABLE",
    "STAFFED",
    "TOKENLESS",
    "InvalidConfig",
    "InvalidTransition",
    "RolloutBusy",
    "RolloutConflict",
    "RolloutError",
    "VersionNotFound",
    "actor_name",
    "canary_health",
    "check_fence",
    "closed_queue_names",
    "current_version",
    "describe_lock",
    "do_transition",
    "ensure_baseline",
    "find_version",
    "fingerprint_config",
    "learn_code_version",
    "live_workers",
    "no_workers_reason",
    "physical_queue",
    "planned_fingerprints",
    "publish_rollout_event",
    "ramping_version",
    "record_event",
    "register_version",
    "repository_key",
    "retire_version",
    "served_fingerprint",
    "version_rows",
]

#: Each public name and the module that defines it. A module loads when one of its names is
#: first read (PEP 562), so settings can import a package before Django's app registry is
#: ready, and a name is read from its module each time: a test that patches the module is
#: seen here too. See docs/architecture.md#package-surfaces.
_SURFACE: dict[str, str] = {
    "canary_health": "dashboard.versions.canary",
    "planned_fingerprints": "dashboard.versions.canary",
    "repository_key": "dashboard.versions.canary",
    "find_version": "dashboard.versions.code_versions",
    "learn_code_version": "dashboard.versions.code_versions",
    "live_workers": "dashboard.versions.code_versions",
    "no_workers_reason": "dashboard.versions.code_versions",
    "version_rows": "dashboard.versions.code_versions",
    "ALLOWED": "dashboard.versions.state_machine",
    "GATE_OPEN": "dashboard.versions.state_machine",
    "InvalidConfig": "dashboard.versions.state_machine",
    "InvalidTransition": "dashboard.versions.state_machine",
    "QUEUE": "dashboard.versions.state_machine",
    "RETIRABLE": "dashboard.versions.state_machine",
    "ROUTABLE": "dashboard.versions.state_machine",
    "RolloutBusy": "dashboard.versions.state_machine",
    "RolloutConflict": "dashboard.versions.state_machine",
    "RolloutError": "dashboard.versions.state_machine",
    "STAFFED": "dashboard.versions.state_machine",
    "TOKENLESS": "dashboard.versions.state_machine",
    "VersionNotFound": "dashboard.versions.state_machine",
    "actor_name": "dashboard.versions.state_machine",
    "check_fence": "dashboard.versions.state_machine",
    "closed_queue_names": "dashboard.versions.state_machine",
    "current_version": "dashboard.versions.state_machine",
    "describe_lock": "dashboard.versions.state_machine",
    "do_transition": "dashboard.versions.state_machine",
    "ensure_baseline": "dashboard.versions.state_machine",
    "fingerprint_config": "dashboard.versions.state_machine",
    "physical_queue": "dashboard.versions.state_machine",
    "publish_rollout_event": "dashboard.versions.state_machine",
    "ramping_version": "dashboard.versions.state_machine",
    "record_event": "dashboard.versions.state_machine",
    "register_version": "dashboard.versions.state_machine",
    "retire_version": "dashboard.versions.state_machine",
    "served_fingerprint": "dashboard.versions.state_machine",
}


def __getattr__(name: str) -> object:
    try:
        module = _SURFACE[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    return getattr(importlib.import_module(module), name)
