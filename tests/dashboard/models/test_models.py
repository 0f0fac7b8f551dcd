"""dashboard.models: the constraints the database itself enforces (so a raw ORM write
cannot break an invariant) and the small properties the pages and jobs rely on."""

from __future__ import annotations

from datetime import date

import pytest
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.utils import timezone

from dashboard.models import (
    AnalyzerVersion,
    ApiToken,
    Chunk,
    JobAttempt,
    JobRun,
    Repository,
    RepositoryView,
    Rollout,
)
from workers.locks import keys

pytestmark = pytest.mark.django_db


def refused(**create: object) -> None:
    """Creating this row violates a constraint (checked in its own savepoint)."""
    model = create.pop("model")
    with pytest.raises(IntegrityError), transaction.atomic():
        model.objects.create(**create)  # type: ignore[attr-defined]


def version(fp: str, **kw: object) -> AnalyzerVersion:
    return AnalyzerVersion.objects.create(fingerprint=fp * 64, code_version="c", **kw)


def test_a_repository_is_unique_per_url_and_branch() -> None:
    Repository.objects.create(url="https://example.com/a/b.git", branch="")
    Repository.objects.create(url="https://example.com/a/b.git", branch="dev")
    refused(model=Repository, url="https://example.com/a/b.git", branch="dev")


@pytest.mark.parametrize(
    ("url", "name"),
    [
        ("https://example.com/owner/tool.git", "tool"),
        ("https://example.com/owner/tool/", "tool"),
        ("git@example.com:owner/tool.git", "tool"),
        ("example.com:tool", "tool"),
        (".git", ".git"),  # nothing left after the suffix: the URL itself
    ],
)
def test_a_repositorys_name_is_the_last_part_of_its_url(url: str, name: str) -> None:
    assert Repository(url=url).name == name == str(Repository(url=url))


@pytest.mark.parametrize(
    "url",
    [
        "https://bob:s3cret@example.com",
        "https://s3cret@example.com/",
        "http://bob:s3cret@example.com:",
    ],
)
def test_a_repositorys_name_never_carries_a_credential_of_its_url(url: str) -> None:
    # A row from before submissions refused credentials: its name (pages, live events)
    # comes from the redacted URL.
    name = Repository(url=url).name
    assert "s3cret" not in name
    assert name in {"<redacted>@example.com", "http://<redacted>@example.com:"}


def test_a_repository_is_active_until_ready_or_failed_and_names_its_lock_and_job() -> None:
    repo = Repository.objects.create(url="https://example.com/a/b.git", generation=3)
    S = Repository.Status
    assert [Repository(status=s).is_active for s in S] == [
        s in {S.QUEUED, S.SYNCING, S.ANALYZING} for s in S
    ]
    assert repo.sync_job_id() == f"sync-{repo.pk}-g3"
    assert repo.lock_key() == keys.mirror(repo.pk)


def test_fail_changes_only_a_repository_not_ready_and_of_the_given_generation() -> None:
    repo = Repository.objects.create(url="https://example.com/a/b.git", generation=2)
    assert not repo.fail("old job", generation=1)  # a newer submission is not failed
    assert Repository.objects.get(pk=repo.pk).status == Repository.Status.QUEUED
    assert repo.fail("x" * 3000, generation=2)
    row = Repository.objects.get(pk=repo.pk)
    assert row.status == repo.status == Repository.Status.FAILED
    assert len(row.error) == 2000
    ready = Repository.objects.create(url="https://example.com/c.git", status="ready")
    assert not ready.fail("late failure")
    assert Repository.objects.get(pk=ready.pk).status == Repository.Status.READY


def test_a_chunk_is_unique_per_repository_version_and_key_and_names_its_job() -> None:
    repo = Repository.objects.create(url="https://example.com/a/b.git")
    key = f"{'a' * 40}..{'b' * 40}"
    chunk = Chunk.objects.create(
        repository=repo, fingerprint="f" * 64, key=key, shas=f"{'a' * 40}\n{'b' * 40}", size=2
    )
    refused(model=Chunk, repository=repo, fingerprint="f" * 64, key=key, shas="", size=0)
    Chunk.objects.create(repository=repo, fingerprint="e" * 64, key=key, shas="", size=0)
    assert chunk.sha_list() == ["a" * 40, "b" * 40]
    assert chunk.lock_key() == keys.chunk(repo.pk, key)
    job = chunk.job_id()
    assert job == f"analyze-{repo.pk}-{'f' * 12}-{'a' * 40}-{'b' * 40}"
    assert set(job) <= set("abcdefghijklmnopqrstuvwxyz0123456789-_")  # RQ's id alphabet


def test_a_run_names_its_attempts_and_counts_its_budget_and_attempts_are_unique() -> None:
    repo = Repository.objects.create(url="https://example.com/a/b.git")
    run = JobRun.objects.create(
        job_id="sync-1-g1", kind="sync", queue="sync", repository=repo, attempts=5, budget_base=3
    )
    assert run.rq_id() == "sync-1-g1-a6" and run.rq_id(2) == "sync-1-g1-a2"
    assert run.budget_used == 2
    refused(model=JobRun, job_id="sync-1-g1", kind="sync", queue="sync", repository=repo)
    JobAttempt.objects.create(run=run, number=1)
    refused(model=JobAttempt, run=run, number=1)


def test_an_api_token_stores_only_its_digest() -> None:
    user = User.objects.create_user("t", password="pw-t-12345")
    token, raw = ApiToken.issue(user)
    assert raw.startswith("gw_") and token.prefix == raw[:10]
    assert token.digest == ApiToken.hash(raw) != raw
    assert ApiToken.objects.get(digest=ApiToken.hash(raw)) == token
    assert raw not in {str(v) for v in ApiToken.objects.values_list(flat=False).get()}


def test_one_current_and_one_ramping_version_per_queue() -> None:
    version("a", state="current")
    refused(model=AnalyzerVersion, fingerprint="b" * 64, code_version="c", state="current")
    version("b", state="current", queue="other")  # another queue has its own
    now = timezone.now()
    version("c", state="ramping", ramp_percent=10, verified_at=now)
    refused(
        model=AnalyzerVersion, fingerprint="d" * 64, code_version="c", state="ramping",
        ramp_percent=10, verified_at=now,
    )  # fmt: skip
    refused(model=AnalyzerVersion, fingerprint="a" * 64, code_version="c")  # same fingerprint


@pytest.mark.parametrize(
    "row",
    [
        {"state": "ramping", "ramp_percent": 101},  # a share is 0..100
        {"state": "warming", "ramp_percent": 10},  # only a ramping version takes a share
        {"state": "verified"},  # routable only once the warming gate passed
        {"state": "ramping", "ramp_percent": 10},
    ],
)
def test_version_check_constraints(row: dict[str, object]) -> None:
    if row.get("ramp_percent") == 101:
        row = {**row, "verified_at": timezone.now()}
    refused(model=AnalyzerVersion, fingerprint="a" * 64, code_version="c", **row)


def test_a_version_shows_its_short_fingerprint() -> None:
    v = version("a", queue="analysis")
    assert v.fp12 == "a" * 12
    assert str(v) == f"analysis@{'a' * 12} (registered)"


def test_one_active_rollout_per_queue() -> None:
    v, w = version("a"), version("b")
    Rollout.objects.create(version=v, started_by="op", state="active")
    for state in Rollout.ACTIVE_STATES:
        refused(model=Rollout, version=w, started_by="op", state=state)
    done = Rollout.objects.create(version=w, started_by="op", state="completed")
    assert not done.is_active
    assert Rollout.objects.get(state="active").is_active
    Rollout.objects.create(version=w, started_by="op", state="active", queue="other")


def test_one_view_counter_per_repository_and_day() -> None:
    repo = Repository.objects.create(url="https://example.com/a/b.git")
    RepositoryView.objects.create(repository=repo, day=date(2026, 1, 1))
    refused(model=RepositoryView, repository=repo, day=date(2026, 1, 1))
    RepositoryView.objects.create(repository=repo, day=date(2026, 1, 2))
