"""Load test: logged-in users browsing with the live view open, while repositories are
submitted and analysed (BENCHMARKS.md, "Load"). Not a test: nothing is asserted, but
the exit status is 1 when a request failed or a submitted repository is incomplete.

``manage.py up --workers 4`` runs as a subprocess on a free loopback port (its own
temporary ``GITWARD_VAR_DIR``: SQLite, or ``DATABASE_URL`` if set; embedded Redis nodes;
submission and API rate limits off). Locust runs in this process, as a library
(headless, one gevent loop):

* ``--users`` browsers (default 200): each is logged in (the users share ``--logins``
  sessions, default 20, each made through the login form before the run, as
  ``--accounts`` operator accounts, default 20: ``admin`` and ``operator001``…; the
  submitters take sessions from the same set, so each account both browses and
  submits; ``--accounts 1`` is the earlier setting, everyone ``admin``), holds the
  operators' websocket (``/ws/ops/``) open for the whole run, and every 2 s (think time)
  opens one of the main pages: overview, repositories, one repository, locks, workers,
  dead letters, audit, and the status API. Anything but a 200 is an error (redirects are
  not followed: a lost session would otherwise measure the login page).
* ``--submitters`` (default 20): each submits a fresh repository through the API
  (``POST /api/repos``) every ``--submit-every`` seconds (synthetic histories of
  ``--commits`` commits built with ``git fast-import`` before the run).

The HTTP client is Locust's ``FastHttpUser`` (geventhttpclient; ``--client requests``
for ``HttpUser``): the load generator shares the cores with the server, and the bench
prints its own CPU time per request (``--no-websockets``: the browsers open no socket,
so that figure is the HTTP client's alone).

Figures are taken over ``--minutes`` (default 3) once every user has logged in (the ramp
is excluded). Websocket event delay = arrival time - the event's ``at`` (set when the
worker or web process published it; one clock, one machine); it includes the
consumers' 100 ms coalescing window. Afterwards every submitted repository must become
ready (bounded by ``--drain-timeout``) with exactly the commits git reports, each once
(paged through ``/api/repos/{id}/commits``).

    .venv/bin/python bench/load.py [--users 200] [--minutes 3] [--submitters 20]
        [--workers 4] [--web-workers N] [--commits 40] [--submit-every 10]
        [--client fast|requests] [--no-websockets] [--logins 20] [--accounts 20]
        [--env GITWARD_X=value ...]
"""

from __future__ import annotations

# Locust's import monkey-patches the standard library for gevent: it must come first.
from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from http.cookiejar import Cookie  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import gevent  # noqa: E402
import requests  # noqa: E402
import websocket  # noqa: E402  (websocket-client, a Locust dependency)
from locust import FastHttpUser, HttpUser, User, constant, events  # noqa: E402
from locust.env import Environment  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.live import make_repo, pct  # noqa: E402
from bench.proccpu import by_role, snapshot  # noqa: E402
from tests.support.sysproc import wait_http  # noqa: E402
from workers.runtime.redis_server import free_port  # noqa: E402

PASSWORD = "load-pass-123456"
#: The main pages, by the name they are reported under; {repo} is filled per request.
PAGES = {
    "overview": "/",
    "repositories": "/repos/",
    "repository": "/repos/{repo}/",
    "locks": "/locks/",
    "workers": "/workers/",
    "dead-letters": "/dead-letters/",
    "audit": "/audit/",
    "api-status": "/api/status",
}


class Shared:
    """What the users share: the pool of origins to submit, and what was submitted."""

    base = ""
    origins: list[tuple[Path, int]] = []
    submitted: dict[int, tuple[Path, int]] = {}
    ws_delays: list[float] = []
    ws_errors: list[str] = []
    ws_open = 0
    measuring = False
    sessions: list[dict[str, str]] = []
    next_session = 0
    websockets = True


def create_accounts(var: Path, count: int) -> list[str]:
    """``count`` operator accounts (staff, every permission) besides ``admin``, made in
    the server's database before the run; their names. One password hash for all."""
    if count <= 1:
        return ["admin"]
    names = [f"operator{i:03d}" for i in range(1, count)]
    code = (
        "from django.contrib.auth import get_user_model\n"
        "from django.contrib.auth.hashers import make_password\n"
        f"hashed = make_password({PASSWORD!r})\n"
        "get_user_model().objects.bulk_create([get_user_model()(username=n, password=hashed,"
        f" is_staff=True, is_superuser=True) for n in {names!r}])\n"
    )
    subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "shell", "-c", code],
        env=server_env(var), check=True,
    )  # fmt: skip
    return ["admin", *names]


def log_in_sessions(count: int, accounts: list[str]) -> list[dict[str, str]]:
    """``count`` sessions, each logged in through the login form (before the users
    start: a password hash costs ~0.3 s of CPU, and 220 at once would be the ramp),
    session i as account i modulo their number."""
    jars: list[dict[str, str]] = []
    attempts = 0
    while len(jars) < count:
        attempts += 1
        client = requests.Session()
        page = client.get(f"{Shared.base}/login/", timeout=60)
        res = client.post(
            f"{Shared.base}/login/",
            data={"username": accounts[len(jars) % len(accounts)], "password": PASSWORD,
                  "csrfmiddlewaretoken": client.cookies.get("csrftoken", "")},
            headers={"Referer": f"{Shared.base}/login/"},
            allow_redirects=False,
            timeout=60,
        )  # fmt: skip
        if res.status_code != 302 or page.status_code != 200:
            # Set-up, not measured: a login refused while the server starts (SQLite busy
            # under the workers' first writes) is retried, and said.
            print(f"login {len(jars) + 1} failed: {page.status_code}/{res.status_code}")
            if attempts > count + 10:
                raise RuntimeError("logins keep failing")
            continue
        jars.append(dict(client.cookies.items()))
    return jars


def _cookie(name: str, value: str, host: str) -> Cookie:
    """A host-only cookie, as the server's ``Set-Cookie`` would have made it."""
    return Cookie(
        version=0, name=name, value=value, port=None, port_specified=False, domain=host,
        domain_specified=False, domain_initial_dot=False, path="/", path_specified=True,
        secure=False, expires=None, discard=True, comment=None, comment_url=None, rest={},
    )  # fmt: skip


def cookies_of(user: User) -> dict[str, str]:
    """The user's cookies now (the server may have set new ones since the login)."""
    jar = getattr(user.client, "cookiejar", None)  # FastHttpSession; requests: .cookies
    if jar is not None:
        return {c.name: c.value for c in jar if c.value is not None}
    return dict(user.client.cookies.items())


def log_in(user: User) -> None:
    """Take the next logged-in session (users share ``--logins`` sessions round-robin,
    as an operator's browser tabs share one): its cookies go into the user's jar, so
    the client sends them and keeps what the server sets."""
    Shared.next_session += 1
    jar = Shared.sessions[Shared.next_session % len(Shared.sessions)]
    host = Shared.base.split("://", 1)[1].split(":", 1)[0]
    for name, value in jar.items():
        if hasattr(user.client, "cookiejar"):
            user.client.cookiejar.set_cookie(_cookie(name, value, host))
        else:
            user.client.cookies.set(name, value)


def csrf_headers(user: User) -> dict[str, str]:
    return {
        "X-CSRFToken": cookies_of(user).get("csrftoken", ""),
        "Referer": f"{Shared.base}/",
        "Content-Type": "application/json",
    }


class BrowserTasks:
    """A logged-in operator: the live websocket open, one page every 2 s. Mixed into a
    Locust user class below (one per HTTP client)."""

    client: Any
    listener: gevent.Greenlet | None = None

    def on_start(self) -> None:
        log_in(self)  # type: ignore[arg-type]
        self.ws_stop = False
        if Shared.websockets:
            self.listener = gevent.spawn(self._listen)

    def on_stop(self) -> None:
        self.ws_stop = True
        if self.listener is not None:
            self.listener.kill(block=False)

    def _listen(self) -> None:
        cookie = "; ".join(f"{k}={v}" for k, v in cookies_of(self).items())  # type: ignore[arg-type]
        url = Shared.base.replace("http://", "ws://") + "/ws/ops/"
        try:
            ws = websocket.create_connection(
                url, header=[f"Cookie: {cookie}"], origin=Shared.base, timeout=30
            )
        except Exception as exc:  # counted and printed
            Shared.ws_errors.append(f"connect: {exc}")
            return
        Shared.ws_open += 1
        try:
            while not self.ws_stop:
                try:
                    raw = ws.recv()
                except websocket.WebSocketTimeoutException:
                    continue
                now = time.time()
                if not raw:
                    Shared.ws_errors.append("closed by the server")
                    return
                msg = json.loads(raw)
                if msg.get("type") == "events" and Shared.measuring:
                    Shared.ws_delays.extend(now - float(e["at"]) for e in msg["events"])
        except Exception as exc:
            if not self.ws_stop:
                Shared.ws_errors.append(f"recv: {type(exc).__name__}: {exc}")
        finally:
            Shared.ws_open -= 1
            ws.close()

    def browse(self) -> None:
        name = random.choice(list(PAGES))
        ids = list(Shared.submitted) or [1]
        path = PAGES[name].format(repo=random.choice(ids))
        with self.client.get(path, name=name, allow_redirects=False, catch_response=True) as res:
            if res.status_code != 200:  # a redirect is a lost session, not a page
                res.failure(f"HTTP {res.status_code}")


class SubmitterTasks:
    """Submits a fresh repository through the API every ``--submit-every`` seconds."""

    client: Any

    def on_start(self) -> None:
        log_in(self)  # type: ignore[arg-type]

    def submit(self) -> None:
        if not Shared.origins:
            return
        path, commits = Shared.origins.pop()
        with self.client.post(
            "/api/repos",
            data=json.dumps({"url": str(path)}),
            headers=csrf_headers(self),  # type: ignore[arg-type]
            name="api-submit",
            catch_response=True,
        ) as res:
            if res.status_code in (200, 202):
                Shared.submitted[int(res.json()["id"])] = (path, commits)
            else:
                res.failure(f"HTTP {res.status_code}")


class FastBrowser(BrowserTasks, FastHttpUser):
    wait_time = constant(2)
    tasks = [BrowserTasks.browse]


class FastSubmitter(SubmitterTasks, FastHttpUser):
    wait_time = constant(10)
    tasks = [SubmitterTasks.submit]


class RequestsBrowser(BrowserTasks, HttpUser):
    wait_time = constant(2)
    tasks = [BrowserTasks.browse]


class RequestsSubmitter(SubmitterTasks, HttpUser):
    wait_time = constant(10)
    tasks = [SubmitterTasks.submit]


CLIENTS: dict[str, tuple[type[User], type[User]]] = {
    "fast": (FastBrowser, FastSubmitter),
    "requests": (RequestsBrowser, RequestsSubmitter),
}


def server_env(var: Path) -> dict[str, str]:
    """The server's environment (and that of the set-up commands on its database)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITWARD_", "REDIS_URL"))}
    env.update(
        GITWARD_VAR_DIR=str(var),
        GITWARD_LOCAL_ROOTS=str(var.parent / "origins"),
        GITWARD_ADMIN_PASSWORD=PASSWORD,
        GITWARD_RATE_SUBMIT_PER_MINUTE="0",
        GITWARD_RATE_API_PER_MINUTE="0",
        PYTHONUNBUFFERED="1",
    )
    if "DATABASE_URL" not in env:
        env["DATABASE_URL"] = f"sqlite:///{var / 'db.sqlite3'}"
    return env


def start_server(var: Path, port: int, args: argparse.Namespace) -> subprocess.Popen[bytes]:
    env = server_env(var)
    for pair in args.env:  # an A/B of a setting, e.g. --env GITWARD_DB_POOL_SIZE=16
        name, _, value = pair.partition("=")
        env[name] = value
    cmd = [sys.executable, str(ROOT / "manage.py"), "up", "--port", str(port),
           "--workers", str(args.workers)]  # fmt: skip
    if args.web_workers:
        cmd += ["--web-workers", str(args.web_workers)]
    var.mkdir(parents=True, exist_ok=True)
    log = open(var / "up.log", "wb")  # noqa: SIM115 - open for the server's lifetime
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    wait_http(f"http://127.0.0.1:{port}/login/", proc, timeout=180)
    return proc


def verify(base: str, token_session: requests.Session, timeout: float) -> dict[str, int]:
    """Wait for every submitted repository; check its commits against git, each once."""
    pending = dict(Shared.submitted)
    report = {"repositories": len(pending), "ready": 0, "wrong": 0, "commits": 0}
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        for repo_id in list(pending):
            body = token_session.get(f"{base}/api/repos/{repo_id}", timeout=30).json()
            if body["status"] in ("ready", "failed"):
                path, commits = pending.pop(repo_id)
                shas: list[str] = []
                cursor = ""
                while True:
                    page = token_session.get(
                        f"{base}/api/repos/{repo_id}/commits",
                        params={"limit": 1000, **({"cursor": cursor} if cursor else {})},
                        timeout=30,
                    ).json()
                    shas += [c["sha"] for c in page["results"]]
                    cursor = page.get("next") or ""
                    if not cursor:
                        break
                want = subprocess.run(
                    ["git", "-C", str(path), "rev-list", "HEAD"],
                    capture_output=True, text=True, check=True,
                ).stdout.split()  # fmt: skip
                good = (
                    body["status"] == "ready"
                    and len(shas) == len(set(shas)) == commits
                    and set(shas) == set(want)
                )
                report["ready" if good else "wrong"] += 1
                report["commits"] += len(shas)
        if pending:
            time.sleep(1)
    report["unfinished"] = len(pending)
    for repo_id in list(pending)[:5]:
        body = token_session.get(f"{base}/api/repos/{repo_id}", timeout=30).json()
        print(f"  unfinished: repository {repo_id} {body['status']} {body.get('error') or ''}")
    return report


def redis_commands(var: Path) -> dict[str, int]:
    """Commands processed so far by each embedded Redis node (state.json of ``up``).
    Node 0 is also the queue Redis and channel layer; the others take only lock calls."""
    import redis

    urls = json.loads((var / "state.json").read_text())["redis_urls"]
    return {
        url: int(redis.Redis.from_url(url).info("stats")["total_commands_processed"])
        for url in urls
    }


def server_times(var: Path) -> dict[str, dict[float, float]]:
    """The web processes' ``gitward_http_request_seconds`` buckets so far, by view:
    ``{view: {upper bound: observations}}`` (read from the metrics hash on the queue
    node, where every web process flushes them every 2 s: ``dashboard.observability.counters``)."""
    import redis

    url = json.loads((var / "state.json").read_text())["redis_urls"][0]
    out: dict[str, dict[float, float]] = {}
    for field, value in redis.Redis.from_url(url).hgetall("gitward:metrics").items():
        series, pairs = json.loads(field)
        if series != "gitward_http_request_seconds_bucket":
            continue
        labels = dict(pairs)
        bound = float("inf") if labels["le"] == "+Inf" else float(labels["le"])
        out.setdefault(labels["view"], {})[bound] = float(value)
    return out


def bucket_percentile(buckets: dict[float, float], q: float) -> str:
    """The upper bound of the bucket holding the ``q`` quantile, as "≤ N ms"."""
    total = sum(buckets.values())
    seen = 0.0
    for bound in sorted(buckets):
        seen += buckets[bound]
        if seen >= q * total:
            return "> 10 s" if bound == float("inf") else f"≤ {bound * 1000:.0f}"
    return "-"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--users", type=int, default=200, help="browsing users")
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--submitters", type=int, default=20)
    parser.add_argument("--workers", type=int, default=4, help="worker processes")
    parser.add_argument("--web-workers", type=int, default=0,
                        help="web server processes (default: what `up` runs by default, 2 per"
                        " core, at least 2)")  # fmt: skip
    parser.add_argument("--commits", type=int, default=40, help="commits per repository")
    parser.add_argument("--submit-every", type=float, default=10.0, help="s per submitter")
    parser.add_argument("--spawn-rate", type=float, default=5.0, help="users started per s")
    parser.add_argument("--drain-timeout", type=float, default=900.0)
    parser.add_argument("--logins", type=int, default=20, help="sessions the users share")
    parser.add_argument(
        "--accounts", type=int, default=20,
        help="operator accounts the sessions log in as (1 = everyone is admin)",
    )  # fmt: skip
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="an environment variable for the server (repeatable)")  # fmt: skip
    parser.add_argument("--keep-log", default="", help="copy the server's log here at the end")
    parser.add_argument(
        "--no-websockets", action="store_true",
        help="browsers open no live socket (to measure the HTTP client's own CPU)",
    )  # fmt: skip
    parser.add_argument(
        "--client", choices=sorted(CLIENTS), default="fast",
        help="Locust's HTTP client: fast = FastHttpUser (geventhttpclient), requests = HttpUser",
    )  # fmt: skip
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="gitward-load-"))
    proc = None
    try:
        budget = int(args.submitters * (args.minutes * 60 / args.submit_every + 2)) + 10
        print(f"building {budget} repositories of {args.commits} commits …", flush=True)
        for i in range(budget):
            path = tmp / "origins" / f"r{i:04d}"
            make_repo(path, args.commits, seed=i)
            Shared.origins.append((path, args.commits))
        port = free_port()
        Shared.base = f"http://127.0.0.1:{port}"
        proc = start_server(tmp / "var", port, args)
        web = args.web_workers or "the default number of"
        print(f"server up on {Shared.base} (pid {proc.pid}) with {args.workers} workers; "
              f"{web} web process(es)", flush=True)  # fmt: skip

        Shared.sessions = log_in_sessions(args.logins, create_accounts(tmp / "var", args.accounts))
        Shared.websockets = not args.no_websockets
        sockets = args.users if Shared.websockets else 0
        Browser, Submitter = CLIENTS[args.client]
        Browser.fixed_count = args.users
        Browser.host = Shared.base
        Submitter.fixed_count = args.submitters
        Submitter.host = Shared.base
        Submitter.wait_time = constant(args.submit_every)
        env = Environment(user_classes=[Browser, Submitter], events=events)
        runner = env.create_local_runner()
        total = args.users + args.submitters
        runner.start(total, spawn_rate=args.spawn_rate)
        deadline = time.monotonic() + total / args.spawn_rate + 120
        while (
            runner.user_count < total or Shared.ws_open + len(Shared.ws_errors) < sockets
        ) and time.monotonic() < deadline:
            gevent.sleep(0.5)
        print(f"{runner.user_count} users, {Shared.ws_open} websockets open; measuring "
              f"{args.minutes} min", flush=True)  # fmt: skip
        env.stats.reset_all()
        Shared.ws_delays.clear()
        Shared.measuring = True
        redis_before = redis_commands(tmp / "var")
        times_before = server_times(tmp / "var")
        tree_before = snapshot(proc.pid)
        started, cpu_before = time.monotonic(), time.process_time()
        gevent.sleep(args.minutes * 60)
        elapsed, bench_cpu = time.monotonic() - started, time.process_time() - cpu_before
        server_cpu = by_role(tree_before, snapshot(proc.pid))
        Shared.measuring = False
        redis_after = redis_commands(tmp / "var")
        gevent.sleep(2.5)  # the web processes flush their metrics every 2 s
        times_after = server_times(tmp / "var")
        stats = env.stats
        rows = sorted(stats.entries.values(), key=lambda e: e.name)
        requests_total = sum(e.num_requests for e in rows)
        failures = sum(e.num_failures for e in rows)
        ws_open_at_end = Shared.ws_open
        runner.quit()

        print(f"\n{requests_total} requests in {elapsed:.0f} s: "
              f"{requests_total / elapsed:.1f} requests/s, {failures} errors")  # fmt: skip
        print(f"load generator ({args.client} client, {sockets} websockets): {bench_cpu:.1f} CPU s"
              f" = {100 * bench_cpu / elapsed:.0f} % of a core, "
              f"{1e6 * bench_cpu / max(1, requests_total):.0f} µs per request")  # fmt: skip
        print("server CPU over the window, by role (cores of 2 busy):", ", ".join(
            f"{role} {sec / elapsed:.2f}" for role, sec in sorted(
                server_cpu.items(), key=lambda kv: -kv[1]) if sec > 0))  # fmt: skip
        web_cpu = server_cpu.get("web processes", 0.0)
        # Compare with bench/webcost.py's mix (the same pages without the load) taken on
        # the same day: this machine's speed moves by 1.6x between days.
        print(f"web processes' CPU per request: {1000 * web_cpu / max(1, requests_total):.1f} ms"
              " (websocket frames included)")  # fmt: skip
        print(f"{'page':<14}{'requests':>9}{'errors':>8}{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}")
        for e in rows:
            if not e.num_requests:
                continue
            print(
                f"{e.name:<14}{e.num_requests:>9}{e.num_failures:>8}"
                f"{e.get_response_time_percentile(0.5):>9.0f}"
                f"{e.get_response_time_percentile(0.95):>9.0f}"
                f"{e.get_response_time_percentile(0.99):>9.0f}"
            )
        print("server time per view (gitward_http_request_seconds over the window, bucket"
              " bounds, ms): from Django taking a request to its response ready")  # fmt: skip
        for view in sorted(times_after):
            window = {
                b: n - times_before.get(view, {}).get(b, 0.0) for b, n in times_after[view].items()
            }
            if sum(window.values()) > 0:
                print(f"  {view:<22}{sum(window.values()):>8.0f}  p50 "
                      f"{bucket_percentile(window, 0.5):>6}  p95 "
                      f"{bucket_percentile(window, 0.95):>6}  p99 "
                      f"{bucket_percentile(window, 0.99):>6}")  # fmt: skip
        for err in list(stats.errors.values())[:10]:
            print(f"  error: {err.method} {err.name}: {err.error} ×{err.occurrences}")
        delays = [d * 1000 for d in Shared.ws_delays]
        if delays:
            print(f"websocket events: {len(delays)} received, delay p50 {pct(delays, 50):.0f} ms,"
                  f" p95 {pct(delays, 95):.0f} ms, p99 {pct(delays, 99):.0f} ms, "
                  f"mean {statistics.fmean(delays):.0f} ms")  # fmt: skip
        print(f"websockets: {ws_open_at_end} of {sockets} open at the end, "
              f"{len(Shared.ws_errors)} errors {Shared.ws_errors[:3]}")  # fmt: skip

        for i, url in enumerate(redis_before):
            rate = (redis_after[url] - redis_before[url]) / elapsed
            role = "queues + channel layer + locks" if i == 0 else "locks only"
            print(f"redis node {i} ({role}): {rate:.0f} commands/s")

        session = requests.Session()
        token = subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), "api_token", "admin"],
            env={**os.environ, "GITWARD_VAR_DIR": str(tmp / "var"),
                 "DATABASE_URL": os.environ.get("DATABASE_URL",
                                                f"sqlite:///{tmp / 'var' / 'db.sqlite3'}")},
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        session.headers["Authorization"] = f"Bearer {token}"
        started = time.monotonic()
        report = verify(Shared.base, session, args.drain_timeout)
        drained = time.monotonic() - started
        print(f"verified after {drained:.0f} s more: {report}")
        span = elapsed + drained
        print(f"analysed {report['commits']} commits of {report['repositories']} repositories"
              f" in {span:.0f} s (measured window + drain): {report['commits'] / span:.1f}"
              f" commits/s over {args.workers} workers, offered load permitting")  # fmt: skip
        ok = failures == 0 and not Shared.ws_errors and report["wrong"] == 0
        ok = ok and report["unfinished"] == 0
        return 0 if ok else 1
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if args.keep_log and (tmp / "var" / "up.log").exists():
            shutil.copy(tmp / "var" / "up.log", args.keep_log)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
