"""deploy/observability: the Prometheus alert rules and the Grafana dashboard are well
formed, and every metric they name is one a real ``/metrics`` scrape exports (promtool
is not on PyPI: this is the equivalent check, run by ``make deploy-check`` and the suite)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from dashboard.operations.prometheus import metrics_text

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "observability" / "alerts.yaml"
DASHBOARD = ROOT / "deploy" / "observability" / "grafana-dashboard.json"
METRIC = re.compile(r"\bgitward_[a-z0-9_]+\b")
DURATION = re.compile(r"^\d+[smhdwy]$")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}

#: The alerts a deployment needs, by name (docs/operations.md).
REQUIRED = {
    "GitwardOldestJobTooOld",
    "GitwardDeadLettersGrowing",
    "GitwardLockQuorumAtRisk",
    "GitwardLostLocks",
    "GitwardFencingRejections",
    "GitwardCanaryFailing",
}


@pytest.fixture
def exported(transactional_db: None) -> set[str]:
    """Every series name a scrape exposes (families present even without samples)."""
    names = set()
    for family in text_string_to_metric_families(metrics_text()):
        for suffix in SUFFIXES.get(family.type, ("",)):
            names.add(family.name + suffix)
    assert "gitward_jobs_started_total" in names and "gitward_job_run_seconds_bucket" in names
    return names


# A PromQL check small enough to read (promtool is a Go binary, not on PyPI): every
# expression tokenizes, its brackets nest, label matchers are ``name op "value"``, a
# range ``[5m]`` follows a selector, ``rate``/``increase`` get one, only known functions
# are called, ``by``/``on``/… take a label list, and binary operators sit between operands.
_TOKEN = re.compile(
    r"""\s+|(?P<str>"(?:[^"\\]|\\.)*")|(?P<range>\[\d+[smhdwy]\])|(?P<num>\d+(?:\.\d+)?)"""
    r"""|(?P<ident>[A-Za-z_][A-Za-z0-9_]*)|(?P<op>==|!=|=~|!~|>=|<=|[-+*/%^<>=,(){}])"""
)
_FUNCTIONS = {"rate", "increase", "irate", "delta", "histogram_quantile", "abs", "clamp_min",
              "clamp_max", "sum", "max", "min", "avg", "count", "topk", "bottomk", "time",
              "vector", "absent", "max_over_time", "min_over_time", "avg_over_time"}  # fmt: skip
_GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
_BINARY = {"and", "or", "unless", "+", "-", "*", "/", "%", "^", "==", "!=", ">", "<", ">=", "<="}
_CLOSE = {")": "(", "}": "{"}


def promql_errors(expr: str) -> list[str]:
    """What is wrong with ``expr`` (empty when it passes)."""
    tokens: list[tuple[str, str]] = []
    pos = 0
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if m is None:
            return [f"cannot read {expr[pos : pos + 10]!r}"]
        if m.lastgroup:
            tokens.append((m.lastgroup, m.group()))
        pos = m.end()
    errors, stack = [], []
    operand_expected = True
    for i, (kind, text) in enumerate(tokens):
        prev = tokens[i - 1][1] if i else ""
        nxt = tokens[i + 1][1] if i + 1 < len(tokens) else ""
        if text in "({":
            stack.append((text, i))
        elif text in _CLOSE and (not stack or stack.pop()[0] != _CLOSE[text]):
            errors.append(f"unbalanced {text!r} at token {i}")
        in_braces = bool(stack) and stack[-1][0] == "{"
        if in_braces and text not in "{,":
            # name op "value" triples inside a selector
            if kind == "ident" and nxt not in {"=", "!=", "=~", "!~"}:
                errors.append(f"label {text} has no matcher")
            if text in {"=", "!=", "=~", "!~"} and not (
                i + 1 < len(tokens) and tokens[i + 1][0] == "str"
            ):
                errors.append(f"matcher {text} needs a quoted value")
            continue
        if kind == "range" and prev not in {"}"} and not (i and tokens[i - 1][0] == "ident"):
            errors.append(f"range {text} follows no selector")
        if kind == "ident" and nxt == "(" and text not in _FUNCTIONS | _GROUPING:
            errors.append(f"unknown function {text}")
        if (
            kind == "ident"
            and text in _GROUPING
            and nxt != "("
            and text not in {"group_left", "group_right"}
        ):
            errors.append(f"{text} needs a label list")
        if text in {"rate", "increase", "irate", "delta"} and nxt == "(":
            depth, j = 0, i + 1
            while j < len(tokens):
                depth += {"(": 1, ")": -1}.get(tokens[j][1], 0)
                if depth == 0:
                    break
                j += 1
            if not any(k == "range" for k, _ in tokens[i + 1 : j]):
                errors.append(f"{text}() needs a range vector")
        if text in _BINARY and kind != "str":
            if operand_expected and text not in {"-", "+"}:
                errors.append(f"operator {text} has no left operand")
            operand_expected = True
        elif text in _GROUPING or text == "bool":
            pass
        elif kind in {"ident", "num", "str", "range"} or text in ")}":
            operand_expected = False
    if stack:
        errors.append(f"unclosed {stack[-1][0]!r}")
    if operand_expected:
        errors.append("the expression ends with an operator")
    return errors


@pytest.mark.parametrize(
    "bad",
    [
        "rate(gitward_jobs_started_total[5m]",  # unclosed
        "rate(gitward_jobs_started_total)",  # no range
        'gitward_workers{state="busy"[5m]',  # brace never closed
        "gitward_workers{state=busy}",  # unquoted value
        "sum by gitward_workers",  # no label list
        "ratee(gitward_jobs_started_total[5m])",  # unknown function
        "gitward_workers >",  # dangling operator
        "gitward_workers[5x]",  # not a duration
    ],
)
def test_the_promql_check_rejects_broken_expressions(bad: str) -> None:
    assert promql_errors(bad), bad


def rules() -> list[dict[str, object]]:
    doc = yaml.safe_load(RULES.read_text())
    assert isinstance(doc, dict) and set(doc) == {"groups"}
    out = []
    for group in doc["groups"]:
        assert set(group) <= {"name", "interval", "rules"} and group["name"]
        out.extend(group["rules"])
    return out


def test_the_rules_file_follows_the_prometheus_rule_format() -> None:
    seen = set()
    for rule in rules():
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
        assert isinstance(rule["alert"], str) and re.fullmatch(
            r"[A-Za-z_][A-Za-z0-9_]*", rule["alert"]
        )
        assert rule["alert"] not in seen
        seen.add(rule["alert"])
        assert isinstance(rule["expr"], str) and rule["expr"].strip()
        assert promql_errors(rule["expr"]) == [], (rule["alert"], promql_errors(rule["expr"]))
        assert DURATION.match(str(rule.get("for", "0m"))), rule["alert"]
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert {"summary", "description"} <= set(rule["annotations"])
    assert seen >= REQUIRED


def test_every_rule_names_only_exported_metrics(exported: set[str]) -> None:
    for rule in rules():
        names = set(METRIC.findall(str(rule["expr"])))
        assert names, rule["alert"]
        assert names <= exported, (rule["alert"], names - exported)


def test_the_dashboard_is_grafana_json_over_exported_metrics(exported: set[str]) -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["title"] and dash["panels"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    used = set()
    for panel in dash["panels"]:
        assert panel["type"] in {"timeseries", "stat", "table"} and panel["targets"]
        assert {"h", "w", "x", "y"} <= set(panel["gridPos"])
        for target in panel["targets"]:
            assert promql_errors(target["expr"]) == [], (panel["title"], target["expr"])
            names = set(METRIC.findall(target["expr"]))
            assert names and names <= exported, (panel["title"], names - exported)
            used |= names
    # The operator's questions are all on it: queues, jobs, locks, masters, DLQ, rollouts.
    for needed in ("gitward_queue_oldest_job_age_seconds", "gitward_job_run_seconds_bucket",
                   "gitward_lock_acquire_seconds_bucket", "gitward_lock_master_errors_total",
                   "gitward_dead_letters", "gitward_workers",
                   "gitward_analyzer_version_ramp_percent"):  # fmt: skip
        assert needed in used
