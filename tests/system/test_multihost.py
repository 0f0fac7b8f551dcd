"""Several "hosts" analysing together, as real processes (docs/operations.md).

Three independent Redis lock masters and a separate queue Redis; three hosts, each a
``manage.py worker`` process tree with its own workspace and its own ``git`` on PATH (a
wrapper that logs every call and, at every fetch, reads the mirror locks off the
masters); two web servers (``manage.py up --workers 0``, the second with
``--web-workers 2``: two uvicorn processes on one port) on one shared database (SQLite,
or PostgreSQL with ``DATABASE_URL``, as CI's second pass runs it). Repositories go in
through web #1's API while a websocket client and a headless Chromium watch web #2. One
host is SIGKILLed (all its processes at once) while it holds work; nothing is lost.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from http.cookiejar import CookieJar
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from dashboard.models import ApiToken, Commit, JobAttempt, JobRun, Repository
from tests.support.gitrepo import GitRepo, reference_commits
from tests.support.sysproc import (
    CHROMIUM,
    CHROMIUM_ARGS,
    children,
    git_processes_under,
    proc_state,
    wait_http,
)
from tests.system.test_pipeline import assert_matches_git
from workers.runtime.redis_server import RedisNode, free_port

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.timeout(600),
]

#: host name -> worker processes on it (``manage.py worker --workers N``).
HOSTS = {"h1": 2, "h2": 1, "h3": 2}
VICTIM = "h3"
REPOS = 12
PASSWORD = "multi-host-pass-123"


def wait_for(cond: Callable[[], Any], what: str, timeout: float = 180) -> Any:
    """Poll ``cond`` until it returns something truthy, for at most ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def descendants(pid: int) -> set[int]:
    out: set[int] = set()
    todo = [pid]
    while todo:
        for child in children(todo.pop()):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def freeze_host(root: int) -> set[int]:
    """SIGSTOP the host's whole process tree (repeated until no new process appears, so
    nothing forks meanwhile) and wait until every one of them is stopped. Returns the
    pids frozen."""
    frozen: set[int] = set()
    for _ in range(50):
        new = ({root} | descendants(root)) - frozen
        if not new:
            break
        for pid in new:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        frozen |= new
    wait_for(
        lambda: all(proc_state(pid) in {"T", "t", "Z", "gone"} for pid in frozen),
        "the host's processes to stop",
        30,
    )
    return frozen


def thaw_host(frozen: set[int]) -> None:
    for pid in frozen:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def kill_host(frozen: set[int]) -> set[int]:
    """The host dies: SIGKILL every process of its frozen tree at once, by pid."""
    for pid in frozen:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return frozen


def database_url() -> str:
    """The test database pytest-django set up (a file for SQLite), for subprocesses."""
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{db['NAME']}"
    auth = urllib.parse.quote(db["USER"] or "postgres")
    if db.get("PASSWORD"):
        auth += ":" + urllib.parse.quote(db["PASSWORD"])
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


GIT_WRAPPER = """#!/bin/sh
# One host's git: log the call, and at a fetch what the lock masters hold, then run git.
printf '%s\\t%s\\t%s\\t%s\\n' "$PPID" "$PWD" "${{GIT_DIR-}}" "$*" >> {log}/calls.log
case " $* " in
*" fetch "*)
  out={log}/fetch-$$-$(date +%s%N)
  {{
    printf 'ppid\\t%s\\n' "$PPID"
    printf 'args\\t%s\\n' "$*"
    for port in {ports}; do
      for key in $(redis-cli -p "$port" --scan --pattern 'locks:git:repo:*:mirror'); do
        printf 'lock\\t%s\\t%s\\t%s\\n' "$port" "$key" "$(redis-cli -p "$port" GET "$key")"
      done
    done
  }} > "$out.tmp"
  mv "$out.tmp" "$out"
  ;;
esac
exec {git} "$@"
"""


class Host:
    """One machine: a worker process tree, its workspace and its git log."""

    def __init__(self, base: Path, name: str, workers: int, masters: list[RedisNode]) -> None:
        self.name = name
        self.workers = workers
        self.root = base / name
        self.workspace = self.root / "workspace"
        self.log = self.root / "gitlog"
        self.bin = self.root / "bin"
        for d in (self.workspace, self.log, self.bin):
            d.mkdir(parents=True)
        wrapper = self.bin / "git"
        wrapper.write_text(
            GIT_WRAPPER.format(
                log=self.log,
                ports=" ".join(str(m.port) for m in masters),
                git=shutil.which("git"),
            )
        )
        wrapper.chmod(0o755)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, env: dict[str, str]) -> None:
        env = {
            **env,
            "PATH": f"{self.bin}:{env['PATH']}",
            "GITWARD_WORKSPACE": str(self.workspace),
            "GITWARD_VAR_DIR": str(self.root / "var"),
        }
        with open(self.root / "worker.log", "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, str(ROOT / "manage.py"), "worker", "--workers",
                 str(self.workers)],
                env=env, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def fetches(self) -> list[dict[str, Any]]:
        """Every fetch this host's git ran: parent pid, arguments, and the mirror locks
        each master held at that moment (key -> holder JSON per port)."""
        out = []
        for path in sorted(self.log.glob("fetch-*")):
            if path.suffix == ".tmp":
                continue
            record: dict[str, Any] = {"locks": {}}
            for line in path.read_text().splitlines():
                kind, _, rest = line.partition("\t")
                if kind == "ppid":
                    record["ppid"] = int(rest)
                elif kind == "args":
                    record["args"] = rest
                elif kind == "lock":
                    port, key, value = rest.split("\t", 2)
                    record["locks"].setdefault(key, {})[port] = value
            out.append(record)
        return out

    def calls(self) -> list[str]:
        path = self.log / "calls.log"
        return path.read_text().splitlines() if path.exists() else []

    def mirrors(self) -> set[int]:
        return {int(p.name.split(".")[0]) for p in (self.workspace / "mirrors").glob("*.git")}


def holder_of(value: str) -> dict[str, Any]:
    """The holder JSON of a lock value (``{"nonce": …, …}``)."""
    return json.loads(value)  # type: ignore[no-any-return]


class LiveClient(threading.Thread):
    """An operator's websocket on web #2, collecting every event it is sent."""

    def __init__(self, base: str, cookie: str) -> None:
        super().__init__(daemon=True)
        self.url = base.replace("http://", "ws://") + "/ws/ops/"
        self.origin = base
        self.cookie = cookie
        self.events: list[dict[str, Any]] = []
        self.snapshots = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        from websockets.sync.client import connect

        try:
            with connect(
                self.url,
                origin=self.origin,  # type: ignore[arg-type]
                additional_headers={"Cookie": self.cookie},
                open_timeout=20,
            ) as ws:
                while not self.stop.is_set():
                    try:
                        raw = ws.recv(timeout=0.5)
                    except TimeoutError:
                        continue
                    msg = json.loads(raw)
                    if msg["type"] == "snapshot":
                        self.snapshots += 1
                    elif msg["type"] == "events":
                        self.events.extend(msg["events"])
        except BaseException as exc:  # reported by the test
            self.error = exc


class BrowserView(threading.Thread):
    """The overview of web #2 in a real headless Chromium, counting the lock events its
    activity feed shows. In a thread of its own: Playwright's sync API runs an event
    loop, under which Django refuses the test's own database queries."""

    ITEMS = "#activity-list li[data-type='lock.acquired']"

    def __init__(self, base: str) -> None:
        super().__init__(daemon=True)
        self.base = base
        self.ready = threading.Event()
        self.stop = threading.Event()
        self.before = -1
        self.lock_items = 0
        self.not_reloaded: bool | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        from playwright.sync_api import expect, sync_playwright

        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                try:
                    page = browser.new_page()
                    page.goto(f"{self.base}/login/")
                    page.fill("input[name=username]", "admin")
                    page.fill("input[name=password]", PASSWORD)
                    page.click("button[type=submit]")
                    page.wait_for_url(f"{self.base}/")
                    expect(page.locator("#live-state")).to_have_text("live", timeout=30000)
                    page.evaluate("window.__notReloaded = true")
                    self.before = page.locator(self.ITEMS).count()
                    self.ready.set()
                    while not self.stop.is_set():
                        self.lock_items = page.locator(self.ITEMS).count()
                        self.not_reloaded = page.evaluate("window.__notReloaded === true")
                        page.wait_for_timeout(200)  # polling what the page shows
                finally:
                    browser.close()
        except BaseException as exc:  # reported by the test
            self.error = exc
            self.ready.set()


def log_in(base: str) -> str:
    """Log in through the login form of ``base``; return the Cookie header."""
    jar = CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    with opener.open(f"{base}/login/", timeout=20) as res:
        res.read()
    csrf = next(c.value for c in jar if c.name == "csrftoken")
    form = urllib.parse.urlencode(
        {"username": "admin", "password": PASSWORD, "csrfmiddlewaretoken": csrf}
    ).encode()
    req = urllib.request.Request(f"{base}/login/", data=form, headers={"Referer": f"{base}/login/"})
    with opener.open(req, timeout=20) as res:
        assert res.status == 200 and "/login/" not in res.geturl(), res.geturl()
    assert any(c.name == "sessionid" for c in jar)
    return "; ".join(f"{c.name}={c.value}" for c in jar)


def api(base: str, token: str, path: str, body: dict[str, Any] | None = None) -> Any:
    req = urllib.request.Request(
        f"{base}{path}",
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as res:
        return json.loads(res.read())


def make_origin(root: Path, index: int) -> GitRepo:
    """A repository of 12..34 commits over a few files; every third one has a merge."""
    repo = GitRepo.create(root / f"origin{index:02d}")
    for i in range(12 + 2 * index):
        repo.commit(f"r{index} change {i}", {f"src/m{i % 4}.py": f"x = {i}\n" * (i % 6 + 1)})
    if index % 3 == 0:
        repo.git("checkout", "--quiet", "-b", "side")
        repo.commit(f"r{index} side", {"side.txt": "side\n", "src/m0.py": "side = 1\n"})
        repo.git("checkout", "--quiet", "main")
        repo.commit(f"r{index} main", {"main.txt": "main\n"})
        repo.git("merge", "--quiet", "--no-ff", "-m", f"r{index} merge", "side")
    return repo


def stop_all(procs: list[subprocess.Popen[Any]]) -> None:
    """SIGTERM our processes (and, after a bounded wait, SIGKILL what is left of their
    trees), by pid."""
    trees = {p.pid: descendants(p.pid) for p in procs if p.poll() is None}
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 60
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)
    for pids in trees.values():
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_hosts_share_the_work_and_one_dying_loses_nothing(tmp_path: Path) -> None:
    base = tmp_path / "cluster"
    masters = [RedisNode(base / f"lock{i}").start() for i in range(3)]
    queue = RedisNode(base / "queue").start()
    origins = tmp_path / "origins"
    repos = [make_origin(origins, i) for i in range(REPOS)]
    user = get_user_model().objects.create_superuser("admin", "", PASSWORD)
    _, token = ApiToken.issue(user)

    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GITWARD_", "REDIS_URL", "DATABASE_URL"))}  # fmt: skip
    env.update(
        DATABASE_URL=database_url(),
        REDIS_URLS=",".join(m.url for m in masters),
        REDIS_URL=queue.url,  # queues and the channel layer, apart from the lock masters
        GITWARD_SECRET_KEY="multi-host-test-secret-key-" + "x" * 40,
        GITWARD_LOCAL_ROOTS=str(origins),
        GITWARD_CHUNK_SIZE="4",
        GITWARD_CHUNK_MAX="4",  # fixed targets: several chunks for every repository
        GITWARD_LOCK_TTL="5",
        GITWARD_WORKER_DEAD_AFTER="4",
        GITWARD_RECONCILE_INTERVAL="1",
        GITWARD_RETRY_BACKOFF="0.2,0.2",
        GITWARD_RATE_SUBMIT_PER_MINUTE="0",
        # every host here has the same machine name: mirror affinity (and its own
        # three-host test) is tests/system/test_fetch_hosts.py
        GITWARD_AFFINITY_WAIT="0",
        PYTHONUNBUFFERED="1",
    )
    hosts = {name: Host(base, name, n, masters) for name, n in HOSTS.items()}
    procs: list[subprocess.Popen[Any]] = []
    live: LiveClient | None = None
    view: BrowserView | None = None
    try:
        webs = []
        for i in (1, 2):
            port = free_port()
            (base / f"web{i}").mkdir()
            with open(base / f"web{i}" / "up.log", "wb") as out:
                proc = subprocess.Popen(
                    [sys.executable, str(ROOT / "manage.py"), "up", "--port", str(port),
                     "--workers", "0", "--web-workers", str(i)],
                    env={**env, "GITWARD_VAR_DIR": str(base / f"web{i}")},
                    stdout=out, stderr=subprocess.STDOUT,
                )  # fmt: skip
            procs.append(proc)
            webs.append((f"http://127.0.0.1:{port}", proc))
        for url, proc in webs:
            wait_http(f"{url}/login/", proc, timeout=120)
        (web1, _), (web2, _) = webs

        # The operator watches web #2 only: a websocket client that records every
        # event, and the overview in a real headless Chromium (its activity feed).
        live = LiveClient(web2, log_in(web2))
        live.start()
        wait_for(lambda: live.snapshots or live.error, "the live view's snapshot", 30)
        assert live.error is None, live.error
        view = BrowserView(web2)
        view.start()
        wait_for(view.ready.is_set, "the browser's live overview", 60)
        assert view.error is None, view.error
        assert view.before == 0  # no worker has run yet

        # The victim is a slow host: it holds its chunk locks a while, so it is surely
        # mid-job when it dies.
        for name, host in hosts.items():
            extra = {"GITWARD_FAILPOINTS": "analyze.locked=sleep:1.5"} if name == VICTIM else {}
            host.start({**env, **extra})
            assert host.proc is not None
            procs.append(host.proc)

        submitted = {}
        for origin in repos:
            body = api(web1, token, "/api/repos", {"url": str(origin.path)})
            submitted[body["id"]] = origin
        assert len(submitted) == REPOS

        # Mid-run: some repository is done, and the victim is running an analysis.
        victim = hosts[VICTIM]
        assert victim.proc is not None

        def victim_busy() -> bool:
            tree = {victim.proc.pid} | descendants(victim.proc.pid)  # type: ignore[union-attr]
            return JobRun.objects.filter(kind="analyze", state="running", pid__in=tree).exists()

        # Frozen, the host can neither finish its job nor start another, so what the
        # database says then is what it holds when it dies. (Checking first and freezing
        # after was flaky under load: the job could end in between, and no attempt of
        # the victim was left to crash.) If it was between jobs, thaw it and try again.
        for _ in range(20):
            wait_for(
                lambda: Repository.objects.filter(status="ready").exists() and victim_busy(),
                "the victim host to be mid-job",
            )
            frozen = freeze_host(victim.proc.pid)
            if victim_busy():
                break
            thaw_host(frozen)
        else:
            raise AssertionError("the victim host was never frozen mid-job")
        assert Repository.objects.exclude(status="ready").exists(), "too late: all done"
        killed = kill_host(frozen)
        victim.proc.wait(timeout=10)
        assert len(killed) >= 1 + HOSTS[VICTIM]  # the pool and its worker processes

        def all_ready() -> bool:
            return Repository.objects.filter(status="ready").count() == REPOS

        wait_for(all_ready, "every repository to be analysed", 300)
        failed = Repository.objects.exclude(status="ready").values_list("url", "error")
        assert not failed, list(failed)

        # 1. Every repository is complete, each commit stored once, equal to git.
        for repo_id, origin in submitted.items():
            repo = Repository.objects.get(pk=repo_id)
            want = reference_commits(origin.path)
            stored = Commit.objects.filter(repository=repo)
            assert stored.count() == len(want), repo.name
            assert stored.values("fingerprint", "sha").distinct().count() == len(want)
            assert_matches_git(repo, origin.path)
        assert not JobRun.objects.exclude(state=JobRun.State.SUCCEEDED).exists()

        # 2. The victim really died with work in hand, and its work was redone elsewhere.
        crashed = JobAttempt.objects.filter(outcome="crashed")
        assert crashed.filter(pid__in=killed).exists()
        assert not JobAttempt.objects.filter(pid__in=killed, outcome="running").exists()

        # 3. Every fetch ran under its mirror lock: when git started, a majority of the
        #    masters named the fetching process (git's parent) as the holder of exactly
        #    that repository's mirror lock.
        by_origin = {str(o.path): rid for rid, o in submitted.items()}
        fetched: dict[str, set[int]] = {}
        for name, host in hosts.items():
            fetched[name] = set()
            for f in host.fetches():
                repo_id = next(rid for path, rid in by_origin.items() if f" {path} " in f["args"])
                fetched[name].add(repo_id)
                key = f"locks:git:repo:{repo_id}:mirror"
                holders = [holder_of(v) for v in f["locks"].get(key, {}).values()]
                mine = [h for h in holders if h["pid"] == f["ppid"]]
                assert len(mine) >= 2, (name, key, f)  # a majority of 3
                assert len({h["nonce"] for h in mine}) == 1  # one acquisition
                assert mine[0]["job"].startswith(("sync-", "analyze-")), mine[0]
                assert f" --git-dir {host.workspace}/" in f["args"], f["args"]
        every_fetch = set().union(*fetched.values())
        assert every_fetch == set(submitted)  # every repository was fetched somewhere
        survivors = [h for n, h in hosts.items() if n != VICTIM]
        assert all(fetched[h.name] for h in survivors), fetched  # both survivors worked

        # 4. No host touched another's workspace: its git calls name only its own, and
        #    its workspace holds only mirrors it fetched itself.
        for name, host in hosts.items():
            others = [str(h.workspace) for n, h in hosts.items() if n != name]
            calls = host.calls()
            assert calls or name == VICTIM
            for line in calls:
                assert not any(o in line for o in others), (name, line)
            assert host.mirrors() <= fetched[name], (name, host.mirrors(), fetched[name])

        # 5. The websocket on web #2 received what the workers did while web #1 took the
        #    submissions: progress of every repository (published by the worker after
        #    each chunk's write) and locks taken by worker processes, never by a web one.
        #    (Not "ready" for all: the reconciler or a retry that finds a chunk already
        #    stored can, today, complete a repository without publishing repo.changed.)
        def progressed() -> set[int]:
            return {
                e["repo"]
                for e in list(live.events)  # type: ignore[union-attr]
                if e["type"] == "job.progress" and e["analyzed"] > 0
            }

        wait_for(lambda: progressed() == set(submitted), "web #2 to show every repository", 30)
        lock_pids = {e["pid"] for e in live.events if e["type"] == "lock.acquired"}
        worker_pids = set(JobAttempt.objects.values_list("pid", flat=True))
        assert lock_pids and lock_pids <= worker_pids
        web_pids = {p.pid for _, p in webs} | {c for _, p in webs for c in descendants(p.pid)}
        assert not lock_pids & web_pids
        assert live.error is None, live.error
        # ...and the browser on web #2 shows locks the workers took, without a reload.
        wait_for(lambda: view.lock_items or view.error, "the browser to show a lock", 30)
        assert view.error is None, view.error
        assert view.not_reloaded is True

        # 6. Nothing of git is left running on any host.
        wait_for(lambda: not git_processes_under(base), "git processes to end", 30)
    finally:
        if view is not None:
            view.stop.set()
            view.join(timeout=30)
        if live is not None:
            live.stop.set()
            live.join(timeout=10)
        stop_all(procs)
        for node in [*masters, queue]:
            node.kill()


def test_up_refuses_fewer_than_one_web_worker(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITWARD_", "REDIS_URL"))}
    env["GITWARD_VAR_DIR"] = str(tmp_path)
    result = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "up", "--web-workers", "0"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode != 0
    assert (
        result.stderr.strip().splitlines()[-1] == "CommandError: --web-workers must be at least 1"
    )
