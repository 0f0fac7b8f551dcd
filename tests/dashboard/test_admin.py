"""dashboard.admin: which models the admin shows, and that what must not be edited there
cannot be: the audit log is append-only, a token's digest and an attempt's record are
read-only. Through the real admin pages, as a superuser."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.test import Client

from dashboard.accounts.audit import record_audit
from dashboard.models import (
    ApiToken,
    AuditEntry,
    BulkAction,
    Chunk,
    FairGroup,
    JobAttempt,
    JobRun,
    Repository,
    WorkerBeat,
)

pytestmark = pytest.mark.django_db

REGISTERED = {
    ApiToken, AuditEntry, BulkAction, Chunk, FairGroup, JobRun, Repository, WorkerBeat,
}  # fmt: skip


@pytest.fixture
def superuser() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", "", "pw-root-12345"))
    return client


def test_exactly_these_dashboard_models_are_registered() -> None:
    ours = {m for m in admin.site._registry if m._meta.app_label == "dashboard"}
    assert ours == REGISTERED


def test_every_changelist_renders_with_rows(superuser: Client) -> None:
    repo = Repository.objects.create(url="https://example.com/a/b.git")
    run = JobRun.objects.create(job_id="sync-1-g1", kind="sync", queue="sync", repository=repo)
    JobAttempt.objects.create(run=run, number=1, error="boom")
    record_audit(user="op", action="queue.pause", target="sync", outcome="paused")
    for model in REGISTERED:
        url = f"/admin/dashboard/{model._meta.model_name}/"
        assert superuser.get(url).status_code == 200, url
    assert superuser.get(f"/admin/dashboard/jobrun/{run.pk}/change/").status_code == 200
    assert superuser.get("/admin/dashboard/jobrun/?state__exact=dead").status_code == 200


def test_the_audit_log_cannot_be_changed_or_deleted_from_the_admin(superuser: Client) -> None:
    entry = record_audit(user="op", action="queue.pause", target="sync", outcome="paused")
    change = f"/admin/dashboard/auditentry/{entry.pk}/change/"
    assert superuser.get(change).status_code == 200  # viewable
    superuser.post(change, {"actor": "someone else", "action": "x", "target": "y",
                            "outcome": "z", "detail": "{}"})  # fmt: skip
    superuser.post(f"/admin/dashboard/auditentry/{entry.pk}/delete/", {"post": "yes"})
    superuser.post(
        "/admin/dashboard/auditentry/",
        {"action": "delete_selected", "_selected_action": [entry.pk], "post": "yes"},
    )
    row = AuditEntry.objects.get(pk=entry.pk)
    assert (row.actor, row.outcome) == ("op", "paused")


def test_a_tokens_digest_is_not_editable(superuser: Client) -> None:
    token, _ = ApiToken.issue(User.objects.get(username="root"))
    page = superuser.get(f"/admin/dashboard/apitoken/{token.pk}/change/").content.decode()
    assert token.digest in page  # shown
    assert 'name="digest"' not in page  # but no input for it


def test_attempts_are_shown_inline_read_only() -> None:
    inline = next(i for i in admin.site._registry[JobRun].inlines if i.model is JobAttempt)
    fields = {f.name for f in JobAttempt._meta.concrete_fields} - {"id", "run", "spans"}
    assert fields <= set(inline.readonly_fields)
    assert inline.can_delete is False and inline.extra == 0
