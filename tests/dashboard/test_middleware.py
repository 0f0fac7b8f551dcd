"""dashboard.middleware through the whole middleware stack: a Redis failure that escapes
its adapter is a 503 (JSON under /api/, an escaped page elsewhere, ``Retry-After``),
never a 500; other errors are not swallowed; every response carries the CSP; and the
audit reason of a write request reaches the entries it records (AuditReasonMiddleware).

The views below are this module's own URLconf (``pytest.mark.urls``); each fails the way
a real adapter would: a real client against a closed port or a missing socket.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import pytest
import redis
from django.contrib.auth.models import User
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import Client
from django.urls import path

from dashboard.accounts.audit import MAX_REASON, record_audit
from dashboard.infra import queues
from dashboard.middleware import CSP
from dashboard.models import AuditEntry
from workers.runtime.redis_server import free_port

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.dashboard.test_middleware")]

#: Set by the ``socket_path`` fixture: the unix socket the ``unix`` view connects to.
SOCKET: list[Path] = []


def closed_port(request: HttpRequest) -> HttpResponse:
    redis.Redis(port=free_port(), socket_connect_timeout=2).ping()
    return HttpResponse("unreachable")


def queue_down(request: HttpRequest) -> HttpResponse:
    queues.build_client(f"redis://127.0.0.1:{free_port()}/0").ping()
    return HttpResponse("unreachable")


def unconfigured(request: HttpRequest) -> HttpResponse:
    queues.redis_urls()
    return HttpResponse("unreachable")


def unix(request: HttpRequest) -> HttpResponse:
    redis.Redis(unix_socket_path=str(SOCKET[0])).ping()
    return HttpResponse("unreachable")


def not_redis(request: HttpRequest) -> HttpResponse:
    raise ValueError("a plain bug")


def audited(request: HttpRequest) -> HttpResponse:
    entry = record_audit(user="op", action="test", target="t", outcome="ok")
    return JsonResponse({"reason": entry.detail.get("reason", "")})


urlpatterns = [
    *(
        p
        for prefix in ("", "api/")
        for p in (
            path(f"{prefix}closed", closed_port),
            path(f"{prefix}queue", queue_down),
            path(f"{prefix}unconfigured", unconfigured),
            path(f"{prefix}unix", unix),
        )
    ),
    path("bug", not_redis),
    path("audited", audited),
]


@pytest.fixture
def socket_path(tmp_path: Path) -> Path:
    SOCKET[:] = [tmp_path / "<b>gone.sock"]
    yield SOCKET[0]
    SOCKET.clear()


@pytest.mark.parametrize(
    ("view", "message"),
    [
        ("closed", "Connection refused"),
        ("queue", queues.QUEUE_DOWN),  # the one wording of a queue outage, no details
        ("unconfigured", "no Redis configured"),
    ],
)
def test_an_escaped_redis_failure_is_a_503_json_under_api(
    settings: object, view: str, message: str
) -> None:
    if view == "unconfigured":
        settings.REDIS_URLS = []  # type: ignore[attr-defined]
        settings.REDIS_URL = ""  # type: ignore[attr-defined]
    client = Client(raise_request_exception=False)
    api = client.get(f"/api/{view}")
    assert api.status_code == 503
    assert api["Content-Type"] == "application/json"
    assert api["Retry-After"] == "5"
    assert message in api.json()["error"]
    if view == "queue":
        assert api.json()["error"] == queues.QUEUE_DOWN
    page = client.get(f"/{view}")
    assert page.status_code == 503 and page["Retry-After"] == "5"
    assert page["Content-Type"].startswith("text/html")
    assert message in page.content.decode() and "try again in a moment" in page.content.decode()


def test_the_page_escapes_the_failure_text(socket_path: Path) -> None:
    page = Client(raise_request_exception=False).get("/unix")
    assert page.status_code == 503
    body = page.content.decode()
    assert "&lt;b&gt;gone.sock" in body and "<b>" not in body


def test_other_errors_are_not_swallowed() -> None:
    response = Client(raise_request_exception=False).get("/bug")
    assert response.status_code == 500
    with pytest.raises(ValueError, match="a plain bug"):
        Client().get("/bug")


def test_every_response_carries_the_content_security_policy() -> None:
    client = Client(raise_request_exception=False)
    for url in ("/audited", "/api/closed", "/nowhere"):
        assert client.get(url)["Content-Security-Policy"] == CSP


def test_the_audit_reason_header_of_a_write_is_the_reason_of_its_entries() -> None:
    User.objects.create_user("op", password="pw-op-12345")
    client = Client()
    reason = "rollback: bad numbers ✓\n" + "x" * 400
    got = client.post("/audited", HTTP_X_AUDIT_REASON=quote(reason)).json()["reason"]
    assert got == ("rollback: bad numbers ✓ " + "x" * 400)[:MAX_REASON]
    assert AuditEntry.objects.get().detail["reason"] == got
    # A read sends no reason; nor does a write without the header; and the reason of
    # one request never leaks into the next.
    assert client.get("/audited", HTTP_X_AUDIT_REASON="sneaky").json()["reason"] == ""
    assert client.post("/audited").json()["reason"] == ""
    assert "reason" not in AuditEntry.objects.order_by("id").last().detail  # type: ignore[union-attr]
