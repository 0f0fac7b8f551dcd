"""Reading a rollout back from its row and its events (``RolloutEvent``): the JSON
description (the API's shape) and the release checklist (Markdown)."""

from __future__ import annotations

from typing import Any

from dashboard.models import Rollout, RolloutEvent
from dashboard.rollouts.checks import measurements
from dashboard.rollouts.contract import contract_lines
from dashboard.rollouts.pins import pinned
from dashboard.rollouts.waiting import waiting
from dashboard.versions import physical_queue


def describe_rollout(ro: Rollout, *, timeline: bool = False) -> dict[str, Any]:
    """A rollout as JSON (the API's and ``rollout status --json``'s shape)."""
    v, prev = ro.version, ro.previous
    out: dict[str, Any] = {
        "id": ro.pk,
        "queue": ro.queue,
        "state": ro.state,
        "version": {
            "fingerprint": v.fingerprint,
            "state": v.state,
            "ramp_percent": v.ramp_percent,
            "config": v.config,
            "queue": physical_queue(v.queue, v.fingerprint),
        },
        "previous": {
            "fingerprint": prev.fingerprint,
            "state": prev.state,
            "queue": physical_queue(prev.queue, prev.fingerprint),
        }
        if prev
        else None,
        "steps": ro.steps,
        "step_index": ro.step_index,
        "auto": ro.auto,
        "started_by": ro.started_by,
        "lock_holder": ro.lock_holder,
        "lock_token": ro.lock_token,
        "lock_since": ro.lock_since.isoformat() if ro.lock_since else None,
        "heartbeat_at": ro.heartbeat_at.isoformat() if ro.heartbeat_at else None,
        "pending_action": ro.pending_action,
        "verdict": ro.verdict,
        "diff": ro.diff,
        # docs/rollouts.md#result-contract: what may change, what was checked, offenders.
        "contract": ro.contract,
        "outcome": ro.outcome,
        "created_at": ro.created_at.isoformat(),
        "finished_at": ro.finished_at.isoformat() if ro.finished_at else None,
        # What it waits for and until when, while active (docs/rollouts.md#waiting-reason).
        "waiting": waiting(ro),
        # Each step's check and gate measurements, and its pinned repositories
        # (docs/rollouts.md#checks-and-gates, docs/rollouts.md#pinning).
        "measurements": measurements(ro),
        "pins": pinned(ro),
    }
    if timeline:
        out["timeline"] = [
            {
                "at": e.at.isoformat(),
                "actor": e.actor,
                "action": e.action,
                "from": e.from_state,
                "to": e.to_state,
                "token": e.token,
                "reason": e.reason,
                "detail": e.detail,
                "version": e.version.fingerprint if e.version else None,
            }
            for e in RolloutEvent.objects.filter(rollout=ro)
            .select_related("version")
            .order_by("at", "id")
        ]
    return out


def _md(text: Any) -> str:
    """Repository- or operator-supplied text as inert Markdown (no tables broken, no
    HTML): pipes, backticks, angle brackets and newlines are neutralised."""
    out = str(text).replace("\r", " ").replace("\n", " ")
    for ch, rep in (("|", "\\|"), ("`", "'"), ("<", "&lt;"), (">", "&gt;")):
        out = out.replace(ch, rep)
    return out


def _when(e: RolloutEvent | None) -> str:
    return e.at.strftime("%Y-%m-%d %H:%M:%S UTC") if e is not None else ""


def _rollback_line(e: RolloutEvent) -> str:
    counts = _md(e.detail.get("counts", "")) if e.action == "drain.check" else ""
    change = f"{e.from_state or ''}→{e.to_state or ''}" if e.to_state else ""
    return f"- {_when(e)} {_md(e.actor)}: {e.action} {change} {_md(e.reason)} {counts}".rstrip()


def _contract_items(ro: Rollout, events: list[RolloutEvent], item: Any) -> list[str]:
    """The result contract's line (docs/rollouts.md#result-contract), and under a broken
    one each offending commit with its fields and what changed."""
    state = ro.contract or {}
    if not state:
        return [item(None, "Result contract checked")]
    failed = next((e for e in events if e.action == "contract.failed"), None)
    if state.get("ok", True):
        return [f"- [x] Result contract {_md(state.get('summary', ''))}"]
    out = [f"- [ ] Result contract **{_md(state.get('summary', ''))}**"
           + (f" — {_when(failed)}" if failed else "")]  # fmt: skip
    out += [f"- Offending: {_md(line)}" for line in contract_lines(state)[1:]]
    return out


def rollout_checklist(rollout: Rollout) -> str:
    """The checklist of one rollout: version tags, lock taken/released, warming verdict,
    result diff, ramp steps, promotion or rollback steps, observability notes, timeline."""
    ro = Rollout.objects.select_related("version", "previous").get(pk=rollout.pk)
    events = list(RolloutEvent.objects.filter(rollout=ro).order_by("at", "id"))
    v, prev = ro.version, ro.previous

    def first(action: str, to: str | None = None) -> RolloutEvent | None:
        return next(
            (e for e in events if e.action == action and (to is None or e.to_state == to)), None
        )

    def item(done: RolloutEvent | None, text: str) -> str:
        mark = "x" if done is not None else " "
        return f"- [{mark}] {text}" + (f" — {_when(done)} by {_md(done.actor)}" if done else "")

    lock = first("lock.taken")
    takeovers = [e for e in events if e.action == "takeover"]
    released = [e for e in events if e.action in {"lock.released", "lock.lost"}]
    warming = first("transition", "warming")
    verdict = first("verdict")
    diff = first("diff")
    ramps = [e for e in events if e.action == "transition" and e.to_state == "ramping"]
    promoted = next(
        (
            e
            for e in events
            if e.action == "transition" and e.to_state == "current" and e.version_id == v.pk
        ),
        None,
    )
    rollback = [
        e
        for e in events
        if (e.action == "rollout" and e.to_state in {"rolling_back", "rolled_back", "aborted"})
        or (e.action == "transition" and e.to_state in {"draining", "drained"})
        or e.action == "drain.check"
    ]
    lines = [
        f"# Rollout #{ro.pk}: {_md(ro.queue)}@{v.fp12}",
        "",
        f"- **State**: {ro.state}" + (f" — {_md(ro.outcome)}" if ro.outcome else ""),
        f"- **Started by**: {_md(ro.started_by)} at {ro.created_at:%Y-%m-%d %H:%M:%S UTC}",
        f"- **New version**: `{v.fingerprint}` (code {_md(v.code_version)}, config "
        f"{_md(v.config)}), physical queue `{physical_queue(v.queue, v.fingerprint)}`",
        f"- **Previous version**: `{prev.fingerprint}` (config {_md(prev.config)})"
        if prev
        else "- **Previous version**: none",
        f"- **Steps**: {', '.join(f'{s}%' for s in ro.steps)}"
        + (" (automatic, health-checked)" if ro.auto else " (manual)"),
        "",
        "## Checklist",
        "",
        item(
            lock,
            f"Deploy lock `locks:queue:{_md(ro.queue)}:deploy` taken"
            + (f" (token {lock.token}, holder {_md(lock.detail.get('holder'))})" if lock else ""),
        ),
    ]
    for t in takeovers:
        lines.append(item(t, f"Lock taken over (token {t.token}): {_md(t.reason)}"))
    ws = (warming.detail.get("warm_set") or {}) if warming else {}
    lines += [
        item(
            warming,
            f"Warming started ({ws.get('repositories', 0)} repositories, "
            f"{ws.get('commits', 0)} commits)",
        ),
        item(
            verdict,
            "Warming verdict: "
            + (_md((verdict.detail.get("verdict") or {}).get("summary", "")) if verdict else ""),
        ),
        item(diff, "Result diff reviewed: " + (_md(diff.reason) if diff else "")),
    ]
    lines += _contract_items(ro, events, item)
    for r in ramps:
        lines.append(
            item(r, f"Ramp {r.detail.get('ramp_from', 0)}% → {r.detail.get('ramp_percent')}%")
        )
    lines.append(item(promoted, "Promoted to current"))
    lines.append(
        item(released[-1] if released else None, "Deploy lock released")
        if not released or released[-1].action == "lock.released"
        else item(released[-1], "Deploy lock **lost** (lease ran out)")
    )
    measured = measurements(ro)
    if measured:  # docs/rollouts.md#checks-and-gates: each step's checks and gates
        lines += ["", "## Checks and gates", ""]
        for step in measured:
            for kind in ("checks", "gates"):
                for m in step[kind]:
                    dry = " (dry run)" if m["dry_run"] else ""
                    c = m["counts"]
                    lines.append(
                        f"- step {step['percent']}%: {kind[:-1]} {_md(m['name'])}{dry}: "
                        f"{m['outcome']} — {_md(m['message'])} ({c['success']} passed, "
                        f"{c['failure']} failed, {c['inconclusive']} inconclusive)"
                    )
    lines += ["", "## Rollback steps taken", ""]
    lines += [_rollback_line(e) for e in rollback] or ["- none"]
    lines += [
        "",
        "## Observability notes",
        "",
        f"- Watch: `manage.py rollout status` / the Rollouts page; the new version's jobs run "
        f"on `{physical_queue(v.queue, v.fingerprint)}`"
        + (
            f", the previous version's on `{physical_queue(prev.queue, prev.fingerprint)}`"
            if prev
            else ""
        )
        + ".",
        f"- Roll back: `manage.py rollout rollback {ro.pk}` (add `--force` if its driver is "
        "alive but stuck).",
        "",
        "## Timeline",
        "",
        "| at | actor | event | change | token | reason |",
        "|---|---|---|---|---|---|",
    ]
    for e in events:
        change = f"{e.from_state or '∅'} → {e.to_state}" if e.to_state else ""
        lines.append(
            f"| {_when(e)} | {_md(e.actor)} | {e.action} | {change} | {e.token or ''} | "
            f"{_md(e.reason)} |"
        )
    return "\n".join(lines) + "\n"
