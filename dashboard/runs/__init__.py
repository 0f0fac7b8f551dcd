"""Job runs: attempts, retries, the dead-letter queue and its counts.
See docs/lifecycle.md."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dashboard.runs.attempts import (
        Attempt,
        begin_attempt,
        cancel_runs,
        closed_fingerprints,
        crash_attempt,
        defer_attempt,
        enqueue_after_commit,
        enqueue_or_leave,
        enqueue_run,
        ensure_run,
        fail_attempt,
        flush_phases,
        hand_back_attempt,
        is_run_job,
        mark_phase,
        record_lock,
        repository_name,
        reroute_attempt,
        running_runs_of,
        search_runs,
        succeed_attempt,
        sweep_closed_queues,
        sweep_queue,
    )
    from dashboard.runs.cancels import (
        CANCEL_REPO_PERMISSION,
        CANCEL_RUN_PERMISSION,
        CANCELLABLE,
        Cancelled,
        CancelRefused,
        cancel_filtered,
        cancel_repository,
        cancel_run,
        cancel_runs_matching,
    )
    from dashboard.runs.dead_letter_counts import groups
    from dashboard.runs.dead_letters import (
        act_now,
        dead_runs,
        group_page,
        group_runs,
        list_groups,
        new_bulk,
        run_bulk,
        run_dict,
        start_bulk,
    )

__all__ = [
    "CANCELLABLE",
    "CANCEL_REPO_PERMISSION",
    "CANCEL_RUN_PERMISSION",
    "Attempt",
    "CancelRefused",
    "Cancelled",
    "act_now",
    "begin_attempt",
    "cancel_filtered",
    "cancel_repository",
    "cancel_run",
    "cancel_runs",
    "cancel_runs_matching",
    "closed_fingerprints",
    "crash_attempt",
    "dead_runs",
    "defer_attempt",
    "enqueue_after_commit",
    "enqueue_or_leave",
    "enqueue_run",
    "ensure_run",
    "fail_attempt",
    "flush_phases",
    "group_page",
    "group_runs",
    "groups",
    "hand_back_attempt",
    "is_run_job",
    "list_groups",
    "mark_phase",
    "new_bulk",
    "record_lock",
    "repository_name",
    "reroute_attempt",
    "run_bulk",
    "run_dict",
    "running_runs_of",
    "search_runs",
    "start_bulk",
    "succeed_attempt",
    "sweep_closed_queues",
    "sweep_queue",
]

#: Each public name and the module that defines it. A module loads when one of its names is
#: first read (PEP 562), so settings can import a package before Django's app registry is
#: ready, and a name is read from its module each time: a test that patches the module is
#: seen here too. See docs/architecture.md#package-surfaces.
_SURFACE: dict[str, str] = {
    "CANCELLABLE": "dashboard.runs.cancels",
    "CANCEL_REPO_PERMISSION": "dashboard.runs.cancels",
    "CANCEL_RUN_PERMISSION": "dashboard.runs.cancels",
    "CancelRefused": "dashboard.runs.cancels",
    "Cancelled": "dashboard.runs.cancels",
    "cancel_filtered": "dashboard.runs.cancels",
    "cancel_repository": "dashboard.runs.cancels",
    "cancel_run": "dashboard.runs.cancels",
    "cancel_runs_matching": "dashboard.runs.cancels",
    "groups": "dashboard.runs.dead_letter_counts",
    "act_now": "dashboard.runs.dead_letters",
    "dead_runs": "dashboard.runs.dead_letters",
    "group_page": "dashboard.runs.dead_letters",
    "group_runs": "dashboard.runs.dead_letters",
    "list_groups": "dashboard.runs.dead_letters",
    "new_bulk": "dashboard.runs.dead_letters",
    "run_bulk": "dashboard.runs.dead_letters",
    "run_dict": "dashboard.runs.dead_letters",
    "start_bulk": "dashboard.runs.dead_letters",
    "Attempt": "dashboard.runs.attempts",
    "begin_attempt": "dashboard.runs.attempts",
    "cancel_runs": "dashboard.runs.attempts",
    "closed_fingerprints": "dashboard.runs.attempts",
    "crash_attempt": "dashboard.runs.attempts",
    "defer_attempt": "dashboard.runs.attempts",
    "enqueue_after_commit": "dashboard.runs.attempts",
    "enqueue_or_leave": "dashboard.runs.attempts",
    "enqueue_run": "dashboard.runs.attempts",
    "ensure_run": "dashboard.runs.attempts",
    "fail_attempt": "dashboard.runs.attempts",
    "flush_phases": "dashboard.runs.attempts",
    "hand_back_attempt": "dashboard.runs.attempts",
    "is_run_job": "dashboard.runs.attempts",
    "mark_phase": "dashboard.runs.attempts",
    "record_lock": "dashboard.runs.attempts",
    "repository_name": "dashboard.runs.attempts",
    "reroute_attempt": "dashboard.runs.attempts",
    "running_runs_of": "dashboard.runs.attempts",
    "search_runs": "dashboard.runs.attempts",
    "succeed_attempt": "dashboard.runs.attempts",
    "sweep_closed_queues": "dashboard.runs.attempts",
    "sweep_queue": "dashboard.runs.attempts",
}


def __getattr__(name: str) -> object:
    try:
        module = _SURFACE[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    return getattr(importlib.import_module(module), name)
