"""dashboard.accounts.rate_limits: the shared per-minute counter, called directly (the 429s of the
web views and API are in tests/system/test_web_security.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dashboard.accounts import rate_limits
from dashboard.accounts.rate_limits import check
from dashboard.infra import queues
from workers.runtime.redis_server import RedisNode

T0 = 1_800_000_000.0  # a minute boundary: 30_000_000 * 60


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [T0 + 15]
    monkeypatch.setattr(rate_limits, "time", SimpleNamespace(time=lambda: now[0]))
    return now


def test_the_limit_counts_per_user_and_resets_with_the_minute(clock: list[float], settings) -> None:
    settings.RATE_SUBMIT_PER_MINUTE = 3
    alice, bob = SimpleNamespace(pk=1), SimpleNamespace(pk=2)
    verdicts = [check("submit", alice) for _ in range(4)]
    assert [v.allowed for v in verdicts] == [True, True, True, False]
    assert [v.remaining for v in verdicts] == [2, 1, 0, 0]
    assert verdicts[-1].retry_after == 45 and verdicts[-1].limit == 3
    assert check("submit", bob).allowed  # another user has their own count
    assert check("api", alice).allowed  # and another scope
    key = f"gitward:ratelimit:submit:1:{int(T0 // 60)}"
    conn = queues.connection()
    assert int(conn.get(key)) == 4 and 0 < conn.ttl(key) <= 120
    clock[0] = T0 + 60  # the next window
    assert check("submit", alice).remaining == 2


def test_anonymous_users_share_one_count(clock: list[float], settings) -> None:
    settings.RATE_API_PER_MINUTE = 1
    assert check("api", None).allowed
    assert not check("api", SimpleNamespace(pk=None)).allowed


def test_zero_means_unlimited(clock: list[float], settings) -> None:
    settings.RATE_SUBMIT_PER_MINUTE = 0
    assert all(check("submit", None).allowed for _ in range(5))
    assert queues.connection().keys("gitward:ratelimit:*") == []


def test_redis_down_fails_open(clock: list[float], settings, redis_nodes: list[RedisNode]) -> None:
    settings.RATE_SUBMIT_PER_MINUTE = 1
    check("submit", None)
    redis_nodes[0].kill()
    try:
        verdict = check("submit", None)
        assert verdict.allowed and verdict.remaining == 1
    finally:
        redis_nodes[0].restart()
        queues.CIRCUIT.reset()
