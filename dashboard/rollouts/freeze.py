"""Freeze windows and stop-the-line (docs/rollouts.md#freeze-windows).

Declared windows (``GITWARD_FREEZE_WINDOWS``: absolute, or weekly in UTC) and one global
switch an operator flips (:func:`set_stop_the_line`, audited) during which starting,
ramping up and promoting a rollout are refused with :class:`RolloutFrozen` (a
``RolloutBusy``: the API answers 409) naming the window and until when. Rolling back and
aborting are always allowed: they only ever reduce what the new version serves.

The hooks are thin: ``start.start_rollout`` and ``start.request_action`` call
:func:`refuse_if_frozen`; the driver calls :func:`refuse_if_frozen` before a step
advance it was asked for and :func:`driver_waits` before one it would make by itself
(``auto``), which then waits and says so on the timeline.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from dashboard.accounts import record_audit
from dashboard.models import FreezeSwitch, Rollout, RolloutEvent
from dashboard.versions import RolloutBusy, actor_name, record_event

#: The actions a freeze refuses; ``rollback`` and ``abort`` are never refused.
FROZEN_ACTIONS = frozenset({"start", "promote", "set_ramp"})
#: The name the stop-the-line switch goes by in refusals.
STOP_THE_LINE = "stop-the-line"


class RolloutFrozen(RolloutBusy):
    """Refused: a freeze window (or stop-the-line) is in force. A ``RolloutBusy``, so every
    adapter that answers a busy queue with 409 answers this with 409 too."""

    def __init__(self, freeze: Freeze, action: str) -> None:
        self.freeze = freeze
        self.action = action
        super().__init__(f"{action.replace('_', ' ')} refused: {freeze.describe()}")


@dataclass(frozen=True)
class Freeze:
    """One freeze in force: its window's name, until when (None: until switched off), why."""

    name: str
    until: datetime | None
    reason: str = ""

    def describe(self) -> str:
        if self.name == STOP_THE_LINE:
            why = f": {self.reason}" if self.reason else ""
            return f"stop-the-line is on{why} (rollback and abort stay allowed)"
        until = self.until.isoformat() if self.until else "further notice"
        return f"freeze window {self.name!r} until {until} (rollback and abort stay allowed)"

    def as_dict(self) -> dict[str, Any]:
        return {
            "window": self.name,
            "until": self.until.isoformat() if self.until else None,
            "reason": self.reason,
            "message": self.describe(),
        }


def _clock(hhmm: str) -> timedelta:
    hh, mm = hhmm.split(":")
    return timedelta(hours=int(hh), minutes=int(mm))


def window_at(window: dict[str, Any], now: datetime) -> datetime | None:
    """When ``window`` (one parsed ``GITWARD_FREEZE_WINDOWS`` item) ends, if ``now`` is inside
    it, else None. A weekly window starts on each of its ``days`` at ``start`` (UTC) and
    ends at the next ``end`` (the next day's when ``end`` <= ``start``)."""
    if "from" in window:
        start, until = (
            datetime.fromisoformat(window["from"]),
            datetime.fromisoformat(window["until"]),
        )
        return until if start <= now < until else None
    now = now.astimezone(UTC)
    begin, end = _clock(window["start"]), _clock(window["end"])
    length = end - begin if end > begin else end + timedelta(days=1) - begin
    # A window that began yesterday may still be open (it crosses midnight).
    for back in (0, 1):
        day = now.date() - timedelta(days=back)
        if day.weekday() not in window["days"]:
            continue
        opened = datetime.combine(day, time(0), tzinfo=UTC) + begin
        if opened <= now < opened + length:
            return opened + length
    return None


def active_freeze(now: datetime | None = None) -> Freeze | None:
    """The freeze in force at ``now``: stop-the-line first, then the declared window that
    ends last (the operator waits for all of them). None when nothing is frozen."""
    switch = FreezeSwitch.objects.filter(pk=1).first()
    if switch is not None and switch.on:
        return Freeze(STOP_THE_LINE, None, switch.reason)
    now = now or timezone.now()
    open_windows = [
        (until, str(w["name"]))
        for w in settings.FREEZE_WINDOWS
        if (until := window_at(w, now)) is not None
    ]
    if not open_windows:
        return None
    until, name = max(open_windows)
    return Freeze(name, until)


def refuse_if_frozen(action: str, *, now: datetime | None = None) -> None:
    """Raise ``RolloutFrozen`` if ``action`` (one of ``FROZEN_ACTIONS``) is frozen now.

    Race: a freeze that begins just after this check lets this one start or request
    through, as if it had come a moment earlier; every later step advance is checked
    again by the driver (``driver_waits``, and this function before a request runs)."""
    if action not in FROZEN_ACTIONS:
        return
    freeze = active_freeze(now)
    if freeze is not None:
        raise RolloutFrozen(freeze, action)


def refuse_frozen_request(rollout_id: int, action: str, params: Any) -> None:
    """``refuse_if_frozen`` for an operator's request to a rollout: a promote, or a
    set_ramp that raises the share, is refused; lowering the share, rollback and abort
    never are."""
    if action == "set_ramp":
        try:
            percent = int((params or {}).get("percent") or 0)
        except (TypeError, ValueError):
            return  # the driver refuses the bad value itself (action.failed)
        ramp = (
            Rollout.objects.filter(pk=rollout_id)
            .values_list("version__ramp_percent", flat=True)
            .first()
        )
        if ramp is not None and percent <= ramp:
            return
    refuse_if_frozen(action)


def driver_waits(ro: Rollout, *, token: int | None, actor: Any, step: str) -> bool:
    """Whether an ``auto`` driver must hold back its next step (``step``, e.g. "ramp to
    50%"); while it waits, a ``freeze.waiting`` event on the timeline names the window and
    until when (once per window and end: the driver polls twice a second). Called between
    the driver's steps, outside their transactions: a freeze that begins just after this
    check lets one step through, the same as a step that was a moment earlier."""
    freeze = active_freeze()
    if freeze is None:
        return False
    detail = {**freeze.as_dict(), "step": step}
    last = (
        RolloutEvent.objects.filter(rollout=ro, action="freeze.waiting")
        .order_by("-at", "-id")
        .first()
    )
    if (
        last is None
        or last.detail.get("window") != freeze.name
        or (last.detail.get("until") != detail["until"])
    ):
        until = detail["until"] or "stop-the-line is switched off"
        with transaction.atomic():
            record_event(
                ro, ro.version, "freeze.waiting", "", "", actor,
                f"waiting for {freeze.name} to end before {step} (until {until})", token, detail,
            )  # fmt: skip
    return True


def rollout_freeze(ro: Rollout) -> dict[str, Any] | None:
    """For an active rollout during a freeze: the freeze (``Freeze.as_dict``) and what it
    holds back (``step``, from the driver's latest ``freeze.waiting``, else None); else
    None. ``GET /api/rollouts/<id>`` and ``rollout status`` show it as ``frozen``."""
    if not ro.is_active:
        return None
    active = active_freeze()
    if active is None:
        return None
    last = (
        RolloutEvent.objects.filter(rollout=ro, action="freeze.waiting")
        .order_by("-at", "-id")
        .first()
    )
    step = last.detail.get("step") if last is not None else None
    return {**active.as_dict(), "step": step}


def stop_the_line() -> dict[str, Any]:
    """The switch's state: ``{on, reason, actor, changed_at}``."""
    switch = FreezeSwitch.objects.filter(pk=1).first()
    if switch is None:
        return {"on": False, "reason": "", "actor": "", "changed_at": None}
    return {
        "on": switch.on,
        "reason": switch.reason,
        "actor": switch.actor,
        "changed_at": switch.changed_at.isoformat() if switch.changed_at else None,
    }


def freeze_status(now: datetime | None = None) -> dict[str, Any]:
    """What ``GET /api/rollouts/freeze`` and ``rollout freeze status`` show: the switch,
    the declared windows, and the freeze in force (or None)."""
    freeze = active_freeze(now)
    return {
        "frozen": freeze is not None,
        "active": freeze.as_dict() if freeze is not None else None,
        "stop_the_line": stop_the_line(),
        "windows": list(settings.FREEZE_WINDOWS),
    }


def set_stop_the_line(*, on: bool, actor: Any, reason: str) -> dict[str, Any]:
    """Flip the global switch; audited as ``rollout.stop_the_line`` with the reason.

    Race: two operators flip at once; the row is written under ``select_for_update`` and
    each flip is its own audit row, so the switch ends in the last writer's state and
    both flips are on record."""
    with transaction.atomic():
        switch, _ = FreezeSwitch.objects.select_for_update().get_or_create(pk=1)
        was = switch.on
        switch.on = on
        switch.reason = reason
        switch.actor = actor_name(actor)
        switch.changed_at = timezone.now()
        switch.save()
        record_audit(
            user=actor,
            action="rollout.stop_the_line",
            target="rollouts",
            outcome=f"{'on' if was else 'off'} → {'on' if on else 'off'}",
            detail={"reason": reason},
            reason=reason,
        )
    return stop_the_line()
