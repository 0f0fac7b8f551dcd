"""Benchmark: live events fanned out to many websockets of one web process, the
anchor (another revision of this repository, by default the one before
``dashboard/live/fanout.py`` was added) and this tree side by side in one run. Not a test.

For each code tree: ``manage.py up --workers 0`` (that tree's code, this virtualenv;
its own temporary ``GITWARD_VAR_DIR``, SQLite, embedded Redis) serves ``--sockets``
websockets on ``/ws/ops/``, opened by this process (asyncio, ``websockets``) with one
logged-in session. A publisher subprocess (that tree's ``dashboard.infra.events.send_to_groups``,
as a worker publishes) sends ``--rate`` events/s for ``--seconds``: job progress of
``--keys`` runs in turn, so a 100 ms window coalesces some but not all. Figures:

* delay = arrival at the client - the event's ``at`` (one clock), p50/p95/p99, of each
  event's first arrival at each socket (``again``: events that came a second time, e.g.
  replayed after a snapshot);
* events delivered, and the web process's CPU seconds (``/proc``, user + system) per
  second of the window and per published event;
* Redis commands (``INFO``: ``total_commands_processed``) per published event;
* load-insensitive costs of the fan-out: the web process's CPU per websocket message
  (frame) delivered, per 1,000 events delivered, and per connected socket and second.
  CPU time is what a process spent, not how long it waited for a core, so these move
  far less with the machine's load than the delays do.

The clients offer permessage-deflate as browsers do (``--compression none``: as the
load test's ``websocket-client`` does, which offers no extension). ``--pad`` adds that
many bytes to each event (real events carry a holder, a repository name, …).
``--ask-snapshots``: each client also asks for a snapshot a second after events arrive,
at most once a second, as the live pages' script does. ``--py-spy FILE`` samples this
tree's web process (``--profile anchor``: the anchor's) during the window (``py-spy``,
the ``bench`` extra) and prints where its time went. ``--skip-anchor`` runs this tree only.

The machine load (``os.getloadavg``) is printed with each run.

    .venv/bin/python bench/fanout.py [--anchor REV] [--skip-anchor] [--sockets 200]
        [--rate 50] [--seconds 30] [--keys 40] [--pad 0] [--compression deflate|none]
        [--ask-snapshots] [--py-spy FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis
import requests
import websockets

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.live import pct  # noqa: E402
from tests.support.sysproc import wait_http  # noqa: E402
from workers.runtime.redis_server import free_port  # noqa: E402

PASSWORD = "fanout-pass-123456"
PUBLISHER = """
import sys, time
from dashboard.infra.events import OPS_GROUP, send_to_groups
rate, seconds, keys = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
pad = "x" * int(sys.argv[4])
start = time.monotonic()
n = 0
lags = []
while time.monotonic() - start < seconds:
    event = {"type": "job.progress", "at": round(time.time(), 3), "run": n % keys, "n": n}
    if pad:
        event["holder"] = pad
    send_to_groups([OPS_GROUP], {"type": "live.event", "event": event}, what="bench")
    lags.append(time.time() - event["at"])
    n += 1
    time.sleep(max(0.0, start + n / rate - time.monotonic()))
lags.sort()
print(lags[len(lags) // 2] * 1000, n)
"""


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def child_env(tree: Path, var: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITWARD_", "REDIS_URL"))}
    env.update(
        GITWARD_VAR_DIR=str(var),
        GITWARD_ADMIN_PASSWORD=PASSWORD,
        GITWARD_RATE_API_PER_MINUTE="0",
        # One web process, whose /proc CPU times are the fan-out's (``up`` starts two
        # per core by default, and the pid we hold would be their supervisor's).
        GITWARD_WEB_WORKERS="1",
        DATABASE_URL=f"sqlite:///{var / 'db.sqlite3'}",
        PYTHONPATH=str(tree),
        PYTHONUNBUFFERED="1",
    )
    return env


def log_in(base: str) -> str:
    client = requests.Session()
    client.get(f"{base}/login/", timeout=60)
    res = client.post(
        f"{base}/login/",
        data={"username": "admin", "password": PASSWORD,
              "csrfmiddlewaretoken": client.cookies.get("csrftoken", "")},
        headers={"Referer": f"{base}/login/"},
        allow_redirects=False,
        timeout=60,
    )  # fmt: skip
    if res.status_code != 302:
        raise RuntimeError(f"login refused: {res.status_code}")
    return "; ".join(f"{k}={v}" for k, v in client.cookies.items())


async def hold(url: str, cookie: str, base: str, delays: list[float], stop: asyncio.Event,
               opened: list[int], counts: dict[str, int],
               args: argparse.Namespace) -> None:  # fmt: skip
    """One browser's socket. With ``--ask-snapshots`` it asks for a snapshot a second
    after events arrive, at most once a second, as ``gitward.js`` does (``refreshSoon``:
    job events, among others, change aggregates that only snapshots carry)."""
    async with websockets.connect(
        url,
        additional_headers={"Cookie": cookie},
        origin=base,
        max_size=2**24,
        compression=None if args.compression == "none" else "deflate",  # type: ignore[arg-type]
    ) as ws:
        opened.append(1)
        ask_at = 0.0  # when the pending snapshot request is due (0: none pending)
        seen: set[int] = set()  # events counted: one sent again after a snapshot is not
        while not stop.is_set():
            wait = 0.5 if not ask_at else max(0.0, min(0.5, ask_at - time.monotonic()))
            try:
                raw = await asyncio.wait_for(ws.recv(), timeout=wait)
            except TimeoutError:
                raw = None
            if ask_at and time.monotonic() >= ask_at:
                ask_at = 0.0
                await ws.send('{"type": "snapshot"}')
                counts["asked"] += 1
            if raw is None:
                continue
            now = time.time()
            msg = json.loads(raw)
            if msg.get("type") == "events":
                counts["frames"] += 1
                for e in msg["events"]:
                    if "at" in e and e.get("n") not in seen:
                        seen.add(e.get("n"))
                        delays.append(now - float(e["at"]))
                    else:
                        counts["again"] += 1
                if args.ask_snapshots and not ask_at:
                    ask_at = time.monotonic() + 1.0
            elif msg.get("type") == "snapshot":
                counts["snapshots"] += 1


async def measure(base: str, args: argparse.Namespace, tree: Path, env: dict[str, str],
                  web_pid: int, redis_url: str, profile: bool) -> dict[str, Any]:  # fmt: skip
    cookie = log_in(base)
    url = base.replace("http://", "ws://") + "/ws/ops/"
    delays: list[float] = []
    stop = asyncio.Event()
    opened: list[int] = []
    counts = {"frames": 0, "snapshots": 0, "asked": 0, "again": 0}
    tasks = [
        asyncio.create_task(hold(url, cookie, base, delays, stop, opened, counts, args))
        for _ in range(args.sockets)
    ]
    async with asyncio.timeout(120):
        while len(opened) < args.sockets:
            await asyncio.sleep(0.1)
    await asyncio.sleep(2)  # the snapshots on connect are not measured
    delays.clear()
    counts.update(frames=0, snapshots=0, asked=0, again=0)
    node = redis.Redis.from_url(redis_url)
    commands = int(node.info("stats")["total_commands_processed"])
    cpu = cpu_seconds(web_pid)
    mine = resource.getrusage(resource.RUSAGE_SELF)
    started = time.monotonic()
    spy = await start_py_spy(web_pid, args) if profile else None
    publisher = await asyncio.create_subprocess_exec(
        sys.executable, "-c", f"import django; django.setup()\n{PUBLISHER}",
        str(args.rate), str(args.seconds), str(args.keys), str(args.pad),
        env={**env, "DJANGO_SETTINGS_MODULE": "dashboard.settings"}, cwd=tree,
        stdout=subprocess.PIPE,
    )  # fmt: skip
    out, _ = await publisher.communicate()
    send_ms, published = float(out.split()[-2]), int(out.split()[-1])
    await asyncio.sleep(1)  # the last windows reach the clients
    elapsed = time.monotonic() - started
    cpu = cpu_seconds(web_pid) - cpu
    after = resource.getrusage(resource.RUSAGE_SELF)
    client_cpu = after.ru_utime + after.ru_stime - mine.ru_utime - mine.ru_stime
    commands = int(node.info("stats")["total_commands_processed"]) - commands
    n_frames, n_snapshots = counts["frames"], counts["snapshots"]
    stop.set()
    if spy is not None:
        await spy.wait()
    await asyncio.gather(*tasks, return_exceptions=True)
    ms = [d * 1000 for d in delays]
    return {
        "published": published,
        "delivered": len(ms),
        "p50": pct(ms, 50) if ms else float("nan"),
        "p95": pct(ms, 95) if ms else float("nan"),
        "p99": pct(ms, 99) if ms else float("nan"),
        "send_ms": send_ms,
        "client_cpu_per_s": client_cpu / elapsed,
        "cpu_per_s": cpu / elapsed,
        "cpu_ms_per_event": 1000 * cpu / max(published, 1),
        "redis_per_event": commands / max(published, 1),
        "frames": n_frames,
        "snapshots": n_snapshots,
        "again": counts["again"],
        "cpu_us_per_frame": 1e6 * cpu / max(n_frames, 1),
        "cpu_ms_per_1k_delivered": 1e6 * cpu / max(len(ms), 1),
        "cpu_ms_per_socket_s": 1000 * cpu / (args.sockets * elapsed),
        "load": os.getloadavg(),
    }


async def start_py_spy(pid: int, args: argparse.Namespace) -> asyncio.subprocess.Process:
    """``py-spy record`` of the web process for the publishing window, collapsed stacks
    (``--format raw``) to ``args.py_spy``."""
    return await asyncio.create_subprocess_exec(
        str(Path(sys.executable).with_name("py-spy")), "record", "--pid", str(pid),
        "--duration", str(int(args.seconds)), "--rate", "200", "--format", "raw",
        "--output", str(args.py_spy), "--nonblocking",
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def _frame_name(frame: str) -> str:
    """``func (dir/file.py:12)`` → ``func (file.py)``: one line of a function, not each."""
    found = re.fullmatch(r"(.*) \((?:.*/)?([^/:]+)(?::\d+)?\)", frame)
    return f"{found[1]} ({found[2]})" if found else frame


def summarise_profile(path: Path, top: int = 25) -> None:
    """Where the sampled time went: each function's share of the samples it appears in
    (inclusive, counted once per stack) and of those it was the innermost frame of."""
    inclusive: dict[str, int] = {}
    leaf: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [_frame_name(f) for f in stack.split(";")]
        for name in set(frames):
            inclusive[name] = inclusive.get(name, 0) + n
        leaf[frames[-1]] = leaf.get(frames[-1], 0) + n
    print(f"py-spy: {total} samples of the web process ({path})")
    for title, table in (("inclusive", inclusive), ("innermost", leaf)):
        print(f"  {title}:")
        for name, n in sorted(table.items(), key=lambda kv: -kv[1])[:top]:
            print(f"    {100 * n / max(total, 1):5.1f} %  {name[:110]}")


def run_tree(name: str, tree: Path, args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix=f"gitward-fanout-{name}-"))
    var = tmp / "var"
    var.mkdir()
    env = child_env(tree, var)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = open(var / "up.log", "wb")  # noqa: SIM115 - open for the server's lifetime
    proc = subprocess.Popen(
        [sys.executable, str(tree / "manage.py"), "up", "--port", str(port), "--workers", "0"],
        env=env, cwd=tree, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        wait_http(f"{base}/login/", proc, timeout=180)
        state = json.loads((var / "state.json").read_text())
        env["REDIS_URLS"] = ",".join(state["redis_urls"])
        env["REDIS_URL"] = state["redis_urls"][0]
        profile = bool(args.py_spy) and (tree == ROOT) == (args.profile == "this")
        return asyncio.run(
            measure(base, args, tree, env, proc.pid, state["redis_urls"][0], profile)
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--anchor", default="", help="git revision to compare with (default: before broadcasts)"
    )
    parser.add_argument("--sockets", type=int, default=200)
    parser.add_argument("--rate", type=float, default=50.0, help="events published per s")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--keys", type=int, default=40, help="distinct runs the events name")
    parser.add_argument("--pad", type=int, default=0, help="extra bytes per event")
    parser.add_argument("--compression", choices=["deflate", "none"], default="deflate",
                        help="what the clients offer (browsers: deflate)")  # fmt: skip
    parser.add_argument("--ask-snapshots", action="store_true",
                        help="clients ask for snapshots as gitward.js does")  # fmt: skip
    parser.add_argument("--skip-anchor", action="store_true", help="run this tree only")
    parser.add_argument("--py-spy", type=Path, help="profile a web process to FILE")
    parser.add_argument("--profile", choices=["this", "anchor"], default="this",
                        help="whose web process --py-spy samples")  # fmt: skip
    args = parser.parse_args()
    if not args.anchor:  # the parent of the commit that added dashboard/live/fanout.py
        added = subprocess.run(
            ["git", "-C", str(ROOT), "log", "--diff-filter=A", "--format=%h", "--",
             "dashboard/live/fanout.py"],
            capture_output=True, text=True, check=True,
        ).stdout.split()  # fmt: skip
        args.anchor = f"{added[-1]}~1"
    if not re.fullmatch(r"[\w.~^/-]+", args.anchor):
        print(f"not a revision: {args.anchor!r}")
        return 2
    anchor = Path(tempfile.mkdtemp(prefix="gitward-anchor-")) / "tree"
    anchor.mkdir()
    # An exported copy (``git archive``), not a worktree: nothing is registered in git.
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.anchor],
                             capture_output=True, check=True).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(anchor)], input=archive, check=True)
    try:
        print(f"{args.sockets} sockets on /ws/ops/, {args.rate:g} events/s for "
              f"{args.seconds:g} s over {args.keys} keys, pad {args.pad} B, "
              f"compression {args.compression}", flush=True)  # fmt: skip
        print(f"{'tree':<22}{'published':>10}{'delivered':>10}{'p50 ms':>9}{'p95 ms':>9}"
              f"{'p99 ms':>9}{'send ms':>8}{'web CPU/s':>10}{'CPU ms/ev':>10}{'redis/ev':>9}"
              f"{'client CPU/s':>13}{'frames':>9}{'us/frame':>9}{'ms/1k ev':>9}"
              f"{'ms/sock·s':>10}{'snapshots':>10}{'again':>8}  load")  # fmt: skip
        trees = [(f"anchor {args.anchor}", anchor), ("this tree", ROOT)]
        for name, tree in trees[1:] if args.skip_anchor else trees:
            r = run_tree(name.split()[0], tree, args)
            print(f"{name:<22}{r['published']:>10}{r['delivered']:>10}{r['p50']:>9.0f}"
                  f"{r['p95']:>9.0f}{r['p99']:>9.0f}{r['send_ms']:>8.0f}{r['cpu_per_s']:>10.2f}"
                  f"{r['cpu_ms_per_event']:>10.2f}{r['redis_per_event']:>9.1f}"
                  f"{r['client_cpu_per_s']:>13.2f}{r['frames']:>9}{r['cpu_us_per_frame']:>9.1f}"
                  f"{r['cpu_ms_per_1k_delivered']:>9.1f}{r['cpu_ms_per_socket_s']:>10.3f}{r['snapshots']:>10}{r['again']:>8}"
                  f"  {' '.join(f'{x:.1f}' for x in r['load'])}", flush=True)  # fmt: skip
        if args.py_spy and args.py_spy.exists():
            summarise_profile(args.py_spy)
    finally:
        shutil.rmtree(anchor.parent, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
