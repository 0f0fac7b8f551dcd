"""dashboard.live.consumers, one consumer at a time, through the real ASGI application (session
cookie, Origin check) and the real channel layer on a real redis-server: who is refused
with which close code, snapshot first and events after, frames that are not ours, a
logout closing the socket, and re-joining the groups after a join that failed.

The whole live view (coalescing bursts, pages, escaping) is in
tests/dashboard/live/test_live_view.py; the
queue server lost or stalled, in tests/system/test_queuedown.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.contrib.auth.models import User
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dashboard.infra import events, queues
from dashboard.infra.events import publish_event
from dashboard.infra.inputs import BadInput, parse_json
from dashboard.live import consumers
from dashboard.models import Repository
from dashboard.settings import channel_layer_host
from tests.conftest import _own_node
from tests.support.sockets import ORIGIN, connect, make_user, session_headers
from workers.runtime.redis_server import RedisNode

pytestmark = pytest.mark.django_db(transaction=True)
FOREIGN = (b"origin", b"http://evil.example")
OPERATOR = ("view_jobrun",)


def run(coro: Any) -> None:
    asyncio.run(coro)


@pytest.fixture
def repo() -> Repository:
    return Repository.objects.create(url="https://example.com/owner/tool.git")


@pytest.mark.parametrize(
    ("who", "path", "code"),
    [
        ("anonymous", "/ws/ops/", consumers.CLOSE_UNAUTHENTICATED),
        ("user", "/ws/ops/", consumers.CLOSE_FORBIDDEN),
        ("anonymous", "/ws/rollouts/", consumers.CLOSE_UNAUTHENTICATED),
        ("user", "/ws/rollouts/", consumers.CLOSE_FORBIDDEN),
        ("anonymous", "/ws/repos/{repo}/", consumers.CLOSE_UNAUTHENTICATED),
        ("user", "/ws/repos/999999/", consumers.CLOSE_NOT_FOUND),
    ],
)
def test_refusals_close_with_the_code_that_says_why(
    repo: Repository, who: str, path: str, code: int
) -> None:
    hdrs = [ORIGIN] if who == "anonymous" else session_headers(make_user(who))

    async def scenario() -> None:
        comm, ok, close_code = await connect(path.format(repo=repo.pk), hdrs)
        assert (ok, close_code) == (False, code)
        await comm.disconnect()

    run(scenario())


@pytest.mark.parametrize("path", ["/ws/ops/", "/ws/rollouts/", "/ws/repos/{repo}/"])
def test_a_foreign_page_is_refused_even_for_an_operator(repo: Repository, path: str) -> None:
    op = make_user("op", perms=OPERATOR)
    refused = [session_headers(op, FOREIGN), session_headers(op, None)]

    async def scenario() -> None:
        for hdrs in refused:
            comm, ok, code = await connect(path.format(repo=repo.pk), hdrs)
            assert not ok
            assert code not in {4401, 4403, 4404}  # refused at the door, not by the consumer
            await comm.disconnect()

    run(scenario())


@pytest.mark.parametrize(
    ("path", "group", "keys"),
    [
        ("/ws/ops/", events.OPS_GROUP, {"locks", "queues", "workers", "dlq"}),
        ("/ws/rollouts/", events.ROLLOUTS_GROUP, set()),
        ("/ws/repos/{repo}/", "repo", {"holders", "waiting"}),
    ],
)
def test_each_consumer_sends_its_snapshot_then_its_groups_events(
    repo: Repository, path: str, group: str, keys: set[str]
) -> None:
    op = make_user("op", perms=OPERATOR)
    group = events.repo_group(repo.pk) if group == "repo" else group
    hdrs = session_headers(op)

    async def scenario() -> None:
        comm, ok, _ = await connect(path.format(repo=repo.pk), hdrs)
        assert ok
        first = await comm.receive_json_from(timeout=10)
        assert first["type"] == "snapshot" and set(first["data"]) >= keys
        layer = get_channel_layer()
        event = {"type": "job.queued", "run": 41, "repo": repo.pk}
        await layer.group_send(group, {"type": "live.event", "event": event})
        message = await comm.receive_json_from(timeout=10)
        assert message == {"type": "events", "events": [event]}
        await comm.disconnect()

    run(scenario())


def test_the_ops_snapshot_groups_dead_letters_only_when_asked() -> None:
    hdrs = session_headers(make_user("op", perms=OPERATOR))

    async def first(path: str) -> dict[str, Any]:
        comm, ok, _ = await connect(path, hdrs)
        assert ok
        snap = await comm.receive_json_from(timeout=10)
        await comm.disconnect()
        return snap["data"]["dlq"]  # type: ignore[no-any-return]

    async def scenario() -> None:
        plain, grouped = await first("/ws/ops/"), await first("/ws/ops/?dlq=groups")
        assert plain["groups"] is None and isinstance(grouped["groups"], list)

    run(scenario())


def test_the_repository_snapshot_has_the_results_marks_only_when_asked(repo: Repository) -> None:
    """``/ws/repos/N/?results=1`` (the analytics pages, docs/live-view.md#analyses-live)
    gets ``results_marks`` in its snapshots; the repository page's socket does not pay
    for them."""
    from dashboard.live.snapshots import repository_live

    hdrs = session_headers(make_user("reader"))

    async def first(path: str) -> dict[str, Any]:
        comm, ok, _ = await connect(path, hdrs)
        assert ok
        snap = await comm.receive_json_from(timeout=10)
        await comm.disconnect()
        return snap["data"]  # type: ignore[no-any-return]

    async def scenario() -> None:
        plain = await first(f"/ws/repos/{repo.pk}/")
        marked = await first(f"/ws/repos/{repo.pk}/?results=1")
        assert "results_marks" not in plain
        want = await sync_to_async(repository_live)(repo.pk, marks=True)
        assert marked["results_marks"] == want["results_marks"]

    run(scenario())


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        ({"text_data": "x" * 5000}, 1009),  # more than a control message
        ({"bytes_data": b"\x00"}, 1009),  # binary: never ours
        ({"text_data": "{"}, 1003),  # not JSON
        # Nested past the decoder's recursion (it raised RecursionError: a logged crash).
        ({"text_data": "[" * 2000 + "]" * 2000}, 1003),
        ({"text_data": '{"type": ' * 400 + "1" + "}" * 400}, 1003),
        ({"text_data": '{"type": "snap\\u0000shot"}'}, 1003),  # a NUL: no text of ours
        ({"text_data": "NaN"}, 1003),  # not JSON (RFC 8259)
    ],
)
def test_frames_that_are_not_ours_close_the_socket(frame: dict[str, Any], code: int) -> None:
    hdrs = session_headers(make_user("op", perms=OPERATOR))

    async def scenario() -> None:
        comm, ok, _ = await connect("/ws/ops/", hdrs)
        assert ok and (await comm.receive_json_from(timeout=10))["type"] == "snapshot"
        await comm.send_to(**frame)
        out = await comm.receive_output(timeout=10)
        assert out == {"type": "websocket.close", "code": code}

    run(scenario())


def test_unknown_control_messages_are_ignored_and_a_snapshot_request_answered() -> None:
    hdrs = session_headers(make_user("op", perms=OPERATOR))

    async def scenario() -> None:
        comm, ok, _ = await connect("/ws/rollouts/", hdrs)
        assert ok and (await comm.receive_json_from(timeout=10))["type"] == "snapshot"
        consumers.SNAPSHOT_MIN_INTERVAL, before = 0.0, consumers.SNAPSHOT_MIN_INTERVAL
        try:
            await comm.send_json_to({"type": "nonsense"})
            await comm.send_json_to([1, 2, 3])
            await comm.send_json_to({"type": "snapshot"})
            assert (await comm.receive_json_from(timeout=10))["type"] == "snapshot"
        finally:
            consumers.SNAPSHOT_MIN_INTERVAL = before
        await comm.disconnect()

    run(scenario())


def test_a_snapshot_asked_for_inside_the_interval_is_answered_when_it_ends(
    repo: Repository,
) -> None:
    """A page asks for a snapshot because an event told it something changed; one asked
    within a second of the last snapshot (which may predate the change) is answered
    when the second ends, never dropped — and a burst of requests costs one snapshot."""
    hdrs = session_headers(make_user("op", perms=OPERATOR))

    async def scenario() -> None:
        comm, ok, _ = await connect(f"/ws/repos/{repo.pk}/", hdrs)
        assert ok
        first = await comm.receive_json_from(timeout=10)
        assert first["type"] == "snapshot" and first["data"]["head"] is None
        # The change, then its request, inside the interval of the first snapshot.
        await sync_to_async(Repository.objects.filter(pk=repo.pk).update)(head="ab" * 20)
        await comm.send_json_to({"type": "snapshot"})
        answer = await comm.receive_json_from(timeout=10)
        assert answer["type"] == "snapshot" and answer["data"]["head"] == "ab" * 20
        # A burst inside the next interval (3 s here, so that a slow machine still sends
        # all 20 inside it): one snapshot when it ends, after which nothing more.
        consumers.SNAPSHOT_MIN_INTERVAL = 3.0
        for _ in range(20):
            await comm.send_json_to({"type": "snapshot"})
        assert (await comm.receive_json_from(timeout=10))["type"] == "snapshot"
        assert await comm.receive_nothing(timeout=4.0)
        await comm.disconnect()

    before = consumers.SNAPSHOT_MIN_INTERVAL
    try:
        run(scenario())
    finally:
        consumers.SNAPSHOT_MIN_INTERVAL = before


def test_a_logout_closes_the_users_sockets_as_unauthenticated() -> None:
    op = make_user("op", perms=OPERATOR)
    browser = Client()
    browser.force_login(op)
    cookie = (b"cookie", f"sessionid={browser.cookies['sessionid'].value}".encode())

    async def scenario() -> None:
        comm, ok, _ = await connect("/ws/ops/", [ORIGIN, cookie])
        assert ok and (await comm.receive_json_from(timeout=10))["type"] == "snapshot"
        await sync_to_async(browser.post)("/logout/")
        out = await comm.receive_output(timeout=10)
        assert out == {"type": "websocket.close", "code": consumers.CLOSE_UNAUTHENTICATED}

    run(scenario())


@pytest.fixture
def queue_node(settings: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisNode]:
    """A queue server (and channel layer) of its own, which the test may kill."""
    settings.QUEUE_TIMEOUT = 0.3
    node = _own_node(tmp_path_factory.mktemp("queue"))
    settings.REDIS_URL = node.url
    # A new dict, so Channels' setting_changed hook drops the cached layer.
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "dashboard.infra.events.ResilientChannelLayer",
            "CONFIG": {"hosts": [channel_layer_host(node.url, 0.3)]},
        }
    }
    queues.CIRCUIT.reset()
    yield node
    node.kill()
    queues.CIRCUIT.reset()


def test_a_socket_whose_join_failed_joins_again_and_gets_a_fresh_snapshot(
    queue_node: RedisNode, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The queue server is down while the socket connects: it is accepted with a
    snapshot but is in no group. Once the server is back, the next re-join check joins
    the groups, sends a fresh snapshot (events were missed), and events flow."""
    monkeypatch.setattr(consumers, "REJOIN_SECONDS", 0.2)  # the check's period, not a wait
    op = make_user("op", perms=OPERATOR)
    hdrs = session_headers(op)
    queue_node.kill()

    async def scenario() -> None:
        comm, ok, _ = await connect("/ws/ops/", hdrs)
        assert ok and (await comm.receive_json_from(timeout=10))["type"] == "snapshot"
        await sync_to_async(queue_node.start)()
        queues.CIRCUIT.reset()
        again = await comm.receive_json_from(timeout=30)
        assert again["type"] == "snapshot"
        await sync_to_async(publish_event)("job.queued", {"run": 5, "repo": 1})
        message = await comm.receive_json_from(timeout=10)
        while message["type"] == "snapshot":  # a snapshot may be in flight meanwhile
            message = await comm.receive_json_from(timeout=10)
        assert message["type"] == "events" and message["events"][0]["run"] == 5
        await comm.disconnect()

    run(scenario())


def test_a_joined_socket_does_not_join_again(
    queue_node: RedisNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a failed join is retried: a joined socket gets no second snapshot from the
    re-join check (a snapshot costs the database a full read)."""
    monkeypatch.setattr(consumers, "REJOIN_SECONDS", 0.05)
    op = make_user("op", perms=OPERATOR)
    hdrs = session_headers(op)

    async def scenario() -> None:
        comm, ok, _ = await connect("/ws/ops/", hdrs)
        assert ok and (await comm.receive_json_from(timeout=10))["type"] == "snapshot"
        # Many re-join periods later an event is the next message, not a snapshot.
        for i in range(10):
            await sync_to_async(publish_event)("job.queued", {"run": i, "repo": 1})
            message = await comm.receive_json_from(timeout=10)
            assert message["type"] == "events", message
        await comm.disconnect()

    run(scenario())


#: Frames a client may send: JSON of any shape (but a snapshot request, answered below),
#: any text, text that looks like JSON nested deep, and binary.
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=10,
).filter(lambda v: not (isinstance(v, dict) and v.get("type") == "snapshot"))
_FRAMES = st.lists(
    st.one_of(
        _JSON.map(lambda v: {"text_data": json.dumps(v)}),
        st.text(min_size=1, max_size=200).map(lambda t: {"text_data": t}),
        st.integers(1, 3000).map(lambda n: {"text_data": "[" * n + "]" * n}),
        st.integers(1, 1500).map(lambda n: {"text_data": '{"a":' * n + "0" + "}" * n}),
        st.binary(min_size=1, max_size=50).map(lambda b: {"bytes_data": b}),
    ),
    min_size=1,
    max_size=5,
)


def _closes(frame: dict[str, Any]) -> int | None:
    """The close code a frame must get, None if the socket must stay open."""
    text = frame.get("text_data")
    if text is None or len(text) > consumers.MAX_INBOUND_BYTES:
        return 1009
    try:
        parse_json(text)
    except BadInput:
        return 1003
    return None


@settings(
    max_examples=25,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(frames=_FRAMES)
def test_arbitrary_frames_never_crash_the_consumer(
    frames: list[dict[str, Any]], caplog: pytest.LogCaptureFixture
) -> None:
    """docs/testing.md#fuzzing: whatever a client sends, the socket either closes with
    the code that says why (1003 not JSON we take, 1009 too big or binary) or stays
    open and still answers a snapshot request; the consumer never raises and nothing
    is logged at ERROR."""
    caplog.set_level(logging.ERROR)
    caplog.clear()
    user = User.objects.filter(username="fuzz").first() or make_user("fuzz")
    hdrs = session_headers(user)

    async def scenario() -> None:
        comm, ok, _ = await connect("/ws/repos/", hdrs)
        assert ok and (await comm.receive_json_from(timeout=10))["type"] == "snapshot"
        for frame in frames:
            await comm.send_to(**frame)
            code = _closes(frame)
            if code is not None:
                out = await comm.receive_output(timeout=10)
                assert out == {"type": "websocket.close", "code": code}, frame
                return
        consumers.SNAPSHOT_MIN_INTERVAL, before = 0.0, consumers.SNAPSHOT_MIN_INTERVAL
        try:
            await comm.send_json_to({"type": "snapshot"})
            assert (await comm.receive_json_from(timeout=10))["type"] == "snapshot"
        finally:
            consumers.SNAPSHOT_MIN_INTERVAL = before
        await comm.disconnect()

    run(scenario())
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
