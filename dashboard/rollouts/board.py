"""The Rollouts page (docs/rollouts.md): what it shows.

Reads: the versions of every queue with their workers, a rollout's progress, gate
verdict, result diff and timeline. Its buttons (which a rollout offers, what pressing
one does: :func:`perform`) are in ``dashboard.rollouts.buttons``; the *rollback offers*
beside the dead letters and on the overview in ``dashboard.rollouts.rollback_offers``. Both are
re-exported here, the one import of the page's views.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from dashboard.models import AnalyzerVersion, Rollout, RolloutEvent, WorkerBeat
from dashboard.rollouts.buttons import (
    DESTRUCTIVE,
    PERMISSION,
    VERBS,
    Action,
    actions_for,
    label,
    perform,
    permitted,
    retire,
    retire_plan,
)
from dashboard.rollouts.checklist import describe_rollout
from dashboard.rollouts.deploy_lock import holder_alive
from dashboard.rollouts.rollback_offers import (
    NEWLY_CURRENT,
    canary_offers,
    dead_letter_offers,
    suspect_rollouts,
)
from dashboard.rollouts.warming import warm_progress
from dashboard.versions import RETIRABLE, live_workers

__all__ = [
    "DESTRUCTIVE", "NEWLY_CURRENT", "PERMISSION", "VERBS", "Action", "actions_for",
    "canary_offers", "checklist_blocks", "config_text", "contract_view", "dead_letter_offers",
    "holder_alive",
    "label", "live_snapshot", "perform", "permitted", "retire", "rollout_view",
    "rollouts_page", "suspect_rollouts", "version_rows",
]  # fmt: skip

S = AnalyzerVersion.State

#: What each config key's change means for the numbers (the diff's headline).
_EFFECTS = {
    ("detect_renames", True): "renames now one file",
    ("detect_renames", False): "renames count as a deletion and an addition again",
    ("ignore_whitespace", True): "whitespace-only changes no longer count",
    ("ignore_whitespace", False): "whitespace-only changes count again",
}


def config_text(config: dict[str, Any]) -> str:
    """``detect_renames=true, ignore_whitespace=false, exclude_paths=[vendor/**]``."""
    flags = [f"{k}={'true' if config.get(k) else 'false'}"
             for k in ("detect_renames", "ignore_whitespace")]  # fmt: skip
    return ", ".join([*flags, f"exclude_paths=[{', '.join(config.get('exclude_paths') or [])}]"])


# ---------------------------------------------------------------------------- versions


def version_rows() -> list[dict[str, Any]]:
    """Every version, by queue, with its workers (``WorkerBeat`` rows of its fingerprint),
    the live workers of its code (``code_workers``) and, for one that may be retired
    (registered, drained, warm_failed), the Retire button's plan."""
    versions = list(AnalyzerVersion.objects.exclude(state=S.RETIRED).order_by("queue", "-pk"))
    cutoff = timezone.now() - timedelta(seconds=settings.WORKER_DEAD_AFTER)
    beats: dict[str, list[dict[str, Any]]] = {}
    for w in WorkerBeat.objects.filter(
        version__in=[v.fingerprint for v in versions], stopped_at__isnull=True
    ).order_by("name"):
        beats.setdefault(w.version, []).append(
            {"name": w.name, "host": w.host, "pid": w.pid, "alive": w.last_seen >= cutoff}
        )
    by_code = live_workers()  # docs/rollouts.md#code-rollouts-bluegreen
    return [
        {
            "version": v,
            "label": label(v),
            "config": config_text(v.config),
            "workers": beats.get(v.fingerprint, []),
            "live_workers": sum(1 for w in beats.get(v.fingerprint, []) if w["alive"]),
            # live workers whose code can load this version; none: nothing can warm,
            # ramp or serve it, and a code rollout of it is refused
            "code_workers": len(by_code.get(v.code_version, [])),
            "startable": v.state in {S.REGISTERED, S.WARM_FAILED, S.DRAINED},
            "retire_plan": retire_plan(v) if v.state in RETIRABLE else "",
        }
        for v in versions
    ]


# ---------------------------------------------------------------------------- one rollout


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
        "contract": "result contract "
        + str((verdict.get("contract") or {}).get("summary", "checked")),
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


def contract_view(ro: Rollout) -> dict[str, Any] | None:
    """The result contract's state (docs/rollouts.md#result-contract): what may change,
    what was checked, and each offending commit with its fields."""
    contract = ro.contract or {}
    if not contract:
        return None
    return {
        "ok": contract.get("ok", True) is True,
        "summary": contract.get("summary", ""),
        "expected": contract.get("expected") or [],
        "violations": contract.get("violations") or [],
    }


def timeline(ro: Rollout) -> list[RolloutEvent]:
    return list(
        RolloutEvent.objects.filter(rollout=ro).select_related("version").order_by("-at", "-id")
    )


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
        "contract": contract_view(ro),
        "timeline": timeline(ro),
        "actions": actions_for(ro, alive=alive),
        # Changes no rollout.* event announces (warming writes commits; the diff and a
        # failed request are recorded without one; an automatic step's samples, which
        # its waiting line counts): the page polls while any is due.
        "settling": ro.is_active
        and (
            ro.version.state == S.WARMING
            or (ro.version.state == S.RAMPING and ro.auto)
            or (ro.version.state == S.VERIFIED and not ro.diff)
            or ro.pending_action is not None
        ),
    }


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
    """The checklist Markdown (``checklist.rollout_checklist``) as blocks the page's
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
