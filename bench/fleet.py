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

**The done-when as stated** ("beside a running 200,000-commit backfill, small
repositories submitted afterwards are ready within 1.5× of their solo time", p95): the
modes ``beside`` (the reserved interactive slot on, ``GITWARD_INTERACTIVE_WORKERS=1``)
and ``beside0`` (off), production chunk settings (``GITWARD_CHUNK_SIZE`` /
``GITWARD_CHUNK_MAX`` left at their defaults; ``--chunk-size`` is ignored). First
``--solo`` small histories are timed one at a time on the idle system (after one warm-up
submission, not counted); then the large history is submitted and, once its chunks are
being analysed, ``--small`` histories are submitted beside it ``--at-once`` at a time
(default 1: one after another; each batch once the one before is ready), each timed from
its submission to ready. A small history counts only if the large one was still analysing
when its batch was ready; once the large one is ready the rest are not submitted (the
table's ``beside`` column says how many counted)::

    .venv/bin/python bench/fleet.py --modes beside,beside0 --large 200000 --small 200 \
        --small-commits 40 --solo 10 --histories /tmp/fleet-histories     # the exact case

Where the time went, per small history, from its runs' rows: ``wait`` (submission to its
first run's claim: no worker free, or the slot not looking yet), ``work`` (to its last
run's end: the sync, its inline chunk and any other chunk) and ``tail`` (to ready as the
bench saw it), and how many ran entirely on the reserved slot; then, from its attempts'
traces, each span's median seconds alone and beside (which phase grows). ``--json FILE``
keeps every small history's figures.

``--histories DIR`` builds the histories once and reuses them; ``--postgres URL`` gives
each mode a fresh PostgreSQL database there; ``--nice N`` sets ``GITWARD_BULK_NICE``
(default: left to the production default, 10).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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
        "--modes",
        default="fair,fifo,nolarge",
        help="comma-separated: fair, fifo, nolarge, beside, beside0",
    )
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument(
        "--nice",
        type=int,
        default=None,
        help="GITWARD_BULK_NICE of the pool (default: the production default, 10; "
        "0: regular work horses keep full priority)",
    )
    parser.add_argument(
        "--write-yield",
        type=float,
        default=None,
        help="GITWARD_BULK_WRITE_YIELD of the pool (default: the production default; "
        "0: bulk chunks never hold their write back for express work)",
    )
    parser.add_argument(
        "--write-slice",
        type=int,
        default=None,
        help="GITWARD_SQLITE_WRITE_SLICE of the pool (default: the production default; "
        "a very large number: every chunk in one write transaction, as before slices)",
    )
    parser.add_argument(
        "--postgres",
        default="",
        help="a PostgreSQL server URL (postgres://user@host:port): each mode gets a fresh "
        "database there instead of SQLite",
    )
    parser.add_argument(
        "--histories",
        default="",
        help="directory to keep the built histories in and reuse them from (beside modes)",
    )
    parser.add_argument(
        "--at-once",
        type=int,
        default=1,
        help="beside modes: small histories submitted together, each batch once the one "
        "before is ready (1: one after another; --small: all at once)",
    )
    parser.add_argument(
        "--json", default="", help="write every mode's figures (each small history's) here"
    )
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
        out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False)
        if out.returncode != 0:
            raise SystemExit(f"mode {mode} failed")
        results[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    beside = {m: r for m, r in results.items() if m.startswith("beside")}
    if beside:
        print(f"{'mode':8} {'slot':>5} {'beside':>8} {'beside p50':>11} {'beside p95':>11} "
              f"{'solo p50':>9} {'solo p95':>9} {'p95/solo':>9} {'large left':>11} "
              f"{'load':>10}")  # fmt: skip
        for mode, r in beside.items():
            print(f"{mode:8} {r['slot']:>5} {r['counted']:>4}/{r['submitted']:<3} "
                  f"{r['p50']:>10.2f}s {r['p95']:>10.2f}s "
                  f"{r['solo_p50']:>8.2f}s {r['solo_p95']:>8.2f}s "
                  f"{r['p95'] / r['solo_p95']:>8.2f}× {r['large_left']:>5}/{r['large_chunks']:<5} "
                  f"{r['load_start']:>4.1f}–{r['load_end']:<4.1f}")  # fmt: skip
        print(f"{'where the time went':28} {'wait p50/p95':>14} {'submit p50/p95':>14} "
              f"{'pickup p50/p95':>14} {'work p50/p95':>14} "
              f"{'tail p50/p95':>14} {'on the slot':>12} {'large writing':>14}")  # fmt: skip
        for mode, r in beside.items():
            for what, part, n in (("beside", r["beside_parts"], r["counted"]),
                                  ("solo", r["solo_parts"], len(r["solo"]))):  # fmt: skip
                print(f"{mode + ' ' + what:28} "
                      + " ".join(f"{part[k + '_p50']:>6.2f}/{part[k + '_p95']:<6.2f}s"
                                 for k in PARTS)
                      + f" {part['express']:>5} of {n:<4}"
                      + f" {part['slow_beside_write']:>5.2f}/"
                      + f"{part['fast_beside_write']:<5.2f}s")  # fmt: skip
        for mode, r in beside.items():
            print(f"{mode}: a small history's spans, median seconds solo → beside")
            for key, (alone, near) in r["spans"].items():
                print(f"  {key:34} {alone:7.3f} → {near:7.3f}  ({near - alone:+.3f})")
        print(
            "goal: beside p95 ≤ 1.5 × solo p95. beside: small histories ready while the "
            "large one was still analysing / submitted. large left: its chunks not yet "
            "analysed at the end. wait: submission to its first run's claim (submit: to "
            "its first run's row; pickup: from there); work: to its "
            "last run's end; tail: to ready as the bench saw it; large writing: seconds of "
            "its work during a large chunk's write phase, analysed to written, which "
            "includes its yield to express work (median of the slowest 5 % / of the "
            "fastest half)"
        )
    results = {m: r for m, r in results.items() if m not in beside}
    if not results:
        print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
        return
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
    db = ""
    try:
        for key in [k for k in os.environ if k.startswith(("REDIS_URL", "GITWARD_", "DATABASE_"))]:
            del os.environ[key]
        os.environ.update(
            GITWARD_VAR_DIR=str(var),
            DATABASE_URL=f"sqlite:///{var / 'db.sqlite3'}",
            GITWARD_WORKSPACE=str(var / "workspace"),
            GITWARD_LOCAL_ROOTS=",".join(
                [str(tmp), *([str(Path(args.histories).resolve())] if args.histories else [])]
            ),
            REDIS_URLS=",".join(n.url for n in nodes),
            GITWARD_RETRY_BACKOFF="0",
            GITWARD_FAIR_WEIGHT=str(0 if args.child == "fifo" else args.weight),
            DJANGO_SETTINGS_MODULE="dashboard.settings",
        )
        if args.nice is not None:
            os.environ["GITWARD_BULK_NICE"] = str(args.nice)
        if args.write_yield is not None:
            os.environ["GITWARD_BULK_WRITE_YIELD"] = str(args.write_yield)
        if args.write_slice is not None:
            os.environ["GITWARD_SQLITE_WRITE_SLICE"] = str(args.write_slice)
        if args.child.startswith("beside"):  # production chunks; the slot on or off
            os.environ["GITWARD_INTERACTIVE_WORKERS"] = "0" if args.child == "beside0" else "1"
        else:
            os.environ["GITWARD_CHUNK_SIZE"] = str(args.chunk_size)
            os.environ["GITWARD_CHUNK_MAX"] = str(args.chunk_size)
        if args.postgres:  # a fresh database of its own per mode
            import psycopg

            # a name of its own: two benches on one server never share a database
            db = f"gw_bench_fleet_{args.child}_{os.getpid()}"
            with psycopg.connect(args.postgres + "/postgres", autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{db}"')
                admin.execute(f'CREATE DATABASE "{db}"')
            os.environ["DATABASE_URL"] = f"{args.postgres}/{db}"
        import logging

        import django

        django.setup()
        from django.core.management import call_command

        from bench.analysis import build_repository

        logging.getLogger("dashboard").setLevel(logging.WARNING)  # progress only on stderr
        call_command("migrate", verbosity=0)
        where = Path(args.histories).resolve() if args.histories else tmp
        where.mkdir(parents=True, exist_ok=True)
        large = where / f"large-{args.large}"
        if not (large / "HEAD").exists() and not (large / ".git").exists():
            build_repository(large, args.large, seed=1)
        smalls = []
        for i in range(args.small + args.solo + 1):  # one more: the beside modes' warm-up
            path = where / f"small{i}-{args.small_commits}"
            if not (path / ".git").exists():
                build_repository(path, args.small_commits, seed=100 + i, repack=False)
            smalls.append(path)
        progress(f"{args.child}: histories ready")
        pool = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "worker", "--workers", str(args.workers)],
            env=os.environ.copy(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        if args.child.startswith("beside"):
            return measure_beside(args, large, smalls[: args.small], smalls[args.small :], pool.pid)
        solo = smalls[args.small : args.small + args.solo]
        return measure(args, large, smalls[: args.small], solo)
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
        if db:  # dropped: a 200,000-commit history's rows are gigabytes
            import psycopg
            from django.db import connections

            connections.close_all()
            with psycopg.connect(args.postgres + "/postgres", autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        # the SQLite database, mirrors and Redis files: about 0.5 GB a run
        shutil.rmtree(tmp, ignore_errors=True)


def progress(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


def wait_ready(args: Any, ids: list[int], start: float, *, poll: float = 0.05) -> dict[int, float]:
    """Seconds from ``start`` until each repository is ready (the reconciler every 2 s,
    as ``up`` runs it)."""
    from dashboard.models import Repository
    from dashboard.operations.reconciler import reconcile

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
        time.sleep(poll)
    return done


def submit_and_wait(
    args: Any, paths: list[Path], *, poll: float = 0.05
) -> list[tuple[float, int, float]]:
    """Submit ``paths`` together and wait until each is ready: per path, (seconds from
    the submission to ready, the repository's id, the submission's epoch time)."""
    from dashboard.repositories.lifecycle import submit_repository

    at, t0 = time.time(), time.monotonic()
    ids = [submit_repository(url=str(path))[0].pk for path in paths]
    ready = wait_ready(args, ids, t0, poll=poll)
    return [(ready[pk], pk, at) for pk in ids]


def express_workers(pool_pid: int) -> set[str]:
    """The RQ names (``host.pid``) of the pool's reserved-slot workers (``--express``)."""
    import socket

    names = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pool_pid and b"--express" in cmdline:
            names.add(f"{socket.gethostname()}.{proc.name}")
    return names


def timeline(pk: int, submitted: float, took: float, express: set[str]) -> dict[str, Any]:
    """Where one small history's time to ready went, from its runs' rows: ``wait`` from
    the submission to its first run's claim, ``work`` from there to its last run's end
    (the sync, its inline chunk, any other chunk and the waits between them), ``tail``
    from there to ready as the bench saw it; ``express``: every run on the reserved slot."""
    from dashboard.models import JobAttempt, JobRun

    rows = list(
        JobRun.objects.filter(repository_id=pk).values(
            "kind", "worker", "enqueued_at", "started_at", "finished_at"
        )
    )
    # its attempts' traces (dashboard/observability/traces.py): seconds per "kind span",
    # summed over the history's attempts, to tell which phase grows beside the backfill
    spans: dict[str, float] = {}
    for kind, trace in JobAttempt.objects.filter(run__repository_id=pk).values_list(
        "run__kind", "spans"
    ):
        for span in trace or []:
            if span.get("end") is not None:
                key = f"{kind} {span['name']}"
                spans[key] = round(spans.get(key, 0.0) + span["end"] - span["start"], 4)
    # a run may still be writing its end when the repository is ready (its row's
    # finished_at comes last): such a run counts as ending at ready
    first = min(r["started_at"].timestamp() for r in rows if r["started_at"])
    last = max(r["finished_at"].timestamp() if r["finished_at"] else submitted + took for r in rows)
    return {
        "pk": pk,
        "first": first,
        "last": last,
        "wait": round(first - submitted, 3),
        # the wait in two: the submission's own writes (to its first run's row), and from
        # there to the claim (the queue, the worker's fork, the claim's write)
        "submit": round(min(r["enqueued_at"].timestamp() for r in rows) - submitted, 3),
        "pickup": round(first - min(r["enqueued_at"].timestamp() for r in rows), 3),
        "work": round(last - first, 3),
        "tail": round(submitted + took - last, 3),
        "express": all(r["worker"] in express for r in rows),
        "runs": len(rows),
        "kinds": sorted(f"{r['kind']}:{'x' if r['worker'] in express else 'r'}" for r in rows),
        "spans": spans,
    }


#: The parts of a small history's time to ready (``timeline``), in the order printed.
PARTS = ("wait", "submit", "pickup", "work", "tail")


def loadavg() -> float:
    return os.getloadavg()[0]


def measure_beside(
    args: Any, large: Path, beside: list[Path], solo: list[Path], pool_pid: int
) -> dict[str, Any]:
    """The done-when as stated (module docstring, ``beside``): solo times on the idle
    system first, then the small histories submitted ``--at-once`` at a time beside the
    running backfill, until all are ready or the backfill is (then the rest are not
    submitted: they would no longer be beside it)."""
    from dashboard.models import JobRun, Repository
    from dashboard.repositories.lifecycle import submit_repository

    express: set[str] = set()

    def batch(paths: list[Path], what: str) -> list[dict[str, Any]]:
        out = []
        for took, pk, at in submit_and_wait(args, paths):
            out.append({"took": took, **timeline(pk, at, took, express)})
        took_all = ", ".join(f"{o['took']:.2f}" for o in out)
        progress(f"{args.child}: {what} {len(paths)} ready in {took_all}s (load {loadavg():.1f})")
        return out

    batch(solo[:1], "warm-up (not counted: the pool's workers start)")
    express |= express_workers(pool_pid)
    solo_rows = [row for p in solo[1:] for row in batch([p], "solo")]
    load_start = loadavg()
    t0 = time.monotonic()
    big = submit_repository(url=str(large))[0].pk
    chunks = JobRun.objects.filter(repository_id=big, kind=JobRun.Kind.ANALYZE)
    while not chunks.filter(state=JobRun.State.RUNNING).exists():  # its backfill has begun
        if time.monotonic() - t0 > args.timeout:
            raise SystemExit("the large history never started analysing")
        time.sleep(0.2)
    progress(f"{args.child}: large analysing after {time.monotonic() - t0:.1f}s")
    rows: list[dict[str, Any]] = []
    step = max(1, args.at_once)
    for i in range(0, len(beside), step):
        if Repository.objects.get(pk=big).status == Repository.Status.READY:
            progress(f"{args.child}: large ready: {len(beside) - i} small ones not submitted")
            break
        done = batch(beside[i : i + step], f"beside ({i + step}/{len(beside)})")
        still = Repository.objects.get(pk=big).status != Repository.Status.READY
        rows += [{**row, "beside": still} for row in done]
    analysed = chunks.filter(state=JobRun.State.SUCCEEDED).count()
    status = Repository.objects.get(pk=big).status
    progress(f"{args.child}: large {status}, {analysed}/{chunks.count()} chunks analysed")
    # the large history's write phases (a chunk's rows, one transaction: analysed_at →
    # written_at): how much of each small history's work ran while one was writing
    windows: list[list[float]] = []  # merged: two chunks writing at once count once
    for a, w in sorted(
        chunks.exclude(analysed_at=None)
        .exclude(written_at=None)
        .values_list("analysed_at", "written_at")
    ):
        if windows and a.timestamp() <= windows[-1][1]:
            windows[-1][1] = max(windows[-1][1], w.timestamp())
        else:
            windows.append([a.timestamp(), w.timestamp()])
    for row in rows:
        row["beside_write"] = round(
            sum(max(0.0, min(w, row["last"]) - max(a, row["first"])) for a, w in windows), 3
        )
    counted = [row for row in rows if row["beside"]]
    if not counted:
        raise SystemExit("the large history was ready before the first small one: raise --large")
    times = [row["took"] for row in counted]
    solo_times = [row["took"] for row in solo_rows]

    def parts(rows: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            **{f"{k}_p50": statistics.median(r[k] for r in rows) for k in PARTS},
            **{f"{k}_p95": pct([r[k] for r in rows], 0.95) for k in PARTS},
            # the slowest 5 %: how much of their work overlapped a large chunk's write
            "slow_beside_write": statistics.median(
                r.get("beside_write", 0.0)
                for r in sorted(rows, key=lambda r: r["took"])[-max(1, len(rows) // 20) :]
            ),
            "fast_beside_write": statistics.median(
                r.get("beside_write", 0.0)
                for r in sorted(rows, key=lambda r: r["took"])[: max(1, len(rows) // 2)]
            ),
            "express": sum(1 for r in rows if r["express"]),
        }

    return {
        "slot": 0 if args.child == "beside0" else 1,
        "p50": statistics.median(times),
        "p95": pct(times, 0.95),
        "solo_p50": statistics.median(solo_times),
        "solo_p95": pct(solo_times, 0.95),
        "counted": len(counted),
        "submitted": len(rows),
        "beside_parts": parts(counted),
        "solo_parts": parts(solo_rows),
        "times": [round(t, 2) for t in times],
        "solo": [round(t, 2) for t in solo_times],
        "spans": {
            key: (
                statistics.median(r["spans"].get(key, 0.0) for r in solo_rows),
                statistics.median(r["spans"].get(key, 0.0) for r in counted),
            )
            for key in sorted({k for r in solo_rows + counted for k in r["spans"]})
        },
        "large_left": chunks.exclude(state=JobRun.State.SUCCEEDED).count(),
        "large_chunks": chunks.count(),
        "load_start": load_start,
        "load_end": loadavg(),
        "rows": rows,
    }


def measure(args: Any, large: Path, fleet: list[Path], solo: list[Path]) -> dict[str, Any]:
    from dashboard.repositories.lifecycle import submit_repository

    start = time.monotonic()
    big = [] if args.child == "nolarge" else [submit_repository(url=str(large))[0].pk]
    small_ids = [submit_repository(url=str(p))[0].pk for p in fleet]
    ready = wait_ready(args, [*big, *small_ids], start, poll=0.2)
    small_times = [ready[pk] for pk in small_ids]
    solo_times = [submit_and_wait(args, [p], poll=0.2)[0][0] for p in solo]
    return {
        "p50": statistics.median(small_times),
        "p95": pct(small_times, 0.95),
        "solo_p50": statistics.median(solo_times),
        "solo_p95": pct(solo_times, 0.95),
        "large": ready[big[0]] if big else float("nan"),
    }


if __name__ == "__main__":
    main()
