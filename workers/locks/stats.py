"""Counters and latencies of one Redlock (``Redlock.stats()``), and the observer interface
through which an application exports them (``Metrics.observe``).

The core imports no metrics library: ``dashboard.observability.counters`` plugs a
``MetricsObserver``
in that feeds its Prometheus counters. Observers are called on whatever thread counted —
the caller's, a pool thread, the heartbeat thread — so they must be quick and must not do
I/O (the heartbeat never waits on anything but the masters); buffering in memory and
flushing elsewhere is the intended shape.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Protocol

from workers.locks.transport import Transport

COUNTERS = (
    "acquire_attempts",
    "acquired",
    "acquire_failures",
    "refused",
    "extensions",
    "extension_rounds",
    "extension_failures",
    "losses",
    "releases",
    "callbacks_dropped",
)


log = logging.getLogger("workers.locks")


class MetricsObserver(Protocol):
    """Told every counter increment and every acquire latency, as they happen."""

    def counted(self, name: str, n: int) -> None:
        """``name`` is one of ``COUNTERS`` (or ``forced_releases``), ``n`` ≥ 0."""

    def acquired(self, took: float) -> None:
        """A lock was acquired ``took`` seconds after ``acquire`` was called (all
        attempts and the fencing token included)."""


@dataclass
class _Stats:
    counters: dict[str, int] = field(default_factory=dict)
    acquire_latencies: list[float] = field(default_factory=list)
    acquire_latency_total: float = 0.0
    acquire_latency_max: float = 0.0


class Metrics:
    """Thread-safe counters and a bounded sample of acquire latencies."""

    LATENCY_SAMPLES = 2048

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stats = _Stats()
        self._observers: list[MetricsObserver] = []
        # A fork may happen while another thread holds the lock: the child gets a new one.
        os.register_at_fork(after_in_child=self._reset_lock)

    def _reset_lock(self) -> None:
        self._lock = threading.Lock()

    def observe(self, observer: MetricsObserver) -> None:
        """Tell ``observer`` every later increment and acquire latency (idempotent)."""
        with self._lock:
            if observer not in self._observers:
                self._observers.append(observer)

    def count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._stats.counters[name] = self._stats.counters.get(name, 0) + n
            observers = list(self._observers)
        for observer in observers:  # outside the lock: an observer never blocks counting
            try:
                observer.counted(name, n)
            except Exception:  # an exporter's bug must not break a lock operation
                log.exception("redlock: metrics observer failed")

    def record_acquired(self, took: float) -> None:
        with self._lock:
            st = self._stats
            st.counters["acquired"] = st.counters.get("acquired", 0) + 1
            st.acquire_latency_total += took
            st.acquire_latency_max = max(st.acquire_latency_max, took)
            st.acquire_latencies.append(took)
            if len(st.acquire_latencies) > self.LATENCY_SAMPLES:
                del st.acquire_latencies[: self.LATENCY_SAMPLES // 2]
            observers = list(self._observers)
        for observer in observers:
            try:
                observer.counted("acquired", 1)
                observer.acquired(took)
            except Exception:
                log.exception("redlock: metrics observer failed")

    def snapshot(self, transport: Transport) -> dict[str, Any]:
        """Counters (attempts, acquired, refused votes, failures, extensions and their
        rounds, losses, releases, dropped callbacks), acquire latency (count/mean/p50/p99/max
        seconds) and per-master calls, errors, timeouts and latency."""
        with self._lock:
            st = self._stats
            samples = sorted(st.acquire_latencies)
            n = st.counters.get("acquired", 0)
            latency = {
                "count": n,
                "mean": st.acquire_latency_total / n if n else 0.0,
                "p50": samples[len(samples) // 2] if samples else 0.0,
                "p99": samples[min(len(samples) - 1, int(len(samples) * 0.99))] if samples else 0.0,
                "max": st.acquire_latency_max,
            }
            counters = {name: st.counters.get(name, 0) for name in COUNTERS}
        with transport.stats_lock:
            nodes = {
                node.name: {
                    "calls": node.stats.calls,
                    "errors": node.stats.errors,
                    "timeouts": node.stats.timeouts,
                    "latency_mean": (
                        node.stats.latency_total / node.stats.calls if node.stats.calls else 0.0
                    ),
                    "latency_max": node.stats.latency_max,
                }
                for node in transport.nodes
            }
        return {**counters, "acquire_latency": latency, "nodes": nodes}
