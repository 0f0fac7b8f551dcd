"""dashboard.observability.counters: the in-process buffer and its flush into the Redis hash (the
Prometheus rendering and the figures of real jobs are in
tests/dashboard/operations/test_prometheus.py and
tests/system/test_observability.py)."""

from __future__ import annotations

import multiprocessing
import os

import pytest
from django.db import transaction

from dashboard.infra import queues
from dashboard.observability import counters
from dashboard.observability.counters import (
    DROPPED,
    JOB_RUN_SECONDS,
    JOBS_ENQUEUED,
    MASTER_SECONDS,
    count,
    flush,
    observe,
    parse_field,
    read_all,
)
from workers.runtime.redis_server import RedisNode


def _series(name: str) -> dict[tuple[tuple[str, str], ...], float]:
    out = {}
    for field, value in read_all().items():
        series, labels = parse_field(field)
        if series == name:
            out[tuple(sorted(labels.items()))] = value
    return out


@pytest.fixture(autouse=True)
def _clean_buffer() -> None:
    counters.discard()


def test_counts_add_up_in_redis_across_flushes() -> None:
    count(JOBS_ENQUEUED, queue="sync", version="abc")
    count(JOBS_ENQUEUED, 2, queue="sync", version="abc")
    count(JOBS_ENQUEUED, 0, queue="sync", version="zero")  # a zero adds no series
    assert flush()
    count(JOBS_ENQUEUED, queue="sync", version="abc")
    count(JOBS_ENQUEUED, queue="analysis", version="abc")
    assert flush()
    assert _series(JOBS_ENQUEUED.name) == {
        (("queue", "sync"), ("version", "abc")): 4.0,
        (("queue", "analysis"), ("version", "abc")): 1.0,
    }


def test_labels_must_match_the_definition() -> None:
    with pytest.raises(ValueError, match="do not match"):
        count(JOBS_ENQUEUED, queue="sync")
    with pytest.raises(ValueError):
        count(JOBS_ENQUEUED, queue="sync", version="v", extra="x")


def test_a_histogram_observation_lands_in_its_bucket_sum_and_count() -> None:
    observe(JOB_RUN_SECONDS, 0.07, queue="q", version="v")
    observe(JOB_RUN_SECONDS, 0.1, queue="q", version="v")  # upper bounds are inclusive
    observe(JOB_RUN_SECONDS, 10_000, queue="q", version="v")
    assert flush()
    buckets = {dict(k)["le"]: v for k, v in _series(f"{JOB_RUN_SECONDS.name}_bucket").items()}
    assert buckets == {"0.1": 2.0, "+Inf": 1.0}
    (total,) = _series(f"{JOB_RUN_SECONDS.name}_sum").values()
    assert total == pytest.approx(10_000.17)
    assert list(_series(f"{JOB_RUN_SECONDS.name}_count").values()) == [3.0]


def test_a_failed_flush_keeps_the_increments_for_the_next(redis_nodes: list[RedisNode]) -> None:
    count(JOBS_ENQUEUED, 5, queue="down", version="v")
    redis_nodes[0].kill()
    try:
        assert flush() is False
    finally:
        redis_nodes[0].restart()
        queues.CIRCUIT.reset()
    assert flush()
    assert _series(JOBS_ENQUEUED.name) == {(("queue", "down"), ("version", "v")): 5.0}


def test_a_full_buffer_drops_new_series_and_counts_them(monkeypatch: pytest.MonkeyPatch) -> None:
    # No periodic flush in the middle of the loop (a loaded machine made one: the buffer
    # was emptied half-way and never filled): a flusher that sleeps past the test.
    monkeypatch.setattr(counters, "FLUSH_INTERVAL", 3600.0)
    counters.stop_flushing()
    try:
        for i in range(counters.MAX_FIELDS + 10):
            count(JOBS_ENQUEUED, queue=f"q{i}", version="v")
        assert flush()
    finally:
        counters.stop_flushing()  # the next count starts a flusher at the usual interval
    assert len(_series(JOBS_ENQUEUED.name)) <= counters.MAX_FIELDS
    (dropped,) = _series(DROPPED.name).values()
    assert dropped >= 10


def _child_flush() -> None:
    os._exit(0 if counters._buffer.take() == {} else 1)


def test_a_forked_child_starts_with_an_empty_buffer() -> None:
    count(JOBS_ENQUEUED, queue="parent", version="v")
    proc = multiprocessing.get_context("fork").Process(target=_child_flush)
    proc.start()
    proc.join(30)
    assert proc.exitcode == 0  # the parent's increment is not the child's to flush
    assert flush()
    assert _series(JOBS_ENQUEUED.name) == {(("queue", "parent"), ("version", "v")): 1.0}


class _Run:
    queue = "sync"
    version = "0123456789abcdef"
    fingerprint = ""
    error = ""
    started_at = None
    finished_at = None


@pytest.mark.django_db(transaction=True)
def test_run_events_count_only_when_the_transaction_commits() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        counters.record_run_event("job.queued", _Run())
        raise RuntimeError("rolled back")
    with transaction.atomic():
        counters.record_run_event("job.queued", _Run())
    assert flush()
    assert _series(JOBS_ENQUEUED.name) == {(("queue", "sync"), ("version", "0123456789ab")): 1.0}


def test_a_detached_flusher_ends_without_flushing_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(counters, "FLUSH_INTERVAL", 0.05)
    count(JOBS_ENQUEUED, queue="sync", version="v1")  # starts the flusher thread
    thread = counters._buffer.flusher
    assert thread is not None and thread.is_alive()
    counters.stop_flushing()
    thread.join(timeout=10)
    assert not thread.is_alive()
    count(JOBS_ENQUEUED, queue="sync", version="v1")  # a later record starts a new one
    later = counters._buffer.flusher
    assert later not in (None, thread)
    # The new flusher must not outlive the test: 0.05 s on, it would write "v1" into the
    # Redis the next test has just emptied (that test then saw a series it never counted).
    counters.stop_flushing()
    later.join(timeout=10)
    assert not later.is_alive()


def test_a_whole_increment_to_a_fractional_series_is_flushed() -> None:
    # A seconds counter holds fractions in the hash; an increment that happens to be a
    # whole number (0.0, 1.0) once went out as HINCRBY, which Redis refuses on a float
    # ("hash value is not an integer"), and the whole flush was retried forever.
    count(MASTER_SECONDS, 0.25, master="m1")
    assert flush()
    count(MASTER_SECONDS, 1.0, master="m1")
    count(JOBS_ENQUEUED, queue="sync", version="abc")
    assert flush()
    assert _series(MASTER_SECONDS.name) == {(("master", "m1"),): 1.25}
    assert _series(JOBS_ENQUEUED.name) == {(("queue", "sync"), ("version", "abc")): 1.0}


def test_two_redlocks_over_the_same_masters_each_count_their_own_calls(
    redis_nodes: list[RedisNode],
) -> None:
    """Per-master calls are deltas of each Redlock's running totals: two Redlocks over
    the same masters (two configurations in one process) once shared one record per
    master name, so each flush counted one's totals against the other's — increments
    that cancelled out (0.0 series of idle masters) or went negative."""
    from dashboard.observability.counters import MASTER_CALLS
    from workers.locks import Redlock

    urls = [n.url for n in redis_nodes]
    busy, idle = Redlock(urls, node_timeout=0.5), Redlock(urls, node_timeout=0.5)
    counters.watch_redlock(busy)
    counters.watch_redlock(idle)
    for i in range(3):
        busy.acquire(f"telemetry-{i}", ttl=5.0).release()
    assert flush()
    made = {n.name.rsplit("/", 1)[0]: n.stats.calls for n in busy.nodes}
    assert all(made.values()) and not any(n.stats.calls for n in idle.nodes)
    calls = {dict(labels)["master"]: v for labels, v in _series(MASTER_CALLS.name).items()}
    assert calls == {m: float(c) for m, c in made.items()}
    assert flush()  # nothing happened since: nothing more is counted
    again = {dict(labels)["master"]: v for labels, v in _series(MASTER_CALLS.name).items()}
    assert again == calls
    assert all(v > 0 for v in _series(MASTER_SECONDS.name).values())
