"""dashboard.web.page_cache: whole pages reused across viewers with the same permissions for
the snapshot TTL, with each viewer's own name and CSRF token; through Django's test
client against the real database and Redis masters (conftest)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.contrib.messages import constants
from django.contrib.messages.storage.base import Message
from django.contrib.messages.storage.cookie import CookieStorage
from django.db import connection
from django.test import Client, RequestFactory
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from dashboard.live import snapshots
from dashboard.live.snapshots import ops_snapshot
from dashboard.locks import leases
from dashboard.models import JobRun, Repository
from dashboard.web import page_cache
from tests.support.gitrepo import GitRepo
from workers.locks import keys

pytestmark = pytest.mark.django_db(transaction=True)

TOKEN = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')


@pytest.fixture(autouse=True)
def _reuse(settings: object) -> Iterator[None]:
    settings.SNAPSHOT_TTL = 3600.0  # type: ignore[attr-defined]  # nothing expires meanwhile
    page_cache.clear()
    yield
    page_cache.clear()


def _operators_group(*codenames: str) -> Group:
    group = Group.objects.create(name="ops-" + "-".join(codenames))
    group.permissions.set(Permission.objects.filter(codename__in=codenames))
    return group


def _client(name: str, group: Group, *, csrf: bool = False) -> Client:
    user = User.objects.create_user(name, password="pw-12345678", is_staff=True)
    user.groups.add(group)
    client = Client(enforce_csrf_checks=csrf)
    client.force_login(user)
    return client


def _page(client: Client, path: str) -> str:
    res = client.get(path)
    assert res.status_code == 200
    text = res.content.decode()
    assert page_cache.CSRF_MARK not in text and page_cache.USER_MARK not in text
    return text


def _queries(client: Client, path: str) -> tuple[str, list[str]]:
    with CaptureQueriesContext(connection) as ctx:
        text = _page(client, path)
    return text, [q["sql"] for q in ctx.captured_queries]


def _without_tokens(text: str) -> str:
    return TOKEN.sub('name="csrfmiddlewaretoken" value=""', text)


def test_a_second_viewer_with_the_same_permissions_gets_the_page_without_its_queries() -> None:
    group = _operators_group("view_jobrun")
    alice, bob = _client("alice", group), _client("bob", group)
    Repository.objects.create(url="https://example.com/t/reponumberone.git")
    first, first_queries = _queries(alice, "/repos/")
    assert "reponumberone" in first
    # Written straight to the database (no event): a reused page does not show it yet.
    Repository.objects.create(url="https://example.com/t/reponumbertwo.git")
    again, again_queries = _queries(bob, "/repos/")
    assert "reponumbertwo" not in again
    assert not any("dashboard_repository" in q for q in again_queries)
    assert any("dashboard_repository" in q for q in first_queries)
    # The same page, with each viewer's own name in the header.
    mine = (
        _without_tokens(first).replace("alice", "bob").replace('data-reused="0"', 'data-reused="1"')
    )
    assert _without_tokens(again) == mine
    assert "alice" not in again and "bob" in again
    # After the TTL the next request renders afresh.
    page_cache.clear()
    assert "reponumbertwo" in _page(bob, "/repos/")


def test_every_viewer_gets_a_csrf_token_of_their_own_session() -> None:
    group = _operators_group("view_jobrun")
    alice = _client("alice", group, csrf=True)
    bob = _client("bob", group, csrf=True)
    alice_page = _page(alice, "/repos/")
    bob_page = _page(bob, "/repos/")  # reused from alice's render
    alice_token = TOKEN.findall(alice_page)[0]
    bob_tokens = set(TOKEN.findall(bob_page))
    assert len(bob_tokens) == 1 and alice_token not in bob_tokens
    form = {"url": "https://example.com/t/x.git", "branch": ""}
    # alice's token is refused in bob's session; bob's own (from the reused page) passes.
    assert bob.post("/repos/", {**form, "csrfmiddlewaretoken": alice_token}).status_code == 403
    res = bob.post("/repos/", {**form, "csrfmiddlewaretoken": bob_tokens.pop()})
    assert res.status_code in (200, 302, 400)  # past the CSRF check (the form decides)


def test_a_viewers_own_action_shows_on_their_next_page(tmp_path: Path) -> None:
    origin = GitRepo.create(tmp_path / "zebrafish")
    origin.commit("first commit", {"README.md": "hello\n"})
    group = _operators_group("view_jobrun")
    alice, bob = _client("alice", group), _client("bob", group)
    _page(bob, "/repos/")  # stored
    res = alice.post("/repos/", {"url": str(origin.path), "branch": ""}, follow=True)
    assert res.redirect_chain and "Submitted zebrafish" in res.content.decode()  # flash shown
    assert "zebrafish" in _page(alice, "/repos/")  # her submission, not the stored page


def test_viewers_with_other_permissions_never_share_a_page() -> None:
    repo = Repository.objects.create(url="https://example.com/t/x.git")
    JobRun.objects.create(
        job_id="d0", kind="sync", queue="sync", repository=repo, state="dead",
        cause_key="k", error="boom", finished_at=timezone.now(),
    )  # fmt: skip
    retrier = _client("retrier", _operators_group("view_jobrun", "retry_jobrun"))
    watcher = _client("watcher", _operators_group("view_jobrun"))
    assert "retry group" in _page(retrier, "/dead-letters/")
    assert "retry group" not in _page(watcher, "/dead-letters/")
    # Nor a user without the page's permission: the view's own check answers them.
    outsider = _client("outsider", _operators_group("add_repository"))
    assert outsider.get("/dead-letters/").status_code == 403
    sent = outsider.get("/")  # the overview sends them to their work, Location kept
    assert sent.status_code == 302 and sent["Location"] == "/repos/"


def test_a_flash_message_is_shown_to_its_user_only() -> None:
    group = _operators_group("view_jobrun")
    alice, bob = _client("alice", group), _client("bob", group)
    _page(bob, "/audit/")  # stored
    storage = CookieStorage(RequestFactory().get("/"))
    alice.cookies[storage.cookie_name] = storage._encode(  # type: ignore[attr-defined]
        [Message(constants.INFO, "only for alice")]
    )
    assert "only for alice" in _page(alice, "/audit/")  # rendered for her, not reused
    assert "only for alice" not in _page(bob, "/audit/")  # and her render was not stored
    assert "only for alice" not in _page(alice, "/audit/")  # shown once


def test_a_name_is_escaped_in_a_reused_page() -> None:
    group = _operators_group("view_jobrun")
    _page(_client("plain", group), "/locks/")
    page = _page(_client("<i>o&p</i>", group), "/locks/")
    assert "&lt;i&gt;o&amp;p&lt;/i&gt;" in page and "<i>o&p" not in page


def test_ttl_zero_renders_every_time(settings: object) -> None:
    settings.SNAPSHOT_TTL = 0.0  # type: ignore[attr-defined]
    group = _operators_group("view_jobrun")
    alice, bob = _client("alice", group), _client("bob", group)
    _page(alice, "/repos/")
    Repository.objects.create(url="https://example.com/t/later.git")
    assert "later" in _page(bob, "/repos/")


def test_the_store_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(page_cache, "LIMIT", 5)
    alice = _client("alice", _operators_group("view_jobrun"))
    for i in range(12):
        _page(alice, f"/repos/?q=n{i}")
    assert len(page_cache._ENTRIES) == 5
    assert {key[2] for key in page_cache._ENTRIES} == {f"/repos/?q=n{i}" for i in range(7, 12)}


def test_a_live_regions_refetch_is_rendered_afresh_and_a_reused_page_says_so() -> None:
    group = _operators_group("view_jobrun")
    alice, bob = _client("alice", group), _client("bob", group)
    assert 'data-reused="0"' in _page(alice, "/repos/")  # rendered for her
    Repository.objects.create(url="https://example.com/t/reponumberthree.git")
    reused = _page(bob, "/repos/")
    # gitward.js refetches the live regions of a reused page once its socket joined.
    assert 'data-reused="1"' in reused and "reponumberthree" not in reused
    # Its refetch after an event (fetchFresh) is rendered afresh, and stored for others.
    fresh = bob.get("/repos/", headers={page_cache.FRESH_HEADER: "1"}).content.decode()
    assert "reponumberthree" in fresh and 'data-reused="0"' in fresh
    assert "reponumberthree" in _page(alice, "/repos/")


def test_a_dead_letter_pages_refetch_builds_its_shared_groups_afresh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A dead letter written by another process publishes nothing here, so the shared
    groups the page was rendered from stay for the TTL; gitward.js refetches them for
    a snapshot newer than the page (``FRESH_HEADER``), which must not get that copy."""
    monkeypatch.setattr(snapshots, "_PARTS", {})  # none of another test's
    alice = _client("alice", _operators_group("view_jobrun"))
    assert "0 dead runs" in _page(alice, "/dead-letters/")
    repo = Repository.objects.create(url="https://example.com/t/poison.git")
    JobRun.objects.create(
        job_id="j-poison", kind=JobRun.Kind.ANALYZE, queue="analysis", repository=repo,
        state=JobRun.State.DEAD, attempts=3, cause_key="c-poison", cause="Error poison",
        error="boom", finished_at=timezone.now(),
    )  # fmt: skip
    page_cache.clear()  # not the stored page: its shared groups
    assert "0 dead runs" in _page(alice, "/dead-letters/")  # the copy, as any page may
    fresh = alice.get("/dead-letters/", headers={page_cache.FRESH_HEADER: "1"})
    assert "1 dead run" in fresh.content.decode()
    page_cache.clear()
    assert "1 dead run" in _page(alice, "/dead-letters/")  # kept for the others


def test_a_newer_snapshot_copy_retires_the_pages_stored_before_it() -> None:
    group = _operators_group("view_jobrun")
    alice, bob = _client("alice", group), _client("bob", group)
    _page(alice, "/locks/")  # takes a copy (not stored: the copy came during the render)
    _page(alice, "/locks/")  # stored, with that copy
    repo = Repository.objects.create(url="https://example.com/t/gen.git")
    lock = leases.redlock().acquire(keys.mirror(repo.pk), ttl=60, holder={"job": "j-gen"})
    try:
        assert "j-gen" not in _page(bob, "/locks/")  # reused: the copy predates the lock
        ops_snapshot(dlq_groups=False, not_before=time.monotonic())  # a socket's newer copy
        assert "j-gen" in _page(bob, "/locks/")
    finally:
        lock.release()
