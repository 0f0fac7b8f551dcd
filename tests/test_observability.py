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

from dashboard.metrics import metrics_text

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy" / "observability" / "alerts.yaml"
DASHBOARD = ROOT / "deploy" / "observability" / "grafana-dashboard.json"
METRIC = re.compile(r"\bgitward_[a-z0-9_]+\b")
DURATION = re.compile(r"^\d+[smhdwy]$")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}

#: The alerts issue 12 asks for, by name.
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
        assert rule["expr"].count("(") == rule["expr"].count(")"), rule["alert"]
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
            names = set(METRIC.findall(target["expr"]))
            assert names and names <= exported, (panel["title"], names - exported)
            used |= names
    # The operator's questions are all on it: queues, jobs, locks, masters, DLQ, rollouts.
    for needed in ("gitward_queue_oldest_job_age_seconds", "gitward_job_run_seconds_bucket",
                   "gitward_lock_acquire_seconds_bucket", "gitward_lock_master_errors_total",
                   "gitward_dead_letters", "gitward_workers",
                   "gitward_analyzer_version_ramp_percent"):  # fmt: skip
        assert needed in used
