"""The live operations view: websocket consumers (auth, Origin, permissions, snapshot,
events, coalescing), the operations pages, forced lock release, and escaping of
repository data in events."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async
from django.test import Client

from dashboard.infra.events import coalesce_key, publish_event
from dashboard.live import fanout
from dashboard.live.snapshots import repository_live
from dashboard.locks import leases
from dashboard.locks.fencing import next_token
from dashboard.models import AuditEntry, Repository
from dashboard.repositories.lifecycle import submit_repository
from tests.conftest import run_workers
from tests.support.checked_threads import CheckedThread
from tests.support.gitrepo import GitRepo
from tests.support.sockets import ORIGIN, connect, make_user, session_headers

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_operator_gets_a_snapshot_then_coalesced_events(
    git_repo: GitRepo, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Flush windows of 2 s: the 500 publishes span a few windows even on a loaded machine
    # (at 0.1 s they spanned up to 346 there), so "< 100" tests coalescing, not the clock.
    monkeypatch.setattr(fanout, "FLUSH_SECONDS", 2.0)
    op = make_user("op", staff=True, perms=("view_jobrun",))

    async def scenario() -> None:
        comm, ok, _ = await connect("/ws/ops/", await sync_to_async(session_headers)(op))
        assert ok
        snap = await comm.receive_json_from(timeout=10)
        assert snap["type"] == "snapshot"
        assert set(snap["data"]) >= {
            "redis_nodes",
            "quorum",
            "queues",
            "locks",
            "workers",
            "dlq",
            "series",
        }
        assert snap["data"]["quorum"]["state"] == "ok"
        # A burst of 500 extensions of one lock becomes one event with the newest state.
        for i in range(500):
            await sync_to_async(publish_event)(
                "lock.extended", {"key": "locks:x", "extensions": i, "ttl_ms": 1}
            )
        await sync_to_async(publish_event)("job.queued", {"run": 7, "repo": 1})
        got: list[dict] = []
        messages = 0
        while not any(e["type"] == "job.queued" for e in got):
            msg = await comm.receive_json_from(timeout=10)
            assert msg["type"] == "events"
            got += msg["events"]
            messages += 1
        extended = [e for e in got if e["type"] == "lock.extended"]
        # One event per flush window at most, each carrying the newest state.
        assert len(extended) == messages or len(extended) == messages - 1
        assert len(extended) < 100 and extended[-1]["extensions"] == 499
        assert any(e["type"] == "job.queued" and e["run"] == 7 for e in got)
        # Asking again (what the page does after a reconnect) sends a new snapshot.
        await comm.send_json_to({"type": "snapshot"})
        assert (await comm.receive_json_from(timeout=10))["type"] == "snapshot"
        await comm.disconnect()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("who", "origin", "code"),
    [
        ("anonymous", ORIGIN, 4401),
        ("user", ORIGIN, 4403),  # logged in, but no operations permission
        ("op", (b"origin", b"http://evil.example"), None),  # foreign page: refused at the door
        ("op", None, None),  # no Origin header at all
    ],
)
def test_refused_sockets(who: str, origin, code) -> None:
    headers: list = [origin] if origin else []
    if who != "anonymous":
        user = make_user(who, staff=who == "op", perms=("view_jobrun",) if who == "op" else ())
        headers = session_headers(user, origin)

    async def scenario() -> None:
        comm, ok, close_code = await connect("/ws/ops/", headers)
        assert not ok
        if code is not None:
            assert close_code == code
        await comm.disconnect()

    asyncio.run(scenario())


def test_any_logged_in_user_can_watch_a_repository_and_events_stay_text(tmp_path: Path) -> None:
    payload = '<img src=x onerror="alert(1)">'
    evil = GitRepo.create(tmp_path / "evil")
    evil.commit(payload, {f"{payload}.txt": payload}, author=(payload, "e@example.com"))
    repo, _ = submit_repository(url=str(evil.path))
    user = make_user("viewer")

    headers = session_headers(user)
    seen: list[dict] = []
    snapshots: list[dict] = []
    connected = threading.Event()

    async def watch() -> None:
        comm, ok, _ = await connect(f"/ws/repos/{repo.pk}/", headers)
        assert ok
        snapshots.append((await comm.receive_json_from(timeout=10))["data"])
        connected.set()
        while not any(e["type"] == "repo.changed" and e["status"] == "ready" for e in seen):
            msg = await comm.receive_json_from(timeout=30)
            if msg["type"] == "events":
                seen.extend(msg["events"])
        _missing, ok_missing, code = await connect("/ws/repos/999999/", headers)
        assert not ok_missing and code == 4404
        await comm.disconnect()

    watcher = CheckedThread(target=lambda: asyncio.run(watch()), name="repository watcher")
    watcher.start()
    assert connected.wait(20)
    assert snapshots[0]["status"] == "queued" and snapshots[0]["waiting"]
    run_workers()  # real RQ worker in the main thread (it installs signal handlers)
    watcher.join(60)
    assert not watcher.is_alive()
    kinds = {e["type"] for e in seen}
    # A lock taken and released within one flush window arrives only as "released".
    assert {"lock.released", "job.progress", "repo.changed"} <= kinds
    released = {e["key"] for e in seen if e["type"] == "lock.released"}
    assert f"locks:git:repo:{repo.pk}:mirror" in released
    # Untrusted text travels as JSON string values (the page inserts it with textContent).
    progress = [e for e in seen if e["type"] == "job.progress"]
    assert progress[-1]["analyzed"] == 1
    page = Client()
    page.force_login(user)
    html = page.get(f"/repos/{repo.pk}/").content.decode()
    assert payload not in html and "&lt;img src=x" in html


def test_coalescing_keys_keep_the_newest_state_per_thing() -> None:
    assert coalesce_key({"type": "lock.acquired", "key": "k"}) == coalesce_key(
        {"type": "lock.released", "key": "k"}
    )
    assert coalesce_key({"type": "job.started", "run": 1}) != coalesce_key(
        {"type": "job.started", "run": 2}
    )
    with pytest.raises(ValueError):
        publish_event("no.such.event", {})
    with pytest.raises(TypeError):
        publish_event("job.queued", {"run": object()})


def test_operations_pages_render_for_operators_and_not_for_others(git_repo: GitRepo) -> None:
    op = make_user("op", staff=True, perms=("view_jobrun",))
    user = make_user("plain")
    submit_repository(url=str(git_repo.path))
    for path in ("/", "/locks/", "/workers/", "/dead-letters/", "/audit/"):
        c = Client()
        c.force_login(op)
        res = c.get(path)
        assert res.status_code == 200, path
        assert b'data-live-socket="/ws/ops/' in res.content or path == "/audit/"
        c.force_login(user)
        assert c.get(path).status_code in {302, 403}, path
    c = Client()
    c.force_login(op)
    assert b"sync" in c.get("/workers/").content  # the queues table


def test_why_a_repository_waits(git_repo: GitRepo) -> None:
    repo, _ = submit_repository(url=str(git_repo.path))
    live = repository_live(repo.pk)
    assert live["waiting"] == ["sync: queued, position 1"]


@pytest.mark.parametrize("role", ["user", "staff", "permitted"])
def test_force_release_needs_the_permission_and_fences_the_old_holder(role: str) -> None:
    key = "locks:git:repo:1:commit:abc"
    old = leases.redlock().acquire([key], ttl=30.0, holder={"worker": "w", "job": "j"})
    perms = ("force_release_lock",) if role == "permitted" else ()
    user = make_user(role, staff=role != "user", perms=perms)
    c = Client()
    c.force_login(user)
    res = c.post("/api/locks/release", {"key": key}, content_type="application/json")
    if role != "permitted":
        assert res.status_code == 403
        assert leases.redlock().inspect(key) is not None
        return
    assert res.status_code == 200
    body = res.json()
    assert body["released"] == 3 and body["token"] > old.token
    assert leases.redlock().inspect(key) is None
    # The token moved on: the old holder's write would be rejected by fencing.
    assert next_token(key) == body["token"] + 1
    entry = AuditEntry.objects.get(action="lock.force_release", outcome__startswith="released")
    assert entry.actor == "permitted"
    assert (
        c.post("/api/locks/release", {"key": "nope"}, content_type="application/json").status_code
        == 400
    )


def test_the_status_api_is_the_operations_snapshot(client, git_repo: GitRepo) -> None:
    op = make_user("op", staff=True, perms=("view_jobrun",))
    client.force_login(op)
    submit_repository(url=str(git_repo.path))
    body = client.get("/api/status").json()
    assert set(body) >= {"locks", "queues", "workers", "dlq", "redis_nodes"}
    assert Repository.objects.count() == 1


def test_metrics_are_prometheus_text_for_operators(git_repo: GitRepo) -> None:
    submit_repository(url=str(git_repo.path))
    run_workers()
    plain, op = make_user("plain"), make_user("op", staff=True, perms=("view_jobrun",))
    c = Client()
    c.force_login(plain)
    assert c.get("/metrics").status_code == 403
    c.force_login(op)
    res = c.get("/metrics")
    assert res.status_code == 200 and res["Content-Type"].startswith("text/plain; version=0.0.4")
    samples = {}
    for line in res.content.decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    assert samples['gitward_repositories{status="ready"}'] == 1
    assert samples['gitward_runs{state="queued"}'] == samples['gitward_runs{state="dead"}'] == 0
    assert sum(v for k, v in samples.items() if k.startswith("gitward_jobs_succeeded_total")) == 2
    assert samples["gitward_redis_masters_up"] == samples["gitward_redis_masters"] == 3
    assert samples["gitward_locks_held"] == 0
    assert samples['gitward_queue_backlog{queue="sync",version=""}'] == 0


def _connections_received(url: str) -> int:
    import redis

    client = redis.Redis.from_url(url)
    try:
        return int(client.info("stats")["total_connections_received"])
    finally:
        client.close()


def test_events_of_one_process_share_one_loop_and_its_connection(settings) -> None:
    """Every send of a process runs on one long-lived loop, so the channel layer's
    connection is opened once, not once per event; a forked child (a work horse) sends
    on a loop of its own, and its events arrive too."""
    import os

    from dashboard.infra.events import OPS_GROUP, send_to_groups
    from tests.support.live_tap import Tap

    tap = Tap()
    assert send_to_groups([OPS_GROUP], {"type": "live.event", "event": {"n": 0}}, what="t")
    before = _connections_received(settings.REDIS_URL)
    for n in range(1, 6):
        assert send_to_groups([OPS_GROUP], {"type": "live.event", "event": {"n": n}}, what="t")
    # the five sends opened no connection (the count includes our own INFO client only)
    assert _connections_received(settings.REDIS_URL) - before == 1
    pid = os.fork()
    if pid == 0:  # the child: exits at once, whatever happens
        ok = False
        try:
            ok = send_to_groups([OPS_GROUP], {"type": "live.event", "event": {"n": 6}}, what="t")
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    events = tap.until(lambda got: len(got) >= 7)
    assert sorted(e["n"] for e in events) == list(range(7))


def test_an_event_outside_a_transaction_goes_at_once_and_opens_no_database_connection() -> None:
    """The lease's heartbeat threads publish with no connection of their own
    (``dashboard.locks.leases``): ``transaction.on_commit`` would open one only to read its
    autocommit flag, and a thread that ends holding it loses its process's pool a slot
    for good (``dashboard.infra.dbpool``)."""
    from django.db import connections

    from tests.support.live_tap import Tap

    tap = Tap()
    opened: list[bool] = []

    def publish() -> None:
        publish_event(
            "lock.extended", {"key": "locks:x", "extensions": 1, "ttl_ms": 5}, repo_id=None
        )
        opened.append(connections["default"].connection is not None)

    thread = CheckedThread(target=publish, name="publisher")
    thread.start()
    thread.join()
    assert opened == [False]
    assert [e["key"] for e in tap.until(lambda got: len(got) >= 1)] == ["locks:x"]
