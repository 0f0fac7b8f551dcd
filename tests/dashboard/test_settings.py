"""Settings fail loudly at start-up (docs/configuration.md): a real ``manage.py check`` per case.

A bad variable stops the process with one line naming the variable and the expected
form and exit 1, never a traceback; rules across variables are system checks
(dashboard/infra/system_checks.py) that ``check`` — and ``up`` / ``worker``, which run it first —
report by id.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from workers.runtime.failpoints import parse_failpoints

ROOT = Path(__file__).resolve().parents[2]
SECRET = "s3cret-" + "k" * 30 + "-With-Entropy-" + "x9" * 10
OURS = ("GITWARD_", "DATABASE_URL", "REDIS_URL", "HOST", "PORT", "WORKERS")


def manage(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``manage.py ARGS`` in a clean environment: none of the caller's gitward variables."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(OURS)}
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        env={**base, "GITWARD_VAR_DIR": str(tmp_path), **env},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )


BAD_VALUES = [
    (
        {"GITWARD_RETRY_BACKOFF": "2,soon"},
        "GITWARD_RETRY_BACKOFF must be comma-separated seconds >= 0 (e.g. 2,10), got 'soon'",
    ),
    (
        {"GITWARD_RETRY_BACKOFF": "2,-1"},
        "GITWARD_RETRY_BACKOFF must be comma-separated seconds >= 0 (e.g. 2,10), got '-1'",
    ),
    (
        {"GITWARD_ALLOWED_HOSTS_NETS": "10.0.0.0/8,10.0.0.0/33"},
        "GITWARD_ALLOWED_HOSTS_NETS must be comma-separated CIDRs (e.g. 10.0.0.0/8,fd00::/8),"
        " got '10.0.0.0/33'",
    ),
    (
        {"GITWARD_FAILPOINTS": "analyze.parsing=explode"},
        "GITWARD_FAILPOINTS: malformed item 'analyze.parsing=explode' (expected"
        " name[#tag][=stop|kill|raise|alter|sleep:SECONDS][*N] or name[#tag]=perturb:N,"
        " comma-separated)",
    ),
    (
        {"GITWARD_FAILPOINTS_ONCE": "/nonexistent/once"},
        "GITWARD_FAILPOINTS_ONCE must be an existing directory, got '/nonexistent/once'",
    ),
    ({"GITWARD_LOCK_TTL": "soon"}, "GITWARD_LOCK_TTL must be a number, got 'soon'"),
    ({"GITWARD_LOCK_TTL": "nan"}, "GITWARD_LOCK_TTL must be a finite number, got 'nan'"),
    ({"GITWARD_LOCK_TTL": "0.1"}, "GITWARD_LOCK_TTL must be >= 0.5, got 0.1"),
    (
        {"GITWARD_LOCK_DRIFT_FACTOR": "1.5"},
        "GITWARD_LOCK_DRIFT_FACTOR must be a fraction of the TTL below 1, got '1.5'",
    ),
    ({"GITWARD_MAX_ATTEMPTS": "0"}, "GITWARD_MAX_ATTEMPTS must be >= 1, got 0"),
    (
        {"GITWARD_CHUNK_SIZE": "2000", "GITWARD_CHUNK_MAX": "1000"},
        "GITWARD_CHUNK_MAX must be >= GITWARD_CHUNK_SIZE (2000), got '1000'",
    ),
    ({"GITWARD_CHUNK_SPREAD": "0"}, "GITWARD_CHUNK_SPREAD must be >= 1, got 0"),
    (
        {"GITWARD_INLINE_CHUNK": "sometimes"},
        "GITWARD_INLINE_CHUNK must be a boolean (true/false), got 'sometimes'",
    ),
    ({"WORKERS": "two"}, "WORKERS must be an integer, got 'two'"),
    ({"PORT": "70000"}, "PORT must be <= 65535, got 70000"),
    ({"GITWARD_DEBUG": "maybe"}, "GITWARD_DEBUG must be a boolean (true/false), got 'maybe'"),
    (
        {"GITWARD_LOG_LEVEL": "loud"},
        "GITWARD_LOG_LEVEL must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL, got 'LOUD'",
    ),
    (
        {"REDIS_URLS": "redis://127.0.0.1:7001/0,127.0.0.1:7002"},
        "REDIS_URLS must be Redis URLs (redis://…, rediss://…, unix://…), got '127.0.0.1:7002'",
    ),
    (
        {"REDIS_URLS": "redis://127.0.0.1:7001/0,redis://127.0.0.1:7001/0"},
        "REDIS_URLS must be distinct Redis masters (each listed once),"
        " got 'redis://127.0.0.1:7001/0,redis://127.0.0.1:7001/0'",
    ),
    ({"REDIS_URL": "localhost:6379"}, "REDIS_URL must be a Redis URL (redis://host:6379/0), got"),
    (
        {"DATABASE_URL": "mysqlx://gitward:hunter2@db/gitward"},
        "DATABASE_URL must be a database URL naming a database"
        " (postgres://user@host:5432/name or sqlite:///path), got 'mysqlx://…'",
    ),
    (
        {"GITWARD_CSRF_TRUSTED_ORIGINS": "gitward.example.com"},
        "GITWARD_CSRF_TRUSTED_ORIGINS must be comma-separated origins (https://host),"
        " got 'gitward.example.com'",
    ),
    ({"GITWARD_ALLOWED_HOSTS": "*"}, "GITWARD_ALLOWED_HOSTS must list host names, not '*'"),
    ({"GITWARD_PRODUCTION": "true"}, "GITWARD_PRODUCTION needs GITWARD_SECRET_KEY"),
]


@pytest.mark.parametrize(("env", "message"), BAD_VALUES, ids=lambda v: next(iter(v), None))
def test_a_bad_variable_stops_start_up_with_one_line_naming_it(
    tmp_path: Path, env: dict[str, str], message: str
) -> None:
    result = manage(tmp_path, "check", **env)
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.startswith(f"gitward: configuration error: {message}")
    assert result.stderr.count("\n") == 1  # one line: no traceback
    assert "hunter2" not in result.stderr  # a database password is never echoed


def test_the_defaults_and_valid_values_pass_the_checks(tmp_path: Path) -> None:
    result = manage(
        tmp_path,
        "check",
        GITWARD_RETRY_BACKOFF="0.5, 3,30",
        GITWARD_ALLOWED_HOSTS_NETS="10.1.2.3/8,fd00::/8",
        GITWARD_FAILPOINTS="analyze.locked#slow=sleep:6,analyze.parsing#poison=raise*3,sync.fetched",
        GITWARD_FAILPOINTS_ONCE=str(tmp_path),
        GITWARD_LOG_LEVEL="warning",
        REDIS_URLS="redis://127.0.0.1:7001/0,rediss://h2:7002/0,unix:///run/r3.sock",
        GITWARD_CSRF_TRUSTED_ORIGINS="https://gitward.example.com",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "System check identified no issues (0 silenced)."


def test_values_are_parsed_once_at_start_up_into_their_types(tmp_path: Path) -> None:
    result = manage(
        tmp_path,
        "shell",
        "--no-imports",
        "-c",
        "from django.conf import settings as s;"
        "print(s.RETRY_BACKOFF, s.ALLOWED_HOSTS_NETS, s.LOG_LEVEL, s.FAILPOINTS)",
        GITWARD_RETRY_BACKOFF="0.5,3",
        GITWARD_ALLOWED_HOSTS_NETS="10.1.2.3/8, fd00::1/8",
        GITWARD_LOG_LEVEL="debug",
        GITWARD_FAILPOINTS="sync.fetched=kill",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[0.5, 3.0] ['10.0.0.0/8', 'fd00::/8'] DEBUG sync.fetched=kill"


def test_up_runs_two_web_processes_per_core_unless_told(tmp_path: Path) -> None:
    code = "from django.conf import settings as s; print(s.WEB_WORKERS)"
    result = manage(tmp_path, "shell", "--no-imports", "-c", code)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) == max(2, 2 * len(os.sched_getaffinity(0)))
    result = manage(tmp_path, "shell", "--no-imports", "-c", code, GITWARD_WEB_WORKERS="3")
    assert int(result.stdout) == 3


def test_postgresql_gets_a_bounded_pool_unless_turned_off(tmp_path: Path) -> None:
    code = (
        "from django.conf import settings as s; d = s.DATABASES['default'];"
        "print(d['OPTIONS'].get('pool'), d['CONN_MAX_AGE'], d['CONN_HEALTH_CHECKS'])"
    )
    url = "postgres://u@127.0.0.1:5432/x"
    result = manage(tmp_path, "shell", "--no-imports", "-c", code, DATABASE_URL=url,
                    GITWARD_DB_POOL_SIZE="5", GITWARD_DB_POOL_TIMEOUT="2.5")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        "{'min_size': 1, 'max_size': 5, 'timeout': 2.5, 'max_idle': 60.0} 0 True"
    )
    result = manage(tmp_path, "shell", "--no-imports", "-c", code, DATABASE_URL=url,
                    GITWARD_DB_POOL_SIZE="0")  # fmt: skip
    assert result.stdout.strip() == "None 0 False"


CROSS_SETTING_ERRORS = [
    (
        {"GITWARD_LOCK_TTL": "1", "GITWARD_LOCK_NODE_TIMEOUT": "0.4"},
        "?: (gitward.E001) GITWARD_LOCK_TTL=1 is too short for GITWARD_LOCK_NODE_TIMEOUT=0.4:"
        " the lease must be longer than 3 node timeouts plus the clock drift allowance (1.212 s)",
    ),
    (
        {"GITWARD_PRODUCTION": "true", "GITWARD_SECRET_KEY": SECRET, "GITWARD_DEBUG": "true"},
        "?: (gitward.E002) GITWARD_PRODUCTION and GITWARD_DEBUG are both on",
    ),
    (
        {
            "GITWARD_PRODUCTION": "true",
            "GITWARD_SECRET_KEY": SECRET,
            "GITWARD_FAILPOINTS": "analyze.parsing=kill",
        },
        "?: (gitward.E003) GITWARD_FAILPOINTS is set with GITWARD_PRODUCTION",
    ),
]


@pytest.mark.parametrize(("env", "line"), CROSS_SETTING_ERRORS, ids=["E001", "E002", "E003"])
def test_cross_setting_errors_fail_the_check_with_their_id(
    tmp_path: Path, env: dict[str, str], line: str
) -> None:
    result = manage(tmp_path, "check", **env)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert any(row.startswith(line) for row in result.stderr.splitlines()), result.stderr
    assert "System check identified 1 issue" in result.stderr  # only that rule broke


def test_a_worker_refuses_to_start_on_a_cross_setting_error(tmp_path: Path) -> None:
    result = manage(
        tmp_path, "worker", "--burst", GITWARD_LOCK_TTL="1", GITWARD_LOCK_NODE_TIMEOUT="0.4"
    )
    assert result.returncode == 1
    assert "(gitward.E001)" in result.stderr and "Traceback" not in result.stderr


def test_the_lock_timing_rule_is_exactly_three_node_timeouts_plus_drift(tmp_path: Path) -> None:
    # 3 × 0.3 + (1 × 0.01 + 0.002) = 0.912 < 1: just inside the rule.
    ok = manage(tmp_path, "check", GITWARD_LOCK_TTL="1", GITWARD_LOCK_NODE_TIMEOUT="0.3")
    assert ok.returncode == 0, ok.stderr
    # 3 × 0.33 + 0.012 = 1.002 > 1: just outside.
    bad = manage(tmp_path, "check", GITWARD_LOCK_TTL="1", GITWARD_LOCK_NODE_TIMEOUT="0.33")
    assert bad.returncode == 1 and "(gitward.E001)" in bad.stderr


def test_a_git_timeout_past_the_job_timeout_is_a_warning(tmp_path: Path) -> None:
    env = {"GITWARD_GIT_TIMEOUT": "2000", "GITWARD_JOB_TIMEOUT": "1800"}
    result = manage(tmp_path, "check", **env)
    assert result.returncode == 0  # a warning: printed, start-up goes on
    assert "?: (gitward.W001) GITWARD_GIT_TIMEOUT=2000 is not below GITWARD_JOB_TIMEOUT=1800" in (
        result.stderr
    )
    strict = manage(tmp_path, "check", "--fail-level", "WARNING", **env)
    assert strict.returncode == 1 and "(gitward.W001)" in strict.stderr


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs util-linux's setpriv")
def test_a_missing_setpriv_is_reported(tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    result = manage(tmp_path, "check", PATH=str(empty))
    assert result.returncode == 0
    assert "?: (gitward.W002) setpriv (util-linux) is not on PATH" in result.stderr
    with_setpriv = manage(tmp_path, "check")
    assert "gitward.W002" not in with_setpriv.stderr


def test_deploy_checks_want_three_masters_and_a_queue_server_of_its_own(tmp_path: Path) -> None:
    prod = {
        "GITWARD_PRODUCTION": "true",
        "GITWARD_SECRET_KEY": SECRET,
        "GITWARD_ALLOWED_HOSTS": "gitward.example.com",
    }
    two = "redis://10.0.0.1:6379/0,redis://10.0.0.2:6379/0"
    shared = manage(tmp_path, "check", "--deploy", REDIS_URLS=two, **prod)
    assert shared.returncode == 0, shared.stderr
    assert "?: (gitward.W003) 2 lock master(s): losing one stops every lock" in shared.stderr
    assert "?: (gitward.W004) REDIS_URL (queues, channel layer, rate limits) is one of" in (
        shared.stderr
    )
    plain = manage(tmp_path, "check", REDIS_URLS=two)  # not a deploy check
    assert "gitward.W00" not in plain.stderr
    good = manage(
        tmp_path,
        "check",
        "--deploy",
        "--fail-level",
        "WARNING",
        REDIS_URLS=two + ",redis://10.0.0.3:6379/0",
        REDIS_URL="redis://queue.internal:6379/0",
        **prod,
    )
    assert good.returncode == 0, good.stderr


def test_failpoint_specs_parse_or_name_the_bad_item() -> None:
    assert parse_failpoints("") == {}
    assert parse_failpoints(" a.b , c.d#poison=raise*3, e=sleep:0.5,f=stop,g=kill,") == {
        "a.b": "raise",
        "c.d#poison": "raise*3",
        "e": "sleep:0.5",
        "f": "stop",
        "g": "kill",
    }
    for bad in ("a=explode", "a=sleep:", "a=sleep:x", "a=raise*0", "=kill", "a b=kill"):
        with pytest.raises(ValueError, match="malformed item"):
            parse_failpoints(bad)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, "1000 4000 4"),
        ({"GITWARD_CHUNK_SIZE": "5000"}, "5000 5000 4"),  # a larger floor alone: fixed
        ({"GITWARD_CHUNK_MAX": "1000"}, "1000 1000 4"),  # fixed targets, as before
        ({"GITWARD_CHUNK_SIZE": "500", "GITWARD_CHUNK_SPREAD": "8"}, "500 4000 8"),
    ],
)
def test_chunk_targets_range_from_the_chunk_size_to_its_maximum(
    tmp_path: Path, env: dict[str, str], expected: str
) -> None:
    code = "from django.conf import settings as s; print(s.CHUNK_SIZE, s.CHUNK_MAX, s.CHUNK_SPREAD)"
    result = manage(tmp_path, "shell", "--no-imports", "-c", code, **env)
    assert result.stdout.strip().splitlines()[-1] == expected, result.stderr


SECRET16 = "0123456789abcdef"
FW, RW = "GITWARD_FREEZE_WINDOWS", "GITWARD_ROLLOUT_WEBHOOKS"


def _w(*items: dict[str, object]) -> str:
    return json.dumps(list(items))


ROLLOUT_GATE_BAD_VALUES = [
    ({FW: "{not json"}, f"{FW} must be a JSON list of objects"),
    ({FW: _w({"name": "a", "from": "2026-01-02T00:00Z", "until": "2026-01-01T00:00Z"})},
     f'{FW} must be "from" before "until"'),
    ({FW: _w({"name": "a", "from": "2026-01-01", "until": "2026-01-02"})},
     f'{FW} must be "from" before "until", both with a time zone'),
    ({FW: _w({"name": "a", "days": ["caturday"], "start": "1:00", "end": "2:00"})},
     f'{FW} must be "days" as a list of mon, tue'),
    ({FW: _w({"name": "a", "start": "25:00", "end": "02:00"})}, f"{FW} must be times as HH:MM"),
    ({FW: _w({"name": "a", "start": "01:00"})},
     f'{FW} must be windows {{"name", "from", "until"}}'),
    ({FW: _w({"name": "a", "start": "01:00", "end": "02:00"},
             {"name": "a", "start": "03:00", "end": "04:00"})},
     f'{FW} must be objects with distinct non-empty "name"s'),
    ({RW: _w({"name": "ops", "url": "ftp://x/", "secret": SECRET16})},
     f'{RW} must be "url" an http(s) URL'),
    ({RW: _w({"name": "ops", "url": "https://x/", "secret": "hunter2"})},
     f'{RW} must be "secret" a string of at least 16 characters'),
    ({RW: _w({"name": "ops", "url": "https://x/", "secret": SECRET16, "format": "teams"})},
     f'{RW} must be "format" json or slack'),
    ({"GITWARD_WEBHOOK_TIMEOUT": "0"}, "GITWARD_WEBHOOK_TIMEOUT must be >= 0.1"),
]  # fmt: skip


@pytest.mark.parametrize(("env", "message"), ROLLOUT_GATE_BAD_VALUES, ids=range(11))
def test_a_bad_freeze_window_or_webhook_stops_start_up_with_one_line(
    tmp_path: Path, env: dict[str, str], message: str
) -> None:
    result = manage(tmp_path, "check", **env)
    assert result.returncode == 1
    assert result.stderr.startswith(f"gitward: configuration error: {message}"), result.stderr
    assert result.stderr.count("\n") == 1
    assert "hunter2" not in result.stderr  # a webhook secret is never echoed


def test_freeze_windows_and_webhooks_are_parsed_at_start_up(tmp_path: Path) -> None:
    code = (
        "from django.conf import settings as s; import json; "
        "print(json.dumps([s.FREEZE_WINDOWS, s.ROLLOUT_WEBHOOKS, s.WEBHOOK_TIMEOUT]))"
    )
    hook = {"name": "chat", "url": "https://h.example/x", "secret": SECRET16, "format": "slack"}
    result = manage(
        tmp_path,
        "shell",
        "-c",
        code,
        GITWARD_FREEZE_WINDOWS=_w(
            {"name": "ye", "from": "2026-12-20T00:00Z", "until": "2027-01-04T00:00Z"},
            {"name": "wk", "days": ["sat", "sun"], "start": "18:00", "end": "6:00"},
        ),
        GITWARD_ROLLOUT_WEBHOOKS=_w(hook),
        GITWARD_WEBHOOK_TIMEOUT="2.5",
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == [
        [
            {"name": "ye", "from": "2026-12-20T00:00:00+00:00",
             "until": "2027-01-04T00:00:00+00:00"},
            {"name": "wk", "days": [5, 6], "start": "18:00", "end": "06:00"},
        ],
        [hook],
        2.5,
    ]  # fmt: skip
