"""Scheduled refresh (docs/lifecycle.md#scheduled-refresh): only due rows are refreshed
(10,000 scheduled repositories after a restart), a batch per round; the interval adapts
to the head moving and backs off a failing remote; a real refresh fetches new commits."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from dashboard import infra
from dashboard.models import JobRun, Repository
from dashboard.operations.reconciler import reconcile
from dashboard.repositories.lifecycle import submit_repository
from dashboard.repositories.refresh_schedule import next_interval, refresh_due
from tests.conftest import run_workers
from tests.support.gitrepo import GitRepo

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def on(settings) -> None:
    settings.REFRESH_INTERVAL = 3600.0
    settings.REFRESH_MIN = 300.0
    settings.REFRESH_MAX = 86400.0
    settings.REFRESH_BATCH = 500


def test_after_a_restart_only_the_due_repositories_of_ten_thousand_are_refreshed() -> None:
    now = timezone.now()
    due, later = now - timedelta(minutes=1), now + timedelta(hours=1)
    rows = [
        Repository(
            url=f"https://example.com/o/r{i}.git", status="ready", head="a" * 40,
            next_refresh_at=due if i % 100 == 0 else later,
            refresh_interval=3600.0,
        )
        for i in range(10_000)
    ]  # fmt: skip
    Repository.objects.bulk_create(rows, batch_size=1000)

    done = refresh_due(now=now)

    assert done == {"scheduled": 0, "refreshed": 100, "busy": 0}
    assert infra.queue(infra.SYNC_QUEUE).count == 100
    assert JobRun.objects.filter(kind="sync").count() == 100
    assert Repository.objects.filter(status="queued").count() == 100
    # each refreshed row got its next time; a second round finds nothing due
    assert not Repository.objects.filter(next_refresh_at__lte=now).exists()
    assert refresh_due(now=now)["refreshed"] == 0


def test_a_round_takes_one_batch_and_new_rows_get_a_spread_first_time(settings) -> None:
    settings.REFRESH_BATCH = 3
    now = timezone.now()
    Repository.objects.bulk_create(
        [Repository(url=f"https://example.com/o/d{i}.git", status="ready",
                    next_refresh_at=now - timedelta(seconds=i + 1)) for i in range(5)]
        + [Repository(url=f"https://example.com/o/n{i}.git", status="ready") for i in range(4)]
    )  # fmt: skip
    done = refresh_due(now=now)
    assert done["refreshed"] == 3 and done["scheduled"] == 4
    new = Repository.objects.filter(url__contains="/n")
    assert all(now <= r.next_refresh_at <= now + timedelta(hours=1) for r in new)
    assert refresh_due(now=now)["refreshed"] == 2  # the rest of the due ones


@pytest.mark.parametrize(
    ("status", "head", "last_head", "interval", "failures", "expected"),
    [
        ("ready", "b" * 40, "a" * 40, 3600.0, 0, (1800.0, 0)),  # moved: twice as often
        ("ready", "a" * 40, "a" * 40, 3600.0, 0, (5400.0, 0)),  # quiet: 1.5× longer
        ("ready", "b" * 40, "a" * 40, 400.0, 0, (300.0, 0)),  # never below the minimum
        ("ready", "a" * 40, "a" * 40, 80000.0, 0, (86400.0, 0)),  # nor above the maximum
        ("failed", "a" * 40, "a" * 40, 3600.0, 2, (7200.0, 3)),  # a failing remote backs off
        ("failed", "a" * 40, "a" * 40, 60000.0, 5, (86400.0, 6)),
        ("ready", "a" * 40, "", 0.0, 0, (5400.0, 0)),  # first time: the configured interval
    ],
)  # fmt: skip
def test_the_interval_adapts(status, head, last_head, interval, failures, expected) -> None:
    repo = Repository(url="https://example.com/o/x.git", status=status, head=head,
                      refresh_head=last_head, refresh_interval=interval,
                      refresh_failures=failures)  # fmt: skip
    assert next_interval(repo) == expected


def test_off_by_default_and_a_busy_repository_is_not_refreshed(settings) -> None:
    now = timezone.now()
    busy = Repository.objects.create(url="https://example.com/o/b.git", status="syncing",
                                     next_refresh_at=now - timedelta(seconds=1))  # fmt: skip
    settings.REFRESH_INTERVAL = 0.0
    assert refresh_due(now=now) == {"scheduled": 0, "refreshed": 0, "busy": 0}
    settings.REFRESH_INTERVAL = 3600.0
    assert refresh_due(now=now) == {"scheduled": 0, "refreshed": 0, "busy": 1}
    busy.refresh_from_db()
    assert busy.next_refresh_at > now and busy.status == "syncing"


def test_a_due_refresh_in_the_reconciler_fetches_the_new_commits(git_repo: GitRepo) -> None:
    repo, _ = submit_repository(url=str(git_repo.path))
    run_workers()
    git_repo.commit("later", {"later.txt": "1\n"})
    Repository.objects.filter(pk=repo.pk).update(
        next_refresh_at=timezone.now() - timedelta(seconds=1), refresh_head=git_repo.shas()[-1]
    )
    assert reconcile()["refreshed"] == 1
    run_workers()
    repo.refresh_from_db()
    assert repo.status == "ready" and repo.head == git_repo.head() and repo.commits_total == 4
    assert repo.refresh_interval == 1800.0  # the head had moved between the last two refreshes
