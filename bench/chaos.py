"""Chaos run: the whole system under SIGKILLed workers, restarted and flushed Redis masters.

Builds N local repositories (``git fast-import``, the synthetic shape of
``bench/analysis.py``: several files per commit, topic branches and merges; the last
repository is three times larger), starts 3 non-persistent ``redis-server`` nodes, runs
``manage.py up --workers 2`` against them with a fresh SQLite database, submits every
repository, then for the chaos phase, at random (seeded) intervals:

  - SIGKILLs a worker child of ``up``, one of its forked children (the work horse running
    a job when there is one), or a worker together with all its descendants (a host dying);
  - kills -9 one Redis master and restarts it empty (sometimes two at once: no quorum for
    a moment);
  - now and then FLUSHALLs every node;
  - kills -9 the queue node (``REDIS_URL``, which with this layout is lock master 1 too)
    for a few seconds and restarts it empty, or stalls it (SIGSTOP … SIGCONT).

All along, a prober requests the operations pages, ``/api/status``, ``/api/runs`` and
``/metrics`` (as the admin, by session and by API token) four times a second and counts
every 5xx answer: ``server_errors`` must be 0 — a lost or stalled queue server is a
banner and ``"queue_server": {"ok": false}``, never a 500.

Then it stops injecting, waits (bounded) until every repository is ready — dead letters
(crashes count as attempts, ``GITWARD_MAX_ATTEMPTS`` stays at its default of 3) are
retried with ``manage.py dlq retry --all`` and counted — and checks against git itself:
every commit reachable from HEAD stored exactly once, no extra commit, per-file rows of a
sample of commits equal to git's numstat, ``files_changed`` equal to the stored file rows
for every commit, no ``*.lock`` file or half-finished clone left in the workspace, no git
process left working on it, and no process of ``up``'s tree left once ``up`` stopped.

Last line (exit 0 iff nothing was lost, duplicated or left behind and all repositories
are ready)::

    chaos: runs=R attempts=A kills=K restarts=N flushes=F queue_kills=Q queue_stalls=T
           lost_work=0 duplicate_rows=0 server_errors=0 dead_letters_retried=D leftovers=0
           seconds=S

    .venv/bin/python bench/chaos.py [--minutes M | --seconds S] [--repos N] [--commits C]
        [--seed K] [--short] [--keep]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from http.cookiejar import CookieJar
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from siblings import sibling  # noqa: E402  (bench/ is the script's directory)

from bench.procstat import ProcStat, read_stat  # noqa: E402
from tests.support.sysproc import git_processes_under, wait_http  # noqa: E402
from workers.runtime.redis_server import RedisNode, free_port  # noqa: E402

EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"


def log(msg: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ------------------------------------------------------------------ repositories


def build_repositories(root: Path, count: int, commits: int, seed: int) -> list[Path]:
    synth = sibling("analysis")
    paths = []
    for i in range(count):
        path = root / f"repo{i}"
        size = commits * 3 if i == count - 1 else commits  # the last one is larger
        synth.build_repository(path, size, seed * 1000 + i)
        paths.append(path)
    return paths


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout


def git_files(repo: Path, sha: str) -> list[tuple[str, int, int]]:
    """(path, added, deleted) against the first parent, one git call per commit."""
    parents = git(repo, "rev-list", "--parents", "-n", "1", sha).split()[1:]
    base = parents[0] if parents else EMPTY_TREE
    raw = subprocess.run(
        ["git", "-C", str(repo), "diff-tree", "-r", "-z", "--numstat", "--no-renames", base, sha],
        check=True,
        capture_output=True,
    ).stdout.decode("utf-8", "replace")
    out = []
    for entry in raw.split("\0"):
        if entry:
            added, deleted, path = entry.split("\t", 2)
            binary = added == "-"
            out.append((path, 0 if binary else int(added), 0 if binary else int(deleted)))
    return sorted(out)


# ------------------------------------------------------------------ processes


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def process_table() -> dict[int, ProcStat]:
    table = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            st = read_stat(int(entry.name))
            if st is not None:
                table[int(entry.name)] = st
    return table


def descendants(pid: int, table: dict[int, ProcStat]) -> list[int]:
    children: dict[int, list[int]] = {}
    for p, st in table.items():
        children.setdefault(st.ppid, []).append(p)
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def kill_pid(pid: int, start: int) -> bool:
    """SIGKILL ``pid`` if it is still the process we saw (same start time)."""
    st = read_stat(pid)
    if st is None or st.start != start or st.state == "Z":
        return False
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


# ------------------------------------------------------------------ the prober


class Prober(threading.Thread):
    """Requests pages and API endpoints as the admin until stopped; counts answers by
    status. A refused connection (``up`` itself gone) is counted apart, not as a 5xx."""

    def __init__(self, base: str, password: str, token: str, repo_id: int) -> None:
        super().__init__(name="chaos-prober", daemon=True)
        self.base = base
        self.password = password
        self.token = token
        self.pages = ["/", "/locks/", "/repos/", f"/repos/{repo_id}/"]
        self.api = ["/api/status", "/api/runs", "/metrics", f"/api/repos/{repo_id}"]
        self.stop = threading.Event()
        self.statuses: dict[int, int] = {}
        self.errors: list[str] = []
        self.unreachable = 0
        self.slowest = 0.0
        self.queue_down_seen = 0
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(CookieJar()))

    def login(self) -> None:
        page = self.opener.open(self.base + "/login/", timeout=30).read().decode()
        match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
        assert match, "no CSRF token on the login page"
        form = urllib.parse.urlencode(
            {"username": "admin", "password": self.password, "csrfmiddlewaretoken": match[1]}
        ).encode()
        self.opener.open(self.base + "/login/", data=form, timeout=30).read()

    def fetch(self, path: str, *, api: bool) -> None:
        request = urllib.request.Request(self.base + path)
        if api:
            request.add_header("Authorization", f"Bearer {self.token}")
        start = time.monotonic()
        try:
            with self.opener.open(request, timeout=60) as response:
                status, body = response.status, response.read()
        except urllib.error.HTTPError as exc:
            status, body = exc.code, exc.read()
        except (urllib.error.URLError, OSError):
            self.unreachable += 1
            return
        self.slowest = max(self.slowest, time.monotonic() - start)
        self.statuses[status] = self.statuses.get(status, 0) + 1
        if b"queue server unreachable" in body:
            self.queue_down_seen += 1
        if status >= 500:
            self.errors.append(f"{status} {path}: {body[:200]!r}")

    def run(self) -> None:
        with contextlib.suppress(Exception):
            self.login()
        while not self.stop.is_set():
            for path in self.pages:
                self.fetch(path, api=False)
            for path in self.api:
                self.fetch(path, api=True)
            self.stop.wait(0.25)

    @property
    def server_errors(self) -> int:
        return sum(n for status, n in self.statuses.items() if status >= 500)


# ------------------------------------------------------------------ the run


class Chaos:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.tmp = Path(tempfile.mkdtemp(prefix="gitward-chaos-"))
        self.var = self.tmp / "var"
        self.db = self.var / "db.sqlite3"
        self.workspace = self.var / "workspace"
        self.nodes: list[RedisNode] = []
        self.up: subprocess.Popen[bytes] | None = None
        self.up_log = self.tmp / "up.log"
        # (pid, start time) -> parent pid, for every process ever seen in up's tree
        self.seen: dict[tuple[int, int], int] = {}
        self.counts = {
            "kills": 0,
            "restarts": 0,
            "flushes": 0,
            "no_quorum": 0,
            "queue_kills": 0,
            "queue_stalls": 0,
        }
        self.prober: Prober | None = None
        self.kill_kinds: dict[str, int] = {}
        self.dead_retried = 0
        self.pushed = 0  # commits appended to the origins while the system runs
        self.submits: list[subprocess.Popen[bytes]] = []
        self.env: dict[str, str] = {}

    # -------------------------------------------------------------- set-up

    def manage(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def start(self) -> list[tuple[Path, int]]:
        a = self.args
        t0 = time.monotonic()
        paths = build_repositories(self.tmp / "repos", a.repos, a.commits, a.seed)
        log(f"built {len(paths)} repositories in {time.monotonic() - t0:.1f}s under {self.tmp}")
        for i in range(3):
            self.nodes.append(RedisNode(self.tmp / "redis" / f"n{i}", persistent=False).start())
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("REDIS_URL", "GITWARD_", "DATABASE_URL"))
        }
        env.update(
            GITWARD_VAR_DIR=str(self.var),
            DATABASE_URL=f"sqlite:///{self.db}",
            GITWARD_LOCAL_ROOTS=str(self.tmp / "repos"),
            REDIS_URLS=",".join(n.url for n in self.nodes),
            GITWARD_ADMIN_PASSWORD="chaos-admin-pass-123",
            GITWARD_CHUNK_SIZE=str(a.chunk_size),
            GITWARD_RECONCILE_INTERVAL="1",
            GITWARD_WORKER_DEAD_AFTER="3",
            GITWARD_LOCK_TTL="3",
            GITWARD_RETRY_BACKOFF="0.2,0.5",
            GITWARD_MAX_ATTEMPTS=str(a.max_attempts),
            PYTHONUNBUFFERED="1",
        )
        if a.slow > 0:  # widen the window in which a work horse is busy (git streaming)
            env["GITWARD_FAILPOINTS"] = f"analyze.parsing=sleep:{a.slow:g}"
        self.env = env
        port = free_port()
        with open(self.up_log, "wb") as out:
            self.up = subprocess.Popen(
                [sys.executable, str(ROOT / "manage.py"), "up", "--port", str(port),
                 "--workers", str(a.workers)],
                env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        self._wait_http(f"http://127.0.0.1:{port}/login/")
        self._wait_workers(a.workers)
        log(f"up pid {self.up.pid} on port {port}, {a.workers} workers, nodes "
            f"{', '.join(str(n.port) for n in self.nodes)}")  # fmt: skip
        procs = [
            (p, subprocess.Popen(
                [sys.executable, str(ROOT / "manage.py"), "submit", str(p), "--json"],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
            for p in paths
        ]  # fmt: skip
        repos = []
        for path, proc in procs:
            out, err = proc.communicate(timeout=120)
            if proc.returncode != 0:
                raise RuntimeError(f"submit {path} failed: {err.strip()[-500:]}")
            repos.append((path, int(json.loads(out)["id"])))
        log(f"submitted {len(repos)} repositories")
        self.repo_paths = [p for p, _ in repos]
        token = self.manage("api_token", "admin").stdout.strip()
        self.prober = Prober(f"http://127.0.0.1:{port}", env["GITWARD_ADMIN_PASSWORD"],
                             token, repos[0][1])  # fmt: skip
        self.prober.start()
        return repos

    def append_commits(self, path: Path, n: int) -> None:
        """Push ``n`` new commits (3-6 files each, new and modified) onto main."""
        out = []
        for i in range(n):
            self.pushed += 1
            when = 1_800_000_000 + self.pushed * 60
            msg = f"live change {self.pushed}".encode()
            out.append(b"commit refs/heads/main\n")
            out.append(b"author Live Pusher <live@example.org> %d +0000\n" % when)
            out.append(b"committer Live Pusher <live@example.org> %d +0000\n" % when)
            out.append(b"data %d\n%s\n" % (len(msg), msg))
            if i == 0:
                out.append(b"from refs/heads/main^0\n")
            for name in self.rng.sample(range(12), self.rng.randint(3, 6)):
                body = "".join(
                    f"line {self.rng.randrange(50)} of {name}\n"
                    for _ in range(self.rng.randint(1, 25))
                ).encode()
                out.append(b"M 100644 inline live/file_%d.txt\n" % name)
                out.append(b"data %d\n%s\n" % (len(body), body))
        subprocess.run(
            ["git", "-C", str(path), "fast-import", "--quiet"],
            input=b"".join(out),
            check=True,
            capture_output=True,
        )

    def submit_async(self, path: Path) -> None:
        self.submits = [p for p in self.submits if p.poll() is None]
        self.submits.append(
            subprocess.Popen(
                [sys.executable, str(ROOT / "manage.py"), "submit", str(path), "--json"],
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )

    def _wait_http(self, url: str, timeout: float = 90) -> None:
        assert self.up is not None
        try:
            wait_http(url, self.up, timeout)  # type: ignore[arg-type]
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}:\n{self.tail()}") from None

    def _wait_workers(self, n: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(self.workers()) >= n:
                return
            time.sleep(0.2)
        raise RuntimeError("the worker pool never started")

    def tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.up_log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # -------------------------------------------------------------- processes of up

    def snapshot(self) -> dict[int, ProcStat]:
        table = process_table()
        if self.up is not None and self.up.poll() is None:
            for pid in descendants(self.up.pid, table):
                self.seen.setdefault((pid, table[pid].start), table[pid].ppid)
        return table

    def workers(self, table: dict[int, ProcStat] | None = None) -> list[int]:
        """The ``manage.py worker`` children of up."""
        table = table or self.snapshot()
        assert self.up is not None
        return [
            p
            for p, st in table.items()
            if st.ppid == self.up.pid and st.state != "Z" and b"worker" in _cmdline(p)
        ]

    def busy_pids(self) -> set[int]:
        with contextlib.suppress(sqlite3.Error):
            rows = self.query("SELECT pid FROM dashboard_jobrun WHERE state = 'running'")
            return {int(r[0]) for r in rows if r[0]}
        return set()

    # -------------------------------------------------------------- faults

    def kill_something(self) -> None:
        table = self.snapshot()
        workers = self.workers(table)
        if not workers:
            return
        worker = self.rng.choice(workers)
        children = [c for c in descendants(worker, table) if table[c].ppid == worker]
        busy = self.busy_pids() & set(children)
        roll = self.rng.random()
        if roll < 0.55 and (busy or children):
            victims, kind = (
                [self.rng.choice(sorted(busy or children))],
                "horse" if busy else "child",
            )
        elif roll < 0.8:
            victims, kind = [worker], "worker"
        else:  # the host dies: the worker and everything under it at once
            victims, kind = [worker, *descendants(worker, table)], "tree"
        hit = [v for v in victims if v in table and kill_pid(v, table[v].start)]
        if hit:
            self.counts["kills"] += 1
            self.kill_kinds[kind] = self.kill_kinds.get(kind, 0) + 1
            log(f"SIGKILL {kind} {hit}")

    def restart_redis(self, *, both: bool = False) -> None:
        victims = self.rng.sample(self.nodes, 2 if both else 1)
        for node in victims:
            node.kill()
        down = self.rng.uniform(1.0, 3.0) if both else self.rng.uniform(0.0, 1.0)
        log(f"killed Redis {[n.port for n in victims]}; down for {down:.1f}s")
        self.sleep(down)
        for node in victims:
            node.restart(empty=True)
            self.counts["restarts"] += 1
        if both:
            self.counts["no_quorum"] += 1

    def kill_queue_node(self) -> None:
        """SIGKILL the queue node (``REDIS_URL``; lock master 1 in this layout), keep it
        down for a while, restart it empty: every queued job in Redis is gone."""
        node = self.nodes[0]
        node.kill()
        down = self.rng.uniform(1.5, 4.0)
        log(f"killed the queue node {node.port}; down for {down:.1f}s")
        self.sleep(down)
        node.restart(empty=True)
        self.counts["queue_kills"] += 1

    def stall_queue_node(self) -> None:
        """SIGSTOP the queue node: its sockets stay open and nothing answers."""
        node = self.nodes[0]
        node.pause()
        stalled = self.rng.uniform(1.5, 4.0)
        log(f"stalled the queue node {node.port} for {stalled:.1f}s")
        try:
            self.sleep(stalled)
        finally:
            node.resume()
        self.counts["queue_stalls"] += 1

    def flush_all(self) -> None:
        for node in self.nodes:
            with contextlib.suppress(Exception):
                node.client(socket_timeout=2).flushall()
        self.counts["flushes"] += 1
        log("FLUSHALL on every node")

    def sleep(self, seconds: float) -> None:
        """Sleep, keeping the record of up's process tree fresh."""
        end = time.monotonic() + seconds
        while True:
            self.snapshot()
            left = end - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(0.1, left))

    def chaos(self, seconds: float) -> None:
        log(f"chaos for {seconds:g}s")
        deadline = time.monotonic() + seconds
        # one of each first (in a seeded order), so even a short run exercises all
        plan = ["kill", "restart", "kill", "flush", "queue_kill", "queue_stall"]
        self.rng.shuffle(plan)
        # The planned faults all run even if the last of them starts past the deadline.
        while time.monotonic() < deadline or plan:
            self.sleep(self.rng.uniform(0.4, 2.2))
            if time.monotonic() >= deadline and not plan:
                break
            if self.up is not None and self.up.poll() is not None:
                raise RuntimeError(f"up died during chaos:\n{self.tail()}")
            if self.rng.random() < 0.4:  # keep work flowing: push and re-submit
                path = self.rng.choice(self.repo_paths)
                self.append_commits(path, self.rng.randint(5, 30))
                self.submit_async(path)
            if plan:
                action = plan.pop()
            else:
                action = self.rng.choices(
                    ["kill", "restart", "restart2", "flush", "queue_kill", "queue_stall"],
                    weights=[50, 25, 5, 8, 6, 6],
                )[0]
            if action == "kill":
                self.kill_something()
            elif action == "restart":
                self.restart_redis()
            elif action == "restart2":
                self.restart_redis(both=True)
            elif action == "queue_kill":
                self.kill_queue_node()
            elif action == "queue_stall":
                self.stall_queue_node()
            else:
                self.flush_all()

    # -------------------------------------------------------------- database (read-only)

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        conn = sqlite3.connect(self.db, timeout=30)
        try:
            return conn.execute(sql, params).fetchall()
        finally:
            conn.close()

    def wait_ready(self, repos: list[tuple[Path, int]], timeout: float) -> bool:
        """Until every repository is ready at its origin's current head and no run is
        pending. A repository pushed to while it was being analysed is re-submitted once
        ready (a submission in progress is a no-op by design); dead letters are retried."""
        log(f"waiting up to {timeout:g}s for every repository to be ready")
        deadline = time.monotonic() + timeout
        heads = {rid: git(path, "rev-parse", "HEAD").strip() for path, rid in repos}
        paths = {rid: path for path, rid in repos}
        marks = ",".join("?" * len(repos))
        rows: list[tuple[Any, ...]] = []
        while time.monotonic() < deadline:
            self.sleep(0.5)
            if self.up is not None and self.up.poll() is not None:
                log(f"up exited:\n{self.tail()}")
                return False
            if any(proc.poll() is None for proc in self.submits):
                continue
            dead = self.query("SELECT COUNT(*) FROM dashboard_jobrun WHERE state = 'dead'")[0][0]
            if dead:
                out = self.manage("dlq", "retry", "--all")
                match = re.search(r"(\d+) runs re-queued", out.stdout)
                moved = int(match.group(1)) if match else 0
                self.dead_retried += moved
                log(f"dlq retry --all: {moved} dead runs re-queued {out.stderr.strip()[-200:]}")
                continue
            rows = self.query(
                f"SELECT id, status, head, error FROM dashboard_repository WHERE id IN ({marks})",
                tuple(heads),
            )
            behind = [r[0] for r in rows if r[1] == "ready" and r[2] != heads[r[0]]]
            if behind:
                log(f"re-submitting repositories behind their origin: {behind}")
                for rid in behind:
                    self.submit_async(paths[rid])
                continue
            if len(rows) == len(heads) and all(r[1] == "ready" for r in rows):
                pending = self.query(
                    "SELECT COUNT(*) FROM dashboard_jobrun "
                    "WHERE state IN ('queued', 'running', 'failed')"
                )[0][0]
                if not pending:
                    return True
        log(f"not ready after {timeout:g}s: {rows}")
        log(f"runs: {self.query('SELECT state, COUNT(*) FROM dashboard_jobrun GROUP BY 1')}")
        self.diagnose()
        return False

    def diagnose(self) -> None:
        """Where the RQ job of every unfinished run is (the queues live on node 0)."""
        with contextlib.suppress(Exception):
            r = self.nodes[0].client(socket_timeout=2, decode_responses=True)
            for run_id, job_id, state, attempts, queue in self.query(
                "SELECT id, job_id, state, attempts, queue FROM dashboard_jobrun "
                "WHERE state NOT IN ('succeeded', 'dead', 'discarded')"
            ):
                rq_id = f"{job_id}-a{attempts + 1}"
                status = r.hget(f"rq:job:{rq_id}", "status")
                queued = r.lpos(f"rq:queue:{queue}", rq_id) is not None
                scheduled = r.zscore(f"rq:scheduled:{queue}", rq_id) is not None
                log(f"run {run_id} {state} attempts={attempts}: rq job {rq_id} status={status} "
                    f"in_queue={queued} scheduled={scheduled} "
                    f"scheduler_lock={r.exists(f'rq:scheduler-lock:{queue}')}")  # fmt: skip

    # -------------------------------------------------------------- invariants

    def verify(self, repos: list[tuple[Path, int]]) -> dict[str, int]:
        found = {"lost_work": 0, "extra_commits": 0, "duplicate_rows": 0, "file_mismatches": 0,
                 "files_changed_mismatches": 0, "sampled": 0}  # fmt: skip
        for path, repo_id in repos:
            fp = self.query("SELECT fingerprint FROM dashboard_repository WHERE id = ?", (repo_id,))
            fingerprint = fp[0][0]
            expected = set(git(path, "rev-list", "HEAD").split())
            count = int(git(path, "rev-list", "--count", "HEAD"))
            assert count == len(expected)
            stored = self.query(
                "SELECT id, sha FROM dashboard_commit WHERE repository_id = ? AND fingerprint = ?",
                (repo_id, fingerprint),
            )
            shas = {sha for _, sha in stored}
            lost, extra = expected - shas, shas - expected
            found["lost_work"] += len(lost)
            found["extra_commits"] += len(extra)
            if lost or extra or len(stored) != count:
                log(f"repository {repo_id}: git has {count} commits, stored {len(stored)} rows "
                    f"({len(lost)} missing, {len(extra)} extra)")  # fmt: skip
            by_sha = {sha: pk for pk, sha in stored}
            sample = sorted(shas & expected)
            sample = self.rng.sample(sample, min(self.args.sample, len(sample)))
            for sha in sample:
                rows = self.query(
                    "SELECT path, added, deleted FROM dashboard_filechange WHERE commit_id = ?",
                    (by_sha[sha],),
                )
                if sorted(rows) != git_files(path, sha):
                    found["file_mismatches"] += 1
                    log(f"repository {repo_id} commit {sha}: file rows differ from git")
            found["sampled"] += len(sample)
        found["duplicate_rows"] = sum(
            n - 1
            for *_, n in self.query(
                "SELECT repository_id, fingerprint, sha, COUNT(*) FROM dashboard_commit "
                "GROUP BY 1, 2, 3 HAVING COUNT(*) > 1"
            )
        )
        found["files_changed_mismatches"] = len(
            self.query(
                "SELECT c.id FROM dashboard_commit c LEFT JOIN dashboard_filechange f "
                "ON f.commit_id = c.id GROUP BY c.id HAVING COUNT(f.id) != c.files_changed"
            )
        )
        return found

    def workspace_leftovers(self) -> list[str]:
        out = [str(p) for p in self.workspace.rglob("*.lock")] if self.workspace.exists() else []
        tmp = self.workspace / "tmp"
        if tmp.exists():
            out += [str(p) for p in tmp.iterdir()]
        deadline = time.monotonic() + 10  # a job that just ended may still be reaping git
        while (pids := git_processes_under(self.workspace)) and time.monotonic() < deadline:
            time.sleep(0.1)
        out += [f"git pid {p}: {_cmdline(p)[:200]!r}" for p in pids]
        return out

    def stop_up(self) -> list[str]:
        """SIGTERM up (kill its session if it hangs); then any process ever seen in its
        tree still alive 10 s later is an orphan (reported, then killed)."""
        if self.up is None:
            return []
        if self.up.poll() is None:
            self.snapshot()
            self.up.send_signal(signal.SIGTERM)
            try:
                self.up.wait(timeout=90)
            except subprocess.TimeoutExpired:
                log("up did not stop within 90s; killing its session")
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.up.pid, signal.SIGKILL)
                self.up.wait(timeout=10)
        log(f"up exited with {self.up.returncode}")
        left = []
        deadline = time.monotonic() + 10
        while True:
            alive = [
                k
                for k in self.seen
                if (st := read_stat(k[0])) and st.start == k[1] and st.state != "Z"
            ]
            if not alive or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        for pid, start in alive:
            left.append(f"pid {pid} (child of {self.seen[pid, start]}) outlived up: "
                        f"{_cmdline(pid)[:200]!r}")  # fmt: skip
            kill_pid(pid, start)
        return left

    def stop_prober(self) -> int:
        """Stop the prober; log what it saw; return the number of 5xx answers."""
        p = self.prober
        if p is None:
            return -1
        p.stop.set()
        p.join(timeout=120)
        log(f"prober: statuses {dict(sorted(p.statuses.items()))}, unreachable {p.unreachable}, "
            f"'queue server unreachable' shown {p.queue_down_seen} times, "
            f"slowest {p.slowest:.2f}s")  # fmt: skip
        for line in p.errors[:20]:
            log(f"server error: {line}")
        return p.server_errors

    def cleanup(self) -> None:
        if self.prober is not None:
            self.prober.stop.set()
        for proc in self.submits:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self.up is not None and self.up.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.up.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.up.wait(timeout=10)
        for node in self.nodes:
            with contextlib.suppress(Exception):
                node.kill()
        if self.args.keep:
            log(f"kept {self.tmp}")
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=None, help="chaos phase length")
    parser.add_argument("--seconds", type=float, default=None, help="chaos phase length")
    parser.add_argument("--repos", type=int, default=None)
    parser.add_argument("--commits", type=int, default=None, help="per repository (last: 3x)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--short", action="store_true", help="3 repos x ~80 commits, 20s")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--chunk-size", type=int, default=None)
    parser.add_argument("--max-attempts", type=int, default=3, help="GITWARD_MAX_ATTEMPTS")
    parser.add_argument("--wait", type=float, default=180.0, help="seconds to wait for ready")
    parser.add_argument("--sample", type=int, default=40, help="commits per repo checked")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument(
        "--slow", type=float, default=0.4, help="seconds each analyze job pauses mid-stream"
    )
    args = parser.parse_args(argv)
    args.repos = args.repos or (3 if args.short else 4)
    args.commits = args.commits or (80 if args.short else 300)
    args.chunk_size = args.chunk_size or (10 if args.short else 50)
    if args.seconds is not None:
        seconds = args.seconds
    elif args.minutes is not None:
        seconds = args.minutes * 60
    else:
        seconds = 20.0 if args.short else 60.0
    started = time.monotonic()
    run = Chaos(args)
    ok = ready = False
    found: dict[str, int] = {}
    leftovers: list[str] = []
    orphans: list[str] = []
    totals = (-1, -1)
    server_errors = -1
    try:
        repos = run.start()
        run.chaos(seconds)
        pending = run.query("SELECT COUNT(*) FROM dashboard_jobrun WHERE state != 'succeeded'")
        log(f"chaos over: {run.counts}, kills by kind {run.kill_kinds}, "
            f"{pending[0][0]} runs not yet succeeded")  # fmt: skip
        ready = run.wait_ready(repos, args.wait)
        server_errors = run.stop_prober()
        found = run.verify(repos)
        leftovers = run.workspace_leftovers()
        orphans = run.stop_up()
        leftovers += [f"git pid {p}" for p in git_processes_under(run.workspace)]
        totals = (
            run.query("SELECT COUNT(*) FROM dashboard_jobrun")[0][0],
            run.query("SELECT COUNT(*) FROM dashboard_jobattempt")[0][0],
        )
        outcomes = run.query("SELECT outcome, COUNT(*) FROM dashboard_jobattempt GROUP BY 1")
        log(f"attempt outcomes: {dict(outcomes)}; checks: {found}")
        tracebacks = run.up_log.read_text(errors="replace").count("Traceback (most recent")
        log(f"tracebacks in up's log: {tracebacks}")
        for item in leftovers:
            log(f"leftover: {item}")
        for item in orphans:
            log(f"orphan (not counted in leftovers): {item}")
        ok = (
            ready
            and found["lost_work"] == 0
            and found["duplicate_rows"] == 0
            and found["extra_commits"] == 0
            and found["file_mismatches"] == 0
            and found["files_changed_mismatches"] == 0
            and server_errors == 0
            and not leftovers
        )
        if not ok:
            log(f"FAILED; last lines of up's log:\n{run.tail()}")
    except Exception as exc:
        log(f"FAILED: {type(exc).__name__}: {exc}")
        with contextlib.suppress(Exception):
            log(f"last lines of up's log:\n{run.tail()}")
    finally:
        with contextlib.suppress(Exception):
            if run.up is not None and run.up.poll() is None:
                orphans += run.stop_up()
        run.cleanup()
    print(
        f"chaos-details: ready={ready} extra_commits={found.get('extra_commits', -1)} "
        f"file_mismatches={found.get('file_mismatches', -1)} "
        f"files_changed_mismatches={found.get('files_changed_mismatches', -1)} "
        f"sampled={found.get('sampled', 0)} orphans={len(orphans)} pushed={run.pushed} "
        f"no_quorum={run.counts['no_quorum']} kill_kinds={run.kill_kinds}",
        flush=True,
    )
    print(
        f"chaos: runs={totals[0]} attempts={totals[1]} kills={run.counts['kills']} "
        f"restarts={run.counts['restarts']} flushes={run.counts['flushes']} "
        f"queue_kills={run.counts['queue_kills']} queue_stalls={run.counts['queue_stalls']} "
        f"lost_work={found.get('lost_work', -1)} duplicate_rows={found.get('duplicate_rows', -1)} "
        f"server_errors={server_errors} "
        f"dead_letters_retried={run.dead_retried} leftovers={len(leftovers)} "
        f"seconds={time.monotonic() - started:.0f}",
        flush=True,
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
