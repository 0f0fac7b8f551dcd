"""Server-rendered pages: login, submission form, repository list and page."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from dashboard.models import Repository, RepositoryView
from dashboard.repositories.view_counts import flush_views
from tests.conftest import run_workers
from tests.support.gitrepo import GitRepo

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def logged_in(client: Client) -> Client:
    client.force_login(User.objects.create_user("bob", password="pw-bob-12345"))
    return client


@pytest.mark.parametrize("path", ["/", "/repos/", "/repos/1/"])
def test_pages_require_login(client: Client, path: str) -> None:
    res = client.get(path)
    assert res.status_code == 302 and res["Location"].startswith("/login/")


def test_the_login_page_logs_in(client: Client) -> None:
    User.objects.create_user("carol", password="pw-carol-123")
    assert client.get("/login/").status_code == 200
    bad = client.post("/login/", {"username": "carol", "password": "wrong"})
    assert bad.status_code == 200 and b"didn't match" in bad.content
    res = client.post("/login/", {"username": "carol", "password": "pw-carol-123"})
    assert res.status_code == 302 and res["Location"] == "/"


def test_the_form_shows_field_errors_and_saves_nothing(logged_in: Client) -> None:
    res = logged_in.post("/repos/", {"url": "file:///etc/passwd", "branch": ""})
    assert res.status_code == 400
    assert b'id="url-error"' in res.content
    res = logged_in.post("/repos/", {"url": "", "branch": "bad..branch"})
    assert b'id="url-error"' in res.content and b'id="branch-error"' in res.content
    assert Repository.objects.count() == 0


def test_submitting_through_the_form_and_browsing_results(
    logged_in: Client, git_repo: GitRepo
) -> None:
    res = logged_in.post("/repos/", {"url": str(git_repo.path), "branch": "main"})
    repo = Repository.objects.get()
    assert res.status_code == 302 and res["Location"] == f"/repos/{repo.pk}/"
    page = logged_in.get(f"/repos/{repo.pk}/").content.decode()
    assert 'id="repo-progress"' in page and "queued" in page
    run_workers()
    page = logged_in.get(f"/repos/{repo.pk}/").content.decode()
    assert "ready" in page and "100.0%" in page
    assert "Ada Lovelace" in page and "src/app.py" in page and "Python" in page
    assert "<svg" in page and "<rect" in page  # commits-per-week chart
    listing = logged_in.get("/repos/").content.decode()
    assert f'href="/repos/{repo.pk}/"' in listing and "3 / 3" in listing
    # Without operations access the home page is the repository list.
    assert logged_in.get("/")["Location"] == "/repos/"


def test_repository_data_is_escaped_in_pages(logged_in: Client, tmp_path) -> None:
    evil = GitRepo.create(tmp_path / "evil")
    payload = '<script>alert("x")</script>'
    evil.commit(payload, {f"{payload}.txt": payload}, author=(payload, "x@example.com"))
    logged_in.post("/repos/", {"url": str(evil.path)})
    run_workers()
    repo = Repository.objects.get()
    assert repo.status == "ready", repo.error
    page = logged_in.get(f"/repos/{repo.pk}/").content.decode()
    assert payload not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page


def test_pages_send_a_content_security_policy(logged_in: Client) -> None:
    res = logged_in.get("/repos/")
    assert "script-src 'self'" in res["Content-Security-Policy"]
    assert res["X-Frame-Options"] == "DENY"


def test_an_unknown_repository_page_is_a_404(logged_in: Client) -> None:
    assert logged_in.get("/repos/4242/").status_code == 404


def test_viewing_a_repository_counts_toward_the_rollout_warm_set(logged_in: Client) -> None:
    repo = Repository.objects.create(url="https://example.com/team/tool.git")
    for _ in range(3):
        assert logged_in.get(f"/repos/{repo.pk}/").status_code == 200
    flush_views()  # counted in memory, written in batches (dashboard.repositories.view_counts)
    assert RepositoryView.objects.get(repository=repo).views == 3


def test_a_duplicate_submission_by_the_form_starts_nothing_without_the_permission(
    logged_in: Client, git_repo: GitRepo
) -> None:
    """The form as the API (docs/api.md): a ready repository submitted again by a user
    who may not re-analyse is shown as it is, with no new sync."""
    from dashboard.models import AuditEntry, JobRun

    first = logged_in.post("/repos/", {"url": str(git_repo.path), "branch": ""})
    assert first.status_code == 302
    run_workers()
    repo = Repository.objects.get()
    assert repo.status == Repository.Status.READY
    again = logged_in.post("/repos/", {"url": str(git_repo.path), "branch": ""}, follow=True)
    assert b"was already submitted" in again.content
    repo.refresh_from_db()
    assert repo.status == Repository.Status.READY
    assert JobRun.objects.filter(repository=repo, kind="sync").count() == 1
    assert not AuditEntry.objects.exists()


def test_the_repository_and_run_pages_say_why_they_wait(client: Client, settings) -> None:
    """docs/scheduling.md#why-is-this-waiting on the pages: the same answer as the API."""
    from dashboard.runs import attempts, dispatch
    from tests.dashboard.runs.test_dispatch import repo_with_runs

    settings.FAIR_WEIGHT = 1
    client.force_login(User.objects.create_superuser("ops", password="pw-ops-12345"))
    _, ahead = repo_with_runs("ahead", 1)
    repo, runs = repo_with_runs("behind", 2, status=Repository.Status.ANALYZING)
    for group in (ahead, runs):
        for run in dispatch.admit(group):
            attempts.enqueue_run(run)
    page = client.get(f"/repos/{repo.pk}/").content.decode()
    assert 'data-position="2"' in page
    assert "behind 1 repository in its class (interactive); 1 more of its runs parked" in page
    run_page = client.get(f"/runs/{runs[1].pk}/").content.decode()
    assert 'data-position="3"' in run_page and "fair share: 1 of its repository" in run_page
    body = client.get(f"/api/runs/{runs[1].pk}").json()
    assert body["waiting"]["position"] == 3 and body["waiting"]["class"] == "interactive"
