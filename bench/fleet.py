"""Benchmark: small repositories' time to ready while a large history is analysed, with
fair scheduling and as plain FIFO (docs/scheduling.md).

Anchor: each small repository's time to ready when it is submitted alone, on the same
idle system (the ``solo`` figures). Goal: the fleet's p95 at most 1.5 × the solo p95.
A second anchor, mode ``nolarge``: the same small histories submitted together without
the large one, so what the large backlog costs them is told apart from what sharing the
workers among themselves does (N histories submitted at once cannot each be as fast as
one alone on the same workers).

One run per mode, each in a child process of its own (a fresh temporary var dir, SQLite,
3 local redis-server nodes): the large history (``--large`` commits, a synthetic
``git fast-import`` history from ``bench/analysis.py``) is submitted first, then
``--small`` histories of ``--small-commits`` commits each, at once; a pool of
``--workers`` forking RQ workers (``manage.py worker --workers N``) analyses them, the
bench process runs the reconciler every 2 s as ``up`` would. Time to ready is the
repository's ``analyzed_at`` minus the moment the fleet was submitted. Then ``--solo``
more small histories of the same shape are submitted one at a time on the idle system.
Chunks are small (``--chunk-size``, fixed targets) so the large history is a long backlog.

    .venv/bin/python bench/fleet.py                       # defaults: a few minutes on 2 cores
    .venv/bin/python bench/fleet.py --large 200000 --small 200 --small-commits 40 \\
        --chunk-size 1000                                 # the goal case (long)

Defaults (``--large 4000 --small 20 --small-commits 40 --chunk-size 10``: 400 large
chunks, 4 per small history) keep a run to a few minutes on 2 shared cores. Prints the
machine's ``uptime`` first: figures from a loaded machine are noisier. Not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--large", type=int, default=4000, help="commits of the large history")
    parser.add_argument("--small", type=int, default=20, help="small histories in the fleet")
    parser.add_argument("--small-commits", type=int, default=40)
    parser.add_argument("--solo", type=int, default=5, help="small histories timed alone")
    parser.add_argument("--chunk-size", type=int, default=10, help="GITWARD_CHUNK_SIZE (fixed)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--weight", type=int, default=1, help="GITWARD_FAIR_WEIGHT when fair")
    parser.add_argument(
        "--modes", default="fair,fifo,nolarge", help="comma-separated: fair, fifo, nolarge"
    )
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_mode(args)))
        return
    print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    print(
        f"fleet: large={args.large} commits, small={args.small}×{args.small_commits} commits, "
        f"chunk size {args.chunk_size}, workers={args.workers}, weight={args.weight}"
    )
    results = {}
    for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
        cmd = [sys.executable, __file__, *sys.argv[1:], "--child", mode]
        out = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            print(out.stderr[-3000:])
            raise SystemExit(f"mode {mode} failed")
        results[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    base = results.get("nolarge")
    print(f"{'mode':8} {'small p50':>10} {'small p95':>10} {'solo p50':>9} {'solo p95':>9} "
          f"{'p95/solo':>9} {'p95/no-large':>13} {'large done':>11}")  # fmt: skip
    for mode, r in results.items():
        vs_base = f"{r['p95'] / base['p95']:>12.2f}×" if base else f"{'—':>13}"
        print(f"{mode:8} {r['p50']:>9.1f}s {r['p95']:>9.1f}s {r['solo_p50']:>8.1f}s "
              f"{r['solo_p95']:>8.1f}s {r['p95'] / r['solo_p95']:>8.2f}× {vs_base} "
              f"{r['large']:>10.1f}s")  # fmt: skip
    print(
        "goal: small p95 ≤ 1.5 × solo p95 (fair). nolarge: the same small histories "
        "submitted together without the large one (what sharing the workers among "
        "themselves costs them)"
    )
    print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


def run_mode(args: Any) -> dict[str, Any]:
    from workers.runtime.redis_server import RedisNode

    tmp = Path(tempfile.mkdtemp(prefix=f"gw-bench-fleet-{args.child}-"))
    var = tmp / "var"
    var.mkdir()
    nodes = [RedisNode(tmp / f"redis{i}", persistent=False).start() for i in range(3)]
    pool = None
    try:
        for key in [k for k in os.environ if k.startswith(("REDIS_URL", "GITWARD_", "DATABASE_"))]:
            del os.environ[key]
        os.environ.update(
            GITWARD_VAR_DIR=str(var),
            DATABASE_URL=f"sqlite:///{var / 'db.sqlite3'}",
            GITWARD_WORKSPACE=str(var / "workspace"),
            GITWARD_LOCAL_ROOTS=str(tmp),
            REDIS_URLS=",".join(n.url for n in nodes),
            GITWARD_RETRY_BACKOFF="0",
            GITWARD_CHUNK_SIZE=str(args.chunk_size),
            GITWARD_CHUNK_MAX=str(args.chunk_size),
            GITWARD_FAIR_WEIGHT=str(0 if args.child == "fifo" else args.weight),
            DJANGO_SETTINGS_MODULE="dashboard.settings",
        )
        import django

        django.setup()
        from django.core.management import call_command

        from bench.analysis import build_repository

        call_command("migrate", verbosity=0)
        large = tmp / "large"
        build_repository(large, args.large, seed=1)
        smalls = []
        for i in range(args.small + args.solo):
            path = tmp / f"small{i}"
            build_repository(path, args.small_commits, seed=100 + i, repack=False)
            smalls.append(path)
        pool = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "worker", "--workers", str(args.workers)],
            env=os.environ.copy(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        return measure(args, large, smalls[: args.small], smalls[args.small :])
    finally:
        if pool is not None:
            pool.terminate()
            try:
                pool.wait(timeout=90)
            except subprocess.TimeoutExpired:
                pool.kill()
                pool.wait()
        for n in nodes:
            n.kill()


def measure(args: Any, large: Path, fleet: list[Path], solo: list[Path]) -> dict[str, Any]:
    from dashboard.models import Repository
    from dashboard.operations.reconciler import reconcile
    from dashboard.repositories.lifecycle import submit_repository

    def wait_ready(ids: list[int], start: float) -> dict[int, float]:
        done: dict[int, float] = {}
        last = 0.0
        while len(done) < len(ids):
            if time.monotonic() - start > args.timeout:
                raise SystemExit("timed out")
            if time.monotonic() - last > 2:
                reconcile()
                last = time.monotonic()
            for repo in Repository.objects.filter(pk__in=ids).exclude(pk__in=list(done)):
                if repo.status == Repository.Status.READY:
                    done[repo.pk] = time.monotonic() - start
                elif repo.status == Repository.Status.FAILED:
                    raise SystemExit(f"{repo.name} failed: {repo.error}")
            time.sleep(0.2)
        return done

    start = time.monotonic()
    big = [] if args.child == "nolarge" else [submit_repository(url=str(large))[0].pk]
    small_ids = [submit_repository(url=str(p))[0].pk for p in fleet]
    ready = wait_ready([*big, *small_ids], start)
    small_times = [ready[pk] for pk in small_ids]
    solo_times = []
    for path in solo:
        t0 = time.monotonic()
        pk = submit_repository(url=str(path))[0].pk
        solo_times.append(wait_ready([pk], t0)[pk])
    return {
        "p50": statistics.median(small_times),
        "p95": pct(small_times, 0.95),
        "solo_p50": statistics.median(solo_times),
        "solo_p95": pct(solo_times, 0.95),
        "large": ready[big[0]] if big else float("nan"),
    }


if __name__ == "__main__":
    main()
