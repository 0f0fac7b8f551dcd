"""Inputs a careless or hostile client sends, through the real URLconf and middleware:
each is a 4xx with a JSON ``{"error"}`` under ``/api/`` (a form error or a short page
elsewhere), never a 500 and never a logged traceback (docs/api.md#limits). Every test
here failed before its fix on SQLite; the NUL searches and the long scp-style URL
failed only on PostgreSQL, and run there too (``DATABASE_URL``).

The central fixes: ``dashboard.middleware.RequestInputMiddleware`` (bodies, field
counts, multipart framing, NUL in the path or query), ``dashboard.infra.inputs`` (JSON
depth and strings, 64-bit ids, the ``<id:...>`` route converter), ``BadCursor`` for an
out-of-range cursor, ``parse_remote``'s bound on the normalised URL, and
``accounts.reason_problem`` before a reason's action runs.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client

from dashboard.infra.inputs import DB_INT_MAX
from dashboard.models import AnalyzerVersion, ApiToken, JobRun, Repository
from dashboard.versions import state_machine
from dashboard.versions.state_machine import ensure_baseline

pytestmark = pytest.mark.django_db(transaction=True)

#: Deeper than Python's JSON decoder can recurse (it raised RecursionError).
DEEP = "[" * 50_000 + "]" * 50_000


@pytest.fixture
def token() -> str:
    admin = User.objects.create_superuser("root", password="pw-root-123456")
    return ApiToken.issue(admin)[1]


@pytest.fixture
def browser() -> Client:
    client = Client(raise_request_exception=False)
    client.force_login(User.objects.create_superuser("ops", password="pw-ops-123456"))
    return client


@pytest.fixture
def api() -> Client:
    return Client(raise_request_exception=False)


@pytest.fixture(autouse=True)
def no_traceback_logged(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """No test here may log an error (Django's ``django.request`` 500, our API's
    ``log.exception``)."""
    with caplog.at_level(logging.ERROR):
        yield
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]


def bearer(token: str) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {token}"}


def api_post_routes() -> list[str]:
    """Every POST route under /api/, as the OpenAPI document names them (whose routes
    and methods tests/dashboard/api/test_openapi.py checks against the URLconf), with
    sample path arguments (the ids exist or not: the body is refused before the lookup)."""
    from dashboard.api.openapi import PATHS

    samples = {"repo_id": "1", "run_id": "1", "rollout_id": "1", "action": "abort",
               "fingerprint": "abcd", "identity": "a", "verification_id": "1"}  # fmt: skip
    out = []
    for route, methods in PATHS.items():
        if "post" not in methods:
            continue
        for name, value in samples.items():
            route = route.replace("{" + name + "}", value)
        assert "{" not in route, route  # a new path parameter needs a sample above
        out.append(route)
    return out


def cursor(stamp: str, pk: object) -> str:
    raw = json.dumps([stamp, pk]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


# ---------------------------------------------------------------------------- cursors


@pytest.mark.parametrize(
    "bad",
    [
        cursor("0001-01-01T00:00:00+14:00", 1),  # UTC is before year 1: OverflowError
        cursor("9999-12-31T23:59:59-14:00", 1),  # after 9999
        cursor("2026-01-01T00:00:00+00:00", 2**70),  # an id no column holds
        cursor("2026-01-01T00:00:00", 1),  # naive: not one of ours
        cursor("2026-01-01T00:00:00+00:00", True),
    ],
)
def test_a_commits_cursor_out_of_range_is_a_400_and_the_page_shows_page_one(
    api: Client, browser: Client, token: str, bad: str
) -> None:
    repo = Repository.objects.create(url="https://example.com/a/b")
    res = api.get(f"/api/repos/{repo.pk}/commits", {"cursor": bad}, **bearer(token))
    assert res.status_code == 400 and res.json() == {"error": "invalid cursor"}
    page = browser.get(f"/repos/{repo.pk}/", {"cursor": bad})
    assert page.status_code == 200


# ---------------------------------------------------------------------------- NUL


@pytest.mark.parametrize("path", ["/api/runs", "/repos/", "/runs/", "/audit/", "/dead-letters/"])
def test_a_search_for_a_nul_is_a_400(browser: Client, path: str) -> None:
    res = browser.get(path, {"q": "a\x00b"})
    assert res.status_code == 400
    if path.startswith("/api/"):
        assert res.json() == {"error": "the path or query string holds a NUL character"}
    else:
        assert b"NUL character" in res.content


def test_a_nul_in_a_path_is_a_400(api: Client, token: str) -> None:
    res = api.get("/api/dlq/ab%00cd", **bearer(token))
    assert res.status_code == 400 and "NUL" in res.json()["error"]


@pytest.mark.parametrize(
    "body",
    [
        {"url": "https://example.com/a\u0000b"},
        {"url": "https://example.com/a", "branch": "main\u0000"},
        {"url": "\ud800"},
    ],
)
def test_a_json_string_no_column_can_store_is_a_400(api: Client, token: str, body: object) -> None:
    res = api.post("/api/repos", json.dumps(body), content_type="application/json", **bearer(token))
    assert res.status_code == 400 and "the JSON holds" in res.json()["error"]
    assert not Repository.objects.exists()


# ---------------------------------------------------------------------------- URLs


def test_an_scp_style_url_that_normalises_past_the_column_is_a_400(
    api: Client, browser: Client, token: str, settings: Any
) -> None:
    settings.ALLOWED_HOSTS_NETS = ["0.0.0.0/0"]  # the fixture: restored after the test
    url = "git@127.0.0.1:" + "a" * (2048 - len("git@127.0.0.1:"))
    assert len(url) == 2048
    res = api.post("/api/repos", {"url": url}, content_type="application/json", **bearer(token))
    assert res.status_code == 400, res.content
    assert res.json() == {
        "error": "the repository URL is longer than 2048 characters once normalised"
    }
    page = browser.post("/repos/", {"url": url})
    assert page.status_code == 400 and b"once normalised" in page.content  # the form's error
    assert not Repository.objects.exists()


# ---------------------------------------------------------------------------- ids


@pytest.mark.parametrize("kind", ["retry", "discard"])
@pytest.mark.parametrize("runs", [[10**20], [2**63], [1, -1], [0]])
def test_run_ids_outside_the_64_bit_range_are_a_400(
    api: Client, token: str, kind: str, runs: list[int]
) -> None:
    res = api.post(
        f"/api/dlq/{kind}", {"runs": runs}, content_type="application/json", **bearer(token)
    )
    assert res.status_code == 400
    assert res.json() == {"error": '"runs" must be a non-empty list of ids (1 … 2^63-1)'}


def test_the_largest_id_is_accepted_and_matches_nothing(api: Client, token: str) -> None:
    res = api.post(
        "/api/dlq/discard", {"runs": [DB_INT_MAX]}, content_type="application/json",
        **bearer(token),
    )  # fmt: skip
    assert res.status_code == 200 and res.json() == {"moved": 0}


@pytest.mark.parametrize(
    "path",
    [
        "/repos/{n}/",
        "/runs/{n}/",
        "/rollouts/{n}/",
        "/repos/{n}/commits/abc/",
        "/api/repos/{n}",
        "/api/repos/{n}/commits",
        "/api/runs/{n}",
        "/api/rollouts/{n}",
        "/api/actions/{n}",
    ],
)
@pytest.mark.parametrize("n", [2**63, 10**30])
def test_a_path_id_past_64_bits_is_a_404(browser: Client, path: str, n: int) -> None:
    res = browser.get(path.format(n=n))
    assert res.status_code == 404
    if path.startswith("/api/"):
        assert res.json() == {"error": "not found"}


def test_the_largest_path_id_is_looked_up_and_not_found(browser: Client) -> None:
    assert browser.get(f"/repos/{DB_INT_MAX}/").status_code == 404
    res = browser.get(f"/api/runs/{DB_INT_MAX}")
    assert res.status_code == 404 and res.json() == {"error": "run not found"}


# ---------------------------------------------------------------------------- bodies


def test_deeply_nested_json_is_a_400_on_every_post_route(api: Client, token: str) -> None:
    routes = api_post_routes()
    assert len(routes) >= 10, routes
    for route in routes:
        res = api.post(route, DEEP, content_type="application/json", **bearer(token))
        if route.endswith(("/reanalyse", "/hook-secret")) or route.startswith(
            ("/api/repos/1/cancel", "/api/hooks/push/")
        ):  # takes no body, or reads it only once the repository is found
            assert res.status_code == 404 and res.json() == {"error": "repository not found"}
            continue
        if route == "/api/runs/1/cancel":  # takes no body
            assert res.status_code == 404 and res.json() == {"error": "run not found"}
            continue
        assert res.status_code == 400, (route, res.status_code, res.content[:200])
        assert res.json() == {"error": "the JSON nests deeper than 32 levels"}, route


def test_a_multipart_body_without_a_boundary_is_a_400(
    api: Client, browser: Client, token: str
) -> None:
    for client, path, headers in [
        (api, "/api/repos", bearer(token)),
        (browser, "/repos/", {}),
        (api, "/login/", {}),
    ]:
        res = client.post(path, b"--x\r\n", content_type="multipart/form-data", **headers)
        assert res.status_code == 400, (path, res.content[:200])
        assert b"multipart body cannot be read" in res.content


def test_a_body_over_the_limit_is_a_413(api: Client, browser: Client, token: str) -> None:
    big = "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1)
    res = api.post(
        "/api/repos", json.dumps({"url": big}), content_type="application/json", **bearer(token)
    )
    assert res.status_code == 413
    assert res.json() == {
        "error": f"the request body is larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes"
    }
    page = browser.post("/repos/", {"url": big})
    assert page.status_code == 413 and b"larger than" in page.content


def test_more_fields_than_the_limit_are_a_400(api: Client, browser: Client, token: str) -> None:
    fields = {f"f{i}": "1" for i in range(settings.DATA_UPLOAD_MAX_NUMBER_FIELDS + 1)}
    page = browser.post("/repos/", fields)
    assert page.status_code == 400 and b"more than" in page.content
    res = api.post("/api/dlq/retry", fields, **bearer(token))
    assert res.status_code == 400
    assert res.json() == {"error": f"more than {settings.DATA_UPLOAD_MAX_NUMBER_FIELDS} fields"}
    query = api.get("/api/runs", fields, **bearer(token))
    assert query.status_code == 400 and "more than" in query.json()["error"]


# ---------------------------------------------------------------------------- reasons


@pytest.mark.parametrize("reason", ["stop\x1b[2Jnow", "bell\x07", "del\x7f", "c1\x9b31m"])
def test_a_reason_with_control_characters_is_refused_before_the_action(
    api: Client, token: str, reason: str
) -> None:
    ensure_baseline(actor="setup")
    v = state_machine.register_version(config={"detect_renames": True}, actor="setup")
    AnalyzerVersion.objects.filter(pk=v.pk).update(state=AnalyzerVersion.State.DRAINED)
    res = api.post(
        f"/api/versions/{v.fingerprint[:12]}/retire", {"reason": reason},
        content_type="application/json", **bearer(token),
    )  # fmt: skip
    assert res.status_code == 400
    assert res.json() == {"error": '"reason" must not hold control characters (NUL, ESC, …)'}
    assert AnalyzerVersion.objects.get(pk=v.pk).state == AnalyzerVersion.State.DRAINED


def test_a_reason_with_a_nul_is_refused_before_the_action(api: Client, token: str) -> None:
    ensure_baseline(actor="setup")
    v = state_machine.register_version(config={"detect_renames": True}, actor="setup")
    AnalyzerVersion.objects.filter(pk=v.pk).update(state=AnalyzerVersion.State.DRAINED)
    for body in [{"reason": "a\u0000b"}]:
        res = api.post(
            f"/api/versions/{v.fingerprint[:12]}/retire", json.dumps(body),
            content_type="application/json", **bearer(token),
        )  # fmt: skip
        assert res.status_code == 400 and "NUL" in res.json()["error"]
    form = api.post(
        f"/api/versions/{v.fingerprint[:12]}/retire", {"reason": "a\x00b"}, **bearer(token)
    )
    assert form.status_code == 400 and "NUL" in form.json()["error"]
    assert AnalyzerVersion.objects.get(pk=v.pk).state == AnalyzerVersion.State.DRAINED
    ok = api.post(
        f"/api/versions/{v.fingerprint[:12]}/retire", {"reason": "superseded\tby v2"},
        content_type="application/json", **bearer(token),
    )  # fmt: skip
    assert ok.status_code == 200 and ok.json()["state"] == "retired"


def test_jobrun_table_is_untouched_by_refused_retries(api: Client, token: str) -> None:
    """A refused id list acts on nothing (the ids are checked before ``act_now``)."""
    repo = Repository.objects.create(url="https://example.com/a/b")
    run = JobRun.objects.create(
        repository=repo, kind=JobRun.Kind.SYNC, state=JobRun.State.DEAD, job_id="sync-x"
    )
    res = api.post(
        "/api/dlq/retry", {"runs": [run.pk, 2**64]}, content_type="application/json",
        **bearer(token),
    )  # fmt: skip
    assert res.status_code == 400
    assert JobRun.objects.get(pk=run.pk).state == JobRun.State.DEAD


# ---------------------------------------------------------------------------- found by fuzzing
# (tests/dashboard/web/test_form_fuzz.py found both)


@pytest.mark.parametrize(
    "next_", ["nonsense", "/rollouts/\nSet-Cookie: x=1", "https://evil.example/"]
)
def test_a_rollout_forms_next_that_is_no_local_path_goes_to_the_default(
    browser: Client, next_: str
) -> None:
    ensure_baseline(actor="setup")
    v = state_machine.register_version(config={"detect_renames": True}, actor="setup")
    res = browser.post(f"/rollouts/versions/{v.pk}/retire/", {"next": next_})
    assert res.status_code == 302 and res["Location"] == "/rollouts/"


def test_an_empty_submission_over_the_rate_limit_is_a_429_with_its_form_error(
    browser: Client, settings: Any
) -> None:
    settings.RATE_SUBMIT_PER_MINUTE = 1  # the fixture: restored after the test
    assert browser.post("/repos/", {}).status_code == 400  # the form: url is required
    res = browser.post("/repos/", {})
    assert res.status_code == 429 and b"Too many submissions" in res.content


def test_more_files_than_the_limit_are_a_400(api: Client, token: str) -> None:
    """A multipart body with 101 file parts (Django's TooManyFilesSent, a 400 page of
    its own and an ERROR in django.security before): a JSON 400."""
    boundary = "BoUnDaRy"
    parts = b"".join(
        f'--{boundary}\r\nContent-Disposition: form-data; name="f{i}"; filename="f{i}.txt"\r\n'
        f"Content-Type: text/plain\r\n\r\nx\r\n".encode()
        for i in range(settings.DATA_UPLOAD_MAX_NUMBER_FILES + 1)
    )
    res = api.post(
        "/api/repos", parts + f"--{boundary}--\r\n".encode(),
        content_type=f"multipart/form-data; boundary={boundary}", **bearer(token),
    )  # fmt: skip
    assert res.status_code == 400
    assert res.json() == {"error": f"more than {settings.DATA_UPLOAD_MAX_NUMBER_FILES} files"}
