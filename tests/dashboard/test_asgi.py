"""dashboard.asgi: HTTP goes to Django, websockets to the consumers, and every websocket
route is behind the Origin check and the session authentication (the consumers see the
user of the cookie; a foreign page never reaches them)."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest
from channels.testing import HttpCommunicator, WebsocketCommunicator
from django.conf import settings
from django.contrib.auth.models import Permission, User
from django.core.signals import request_started
from django.db import connection
from django.db.backends.signals import connection_created
from django.test import Client

from dashboard.asgi import application, serving, websocket_urls
from dashboard.live.consumers import (
    CLOSE_NOT_FOUND,
    OpsConsumer,
    RepositoryConsumer,
    RepositoryListConsumer,
    RolloutsConsumer,
    UnknownPathConsumer,
)
from dashboard.models import Repository
from dashboard.server import request_threads

pytestmark = pytest.mark.django_db(transaction=True)
HOST = [(b"host", b"localhost")]


def operator_cookie() -> tuple[bytes, bytes]:
    op = User.objects.create_user("op", password="pw-op-12345")
    op.user_permissions.add(Permission.objects.get(codename="view_jobrun"))
    client = Client()
    client.force_login(op)
    return (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())


def test_the_websocket_routes_are_the_four_consumers_then_the_refusal() -> None:
    routes = {str(p.pattern): p.callback.consumer_class for p in websocket_urls}  # type: ignore[attr-defined]
    assert routes == {
        "ws/ops/": OpsConsumer,
        "ws/repos/": RepositoryListConsumer,
        "ws/repos/<id:repo_id>/": RepositoryConsumer,
        "ws/rollouts/": RolloutsConsumer,
        "": UnknownPathConsumer,
    }
    assert str(websocket_urls[-1].pattern) == ""  # last: it matches every path


def test_http_is_served_by_django() -> None:
    async def scenario() -> None:
        comm = HttpCommunicator(application, "GET", "/healthz", headers=HOST)
        response = await comm.get_response(timeout=10)
        assert response["status"] == 200
        comm = HttpCommunicator(application, "GET", "/api/nowhere", headers=HOST)
        missing = await comm.get_response(timeout=10)
        assert missing["status"] == 404 and b'"not found"' in missing["body"]

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("origin", "accepted"),
    [
        (b"http://localhost", True),
        (b"http://127.0.0.1", True),
        (b"http://evil.example", False),
        (b"http://localhost.evil.example", False),
        (b"null", False),
        (b"ftp://localhost", False),
        (None, False),
    ],
)
def test_every_websocket_route_is_behind_the_origin_check(
    origin: bytes | None, accepted: bool
) -> None:
    cookie = operator_cookie()
    repo = Repository.objects.create(url="https://example.com/a/b.git")
    hdrs = [cookie] + ([(b"origin", origin)] if origin else [])

    async def scenario() -> None:
        for path in ("/ws/ops/", f"/ws/repos/{repo.pk}/", "/ws/rollouts/"):
            comm = WebsocketCommunicator(application, path, headers=hdrs)
            ok, _ = await comm.connect(timeout=10)
            assert ok is accepted, (path, origin)
            if ok:
                assert (await comm.receive_json_from(timeout=10))["type"] == "snapshot"
            await comm.disconnect()

    asyncio.run(scenario())


def test_the_consumers_see_the_cookies_user() -> None:
    """Without the session middleware stack every socket would be anonymous (4401)."""
    hdrs = [operator_cookie(), (b"origin", b"http://localhost")]

    async def scenario() -> None:
        comm = WebsocketCommunicator(application, "/ws/ops/", headers=hdrs)
        ok, code = await comm.connect(timeout=10)
        assert ok, code
        await comm.disconnect()
        anonymous = WebsocketCommunicator(
            application, "/ws/ops/", headers=[(b"origin", b"http://localhost")]
        )
        assert await anonymous.connect(timeout=10) == (False, 4401)

    asyncio.run(scenario())


@pytest.mark.parametrize(
    "path", ["/ws/nowhere/", "/", "/ws/repos/9223372036854775808/", "/ws/repos/1x/"]
)
def test_an_unknown_websocket_path_is_refused_cleanly(
    path: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Refused at the handshake (closed with 4404 before being accepted: the server
    answers the upgrade with 403), where Channels' router raised ValueError ("No route
    found"), a 500 with a logged traceback under a real server. A repository id past
    the 64-bit range is no route either (``<id:...>``), not an overflow in the query."""
    hdrs = [operator_cookie(), (b"origin", b"http://localhost")]

    async def scenario() -> None:
        comm = WebsocketCommunicator(application, path, headers=hdrs)
        connected, code = await comm.connect(timeout=10)
        assert (connected, code) == (False, CLOSE_NOT_FOUND)

    with caplog.at_level(logging.ERROR):
        asyncio.run(scenario())
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_requests_run_on_pooled_threads_not_a_new_thread_each(settings: Any) -> None:
    """``dashboard.server.request_threads``: a request's sync code runs on a thread of its own
    (Django's rule: its signals, middleware and view on one thread), but later requests
    reuse that thread instead of starting a new one each; concurrent requests are all
    served. On both databases."""
    # The thread objects themselves (kept alive, so no two can look alike), not their
    # idents, which the system reuses once a thread has ended.
    threads: list[threading.Thread] = []

    def record(sender: object, **kwargs: object) -> None:
        threads.append(threading.current_thread())

    async def one() -> None:
        comm = HttpCommunicator(application, "GET", "/healthz", headers=HOST)
        assert (await comm.get_response(timeout=10))["status"] == 200

    async def scenario() -> None:
        for _ in range(5):
            await one()
        await asyncio.gather(*(one() for _ in range(4)))

    request_started.connect(record)
    try:
        asyncio.run(scenario())
    finally:
        request_started.disconnect(record)
    sequential, concurrent = threads[:5], threads[5:]
    assert threading.main_thread() not in threads
    assert len({id(t) for t in sequential}) == 1  # one thread, reused
    assert len(concurrent) == 4
    assert request_threads.idle_executors() >= 1


def test_on_sqlite_a_request_thread_keeps_its_database_connection() -> None:
    """Served as ``up`` serves it (``asgi.serving``), sequential logged-in pages open one
    SQLite connection between them (the pooled thread's), not one per request."""
    if connection.vendor != "sqlite":
        pytest.skip("PostgreSQL web processes draw from a pool instead")
    cookie = operator_cookie()
    opened: list[object] = []

    def count(sender: object, connection: object, **kwargs: object) -> None:
        opened.append(connection)

    async def scenario() -> None:
        for _ in range(5):
            comm = HttpCommunicator(application, "GET", "/repos/", headers=[*HOST, cookie])
            assert (await comm.get_response(timeout=10))["status"] == 200

    saved = settings.DATABASES["default"]["CONN_MAX_AGE"]
    served = serving()  # what `up`'s web processes run
    assert served is application
    connection_created.connect(count)
    try:
        assert settings.DATABASES["default"]["CONN_MAX_AGE"] == request_threads.SQLITE_CONN_MAX_AGE
        asyncio.run(scenario())
    finally:
        connection_created.disconnect(count)
        settings.DATABASES["default"]["CONN_MAX_AGE"] = saved  # this process only serves tests
    assert len(opened) == 1


def test_a_request_crosses_to_its_thread_once_and_never_back_to_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``SyncChainASGIHandler``: the middleware chain and the view run in one call on the
    request's thread. Django's async chain around sync middleware sends the inner part
    back to the event loop (``async_to_sync``) and then to a thread again, each a wait
    for a busy loop; here no request ever calls ``async_to_sync``, and the middleware and
    view run on one thread, which hands its database connection back before the
    response is sent. (Django's own hand-back at ``response.close()`` runs outside the
    request's context under this harness and finds nothing: on PostgreSQL the pool-slot
    guard then reports every request's pooled connection as left taken.)"""
    import asgiref.sync

    crossings: list[str] = []
    original = asgiref.sync.AsyncToSync.__call__

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        crossings.append(getattr(self.awaitable, "__qualname__", "?"))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(asgiref.sync.AsyncToSync, "__call__", counted)
    threads: set[int] = set()

    def record(sender: object, **kwargs: object) -> None:
        threads.add(threading.get_ident())

    cookie = operator_cookie()

    async def scenario() -> None:
        for path in ("/repos/", "/", "/api/status", "/healthz"):
            comm = HttpCommunicator(application, "GET", path, headers=[*HOST, cookie])
            assert (await comm.get_response(timeout=10))["status"] == 200

    assert isinstance(application.application_mapping["http"], request_threads.SyncChainASGIHandler)
    request_started.connect(record)
    try:
        asyncio.run(scenario())
    finally:
        request_started.disconnect(record)
    assert crossings == []
    assert threading.main_thread().ident not in threads


def test_each_request_records_its_server_time_by_route() -> None:
    from dashboard.observability import counters
    from dashboard.observability.counters import HTTP_REQUEST_SECONDS, parse_field, read_all

    def counts() -> dict[str, float]:
        out: dict[str, float] = {}
        for field, value in read_all().items():
            series, labels = parse_field(field)
            if series == f"{HTTP_REQUEST_SECONDS.name}_count":
                out[labels["view"]] = value
        return out

    counters.discard()
    before = counts()
    cookie = operator_cookie()

    async def scenario() -> None:
        for path in ("/healthz", "/healthz", "/repos/", "/no/such/page"):
            comm = HttpCommunicator(application, "GET", path, headers=[*HOST, cookie])
            await comm.get_response(timeout=10)

    asyncio.run(scenario())
    assert counters.flush()
    after = counts()
    grew = {view: after[view] - before.get(view, 0.0) for view in after}
    grew = {view: n for view, n in grew.items() if n}
    assert grew == {"healthz": 2.0, "repositories": 1.0, "unmatched": 1.0}, grew
    # The seconds add up to something: each observation's time, not a constant.
    sums = {
        parse_field(f)[1]["view"]: v
        for f, v in read_all().items()
        if parse_field(f)[0] == f"{HTTP_REQUEST_SECONDS.name}_sum"
    }
    assert sums["repositories"] > 0
