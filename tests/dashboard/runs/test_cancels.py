"""Cancelling analysis (docs/lifecycle.md#cancelling) of queued work, over the API, the
CLI and the core: real RQ queues on the session's Redis, real workers, real git. The
running case (a work horse stopped mid-job, git killed, the late write fenced) is
tests/system/test_cancel.py."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import CommandError, call_command
from django.test import Client

from dashboard import infra
from dashboard.models import AuditEntry, Commit, JobRun, Repository
from dashboard.repositories.lifecycle import submit_repository
from dashboard.repositories.reanalysis import reanalyse
from dashboard.runs.cancels import cancel_runs_matching
from tests.conftest import run_syncs_only, run_workers
from tests.support.gitrepo import GitRepo

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def admin() -> User:
    return User.objects.create_superuser("root", password="pw-root-123")


@pytest.fixture
def nobody() -> User:
    return User.objects.create_user("bob", password="pw-bob-123")


def post(client: Client, user: User, path: str, body: object | None = None):
    client.force_login(user)
    return client.post(path, data=json.dumps(body or {}), content_type="application/json")


def test_cancelling_a_queued_repository_dequeues_its_sync_and_it_can_be_reanalysed(
    client: Client, admin: User, git_repo: GitRepo
) -> None:
    repo, _ = submit_repository(url=str(git_repo.path))
    sync = JobRun.objects.get(repository=repo, kind="sync")
    assert sync.rq_id() in infra.queue(infra.SYNC_QUEUE).get_job_ids()

    res = post(client, admin, f"/api/repos/{repo.pk}/cancel")

    assert res.status_code == 200
    body = res.json()
    assert body["cancelled"] == 1 and body["dequeued"] == 1 and body["runs"] == [sync.pk]
    assert body["status"] == "failed" and body["error"] == "cancelled by root"
    assert infra.queue(infra.SYNC_QUEUE).get_job_ids() == []
    sync.refresh_from_db()
    assert sync.state == JobRun.State.DISCARDED and sync.error == "cancelled by root"
    assert run_workers() == 0  # nothing left to run
    entry = AuditEntry.objects.get(action="repo.cancel")
    assert entry.user == admin and entry.outcome.startswith("cancelled 1 run(s): 1 dequeued")
    # The repository ends failed with the reason, and re-analysing it starts again.
    repo.refresh_from_db()
    assert (repo.status, repo.error) == ("failed", "cancelled by root")
    assert reanalyse(repo, admin)[0] == 202
    run_workers()
    repo.refresh_from_db()
    assert repo.status == "ready" and Commit.objects.filter(repository=repo).count() == 3


def test_cancelling_planned_chunks_leaves_them_for_the_next_analysis(
    client: Client, admin: User, git_repo: GitRepo
) -> None:
    repo, _ = submit_repository(url=str(git_repo.path))
    run_syncs_only()  # the chunk's run queued on its analysis queue
    chunk_run = JobRun.objects.get(repository=repo, kind="analyze")
    queue = infra.queue(chunk_run.queue)
    assert chunk_run.rq_id() in queue.get_job_ids()

    res = post(client, admin, f"/api/runs/{chunk_run.pk}/cancel")

    assert res.status_code == 200 and res.json()["runs"] == [chunk_run.pk]
    assert queue.get_job_ids() == []
    repo.refresh_from_db()
    assert repo.status == "failed" and repo.error == "cancelled by root"
    assert AuditEntry.objects.get(action="run.cancel").target.startswith(f"run #{chunk_run.pk}")
    # A second cancel of the ended run does nothing (and says so).
    again = post(client, admin, f"/api/runs/{chunk_run.pk}/cancel")
    assert again.status_code == 200 and again.json()["cancelled"] == 0
    assert reanalyse(repo, admin)[0] == 202
    run_workers()
    repo.refresh_from_db()
    assert repo.status == "ready" and Commit.objects.filter(repository=repo).count() == 3


def test_cancel_without_permission_is_refused_with_403_and_audited(
    client: Client, nobody: User, git_repo: GitRepo
) -> None:
    repo, _ = submit_repository(url=str(git_repo.path))
    sync = JobRun.objects.get(repository=repo)
    for path, action in [
        (f"/api/repos/{repo.pk}/cancel", "repo.cancel"),
        (f"/api/runs/{sync.pk}/cancel", "run.cancel"),
        ("/api/runs/cancel", "runs.cancel"),
    ]:
        res = post(client, nobody, path, {"state": "queued"})
        assert res.status_code == 403, path
        assert res.json() == {"error": "you do not have permission to cancel analysis"}
        entry = AuditEntry.objects.get(action=action)
        assert entry.user == nobody and entry.outcome == "refused: permission denied"
    sync.refresh_from_db()
    assert sync.state == JobRun.State.QUEUED
    assert infra.queue(infra.SYNC_QUEUE).get_job_ids() == [sync.rq_id()]
    # Each permission opens its own door: a repository's needs change_repository.
    nobody.user_permissions.add(Permission.objects.get(codename="change_jobrun"))
    nobody = User.objects.get(pk=nobody.pk)  # permissions are cached on the instance
    assert post(client, nobody, f"/api/repos/{repo.pk}/cancel").status_code == 403
    assert post(client, nobody, f"/api/runs/{sync.pk}/cancel").status_code == 200


def test_the_repository_page_shows_the_button_only_to_who_may_cancel(
    client: Client, admin: User, nobody: User, git_repo: GitRepo
) -> None:
    repo, _ = submit_repository(url=str(git_repo.path))
    client.force_login(nobody)
    assert b'id="cancel-analysis"' not in client.get(f"/repos/{repo.pk}/").content
    client.force_login(admin)
    page = client.get(f"/repos/{repo.pk}/").content
    assert f'data-confirm-url="/api/repos/{repo.pk}/cancel"'.encode() in page
    run = JobRun.objects.get(repository=repo)
    assert (
        f'data-confirm-url="/api/runs/{run.pk}/cancel"'.encode()
        in client.get(f"/runs/{run.pk}/").content
    )


def test_a_bulk_cancel_by_filter_counts_what_it_cancelled(
    client: Client, admin: User, tmp_path
) -> None:
    repos = []
    for i in range(3):
        origin = GitRepo.create(tmp_path / f"o{i}")
        origin.commit("one", {"a.txt": f"{i}\n"})
        repos.append(submit_repository(url=str(origin.path))[0])

    only_first = post(client, admin, "/api/runs/cancel", {"repo": repos[0].pk})
    assert only_first.status_code == 200 and only_first.json()["cancelled"] == 1
    rest = post(client, admin, "/api/runs/cancel", {"state": "queued", "queue": infra.SYNC_QUEUE})
    assert rest.status_code == 200 and rest.json()["cancelled"] == 2
    assert infra.queue(infra.SYNC_QUEUE).get_job_ids() == []
    assert set(Repository.objects.values_list("status", flat=True)) == {"failed"}
    entries = AuditEntry.objects.filter(action="runs.cancel").order_by("pk")
    assert [e.detail["cancelled"] for e in entries] == [1, 2]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "give at least one of state, queue, repo"),
        ({"state": "succeeded"}, "state must be one of queued, failed, running"),
        ({"repo": "7"}, "repo must be a repository id"),
        ({"repo": True}, "repo must be a repository id"),
        ({"repo": 2**63}, "repo must be a repository id"),
        ({"repo": 0}, "repo must be a repository id"),
        ({"queue": 5}, "state and queue must be strings"),
    ],
)
def test_a_bad_filter_is_a_400(client: Client, admin: User, body: dict, message: str) -> None:
    res = post(client, admin, "/api/runs/cancel", body)
    assert res.status_code == 400 and res.json() == {"error": message}


def test_unknown_targets_are_404(client: Client, admin: User) -> None:
    assert post(client, admin, "/api/repos/999/cancel").json() == {"error": "repository not found"}
    assert post(client, admin, "/api/runs/999/cancel").status_code == 404


def test_the_cli_cancels_by_repository_url_run_or_filter(
    git_repo: GitRepo, capsys, tmp_path
) -> None:
    repo, _ = submit_repository(url=str(git_repo.path))
    call_command("cancel", "--repo", str(git_repo.path))
    assert capsys.readouterr().out.strip() == (
        f"1 run cancelled (1 dequeued, 0 running stopped, 0 locks fenced); {repo.name} is failed"
    )
    assert AuditEntry.objects.get(action="repo.cancel").actor == "cli"
    other = GitRepo.create(tmp_path / "other")
    other.commit("one", {"a": "1\n"})
    submit_repository(url=str(other.path))
    call_command("cancel", "--state", "queued")
    assert capsys.readouterr().out.startswith("1 run cancelled")
    with pytest.raises(CommandError, match="choose one of"):
        call_command("cancel", "--repo", "1", "--run", "2")
    with pytest.raises(CommandError, match="no repository"):
        call_command("cancel", "--repo", "/nowhere")
    with pytest.raises(CommandError, match="--run must be an id"):
        call_command("cancel", "--run", str(2**64))
    with pytest.raises(CommandError, match="state must be one of"):
        call_command("cancel", "--state", "dead")


def test_the_core_cancels_only_cancellable_runs(git_repo: GitRepo) -> None:
    repo, _ = submit_repository(url=str(git_repo.path))
    run_workers()
    assert set(JobRun.objects.values_list("state", flat=True)) == {"succeeded"}
    done = cancel_runs_matching(JobRun.objects.filter(repository=repo), by="x")
    assert done.runs == [] and done.dequeued == 0
    repo.refresh_from_db()
    assert repo.status == "ready"
