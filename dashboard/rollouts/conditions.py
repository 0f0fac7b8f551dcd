"""Operator-defined checks and gates, as data (docs/rollouts.md#checks-and-gates): the tiny
condition language (``result < 0.05``, ``result >= 1 and result <= 3``) and the
validation of a check's and a gate's spec.

Pure Python, no Django: ``dashboard.settings`` validates ``GITWARD_ROLLOUT_CHECKS`` and
``GITWARD_ROLLOUT_GATES`` with it at start-up, ``dashboard.rollouts.start`` a rollout's
own ``options.checks``. A condition is parsed, never ``eval``-ed: comparisons of
``result`` with a number (either side), joined by ``and`` / ``or`` (``and`` binds
tighter), nothing else.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

__all__ = [
    "CHECK_DEFAULTS",
    "GATE_DEFAULTS",
    "evaluate",
    "parse_condition",
    "validate_check",
    "validate_gate",
]

_OPS: dict[str, Callable[[float, float], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
}
#: What each comparison becomes when ``result`` is on its right: ``0.05 > result``.
_MIRROR = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "==", "!=": "!="}
_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_COMPARISON = re.compile(
    rf"^\s*(?:result\s*(?P<op1><=|>=|==|!=|<|>)\s*(?P<n1>{_NUMBER})"
    rf"|(?P<n2>{_NUMBER})\s*(?P<op2><=|>=|==|!=|<|>)\s*result)\s*$"
)
#: A parsed condition: alternatives (``or``) of conjunctions (``and``) of (op, number).
Condition = list[list[tuple[str, float]]]


def parse_condition(text: str) -> Condition:
    """``"result < 0.05 or result > 9"`` → ``[[("<", 0.05)], [(">", 9.0)]]``; ValueError
    naming what is wrong otherwise."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("a condition must be a non-empty string such as 'result < 0.05'")
    if len(text) > 500:
        raise ValueError("a condition is at most 500 characters")
    out: Condition = []
    for alternative in re.split(r"\s+or\s+", text.strip()):
        terms = []
        for term in re.split(r"\s+and\s+", alternative):
            m = _COMPARISON.match(term)
            if m is None:
                raise ValueError(
                    f"cannot read {term.strip()!r}: write comparisons of result with a number "
                    "(<, <=, >, >=, ==, !=) joined by and / or, e.g. 'result < 0.05'"
                )
            if m["op1"]:
                op, number = m["op1"], float(m["n1"])
            else:
                op, number = _MIRROR[m["op2"]], float(m["n2"])
            if not math.isfinite(number):
                raise ValueError(f"{term.strip()!r}: the number must be finite")
            terms.append((op, number))
        out.append(terms)
    return out


def evaluate(condition: Condition | str, result: float) -> bool:
    """Whether ``result`` meets the condition (a parsed one, or its text)."""
    parsed = parse_condition(condition) if isinstance(condition, str) else condition
    return any(all(_OPS[op](result, n) for op, n in terms) for terms in parsed)


CHECK_DEFAULTS: dict[str, Any] = {
    "success": None,
    "failure": None,
    "failure_limit": 0,
    "dry_run": False,
    "interval": 30.0,
}
_CHECK_KEYS = {"name", "query", *CHECK_DEFAULTS}


def _name(spec: Mapping[str, Any], what: str) -> str:
    name = spec.get("name")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}", name):
        raise ValueError(f"a {what}'s \"name\" must be 1-100 letters, digits, '.', '_' or '-'")
    return name


def validate_check(spec: Any) -> dict[str, Any]:
    """A check ``{"name", "query", "success"?, "failure"?, "failure_limit"?, "dry_run"?,
    "interval"?}`` with its defaults; at least one condition. ValueError otherwise."""
    if not isinstance(spec, Mapping):
        raise ValueError("a check must be a JSON object")
    name = _name(spec, "check")
    unknown = sorted(set(spec) - _CHECK_KEYS)
    if unknown:
        raise ValueError(f"check {name!r}: unknown field(s) {', '.join(unknown)}")
    out = {**CHECK_DEFAULTS, **spec}
    if not isinstance(out.get("query"), str) or not out["query"].strip():
        raise ValueError(f'check {name!r}: "query" must be a PromQL expression')
    if len(out["query"]) > 2000:
        raise ValueError(f'check {name!r}: "query" is at most 2000 characters')
    if out["success"] is None and out["failure"] is None:
        raise ValueError(f'check {name!r}: give a "success" or a "failure" condition (or both)')
    for key in ("success", "failure"):
        if out[key] is not None:
            try:
                parse_condition(out[key])
            except ValueError as exc:
                raise ValueError(f"check {name!r}: {key}: {exc}") from None
    limit = out["failure_limit"]
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ValueError(f'check {name!r}: "failure_limit" must be a whole number >= 0')
    if not isinstance(out["dry_run"], bool):
        raise ValueError(f'check {name!r}: "dry_run" must be true or false')
    interval = out["interval"]
    if isinstance(interval, bool) or not isinstance(interval, int | float) or interval < 0:
        raise ValueError(f'check {name!r}: "interval" must be seconds >= 0')
    out["interval"] = float(interval)
    return {k: out[k] for k in ("name", "query", *CHECK_DEFAULTS)}


GATE_DEFAULTS: dict[str, Any] = {"when": "promotion", "on_refusal": "hold", "interval": 30.0}
_GATE_KEYS = {"name", "url", "secret", *GATE_DEFAULTS}


def validate_gate(spec: Any) -> dict[str, Any]:
    """A gate ``{"name", "url", "secret", "when"?, "on_refusal"?, "interval"?}``: ``when``
    ``promotion`` (before the promote to current, the default) or ``step`` (before every
    step advance); ``on_refusal`` ``hold`` (ask again after ``interval``) or ``fail``
    (roll back). ValueError otherwise."""
    if not isinstance(spec, Mapping):
        raise ValueError("a gate must be a JSON object")
    name = _name(spec, "gate")
    unknown = sorted(set(spec) - _GATE_KEYS)
    if unknown:
        raise ValueError(f"gate {name!r}: unknown field(s) {', '.join(unknown)}")
    out = {**GATE_DEFAULTS, **spec}
    url = out.get("url")
    if not isinstance(url, str) or urlsplit(url).scheme not in {"http", "https"}:
        raise ValueError(f'gate {name!r}: "url" must be an http(s) URL')
    if not urlsplit(url).hostname:
        raise ValueError(f'gate {name!r}: "url" must be an http(s) URL')
    secret = out.get("secret")
    if not isinstance(secret, str) or len(secret) < 16:
        raise ValueError(f'gate {name!r}: "secret" must be a string of at least 16 characters')
    if out["when"] not in {"promotion", "step"}:
        raise ValueError(f'gate {name!r}: "when" must be promotion or step')
    if out["on_refusal"] not in {"hold", "fail"}:
        raise ValueError(f'gate {name!r}: "on_refusal" must be hold or fail')
    interval = out["interval"]
    if isinstance(interval, bool) or not isinstance(interval, int | float) or interval < 0:
        raise ValueError(f'gate {name!r}: "interval" must be seconds >= 0')
    out["interval"] = float(interval)
    return {k: out[k] for k in ("name", "url", "secret", *GATE_DEFAULTS)}
