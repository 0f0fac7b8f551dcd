"""The overview's Recent activity feed (dashboard/infra/activity_feed.py) and the sockets that keep
every page live: events worth a line are kept newest first (state ticks are not), the
overview is seeded with them, audit entries are events, the repository list has its own
socket for any logged-in user, and every page names the socket that keeps it live."""

from __future__ import annotations

import asyncio
import json
import re
import threading

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext

from dashboard.accounts.audit import record_audit
from dashboard.infra import activity_feed
from dashboard.infra.events import publish_event
from dashboard.live import consumers
from dashboard.models import JobRun, Repository
from dashboard.repositories.lifecycle import submit_repository
from dashboard.runs.attempts import begin_attempt, ensure_run, fail_attempt, succeed_attempt
from tests.conftest import run_workers
from tests.support.checked_threads import CheckedThread
from tests.support.gitrepo import GitRepo
from tests.support.sockets import ORIGIN, connect, make_user, session_headers

pytestmark = pytest.mark.django_db(transaction=True)
OPS = ("view_jobrun",)


def test_the_feed_keeps_activity_newest_first_and_leaves_state_ticks_out() -> None:
    publish_event("job.started", {"run": 1, "job": "j1", "kind": "analyze", "repo": 7})
    publish_event("job.progress", {"repo": 7, "analyzed": 3, "total": 9})
    publish_event("lock.extended", {"key": "k", "extensions": 2, "ttl_ms": 1000})
    publish_event("worker.heartbeat", {"worker": "w", "last_seen": "x", "rss": 1})
    publish_event("action.progress", {"action": 4, "kind": "retry", "state": "running"})
    publish_event("action.progress", {"action": 4, "kind": "retry", "state": "done"})
    publish_event("job.succeeded", {"run": 1, "job": "j1", "kind": "analyze", "repo": 7})
    kinds = [(e["type"], e.get("state")) for e in activity_feed.recent()]
    assert kinds == [("job.succeeded", None), ("action.progress", "done"), ("job.started", None)]
    for i in range(activity_feed.FEED_SIZE + 20):
        publish_event("dlq.changed", {"n": i})
    assert len(activity_feed.recent(limit=10_000)) == activity_feed.FEED_SIZE  # trimmed
    assert activity_feed.recent(limit=1)[0]["n"] == activity_feed.FEED_SIZE + 19  # the newest


def test_an_event_is_kept_only_once_its_transaction_commits() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        publish_event("job.queued", {"run": 9, "job": "rolled-back", "kind": "sync"})
        raise RuntimeError("rolled back")
    assert activity_feed.recent() == []


def test_the_overview_is_seeded_with_the_feed_and_audit_entries_are_events() -> None:
    op = make_user("op", staff=True, perms=OPS)
    record_audit(user=op, action="dlq.discard", target="group g", outcome="3 runs",
                 reason="<b>cleanup</b>")  # fmt: skip
    [entry] = activity_feed.recent()
    assert entry["type"] == "audit.recorded" and entry["reason"] == "<b>cleanup</b>"
    client = Client()
    client.force_login(op)
    html = client.get("/").content.decode()
    assert 'id="activity"' in html and 'id="activity-kind"' in html
    seed = re.search(r'<script id="activity-seed" type="application/json">(.*?)</script>', html)
    assert seed, "the overview carries the feed as it was when rendered"
    assert json.loads(seed.group(1))[0]["action"] == "dlq.discard"
    assert "<b>cleanup</b>" not in html  # data, escaped (json_script), never markup


def test_every_page_names_the_socket_that_keeps_it_live(git_repo: GitRepo) -> None:
    repo, _ = submit_repository(url=str(git_repo.path))
    run_workers()
    op = make_user("op", staff=True, perms=OPS)
    client = Client()
    client.force_login(op)
    run_id = JobRun.objects.filter(repository=repo).order_by("pk").first().pk
    pages = {"/": "/ws/ops/", "/locks/": "/ws/ops/", "/workers/": "/ws/ops/",
             "/dead-letters/": "/ws/ops/?dlq=groups", "/audit/": "/ws/ops/", "/runs/": "/ws/ops/",
             f"/runs/{run_id}/": "/ws/ops/", "/repos/": "/ws/repos/",
             f"/repos/{repo.pk}/": f"/ws/repos/{repo.pk}/",
             "/rollouts/": "/ws/rollouts/"}  # fmt: skip
    for path, socket in pages.items():
        html = client.get(path).content.decode()
        assert f'data-live-socket="{socket}"' in html, path
        assert 'id="live-state"' in html, path  # the connection dot
    plain = Client()
    plain.force_login(User.objects.create_user("viewer"))
    assert 'data-live-socket="/ws/repos/"' in plain.get("/repos/").content.decode()
    assert "data-live-socket" not in Client().get("/login/").content.decode()


def test_the_repository_list_socket_serves_any_logged_in_user(git_repo: GitRepo) -> None:
    """Any signed-in user's socket gets the list's events; once the user logs out the open
    socket is closed as unauthenticated (4401), the old cookie opens nothing, and a
    socket from one of our pages without a session is refused with 4401 too."""
    viewer = make_user("viewer")
    browser = Client()
    browser.force_login(viewer)
    headers = [(b"cookie", f"sessionid={browser.cookies['sessionid'].value}".encode()), ORIGIN]
    seen: list[dict] = []
    connected = threading.Event()

    async def watch() -> None:
        comm, ok, _ = await connect("/ws/repos/", headers)
        assert ok
        assert (await comm.receive_json_from(timeout=10))["type"] == "snapshot"
        connected.set()
        while not any(e["type"] == "repo.changed" and e.get("status") == "ready" for e in seen):
            msg = await comm.receive_json_from(timeout=30)
            if msg["type"] == "events":
                seen.extend(msg["events"])
        await sync_to_async(browser.post)("/logout/")
        while (out := await comm.receive_output(timeout=10))["type"] == "websocket.send":
            pass  # events flushed before the close
        assert out == {"type": "websocket.close", "code": consumers.CLOSE_UNAUTHENTICATED}
        await comm.disconnect()
        _old, ok_old, code = await connect("/ws/repos/", headers)
        assert not ok_old and code == consumers.CLOSE_UNAUTHENTICATED
        _anon, ok_anon, code = await connect("/ws/repos/", [ORIGIN])
        assert not ok_anon and code == consumers.CLOSE_UNAUTHENTICATED

    watcher = CheckedThread(target=lambda: asyncio.run(watch()), name="repository-list watcher")
    watcher.start()
    assert connected.wait(20)
    submit_repository(url=str(git_repo.path))
    run_workers()
    watcher.join(60)
    assert not watcher.is_alive()
    kinds = {e["type"] for e in seen}
    assert "repo.changed" in kinds and kinds <= {"repo.changed", "job.progress"}, kinds


def test_operators_get_the_feed_in_every_snapshot() -> None:
    op = make_user("op", staff=True, perms=OPS)
    publish_event("lock.lost", {"key": "locks:git:repo:1:mirror", "job": "j"})

    async def scenario() -> None:
        comm, ok, _ = await connect("/ws/ops/", await sync_to_async(session_headers)(op))
        assert ok
        snap = await comm.receive_json_from(timeout=10)
        assert [e["type"] for e in snap["data"]["activity"]] == ["lock.lost"]
        await comm.disconnect()

    asyncio.run(scenario())


def test_every_event_of_an_analysis_names_its_repository(git_repo: GitRepo) -> None:
    """Runs, locks and status changes carry the repository's name, so the feed's lines
    (and the ops socket's snapshot of them) link to it by name, not "repository #N"."""
    repo, _ = submit_repository(url=str(git_repo.path))
    run_workers()
    events = [
        e for e in activity_feed.recent(limit=activity_feed.FEED_SIZE) if e.get("repo") == repo.pk
    ]
    kinds = {e["type"] for e in events}
    assert {"job.queued", "job.started", "job.succeeded", "lock.acquired", "lock.released",
            "repo.changed"} <= kinds, kinds  # fmt: skip
    for e in events:
        assert e.get("repo_name", e.get("name")) == repo.name != "", e
    op = make_user("op", staff=True, perms=OPS)

    async def scenario() -> list[dict]:
        comm, ok, _ = await connect("/ws/ops/", await sync_to_async(session_headers)(op))
        assert ok
        snap = await comm.receive_json_from(timeout=10)
        await comm.disconnect()
        return snap["data"]["activity"]

    seeded = [e for e in asyncio.run(scenario()) if e["type"].startswith("job.")]
    assert seeded and {e["repo_name"] for e in seeded} == {repo.name}


def test_a_dead_run_names_its_repository_without_its_credentials() -> None:
    # A row from before submissions refused credentials in URLs.
    repo = Repository.objects.create(url="https://bob:s3cret@example.com/team/widget.git")
    run = ensure_run(kind=JobRun.Kind.SYNC, job_id="sync-cred-g1", queue="sync",
                     repository_id=repo.pk, generation=1)  # fmt: skip
    attempt = begin_attempt(run_id=run.pk, number=1, worker="w-test")
    assert attempt is not None
    fail_attempt(attempt, RuntimeError("remote hung up"), permanent=True)
    events = activity_feed.recent()
    assert [e["type"] for e in events] == ["dlq.changed", "repo.changed", "job.dead", "job.started"]
    assert "s3cret" not in json.dumps(events)
    changed, dead, started = events[1:]
    assert dead["repo_name"] == started["repo_name"] == changed["name"] == "widget"
    assert changed["url"] == "https://<redacted>@example.com/team/widget.git"


def test_naming_the_repository_costs_the_job_path_no_query_of_its_own() -> None:
    repo = Repository.objects.create(url="https://example.com/team/widget.git")
    run = ensure_run(kind=JobRun.Kind.SYNC, job_id="sync-q-g1", queue="sync",
                     repository_id=repo.pk, generation=1)  # fmt: skip
    with CaptureQueriesContext(connection) as queries:
        attempt = begin_attempt(run_id=run.pk, number=1, worker="w-test")
        assert attempt is not None
        succeed_attempt(attempt)
    alone = [q["sql"] for q in queries.captured_queries
             if re.match(r'SELECT .* FROM "dashboard_repository" WHERE', q["sql"])]  # fmt: skip
    assert alone == []  # the run is loaded with its repository (one join)
    assert [e["repo_name"] for e in activity_feed.recent()] == ["widget", "widget"]
