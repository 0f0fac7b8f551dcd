"""Operator-defined checks and gates of a ramp step (docs/rollouts.md#checks-and-gates), as
Argo Rollouts' AnalysisTemplates do.

* **Checks** — PromQL queries against ``GITWARD_PROMETHEUS_URL`` (``/api/v1/query``),
  each judged by its ``success`` / ``failure`` conditions (``dashboard.rollouts.conditions``):
  :func:`measure_step` takes the measurements that are due (one per check per
  ``interval``) and stores each as a ``RolloutMeasurement``; :func:`step_checks` reads the
  step's verdict from them. A check fails the step once it failed more than its
  ``failure_limit`` times in the step; a ``dry_run`` check is recorded and never blocks.
* **Gates** — signed POSTs (``notifications.sign``, the same headers as the rollout
  webhooks) to ``GITWARD_ROLLOUT_GATES`` before the promote to current (``when:
  promotion``) or before every step advance (``when: step``): :func:`ask_gates`. 2xx
  passes; 4xx/5xx refuses (``on_refusal``: ``hold`` asks again after ``interval``,
  ``fail`` rolls back); no answer within ``GITWARD_WEBHOOK_TIMEOUT`` is inconclusive.

The driver (``dashboard.rollouts.driver``) calls these beside the canary health check; an
inconclusive result follows the rollout's ``on_inconclusive`` policy at the step's
deadline, as an inconclusive health check does. Only the deploy-lock holder measures
and asks (the driver thread), so one rollout's measurements are written by one writer
at a time; a taken-over driver's last tick may add a row beside its successor's, which
only adds one more measurement of the same step.
"""

from __future__ import annotations

import json
import logging
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from dashboard.models import Rollout, RolloutMeasurement
from dashboard.rollouts.conditions import evaluate, validate_check
from dashboard.rollouts.notifications import USER_AGENT, sign

__all__ = [
    "CheckError",
    "ask_gates",
    "gate_waiting",
    "gates_due",
    "measure_step",
    "measurements",
    "query_prometheus",
    "rollout_checks",
    "step_checks",
    "validate_checks",
]

log = logging.getLogger(__name__)
M = RolloutMeasurement
OUT = RolloutMeasurement.Outcome


class CheckError(Exception):
    """A measurement that gave no value: Prometheus unreachable, an error answer, no
    series, several series, NaN. The measurement is then inconclusive, with this text."""


def validate_checks(items: Any) -> list[dict[str, Any]]:
    """A rollout's ``options.checks``: a list of check specs, names distinct. ValueError
    naming the problem otherwise."""
    if not isinstance(items, list):
        raise ValueError("checks must be a list of check objects")
    out = [validate_check(item) for item in items]
    names = [c["name"] for c in out]
    if len(set(names)) != len(names):
        raise ValueError("checks must have distinct names")
    return out


def rollout_checks(ro: Rollout) -> list[dict[str, Any]]:
    """The checks of a rollout: ``GITWARD_ROLLOUT_CHECKS`` (every rollout's), then the
    rollout's own ``options.checks``; a rollout's check replaces a configured one of the
    same name."""
    own = [validate_check(c) for c in (ro.options or {}).get("checks") or []]
    mine = {c["name"] for c in own}
    return [c for c in settings.ROLLOUT_CHECKS if c["name"] not in mine] + own


# ---------------------------------------------------------------------------- Prometheus


def query_prometheus(query: str, *, url: str | None = None, timeout: float | None = None) -> float:
    """The one value of ``query`` now: a scalar, or a vector of exactly one sample.
    ``CheckError`` otherwise (no URL configured, unreachable, timed out, an error
    answer, an empty or multi-series vector, a non-finite value)."""
    base = (url if url is not None else settings.PROMETHEUS_URL).rstrip("/")
    if not base:
        raise CheckError("GITWARD_PROMETHEUS_URL is not set")
    target = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    request = urllib.request.Request(  # noqa: S310 - http(s) only (settings.PROMETHEUS_URL)
        target, headers={"Accept": "application/json", "User-Agent": USER_AGENT}
    )
    try:
        with urllib.request.urlopen(  # noqa: S310 - http(s) only (settings.PROMETHEUS_URL)
            request, timeout=timeout if timeout is not None else settings.PROMETHEUS_TIMEOUT
        ) as answer:
            body = json.loads(answer.read(1 << 20))
    except urllib.error.HTTPError as exc:
        raise CheckError(f"Prometheus answered HTTP {exc.code}") from None
    except (OSError, ValueError) as exc:  # refused, reset, timeout, not JSON
        raise CheckError(f"Prometheus: {type(exc).__name__}: {exc}"[:300]) from None
    if not isinstance(body, dict) or body.get("status") != "success":
        error = body.get("error") if isinstance(body, dict) else None
        raise CheckError(f"Prometheus: {error or 'not a success answer'}"[:300])
    data = body.get("data") or {}
    kind, result = data.get("resultType"), data.get("result")
    if kind == "scalar" and isinstance(result, list) and len(result) == 2:
        raw = result[1]
    elif kind == "vector" and isinstance(result, list):
        if not result:
            raise CheckError("no data: the query returned an empty vector")
        if len(result) > 1:
            raise CheckError(
                f"{len(result)} series: aggregate the query to one value (e.g. sum(...))"
            )
        raw = (result[0].get("value") or [None, None])[1]
    else:
        raise CheckError(f"unsupported result type {kind!r}: use a scalar or an instant vector")
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise CheckError(f"not a number: {raw!r}"[:300]) from None
    if not math.isfinite(value):
        raise CheckError(f"not a finite number: {raw}")
    return value


def judge(check: Mapping[str, Any], value: float) -> tuple[str, str]:
    """(outcome, why) of ``value``: the failure condition holding fails it, else the
    success condition holding passes it; with only one condition given, the other
    outcome is its negation; with both given and neither holding, inconclusive."""
    success, failure = check.get("success"), check.get("failure")
    if failure is not None and evaluate(failure, value):
        return OUT.FAILURE, f"{value:g}: {failure}"
    if success is not None and evaluate(success, value):
        return OUT.SUCCESS, f"{value:g}: {success}"
    if success is None:
        return OUT.SUCCESS, f"{value:g}: not {failure}"
    if failure is None:
        return OUT.FAILURE, f"{value:g}: not {success}"
    return OUT.INCONCLUSIVE, f"{value:g}: neither {success} nor {failure}"


def _conditions(check: Mapping[str, Any]) -> str:
    parts = [f"{k}: {check[k]}" for k in ("success", "failure") if check.get(k)]
    return "; ".join(parts)


def _step(ro: Rollout) -> tuple[int, int]:
    index = ro.step_index
    percent = ro.steps[index] if 0 <= index < len(ro.steps) else 0
    return index, percent


def _rows(ro: Rollout, kind: str, index: int | None = None) -> list[RolloutMeasurement]:
    """The measurements of the current step (``step_index`` and at or after the step
    began: a set-ramp back to an earlier step starts it afresh)."""
    index = ro.step_index if index is None else index
    rows = M.objects.filter(rollout=ro, kind=kind, step_index=index)
    if index == ro.step_index and ro.step_started_at is not None:
        rows = rows.filter(at__gte=ro.step_started_at)
    return list(rows.order_by("id"))


def measure_step(ro: Rollout, *, now: datetime | None = None) -> list[RolloutMeasurement]:
    """Take every check's measurement that is due in the current step (none of it yet,
    or its last one ``interval`` seconds ago) and store it; returns the new rows."""
    if ro.step_index < 0:
        return []
    now = now or timezone.now()
    index, percent = _step(ro)
    last: dict[str, datetime] = {}
    for row in _rows(ro, M.Kind.CHECK):
        last[row.name] = row.at
    made = []
    for check in rollout_checks(ro):
        seen = last.get(check["name"])
        if seen is not None and now - seen < timedelta(seconds=check["interval"]):
            continue
        value: float | None = None
        try:
            value = query_prometheus(check["query"])
            outcome, message = judge(check, value)
        except CheckError as exc:
            outcome, message = OUT.INCONCLUSIVE, str(exc)
        made.append(
            M.objects.create(
                rollout=ro,
                step_index=index,
                percent=percent,
                kind=M.Kind.CHECK,
                name=check["name"],
                target=check["query"],
                condition=_conditions(check),
                value=value,
                outcome=outcome,
                dry_run=check["dry_run"],
                message=message,
            )
        )
    return made


def _check_state(check: Mapping[str, Any], rows: Sequence[RolloutMeasurement]) -> dict[str, Any]:
    counts = {o: sum(1 for r in rows if r.outcome == o) for o in OUT.values}
    latest = rows[-1] if rows else None
    if counts[OUT.FAILURE] > check["failure_limit"]:
        verdict = "fail"
    elif latest is None:
        verdict = "pending"
    elif latest.outcome == OUT.SUCCESS:
        verdict = "pass"
    else:
        # No value, neither condition, or failed but not more often than its limit
        # allows: not failing the step, not passing it either.
        verdict = "inconclusive"
    return {
        "name": check["name"],
        "query": check["query"],
        "condition": _conditions(check),
        "failure_limit": check["failure_limit"],
        "dry_run": check["dry_run"],
        "verdict": verdict,
        "counts": counts,
        "value": latest.value if latest else None,
        "outcome": latest.outcome if latest else None,
        "message": latest.message if latest else "",
        "at": latest.at.isoformat() if latest else None,
    }


def step_checks(ro: Rollout) -> dict[str, Any]:
    """The current step's verdict from its checks' measurements: ``fail`` if a blocking
    (not dry-run) check failed more than its ``failure_limit``; ``pass`` if every
    blocking check's latest measurement succeeded (also with no checks at all);
    ``inconclusive`` otherwise (no measurement yet, no value, neither condition held).
    ``{"verdict", "summary", "checks": [...]}``."""
    states = [
        _check_state(c, [r for r in _rows(ro, M.Kind.CHECK) if r.name == c["name"]])
        for c in rollout_checks(ro)
    ]
    blocking = [s for s in states if not s["dry_run"]]
    failed = [s for s in blocking if s["verdict"] == "fail"]
    waiting = [s for s in blocking if s["verdict"] != "pass"]
    if failed:
        verdict = "fail"
        summary = "; ".join(
            f"check {s['name']} failed {s['counts'][OUT.FAILURE]}x (limit {s['failure_limit']}):"
            f" {s['message']}"
            for s in failed
        )
    elif waiting:
        verdict = "inconclusive"
        summary = "; ".join(f"check {s['name']} {s['message'] or 'not measured yet'}"
                            for s in waiting)  # fmt: skip
    else:
        verdict, summary = "pass", ""
    return {"verdict": verdict, "summary": summary, "checks": states}


# ---------------------------------------------------------------------------- gates


def gates_due(ro: Rollout) -> list[dict[str, Any]]:
    """The gates the next step advance must pass: every ``when: step`` gate, and the
    ``when: promotion`` ones when the next advance is the promote to current."""
    promoting = ro.step_index + 1 >= len(ro.steps)
    return [g for g in settings.ROLLOUT_GATES if g["when"] == "step" or promoting]


def _gate_body(ro: Rollout, gate: Mapping[str, Any], checks: Mapping[str, Any]) -> dict[str, Any]:
    index, percent = _step(ro)
    nxt = index + 1
    return {
        "id": f"gitward-rollout-{ro.pk}-gate-{gate['name']}-step-{index}",
        "type": "rollout.gate",
        "gate": gate["name"],
        "at": timezone.now().isoformat(),
        "rollout": {
            "id": ro.pk,
            "queue": ro.queue,
            "version": ro.version.fingerprint,
            "previous": ro.previous.fingerprint if ro.previous else None,
        },
        "step": {
            "index": index,
            "percent": percent,
            "next": f"ramp to {ro.steps[nxt]}%" if nxt < len(ro.steps) else "promote to current",
        },
        "checks": [
            {k: s[k] for k in ("name", "verdict", "value", "outcome", "dry_run")}
            for s in checks.get("checks", [])
        ],
    }


def _post(gate: Mapping[str, Any], body: Mapping[str, Any]) -> tuple[int | None, str]:
    """POST the signed body; (HTTP status, the answer's first line) or (None, why)."""
    raw = json.dumps(body, separators=(",", ":"), sort_keys=True).encode()
    stamp = int(time.time())
    request = urllib.request.Request(  # noqa: S310 - http(s) only (conditions.validate_gate)
        gate["url"],
        data=raw,
        method="POST",
        headers={
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            "X-Gitward-Event-Id": str(body["id"]),
            "X-Gitward-Timestamp": str(stamp),
            "X-Gitward-Signature": sign(gate["secret"], stamp, raw),
        },
    )
    try:
        with urllib.request.urlopen(  # noqa: S310 - http(s) only (conditions.validate_gate)
            request, timeout=settings.WEBHOOK_TIMEOUT
        ) as answer:
            text = answer.read(4096).decode("utf-8", "replace")
            return answer.status, text.strip().splitlines()[0][:200] if text.strip() else ""
    except urllib.error.HTTPError as exc:
        text = exc.read(4096).decode("utf-8", "replace").strip()
        return exc.code, text.splitlines()[0][:200] if text else ""
    except (OSError, ValueError) as exc:  # refused, reset, timed out
        return None, f"{type(exc).__name__}: {exc}"[:300]


def ask_gates(ro: Rollout, *, fresh: bool = False, now: datetime | None = None) -> dict[str, Any]:
    """Ask the gates due before the next step advance (:func:`gates_due`) and store each
    answer as a measurement. A gate that passed in this step is not asked again; one
    that refused or did not answer is asked again once its ``interval`` passed (at once
    with ``fresh``: an operator's promote). ``{"verdict", "summary"}``: ``pass`` (all
    passed), ``fail`` (one with ``on_refusal: fail`` refused), ``hold`` (one refused,
    ``on_refusal: hold``, or waits for its interval), ``inconclusive`` (one did not
    answer)."""
    now = now or timezone.now()
    index, percent = _step(ro)
    rows = _rows(ro, M.Kind.GATE)
    checks = step_checks(ro)
    verdicts: list[tuple[str, str]] = []
    for gate in gates_due(ro):
        mine = [r for r in rows if r.name == gate["name"]]
        latest = mine[-1] if mine else None
        if latest is not None and latest.outcome == OUT.SUCCESS:
            verdicts.append(("pass", ""))
            continue
        if (
            latest is not None
            and not fresh
            and now - latest.at < timedelta(seconds=gate["interval"])
        ):
            verdicts.append((_gate_verdict(gate, latest.outcome), _gate_text(gate, latest)))
            continue
        status, answer = _post(gate, _gate_body(ro, gate, checks))
        if status is not None and 200 <= status < 300:
            outcome, message = OUT.SUCCESS, f"HTTP {status}"
        elif status is not None:
            outcome, message = OUT.FAILURE, f"HTTP {status}" + (f": {answer}" if answer else "")
        else:
            outcome, message = OUT.INCONCLUSIVE, f"no answer: {answer}"
        row = M.objects.create(
            rollout=ro, step_index=index, percent=percent, kind=M.Kind.GATE, name=gate["name"],
            target=gate["url"], condition=f"when {gate['when']}; on refusal {gate['on_refusal']}",
            value=float(status) if status is not None else None, outcome=outcome,
            message=message,
        )  # fmt: skip
        verdicts.append((_gate_verdict(gate, outcome), _gate_text(gate, row)))
    for wanted in ("fail", "inconclusive", "hold"):
        texts = [t for v, t in verdicts if v == wanted]
        if texts:
            return {"verdict": wanted, "summary": "; ".join(texts)}
    return {"verdict": "pass", "summary": ""}


def _gate_verdict(gate: Mapping[str, Any], outcome: str) -> str:
    if outcome == OUT.SUCCESS:
        return "pass"
    if outcome == OUT.INCONCLUSIVE:
        return "inconclusive"
    return "fail" if gate["on_refusal"] == "fail" else "hold"


def _gate_text(gate: Mapping[str, Any], row: RolloutMeasurement) -> str:
    return f"gate {gate['name']} {row.message}"


def gate_waiting(ro: Rollout) -> dict[str, Any] | None:
    """While the current step waits on a gate (its latest answer in this step did not
    pass): ``{"gate", "message", "again"}`` (when it is asked again, ISO 8601), else
    None. ``waiting.waiting`` words it."""
    rows = _rows(ro, M.Kind.GATE)
    for gate in gates_due(ro):
        mine = [r for r in rows if r.name == gate["name"]]
        if mine and mine[-1].outcome != OUT.SUCCESS:
            again = mine[-1].at + timedelta(seconds=gate["interval"])
            return {"gate": gate["name"], "message": mine[-1].message, "again": again.isoformat()}
    return None


# ---------------------------------------------------------------------------- the views


def _row(r: RolloutMeasurement) -> dict[str, Any]:
    return {
        "kind": r.kind,
        "name": r.name,
        "target": r.target,
        "condition": r.condition,
        "value": r.value,
        "outcome": r.outcome,
        "dry_run": r.dry_run,
        "message": r.message,
        "at": r.at.isoformat(),
    }


def measurements(ro: Rollout, *, per_name: int = 5) -> list[dict[str, Any]]:
    """Each step's measurements, oldest step first: ``{"step_index", "percent", "checks":
    [...], "gates": [...]}``, each entry a check or gate with its counts per outcome and
    its latest ``per_name`` measurements (value, condition, outcome, why) newest last.
    What ``GET /api/rollouts/<id>``, ``rollout status --json`` and the Rollouts page show."""
    steps: dict[tuple[int, int], dict[str, Any]] = {}
    names: dict[tuple[int, int, str, str], list[RolloutMeasurement]] = {}
    for r in M.objects.filter(rollout=ro).order_by("id"):
        key = (r.step_index, r.percent)
        steps.setdefault(key, {"step_index": r.step_index, "percent": r.percent})
        names.setdefault((r.step_index, r.percent, r.kind, r.name), []).append(r)
    for (index, percent, kind, name), rows in names.items():
        entry = {
            "name": name,
            "dry_run": rows[-1].dry_run,
            "outcome": rows[-1].outcome,
            "value": rows[-1].value,
            "condition": rows[-1].condition,
            "message": rows[-1].message,
            "counts": {o: sum(1 for r in rows if r.outcome == o) for o in OUT.values},
            "latest": [_row(r) for r in rows[-per_name:]],
        }
        steps[(index, percent)].setdefault(f"{kind}s", []).append(entry)
    out = []
    for key in sorted(steps):
        step = steps[key]
        step.setdefault("checks", [])
        step.setdefault("gates", [])
        out.append(step)
    return out
