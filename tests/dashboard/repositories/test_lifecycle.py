"""dashboard.repositories.lifecycle and the Repository row: status changes (claimed by a sync,
failed, completed) and the state the live view is given, on the real database."""

from __future__ import annotations

import pytest

from dashboard.models import Chunk, JobRun, Repository
from dashboard.repositories.lifecycle import (
    claim_sync,
    complete_repository,
    publish_repo_changed,
    submit_repository,
)
from tests.support.gitrepo import GitRepo
from tests.support.live_tap import Tap, repo_tap

pytestmark = pytest.mark.django_db(transaction=True)

FP = "0123456789abcdef"


def a_repo(**fields: object) -> Repository:
    return Repository.objects.create(url="https://example.com/team/tool.git", **fields)


def test_a_sync_claims_only_its_own_generation() -> None:
    repo = a_repo(status=Repository.Status.QUEUED, generation=2)
    assert claim_sync(repo_id=repo.pk, generation=1) is None
    claimed = claim_sync(repo_id=repo.pk, generation=2)
    assert claimed is not None and claimed.status == Repository.Status.SYNCING
    assert claim_sync(repo_id=repo.pk, generation=2) is not None  # a redelivery goes on
    Repository.objects.filter(pk=repo.pk).update(status=Repository.Status.READY)
    assert claim_sync(repo_id=repo.pk, generation=2) is None


def test_failing_leaves_a_ready_repository_and_other_generations_alone() -> None:
    ready = a_repo(status=Repository.Status.READY)
    assert ready.fail("boom") is False
    assert Repository.objects.get(pk=ready.pk).status == Repository.Status.READY
    Repository.objects.filter(pk=ready.pk).update(status=Repository.Status.SYNCING)
    assert ready.fail("boom", generation=5) is False  # generation 1 is current
    assert ready.fail("x" * 3000, generation=1) is True
    row = Repository.objects.get(pk=ready.pk)
    assert row.status == Repository.Status.FAILED and len(row.error) == 2000


def test_completion_waits_for_open_chunks_and_reports_a_dead_one() -> None:
    repo = a_repo(status=Repository.Status.ANALYZING, fingerprint=FP)
    one = Chunk.objects.create(repository=repo, fingerprint=FP, key="a1", shas="a1", size=1)
    two = Chunk.objects.create(repository=repo, fingerprint=FP, key="b2", shas="b2", size=1)
    assert complete_repository(repo_id=repo.pk, fingerprint=FP) is False  # both open
    Chunk.objects.filter(pk=one.pk).update(state=Chunk.State.DONE)
    Chunk.objects.filter(pk=two.pk).update(state=Chunk.State.FAILED, error="poison")
    assert complete_repository(repo_id=repo.pk, fingerprint=FP) is False
    repo.refresh_from_db()
    assert repo.status == Repository.Status.FAILED and repo.error == "poison"
    Repository.objects.filter(pk=repo.pk).update(status=Repository.Status.ANALYZING)
    Chunk.objects.filter(pk=two.pk).update(state=Chunk.State.DONE)
    assert complete_repository(repo_id=repo.pk, fingerprint="another") is False
    assert complete_repository(repo_id=repo.pk, fingerprint=FP) is True
    repo.refresh_from_db()
    assert repo.status == Repository.Status.READY and repo.error == ""


def test_a_change_sends_the_repositorys_state_to_operators_and_watchers(
    git_repo: GitRepo,
) -> None:
    repo, created = submit_repository(url=str(git_repo.path))
    assert created and JobRun.objects.get().kind == JobRun.Kind.SYNC
    ops, watchers = Tap(), repo_tap(repo.pk)
    publish_repo_changed(repo.pk)
    for tap in (ops, watchers):
        (event,) = tap.until(lambda evs: len(evs) == 1)
        assert event["type"] == "repo.changed" and event["repo"] == repo.pk
        assert event["status"] == "queued" and event["url"] == repo.url
        assert event["progress"] == 0.0 and event["commits_total"] == 0
