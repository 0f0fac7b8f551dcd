"""The web surface against the attack catalog's rows D1–D10 (docs/security.md)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import Permission, User
from django.test import Client
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from dashboard.asgi import application
from dashboard.models import Repository
from tests.support.gitrepo import GitRepo

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.django_db(transaction=True)


def make_user(
    name: str, *, staff: bool = False, perms: tuple[str, ...] = (), superuser: bool = False
) -> User:
    if superuser:
        return User.objects.create_superuser(name, password=f"pw-{name}-12345")
    user = User.objects.create_user(name, password=f"pw-{name}-12345", is_staff=staff)
    if perms:
        user.user_permissions.add(*Permission.objects.filter(codename__in=perms))
    return user


# ---------------------------------------------------------------------------- D1


def _check_deploy(**env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("GITWARD_", "DATABASE_URL"))}
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "check", "--deploy", "--fail-level", "WARNING"],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_d1_production_settings_pass_check_deploy(tmp_path: Path) -> None:
    result = _check_deploy(
        GITWARD_PRODUCTION="true",
        GITWARD_SECRET_KEY="x" * 20 + "-k3y-With-Enough-Entropy-" + "y9" * 20,
        GITWARD_ALLOWED_HOSTS="gitward.example.com",
        GITWARD_VAR_DIR=str(tmp_path),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"GITWARD_PRODUCTION": "true"}, "GITWARD_SECRET_KEY"),
        ({"GITWARD_ALLOWED_HOSTS": "*"}, "not '*'"),
        ({"GITWARD_LOCK_TTL": "soon"}, "must be a number"),
    ],
)
def test_d1_unsafe_or_broken_settings_refuse_to_start(
    env: dict[str, str], message: str, tmp_path: Path
) -> None:
    result = _check_deploy(GITWARD_VAR_DIR=str(tmp_path), **env)
    assert result.returncode != 0 and message in result.stderr


# ---------------------------------------------------------------------------- D2, D3

MUTATIONS = [
    ("/api/repos", {"url": "https://example.com/a/b.git"}, None),
    ("/api/dlq/retry", {"all": True}, "retry_jobrun"),
    ("/api/dlq/discard", {"all": True}, "discard_jobrun"),
    ("/api/locks/release", {"key": "locks:none"}, "force_release_lock"),
]


def test_d2_mutations_need_post_and_a_csrf_token() -> None:
    admin = make_user("root", superuser=True)
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin)
    for path, body, _ in MUTATIONS:
        assert client.get(path).status_code == 405, path  # GET never mutates
        res = client.post(path, body, content_type="application/json")
        assert res.status_code == 403 and res.json()["error"] == "CSRF verification failed", path
    assert client.post("/repos/", {"url": "https://example.com/x.git"}).status_code == 403
    assert client.post("/logout/").status_code == 403
    cross = Client(enforce_csrf_checks=True, HTTP_ORIGIN="https://evil.example")
    cross.force_login(admin)
    cross.get("/repos/")
    token = cross.cookies["csrftoken"].value
    res = cross.post(
        "/api/repos",
        {"url": "https://example.com/y.git"},
        content_type="application/json",
        HTTP_X_CSRFTOKEN=token,
    )
    assert res.status_code == 403  # right token, foreign Origin
    assert Repository.objects.count() == 0


@pytest.mark.parametrize("role", ["anonymous", "user", "staff", "staff+perm", "superuser"])
def test_d3_permission_matrix_over_every_mutating_endpoint(role: str) -> None:
    client = Client()
    if role != "anonymous":
        perms = (*(p for _, _, p in MUTATIONS if p), "view_jobrun") if role == "staff+perm" else ()
        user = make_user(
            role.replace("+", "_"), staff=role != "user", perms=perms, superuser=role == "superuser"
        )
        client.force_login(user)
    for path, body, perm in MUTATIONS:
        res = client.post(path, body, content_type="application/json")
        if role == "anonymous":
            expected = {401}
        elif perm is None:
            expected = {200, 202}  # any logged-in user may submit
        elif role in {"staff+perm", "superuser"}:
            expected = {200, 202}
        else:
            expected = {403}
        assert res.status_code in expected, (role, path, res.status_code, res.content)
        assert "error" in res.json() or res.status_code in {200, 202}
    # The admin's DLQ list is for staff only; a plain user is sent to the admin login.
    admin_page = client.get("/admin/dashboard/jobrun/")
    if role in {"anonymous", "user"}:
        assert admin_page.status_code == 302 and "/admin/login/" in admin_page["Location"]
    elif role == "staff":
        assert admin_page.status_code == 403
    else:
        assert admin_page.status_code == 200


# ---------------------------------------------------------------------------- D4


def test_d4_operations_data_is_for_operators_only(git_repo: GitRepo) -> None:
    """Repositories are team-visible by design (no per-user ownership); what reveals
    other people's jobs — locks, workers, dead letters with tracebacks, bulk actions —
    needs dashboard.view_jobrun over HTTP and over the websocket."""
    from dashboard.repositories.lifecycle import submit_repository

    repo, _ = submit_repository(url=str(git_repo.path))
    plain, op = make_user("plain"), make_user("op", staff=True, perms=("view_jobrun",))
    for user, allowed in ((plain, False), (op, True)):
        c = Client()
        c.force_login(user)
        for path in ("/api/status", "/api/dlq", "/api/dlq/abc123", "/api/actions/1"):
            res = c.get(path)
            assert (res.status_code != 403) == allowed, (user.username, path)
        assert c.get(f"/api/repos/{repo.pk}").status_code == 200  # team-visible


# ---------------------------------------------------------------------------- D5, D6


def _cookie(user: User) -> bytes:
    c = Client()
    c.force_login(user)
    return f"sessionid={c.cookies['sessionid'].value}".encode()


@pytest.mark.parametrize(
    "origin",
    [
        b"https://evil.example",
        b"null",
        b"http://localhost.evil.com",
        b"ftp://localhost",
        b"http://127.0.0.1.evil.com:80",
        None,
    ],
)
def test_d5_foreign_origins_cannot_open_a_socket(origin: bytes | None) -> None:
    op = make_user("op", staff=True, perms=("view_jobrun",))
    headers = [(b"cookie", _cookie(op))] + ([(b"origin", origin)] if origin else [])

    async def scenario() -> bool:
        comm = WebsocketCommunicator(application, "/ws/ops/", headers=headers)
        ok, _ = await comm.connect(timeout=10)
        await comm.disconnect()
        return ok

    assert asyncio.run(scenario()) is False


def test_d6_logout_closes_open_sockets_and_a_new_password_refuses_old_sessions() -> None:
    op = make_user("op", staff=True, perms=("view_jobrun",))
    browser = Client()
    browser.force_login(op)
    cookie = f"sessionid={browser.cookies['sessionid'].value}".encode()
    headers = [(b"cookie", cookie), (b"origin", b"http://localhost")]

    async def scenario() -> None:
        comm = WebsocketCommunicator(application, "/ws/ops/", headers=headers)
        assert (await comm.connect(timeout=10))[0]
        await comm.receive_json_from(timeout=10)  # snapshot
        await sync_to_async(browser.post)("/logout/")
        closed = await comm.receive_output(timeout=10)
        assert closed["type"] == "websocket.close" and closed["code"] == 4401
        await comm.disconnect()
        # The old cookie no longer opens anything.
        again = WebsocketCommunicator(application, "/ws/ops/", headers=headers)
        ok, code = await again.connect(timeout=10)
        assert not ok and code == 4401

    asyncio.run(scenario())
    second = Client()
    second.force_login(op)
    cookie2 = f"sessionid={second.cookies['sessionid'].value}".encode()
    op.set_password("a-brand-new-password-1")
    op.save()

    async def after_password_change() -> None:
        comm = WebsocketCommunicator(
            application,
            "/ws/ops/",
            headers=[(b"cookie", cookie2), (b"origin", b"http://localhost")],
        )
        ok, code = await comm.connect(timeout=10)
        assert not ok and code == 4401

    asyncio.run(after_password_change())


# ---------------------------------------------------------------------------- D8, D10


def test_d8_submissions_and_api_calls_are_rate_limited_per_user(
    settings, git_repo: GitRepo
) -> None:
    settings.RATE_SUBMIT_PER_MINUTE = 3
    settings.RATE_API_PER_MINUTE = 8
    alice, bob = make_user("alice"), make_user("bob")
    a, b = Client(), Client()
    a.force_login(alice)
    b.force_login(bob)
    responses = [
        a.post("/api/repos", {"url": str(git_repo.path)}, content_type="application/json")
        for _ in range(4)
    ]
    codes = [r.status_code for r in responses]
    repo_id = responses[0].json()["id"]
    assert codes[:3] == [202, 200, 200] and codes[3] == 429
    res = a.post("/api/repos", {"url": str(git_repo.path)}, content_type="application/json")
    assert res.status_code == 429 and int(res["Retry-After"]) > 0
    assert "at most 3 per minute" in res.json()["error"]
    form = a.post("/repos/", {"url": str(git_repo.path)})
    assert form.status_code == 429 and b"Too many submissions" in form.content
    assert (
        b.post(
            "/api/repos", {"url": str(git_repo.path)}, content_type="application/json"
        ).status_code
        == 200
    )  # bob has his own budget
    reads = [a.get(f"/api/repos/{repo_id}").status_code for _ in range(4)]
    assert reads[-1] == 429 and set(reads[:-1]) <= {200, 429}


def test_d8_d10_sockets_cap_frames_throttle_snapshots_and_report_drops(monkeypatch) -> None:
    from dashboard.live import consumers, fanout

    monkeypatch.setattr(fanout, "MAX_PENDING", 20)  # a slow client's small buffer
    # One flush every 2 s: more than 20 of the 301 events surely land in one window, even
    # when a loaded machine sends them slowly (at 0.1 s a slow sender never overflowed).
    monkeypatch.setattr(fanout, "FLUSH_SECONDS", 2.0)
    op = make_user("op", staff=True, perms=("view_jobrun",))
    headers = [(b"cookie", _cookie(op)), (b"origin", b"http://localhost")]

    async def scenario() -> None:
        comm = WebsocketCommunicator(application, "/ws/ops/", headers=headers)
        assert (await comm.connect(timeout=10))[0]
        assert (await comm.receive_json_from(timeout=10))["type"] == "snapshot"
        # More distinct events than a client may have pending: the newest are kept and
        # the client is told how many it missed (so it asks for a snapshot).
        from channels.layers import get_channel_layer

        layer = get_channel_layer()
        last = 300
        for i in range(last + 1):
            await layer.group_send(
                "live.ops", {"type": "live.event", "event": {"type": "job.queued", "run": i}}
            )
        dropped = 0
        while True:
            msg = await comm.receive_json_from(timeout=10)
            if msg["type"] == "events":
                dropped += msg.get("dropped", 0)
                if any(e.get("run") == last for e in msg["events"]):
                    break
        assert dropped > 0
        # A flood of snapshot requests costs at most one snapshot per interval (1 s).
        # The interval is set (the clock, not the code) so that no timing decides it: a
        # flood inside one interval gets nothing; at an interval of 0 every request is
        # answered, so the throttle — not a lost request — is what holds the first back.
        assert consumers.SNAPSHOT_MIN_INTERVAL == 1.0
        monkeypatch.setattr(consumers, "SNAPSHOT_MIN_INTERVAL", 3600.0)
        assert await snapshots_for_a_flood(comm) == 0
        monkeypatch.setattr(consumers, "SNAPSHOT_MIN_INTERVAL", 0.0)
        comm = WebsocketCommunicator(application, "/ws/ops/", headers=headers)
        assert (await comm.connect(timeout=10))[0]
        assert (await comm.receive_json_from(timeout=10))["type"] == "snapshot"
        assert await snapshots_for_a_flood(comm) == 50

    async def snapshots_for_a_flood(comm: WebsocketCommunicator) -> int:
        """Send 50 snapshot requests, then an oversize frame; count snapshots until the
        close. The consumer handles frames in order, so by the close (code 1009) every
        snapshot the flood caused has been sent."""
        for _ in range(50):
            await comm.send_json_to({"type": "snapshot"})
        await comm.send_to(text_data="x" * 10_000)  # oversize frame
        snapshots = 0
        out = await comm.receive_output(timeout=10)
        while out["type"] != "websocket.close":
            snapshots += json.loads(out.get("text", "{}")).get("type") == "snapshot"
            out = await comm.receive_output(timeout=10)
        assert out["code"] == 1009
        return snapshots

    asyncio.run(scenario())


# ---------------------------------------------------------------------------- D9

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=80),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
hostile_text = st.one_of(
    st.text(max_size=300),
    st.sampled_from(
        [
            "-oProxyCommand=x",
            "ext::sh -c id",
            "file:///etc/passwd",
            "http://[::1]/x",
            "https://user:pw@h.example/x",
            "git@h:-x",
            "\x00",
            "../../etc",
            "/etc",
            "https://0x7f000001/x.git",
            "https://h.example/x.git#frag",
        ]
    ),
)


@hsettings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    url=st.one_of(hostile_text, json_values), branch=st.one_of(st.none(), hostile_text, json_values)
)
def test_d9_fuzzed_submissions_never_500(url: object, branch: object) -> None:
    from django.conf import settings as dj

    dj.RATE_SUBMIT_PER_MINUTE = dj.RATE_API_PER_MINUTE = 0
    user = User.objects.get_or_create(username="fuzz")[0]
    client = Client()
    client.force_login(user)
    body = {"url": url} if branch is None else {"url": url, "branch": branch}
    res = client.post("/api/repos", json.dumps(body), content_type="application/json")
    assert res.status_code in {200, 202, 400}, res.content
    assert "error" in res.json() or res.status_code in {200, 202}
    if isinstance(url, str) and isinstance(branch, (str, type(None))):
        form = client.post("/repos/", {"url": url, "branch": branch or ""})
        assert form.status_code in {302, 400}
    for repo in Repository.objects.all():  # anything stored passed the URL policy
        from dashboard.repositories.lifecycle import validate_remote

        assert validate_remote(repo.fetch_url).url == repo.url


# ---------------------------------------------------------------------------- D7

PAYLOADS = ['<script>alert("x")</script>', '<img src=x onerror="alert(1)">', "javascript:alert(1)"]


def test_d7_repository_data_is_text_everywhere(tmp_path: Path, monkeypatch) -> None:
    """Payloads in messages, author names and file names: escaped in every page, plain
    JSON strings in events, and the live view's script never writes HTML."""
    from tests.conftest import run_workers

    evil = GitRepo.create(tmp_path / "evil")
    for i, payload in enumerate(PAYLOADS):
        evil.commit(payload, {f"{i}{payload}.txt": payload}, author=(payload, f"{i}@example.com"))
    # Make its analysis fail with the payload in the error too (a poison repository).
    monkeypatch.setenv("GITWARD_FAILPOINTS", "analyze.parsing#poison=raise")
    poisoned = GitRepo.create(tmp_path / "poison")
    poisoned.commit(PAYLOADS[1], {"a.txt": "a"})
    from dashboard.repositories.lifecycle import submit_repository

    repo, _ = submit_repository(url=str(evil.path))
    submit_repository(url=str(poisoned.path))
    run_workers()
    admin = make_user("root", superuser=True)
    c = Client()
    c.force_login(admin)
    pages = [f"/repos/{repo.pk}/", "/repos/", "/", "/dead-letters/", "/locks/", "/audit/"]
    for path in pages:
        html = c.get(path).content.decode()
        for payload in PAYLOADS[:2]:
            assert payload not in html, path
    assert "&lt;script&gt;" in c.get(f"/repos/{repo.pk}/").content.decode()
    assert 'href="javascript' not in c.get(f"/repos/{repo.pk}/").content.decode()
    detail = c.get(f"/api/repos/{repo.pk}/commits?files=1").json()
    assert {r["subject"] for r in detail["results"]} == set(PAYLOADS)  # exact text, as JSON
    script = (ROOT / "dashboard" / "static" / "gitward.js").read_text()
    assert "innerHTML" not in script and "insertAdjacentHTML" not in script
    assert "document.write" not in script
