"""dashboard.repositories.submissions: what a user's duplicate submission may do. A new
repository is created and synced; a duplicate is returned unchanged, unless the user may
re-analyse and it is ready or failed: then it is re-analysed as the page's button does,
audited. Against the real database, Redis and git (the API and form over it:
tests/dashboard/api/test_api.py, tests/dashboard/web/test_repositories.py)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User

from dashboard.models import AuditEntry, JobRun, Repository
from dashboard.repositories.submissions import (
    CREATED,
    EXISTING,
    REANALYSED,
    user_submission,
)
from tests.conftest import run_workers
from tests.support.gitrepo import GitRepo
from workers.remotes import InvalidRemote

pytestmark = pytest.mark.django_db(transaction=True)


def reanalyser(name: str) -> User:
    user = User.objects.create_user(name)
    user.user_permissions.add(Permission.objects.get(codename="change_repository"))
    return User.objects.get(pk=user.pk)  # fresh permission cache


def syncs(repo: Repository) -> int:
    return JobRun.objects.filter(repository=repo, kind=JobRun.Kind.SYNC).count()


def test_a_duplicate_of_a_ready_or_failed_repository_starts_nothing_without_the_permission(
    git_repo: GitRepo,
) -> None:
    bob = User.objects.create_user("bob")
    repo, outcome = user_submission(url=str(git_repo.path), branch=None, user=bob)
    assert outcome == CREATED and syncs(repo) == 1
    run_workers()
    for status in (Repository.Status.READY, Repository.Status.FAILED):
        Repository.objects.filter(pk=repo.pk).update(status=status)
        again, outcome = user_submission(url=str(git_repo.path) + "/", branch="", user=bob)
        assert (again.pk, outcome, again.status) == (repo.pk, EXISTING, status)
        assert again.generation == repo.generation and syncs(repo) == 1
    assert not AuditEntry.objects.exists()


def test_a_duplicate_by_a_user_who_may_reanalyse_is_a_reanalysis_audited_as_one(
    git_repo: GitRepo,
) -> None:
    ops = reanalyser("ops")
    repo, _ = user_submission(url=str(git_repo.path), branch=None, user=ops)
    run_workers()
    # still in progress: nothing to re-analyse, nothing started, nothing audited
    Repository.objects.filter(pk=repo.pk).update(status=Repository.Status.ANALYZING)
    assert user_submission(url=str(git_repo.path), branch=None, user=ops).outcome == EXISTING
    assert syncs(repo) == 1 and not AuditEntry.objects.exists()
    Repository.objects.filter(pk=repo.pk).update(status=Repository.Status.READY)
    git_repo.commit("pushed", {"late.txt": "x\n"})
    again, outcome = user_submission(url=str(git_repo.path), branch=None, user=ops)
    assert outcome == REANALYSED and again.status == Repository.Status.QUEUED
    assert syncs(repo) == 2
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.user, entry.outcome.split(":")[0]) == (
        "repo.reanalyse",
        ops,
        "queued",
    )
    run_workers()
    again.refresh_from_db()
    assert again.status == Repository.Status.READY and again.commits_total == 4


def test_a_bad_url_or_branch_is_refused_before_anything_is_written(git_repo: GitRepo) -> None:
    bob = User.objects.create_user("bob")
    with pytest.raises(InvalidRemote):
        user_submission(url=str(git_repo.path), branch="a..b", user=bob)
    with pytest.raises(InvalidRemote):
        user_submission(url="file:///etc", branch=None, user=bob)
    assert not Repository.objects.exists()
