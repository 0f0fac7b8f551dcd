"""What the running web server spends per request of each of the load test's eight
screens: CPU time of the web processes themselves, read from ``/proc`` (load test,
BENCHMARKS.md: 200 browsers every 2 s = 100 requests/s, 4 web processes beside 4 workers on 2
cores, so every millisecond of server CPU per request counts).

Unlike ``bench/pagecost.py`` (Django's test client in the bench's own process), this
measures the real serving path: ``manage.py up --workers 0 --web-workers W`` (uvicorn with
its HTTP parser, Django's ASGI handler and its thread hops, every middleware, the view,
the template), against the same seed as ``bench/pagecost.py`` (``--repos`` repositories,
``--real`` of them analysed git repositories, ``--dead`` dead letters, 200 audit
entries, a backlog of queued syncs) plus ``--locks`` held locks and 5 worker heartbeats,
so the operations tables have rows. One session, logged in through the form.

For every page, ``--requests`` GETs over ``--connections`` keep-alive connections
(one thread each), after a warm-up; CPU = the change of ``utime + stime`` of the web
processes (``/proc/PID/stat``, clock ticks) over the batch, divided by the requests;
the processes' idle rate, measured for 2 s before, is subtracted. Each page is measured
in two servers: *warm* (``GITWARD_SNAPSHOT_TTL=3600``: the shared snapshot and page parts
always reused — what most requests pay) and *cold* (``GITWARD_SNAPSHOT_TTL=0``: every
request builds them — the extra cost, paid about once per second per host under load).
Then *mix*: the eight pages at random, the default TTL, ``--mix`` requests, the CPU per
request of that mix. Nothing is asserted; prints JSON.

``--profile SECONDS``: afterwards, ``py-spy record`` (the ``bench`` extra) samples every
web process for that long while the mix runs (default TTL), and the bench prints where
their CPU went: the top functions by inclusive and by own samples, and the share of a
few areas (uvicorn/asyncio, Django's handler and middleware, sessions and auth, the
ORM and SQLite, templates, Redis, JSON). Sampling costs CPU, so no CPU figure is taken
meanwhile; ``--profile-out FILE`` keeps the collapsed stacks (one ``frame;frame;… count``
a line) for a closer look.

    .venv/bin/python bench/webcost.py [--requests 300] [--connections 4] [--web-workers 2]
        [--mix 1600] [--profile 30] [--database-url postgres://…]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.live import redis_nodes  # noqa: E402
from bench.pagecost import PAGES, seed  # noqa: E402
from tests.support.sysproc import wait_http  # noqa: E402
from workers.runtime.redis_server import free_port  # noqa: E402

PASSWORD = "webcost-pass-123456"
TICK = os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    """Live children of ``pid`` (from ``/proc/*/stat``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def cpu_seconds(pids: list[int]) -> float:
    """utime + stime of ``pids`` (every thread, finished ones included), seconds."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / TICK


class Server:
    """``manage.py up --workers 0`` on a free port with this bench's settings."""

    def __init__(
        self, env: dict[str, str], web_workers: int, ttl: float, tree: Path = ROOT
    ) -> None:
        self.port = free_port()
        name = f"up-{ttl:g}-{tree.name}.log"
        log = open(Path(env["GITWARD_VAR_DIR"]) / name, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, str(tree / "manage.py"), "up", "--workers", "0",
             "--web-workers", str(web_workers), "--port", str(self.port)],
            env={**env, "GITWARD_SNAPSHOT_TTL": str(ttl)},
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        wait_http(f"http://127.0.0.1:{self.port}/login/", self.proc, timeout=120)
        deadline = time.monotonic() + 60
        self.pids: list[int] = []
        while time.monotonic() < deadline:
            # uvicorn's multiprocess supervisor spawns the web processes as children;
            # one web process serves from ``up`` itself.
            self.pids = children(self.proc.pid) if web_workers > 1 else [self.proc.pid]
            if len(self.pids) >= web_workers:
                break
            time.sleep(0.2)
        self.cookies = self._log_in()

    def _log_in(self) -> str:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        conn.request("GET", "/login/")
        res = conn.getresponse()
        body = res.read().decode()
        csrf = _cookie(res.getheader("Set-Cookie") or "", "csrftoken")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', body)
        assert token, "no CSRF token on the login page"
        form = f"username=admin&password={PASSWORD}&csrfmiddlewaretoken={token.group(1)}"
        headers = {
            "Content-Type": "application/x-www-form-urlencoded",
            "Cookie": f"csrftoken={csrf}",
            "Referer": f"http://127.0.0.1:{self.port}/login/",
        }
        conn.request("POST", "/login/", body=form, headers=headers)
        res = conn.getresponse()
        res.read()
        assert res.status == 302, f"login answered {res.status}"
        session = ""
        for name, value in res.getheaders():
            if name.lower() == "set-cookie":
                session = _cookie(value, "sessionid") or session
                csrf = _cookie(value, "csrftoken") or csrf
        conn.close()
        return f"sessionid={session}; csrftoken={csrf}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _cookie(header: str, name: str) -> str:
    found = re.search(rf"(?:^|[;,]\s*){name}=([^;]+)", header)
    return found.group(1) if found else ""


def serve(server: Server, paths: list[str], connections: int) -> list[float]:
    """GET every path of ``paths`` once, spread over ``connections`` keep-alive
    connections (one thread each); returns the wall times (ms). Anything but 200 fails."""
    lanes = [paths[i::connections] for i in range(connections)]
    walls: list[float] = []
    errors: list[str] = []

    def lane(todo: list[str]) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        for path in todo:
            t0 = time.perf_counter()
            conn.request("GET", path, headers={"Cookie": server.cookies})
            res = conn.getresponse()
            res.read()
            walls.append((time.perf_counter() - t0) * 1000)
            if res.status != 200:
                errors.append(f"{path}: {res.status}")
        conn.close()

    threads = [threading.Thread(target=lane, args=(t,)) for t in lanes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"{len(errors)} requests failed: {errors[:3]}")
    return walls


def idle_rate(server: Server, seconds: float = 2.0) -> float:
    """The web processes' CPU seconds per second with no request."""
    c0, t0 = cpu_seconds(server.pids), time.monotonic()
    time.sleep(seconds)
    return (cpu_seconds(server.pids) - c0) / (time.monotonic() - t0)


def measure(server: Server, paths: list[str], connections: int, idle: float) -> dict[str, Any]:
    serve(server, paths[: 4 * connections], connections)  # warm-up
    c0, t0 = cpu_seconds(server.pids), time.monotonic()
    walls = serve(server, paths, connections)
    elapsed = time.monotonic() - t0
    cpu = cpu_seconds(server.pids) - c0 - idle * elapsed
    return {
        "cpu_ms": round(1000 * cpu / len(paths), 2),
        "wall_p50_ms": round(statistics.median(walls), 1),
        "requests_per_s": round(len(paths) / elapsed, 1),
    }


def spy_options(seconds: float) -> list[str]:
    """``py-spy record`` options: 200 samples/s, collapsed stacks, only samples of a
    thread holding the interpreter lock (Python CPU work; idle waits and native work
    outside the lock, such as SQLite's, are not seen), the output file last."""
    return ["--rate", "200", "--duration", str(int(seconds)), "--format", "raw", "--gil",
            "--output"]  # fmt: skip


def profile(
    server: Server, paths: list[str], connections: int, seconds: float, keep: str = ""
) -> str:
    """py-spy ``record`` on every web process while ``paths`` are served; the samples'
    summary as text (``keep``: also write the collapsed stacks to that file)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    out = Path(tempfile.mkdtemp(prefix="gitward-webcost-spy-"))
    spies = [
        subprocess.Popen(
            [spy, "record", "--pid", str(pid), *spy_options(seconds), str(out / f"{pid}.txt")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for pid in server.pids
    ]
    stop = time.monotonic() + seconds
    while time.monotonic() < stop and all(s.poll() is None for s in spies):
        serve(server, random.sample(paths, min(len(paths), 200)), connections)
    for s in spies:
        s.wait()
    stacks: Counter[str] = Counter()
    for f in out.glob("*.txt"):
        for line in f.read_text().splitlines():
            stack, _, n = line.rpartition(" ")
            if stack and n.isdigit():
                stacks[stack] += int(n)
    shutil.rmtree(out, ignore_errors=True)
    if keep:
        Path(keep).write_text("".join(f"{k} {n}\n" for k, n in stacks.most_common()))
    return summarise(stacks)


#: Areas of the serving path, by the first matching frame from the leaf up (file paths).
AREAS = [
    ("templates", ("django/template/", "templatetags/", "dashboard/web/prerendered_rows.py")),
    ("ORM + database driver", ("django/db/", "sqlite3", "psycopg")),
    ("Redis client", ("redis/", "workers/locks/")),
    ("sessions + auth", ("contrib/sessions/", "contrib/auth/", "django/core/signing")),
    ("JSON", ("json/",)),
    ("Django handler, middleware, URLs", ("django/core/handlers/", "django/middleware/",
                                         "django/urls/", "django/http/", "whitenoise/",
                                         "contrib/messages/", "django/dispatch/")),
    ("asgiref thread hops", ("asgiref/",)),
    ("uvicorn, asyncio, h11/httptools", ("uvicorn/", "asyncio/", "httptools", "h11/",
                                        "websockets/", "uvloop")),
    ("gitward code", ("/dashboard/", "/workers/")),
]  # fmt: skip


def _frame_file(frame: str) -> str:
    inner = frame.rsplit("(", 1)[-1]
    return inner.rstrip(")")


def summarise(stacks: Counter[str], top: int = 40) -> str:
    total = sum(stacks.values()) or 1
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    areas: Counter[str] = Counter()
    for stack, n in stacks.items():
        frames = stack.split(";")
        for frame in set(frames):
            inclusive[re.sub(r":\d+\)$", ")", frame)] += n
        own[re.sub(r":\d+\)$", ")", frames[-1])] += n
        for frame in reversed(frames):
            where = _frame_file(frame)
            area = next((a for a, keys in AREAS if any(k in where for k in keys)), None)
            if area is not None:
                areas[area] += n
                break
        else:
            areas["other"] += n
    lines = [f"{total} samples"]
    lines.append("areas (the innermost frame that belongs to one):")
    lines += [f"  {100 * n / total:5.1f} %  {a}" for a, n in areas.most_common()]
    lines.append(f"top {top} inclusive:")
    lines += [f"  {100 * n / total:5.1f} %  {f}" for f, n in inclusive.most_common(top)]
    lines.append(f"top {top} own:")
    lines += [f"  {100 * n / total:5.1f} %  {f}" for f, n in own.most_common(top)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repos", type=int, default=400)
    parser.add_argument("--real", type=int, default=3)
    parser.add_argument("--dead", type=int, default=2000)
    parser.add_argument("--locks", type=int, default=8, help="held locks (chunks, a mirror)")
    parser.add_argument("--requests", type=int, default=300, help="per page and mode")
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--web-workers", type=int, default=2)
    parser.add_argument("--mix", type=int, default=1600, help="requests of the mixed run")
    parser.add_argument("--modes", default="warm,cold,mix")
    parser.add_argument("--profile", type=float, default=0.0, help="seconds of py-spy (0: none)")
    parser.add_argument("--rounds", type=int, default=3, help="batches per page and tree")
    parser.add_argument("--anchor", default="",
                        help="another checkout (e.g. the branch point, `git archive`d) served"
                        " the same way, its batches alternating with this tree's")  # fmt: skip
    parser.add_argument("--profile-out", default="", help="file for the collapsed stacks")
    parser.add_argument("--database-url", default="")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gitward-bench-webcost-"))
    out: dict[str, Any] = {"load_average_start": os.getloadavg()}
    servers: list[Server] = []
    with redis_nodes(tmp) as nodes:
        for key in list(os.environ):
            if key.startswith(("REDIS_URL", "GITWARD_", "DATABASE_URL")):
                del os.environ[key]
        (tmp / "var").mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "dashboard.settings",
            "GITWARD_VAR_DIR": str(tmp / "var"),
            "DATABASE_URL": args.database_url or f"sqlite:///{tmp / 'var' / 'db.sqlite3'}",
            "REDIS_URLS": ",".join(n.url for n in nodes),
            "GITWARD_LOG_LEVEL": "WARNING",
            "GITWARD_ADMIN_PASSWORD": PASSWORD,
            "GITWARD_RATE_SUBMIT_PER_MINUTE": "0",
            "GITWARD_RATE_API_PER_MINUTE": "0",
            "GITWARD_LOCAL_ROOTS": str(tmp.resolve()),
        }
        os.environ.update(env)
        import django

        django.setup()
        from django.contrib.auth.models import User
        from django.core.management import call_command
        from django.db import connections
        from django.utils import timezone

        from dashboard.locks import leases
        from dashboard.models import WorkerBeat
        from workers.locks import keys as locks_keys

        call_command("migrate", verbosity=0)
        repo_id = seed(tmp, args.repos, args.real, args.dead)
        User.objects.create_superuser("admin", password=PASSWORD)
        now = timezone.now()
        for i in range(5):
            WorkerBeat.objects.create(
                name=f"host-1.{4200 + i}", host="host-1", pid=4200 + i, version="", last_seen=now
            )
        held = []  # kept for the whole run (TTL an hour), released at the end
        for i in range(args.locks):
            key = (
                locks_keys.mirror(repo_id) if i == 0 else locks_keys.chunk(repo_id + i, f"{i:040x}")
            )
            held.append(
                leases.redlock().acquire(
                    key, ttl=3600, holder={"worker": f"host-1.{4200 + i % 5}", "job": f"j{i}"}
                )
            )
        connections.close_all()
        paths = {name: path.format(repo=repo_id) for name, path in PAGES.items()}
        trees = {"this": ROOT, **({"anchor": Path(args.anchor).resolve()} if args.anchor else {})}
        try:
            ttls = {"warm": 3600.0, "cold": 0.0, "mix": 1.0}
            for mode in filter(None, args.modes.split(",")):
                running = {t: Server(env, args.web_workers, ttls[mode], tree)
                           for t, tree in trees.items()}  # fmt: skip
                servers.extend(running.values())
                idle = {t: idle_rate(server) for t, server in running.items()}
                out.setdefault("idle_cpu_ms_per_s", {})[mode] = {
                    t: round(1000 * v, 2) for t, v in idle.items()
                }
                if mode == "mix":
                    batches = {
                        "mix": [random.choice(list(paths.values())) for _ in range(args.mix)]
                    }
                else:
                    batches = {name: [path] * args.requests for name, path in paths.items()}
                    batches["anchor /healthz"] = ["/healthz"] * args.requests
                out[mode] = {}
                for name, batch in batches.items():
                    # The trees alternate, round after round: both see the same machine.
                    got: dict[str, list[dict[str, Any]]] = {t: [] for t in running}
                    for _ in range(args.rounds):
                        for t, server in running.items():
                            got[t].append(measure(server, batch, args.connections, idle[t]))
                    out[mode][name] = row = {
                        t: {
                            "cpu_ms": round(statistics.median(m["cpu_ms"] for m in ms), 2),
                            "cpu_ms_rounds": [m["cpu_ms"] for m in ms],
                            "wall_p50_ms": round(
                                statistics.median(m["wall_p50_ms"] for m in ms), 1
                            ),
                        }
                        for t, ms in got.items()
                    }
                    if "anchor" in row:
                        row["this/anchor"] = round(
                            row["this"]["cpu_ms"] / row["anchor"]["cpu_ms"], 3
                        )
                    print(f"{mode} {name}: {json.dumps(row)}", file=sys.stderr, flush=True)
                if mode == "mix" and args.profile:
                    text = profile(running["this"], list(paths.values()) * 50, args.connections,
                                   args.profile, args.profile_out)  # fmt: skip
                    print(f"--- py-spy, {args.web_workers} web processes, mix\n{text}",
                          file=sys.stderr)  # fmt: skip
                for server in running.values():
                    server.stop()
        finally:
            for server in servers:
                server.stop()
            for lock in held:
                lock.release()
        out["vendor"] = env["DATABASE_URL"].split(":", 1)[0]
    out["load_average_end"] = os.getloadavg()
    print(json.dumps(out, indent=1))
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
