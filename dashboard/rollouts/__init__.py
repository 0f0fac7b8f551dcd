"""Rollouts: one attempt to bring an analyzer version live on a queue, driven under
the queue's deploy lock through warming, verification, a canary ramp, promotion or
rollback, with drains, a release checklist, the Rollouts board and its buttons, and the
rollback offers for bad versions, freeze windows and stop-the-line, the signed webhook
notifications of its transitions, and its marks on the Overview's charts. See
docs/rollouts.md."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dashboard.rollouts.board import (
        checklist_blocks,
        live_snapshot,
        rollout_view,
        rollouts_page,
    )
    from dashboard.rollouts.buttons import PERMISSION, VERBS, label, perform, permitted, retire
    from dashboard.rollouts.checklist import describe_rollout, rollout_checklist
    from dashboard.rollouts.checks import ask_gates, measurements, query_prometheus, step_checks
    from dashboard.rollouts.conditions import (
        evaluate,
        parse_condition,
        validate_check,
        validate_gate,
    )
    from dashboard.rollouts.deploy_lock import (
        abort_rollout,
        driver_alive,
        rollback_rollout,
        takeover_rollout,
    )
    from dashboard.rollouts.drains import reconcile_drains
    from dashboard.rollouts.driver import RolloutDriver
    from dashboard.rollouts.freeze import (
        RolloutFrozen,
        active_freeze,
        freeze_status,
        rollout_freeze,
        set_stop_the_line,
    )
    from dashboard.rollouts.marks import transition_marks
    from dashboard.rollouts.notifications import (
        connect_notifications,
        deliver_notifications,
        notification_status,
    )
    from dashboard.rollouts.pins import pin_repositories, pinned, unpin_repositories
    from dashboard.rollouts.rollback_offers import canary_offers, dead_letter_offers
    from dashboard.rollouts.start import (
        DRIVER_QUEUE,
        active_rollout,
        check_applies,
        ended_state,
        enqueue_driver_job,
        reconcile_pending_drivers,
        request_action,
        start_rollout,
        validate_steps,
    )
    from dashboard.rollouts.warming import warm_rollout

__all__ = [
    "DRIVER_QUEUE",
    "PERMISSION",
    "VERBS",
    "RolloutDriver",
    "RolloutFrozen",
    "abort_rollout",
    "active_freeze",
    "active_rollout",
    "ask_gates",
    "canary_offers",
    "check_applies",
    "checklist_blocks",
    "connect_notifications",
    "dead_letter_offers",
    "deliver_notifications",
    "describe_rollout",
    "driver_alive",
    "ended_state",
    "enqueue_driver_job",
    "evaluate",
    "freeze_status",
    "label",
    "live_snapshot",
    "measurements",
    "notification_status",
    "parse_condition",
    "perform",
    "permitted",
    "pin_repositories",
    "pinned",
    "query_prometheus",
    "reconcile_drains",
    "reconcile_pending_drivers",
    "request_action",
    "retire",
    "rollback_rollout",
    "rollout_checklist",
    "rollout_freeze",
    "rollout_view",
    "rollouts_page",
    "set_stop_the_line",
    "start_rollout",
    "step_checks",
    "takeover_rollout",
    "transition_marks",
    "unpin_repositories",
    "validate_check",
    "validate_gate",
    "validate_steps",
    "warm_rollout",
]

#: Each public name and the module that defines it. A module loads when one of its names is
#: first read (PEP 562), so settings can import a package before Django's app registry is
#: ready, and a name is read from its module each time: a test that patches the module is
#: seen here too. See docs/architecture.md#package-surfaces.
_SURFACE: dict[str, str] = {
    "checklist_blocks": "dashboard.rollouts.board",
    "live_snapshot": "dashboard.rollouts.board",
    "rollout_view": "dashboard.rollouts.board",
    "rollouts_page": "dashboard.rollouts.board",
    "PERMISSION": "dashboard.rollouts.buttons",
    "VERBS": "dashboard.rollouts.buttons",
    "label": "dashboard.rollouts.buttons",
    "perform": "dashboard.rollouts.buttons",
    "permitted": "dashboard.rollouts.buttons",
    "retire": "dashboard.rollouts.buttons",
    "ask_gates": "dashboard.rollouts.checks",
    "measurements": "dashboard.rollouts.checks",
    "query_prometheus": "dashboard.rollouts.checks",
    "step_checks": "dashboard.rollouts.checks",
    "evaluate": "dashboard.rollouts.conditions",
    "parse_condition": "dashboard.rollouts.conditions",
    "validate_check": "dashboard.rollouts.conditions",
    "validate_gate": "dashboard.rollouts.conditions",
    "pin_repositories": "dashboard.rollouts.pins",
    "pinned": "dashboard.rollouts.pins",
    "unpin_repositories": "dashboard.rollouts.pins",
    "describe_rollout": "dashboard.rollouts.checklist",
    "rollout_checklist": "dashboard.rollouts.checklist",
    "abort_rollout": "dashboard.rollouts.deploy_lock",
    "driver_alive": "dashboard.rollouts.deploy_lock",
    "rollback_rollout": "dashboard.rollouts.deploy_lock",
    "takeover_rollout": "dashboard.rollouts.deploy_lock",
    "reconcile_drains": "dashboard.rollouts.drains",
    "RolloutDriver": "dashboard.rollouts.driver",
    "RolloutFrozen": "dashboard.rollouts.freeze",
    "active_freeze": "dashboard.rollouts.freeze",
    "freeze_status": "dashboard.rollouts.freeze",
    "rollout_freeze": "dashboard.rollouts.freeze",
    "set_stop_the_line": "dashboard.rollouts.freeze",
    "transition_marks": "dashboard.rollouts.marks",
    "connect_notifications": "dashboard.rollouts.notifications",
    "deliver_notifications": "dashboard.rollouts.notifications",
    "notification_status": "dashboard.rollouts.notifications",
    "canary_offers": "dashboard.rollouts.rollback_offers",
    "dead_letter_offers": "dashboard.rollouts.rollback_offers",
    "DRIVER_QUEUE": "dashboard.rollouts.start",
    "active_rollout": "dashboard.rollouts.start",
    "check_applies": "dashboard.rollouts.start",
    "ended_state": "dashboard.rollouts.start",
    "enqueue_driver_job": "dashboard.rollouts.start",
    "reconcile_pending_drivers": "dashboard.rollouts.start",
    "request_action": "dashboard.rollouts.start",
    "start_rollout": "dashboard.rollouts.start",
    "validate_steps": "dashboard.rollouts.start",
    "warm_rollout": "dashboard.rollouts.warming",
}


def __getattr__(name: str) -> object:
    try:
        module = _SURFACE[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    return getattr(importlib.import_module(module), name)
