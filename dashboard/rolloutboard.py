"""The Rollouts page (DESIGN §12): what it shows and what its buttons do.

Reads: the versions of every queue with their workers, a rollout's progress, gate
verdict, result diff and timeline, and the *rollback offers* — a ramping or newly current
version whose dead letters (``JobRun.fingerprint``) or canary health say it is bad, with
the rollout that can roll it back (shown beside the dead letters and on the overview).

Writes: :func:`perform` runs one operator action through the rollout domain
(``dashboard.rollouts`` / ``dashboard.deploylock``), never around it, and writes one
``rollout.page.<verb>`` audit row with the operator's reason and the exact plan the
confirm step showed. Operators never hold the deploy lock's token: promote / set ramp /
abort of a live driver are *requests* it runs within a poll; a rollback whose driver is
gone (or finished) takes the lock here for the few milliseconds the routing change needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Count
from django.utils import timezone

from dashboard import leases, rollouts
from dashboard.audit import record_audit
from dashboard.canary import canary_health
from dashboard.checklists import describe_rollout
from dashboard.deploylock import abort_rollout, rollback_rollout
from dashboard.models import AnalyzerVersion, JobRun, Rollout, RolloutEvent, WorkerBeat
from dashboard.rollouts import RolloutError, drain_counts, physical_queue
from dashboard.warming import warm_progress
from workers import lockkeys

S = AnalyzerVersion.State
R = Rollout.State

#: A version made current this recently still offers a rollback beside its dead letters.
NEWLY_CURRENT = timedelta(hours=24)

#: What each config key's change means for the numbers (the diff's headline).
_EFFECTS = {
    ("detect_renames", True): "renames now one file",
    ("detect_renames", False): "renames count as a deletion and an addition again",
    ("ignore_whitespace", True): "whitespace-only changes no longer count",
    ("ignore_whitespace", False): "whitespace-only changes count again",
}

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
}


def permitted(user: Any, verb: str) -> bool:
    """Operator actions need staff status *and* the explicit permission (as the DLQ's)."""
    return bool(
        getattr(user, "is_active", False)
        and getattr(user, "is_staff", False)
        and user.has_perm(PERMISSION[verb])
    )


def config_text(config: dict[str, Any]) -> str:
    """``detect_renames=true, ignore_whitespace=false, exclude_paths=[vendor/**]``."""
    flags = [f"{k}={'true' if config.get(k) else 'false'}"
             for k in ("detect_renames", "ignore_whitespace")]  # fmt: skip
    return ", ".join([*flags, f"exclude_paths=[{', '.join(config.get('exclude_paths') or [])}]"])


def label(version: AnalyzerVersion | None) -> str:
    """``analysis@3f2a9c1e`` — the name operators see (the physical queue)."""
    if version is None:
        return "—"
    return physical_queue(version.queue, version.fingerprint)


# ---------------------------------------------------------------------------- versions


def version_rows() -> list[dict[str, Any]]:
    """Every version, by queue, with its workers (``WorkerBeat`` rows of its fingerprint)."""
    versions = list(AnalyzerVersion.objects.exclude(state=S.RETIRED).order_by("queue", "-pk"))
    cutoff = timezone.now() - timedelta(seconds=settings.WORKER_DEAD_AFTER)
    beats: dict[str, list[dict[str, Any]]] = {}
    for w in WorkerBeat.objects.filter(
        version__in=[v.fingerprint for v in versions], stopped_at__isnull=True
    ).order_by("name"):
        beats.setdefault(w.version, []).append(
            {"name": w.name, "host": w.host, "pid": w.pid, "alive": w.last_seen >= cutoff}
        )
    return [
        {
            "version": v,
            "label": label(v),
            "config": config_text(v.config),
            "workers": beats.get(v.fingerprint, []),
            "live_workers": sum(1 for w in beats.get(v.fingerprint, []) if w["alive"]),
        }
        for v in versions
    ]


# ---------------------------------------------------------------------------- one rollout


def holder_alive(ro: Rollout) -> bool:
    """The rollout's deploy lock is in Redis under its recorded token (a live driver)."""
    info = leases.redlock().inspect(lockkeys.deploy(ro.queue))
    return bool(info and (info.get("holder") or {}).get("token") == ro.lock_token)


def _counts(version: AnalyzerVersion) -> dict[str, int]:
    try:
        return drain_counts(version)
    except Exception:  # Redis down: the plan says "its queued jobs" without a number
        return {}


def diff_view(ro: Rollout) -> dict[str, Any] | None:
    """The stored result diff, with a headline naming what the config change does."""
    diff = ro.diff or {}
    if not diff:
        return None
    prev = ro.previous.config if ro.previous else {}
    new = ro.version.config
    effects = [
        _EFFECTS[(key, bool(new.get(key)))]
        for key in ("detect_renames", "ignore_whitespace")
        if bool(new.get(key)) != bool(prev.get(key))
    ]
    added = sorted(set(new.get("exclude_paths") or []) - set(prev.get("exclude_paths") or []))
    removed = sorted(set(prev.get("exclude_paths") or []) - set(new.get("exclude_paths") or []))
    if added:
        effects.append(f"paths matching {', '.join(added)} no longer count")
    if removed:
        effects.append(f"paths matching {', '.join(removed)} count again")
    n = int(diff.get("commits_changed", 0))
    what = "; ".join(effects) or "same numbers expected"
    headline = (
        f"{n} commit{'s' if n != 1 else ''} change: {what}" if n else f"no commit changes ({what})"
    )
    totals = diff.get("totals") or {}
    before, after = totals.get("before") or {}, totals.get("after") or {}
    return {
        "headline": headline,
        "summary": diff.get("summary", ""),
        "compared": diff.get("compared", 0),
        "missing": diff.get("missing", {}),
        "commits_changed": n,
        "changed": diff.get("changed", {}),
        "totals": [
            {
                "name": k.replace("_", " "),
                "before": before.get(k, 0),
                "after": after.get(k, 0),
                "delta": after.get(k, 0) - before.get(k, 0),
            }
            for k in ("files_changed", "insertions", "deletions", "file_rows")
        ],
        "examples": diff.get("examples", []),
    }


def progress_view(ro: Rollout) -> dict[str, Any] | None:
    """Warming progress (stored / expected commits of the warm set under the new
    fingerprint) once the warm set is chosen."""
    if not (ro.warm_set or {}).get("items"):
        return None
    p = warm_progress(version=ro.version, warm_set=ro.warm_set)
    pct = round(100 * p["stored"] / p["expected"]) if p["expected"] else 0
    return {**p, "percent": min(100, pct)}


def verdict_view(ro: Rollout) -> dict[str, Any] | None:
    verdict = ro.verdict or {}
    if not verdict:
        return None
    names = {
        "coverage": f"coverage {verdict.get('stored', '?')}/{verdict.get('expected', '?')} "
        f"(need {float(verdict.get('threshold', 0)):.0%})",
        "errors": f"{verdict.get('errors', '?')} errors",
        "fingerprint": f"{verdict.get('foreign_rows', '?')} rows with another fingerprint",
        "workers": f"{len(verdict.get('workers') or [])} worker(s) report the new fingerprint",
    }
    checks = [
        {"name": k, "ok": bool(v), "text": names.get(k, k)}
        for k, v in (verdict.get("checks") or {}).items()
    ]
    return {
        "ok": verdict.get("ok") is True,
        "summary": verdict.get("summary", ""),
        "checks": checks,
    }


def timeline(ro: Rollout) -> list[RolloutEvent]:
    return list(
        RolloutEvent.objects.filter(rollout=ro).select_related("version").order_by("-at", "-id")
    )


@dataclass(frozen=True)
class Action:
    """One button: what it is called, what the confirm step says will happen."""

    verb: str
    label: str
    plan: str
    danger: bool
    needs_percent: bool = False


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
                    "nothing was warmed yet, so it just ends"
                    if v.state == S.REGISTERED
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


def rollout_view(ro: Rollout) -> dict[str, Any]:
    """Everything the rollout's section of the page shows."""
    alive = holder_alive(ro) if ro.is_active else False
    return {
        "rollout": ro,
        "data": describe_rollout(ro),
        "new": label(ro.version),
        "old": label(ro.previous),
        "config": config_text(ro.version.config),
        "old_config": config_text(ro.previous.config) if ro.previous else "",
        "alive": alive,
        "progress": progress_view(ro),
        "verdict": verdict_view(ro),
        "diff": diff_view(ro),
        "timeline": timeline(ro),
        "actions": actions_for(ro, alive=alive),
        # Changes no rollout.* event announces (warming writes commits; the diff and a
        # failed request are recorded without one): the page polls while any is due.
        "settling": ro.is_active
        and (
            ro.version.state == S.WARMING
            or (ro.version.state == S.VERIFIED and not ro.diff)
            or ro.pending_action is not None
        ),
    }


# ---------------------------------------------------------------------------- rollback offers


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
        options = rollouts.validate_options(ro.options)
        health = canary_health(rollout=ro, since=since, min_samples=int(options["min_samples"]))
        if health["verdict"] == "fail":
            out.append(_offer(ro, f"canary health check fails: {health['summary']}"))
    return out


# ---------------------------------------------------------------------------- actions


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
        rollouts.request_action(rollout=ro, action=verb, actor=user, params=params)
        return f"{verb.replace('_', ' ')} requested from the driver {ro.lock_holder}"
    if verb == "rollback":
        after = rollback_rollout(rollout=ro, actor=user, reason=why, wait=0.0)
        if after.pending_action and after.pending_action.get("action") == "rollback":
            return f"rollback requested from the driver {ro.lock_holder}"
        return f"routed back to {label(ro.previous)}; {label(ro.version)} is draining"
    if verb == "abort":
        if ro.is_active and holder_alive(ro):
            rollouts.request_action(rollout=ro, action="abort", actor=user, params={"reason": why})
            return f"abort requested from the driver {ro.lock_holder}"
        after = abort_rollout(rollout=ro, actor=user, reason=why, wait=0.0)
        return f"rollout #{ro.pk} is {after.state}"
    if verb == "takeover":
        if not rollouts.enqueue_driver_job(ro.pk, takeover=True, actor=rollouts.actor_name(user)):
            raise RolloutError(f"a takeover driver for rollout #{ro.pk} is already queued")
        return "takeover driver queued on the 'rollouts' queue"
    raise RolloutError(f"unknown action {verb!r}")


def rollouts_page() -> dict[str, Any]:
    """The page: versions, each queue's latest rollout in full (the active one, or the
    last one, which a rollback after promote still acts on), and the recent ones."""
    recent = list(Rollout.objects.select_related("version", "previous").order_by("-pk")[:20])
    latest: dict[str, Rollout] = {}
    for ro in recent:
        latest.setdefault(ro.queue, ro)
    for ro in Rollout.objects.filter(state__in=Rollout.ACTIVE_STATES).select_related(
        "version", "previous"
    ):
        latest[ro.queue] = ro
    return {
        "versions": version_rows(),
        "shown": [rollout_view(ro) for ro in latest.values()],
        "recent": recent,
    }


def checklist_blocks(markdown: str) -> list[dict[str, Any]]:
    """The checklist Markdown (``checklists.rollout_checklist``) as blocks the page's
    template renders (escaped): headings, check items, list items and the timeline
    table. Only the subset that function writes; emphasis marks are dropped."""
    blocks: list[dict[str, Any]] = []
    for raw in markdown.splitlines():
        line = raw.rstrip()
        text = line.replace("**", "").replace("`", "")
        if not line:
            continue
        if line.startswith("#"):
            level = min(len(line) - len(line.lstrip("#")), 3)
            blocks.append({"kind": "heading", "level": level + 1, "text": text.lstrip("# ")})
        elif line.startswith(("- [x] ", "- [ ] ")):
            blocks.append({"kind": "check", "done": line[3] == "x", "text": text[6:]})
        elif line.startswith("- "):
            blocks.append({"kind": "item", "text": text[2:]})
        elif line.startswith("|"):
            cells = [c.strip().replace("\\|", "|") for c in line.strip("|").split(" | ")]
            if all(set(c) <= {"-", "|", ":"} for c in cells):
                continue
            if blocks and blocks[-1]["kind"] == "table":
                blocks[-1]["rows"].append(cells)
            else:
                blocks.append({"kind": "table", "head": cells, "rows": []})
        else:
            blocks.append({"kind": "text", "text": text})
    return blocks


def live_snapshot() -> dict[str, Any]:
    """What the Rollouts pages' socket sends on (re)connect: each recent rollout's state
    and its version's, so a page that missed events while reconnecting re-renders."""
    rows = Rollout.objects.select_related("version").order_by("-pk")[:20]
    return {
        "rollouts": [
            {
                "rollout": ro.pk,
                "state": ro.state,
                "version_state": ro.version.state,
                "ramp_percent": ro.version.ramp_percent,
                "updated_at": ro.updated_at.isoformat(),
            }
            for ro in rows
        ]
    }
