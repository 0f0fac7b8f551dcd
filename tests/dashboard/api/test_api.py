"""The JSON API (docs/api.md), through Django's test client against the real stack."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import User
from django.test import Client

from dashboard.models import ApiToken, Commit, Repository
from tests.conftest import run_workers
from tests.support.gitrepo import GitRepo, reference_commits

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def user() -> User:
    return User.objects.create_user("alice", password="pw-alice-123")


@pytest.fixture
def token(user: User) -> str:
    return ApiToken.issue(user)[1]


def post(client: Client, body: object, token: str | None = None, **extra: str):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    return client.post(
        "/api/repos", data=json.dumps(body), content_type="application/json", **headers, **extra
    )


def get(client: Client, path: str, token: str):
    return client.get(path, HTTP_AUTHORIZATION=f"Bearer {token}")


def test_it_requires_authentication(client: Client) -> None:
    res = client.get("/api/repos/1")
    assert res.status_code == 401
    assert res.json() == {"error": "authentication required"}


def test_it_rejects_an_unknown_token(client: Client) -> None:
    res = get(client, "/api/status", "gw_not-a-token")
    assert res.status_code == 401 and res.json()["error"] == "invalid API token"


def test_it_accepts_then_reports_a_repository(
    client: Client, token: str, git_repo: GitRepo
) -> None:
    res = post(client, {"url": str(git_repo.path)}, token)
    assert res.status_code == 202
    body = res.json()
    assert body["status"] == "queued" and body["commits_analyzed"] == 0
    again = post(client, {"url": str(git_repo.path)}, token)
    assert again.status_code == 200 and again.json()["id"] == body["id"]
    run_workers()
    detail = get(client, f"/api/repos/{body['id']}", token).json()
    assert set(detail) >= {
        "id",
        "url",
        "branch",
        "status",
        "head",
        "commits_total",
        "commits_analyzed",
        "fingerprint",
        "error",
    }
    assert detail["status"] == "ready"
    assert detail["head"] == git_repo.head()
    assert detail["commits_total"] == detail["commits_analyzed"] == 3
    assert detail["error"] is None


def test_commits_are_cursor_paginated_newest_first(
    client: Client, token: str, git_repo: GitRepo
) -> None:
    for i in range(7):
        git_repo.commit(f"c{i}", {"n.txt": f"{i}\n"}, tz="+0530")
    repo_id = post(client, {"url": str(git_repo.path)}, token).json()["id"]
    run_workers()
    seen: list[dict] = []
    cursor = None
    pages = 0
    while True:
        qs = "?limit=3&files=1" + (f"&cursor={cursor}" if cursor else "")
        body = get(client, f"/api/repos/{repo_id}/commits{qs}", token).json()
        seen += body["results"]
        pages += 1
        cursor = body["next"]
        if not cursor:
            break
    assert pages == 4
    ref = reference_commits(git_repo.path)
    assert [c["sha"] for c in seen] == git_repo.git("rev-list", "HEAD").split()
    for c in seen:
        want = ref[c["sha"]]
        assert c["authored_at"] == want["authored_at"]  # same instant *and* same offset
        assert c["committed_at"] == want["committed_at"]
        assert (
            sorted((f["path"], f["added"], f["deleted"], f["binary"]) for f in c["files"])
            == want["files"]
        )
        assert c["parents"] == want["parents"] and c["subject"] == want["subject"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "url is required"),
        ({"url": ""}, "url is required"),
        ({"url": 5}, "url is required"),
        ({"url": "ftp://example.com/x.git"}, None),
        ({"url": "--upload-pack=touch /tmp/pwned"}, None),
        ({"url": "/etc"}, None),
        ({"url": "https://example.com/x.git", "branch": 3}, "branch must be a string"),
        ({"url": "https://example.com/x.git", "branch": "../../etc"}, None),
        ([1, 2], "request body must be a JSON object"),
    ],
)
def test_bad_submissions_get_a_json_400(
    client: Client, token: str, body: object, message: str | None
) -> None:
    res = post(client, body, token)
    assert res.status_code == 400
    error = res.json()["error"]
    assert isinstance(error, str) and error and "\n" not in error
    if message:
        assert error == message
    assert Repository.objects.count() == 0


def test_malformed_json_gets_a_400(client: Client, token: str) -> None:
    res = client.post(
        "/api/repos",
        data="{nope",
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )
    assert res.status_code == 400 and res.json() == {"error": "request body is not valid JSON"}


def test_bad_pagination_parameters_get_a_400(client: Client, token: str, git_repo: GitRepo) -> None:
    repo_id = post(client, {"url": str(git_repo.path)}, token).json()["id"]
    for qs, msg in [
        ("?limit=x", "limit must be an integer"),
        ("?limit=0", "limit must be between 1 and 1000"),
        ("?cursor=%%%", "invalid cursor"),
        ("?cursor=bm9wZQ", "invalid cursor"),
    ]:
        res = get(client, f"/api/repos/{repo_id}/commits{qs}", token)
        assert res.status_code == 400 and res.json() == {"error": msg}


def test_unknown_ids_and_paths_get_a_json_404(client: Client, token: str) -> None:
    assert get(client, "/api/repos/999", token).json() == {"error": "repository not found"}
    assert get(client, "/api/repos/999/commits", token).status_code == 404
    res = get(client, "/api/nothing-here", token)
    assert res.status_code == 404 and res.json() == {"error": "not found"}


def test_wrong_methods_get_a_json_405(client: Client, token: str) -> None:
    res = get(client, "/api/repos", token)
    assert res.status_code == 405 and "not allowed" in res.json()["error"]


def test_session_writes_need_the_csrf_token(user: User, git_repo: GitRepo) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    res = post(client, {"url": str(git_repo.path)})
    assert res.status_code == 403 and res.json() == {"error": "CSRF verification failed"}
    assert Repository.objects.count() == 0
    client.get("/repos/")  # sets the csrf cookie
    csrf = client.cookies["csrftoken"].value
    res = post(client, {"url": str(git_repo.path)}, HTTP_X_CSRFTOKEN=csrf)
    assert res.status_code == 202


def test_status_reports_nodes_queues_workers_and_locks(
    client: Client, user: User, token: str, git_repo: GitRepo
) -> None:
    from django.contrib.auth.models import Permission

    assert get(client, "/api/status", token).status_code == 403  # operators only
    user.user_permissions.add(Permission.objects.get(codename="view_jobrun"))
    post(client, {"url": str(git_repo.path)}, token)
    body = get(client, "/api/status", token).json()
    assert set(body) >= {"locks", "queues", "workers", "dlq", "redis_nodes"}
    assert [n["up"] for n in body["redis_nodes"]] == [True, True, True]
    sync = next(q for q in body["queues"] if q["name"] == "sync")
    assert sync["backlog"] == 1
    assert body["locks"] == []


def test_api_and_cli_return_the_same_data(
    client: Client, token: str, git_repo: GitRepo, capsys
) -> None:
    from django.core.management import call_command

    repo_id = post(client, {"url": str(git_repo.path)}, token).json()["id"]
    run_workers()
    api = get(client, f"/api/repos/{repo_id}/commits?limit=1000&files=1", token).json()["results"]
    call_command("results", str(repo_id), "--commits")
    cli = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sorted(api, key=lambda c: c["sha"]) == sorted(cli, key=lambda c: c["sha"])
    assert Commit.objects.count() == 3


def test_a_duplicate_submission_returns_the_repository_unchanged_unless_the_user_may_reanalyse(
    client: Client, user: User, token: str, git_repo: GitRepo
) -> None:
    """docs/api.md: re-submitting a ready or failed repository's URL starts no sync for a
    user without ``dashboard.change_repository`` (200, unchanged, nothing audited); for
    one with it, it is the re-analyse button's action (202, audited as repo.reanalyse)."""
    from django.contrib.auth.models import Permission

    from dashboard.models import AuditEntry, JobRun

    first = post(client, {"url": str(git_repo.path)}, token)
    assert first.status_code == 202
    run_workers()
    repo = Repository.objects.get(pk=first.json()["id"])
    for status in ("ready", "failed"):
        Repository.objects.filter(pk=repo.pk).update(status=status)
        again = post(client, {"url": str(git_repo.path)}, token)
        assert again.status_code == 200 and again.json()["status"] == status
    assert JobRun.objects.filter(repository=repo, kind="sync").count() == 1
    assert not AuditEntry.objects.exists()
    user.user_permissions.add(Permission.objects.get(codename="change_repository"))
    again = post(client, {"url": str(git_repo.path)}, token)
    assert again.status_code == 202 and again.json()["status"] == "queued"
    assert JobRun.objects.filter(repository=repo, kind="sync").count() == 2
    entry = AuditEntry.objects.get()
    assert entry.action == "repo.reanalyse" and entry.user == user
