"""Redlock fault cases, against real redis-server processes: a heartbeat whose
observer is stuck on a stalled master, one slow reply while another master is down (a
delaying TCP proxy), a lock handed out with little validity left, and a SET delayed past a
failed attempt."""

# The Redis-node fixtures are imported from tests/workers/locks/test_redlock.py, so test
# arguments named after them "redefine" the imports:
# ruff: noqa: F811

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from tests.support.lock_timing import HEALTHY_NODE_TIMEOUT
from tests.support.tcp_proxy import TcpProxy
from tests.workers.locks.test_redlock import (  # noqa: F401  (fixtures)
    SqliteCounter,
    counter,
    eventually,
    make,
    masters,
    nodes,
    stored,
)
from workers.locks import Lock, LockLost, LockNotAcquired, Redlock
from workers.runtime.redis_server import RedisNode


@pytest.fixture
def proxy(masters: list[RedisNode]) -> Iterator[TcpProxy]:
    """A delaying proxy in front of master 0."""
    p = TcpProxy(masters[0].port)
    yield p
    p.close()


def set_calls(node: RedisNode) -> int:
    """How many SETs the master has run (those inside our Lua scripts included)."""
    stats = node.client().info("commandstats").get("cmdstat_set", {})
    return int(stats.get("calls", 0)) if isinstance(stats, dict) else 0


# Nothing but the extension on the heartbeat thread ---------------------------


def heartbeat_threads(key: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"redlock-heartbeat:{key}"]


def test_an_observer_stuck_on_a_stalled_master_stops_neither_extensions_nor_loss_detection(
    masters: list[RedisNode], counter: SqliteCounter
) -> None:
    rl = make(masters, token_source=counter)
    in_callback = threading.Event()
    observer_done = threading.Event()
    calls: list[int] = []
    aborted: list[Lock] = []

    def on_extended(lock: Lock) -> None:
        # What workers/jobs.py does: a Redis write to master 0 with a long socket timeout.
        calls.append(lock.extensions)
        in_callback.set()
        try:
            masters[0].client(socket_timeout=30).hset("gitward:extensions", lock.key, 1)
        finally:
            observer_done.set()

    def on_lost(lock: Lock) -> None:
        aborted.append(lock)
        # What the job's hook does after the abort: tell the live view, on master 0 too.
        masters[0].client(socket_timeout=30).hset("gitward:lost", lock.key, 1)

    try:
        with (
            pytest.raises(LockLost),
            rl.hold("locks:cb", ttl=1.5, on_lost=on_lost, on_extended=on_extended) as lock,
        ):
            masters[0].pause()  # SIGSTOP: the observer's hset will hang on it
            assert eventually(in_callback.is_set)
            seen = lock.extensions
            # The Redlock tolerates one stalled master: extensions go on, on masters 1 and 2.
            assert eventually(lambda: lock.extensions >= seen + 3)
            assert not lock.lost.is_set()
            assert len(calls) == 1  # ... while the observer is still stuck in its first call
            # Now the lease really goes: the next extension finds it gone on a majority.
            for node in masters[1:]:
                node.client().delete("locks:cb")
            assert eventually(lambda: bool(aborted), timeout=3.0)
            assert aborted == [lock] and lock.lost.is_set()
        # Leaving hold() did not wait for the observer (still stuck on master 0).
        assert not observer_done.is_set()
        # And the heartbeat thread itself has ended: neither hook runs on it (an on_lost
        # stuck on the stalled master would keep it alive for 30 s).
        assert eventually(lambda: not heartbeat_threads("locks:cb"), timeout=3.0)
    finally:
        masters[0].resume()
        rl.close()


def test_the_first_heartbeat_comes_within_half_of_the_validity_left(
    masters: list[RedisNode], counter: SqliteCounter
) -> None:
    def slow_tokens(key: str, confirm: Callable[[int], None]) -> int:
        time.sleep(2.1)  # a token fetch waiting on a busy database
        return counter(key, confirm)

    rl = make(masters, token_source=slow_tokens, min_validity=0.1)
    try:
        with rl.hold("locks:first", ttl=3.0) as lock:
            # Less than ttl/3 of the lease is left: a heartbeat at ttl/3 would come too late.
            assert lock.valid_for() < 3.0 / 3
            assert eventually(lambda: lock.extensions >= 1, timeout=3.0)
            assert not lock.lost.is_set()
            lock.check()
    finally:
        rl.close()


# One slow reply costs a round, not the job --------------------------------


def test_one_slow_reply_while_another_master_is_down_costs_a_round_not_the_lock(
    masters: list[RedisNode], proxy: TcpProxy
) -> None:
    # The healthy masters' timeout (not 50 ms: a loaded machine can take longer to answer),
    # and a stall four times as long: the first round still times master 0 out.
    node_timeout = HEALTHY_NODE_TIMEOUT
    rl = Redlock(
        [proxy.url, masters[1].url, masters[2].url], retry_count=0, node_timeout=node_timeout
    )
    try:
        rl.inspect("locks:slow")  # a pooled connection to every master
        lock = rl.acquire("locks:slow", ttl=10.0)
        assert eventually(lambda: (rl.inspect("locks:slow") or {}).get("agreeing") == 3)
        masters[1].kill()
        proxy.stall(4 * node_timeout)  # master 0's next reply comes four node timeouts late
        rounds = rl.stats()["extension_rounds"]
        lock.extend()
        assert not lock.lost.is_set() and lock.valid_for() > 8.0
        assert rl.stats()["extension_rounds"] >= rounds + 2  # a later round got the quorum
        lock.release()
    finally:
        rl.close()


def test_an_extension_gives_up_only_near_the_end_of_the_validity(
    masters: list[RedisNode],
) -> None:
    # The healthy masters' node timeout, and a TTL long enough for several rounds of it
    # before the margin (2 node timeouts) is reached.
    rl = make(masters)
    ttl = 12 * HEALTHY_NODE_TIMEOUT
    try:
        lock = rl.acquire("locks:end", ttl=ttl)
        masters[1].kill()
        masters[2].pause()
        with pytest.raises(LockLost):
            lock.extend()
        # It kept trying until only its margin was left, and stopped before the lease ended.
        left = lock.valid_until - time.monotonic()
        assert 0 < left <= rl.extend_margin(ttl) + rl.node_timeout
        assert lock.lost.is_set()
        assert rl.stats()["extension_rounds"] >= 3
    finally:
        masters[2].resume()
        rl.close()


# A minimum validity -----------------------------------------------------------


def test_a_lock_left_with_less_than_the_minimum_validity_is_released_not_returned(
    masters: list[RedisNode], counter: SqliteCounter
) -> None:
    def slow_tokens(key: str, confirm: Callable[[int], None]) -> int:
        time.sleep(0.6)  # a token fetch waiting on a busy database
        return counter(key, confirm)

    rl = make(masters, token_source=slow_tokens, min_validity=0.5)
    try:
        with pytest.raises(LockNotAcquired) as failure:
            rl.acquire("locks:min", ttl=1.0)
        assert "minimum 0.500s" in failure.value.reasons["validity"]
        # Released at once (not left to expire): the next holder need not wait.
        assert all(stored(n, "locks:min") is None for n in masters)
    finally:
        rl.close()
    with pytest.raises(ValueError):
        make(masters, min_validity=1.0)


# A SET that lands after the attempt gave up ------------------------------


def test_a_set_delayed_past_a_failed_attempt_is_deleted_right_behind_it(
    masters: list[RedisNode], proxy: TcpProxy
) -> None:
    # The healthy masters' timeout (with 50 ms a loaded machine could time out the pooling
    # inspect below, and the SET would go on a fresh, unstalled connection or none at all).
    node_timeout = HEALTHY_NODE_TIMEOUT
    rl = Redlock(
        [proxy.url, masters[1].url, masters[2].url], retry_count=0, node_timeout=node_timeout
    )
    try:
        rl.inspect("locks:late")  # a pooled connection to every master
        # Every master knows the lock scripts (as after any earlier lock): a master that
        # does not answers the late SET's EVALSHA with NOSCRIPT, and nothing is set.
        rl.acquire("locks:warm", ttl=10.0).release()
        masters[2].client().set("locks:late", "someone else", px=10_000)
        masters[1].kill()
        before = set_calls(masters[0])
        proxy.stall(6 * node_timeout)  # our SET to master 0 is held back past the attempt
        with pytest.raises(LockNotAcquired):
            rl.acquire("locks:late", ttl=10.0)
        assert masters[0].client().get("locks:late") is None  # not arrived yet
        # The SET reaches master 0 only now, after the attempt gave up ...
        assert eventually(lambda: set_calls(masters[0]) > before)
        # ... and the release written behind it on the same connection removes it at once,
        # long before its 10 s TTL.
        assert eventually(lambda: masters[0].client().get("locks:late") is None, timeout=2.0)
        assert stored(masters[2], "locks:late") == b"someone else"  # (master 1 is dead)
    finally:
        rl.close()


def test_a_set_pending_on_a_stalled_master_is_released_as_soon_as_it_resumes(
    masters: list[RedisNode],
) -> None:
    key = "locks:stalled"
    a = make(masters)  # never talks to master 0 before it stalls
    b = make(masters)
    try:
        b.inspect(key)  # a pooled connection to every master
        # Every master knows the lock scripts (as after any earlier lock): a master that
        # does not answers the late SET's EVALSHA with NOSCRIPT, and nothing is set.
        b.acquire("locks:warm", ttl=10.0).release()
        before = set_calls(masters[0])
        masters[0].pause()  # SIGSTOP
        try:
            held = a.acquire(key, ttl=10.0)  # granted by masters 1 and 2
            with pytest.raises(LockNotAcquired) as failure:
                b.acquire(key, ttl=10.0)  # its SET waits, unread, in master 0's socket
            assert failure.value.reasons[b.nodes[0].name] != "acquired"
        finally:
            masters[0].resume()
        # Master 0 now runs b's SET (nothing held there, so it succeeds) ...
        assert eventually(lambda: set_calls(masters[0]) > before)
        # ... and the release b queued behind it, at once: no key for the 10 s TTL.
        assert eventually(lambda: masters[0].client().get(key) is None, timeout=2.0)
        held.release()
    finally:
        a.close()
        b.close()


# A master that lost its script cache answers NOSCRIPT after the quorum was decided ---------


def test_a_noscript_reply_after_the_quorum_still_puts_the_lock_on_that_master(
    masters: list[RedisNode], proxy: TcpProxy
) -> None:
    # A long node timeout: the reply read after the decision must not time out.
    rl = Redlock([proxy.url, masters[1].url, masters[2].url], retry_count=0, node_timeout=1.0)
    try:
        rl.inspect("locks:noscript")  # a pooled connection to every master
        masters[0].client().script_flush()  # what a restart does to the script cache
        proxy.stall(0.2)  # master 0's NOSCRIPT comes after masters 1 and 2 decided
        lock = rl.acquire("locks:noscript", ttl=5.0)
        # The script did not run on master 0; it is sent again (EVAL) once the reply comes,
        # so the key lands on every master, not on a bare quorum.
        assert eventually(lambda: stored(masters[0], "locks:noscript") is not None)
        info = rl.inspect("locks:noscript")
        assert info is not None and info["agreeing"] == 3
        lock.release()
    finally:
        rl.close()
