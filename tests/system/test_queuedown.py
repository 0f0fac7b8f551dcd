"""The queue server (``REDIS_URL``) lost or stalled: every page, API call and socket
degrades, submissions are kept in the database and enqueued once it returns.

Two layouts, both with real ``redis-server`` processes: a separate queue node (the
three lock masters stay up) and the embedded default, where the queue node *is* lock
master 1. The node is SIGKILLed (down) or SIGSTOPped (stalled, sockets kept open).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client
from django.urls import URLResolver, get_resolver
from rq.job import Job

from dashboard.asgi import websocket_urls
from dashboard.infra import queues
from dashboard.infra.dbpool import close_thread_connections
from dashboard.live.consumers import OpsConsumer, RepositoryConsumer
from dashboard.locks.leases import redlock
from dashboard.models import Commit, JobRun, Repository, Rollout
from dashboard.operations.reconciler import reconcile
from dashboard.rollouts import start
from dashboard.settings import channel_layer_host
from dashboard.versions.state_machine import ensure_baseline
from tests.conftest import _own_node, run_workers
from tests.support.checked_threads import CheckedThread
from tests.support.gitrepo import GitRepo
from tests.support.rollouts import DRIVERS, verify
from tests.support.rollouts import start as start_driven_rollout
from workers.locks import keys
from workers.runtime.redis_server import RedisNode

pytestmark = pytest.mark.django_db(transaction=True)

DOWN = "queue server unreachable"
PAGES = ["/", "/locks/", "/workers/", "/dead-letters/", "/audit/", "/repos/", "/healthz"]
API_GETS = [
    "/api/status",
    "/api/runs",
    "/api/dlq",
    "/metrics",
]


def _point_queue_at(settings: Any, url: str) -> None:
    settings.REDIS_URL = url
    # A new dict, so Channels' setting_changed hook drops the cached layer.
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "dashboard.infra.events.ResilientChannelLayer",
            "CONFIG": {"hosts": [channel_layer_host(url, settings.QUEUE_TIMEOUT)]},
        }
    }
    queues.CIRCUIT.reset()


@pytest.fixture
def fast_timeouts(settings: Any) -> None:
    settings.QUEUE_TIMEOUT = 0.3


@pytest.fixture
def separate_queue(
    settings: Any, tmp_path_factory: pytest.TempPathFactory, fast_timeouts: None
) -> Iterator[RedisNode]:
    """A queue node of its own; the three lock masters of conftest stay up."""
    node = _own_node(tmp_path_factory.mktemp("queue"))
    _point_queue_at(settings, node.url)
    yield node
    node.resume()
    node.kill()
    queues.CIRCUIT.reset()


@pytest.fixture
def embedded_queue(
    settings: Any, redis_nodes: list[RedisNode], fast_timeouts: None
) -> Iterator[RedisNode]:
    """The embedded default: the queue node is lock master 1 (conftest restarts it)."""
    _point_queue_at(settings, redis_nodes[0].url)
    yield redis_nodes[0]
    redis_nodes[0].resume()
    queues.CIRCUIT.reset()


@pytest.fixture(params=["separate", "embedded"])
def queue_node(request: pytest.FixtureRequest) -> RedisNode:
    return request.getfixturevalue(f"{request.param}_queue")  # type: ignore[no-any-return]


@pytest.fixture
def operator(db: None) -> Any:
    return get_user_model().objects.create_superuser("ops", "ops@example.org", "pw-ops-12345")


def _client(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _repo(tmp_path: Path, name: str) -> GitRepo:
    repo = GitRepo.create(tmp_path / name)
    repo.commit(f"{name} one", {"a.txt": "1\n"})
    repo.commit(f"{name} two", {"b.txt": "2\n", "a.txt": "1\n2\n"})
    return repo


def _held_lock(repo_id: int) -> str:
    key = keys.mirror(repo_id)
    redlock().acquire(key, ttl=120, holder={"job": "test-holder", "worker": "w1"})
    return key


def _ws_snapshot(user: Any, repo_id: int | None = None) -> dict[str, Any]:
    """Connect to ``/ws/ops/`` (or ``/ws/repos/N/``) as ``user`` and return the first
    message (the snapshot)."""

    async def go() -> dict[str, Any]:
        if repo_id is None:
            comm = WebsocketCommunicator(OpsConsumer.as_asgi(), "/ws/ops/")
        else:
            comm = WebsocketCommunicator(RepositoryConsumer.as_asgi(), f"/ws/repos/{repo_id}/")
            comm.scope["url_route"] = {"kwargs": {"repo_id": repo_id}}
        comm.scope["user"] = user
        connected, _ = await comm.connect(timeout=10)
        assert connected
        message = await comm.receive_json_from(timeout=10)
        await comm.disconnect()
        return message  # type: ignore[no-any-return]

    return async_to_sync(go)()


def test_every_page_api_call_and_socket_degrades_with_the_queue_node_killed(
    queue_node: RedisNode, operator: Any, tmp_path: Path
) -> None:
    origin = _repo(tmp_path, "before")
    client = _client(operator)
    created = client.post("/api/repos", {"url": str(origin.path)}, content_type="application/json")
    assert created.status_code == 202
    repo_id = created.json()["id"]
    key = _held_lock(repo_id)

    queue_node.kill()

    seen: list[tuple[str, int]] = []
    for path in [*PAGES, f"/repos/{repo_id}/"]:
        response = client.get(path)
        seen.append((path, response.status_code))
        assert response.status_code == 200, path
        if path != "/healthz":
            assert DOWN in response.content.decode(), f"no banner on {path}"
    locks_page = client.get("/locks/").content.decode()
    assert key in locks_page  # from the two (or three) lock masters still up

    status = client.get("/api/status")
    assert status.status_code == 200
    body = status.json()
    assert body["queue_server"]["ok"] is False
    assert body["queue_server"]["error"] == DOWN
    assert key in [row["key"] for row in body["locks"]]
    assert all(q["backlog"] is None and q["unreachable"] for q in body["queues"])

    for path in [*API_GETS, f"/api/repos/{repo_id}", f"/api/repos/{repo_id}/commits"]:
        response = client.get(path)
        seen.append((path, response.status_code))
        assert response.status_code == 200, path
    assert "gitward_queue_server_up 0" in client.get("/metrics").content.decode()

    snapshot = _ws_snapshot(operator)
    assert snapshot["type"] == "snapshot"
    assert snapshot["data"]["queue_server"]["ok"] is False
    assert snapshot["data"]["queue_server"]["error"] == DOWN
    assert key in [row["key"] for row in snapshot["data"]["locks"]]
    pause = client.post(
        "/api/queues/pause", {"queue": queues.SYNC_QUEUE}, content_type="application/json"
    )
    assert pause.status_code == 503 and DOWN in pause.json()["error"]
    release = client.post("/api/locks/release", {"key": key}, content_type="application/json")
    assert release.status_code == 200 and release.json()["released"] >= 2
    retry = client.post("/api/dlq/retry", {"all": True}, content_type="application/json")
    assert retry.status_code == 202  # a bulk action; it ends failed, not stuck queued
    assert retry.json()["state"] == "failed" and DOWN in retry.json()["error"]

    repo_socket = _ws_snapshot(operator, repo_id)
    assert repo_socket["type"] == "snapshot"
    assert any(DOWN in reason for reason in repo_socket["data"]["waiting"])
    assert not [s for s in seen if s[1] >= 500], seen


def test_submissions_while_down_are_enqueued_when_the_queue_server_returns(
    queue_node: RedisNode, operator: Any, tmp_path: Path
) -> None:
    origins = {how: _repo(tmp_path, how) for how in ("api", "form", "cli")}
    queue_node.kill()
    client = _client(operator)

    via_api = client.post(
        "/api/repos", {"url": str(origins["api"].path)}, content_type="application/json"
    )
    assert via_api.status_code == 202
    via_form = client.post("/repos/", {"url": str(origins["form"].path), "branch": ""})
    assert via_form.status_code == 302  # to the repository page: accepted
    call_command("submit", str(origins["cli"].path))

    repos = {how: Repository.objects.get(url__endswith=f"/{how}") for how, o in origins.items()}
    syncs = JobRun.objects.filter(kind=JobRun.Kind.SYNC, repository__in=repos.values())
    assert syncs.count() == 3
    assert set(syncs.values_list("state", flat=True)) == {JobRun.State.QUEUED}
    assert reconcile()["queue_unreachable"] == 1  # nothing lost, nothing enqueued yet

    queue_node.restart()
    queues.CIRCUIT.reset()  # this process would retry within RETRY_AFTER_SECONDS anyway
    assert reconcile()["requeued"] == 3
    assert reconcile()["requeued"] == 0  # once
    while run_workers():
        reconcile()
    for how, repo in repos.items():
        repo.refresh_from_db()
        assert repo.status == Repository.Status.READY, (how, repo.error)
        shas = list(Commit.objects.filter(repository=repo).values_list("sha", flat=True))
        assert sorted(shas) == sorted(origins[how].shas()), how  # each commit once


def _bounded(call: Callable[[], Any], limit: float) -> Any:
    """Run ``call`` in a thread; fail (instead of hanging the suite) past ``limit``."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = call()
        finally:
            # The test client keeps a request's connection open (for the test's own
            # transaction); in a thread of its own that connection would hold a pool slot.
            close_thread_connections()

    thread = CheckedThread(target=run, daemon=True)
    thread.start()
    thread.join(limit)  # raises what ``call`` raised
    assert not thread.is_alive(), f"request still waiting after {limit}s"
    return box["result"]


def test_a_stalled_queue_node_delays_requests_by_a_bounded_time(
    queue_node: RedisNode, operator: Any, tmp_path: Path
) -> None:
    origin = _repo(tmp_path, "stalled")
    client = _client(operator)
    queue_node.pause()  # SIGSTOP: connections open, nothing answers
    # Each request pays at most a few QUEUE_TIMEOUTs (0.3 s here) before the circuit
    # opens; the limit only separates "bounded" from "hangs" (the old 10 s reads).
    limit = 8.0
    status = _bounded(lambda: client.get("/api/status"), limit)
    assert status.status_code == 200 and status.json()["queue_server"]["ok"] is False
    page = _bounded(lambda: client.get("/"), limit)
    assert page.status_code == 200 and DOWN in page.content.decode()
    submitted = _bounded(
        lambda: client.post(
            "/api/repos", {"url": str(origin.path)}, content_type="application/json"
        ),
        limit,
    )
    assert submitted.status_code == 202
    snapshot = _bounded(lambda: _ws_snapshot(operator), limit)
    assert snapshot["data"]["queue_server"]["ok"] is False
    queue_node.resume()
    deadline = time.monotonic() + 10
    while not queues.queue_server()["ok"]:
        assert time.monotonic() < deadline, "queue server not seen again after SIGCONT"
        time.sleep(0.1)
    assert reconcile()["requeued"] == 1  # the stalled submission, now enqueued


def _fill(route: str, ids: dict[str, str]) -> str:
    """``route`` (a URL pattern as Django prints it) with every ``<conv:name>`` replaced
    by ``ids[name]``; an argument without an id is a test bug (a new route: add it)."""
    return "/" + re.sub(r"<(?:\w+:)?(\w+)>", lambda m: ids[m.group(1)], route)


def _every_route(ids: dict[str, str]) -> list[str]:
    """A path for every URL pattern of the dashboard (the admin: its index), so a page
    added later is covered without being listed here."""
    paths = []
    for pattern in get_resolver().url_patterns:
        route = str(pattern.pattern)
        paths.append("/admin/" if isinstance(pattern, URLResolver) else _fill(route, ids))
    return paths


def _socket_first_message(user: Any, path: str) -> dict[str, Any]:
    """Connect to ``path`` through the real websocket router and return the first message."""

    async def go() -> dict[str, Any]:
        comm = WebsocketCommunicator(URLRouter(websocket_urls), path)
        comm.scope["user"] = user
        connected, _ = await comm.connect(timeout=10)
        assert connected, path
        message = await comm.receive_json_from(timeout=10)
        await comm.disconnect()
        return message  # type: ignore[no-any-return]

    return async_to_sync(go)()


def test_every_route_and_socket_answers_without_a_server_error_with_the_queue_node_killed(
    queue_node: RedisNode, operator: Any, tmp_path: Path
) -> None:
    """Every URL pattern (GET, and POST with an empty JSON body) and every websocket route,
    with real objects behind each argument: an analysed repository and its commit, a run,
    a rollout. No answer is a 5xx but the documented 503 of a mutation that needs the
    queue; every HTML page shows the banner."""
    origin = _repo(tmp_path, "routes")
    client = _client(operator)
    created = client.post("/api/repos", {"url": str(origin.path)}, content_type="application/json")
    assert created.status_code == 202
    while run_workers():
        reconcile()
    repo = Repository.objects.get(pk=created.json()["id"])
    assert repo.status == Repository.Status.READY, repo.error
    # A rollout whose driver (this process) holds the deploy lock: its page offers the
    # rollback, whose plan counts the version's queued jobs on the queue server.
    rollout, driver = start_driven_rollout()
    DRIVERS.remove(driver)
    try:
        rollout = verify(rollout, driver)  # warmed and passed: a rollback is on offer
        _every_route_with(queue_node, operator, client, origin, repo, rollout)
    finally:
        driver.release()


def _every_route_with(
    queue_node: RedisNode, operator: Any, client: Client, origin: GitRepo, repo: Repository,
    rollout: Rollout,
) -> None:  # fmt: skip
    run = JobRun.objects.filter(repository=repo).first()
    assert run is not None
    key = _held_lock(repo.pk)

    queue_node.kill()

    retry = client.post("/api/dlq/retry", {"all": True}, content_type="application/json")
    assert retry.status_code == 202
    ids = {
        "repo_id": str(repo.pk),
        "sha": origin.shas()[0],
        "run_id": str(run.pk),
        "job_id": run.job_id,
        "rollout_id": str(rollout.pk),
        "version_id": str(rollout.version_id),
        "fingerprint": rollout.version.fingerprint,
        "verb": "pause",
        "action": "pause",
        "group": "none",
        "action_id": str(retry.json()["id"]),
        "analysis": "coupling",
        "identity": "nobody@example.com",
        "verification_id": "1",
    }
    # Logging out last: every other request is the operator's.
    routes = sorted(_every_route(ids), key=lambda path: path == "/logout/")
    assert len(routes) == len(get_resolver().url_patterns) > 40
    served: list[tuple[str, str, int]] = []
    for path in routes:
        response = client.get(path)
        served.append(("GET", path, response.status_code))
        html = response.get("Content-Type", "").startswith("text/html")
        if response.status_code == 200 and html and not path.startswith("/admin/"):
            assert DOWN in response.content.decode(), f"no banner on {path}"
    for path in routes:
        response = client.post(path, {}, content_type="application/json")  # a bad body too
        code = response.status_code
        served.append(("POST", path, code))
        if code == 503 and path != "/readyz":  # only a refusal that says why
            assert DOWN in response.content.decode(), path
    # A GET always degrades (the readiness probe aside); a POST may refuse with 503.
    errors = [
        (m, p, c)
        for m, p, c in served
        if c >= 500 and not (c == 503 and (m == "POST" or p == "/readyz"))
    ]
    assert errors == [], errors
    gets = {p: c for m, p, c in served if m == "GET"}
    client = _client(operator)  # (logged in again)
    # The rollback plan on the rollout page, without the queue's counts.
    assert "move its queued jobs back to" in client.get(f"/rollouts/{rollout.pk}/").content.decode()
    assert all(gets[p] == 200 for p in (*PAGES, f"/repos/{repo.pk}/", f"/runs/{run.pk}/"))
    assert gets[f"/repos/{repo.pk}/commits/{ids['sha']}/"] == 200
    # The readiness probe says "not ready" on purpose (a load balancer routes around a
    # replica without its queue server), naming the failed check.
    assert gets["/readyz"] == 503 and client.get("/readyz").json()["failed"] == ["queue"]

    # Every consumer's route; the last, catch-all pattern refuses any other path.
    paths = [_fill(str(p.pattern), ids) for p in websocket_urls if str(p.pattern)]
    assert len(paths) == len(websocket_urls) - 1
    for path in paths:
        message = _socket_first_message(operator, path)
        assert message["type"] == "snapshot", (path, message)
    ops = _socket_first_message(operator, "/ws/ops/")
    assert ops["data"]["queue_server"]["error"] == DOWN
    assert key in [row["key"] for row in ops["data"]["locks"]]


def test_a_rollout_started_while_down_gets_its_driver_when_the_queue_server_returns(
    queue_node: RedisNode, operator: Any
) -> None:
    """Starting a rollout is a submission too: accepted (202, pending) with the queue
    node killed, its driver job enqueued by the reconciler once the node is back."""
    ensure_baseline(actor="setup")
    client = _client(operator)
    queue_node.kill()
    started = client.post(
        "/api/rollouts", {"config": {"detect_renames": True}}, content_type="application/json"
    )
    assert started.status_code == 202, started.content
    ro = Rollout.objects.get(pk=started.json()["id"])
    assert ro.state == Rollout.State.PENDING
    assert reconcile()["queue_unreachable"] == 1

    queue_node.restart()
    queues.CIRCUIT.reset()
    job_id = start.driver_job_id(ro.pk)
    assert not Job.exists(job_id, connection=queues.connection())  # the start lost it
    assert reconcile()["drivers"] == 1
    job = Job.fetch(job_id, connection=queues.connection())
    assert job.func_name == "workers.jobs.drive_rollout" and job.args[0] == ro.pk
    assert job.origin == start.DRIVER_QUEUE and job.get_status() == "queued"
    assert reconcile()["drivers"] == 0  # once
