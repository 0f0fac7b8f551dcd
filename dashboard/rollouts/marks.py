"""Rollout marks on the Overview's 24-hour charts (docs/rollouts.md#chart-marks): one per
transition of a rollout's version inside a time window, labelled, so a change in
throughput or failures can be read against the rollout step that preceded it."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from dashboard.models import RolloutEvent


def transition_marks(start: datetime, end: datetime) -> list[dict[str, Any]]:
    """``[{at, label, title, rollout}]``, oldest first: each version transition recorded
    by a rollout for its own version in ``[start, end)`` (the previous version's
    "superseded" at a promote happens at the same moment as the promote and is left out).
    Read only."""
    rows = (
        RolloutEvent.objects.filter(
            action="transition", rollout__isnull=False, at__gte=start, at__lt=end
        )
        .select_related("rollout", "version")
        .order_by("at", "id")
    )
    marks: list[dict[str, Any]] = []
    for ev in rows:
        if ev.rollout is None or ev.version_id != ev.rollout.version_id:
            continue
        state = ev.to_state
        ramp = ev.detail.get("ramp_percent")
        short = f"{ramp}%" if state == "ramping" and ramp is not None else state
        marks.append(
            {
                "at": ev.at,
                "label": f"#{ev.rollout_id} {short}",
                "title": (
                    f"rollout #{ev.rollout_id} {ev.version.queue}@{ev.version.fp12}: "
                    f"{ev.from_state or '∅'} → {short} at {ev.at:%H:%M} UTC"
                    + (f" ({ev.reason})" if ev.reason else "")
                ),
                "rollout": ev.rollout_id,
            }
        )
    return marks
