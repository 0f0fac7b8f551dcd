"""Redlock against real redis-server processes (killed, paused, restarted for real).

Runs without Django: ``.venv/bin/pytest -p no:django tests/workers/locks/test_redlock.py``.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.support.checked_threads import CheckedThread
from tests.support.lock_timing import HEALTHY_NODE_TIMEOUT
from workers.locks import Lock, LockLost, LockNotAcquired, LockNotOwned, Redlock
from workers.runtime.redis_server import RedisNode

# Fixtures and helpers --------------------------------------------------------------------

NO_RETRY = Retry(NoBackoff(), 0)


class SqliteCounter:
    """A fencing-token source backed by a real sqlite file: one row per resource,
    incremented in its own transaction (the database counter of docs/locks.md)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        with contextlib.closing(sqlite3.connect(self.path)) as conn:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS fence (resource TEXT PRIMARY KEY, token INTEGER)"
            )
            conn.commit()

    def __call__(self, resource: str, confirm: Callable[[int], None] | None = None) -> int:
        """Like ``dashboard.locks.fencing.next_token``: ``confirm`` runs before the COMMIT, and a
        failed confirmation rolls the increment back."""
        with contextlib.closing(sqlite3.connect(self.path, timeout=30, isolation_level=None)) as c:
            c.execute("BEGIN IMMEDIATE")
            try:
                c.execute("INSERT OR IGNORE INTO fence VALUES (?, 0)", (resource,))
                c.execute("UPDATE fence SET token = token + 1 WHERE resource = ?", (resource,))
                row = c.execute(
                    "SELECT token FROM fence WHERE resource = ?", (resource,)
                ).fetchone()
                if confirm is not None:
                    confirm(int(row[0]))
            except BaseException:
                c.execute("ROLLBACK")
                raise
            c.execute("COMMIT")
            return int(row[0])

    def current(self, resource: str) -> int:
        with contextlib.closing(sqlite3.connect(self.path, timeout=30)) as c:
            row = c.execute("SELECT token FROM fence WHERE resource = ?", (resource,)).fetchone()
            return int(row[0]) if row else 0


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[RedisNode]]:
    base = tmp_path_factory.mktemp("redlock")
    started = [RedisNode(base / f"m{i}", debug_command=True).start() for i in range(3)]
    yield started
    for node in started:
        node.kill()


def heal(nodes: list[RedisNode]) -> None:
    for node in nodes:
        node.resume()
        if not node.alive():
            node.start()


@pytest.fixture
def masters(nodes: list[RedisNode]) -> Iterator[list[RedisNode]]:
    heal(nodes)
    for node in nodes:
        node.client().flushall()
    yield nodes
    heal(nodes)


@pytest.fixture
def counter(tmp_path: Path) -> SqliteCounter:
    return SqliteCounter(tmp_path / "fence.sqlite3")


@pytest.fixture
def redlock(masters: list[RedisNode], counter: SqliteCounter) -> Iterator[Redlock]:
    rl = Redlock(
        [n.url for n in masters],
        retry_count=0,
        token_source=counter,
        node_timeout=HEALTHY_NODE_TIMEOUT,
    )
    yield rl
    rl.close()


def make(masters: list[RedisNode], **kwargs: Any) -> Redlock:
    kwargs.setdefault("retry_count", 0)
    kwargs.setdefault("node_timeout", HEALTHY_NODE_TIMEOUT)
    return Redlock([n.url for n in masters], **kwargs)


def eventually(predicate: Callable[[], object], timeout: float = 5.0) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` passed; return the last result."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def busy(node: RedisNode) -> bool:
    """Whether the master is stuck in a command (``DEBUG SLEEP``): a PING gets no answer.

    No retries: redis-py 6 retries a timed-out command 3 times by default, with jittered
    exponential backoff (up to 1 s, 2 s, 4 s), so the PING would outlast the sleep, be
    answered, and the master would never look busy.
    """
    client = node.client(socket_timeout=0.25, socket_connect_timeout=0.5, retry=NO_RETRY)
    try:
        client.ping()
    except redis.TimeoutError:
        return True
    finally:
        client.close()
    return False


def stored(node: RedisNode, key: str) -> bytes | None:
    value = node.client().get(key)
    assert value is None or isinstance(value, bytes)
    return value


# Basic contract -----------------------------------------------------------------------------


def test_it_acquires_extends_and_releases_with_a_holder_and_a_token(redlock: Redlock) -> None:
    lock = redlock.acquire(["locks:a"], ttl=5.0, holder={"worker": "w1", "job": "j1"})
    assert lock.token == 1
    assert 4.0 < lock.valid_for() <= 5.0
    info = redlock.inspect("locks:a")
    assert info is not None
    assert info["holder"]["worker"] == "w1"
    assert info["holder"]["job"] == "j1"
    assert info["holder"]["pid"] == os.getpid()
    assert info["holder"]["token"] == 1  # confirmed on a quorum before acquire returned
    assert "nonce" not in info["holder"]
    # A quorum at least (a master still silent when the quorum was reached gets the SET
    # too, but may have timed out on a loaded machine).
    assert info["agreeing"] >= 2 and info["masters"] == 3
    assert 0 < info["ttl_ms"] <= 5000
    lock.extend(ttl=20.0)
    assert lock.valid_for() > 15.0
    lock.check()
    lock.release()
    assert redlock.inspect("locks:a") is None
    with pytest.raises(LockLost):
        lock.check()


def test_it_refuses_a_second_holder_naming_each_master(redlock: Redlock) -> None:
    first = redlock.acquire(["locks:a"], ttl=10.0)
    start = time.monotonic()
    with pytest.raises(LockNotAcquired) as failure:
        redlock.acquire(["locks:a"], ttl=10.0)
    assert time.monotonic() - start < 10.0 / 4  # fails fast, well before the TTL
    # Refused as soon as a majority said "held": the third master is named too, by its
    # refusal or, when its reply was still on its way, as not needed for the outcome.
    reasons = list(failure.value.reasons.values())
    assert len(reasons) == 3 and reasons.count("refused: held") >= 2
    assert set(reasons) <= {"refused: held", "no answer yet (outcome already decided)"}
    assert "refused: held" in str(failure.value)
    assert redlock.stats()["refused"] >= 2
    first.release()
    second = redlock.acquire(["locks:a"], ttl=10.0)
    assert second.token is not None and first.token is not None
    assert second.token > first.token
    second.release()


def test_it_retries_with_jitter_before_giving_up(masters: list[RedisNode]) -> None:
    rl = make(masters, retry_count=2, retry_delay=0.02, retry_jitter=0.01)
    try:
        held = rl.acquire("locks:r", ttl=10.0)
        with pytest.raises(LockNotAcquired) as failure:
            rl.acquire("locks:r", ttl=10.0)
        assert failure.value.attempts == 3
        assert rl.stats()["acquire_attempts"] == 4
        held.release()
    finally:
        rl.close()


def test_a_lock_whose_validity_is_gone_is_not_acquired_and_leaves_nothing(
    masters: list[RedisNode],
) -> None:
    # The token source stalls past the TTL: the quorum was reached, but by the time the
    # token arrives the lease may belong to someone else, so the lock is not handed out.
    def slow_tokens(resource: str, confirm: Callable[[int], None]) -> int:
        time.sleep(0.35)
        return 1

    rl = make(masters, token_source=slow_tokens)
    try:
        with pytest.raises(LockNotAcquired) as failure:
            rl.acquire("locks:v", ttl=0.3)
        assert "validity" in failure.value.reasons
        assert all(stored(n, "locks:v") is None for n in masters)
    finally:
        rl.close()


def test_release_of_a_lock_we_no_longer_own_raises_lock_not_owned(redlock: Redlock) -> None:
    lock = redlock.acquire("locks:o", ttl=5.0)
    lock.release()
    with pytest.raises(LockNotOwned):
        lock.release()
    other = redlock.acquire("locks:o", ttl=5.0)
    # A forged lock with a different nonce cannot delete the real holder's keys.
    with pytest.raises(LockNotOwned):
        Lock(
            redlock,
            ("locks:o",),
            ttl=5.0,
            nonce="0" * 32,
            prefix='{"nonce":"' + "0" * 32 + '",',
            holder={},
            valid_until=time.monotonic() + 5,
            tokens={},
        ).release()
    assert redlock.inspect("locks:o") is not None
    other.release()


def test_it_works_with_a_single_master(masters: list[RedisNode]) -> None:
    rl = make(masters[:1])
    try:
        assert rl.quorum == 1
        lock = rl.acquire("locks:one", ttl=5.0)
        with pytest.raises(LockNotAcquired):
            rl.acquire("locks:one", ttl=5.0)
        lock.extend()
        lock.release()
    finally:
        rl.close()


def test_it_reuses_one_thread_pool_instead_of_one_per_call(masters: list[RedisNode]) -> None:
    # 110 calls in a row: 0.5 s node timeouts (not 50 ms) so a loaded machine does not time
    # a healthy master out; the timeout plays no part in what is checked.
    redlock = make(masters, node_timeout=0.5)
    try:
        for _ in range(10):
            redlock.acquire("locks:p", ttl=5.0).release()
        pool = redlock.transport.pool
        for _ in range(100):
            redlock.acquire("locks:p", ttl=5.0).release()
        assert redlock.transport.pool is pool
        # Its threads are started on demand but bounded: 100 calls never add 100s of threads.
        workers = [t for t in threading.enumerate() if t.name.startswith("redlock_")]
        assert 0 < len(workers) <= redlock.transport.max_workers
    finally:
        redlock.close()


def _use_inherited_redlock(rl: Redlock) -> None:
    lock = rl.acquire("locks:fork", ttl=5.0)
    lock.extend()
    info = rl.inspect("locks:fork")  # runs on the thread pool
    if info is None or info["agreeing"] != 3:
        raise SystemExit(f"inspect in the child saw {info}")
    lock.release()


def test_a_forked_child_can_use_the_inherited_redlock(masters: list[RedisNode]) -> None:
    # RQ forks a work horse per job; a process-wide Redlock built before the fork must work.
    # One pool thread, already started: a child that inherited the pool as-is would queue
    # work that no thread ever runs.
    rl = make(masters, max_workers=1)
    try:
        rl.acquire("locks:fork", ttl=5.0).release()
        rl.inspect("locks:fork")
        child = multiprocessing.get_context("fork").Process(
            target=_use_inherited_redlock, args=(rl,)
        )
        child.start()
        child.join(30)
        assert child.exitcode == 0
        rl.acquire("locks:fork", ttl=5.0).release()  # the parent is unaffected
    finally:
        rl.close()


# Contention ---------------------------------------------------------------------------------


CONTENDED = "locks:contended"
ROUNDS = 20  # per thread / process


def _critical_section(lock: Lock, workdir: Path) -> None:
    """Fail loudly (into violations.log) if two holders are ever inside at once, or if a
    token is not larger than the previous holder's."""
    marker = workdir / "inside"
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        _log(workdir / "violations.log", f"overlap token={lock.token}")
        return
    try:
        lock.check()
        last_path = workdir / "last"
        last = int(last_path.read_text()) if last_path.exists() else 0
        if lock.token is None or lock.token <= last:
            _log(workdir / "violations.log", f"token {lock.token} after {last}")
        last_path.write_text(str(lock.token))
        _log(workdir / "order.log", str(lock.token))
        time.sleep(0.002)
    finally:
        os.close(fd)
        os.unlink(marker)


def _log(path: Path, line: str) -> None:
    fd = os.open(path, os.O_CREAT | os.O_APPEND | os.O_WRONLY)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def _hammer(urls: list[str], db_path: str, workdir: str, rounds: int) -> int:
    """Take the contended lock ``script_rounds`` times from this process; return the count."""
    rl = Redlock(
        urls,
        retry_count=200,
        retry_delay=0.01,
        retry_jitter=0.008,
        token_source=SqliteCounter(Path(db_path)),
        node_timeout=HEALTHY_NODE_TIMEOUT,
    )
    done = 0
    try:
        for _ in range(rounds):
            lock = rl.acquire(CONTENDED, ttl=3.0)
            try:
                _critical_section(lock, Path(workdir))
            finally:
                lock.release()
            done += 1
    finally:
        rl.close()
    return done


def test_it_keeps_one_holder_at_a_time_across_threads_and_processes(
    masters: list[RedisNode], tmp_path: Path
) -> None:
    urls = [n.url for n in masters]
    db = tmp_path / "fence.sqlite3"
    SqliteCounter(db)
    ctx = multiprocessing.get_context("spawn")  # no fork of a threaded test process
    with ctx.Pool(2) as pool:
        procs = [
            pool.apply_async(_hammer, (urls, str(db), str(tmp_path), ROUNDS)) for _ in range(2)
        ]
        results: list[int] = []
        errors: list[BaseException] = []

        def thread_main() -> None:
            try:
                results.append(_hammer(urls, str(db), str(tmp_path), ROUNDS))
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=thread_main) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        results += [p.get(timeout=60) for p in procs]
    assert not errors
    assert sum(results) == 6 * ROUNDS
    violations = tmp_path / "violations.log"
    assert not violations.exists(), violations.read_text()
    tokens = [int(x) for x in (tmp_path / "order.log").read_text().split()]
    assert len(tokens) == 6 * ROUNDS
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)


# Master failures ----------------------------------------------------------------------------


def test_it_keeps_working_with_one_of_three_masters_dead(
    redlock: Redlock, masters: list[RedisNode]
) -> None:
    masters[0].kill()
    lock = redlock.acquire("locks:k", ttl=5.0)
    lock.extend(5.0)
    info = redlock.inspect("locks:k")
    assert info is not None and info["agreeing"] == 2
    lock.release()
    assert redlock.inspect("locks:k") is None
    assert redlock.stats()["nodes"][redlock.nodes[0].name]["errors"] >= 1


def test_it_fails_fast_naming_the_dead_masters_and_recovers_when_they_return(
    masters: list[RedisNode],
) -> None:
    rl = make(masters, retry_count=2, retry_delay=0.05, retry_jitter=0.02)
    try:
        masters[0].kill()
        masters[1].kill()
        start = time.monotonic()
        with pytest.raises(LockNotAcquired) as failure:
            rl.acquire("locks:k", ttl=10.0)
        assert time.monotonic() - start < 10.0 / 4
        reasons = failure.value.reasons
        assert reasons[rl.nodes[0].name] == "connection refused"
        assert reasons[rl.nodes[1].name] == "connection refused"
        assert rl.nodes[0].name in str(failure.value)
        # The attempt unlocked the one master it reached.
        assert stored(masters[2], "locks:k") is None
        masters[0].start()
        masters[1].start()
        lock = rl.acquire("locks:k", ttl=10.0)
        lock.release()
    finally:
        rl.close()


def test_a_master_restarted_empty_lets_a_second_holder_in_with_a_larger_token(
    redlock: Redlock, masters: list[RedisNode], counter: SqliteCounter
) -> None:
    # A locks while master 2 is down, so A holds exactly 2 of 3.
    masters[2].kill()
    first = redlock.acquire("locks:m", ttl=10.0)
    masters[2].start()
    # Master 0 crashes and comes back empty at once (no delayed restart): the Redlock
    # safety assumption is broken and B can take a majority (masters 0 and 2).
    masters[0].restart(empty=True)
    second = redlock.acquire("locks:m", ttl=10.0)
    assert first.valid_for() > 0 and second.valid_for() > 0  # both believe they hold it
    assert first.token is not None and second.token is not None
    assert second.token > first.token
    # The database fence accepts only the newest token: the first holder is stale.
    assert counter.current("locks:m") == second.token != first.token
    # And the first holder finds out at its next extension.
    with pytest.raises(LockNotOwned):
        first.extend()
    assert first.lost.is_set()
    second.release()


def test_it_reloads_its_scripts_after_every_master_restarted_empty(
    masters: list[RedisNode], counter: SqliteCounter
) -> None:
    # Each master needs a new connection (handshake included), NOSCRIPT and EVAL: 0.5 s node
    # timeouts (not 50 ms) so a loaded machine does not time that out.
    redlock = make(masters, token_source=counter, node_timeout=0.5)
    try:
        redlock.acquire("locks:w", ttl=5.0).release()  # pooled connections, cached scripts
        for node in masters:
            node.restart(empty=True)  # stale sockets and an empty script cache everywhere
        lock = redlock.acquire("locks:w", ttl=5.0)
        lock.extend()
        assert eventually(lambda: (redlock.inspect("locks:w") or {}).get("agreeing") == 3)
        lock.release()
    finally:
        redlock.close()


def test_a_slow_master_is_outvoted_without_waiting_for_it(
    redlock: Redlock, masters: list[RedisNode]
) -> None:
    sleep = 2.0  # long enough to be seen busy even on a loaded machine
    sleeper = CheckedThread(
        target=lambda: masters[0].client().execute_command("DEBUG", "SLEEP", sleep)
    )
    sleeper.start()
    assert eventually(lambda: busy(masters[0]))  # DEBUG SLEEP has started
    try:
        start = time.monotonic()
        lock = redlock.acquire("locks:s", ttl=10.0)
        lock.extend()
        lock.release()
        assert time.monotonic() - start < sleep  # never waited for the stalled master
    finally:
        sleeper.join()


def test_two_slow_masters_time_out_within_the_node_timeout(
    masters: list[RedisNode],
) -> None:
    # A short node timeout is safe here: masters 0 and 1 are stopped (SIGSTOP), so they
    # time out whatever the budget, and the one healthy master's vote decides nothing (no
    # quorum without one of them). Stopped, not DEBUG SLEEP: a sleep of fixed length could
    # end before a loaded machine got to the acquire.
    rl = make(masters, node_timeout=0.05)
    ttl = 60.0
    try:
        masters[0].pause()
        masters[1].pause()
        start = time.monotonic()
        with pytest.raises(LockNotAcquired) as failure:
            rl.acquire("locks:s", ttl=ttl)
        assert time.monotonic() - start < ttl / 20  # per-node timeout, not the TTL
        assert failure.value.reasons[rl.nodes[0].name] == "timeout"
        assert failure.value.reasons[rl.nodes[1].name] == "timeout"
    finally:
        masters[0].resume()
        masters[1].resume()
        rl.close()


def test_a_paused_master_counts_as_a_timeout(masters: list[RedisNode]) -> None:
    # A paused master never answers, whatever the timeout: HEALTHY_NODE_TIMEOUT (not 50
    # ms) so the healthy ones are not timed out too when the machine is loaded.
    rl = make(masters)
    try:
        masters[1].pause()
        lock = rl.acquire("locks:z", ttl=10.0)
        lock.release()
        masters[2].pause()
        with pytest.raises(LockNotAcquired) as failure:
            rl.acquire("locks:z", ttl=10.0)
        assert failure.value.reasons[rl.nodes[1].name] == "timeout"
        assert failure.value.reasons[rl.nodes[2].name] == "timeout"
    finally:
        masters[1].resume()
        masters[2].resume()
        rl.close()


def closed_ports(n: int) -> Iterator[list[str]]:
    """URLs of ``n`` distinct loopback ports that refuse connections.

    Each port stays bound (never listening, so a connect is refused) until the test ends:
    two free_port() calls in a row may return the same port, and then the two "masters"
    would share one name in the failure's reasons.
    """
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        yield [f"redis://127.0.0.1:{s.getsockname()[1]}/0" for s in socks]


@pytest.fixture
def closed() -> Iterator[list[str]]:
    yield from closed_ports(2)


def test_a_closed_port_is_a_refused_master(masters: list[RedisNode], closed: list[str]) -> None:
    urls = [masters[0].url, masters[1].url, closed[0]]
    rl = Redlock(urls, retry_count=0, node_timeout=HEALTHY_NODE_TIMEOUT)
    try:
        rl.acquire("locks:c", ttl=10.0).release()
        assert rl.stats()["nodes"][rl.nodes[2].name]["errors"] >= 1
    finally:
        rl.close()
    rl = Redlock([masters[0].url, *closed], retry_count=0, node_timeout=HEALTHY_NODE_TIMEOUT)
    try:
        start = time.monotonic()
        with pytest.raises(LockNotAcquired) as failure:
            rl.acquire("locks:c", ttl=10.0)
        assert time.monotonic() - start < 10.0 / 4
        assert str(failure.value).count("connection refused") == 2
        assert stored(masters[0], "locks:c") is None
    finally:
        rl.close()


def test_a_clock_jump_on_one_master_leaves_a_working_majority(
    redlock: Redlock, masters: list[RedisNode]
) -> None:
    lock = redlock.acquire("locks:j", ttl=10.0)
    masters[0].client().pexpire("locks:j", 1)  # that master's clock jumped past the TTL
    assert eventually(lambda: masters[0].client().pttl("locks:j") == -2)
    info = redlock.inspect("locks:j")
    assert info is not None and info["agreeing"] == 2
    lock.extend()
    lock.check()
    lock.release()


# Losing a lease -----------------------------------------------------------------------------


def test_a_holder_paused_past_its_ttl_gets_lock_lost(
    redlock: Redlock, masters: list[RedisNode]
) -> None:
    lock = redlock.acquire("locks:p", ttl=0.3)
    # The holder "pauses" (GC, SIGSTOP) until its lease is over on the masters too.
    assert eventually(lambda: all(stored(n, "locks:p") is None for n in masters))
    assert lock.valid_for() == 0
    with pytest.raises(LockLost):
        lock.check()
    with pytest.raises(LockLost):
        lock.extend()
    other = redlock.acquire("locks:p", ttl=5.0)
    assert other.token is not None and lock.token is not None and other.token > lock.token
    with pytest.raises(LockNotOwned):
        lock.release()
    assert redlock.inspect("locks:p") is not None  # the stale release did not touch it
    other.release()


def test_the_heartbeat_keeps_a_lock_past_its_ttl(redlock: Redlock) -> None:
    with redlock.hold("locks:h", ttl=0.6) as lock:
        acquired_until = lock.valid_until
        # Two extensions and then past the first lease's end: held only thanks to them.
        assert eventually(lambda: lock.extensions >= 2 and time.monotonic() > acquired_until)
        lock.check()
        assert not lock.lost.is_set()
    assert redlock.inspect("locks:h") is None


def test_the_heartbeat_detects_a_lost_majority_and_calls_on_lost(
    redlock: Redlock, masters: list[RedisNode]
) -> None:
    called: list[Lock] = []
    done = threading.Event()

    def on_lost(lock: Lock) -> None:  # runs in the heartbeat thread, after lock.lost is set
        assert lock.lost.is_set()
        called.append(lock)
        done.set()

    with pytest.raises(LockLost), redlock.hold("locks:h", ttl=0.6, on_lost=on_lost) as lock:
        for node in masters[:2]:
            node.client().pexpire("locks:h", 1)
        assert done.wait(10.0)
        assert called == [lock]
        with pytest.raises(LockLost):
            lock.check()
        with pytest.raises(LockLost):
            lock.extend()
    assert redlock.stats()["losses"] == 1


def test_the_heartbeat_detects_unreachable_masters(
    redlock: Redlock, masters: list[RedisNode]
) -> None:
    lost = threading.Event()
    with pytest.raises(LockLost), redlock.hold("locks:h", ttl=0.6, on_lost=lambda _: lost.set()):
        masters[0].kill()
        masters[1].pause()
        assert lost.wait(10.0)


def test_hold_lets_the_body_exception_through_when_the_lock_was_lost(
    redlock: Redlock, masters: list[RedisNode]
) -> None:
    with pytest.raises(KeyError), redlock.hold("locks:h", ttl=0.6) as lock:
        for node in masters:
            node.client().delete("locks:h")
        assert lock.lost.wait(10.0)
        raise KeyError("body failed")


def test_hold_tolerates_a_release_inside_the_body(redlock: Redlock) -> None:
    with redlock.hold("locks:h", ttl=0.3) as lock:
        lock.release()
        heartbeat = lock._heartbeat
        assert heartbeat is not None
        # The heartbeat wakes up after the release, sees it and ends (without a "loss").
        assert eventually(lambda: not heartbeat._thread.is_alive())
    assert not lock.lost.is_set()
    assert redlock.stats()["losses"] == 0


def test_extend_and_release_from_many_threads_are_serialised(redlock: Redlock) -> None:
    lock = redlock.acquire("locks:t", ttl=5.0)
    outcomes: list[str] = []

    def extend_a_lot() -> None:
        for _ in range(20):
            try:
                lock.extend()
                outcomes.append("extended")
            except LockLost as exc:
                outcomes.append(type(exc).__name__)

    threads = [CheckedThread(target=extend_a_lot) for _ in range(4)]
    for t in threads:
        t.start()
    assert eventually(lambda: len(outcomes) >= 4)  # extensions are under way
    lock.release()
    for t in threads:
        t.join()
    # Each extend either fully happened before the release or saw it; none lost the lock.
    assert set(outcomes) <= {"extended", "LockLost"}
    assert not lock.lost.is_set()
    assert redlock.inspect("locks:t") is None


def test_hold_releases_on_exit(redlock: Redlock) -> None:
    with redlock.hold(["locks:h1", "locks:h2"], ttl=5.0, holder={"job": "j"}) as lock:
        assert lock.tokens == {"locks:h1": 1, "locks:h2": 1}
        assert redlock.inspect("locks:h2") is not None
    assert redlock.inspect("locks:h1") is None and redlock.inspect("locks:h2") is None


# Multi-key and introspection ----------------------------------------------------------------


def test_multi_key_acquire_is_all_or_nothing(redlock: Redlock, masters: list[RedisNode]) -> None:
    blocker = redlock.acquire("locks:k2", ttl=10.0)
    with pytest.raises(LockNotAcquired):
        redlock.acquire(["locks:k1", "locks:k2", "locks:k3"], ttl=10.0)
    for node in masters:
        assert stored(node, "locks:k1") is None and stored(node, "locks:k3") is None
    blocker.release()
    # Held on one master only: we win on the other two, and touch nothing on that one.
    masters[0].client().set("locks:k2", "someone else", px=10_000)
    lock = redlock.acquire(["locks:k1", "locks:k2", "locks:k3"], ttl=10.0)
    assert stored(masters[0], "locks:k1") is None
    assert stored(masters[1], "locks:k1") is not None
    assert lock.token == lock.tokens["locks:k1"]
    assert set(lock.tokens) == {"locks:k1", "locks:k2", "locks:k3"}
    lock.release()
    assert stored(masters[0], "locks:k2") == b"someone else"
    assert stored(masters[1], "locks:k2") is None


def test_inspect_and_list_locks_show_holder_ttl_and_agreement(
    redlock: Redlock, masters: list[RedisNode]
) -> None:
    a = redlock.acquire("locks:git:repo:1:mirror", ttl=10.0, holder={"worker": "w", "job": "1"})
    b = redlock.acquire("locks:git:repo:2:mirror", ttl=10.0, holder={"version": "v2"})
    masters[0].client().delete("locks:git:repo:1:mirror")
    masters[0].client().set("other:key", "x")
    info = redlock.inspect("locks:git:repo:1:mirror")
    assert info is not None
    assert (info["agreeing"], info["masters"]) == (2, 3)
    assert info["holder"]["worker"] == "w" and info["holder"]["token"] == a.token
    assert 0 < info["ttl_ms"] <= 10_000
    listed = redlock.list_locks("locks:")
    assert [x["key"] for x in listed] == ["locks:git:repo:1:mirror", "locks:git:repo:2:mirror"]
    assert listed[1]["holder"]["version"] == "v2" and listed[1]["agreeing"] == 3
    assert redlock.inspect("locks:none") is None
    a.release()
    b.release()
    assert redlock.list_locks("locks:") == []


def test_inspect_reports_foreign_values(redlock: Redlock, masters: list[RedisNode]) -> None:
    for node in masters:
        node.client().set("locks:foreign", "not json", px=5000)
    info = redlock.inspect("locks:foreign")
    assert info is not None and info["holder"] == {"raw": "not json"} and info["agreeing"] == 3


def test_it_accepts_redis_clients_and_leaves_their_settings_alone(
    masters: list[RedisNode],
) -> None:
    clients = [redis.Redis(host=n.host, port=n.port, socket_timeout=5.0) for n in masters]
    rl = Redlock(clients, retry_count=0, node_timeout=HEALTHY_NODE_TIMEOUT)
    try:
        rl.acquire("locks:cl", ttl=5.0).release()
        assert clients[0].connection_pool.connection_kwargs["socket_timeout"] == 5.0
        assert rl.nodes[0].pool.connection_kwargs["socket_timeout"] == HEALTHY_NODE_TIMEOUT
    finally:
        rl.close()
