"""The Rollouts page's buttons (docs/rollouts.md): which a rollout offers now, the plan each
confirm step names, and what pressing one does.

:func:`perform` runs one operator action through the rollout domain
(``dashboard.rollouts.start`` / ``dashboard.rollouts.deploy_lock``), never around it, and writes one
``rollout.page.<verb>`` audit row with the operator's reason and the exact plan the
confirm step showed. Operators never hold the deploy lock's token: promote / set ramp /
abort of a live driver are *requests* it runs within a poll; a rollback whose driver is
gone (or finished) takes the lock here for the few milliseconds the routing change needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dashboard import versions
from dashboard.accounts import record_audit
from dashboard.models import AnalyzerVersion, Rollout
from dashboard.rollouts import start
from dashboard.rollouts.deploy_lock import abort_rollout, holder_alive, rollback_rollout
from dashboard.rollouts.drains import drain_counts
from dashboard.rollouts.freeze import active_freeze
from dashboard.rollouts.steps import UNTOUCHED
from dashboard.versions import (
    RETIRABLE,
    InvalidTransition,
    RolloutError,
    physical_queue,
    retire_version,
)

S = AnalyzerVersion.State
R = Rollout.State

VERBS = ("promote", "set_ramp", "rollback", "abort", "takeover")
#: Buttons that undo work: drawn red, apart from the others.
DESTRUCTIVE = frozenset({"rollback", "abort", "takeover"})
PERMISSION = {
    "start": "dashboard.start_rollout",
    "promote": "dashboard.start_rollout",
    "set_ramp": "dashboard.start_rollout",
    "rollback": "dashboard.rollback_rollout",
    "abort": "dashboard.rollback_rollout",
    "takeover": "dashboard.rollback_rollout",
    # a version's button (the Versions table), not a rollout's: it ends the version for good
    "retire": "dashboard.rollback_rollout",
}


def permitted(user: Any, verb: str) -> bool:
    """Operator actions need staff status *and* the explicit permission (as the DLQ's)."""
    return bool(
        getattr(user, "is_active", False)
        and getattr(user, "is_staff", False)
        and user.has_perm(PERMISSION[verb])
    )


def label(version: AnalyzerVersion | None) -> str:
    """``analysis@3f2a9c1e`` — the name operators see (the physical queue)."""
    if version is None:
        return "—"
    return physical_queue(version.queue, version.fingerprint)


def _counts(version: AnalyzerVersion) -> dict[str, int]:
    try:
        return drain_counts(version)
    except Exception:  # Redis down: the plan says "its queued jobs" without a number
        return {}


@dataclass(frozen=True)
class Action:
    """One button: what it is called, what the confirm step says will happen."""

    verb: str
    label: str
    plan: str
    danger: bool
    needs_percent: bool = False
    #: Why the button is shown disabled (a freeze holds a promote back), else "".
    disabled: str = ""


def actions_for(ro: Rollout, *, alive: bool | None = None) -> list[Action]:
    """The buttons a rollout offers now, each with the plan its confirm step names."""
    v, prev = ro.version, ro.previous
    alive = holder_alive(ro) if alive is None and ro.is_active else bool(alive)
    new, old = label(v), label(prev)
    out: list[Action] = []
    who = (
        f"its driver {ro.lock_holder} runs it within a second"
        if alive
        else "no driver holds the deploy lock: it waits for a takeover"
    )
    if ro.state == R.ACTIVE and v.state in {S.VERIFIED, S.RAMPING}:
        # A freeze refuses a promote (docs/rollouts.md#freeze-windows): the button says so.
        freeze = active_freeze()
        frozen = f"Frozen: {freeze.describe()}" if freeze is not None else ""
        steps = list(ro.steps)
        nxt = ro.step_index + 1 if v.state == S.RAMPING else 0
        if nxt < len(steps):
            out.append(
                Action(
                    "promote",
                    f"Promote to {steps[nxt]}%",
                    f"promote {new} from {v.ramp_percent}% to {steps[nxt]}%: route {steps[nxt]}% "
                    f"of new analysis work to {new} (by the hash of each job's key); the rest "
                    f"stays on {old}; retries stay on their version ({who}).",
                    False,
                    disabled=frozen,
                )
            )
        else:
            out.append(
                Action(
                    "promote",
                    "Promote to current",
                    f"make {new} current: all new analysis work goes to {new}, {old} starts "
                    f"draining, every repository is brought up to date under {new}; the "
                    f"rollout completes and the deploy lock is released ({who}).",
                    False,
                    disabled=frozen,
                )
            )
        out.append(
            Action(
                "set_ramp",
                "Set ramp…",
                f"set the share of new analysis work routed to {new} (now {v.ramp_percent}%) "
                f"to the percentage below; the rest stays on {old} ({who}).",
                False,
                needs_percent=True,
            )
        )
    can_roll_back = prev is not None and (
        (ro.state in {R.PENDING, R.ACTIVE} and v.state != S.REGISTERED)
        or (
            ro.state == R.COMPLETED
            and v.state == S.CURRENT
            and prev.state in {S.DRAINING, S.DRAINED}
            # Re-opening it needs the queue free (one active rollout per queue).
            and not Rollout.objects.filter(queue=ro.queue, state__in=Rollout.ACTIVE_STATES)
            .exclude(pk=ro.pk)
            .exists()
        )
    )
    if can_roll_back:
        counts = _counts(v)
        queued = counts.get("queued", 0) + counts.get("scheduled", 0)
        running = counts.get("started", 0) + counts.get("runs", 0)
        moves = (
            f"move {queued} queued job{'s' if queued != 1 else ''} back to {old}"
            if counts
            else f"move its queued jobs back to {old}"
        )
        serve = (
            f"{old} becomes current again and its stored results are served at once "
            "(no recomputation)"
            if v.state == S.CURRENT
            else f"{old} stays current"
        )
        lock = (
            f"the driver {ro.lock_holder} runs it"
            if alive
            else "the deploy lock is taken here with a new fencing token"
        )
        out.append(
            Action(
                "rollback",
                f"Roll back to {old}",
                f"roll back {new} to {old}: stop routing to {new}, {serve}; close {new}'s gate "
                f"so its workers take no new job; {moves}; let its running jobs finish "
                f"({running} now) or stop them after a timeout; mark it drained once its queue "
                f"stays empty on two checks; release the deploy lock ({lock}).",
                True,
            )
        )
    if ro.state in {R.PENDING, R.ACTIVE}:
        out.append(
            Action(
                "abort",
                "Abort",
                f"abort rollout #{ro.pk} of {new}: "
                + (
                    f"nothing was routed to {new} yet, so it just ends ({new} stays {v.state})"
                    if ro.state == R.PENDING or v.state in UNTOUCHED
                    else f"{new} stops receiving work and drains; {old} stays current"
                )
                + (f" ({who})." if alive else " (the deploy lock is taken here)."),
                True,
            )
        )
    # Pending: its first driver has not taken the lock yet — nothing to take over.
    if ro.state in {R.ACTIVE, R.ROLLING_BACK} and not alive:
        beat = ro.heartbeat_at.isoformat() if ro.heartbeat_at else "never"
        out.append(
            Action(
                "takeover",
                "Take over",
                f"take over rollout #{ro.pk}: its driver {ro.lock_holder or '(none)'} is gone "
                f"(last heartbeat {beat}); a new driver on the 'rollouts' queue takes "
                f"locks:queue:{ro.queue}:deploy with a new fencing token, so the old holder's "
                "token is stale from then on; it carries on where the rollout stopped.",
                True,
            )
        )
    return out


def perform(*, rollout: Rollout, verb: str, user: Any, reason: str = "",
            percent: int | None = None) -> str:  # fmt: skip
    """Run one button's action; returns what happened, for the operator. Audited as
    ``rollout.page.<verb>`` with the reason and the plan shown (refusals too).

    Raises ``RolloutError`` (refused by the domain: busy, wrong state, stale token).

    Race: two operators press at once. Requests to a live driver go through
    ``request_action``'s conditional UPDATE (one request, one refusal); two rollbacks of
    a dead driver race for the deploy lock, Redlock gives it to one and the other is
    refused (``RolloutBusy``) — or, once the first committed, is refused because the
    rollout (rolling back) offers no rollback any more. The plan is read before
    the action, so it can be a moment stale; the audit row records what was shown.
    """
    plan = next((a.plan for a in actions_for(rollout) if a.verb == verb), "")
    target = f"rollout #{rollout.pk} {rollout.queue}@{rollout.version.fp12}"
    detail = {"reason": reason, "plan": plan, **({"percent": percent} if percent else {})}
    why = reason or f"{verb} from the Rollouts page"
    try:
        if not plan:
            raise RolloutError(f"rollout #{rollout.pk} offers no {verb.replace('_', ' ')} now")
        outcome = _run(rollout, verb, user, why, percent)
    except RolloutError as exc:
        record_audit(user=user, action=f"rollout.page.{verb}", target=target,
                     outcome=f"refused: {exc}", detail=detail)  # fmt: skip
        raise
    record_audit(
        user=user, action=f"rollout.page.{verb}", target=target, outcome=outcome, detail=detail
    )
    return outcome


def _run(ro: Rollout, verb: str, user: Any, why: str, percent: int | None) -> str:
    if verb in {"promote", "set_ramp"}:
        params: dict[str, Any] = {"reason": why}
        if verb == "set_ramp":
            params["percent"] = percent
        start.request_action(rollout=ro, action=verb, actor=user, params=params)
        return f"{verb.replace('_', ' ')} requested from the driver {ro.lock_holder}"
    if verb == "rollback":
        after = rollback_rollout(rollout=ro, actor=user, reason=why, wait=0.0)
        if after.pending_action and after.pending_action.get("action") == "rollback":
            return f"rollback requested from the driver {ro.lock_holder}"
        return f"routed back to {label(ro.previous)}; {label(ro.version)} is draining"
    if verb == "abort":
        after = abort_rollout(rollout=ro, actor=user, reason=why, wait=0.0)
        if after.pending_action and after.pending_action.get("action") == "abort":
            return f"abort requested from the driver {ro.lock_holder}"
        return f"rollout #{ro.pk} is {after.state}"
    if verb == "takeover":
        if not start.enqueue_driver_job(ro.pk, takeover=True, actor=versions.actor_name(user)):
            raise RolloutError(f"a takeover driver for rollout #{ro.pk} is already queued")
        return "takeover driver queued on the 'rollouts' queue"
    raise RolloutError(f"unknown action {verb!r}")


# ---------------------------------------------------------------------------- retiring a version


def retire_plan(version: AnalyzerVersion) -> str:
    """What the Retire button's confirm step says."""
    return (
        f"retire {label(version)} ({version.state}) for good: it is never staffed, routed or "
        "rolled out again and leaves the Versions table; its stored results stay in the "
        "database, unserved. This cannot be undone."
    )


def retire(*, version: AnalyzerVersion, user: Any, reason: str = "") -> str:
    """The Versions table's Retire button: ``versions.retire_version`` (drained |
    warm_failed → retired); returns what happened. Audited as ``rollout.page.retire``
    with the reason and the plan shown (refusals too); the transition writes its own
    ``rollout.transition`` row and a live ``rollout.*`` event.

    Raises ``RolloutError`` (``InvalidTransition`` naming the state when it allows no
    retirement). Race: the version changes state between the page and the press (a
    re-activation, another operator's retire): ``do_transition`` checks the edge again
    on the locked row, so the later press is refused, never applied twice.
    """
    plan = retire_plan(version)
    target = label(version)
    detail = {"reason": reason, "plan": plan}
    try:
        if version.state not in RETIRABLE:
            raise InvalidTransition(
                f"{target} is {version.state}: only a drained or warm_failed version can be "
                "retired (roll it back or let it drain first)"
            )
        retire_version(
            fingerprint=version.fingerprint,
            queue=version.queue,
            actor=user,
            reason=reason or "retired from the Rollouts page",
        )
    except RolloutError as exc:
        record_audit(user=user, action="rollout.page.retire", target=target,
                     outcome=f"refused: {exc}", detail=detail)  # fmt: skip
        raise
    outcome = f"{target} retired ({version.state} → retired)"
    record_audit(
        user=user, action="rollout.page.retire", target=target, outcome=outcome, detail=detail
    )
    return outcome
