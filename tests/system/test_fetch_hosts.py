"""Per-git-host fetch limits and mirror affinity across three worker hosts, as real
processes (docs/scheduling.md).

A loopback git server (``git http-backend`` behind a small threaded HTTP server on
127.0.0.2, allowed by ``GITWARD_ALLOWED_HOSTS_NETS``) counts the upload-packs it runs at
once; three ``manage.py worker`` process trees with their own ``GITWARD_HOST_ID`` and
workspace fetch from it. The server can also refuse every request with HTTP 429 and a
``Retry-After``.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from dashboard.infra import queues
from dashboard.models import JobAttempt, JobRun, Repository
from dashboard.repositories.lifecycle import submit_repository
from tests.support.checked_threads import CheckedThread
from tests.support.gitrepo import GitRepo
from tests.system.test_multihost import (
    database_url,
    descendants,
    make_origin,
    stop_all,
    wait_for,
)
from workers.git.fetch_limits import host_status
from workers.runtime.redis_server import RedisNode, free_port

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.timeout(900),
]

SERVER_HOST = "127.0.0.2"
CAP = 2


class GitServer(ThreadingHTTPServer):
    """Smart HTTP over ``git http-backend``; counts concurrent upload-packs, can refuse."""

    daemon_threads = True

    def __init__(self, root: Path, *, delay: float = 0.0) -> None:
        super().__init__((SERVER_HOST, free_port()), Handler)
        self.root = root
        self.delay = delay
        self.guard = threading.Lock()
        self.inside = 0
        self.peak = 0
        self.packs = 0
        self.retry_after: int | None = None  # set: every request is refused with 429
        self.refused: list[float] = []
        self.requests: list[float] = []
        #: repository name -> event its upload-packs wait for (a fetch that hangs)
        self.blocked: dict[str, threading.Event] = {}

    def url(self, name: str) -> str:
        return f"http://{SERVER_HOST}:{self.server_port}/{name}"


class Handler(BaseHTTPRequestHandler):
    server: GitServer

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def _serve(self) -> None:
        srv = self.server
        srv.requests.append(time.time())
        if srv.retry_after is not None:
            srv.refused.append(time.time())
            body = f"Retry-After: {srv.retry_after}\n".encode()
            self.send_response(429)
            self.send_header("Retry-After", str(srv.retry_after))
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        path, _, query = self.path.partition("?")
        pack = path.endswith("/git-upload-pack")
        if pack:
            with srv.guard:
                srv.inside += 1
                srv.packs += 1
                srv.peak = max(srv.peak, srv.inside)
        try:
            if pack:
                time.sleep(srv.delay)  # a slow server: fetches overlap unless limited
                for name, event in srv.blocked.items():
                    if f"/{name}/" in path:
                        event.wait(300)
            env = {
                "PATH": os.environ["PATH"],
                "GIT_PROJECT_ROOT": str(srv.root),
                "GIT_HTTP_EXPORT_ALL": "1",
                "PATH_INFO": path,
                "QUERY_STRING": query,
                "REQUEST_METHOD": self.command,
                "CONTENT_TYPE": self.headers.get("Content-Type", ""),
                "CONTENT_LENGTH": str(len(data)),
                "HTTP_CONTENT_ENCODING": self.headers.get("Content-Encoding", ""),
                "GIT_PROTOCOL": self.headers.get("Git-Protocol", ""),
                "REMOTE_ADDR": self.client_address[0],
            }
            out = subprocess.run(
                ["git", "http-backend"], input=data, env=env, capture_output=True, check=False
            ).stdout
        finally:
            if pack:
                with srv.guard:
                    srv.inside -= 1
        head, _, body = out.partition(b"\r\n\r\n")
        status = 200
        headers = []
        for line in head.decode("latin-1").split("\r\n"):
            name, _, value = line.partition(":")
            if name.lower() == "status":
                status = int(value.strip().split()[0])
            elif name:
                headers.append((name, value.strip()))
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def git_server(tmp_path: Path) -> Iterator[GitServer]:
    server = GitServer(tmp_path / "served", delay=0.4)
    (tmp_path / "served").mkdir()
    thread = CheckedThread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    thread.join()
    server.server_close()


def serve(server: GitServer, origin: GitRepo, name: str) -> str:
    subprocess.run(
        ["git", "clone", "--quiet", "--bare", str(origin.path), str(server.root / name)],
        check=True,
    )
    return server.url(name)


def worker_env(redis_nodes: list[RedisNode], **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GITWARD_", "REDIS_URL", "DATABASE_URL"))}  # fmt: skip
    env.update(
        DATABASE_URL=database_url(),
        REDIS_URLS=",".join(n.url for n in redis_nodes),
        REDIS_URL=redis_nodes[0].url,  # the queue server the test process enqueues on
        GITWARD_SECRET_KEY="fetch-hosts-test-secret-key-" + "x" * 40,
        GITWARD_ALLOWED_HOSTS_NETS="127.0.0.0/8",
        GITWARD_CHUNK_SIZE="4",
        GITWARD_CHUNK_MAX="4",
        GITWARD_LOCK_TTL="5",
        GITWARD_WORKER_DEAD_AFTER="6",
        GITWARD_RETRY_BACKOFF="0.2,0.2",
        PYTHONUNBUFFERED="1",
        **extra,
    )
    return env


def start_host(
    base: Path, host_id: str, workers: int, env: dict[str, str]
) -> subprocess.Popen[bytes]:
    root = base / host_id
    root.mkdir(parents=True)
    with open(root / "worker.log", "wb") as out:
        return subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "worker", "--workers", str(workers)],
            env={**env, "GITWARD_HOST_ID": host_id, "GITWARD_WORKSPACE": str(root / "ws"),
                 "GITWARD_VAR_DIR": str(root / "var")},
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip


def test_three_hosts_keep_the_host_cap_and_run_chunks_where_the_mirror_is(
    tmp_path: Path, git_server: GitServer, redis_nodes: list[RedisNode], settings: Any
) -> None:
    settings.ALLOWED_HOSTS_NETS = [ipaddress.ip_network("127.0.0.0/8")]
    env = worker_env(
        redis_nodes,
        GITWARD_FETCH_LIMITS=f'{{"{SERVER_HOST}": {{"concurrency": {CAP}}}}}',
        GITWARD_AFFINITY_WAIT="60",
        GITWARD_FETCH_SLOT_WAIT="2",
    )
    urls = [serve(git_server, make_origin(tmp_path / "origins", i), f"r{i:02d}.git")
            for i in range(9)]  # fmt: skip
    procs = [start_host(tmp_path / "hosts", f"h{i}", 2, env) for i in (1, 2, 3)]
    try:
        repos = [submit_repository(url=u)[0] for u in urls]

        def all_ready() -> bool:
            failed = Repository.objects.filter(status="failed").values_list("url", "error")
            assert not failed, list(failed)
            return Repository.objects.filter(status="ready").count() == len(repos)

        wait_for(all_ready, "every repository to be analysed", 600)
    finally:
        stop_all(procs)

    # 1. The git server never ran more upload-packs at once than the cap; it did reach it.
    assert git_server.packs >= len(repos)
    assert git_server.peak == CAP, (git_server.peak, git_server.packs)

    # 2. The host that ran each chunk, and whether it had the mirror already: a host
    #    holds it once one of its syncs of that repository started before the chunk did.
    attempts = JobAttempt.objects.filter(outcome="succeeded").select_related("run")
    syncs: dict[int, list[tuple[Any, str]]] = {}
    for a in attempts.filter(run__kind=JobRun.Kind.SYNC):
        syncs.setdefault(a.run.repository_id, []).append((a.started_at, a.host))
    chunks = list(attempts.filter(run__kind=JobRun.Kind.ANALYZE))
    assert len(chunks) > 2 * len(repos)
    assert {a.host for a in chunks} <= {"h1", "h2", "h3"}
    local = [
        a for a in chunks
        if any(h == a.host and at <= a.started_at for at, h in syncs[a.run.repository_id])
    ]  # fmt: skip
    ratio = len(local) / len(chunks)
    print(f"chunks on a host holding the mirror: {len(local)}/{len(chunks)} = {ratio:.2f}")
    assert ratio >= 0.9, [(a.run.repository_id, a.host) for a in chunks if a not in local]
    # the slot of every fetch was given back
    assert host_status(queues.connection(), SERVER_HOST, {}).in_use == 0


def test_a_429_backs_the_host_off_for_every_worker_then_fetches_succeed(
    tmp_path: Path, git_server: GitServer, redis_nodes: list[RedisNode], settings: Any,
    admin_client: Client,
) -> None:  # fmt: skip
    settings.ALLOWED_HOSTS_NETS = [ipaddress.ip_network("127.0.0.0/8")]
    # The Git hosts table comes from the operations snapshot, which a page may take up to
    # GITWARD_SNAPSHOT_TTL old (docs/live-view.md); 0 builds it for the page below.
    settings.SNAPSHOT_TTL = 0
    env = worker_env(redis_nodes, GITWARD_FETCH_BACKOFF="30")
    url = serve(git_server, make_origin(tmp_path / "origins", 1), "r.git")
    git_server.retry_after = 4
    procs = [start_host(tmp_path / "hosts", f"h{i}", 1, env) for i in (1, 2)]
    try:
        repo, _ = submit_repository(url=url)
        deferred = wait_for(
            lambda: JobAttempt.objects.filter(run__repository=repo, outcome="deferred").first(),
            "the refused sync to be deferred",
            300,
        )
        first_refusal = git_server.refused[0]
        git_server.retry_after = None  # the host takes requests again
        # Visible: the attempt says why, Redis holds the backoff, the Workers page shows it.
        assert "refused with a rate limit; backing off until" in deferred.error
        status = host_status(queues.connection(), SERVER_HOST, {})
        assert status.backoff_until is not None
        page = admin_client.get("/workers/").content.decode()
        assert f'data-host="{SERVER_HOST}"' in page and "until " in page
        wait_for(
            lambda: Repository.objects.get(pk=repo.pk).status == "ready", "the sync to succeed", 300
        )
    finally:
        stop_all(procs)
    # Nobody (two worker hosts) asked the server anything during the 4 s it asked for.
    after = [t for t in git_server.requests if t > first_refusal]
    assert after, "no request after the refusal"
    assert min(after) - first_refusal >= 3.9, min(after) - first_refusal
    assert len(git_server.refused) == 1


def test_a_sigkilled_worker_holding_the_slot_frees_it_when_its_lease_ends(
    tmp_path: Path, git_server: GitServer, redis_nodes: list[RedisNode], settings: Any
) -> None:
    settings.ALLOWED_HOSTS_NETS = [ipaddress.ip_network("127.0.0.0/8")]
    env = worker_env(
        redis_nodes,
        GITWARD_FETCH_LIMITS=f'{{"{SERVER_HOST}": {{"concurrency": 1}}}}',
        GITWARD_FETCH_SLOT_LEASE="8",
        GITWARD_FETCH_SLOT_WAIT="1",
    )
    stuck = serve(git_server, make_origin(tmp_path / "origins", 1), "stuck.git")
    other = serve(git_server, make_origin(tmp_path / "origins", 2), "other.git")
    release = git_server.blocked["stuck.git"] = threading.Event()
    procs = {h: start_host(tmp_path / "hosts", h, 1, env) for h in ("h1", "h2")}
    try:
        hung, _ = submit_repository(url=stuck)
        wait_for(lambda: git_server.inside == 1, "the fetch of stuck.git to hang in the server")
        victim = JobRun.objects.get(repository=hung, kind=JobRun.Kind.SYNC).host
        tree = {procs[victim].pid} | descendants(procs[victim].pid)
        for pid in tree:  # the whole host dies at once, by pid
            # A child may end on its own between the listing and the kill (a git
            # process finishing): nothing left to kill.
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        procs[victim].wait(timeout=30)
        # Its slot is still taken: nobody released it, its lease runs on.
        assert host_status(queues.connection(), SERVER_HOST, {}).in_use == 1
        repo, _ = submit_repository(url=other)
        wait_for(
            lambda: Repository.objects.get(pk=repo.pk).status == "ready",
            "the other repository to sync on the surviving host once the lease ended",
            300,
        )
        survivor = next(h for h in procs if h != victim)
        assert set(
            JobAttempt.objects.filter(run__repository=repo).values_list("host", flat=True)
        ) == {survivor}
        waited = JobAttempt.objects.filter(run__repository=repo, outcome="deferred")
        assert any(f"host limit {SERVER_HOST} 1/1" in a.error for a in waited), [
            a.error for a in waited
        ]
    finally:
        release.set()
        stop_all([p for p in procs.values() if p.poll() is None])
