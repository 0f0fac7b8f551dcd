"""Rollback offers (docs/rollouts.md): a ramping or newly current version whose dead letters
(``JobRun.fingerprint``) or canary health say it is bad, with the rollback of the rollout
that can undo it (shown beside the dead letters and on the overview).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count
from django.utils import timezone

from dashboard.models import AnalyzerVersion, JobRun, Rollout
from dashboard.rollouts import start
from dashboard.rollouts.buttons import actions_for, label
from dashboard.versions import canary_health

S = AnalyzerVersion.State
R = Rollout.State

#: A version made current this recently still offers a rollback beside its dead letters.
NEWLY_CURRENT = timedelta(hours=24)


def _offer(ro: Rollout, why: str) -> dict[str, Any]:
    rollback = next((a for a in actions_for(ro) if a.verb == "rollback"), None)
    return {
        "rollout": ro.pk,
        "version": ro.version.fingerprint,
        "from": label(ro.version),
        "to": label(ro.previous),
        "why": why,
        "plan": rollback.plan if rollback else "",
    }


def suspect_rollouts(*, now: datetime | None = None) -> list[Rollout]:
    """Rollouts whose version is ramping, or current since less than ``NEWLY_CURRENT``
    and still able to roll back to its previous version."""
    now = now or timezone.now()
    out = list(
        Rollout.objects.filter(state=R.ACTIVE, version__state=S.RAMPING).select_related(
            "version", "previous"
        )
    )
    for ro in Rollout.objects.filter(
        state=R.COMPLETED,
        version__state=S.CURRENT,
        finished_at__gte=now - NEWLY_CURRENT,
        previous__state__in=[S.DRAINING, S.DRAINED],
    ).select_related("version", "previous"):
        out.append(ro)
    return out


def dead_letter_offers() -> dict[str, dict[str, Any]]:
    """Dead-letter group (cause key) → the rollback its runs' version offers: a group
    with runs of a ramping or newly current version (``JobRun.fingerprint``)."""
    suspects = {ro.version.fingerprint: ro for ro in suspect_rollouts()}
    if not suspects:
        return {}
    rows = (
        JobRun.objects.filter(state=JobRun.State.DEAD, fingerprint__in=list(suspects))
        .values("cause_key", "fingerprint")
        .annotate(n=Count("id"))
        .order_by("-n")
    )
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r["cause_key"] in out:
            continue
        ro = suspects[r["fingerprint"]]
        n = r["n"]
        why = (
            f"{n} dead letter{'s' if n != 1 else ''} from {label(ro.version)} ({ro.version.state})"
        )
        out[r["cause_key"]] = _offer(ro, why)
    return out


def canary_offers() -> list[dict[str, Any]]:
    """The overview's offers: ramping versions whose canary health check fails."""
    out = []
    for ro in suspect_rollouts():
        if ro.version.state != S.RAMPING:
            continue
        since = ro.step_started_at or ro.version.state_changed_at or ro.created_at
        options = start.validate_options(ro.options)
        health = canary_health(rollout=ro, since=since, min_samples=int(options["min_samples"]))
        if health["verdict"] == "fail":
            out.append(_offer(ro, f"canary health check fails: {health['summary']}"))
    return out
