"""The per-host fetch semaphore and token bucket against a real redis-server
(docs/scheduling.md#per-host-fetch-limits)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.checked_threads import CheckedThread
from workers.git.fetch_errors import RateLimited, rate_limited
from workers.git.fetch_limits import (
    FetchGate,
    HostBusy,
    HostLimit,
    back_off,
    host_status,
    known_hosts,
    parse_limits,
    wait_reason,
)
from workers.runtime.redis_server import RedisNode


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Any:
    n = RedisNode(tmp_path_factory.mktemp("fetch-limits")).start()
    yield n
    n.kill()


@pytest.fixture
def conn(node: RedisNode) -> redis.Redis:
    c = redis.Redis.from_url(node.url)
    c.flushall()
    return c


def test_parse_limits_reads_hosts_and_default() -> None:
    limits = parse_limits('{"GitHub.com": {"concurrency": 2, "rate": 1.5, "burst": 3}, "*": {}}')
    assert limits == {"github.com": HostLimit(2, 1.5, 3), "*": HostLimit()}
    assert parse_limits("") == {}


@pytest.mark.parametrize(
    "text",
    ["[1]", "{", '{"h": 3}', '{"h": {"concurrency": 0}}', '{"h": {"rate": -1}}',
     '{"h": {"cap": 1}}', '{"h": {"burst": "x"}}', '{"h": {"burst": true}}'],
)  # fmt: skip
def test_parse_limits_refuses_nonsense(text: str) -> None:
    with pytest.raises(ValueError):
        parse_limits(text)


def test_cap_is_never_exceeded_by_concurrent_holders(conn: redis.Redis) -> None:
    gate = FetchGate(conn, {"h": HostLimit(concurrency=3)}, wait=30, lease=10)
    inside = 0
    peak = 0
    guard = threading.Lock()

    def fetch() -> None:
        nonlocal inside, peak
        with gate.slot("h"):
            with guard:
                inside += 1
                peak = max(peak, inside)
            time.sleep(0.05)
            with guard:
                inside -= 1

    threads = [CheckedThread(target=fetch) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak == 3
    assert host_status(conn, "h", gate.limits).in_use == 0


def test_a_full_host_raises_host_busy_with_the_reason(conn: redis.Redis) -> None:
    gate = FetchGate(conn, {"h": HostLimit(concurrency=1)}, wait=0.2, lease=10)
    with gate.slot("h"):
        assert wait_reason(conn, "h", gate.limits) == "host limit h 1/1"
        with pytest.raises(HostBusy) as caught, gate.slot("h"):
            pass
    assert caught.value.reason == "host limit h 1/1"
    assert caught.value.why == "limit"
    assert caught.value.retry_after > 0
    assert wait_reason(conn, "h", gate.limits) is None
    assert known_hosts(conn) == ["h"]


def test_waiters_are_counted_while_they_wait(conn: redis.Redis) -> None:
    gate = FetchGate(conn, {"h": HostLimit(concurrency=1)}, wait=1.0, lease=10)
    seen: list[int] = []
    texts: list[str] = []
    with gate.slot("h"):
        waiter = CheckedThread(target=_enter_refused, args=(gate, "h"))
        waiter.start()
        deadline = time.monotonic() + 5
        while not seen or seen[-1] == 0:
            status = host_status(conn, "h", gate.limits)
            seen.append(status.waiting)
            texts.append(status.text())
            if time.monotonic() > deadline:
                break
            time.sleep(0.02)
        waiter.join()
    assert seen[-1] == 1
    assert texts[-1] == "h 1/1, 1 waiting"
    assert host_status(conn, "h", gate.limits).waiting == 0  # removed when it gave up


def _enter(gate: FetchGate, host: str) -> None:
    with gate.slot(host):
        pass


def _enter_refused(gate: FetchGate, host: str) -> None:
    with pytest.raises(HostBusy):
        _enter(gate, host)


def _hold_forever(url: str, ready: Any) -> None:
    conn = redis.Redis.from_url(url)
    gate = FetchGate(conn, {"h": HostLimit(concurrency=1)}, wait=5, lease=1.0)
    with gate.slot("h"):
        ready.set()
        time.sleep(3600)


def test_a_sigkilled_holder_frees_its_slot_when_the_lease_ends(
    conn: redis.Redis, node: RedisNode
) -> None:
    ready = multiprocessing.get_context("spawn").Event()
    proc = multiprocessing.get_context("spawn").Process(
        target=_hold_forever, args=(node.url, ready)
    )
    proc.start()
    try:
        assert ready.wait(60)
        gate = FetchGate(conn, {"h": HostLimit(concurrency=1)}, wait=0.1, lease=1.0)
        # held and renewed (lease 1 s, renewed every third): still held after 2 leases
        time.sleep(2.0)
        with pytest.raises(HostBusy):
            _enter(gate, "h")
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        assert host_status(conn, "h", gate.limits).in_use == 1  # not released: killed
        waiting = FetchGate(conn, gate.limits, wait=30, lease=1.0)
        with waiting.slot("h"):
            assert host_status(conn, "h", gate.limits).in_use == 1
    finally:
        if proc.is_alive():
            os.kill(proc.pid, signal.SIGKILL)
            proc.join()


def test_the_token_bucket_allows_burst_then_rate(conn: redis.Redis) -> None:
    gate = FetchGate(conn, {"h": HostLimit(concurrency=100, rate=2.0, burst=3)}, lease=10)
    taken = [gate.try_acquire("h", f"x{i}")[0] for i in range(4)]
    assert taken == [True, True, True, False]
    ok, pause, why = gate.try_acquire("h", "x9")
    assert (ok, why) == (False, "rate") and 0 < pause <= 0.5
    time.sleep(pause + 0.05)
    assert gate.try_acquire("h", "x9")[0]


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    cap=st.integers(1, 5),
    ops=st.lists(st.tuples(st.booleans(), st.integers(0, 7)), min_size=1, max_size=40),
)
def test_property_holders_never_exceed_the_cap(
    conn: redis.Redis, cap: int, ops: list[tuple[bool, int]]
) -> None:
    """Any interleaving of acquires and releases of 8 holders: the slots Redis holds
    are exactly the model's, and never more than the cap."""
    conn.flushall()
    gate = FetchGate(conn, {"h": HostLimit(concurrency=cap)}, lease=60)
    model: set[int] = set()
    for acquire, who in ops:
        if acquire:
            ok, _, why = gate.try_acquire("h", f"w{who}")
            expected = who in model or len(model) < cap
            assert ok == expected, (who, model, why)
            if ok:
                model.add(who)
        else:
            conn.zrem("gitward:fetch:h:slots", f"w{who}")
            model.discard(who)
        assert host_status(conn, "h", gate.limits).in_use == len(model) <= cap


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(rate=st.sampled_from([5.0, 20.0]), burst=st.integers(1, 6), tries=st.integers(1, 20))
def test_property_bucket_grants_at_most_burst_plus_refill(
    conn: redis.Redis, rate: float, burst: int, tries: int
) -> None:
    conn.flushall()
    gate = FetchGate(conn, {"h": HostLimit(concurrency=1000, rate=rate, burst=burst)}, lease=60)
    start = time.monotonic()
    granted = sum(gate.try_acquire("h", f"t{i}")[0] for i in range(tries))
    elapsed = time.monotonic() - start
    assert granted >= min(tries, burst)
    assert granted <= burst + int(elapsed * rate) + 1


def test_backoff_is_shared_and_the_longest_wins(conn: redis.Redis) -> None:
    gate = FetchGate(conn, {}, wait=0.2, lease=10)
    until = back_off(conn, "h", 30)
    assert back_off(conn, "h", 5) == until  # a shorter ask does not shorten it
    status = host_status(conn, "h", {})
    assert status.backoff_until == until
    assert "backoff until" in status.text()
    with pytest.raises(HostBusy) as caught:
        _enter(gate, "h")
    assert caught.value.reason.startswith("host h backing off until ")
    assert 20 < caught.value.retry_after <= 30


def test_a_rate_limited_fetch_backs_the_host_off(conn: redis.Redis) -> None:
    gate = FetchGate(conn, {}, wait=0.2, lease=10, backoff=40)
    with pytest.raises(HostBusy) as caught, gate.slot("h"):
        raise RateLimited("429", retry_after=None, returncode=128, stderr="")
    assert "refused with a rate limit" in caught.value.reason
    assert caught.value.why == "backoff"
    assert 30 < caught.value.retry_after <= 40
    assert host_status(conn, "h", {}).in_use == 0
    assert host_status(conn, "h", {}).backoff_until is not None


def test_rate_limited_reads_git_stderr() -> None:
    assert rate_limited(
        "remote: Retry-After: 7\nfatal: unable to access 'http://x/': "
        "The requested URL returned error: 429\n"
    ) == (True, 7.0)
    assert rate_limited("error: RPC failed; HTTP 429 curl 22") == (True, None)
    assert rate_limited("remote: API rate limit exceeded") == (True, None)
    assert rate_limited("fatal: repository 'x' not found") == (False, None)


def test_the_gate_tells_on_change_of_every_slot_wait_and_backoff(conn: redis.Redis) -> None:
    """``on_change`` (the live Workers page's trigger, docs/live-view.md): once when a
    slot is taken, once when it is let go, once when a wait begins and once when it
    gives up, once for a backoff; never per poll, and its failure never fails a fetch."""
    seen: list[str] = []
    gate = FetchGate(conn, {"h": HostLimit(concurrency=1)}, wait=0.3, lease=10,
                     on_change=seen.append)  # fmt: skip
    with gate.slot("h"):
        assert seen == ["h"]  # taken
        other = FetchGate(conn, gate.limits, wait=0.3, lease=10, on_change=seen.append)
        with pytest.raises(HostBusy):
            _enter(other, "h")
        assert seen == ["h", "h", "h"]  # the wait began, then gave up (several polls)
    assert seen == ["h"] * 4  # let go
    with pytest.raises(HostBusy), gate.slot("h"):
        raise RateLimited("429", retry_after=5, returncode=128, stderr="")
    assert seen == ["h"] * 7  # taken, backoff, let go

    def broken(host: str) -> None:
        raise RuntimeError("live view down")

    conn.delete("gitward:fetch:h:backoff")
    with FetchGate(conn, {}, wait=0.3, lease=10, on_change=broken).slot("h"):
        assert host_status(conn, "h", {}).in_use == 1
    assert host_status(conn, "h", {}).in_use == 0


def test_the_status_shows_the_tokens_left_in_the_bucket(conn: redis.Redis) -> None:
    """The Git hosts table's Tokens: a full bucket before any fetch, one fewer per
    fetch, refilled at the rate up to the burst; None without a bucket."""
    limits = {"h": HostLimit(concurrency=10, rate=0.001, burst=3), "*": HostLimit()}
    assert host_status(conn, "h", limits).tokens == 3.0
    gate = FetchGate(conn, limits, lease=10)
    assert gate.try_acquire("h", "a")[0] and gate.try_acquire("h", "b")[0]
    tokens = host_status(conn, "h", limits).tokens
    assert tokens is not None and 1.0 <= tokens < 1.1  # 0.001/s: barely refilled
    assert host_status(conn, "other", limits).tokens is None
