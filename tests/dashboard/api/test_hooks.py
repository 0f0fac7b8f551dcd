"""``POST /api/hooks/push/<id>`` and ``POST /api/repos/<id>/hook-secret`` over HTTP
(docs/api.md#push-webhooks): each provider's request shape, refusals that enqueue
nothing, limits, and the secret shown once to who may manage the repository."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest
from django.contrib.auth.models import User
from django.test import Client
from rq.registry import ScheduledJobRegistry

from dashboard import infra
from dashboard.models import AuditEntry, Repository
from dashboard.repositories.lifecycle import submit_repository
from tests.support.gitrepo import GitRepo

pytestmark = pytest.mark.django_db(transaction=True)

BODY = json.dumps({"ref": "refs/heads/main", "after": "0" * 40}).encode()


def sign(secret: str, body: bytes = BODY) -> str:
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


@pytest.fixture
def admin() -> User:
    return User.objects.create_superuser("root", password="pw-root-123")


@pytest.fixture
def repo_and_secret(git_repo: GitRepo, admin: User) -> tuple[Repository, str]:
    repo, _ = submit_repository(url=str(git_repo.path))
    client = Client()
    client.force_login(admin)
    res = client.post(f"/api/repos/{repo.pk}/hook-secret")
    assert res.status_code == 200, res.content
    body = res.json()
    assert body["url"] == f"http://testserver/api/hooks/push/{repo.pk}"
    return repo, body["secret"]


def scheduled() -> list[str]:
    return ScheduledJobRegistry(queue=infra.queue(infra.MAINTENANCE_QUEUE)).get_job_ids()


def push(repo_id: int, body: bytes = BODY, **headers: str):
    return Client().post(f"/api/hooks/push/{repo_id}", data=body,
                         content_type="application/json", **headers)  # fmt: skip


@pytest.mark.parametrize(
    ("provider", "headers"),
    [
        ("github", lambda s: {"HTTP_X_HUB_SIGNATURE_256": f"sha256={sign(s)}",
                              "HTTP_X_GITHUB_EVENT": "push"}),
        ("gitlab", lambda s: {"HTTP_X_GITLAB_TOKEN": s, "HTTP_X_GITLAB_EVENT": "Push Hook"}),
        ("gitea", lambda s: {"HTTP_X_GITEA_SIGNATURE": sign(s), "HTTP_X_GITEA_EVENT": "push"}),
        ("generic", lambda s: {"HTTP_X_GITWARD_SIGNATURE": f"sha256={sign(s)}"}),
    ],
)  # fmt: skip
def test_each_providers_push_is_accepted_and_schedules_the_sync(
    repo_and_secret: tuple[Repository, str], provider: str, headers
) -> None:
    repo, secret = repo_and_secret
    res = push(repo.pk, **headers(secret))
    assert res.status_code == 202
    assert res.json() == {"repository": repo.pk, "provider": provider, "outcome": "scheduled"}
    assert scheduled() == [f"hook-{repo.pk}"]
    assert Repository.objects.get(pk=repo.pk).pushed_at is not None


def test_a_bad_or_missing_signature_is_401_and_enqueues_nothing(
    repo_and_secret: tuple[Repository, str],
) -> None:
    repo, secret = repo_and_secret
    bad = push(repo.pk, HTTP_X_HUB_SIGNATURE_256=f"sha256={sign(secret + 'x')}")
    assert bad.status_code == 401 and bad.json() == {"error": "bad signature"}
    assert push(repo.pk).json() == {"error": "missing signature"}
    assert push(repo.pk, HTTP_X_GITLAB_TOKEN="guess").status_code == 401
    assert scheduled() == []
    assert Repository.objects.get(pk=repo.pk).pushed_at is None


def test_unknown_repository_no_secret_size_and_method(
    repo_and_secret: tuple[Repository, str], settings, tmp_path
) -> None:
    repo, secret = repo_and_secret
    assert push(repo.pk + 1000, HTTP_X_GITLAB_TOKEN=secret).status_code == 404
    other = GitRepo.create(tmp_path / "other")
    other.commit("one", {"a": "1\n"})
    plain, _ = submit_repository(url=str(other.path))
    off = push(plain.pk, HTTP_X_GITLAB_TOKEN="anything")
    assert off.status_code == 403
    assert off.json() == {"error": "webhooks are not enabled for this repository"}
    settings.HOOK_MAX_BYTES = 1024
    big = b'{"ref": "' + b"x" * 2000 + b'"}'
    res = push(repo.pk, big, HTTP_X_GITEA_SIGNATURE=sign(secret, big))
    assert res.status_code == 413
    assert Client().get(f"/api/hooks/push/{repo.pk}").status_code == 405
    assert push(repo.pk, b"[1]", HTTP_X_GITEA_SIGNATURE=sign(secret, b"[1]")).status_code == 400
    assert scheduled() == []


def test_only_who_may_manage_the_repository_gets_a_secret(
    git_repo: GitRepo,
) -> None:
    repo, _ = submit_repository(url=str(git_repo.path))
    bob = User.objects.create_user("bob", password="pw-bob-123")
    client = Client()
    client.force_login(bob)
    res = client.post(f"/api/repos/{repo.pk}/hook-secret")
    assert res.status_code == 403
    entry = AuditEntry.objects.get(action="repo.hook_secret")
    assert entry.outcome == "refused: permission denied"
    assert Repository.objects.get(pk=repo.pk).hook_secret == ""
    assert client.post("/api/repos/999/hook-secret").status_code == 404
