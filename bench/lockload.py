"""The contention and per-job parts of ``bench/locks.py`` (imported by it, not run alone).

Contention: ``threads`` threads loop for ``seconds``: blocking acquire (timed from the call
to the return, retries included), hold ``hold`` seconds, release, pause ``think`` seconds.
On one key, or on a key drawn at random from 64 for every acquisition. Ours is one shared
``Redlock`` (as one per worker process in production); pottery one ``Redlock`` object per
thread and key (its objects carry the held value, so they are not shared). Both retry after
``uniform(0, 0.2)`` s — pottery's fixed policy, and ours set to the same
(``retry_delay=0.1, retry_jitter=0.1``).

Per job: what a chunk job does with its lease — acquire with a fencing token (a database
counter incremented in a transaction that confirms the token on a quorum: a SQLite file
here, the shape of ``dashboard.locks.fencing.next_token``), the heartbeat's extensions at TTL/3
over the chunk's time, release — against the time git + the parser take for a 1,000-commit
chunk of the synthetic history (the database write comes on top in a real chunk, so the
share printed is an upper bound).
"""

from __future__ import annotations

import math
import random
import sqlite3
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import redis

from workers.analysis.history import stream_commits
from workers.locks import Redlock

Acquire = Callable[[str], Callable[[], None]]  # key -> release


def run_contention(
    acquire_for_thread: Callable[[], Acquire],
    keys: Sequence[str],
    *,
    threads: int,
    seconds: float,
    hold: float,
    think: float,
) -> dict[str, Any]:
    """Run the loop on ``threads`` threads; throughput, latency percentiles, per-thread
    counts."""
    stop = threading.Event()
    counts = [0] * threads
    latencies: list[list[float]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []
    start_gate = threading.Barrier(threads + 1)

    def worker(n: int) -> None:
        acquire = acquire_for_thread()
        rng = random.Random(n)
        start_gate.wait()
        try:
            while not stop.is_set():
                key = keys[0] if len(keys) == 1 else rng.choice(keys)
                t0 = time.perf_counter()
                release = acquire(key)
                latencies[n].append(time.perf_counter() - t0)
                counts[n] += 1
                if hold:
                    time.sleep(hold)
                release()
                if think:
                    time.sleep(think)
        except BaseException as exc:
            errors.append(exc)

    pool = [threading.Thread(target=worker, args=(n,), daemon=True) for n in range(threads)]
    for t in pool:
        t.start()
    start_gate.wait()
    began = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for t in pool:
        t.join(seconds + 60)
    took = time.perf_counter() - began
    if errors:
        raise RuntimeError(f"contention worker failed: {errors[0]!r}") from errors[0]
    lat = sorted(x for per in latencies for x in per)
    total = sum(counts)
    mean = total / threads
    jain = total**2 / (threads * sum(c * c for c in counts)) if total else 0.0
    return {
        "throughput": total / took,
        "p50": lat[len(lat) // 2] if lat else math.nan,
        "p99": lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else math.nan,
        "counts": counts,
        "min_share": min(counts) / mean if mean else 0.0,
        "jain": jain,
    }


def ours_acquirer(rl: Redlock, ttl: float) -> Callable[[], Acquire]:
    def for_thread() -> Acquire:
        def acquire(key: str) -> Callable[[], None]:
            return rl.acquire(key, ttl=ttl).release

        return acquire

    return for_thread


def pottery_acquirer(masters: set[redis.Redis], ttl: float, wait: float) -> Callable[[], Acquire]:
    from pottery import Redlock as PotteryRedlock  # type: ignore[import-untyped]  # bench extra

    def for_thread() -> Acquire:
        locks: dict[str, Any] = {}

        def acquire(key: str) -> Callable[[], None]:
            lock = locks.get(key)
            if lock is None:
                lock = locks[key] = PotteryRedlock(key=key, masters=masters, auto_release_time=ttl)
            if not lock.acquire(blocking=True, timeout=wait):
                raise RuntimeError(f"pottery: no lock on {key} in {wait} s")
            return lock.release  # type: ignore[no-any-return]

        return acquire

    return for_thread


def print_contention(rows: list[tuple[str, str, dict[str, Any]]], threads: int) -> None:
    print(
        f"{'scenario':<16} {'client':<8} {'acq/s':>7} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'min/mean':>9} {'Jain':>5}  per-thread acquisitions ({threads} threads)"
    )
    for scenario, client, r in rows:
        print(
            f"{scenario:<16} {client:<8} {r['throughput']:>7.0f} {r['p50'] * 1e3:>8.2f} "
            f"{r['p99'] * 1e3:>8.2f} {r['min_share']:>9.2f} {r['jain']:>5.2f}  {r['counts']}"
        )


# Per job ---------------------------------------------------------------------------------


class SqliteCounter:
    """A fencing-token source: one row per resource, incremented in a transaction that
    calls ``confirm`` before its COMMIT — ``dashboard.locks.fencing.next_token``'s shape on the
    settings' SQLite connection (kept open, WAL, ``synchronous=NORMAL``, IMMEDIATE)."""

    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(str(path), timeout=30, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.execute("CREATE TABLE IF NOT EXISTS fence (resource TEXT PRIMARY KEY, token INT)")

    def __call__(self, resource: str, confirm: Callable[[int], None]) -> int:
        c = self.conn
        c.execute("BEGIN IMMEDIATE")
        try:
            c.execute("INSERT OR IGNORE INTO fence VALUES (?, 0)", (resource,))
            c.execute("UPDATE fence SET token = token + 1 WHERE resource = ?", (resource,))
            row = c.execute("SELECT token FROM fence WHERE resource = ?", (resource,)).fetchone()
            confirm(int(row[0]))
        except BaseException:
            c.execute("ROLLBACK")
            raise
        c.execute("COMMIT")
        return int(row[0])

    def close(self) -> None:
        self.conn.close()


def chunk_seconds(tmp: Path, commits: int, runs: int) -> float:
    """Median seconds git + gitward's parser take for ``commits`` commits of the synthetic
    history (``workers.analysis.history.stream_commits``, the analysis a chunk job runs)."""
    from bench.analysis import build_repository  # heavy (psycopg, …): only this part needs it

    repo = tmp / "chunk-repo"
    build_repository(repo, commits, seed=1)
    shas = subprocess.run(
        ["git", "-C", str(repo), "rev-list", "--reverse", "HEAD"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()[:commits]
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        n = sum(1 for _ in stream_commits(repo / ".git", shas))
        times.append(time.perf_counter() - t0)
        assert n == len(shas)
    return statistics.median(times)


def job_lock_cost(rl: Redlock, tmp: Path, *, ttl: float, jobs: int) -> dict[str, float]:
    """Median seconds of acquire-with-token, one extension and release on a chunk key."""
    counter = SqliteCounter(tmp / "fence.sqlite3")
    rl.token_source = counter
    acquire, extend, release = [], [], []
    try:
        for n in range(jobs):
            key = f"locks:bench:chunk:{n % 16}"
            t0 = time.perf_counter()
            lock = rl.acquire(key, ttl=ttl)
            t1 = time.perf_counter()
            lock.extend()
            t2 = time.perf_counter()
            lock.release()
            t3 = time.perf_counter()
            acquire.append(t1 - t0)
            extend.append(t2 - t1)
            release.append(t3 - t2)
    finally:
        rl.token_source = None
        counter.close()
    return {
        "acquire": statistics.median(acquire),
        "extend": statistics.median(extend),
        "release": statistics.median(release),
    }


def print_job_cost(cost: dict[str, float], chunk: float, *, ttl: float, commits: int) -> None:
    beats = math.ceil(chunk / (ttl / 3))  # the heartbeat extends at TTL/3 (at least once)
    total = cost["acquire"] + beats * cost["extend"] + cost["release"]
    print(
        f"per job: acquire + fencing token {cost['acquire'] * 1e3:.2f} ms, extension "
        f"{cost['extend'] * 1e3:.2f} ms x {beats} (TTL {ttl:g} s), release "
        f"{cost['release'] * 1e3:.2f} ms = {total * 1e3:.2f} ms; git + parse of a "
        f"{commits:,}-commit chunk {chunk * 1e3:.0f} ms; lock share {total / chunk:.2%}"
    )
