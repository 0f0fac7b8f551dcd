"""dashboard.infra.system_checks: the cross-setting system checks called directly (``manage.py
check`` and the commands refusing to start are covered in tests/dashboard/test_settings.py)."""

from __future__ import annotations

from dashboard.infra.system_checks import (
    check_death_signal,
    check_lock_timing,
    check_production,
    check_redis_layout,
    check_timeouts,
    lock_drift,
)
from workers.git.runner import death_prefix


def _ids(messages: list) -> list[str]:  # type: ignore[type-arg]
    return [m.id for m in messages]


def test_lock_ttl_must_outlast_three_node_timeouts_plus_drift(settings) -> None:
    settings.LOCK_DRIFT_FACTOR = 0.01
    settings.LOCK_NODE_TIMEOUT = 1.0
    assert lock_drift(10) == 10 * 0.01 + 0.002
    needed = 3 * 1.0 + lock_drift(3.1)
    settings.LOCK_TTL = 3.1  # needs > 3 + 0.031 + 0.002
    assert needed < 3.1 and check_lock_timing() == []
    settings.LOCK_TTL = 3.0
    (err,) = check_lock_timing()
    assert err.id == "gitward.E001" and "GITWARD_LOCK_TTL=3 is too short" in err.msg
    assert err.is_serious()


def test_production_refuses_debug_and_failpoints(settings) -> None:
    settings.PRODUCTION = False
    settings.DEBUG = True
    settings.FAILPOINTS = {"x": "raise"}
    assert check_production() == []
    settings.PRODUCTION = True
    assert _ids(check_production()) == ["gitward.E002", "gitward.E003"]
    settings.DEBUG = False
    settings.FAILPOINTS = {}
    assert check_production() == []


def test_git_timeout_below_job_timeout(settings) -> None:
    settings.JOB_TIMEOUT = 600
    settings.GIT_TIMEOUT = 599.5
    assert check_timeouts() == []
    settings.GIT_TIMEOUT = 600
    (w,) = check_timeouts()
    assert w.id == "gitward.W001" and not w.is_serious()


def test_death_signal_warning_without_setpriv(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert death_prefix() and check_death_signal() == []
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no setpriv on PATH
    death_prefix.cache_clear()
    try:
        assert _ids(check_death_signal()) == ["gitward.W002"]
    finally:
        monkeypatch.undo()
        death_prefix.cache_clear()
    assert death_prefix()


def test_redis_layout_advice(settings) -> None:
    a, b, c, q = (f"redis://127.0.0.1:{p}/0" for p in (1, 2, 3, 4))
    settings.REDIS_URLS = [a, b, c]
    settings.REDIS_URL = q
    assert check_redis_layout() == []
    settings.REDIS_URL = a
    assert _ids(check_redis_layout()) == ["gitward.W004"]
    settings.REDIS_URLS = [a]
    assert _ids(check_redis_layout()) == ["gitward.W003", "gitward.W004"]
    settings.REDIS_URLS = []
    settings.EMBEDDED_REDIS_NODES = 3
    assert check_redis_layout() == []
    settings.EMBEDDED_REDIS_NODES = 1
    assert _ids(check_redis_layout()) == ["gitward.W003"]
