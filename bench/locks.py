"""Benchmark: acquire+release pairs per second, gitward Redlock vs pottery vs single-node SET NX.

Starts three local redis-server processes (temporary directories), then runs several
interleaved rounds of sequential, contention-free acquire+release pairs on one key:

  ours        gitward ``Redlock`` over the 3 masters (no token source)
  ours-3keys  the same, locking 3 keys at once (one Lua script per master)
  pottery     pottery 3.0.1 ``Redlock`` over the same 3 masters (one object reused)
  baseline    one master: ``SET key v NX PX ttl`` + compare-and-delete Lua (EVALSHA)

Prints medians over the rounds and the ratios, and the client's own CPU per pair (process
time: on a shared machine wall time is mostly waiting for a CPU). Then, on the same masters
(``bench/lockload.py``): contention — 8 threads on 1 key and on 64 keys, ours vs pottery:
throughput, p50/p99 acquire latency, per-thread acquisitions (fairness) — and the per-job
lock cost (acquire + fencing token + heartbeats + release) as a share of a 1,000-commit
chunk's git + parse time. Not a test: nothing is asserted.

    .venv/bin/python bench/locks.py [--pairs 500] [--rounds 7] [--seconds 4] [--skip-load]
"""

from __future__ import annotations

import argparse
import os
import platform
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import lockload
from workers.locks import Redlock
from workers.runtime.redis_server import RedisNode

TTL = 10.0
KEY = "locks:bench:one"

_CAS_DELETE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def run_pairs(pair: Callable[[], None], pairs: int) -> tuple[float, float]:
    """Wall and process-CPU seconds for ``pairs`` sequential acquire+release pairs."""
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(pairs):
        pair()
    return time.perf_counter() - start, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--pairs", type=int, default=500, help="pairs per round and variant")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument(
        "--node-timeout",
        type=float,
        default=0.5,
        help="ours: per-master timeout (s); the 50 ms default times out on a loaded machine",
    )
    parser.add_argument("--seconds", type=float, default=4.0, help="per contention scenario")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--hold", type=float, default=0.002, help="contention: s held")
    parser.add_argument("--think", type=float, default=0.002, help="contention: s between")
    parser.add_argument("--chunk-commits", type=int, default=1000)
    parser.add_argument("--skip-load", action="store_true", help="only the sequential pairs")
    args = parser.parse_args()

    from pottery import Redlock as PotteryRedlock  # type: ignore[import-untyped]

    with tempfile.TemporaryDirectory(prefix="gitward-bench-") as tmp:
        nodes = [RedisNode(Path(tmp) / f"m{i}").start() for i in range(3)]
        try:
            urls = [n.url for n in nodes]
            ours = Redlock(urls, retry_count=0, node_timeout=args.node_timeout)
            masters = {redis.Redis(host=n.host, port=n.port) for n in nodes}
            pottery = PotteryRedlock(key=KEY, masters=masters, auto_release_time=TTL)
            single = nodes[0].client()
            cas_delete = single.register_script(_CAS_DELETE)
            ttl_ms = int(TTL * 1000)

            def ours_pair() -> None:
                ours.acquire(KEY, ttl=TTL).release()

            def ours_3keys_pair() -> None:
                ours.acquire([KEY, KEY + ":b", KEY + ":c"], ttl=TTL).release()

            def pottery_pair() -> None:
                if not pottery.acquire(blocking=False):
                    raise RuntimeError("pottery failed to acquire a free lock")
                pottery.release()

            def baseline_pair() -> None:
                value = secrets.token_hex(16)
                if not single.set(KEY, value, nx=True, px=ttl_ms):
                    raise RuntimeError("baseline failed to acquire a free lock")
                cas_delete(keys=[KEY], args=[value])

            variants: dict[str, Callable[[], None]] = {
                "ours": ours_pair,
                "ours-3keys": ours_3keys_pair,
                "pottery": pottery_pair,
                "baseline": baseline_pair,
            }
            for pair in variants.values():  # warm up connections and script caches
                run_pairs(pair, 20)
            times: dict[str, list[float]] = {name: [] for name in variants}
            cpus: dict[str, list[float]] = {name: [] for name in variants}
            for _ in range(args.rounds):
                for name, pair in variants.items():
                    wall, cpu = run_pairs(pair, args.pairs)
                    times[name].append(wall / args.pairs)
                    cpus[name].append(cpu / args.pairs)

            print(
                f"redis {single.info()['redis_version']}, Python {platform.python_version()}, "
                f"{os.cpu_count()} CPUs, 3 local masters, TTL {TTL:g} s, "
                f"{args.rounds} rounds x {args.pairs} sequential pairs on 1 key (no contention)"
            )
            print(
                f"{'variant':<12} {'pairs/s':>10} {'us/pair':>10} {'min us':>9} {'max us':>9} "
                f"{'CPU us':>8}"
            )
            med = {name: statistics.median(t) for name, t in times.items()}
            cpu_med = {name: statistics.median(t) for name, t in cpus.items()}
            for name, t in times.items():
                print(
                    f"{name:<12} {1 / med[name]:>10.0f} {med[name] * 1e6:>10.0f} "
                    f"{min(t) * 1e6:>9.0f} {max(t) * 1e6:>9.0f} {cpu_med[name] * 1e6:>8.0f}"
                )
            print(f"ours/pottery throughput: {med['pottery'] / med['ours']:.2f}x")
            print(f"ours/baseline time per pair: {med['ours'] / med['baseline']:.2f}x")
            print(
                f"ours/baseline client CPU per pair: {cpu_med['ours'] / cpu_med['baseline']:.2f}x"
                f", pottery/ours: {cpu_med['pottery'] / cpu_med['ours']:.2f}x"
            )
            lat = ours.stats()["acquire_latency"]
            print(
                f"ours acquire latency (last {lat['count']} acquisitions, us): "
                f"p50 {lat['p50'] * 1e6:.0f}, p99 {lat['p99'] * 1e6:.0f}, "
                f"max {lat['max'] * 1e6:.0f}"
            )
            ours.close()
            if not args.skip_load:
                run_load(args, urls, masters, Path(tmp))
        finally:
            for node in nodes:
                node.kill()


def run_load(
    args: argparse.Namespace, urls: list[str], masters: set[redis.Redis], tmp: Path
) -> None:
    """Contention (ours vs pottery, same masters) and the per-job lock cost."""
    ttl = 10.0
    rl = Redlock(
        urls,
        retry_count=100_000,  # blocking, as pottery's acquire(blocking=True)
        retry_delay=0.1,
        retry_jitter=0.1,  # uniform(0, 0.2) s: pottery's retry policy
        node_timeout=args.node_timeout,
    )
    print(
        f"contention: {args.threads} threads x {args.seconds:g} s, hold {args.hold * 1e3:g} ms, "
        f"think {args.think * 1e3:g} ms, retry after uniform(0, 0.2) s, TTL {ttl:g} s"
    )
    rows = []
    for scenario, keys in (
        ("1 key", ["locks:bench:hot"]),
        ("64 keys", [f"locks:bench:k{n}" for n in range(64)]),
    ):
        for client, acquirer in (
            ("ours", lockload.ours_acquirer(rl, ttl)),
            ("pottery", lockload.pottery_acquirer(masters, ttl, wait=args.seconds + 30)),
        ):
            r = lockload.run_contention(
                acquirer,
                keys,
                threads=args.threads,
                seconds=args.seconds,
                hold=args.hold,
                think=args.think,
            )
            rows.append((scenario, client, r))
    lockload.print_contention(rows, args.threads)
    rl.close()
    job = Redlock(urls, node_timeout=args.node_timeout)
    cost = lockload.job_lock_cost(job, tmp, ttl=30.0, jobs=200)
    job.close()
    chunk = lockload.chunk_seconds(tmp, args.chunk_commits, runs=3)
    lockload.print_job_cost(cost, chunk, ttl=30.0, commits=args.chunk_commits)


if __name__ == "__main__":
    main()
