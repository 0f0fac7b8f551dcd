"""Push webhooks' core (docs/api.md#push-webhooks): verification of each provider's
signature, and the debounce — a burst of signed pushes over HTTP makes exactly one sync,
of the head the origin has when it runs (real RQ queues and workers, real git)."""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import time

import pytest
from django.contrib.auth.models import User
from django.test import Client
from rq.registry import ScheduledJobRegistry

from dashboard import infra
from dashboard.models import AuditEntry, JobRun, Repository
from dashboard.repositories.lifecycle import submit_repository
from dashboard.repositories.webhooks import (
    HookRefused,
    issue_secret,
    job_id,
    sync_after_push,
    verify,
    wanted,
)
from tests.conftest import run_workers
from tests.support.gitrepo import GitRepo

pytestmark = pytest.mark.django_db(transaction=True)


def sign(secret: str, body: bytes) -> str:
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def github(secret: str, body: bytes) -> dict[str, str]:
    return {"HTTP_X_HUB_SIGNATURE_256": f"sha256={sign(secret, body)}",
            "HTTP_X_GITHUB_EVENT": "push"}  # fmt: skip


@pytest.fixture
def admin() -> User:
    return User.objects.create_superuser("root", password="pw-root-123")


@pytest.fixture
def ready(git_repo: GitRepo, admin: User) -> tuple[Repository, str]:
    repo, _ = submit_repository(url=str(git_repo.path))
    run_workers()
    repo.refresh_from_db()
    assert repo.status == "ready"
    return repo, issue_secret(repo, admin)


def headers_of(meta: dict[str, str]) -> dict[str, str]:
    """WSGI names → the header names ``request.headers`` answers to."""
    return {k.removeprefix("HTTP_").replace("_", "-").title(): v for k, v in meta.items()}


@pytest.mark.parametrize("provider", ["github", "gitlab", "gitea", "generic"])
def test_each_providers_signature_is_verified_and_a_wrong_one_refused(
    ready: tuple[Repository, str], provider: str
) -> None:
    repo, secret = ready
    body = json.dumps({"ref": "refs/heads/main"}).encode()
    good, bad = {
        "github": ({"X-Hub-Signature-256": f"sha256={sign(secret, body)}"},
                   {"X-Hub-Signature-256": f"sha256={sign('wrong', body)}"}),
        "gitlab": ({"X-Gitlab-Token": secret}, {"X-Gitlab-Token": secret[:-1]}),
        "gitea": ({"X-Gitea-Signature": sign(secret, body)},
                  {"X-Gitea-Signature": sign(secret, body + b" ")}),
        "generic": ({"X-Gitward-Signature": f"sha256={sign(secret, body)}"},
                    {"X-Gitward-Signature": sign(secret, body)}),  # the prefix is required
    }[provider]  # fmt: skip
    push = verify(repo, good, body)
    assert (push.provider, push.ref) == (provider, "refs/heads/main")
    with pytest.raises(HookRefused, match="bad signature") as refused:
        verify(repo, bad, body)
    assert refused.value.status == 401


def test_no_signature_or_no_secret_is_refused(ready: tuple[Repository, str]) -> None:
    repo, _ = ready
    with pytest.raises(HookRefused, match="missing signature"):
        verify(repo, {"X-GitHub-Event": "push"}, b"{}")
    repo.hook_secret = ""
    with pytest.raises(HookRefused, match="not enabled") as refused:
        verify(repo, {"X-Gitlab-Token": ""}, b"{}")
    assert refused.value.status == 403


def test_pings_and_other_branches_start_nothing(ready: tuple[Repository, str]) -> None:
    repo, secret = ready
    ping = verify(repo, {"X-Hub-Signature-256": f"sha256={sign(secret, b'{}')}",
                         "X-GitHub-Event": "ping"}, b"{}")  # fmt: skip
    assert wanted(repo, ping) == "ignored: event 'ping' is not a push"
    repo.branch = "main"
    body = b'{"ref": "refs/heads/dev"}'
    other = verify(repo, {"X-Gitea-Signature": sign(secret, body)}, body)
    assert wanted(repo, other) == "ignored: refs/heads/dev is not the analysed branch main"


def test_issuing_a_secret_replaces_the_old_one_and_is_audited(
    ready: tuple[Repository, str], admin: User
) -> None:
    repo, first = ready
    second = issue_secret(repo, admin)
    assert second != first and second.startswith("gwh_")
    body = b"{}"
    with pytest.raises(HookRefused):
        verify(repo, {"X-Gitlab-Token": first}, body)
    assert verify(repo, {"X-Gitlab-Token": second}, body).provider == "gitlab"
    entries = AuditEntry.objects.filter(action="repo.hook_secret")
    assert entries.count() == 2 and all(second not in e.outcome for e in entries)


def test_a_burst_of_signed_pushes_makes_exactly_one_sync_of_the_latest_head(
    ready: tuple[Repository, str], git_repo: GitRepo, settings
) -> None:
    repo, secret = ready
    settings.HOOK_DEBOUNCE = 1.0
    client = Client()
    q = infra.queue(infra.MAINTENANCE_QUEUE)
    scheduled = ScheduledJobRegistry(queue=q)
    outcomes = []
    for n in range(50):
        if n % 10 == 0:  # the origin moves during the burst
            git_repo.commit(f"pushed {n}", {f"p{n}.txt": "x\n"})
        body = json.dumps({"ref": "refs/heads/main", "after": git_repo.head()}).encode()
        res = client.post(f"/api/hooks/push/{repo.pk}", data=body,
                          content_type="application/json", **github(secret, body))  # fmt: skip
        assert res.status_code == 202, res.content
        outcomes.append(res.json()["outcome"])
    assert outcomes[0] == "scheduled" and set(outcomes[1:]) == {"delayed"}
    assert scheduled.get_job_ids() == [job_id(repo.pk)]  # one job for the burst
    assert JobRun.objects.filter(repository=repo, kind="sync").count() == 1  # none yet
    # Once the quiet period is over, the workers run it: one sync, of the latest head.
    due = scheduled.get_scheduled_time(job_id(repo.pk)).timestamp()
    time.sleep(max(0.0, math.ceil(due) - time.time()) + 0.05)  # RQ compares whole seconds
    assert infra.promote_due_jobs([infra.MAINTENANCE_QUEUE]) == 1  # as every worker does
    run_workers()
    repo.refresh_from_db()
    syncs = JobRun.objects.filter(repository=repo, kind="sync").order_by("pk")
    assert [s.generation for s in syncs] == [1, 2]
    assert repo.status == "ready" and repo.head == git_repo.head()
    assert repo.commits_total == 3 + 5
    # The job, run again (a redelivery, a trailing job), finds the push covered.
    assert sync_after_push(repo.pk).startswith("covered by sync-")
    assert JobRun.objects.filter(repository=repo, kind="sync").count() == 2


def test_a_push_to_a_busy_repository_waits_for_it_then_syncs_once(
    ready: tuple[Repository, str], git_repo: GitRepo, settings
) -> None:
    repo, _ = ready
    settings.HOOK_DEBOUNCE = 0.0
    # A sync is running (started before the push): the push is not covered by it.
    sync = JobRun.objects.get(repository=repo, kind="sync")
    Repository.objects.filter(pk=repo.pk).update(status="syncing")
    Repository.objects.filter(pk=repo.pk).update(pushed_at=sync.started_at.replace(year=2100))
    outcome = sync_after_push(repo.pk)
    assert outcome == f"busy: looked at again by hook-{repo.pk}-g1-1"
    assert JobRun.objects.filter(repository=repo, kind="sync").count() == 1
    Repository.objects.filter(pk=repo.pk).update(status="ready")
    git_repo.commit("late", {"late.txt": "y\n"})
    run_workers()  # the follow-up job: the repository is free now
    repo.refresh_from_db()
    assert JobRun.objects.filter(repository=repo, kind="sync").count() == 2
    assert repo.head == git_repo.head()


def test_the_cli_issues_a_secret_that_verifies(git_repo: GitRepo, capsys) -> None:
    from django.core.management import CommandError, call_command

    repo, _ = submit_repository(url=str(git_repo.path))
    call_command("hook_secret", str(repo.pk))
    lines = capsys.readouterr().out.splitlines()
    secret = lines[0].removeprefix("secret ")
    assert lines[1] == f"url    /api/hooks/push/{repo.pk}"
    repo.refresh_from_db()
    assert verify(repo, {"X-Gitlab-Token": secret}, b"{}").provider == "gitlab"
    assert AuditEntry.objects.get(action="repo.hook_secret").actor == "cli"
    with pytest.raises(CommandError, match="no repository"):
        call_command("hook_secret", "/nowhere")


def test_a_stream_of_pushes_cannot_delay_the_sync_past_the_maximum_wait(
    ready: tuple[Repository, str], settings
) -> None:
    from dashboard.repositories.webhooks import schedule_sync

    repo, _ = ready
    settings.HOOK_DEBOUNCE = 60.0
    settings.HOOK_MAX_WAIT = 90.0
    registry = ScheduledJobRegistry(queue=infra.queue(infra.MAINTENANCE_QUEUE))
    assert schedule_sync(repo) == "scheduled"
    first = registry.get_scheduled_time(job_id(repo.pk)).timestamp()
    settings.HOOK_MAX_WAIT = 0.0  # from now on, no push may move it past its creation
    assert schedule_sync(repo) == "delayed"
    capped = registry.get_scheduled_time(job_id(repo.pk)).timestamp()
    assert capped < first and registry.get_job_ids() == [job_id(repo.pk)]


def test_cancelling_the_repository_drops_the_pushes_announced_before(
    ready: tuple[Repository, str], admin: User, settings
) -> None:
    from dashboard.repositories.webhooks import schedule_sync
    from dashboard.runs.cancels import cancel_repository

    repo, _ = ready
    settings.HOOK_DEBOUNCE = 0.0
    assert schedule_sync(repo) == "scheduled"  # queued at once: debounce 0
    cancel_repository(repo, admin)
    run_workers()  # the push job runs after the cancel: nothing to sync
    assert JobRun.objects.filter(repository=repo, kind="sync").count() == 1
    assert schedule_sync(repo) == "scheduled"  # a push after the cancel syncs again
    run_workers()
    assert JobRun.objects.filter(repository=repo, kind="sync").count() == 2
