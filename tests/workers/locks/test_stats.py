"""workers.locks.stats: the observer interface through which an application exports a
Redlock's counters (the core knows no metrics library). Real masters: the conftest's."""

from __future__ import annotations

import pytest

from workers.locks import LockNotAcquired, Redlock
from workers.runtime.redis_server import RedisNode


class Observer:
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.latencies: list[float] = []

    def counted(self, name: str, n: int) -> None:
        self.counts[name] = self.counts.get(name, 0) + n

    def acquired(self, took: float) -> None:
        self.latencies.append(took)


class Broken:
    def counted(self, name: str, n: int) -> None:
        raise RuntimeError("exporter bug")

    def acquired(self, took: float) -> None:
        raise RuntimeError("exporter bug")


def test_an_observer_sees_every_increment_and_acquire_latency(
    redis_nodes: list[RedisNode],
) -> None:
    # 0.5 s node timeouts, not the 50 ms default: a loaded machine must not turn a healthy
    # master's refusal into a timeout (the refusals are counted below).
    rl = Redlock([n.url for n in redis_nodes], retry_count=1, retry_delay=0.01, node_timeout=0.5)
    seen = Observer()
    rl.metrics.observe(seen)
    rl.metrics.observe(seen)  # idempotent: counted once
    lock = rl.acquire("locks:observed", ttl=5.0)
    with pytest.raises(LockNotAcquired):  # held: refused by every master, twice
        rl.acquire("locks:observed", ttl=5.0)
    lock.extend(ttl=5.0)
    lock.release()
    stats = rl.stats()
    for name in ("acquire_attempts", "acquired", "acquire_failures", "refused", "extensions",
                 "releases"):  # fmt: skip
        assert seen.counts.get(name, 0) == stats[name], name
    assert stats["acquired"] == 1 and len(seen.latencies) == 1 and seen.latencies[0] > 0
    assert seen.counts["refused"] >= 2 * 2  # two attempts, each refused by a majority
    rl.close()


def test_a_broken_observer_never_breaks_a_lock_operation(redis_nodes: list[RedisNode]) -> None:
    rl = Redlock([n.url for n in redis_nodes], node_timeout=0.5)
    rl.metrics.observe(Broken())
    lock = rl.acquire("locks:broken-observer", ttl=5.0)
    lock.release()
    assert rl.stats()["acquired"] == 1 and rl.stats()["releases"] == 1
    rl.close()
