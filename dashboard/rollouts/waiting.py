"""What a rollout waits for, and until when (docs/rollouts.md#waiting-reason).

* :func:`step_event` — the driver's latest event of one kind for the current ramp
  step (``shadow.enqueued``, ``step.deadline``): events at or after the step began.
* :func:`paused` — the ``step.deadline`` event that paused the current step, or None.
* :func:`waiting` — ``{"reason", "until"}`` while an active rollout waits (``until``
  ISO 8601 or None), else None: what ``GET /api/rollouts/<id>``, ``rollout status``
  and the Rollouts page show.

Reads only. Every answer is a snapshot of the database (and the freeze) at the time of
the call; the driver decides by the same reads, so a reason may be one tick stale.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from dashboard.models import AnalyzerVersion, Rollout, RolloutEvent
from dashboard.rollouts import start
from dashboard.rollouts.checks import gate_waiting, step_checks
from dashboard.rollouts.freeze import rollout_freeze
from dashboard.versions import canary_health

S = AnalyzerVersion.State
R = Rollout.State


def step_event(ro: Rollout, action: str) -> RolloutEvent | None:
    """The newest ``action`` event recorded since the current step began (None before
    the first step)."""
    if ro.step_started_at is None:
        return None
    return (
        RolloutEvent.objects.filter(rollout=ro, action=action, at__gte=ro.step_started_at)
        .order_by("-at", "-id")
        .first()
    )


def paused(ro: Rollout) -> RolloutEvent | None:
    """The ``step.deadline`` event (policy ``pause``) that paused the current step: the
    driver then no longer advances it by itself, an operator promotes or rolls back."""
    event = step_event(ro, "step.deadline")
    if event is None or event.detail.get("policy") != "pause":
        return None
    return event


def deadline_of(ro: Rollout) -> Any:
    """When the current step's deadline falls (``step_started_at`` + ``step_deadline``),
    or None before the first step."""
    if ro.step_started_at is None:
        return None
    options = start.validate_options(ro.options)
    return ro.step_started_at + timedelta(seconds=float(options["step_deadline"]))


def _hhmm(when: Any) -> str:
    return timezone.localtime(when).strftime("%H:%M:%S")


def _iso(when: Any) -> str | None:
    return when.isoformat() if when is not None else None


def waiting(ro: Rollout) -> dict[str, Any] | None:
    """``{"reason", "until"}`` while the active rollout waits; None once it ended.

    In order: a pending rollout waits for its driver; a rollback for the drain; a freeze
    holds back any step advance (``rollout_freeze``: the window and its end); a warming
    version for its warm set (until ``warm_timeout``); a paused step for an operator;
    an automatic ramp step for its health check's samples (the count, the shadow work
    the driver sent, the step's deadline); a manual rollout for an operator.
    """
    if not ro.is_active:
        return None
    if ro.state == R.PENDING:
        return {"reason": "waiting for a driver to take the deploy lock", "until": None}
    version = AnalyzerVersion.objects.get(pk=ro.version_id)
    if ro.state == R.ROLLING_BACK:
        return {"reason": f"rolling back: waiting for {version} to drain", "until": None}
    options = start.validate_options(ro.options)
    frozen = rollout_freeze(ro)
    if frozen is not None and version.state in {S.VERIFIED, S.RAMPING}:
        step = f" ({frozen['step']} waits)" if frozen.get("step") else ""
        return {"reason": f"frozen: {frozen['message']}{step}", "until": frozen.get("until")}
    if version.state in {S.REGISTERED, S.WARM_FAILED, S.DRAINED}:
        return {"reason": "waiting for the driver to start warming", "until": None}
    if version.state == S.WARMING:
        last = (
            RolloutEvent.objects.filter(rollout=ro, action="warming.progress")
            .order_by("-at", "-id")
            .first()
        )
        done = f"{last.detail.get('stored', 0)}/{last.detail.get('expected', 0)}" if last else "0"
        since = version.state_changed_at or ro.created_at
        until = since + timedelta(seconds=float(options["warm_timeout"]))
        return {
            "reason": f"warming: {done} warm commits stored, gives up at {_hhmm(until)}",
            "until": _iso(until),
        }
    if version.state == S.VERIFIED:
        first = ro.steps[0]
        if ro.auto:
            return {"reason": f"verified: ramping to {first}% next", "until": None}
        return {"reason": f"verified: waiting for an operator to ramp to {first}%", "until": None}
    if version.state != S.RAMPING:
        return None
    percent = ro.steps[ro.step_index] if ro.step_index < len(ro.steps) else version.ramp_percent
    label = f"step {percent} %"
    hold = paused(ro)
    if hold is not None:
        return {
            "reason": f"{label}: paused at its deadline ({hold.detail.get('summary', '')}): "
            "waiting for an operator to promote or roll back",
            "until": None,
        }
    if not ro.auto:
        return {"reason": f"{label}: waiting for an operator to promote", "until": None}
    started = ro.step_started_at or timezone.now()
    deadline = deadline_of(ro)
    gate = gate_waiting(ro)  # docs/rollouts.md#checks-and-gates
    if gate is not None and deadline is not None:
        again = datetime.fromisoformat(gate["again"])
        return {
            "reason": f"{label}: waiting on gate {gate['gate']!r} ({gate['message']}), "
            f"asking again at {_hhmm(again)}, deadline {_hhmm(deadline)} "
            f"(then {options['on_inconclusive']})",
            "until": gate["again"],
        }
    min_samples = int(options["min_samples"])
    health = canary_health(rollout=ro, since=started, min_samples=min_samples)
    parts = [f"{health['canary']['samples']}/{min_samples} samples"]
    measured = step_checks(ro)
    if measured["checks"]:
        passing = sum(1 for c in measured["checks"] if c["verdict"] == "pass")
        parts.append(f"checks {passing}/{len(measured['checks'])} passing")
    shadow = step_event(ro, "shadow.enqueued")
    if shadow is not None and not shadow.detail.get("commits"):
        parts.append("no commits left to shadow")
    elif shadow is not None:
        parts.append(
            f"shadowing {shadow.detail.get('commits', 0)} commits of "
            f"{shadow.detail.get('repositories', 0)} repositories"
        )
    pause_end = started + timedelta(seconds=float(options["step_pause"]))
    if timezone.now() < pause_end:
        parts.append(f"observing until {_hhmm(pause_end)}")
    if deadline is not None:
        parts.append(f"deadline {_hhmm(deadline)} (then {options['on_inconclusive']})")
    return {"reason": f"{label}: " + ", ".join(parts), "until": _iso(deadline)}
