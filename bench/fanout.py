"""Benchmark: live events fanned out to many websockets of one web process, the
anchor (another revision of this repository, by default the one before
``dashboard/broadcasts.py`` was added) and this tree side by side in one run. Not a test.

For each code tree: ``manage.py up --workers 0`` (that tree's code, this virtualenv;
its own temporary ``GITWARD_VAR_DIR``, SQLite, embedded Redis) serves ``--sockets``
websockets on ``/ws/ops/``, opened by this process (asyncio, ``websockets``) with one
logged-in session. A publisher subprocess (that tree's ``dashboard.live.send_to_groups``,
as a worker publishes) sends ``--rate`` events/s for ``--seconds``: job progress of
``--keys`` runs in turn, so a 100 ms window coalesces some but not all. Figures:

* delay = arrival at the client - the event's ``at`` (one clock), p50/p95/p99;
* events delivered, and the web process's CPU seconds (``/proc``, user + system) per
  second of the window and per published event;
* Redis commands (``INFO``: ``total_commands_processed``) per published event.

The machine load (``os.getloadavg``) is printed with each run.

    .venv/bin/python bench/fanout.py [--anchor REV] [--sockets 200] [--rate 50]
        [--seconds 30] [--keys 40]
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
from tests.sysproc import wait_http  # noqa: E402
from workers.redisnode import free_port  # noqa: E402

PASSWORD = "fanout-pass-123456"
PUBLISHER = """
import sys, time
from dashboard.live import OPS_GROUP, send_to_groups
rate, seconds, keys = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
start = time.monotonic()
n = 0
lags = []
while time.monotonic() - start < seconds:
    event = {"type": "job.progress", "at": round(time.time(), 3), "run": n % keys, "n": n}
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
               opened: list[int]) -> None:  # fmt: skip
    async with websockets.connect(
        url,
        additional_headers={"Cookie": cookie},
        origin=base,
        max_size=2**24,  # type: ignore[arg-type]
    ) as ws:
        opened.append(1)
        while not stop.is_set():
            try:
                raw = await asyncio.wait_for(ws.recv(), timeout=0.5)
            except TimeoutError:
                continue
            now = time.time()
            msg = json.loads(raw)
            if msg.get("type") == "events":
                delays.extend(now - float(e["at"]) for e in msg["events"] if "at" in e)


async def measure(base: str, args: argparse.Namespace, tree: Path, env: dict[str, str],
                  web_pid: int, redis_url: str) -> dict[str, Any]:  # fmt: skip
    cookie = log_in(base)
    url = base.replace("http://", "ws://") + "/ws/ops/"
    delays: list[float] = []
    stop = asyncio.Event()
    opened: list[int] = []
    tasks = [
        asyncio.create_task(hold(url, cookie, base, delays, stop, opened))
        for _ in range(args.sockets)
    ]
    async with asyncio.timeout(120):
        while len(opened) < args.sockets:
            await asyncio.sleep(0.1)
    await asyncio.sleep(2)  # the snapshots on connect are not measured
    delays.clear()
    node = redis.Redis.from_url(redis_url)
    commands = int(node.info("stats")["total_commands_processed"])
    cpu = cpu_seconds(web_pid)
    mine = resource.getrusage(resource.RUSAGE_SELF)
    started = time.monotonic()
    publisher = await asyncio.create_subprocess_exec(
        sys.executable, "-c", f"import django; django.setup()\n{PUBLISHER}",
        str(args.rate), str(args.seconds), str(args.keys),
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
    stop.set()
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
        "load": os.getloadavg(),
    }


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
        return asyncio.run(measure(base, args, tree, env, proc.pid, state["redis_urls"][0]))
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
    args = parser.parse_args()
    if not args.anchor:  # the parent of the commit that added dashboard/broadcasts.py
        added = subprocess.run(
            ["git", "-C", str(ROOT), "log", "--diff-filter=A", "--format=%h", "--",
             "dashboard/broadcasts.py"],
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
              f"{args.seconds:g} s over {args.keys} keys", flush=True)  # fmt: skip
        print(f"{'tree':<22}{'published':>10}{'delivered':>10}{'p50 ms':>9}{'p95 ms':>9}"
              f"{'p99 ms':>9}{'send ms':>8}{'web CPU/s':>10}{'CPU ms/ev':>10}{'redis/ev':>9}"
              f"{'client CPU/s':>13}  load")  # fmt: skip
        for name, tree in ((f"anchor {args.anchor}", anchor), ("this tree", ROOT)):
            r = run_tree(name.split()[0], tree, args)
            print(f"{name:<22}{r['published']:>10}{r['delivered']:>10}{r['p50']:>9.0f}"
                  f"{r['p95']:>9.0f}{r['p99']:>9.0f}{r['send_ms']:>8.0f}{r['cpu_per_s']:>10.2f}"
                  f"{r['cpu_ms_per_event']:>10.2f}{r['redis_per_event']:>9.1f}"
                  f"{r['client_cpu_per_s']:>13.2f}"
                  f"  {' '.join(f'{x:.1f}' for x in r['load'])}", flush=True)  # fmt: skip
    finally:
        shutil.rmtree(anchor.parent, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
