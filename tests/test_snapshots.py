"""dashboard.snapshots: what the operations pages and one repository's page show, read
from real Redis masters, queues and the database."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.utils import timezone

from dashboard import leases, queues
from dashboard.models import Chunk, JobAttempt, JobRun, Repository
from dashboard.repositories import current_fingerprint, submit_repository
from dashboard.snapshots import ops_snapshot, repository_live, user_can, why_waiting
from tests.gitrepo import GitRepo

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_operations_snapshot_has_every_section() -> None:
    repo = Repository.objects.create(url="https://example.com/t/x.git")
    for i in range(2):
        JobRun.objects.create(
            job_id=f"d{i}",
            kind="sync",
            queue="sync",
            repository=repo,
            state="dead",
            cause_key="k",
            finished_at=timezone.now(),
        )
    snap = ops_snapshot()
    assert snap["quorum"]["state"] == "ok" and len(snap["redis_nodes"]) == 3
    assert [q["name"] for q in snap["queues"]] == queues.queue_names()
    assert snap["dlq"]["dead"] == 2 and snap["dlq"]["group_count"] == 1
    assert snap["dlq"]["groups"][0]["count"] == 2
    assert snap["can"] == {}  # no user given
    # The totals-only form skips the grouping but counts the same.
    slim = ops_snapshot(dlq_groups=False)["dlq"]
    assert slim == {"groups": None, "dead": 2, "group_count": 1}


def test_operator_buttons_need_staff_and_the_explicit_permission() -> None:
    staff = User.objects.create_user("s", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="retry_jobrun"))
    plain = User.objects.create_user("p")
    plain.user_permissions.add(Permission.objects.get(codename="retry_jobrun"))
    assert user_can(User.objects.get(pk=staff.pk)) == {
        "retry": True,
        "discard": False,
        "force_release": False,
        "pause": False,
    }
    assert not any(user_can(User.objects.get(pk=plain.pk)).values())


def test_a_repository_shows_its_holders_and_why_the_rest_waits(git_repo: GitRepo) -> None:
    repo, _ = submit_repository(url=str(git_repo.path))
    assert why_waiting(repo) == ["sync: queued, position 1"]
    chunk = Chunk.objects.create(
        repository=repo,
        fingerprint=current_fingerprint(),
        key="abcd1234",
        shas="abcd1234",
        size=1,
        position=1,
    )
    run = JobRun.objects.create(
        job_id="an-1",
        kind="analyze",
        queue="q",
        repository=repo,
        chunk=chunk,
        fingerprint=chunk.fingerprint,
        attempts=1,
    )
    JobAttempt.objects.create(run=run, number=1, outcome=JobAttempt.Outcome.DEFERRED)
    leases.redlock().acquire([chunk.lock_key()], ttl=30.0, holder={"worker": "w", "job": "other"})
    live = repository_live(repo.pk)
    assert [h["key"] for h in live["holders"]] == [chunk.lock_key()]
    assert live["holders"][0]["what"] == "commit abcd1234"
    blocked = [w for w in live["waiting"] if w.startswith("chunk 1/1")]
    assert blocked and "lock held by job other" in blocked[0]
    assert live["status"] == "queued" and live["id"] == repo.pk
