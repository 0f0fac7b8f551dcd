"""dashboard.accounts.audit: one row per operator action (the views that call it are covered in
tests/dashboard/web/test_repositories.py and tests/dashboard/api/test_api.py)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import AnonymousUser, User
from django.test import Client

from dashboard.accounts.audit import clean_reason, reason_problem, record_audit
from dashboard.locks import leases
from dashboard.locks.leases import force_release_lock
from dashboard.models import AuditEntry, JobRun, Repository
from dashboard.runs.dead_letters import act_now
from tests.support.sockets import make_user
from workers.locks import keys

pytestmark = pytest.mark.django_db


def test_a_mutation_writes_who_what_and_outcome() -> None:
    alice = User.objects.create_user("alice", password="pw-alice-12345")
    entry = record_audit(
        user=alice, action="repo.delete", target="repo 7", outcome="deleted", detail={"id": 7}
    )
    row = AuditEntry.objects.get(pk=entry.pk)
    assert (row.user, row.actor, row.action, row.target, row.outcome, row.detail) == (
        alice,
        "alice",
        "repo.delete",
        "repo 7",
        "deleted",
        {"id": 7},
    )
    assert row.created_at is not None


def test_actor_of_a_string_a_nobody_and_an_anonymous_user() -> None:
    by_cli = record_audit(user="cli:root", action="a", target="t", outcome="ok")
    assert (by_cli.user, by_cli.actor) == (None, "cli:root")
    by_none = record_audit(user=None, action="a", target="t", outcome="ok")
    assert (by_none.user, by_none.actor, by_none.detail) == (None, "system", {})
    anon = record_audit(user=AnonymousUser(), action="a", target="t", outcome="ok")
    assert anon.user is None and anon.actor == "system"  # AnonymousUser.username == ""


def test_long_fields_are_cut_to_their_columns() -> None:
    entry = record_audit(user="u" * 400, action="a", target="t" * 900, outcome="o" * 900)
    entry.refresh_from_db()
    assert (len(entry.actor), len(entry.target), len(entry.outcome)) == (150, 500, 500)


@pytest.mark.django_db(transaction=True)
def test_entries_about_runs_link_to_the_run_pages() -> None:
    repo = Repository.objects.create(url="https://example.com/t/audited.git")
    dead = JobRun.objects.create(
        job_id="analyze-dead", kind="analyze", queue="analysis", repository=repo, state="dead"
    )
    holder = JobRun.objects.create(
        job_id="sync-holder", kind="sync", queue="sync", repository=repo, state="running"
    )
    op = make_user("op", staff=True, perms=("view_jobrun",))
    act_now(kind="discard", run_ids=[dead.pk], user=op)
    key = keys.mirror(repo.pk)
    leases.redlock().acquire([key], ttl=30.0, holder={"worker": "w", "job": holder.job_id})
    force_release_lock(key=key, user=op)
    record_audit(user=op, action="repo.reanalyse", target="runs of nobody", outcome="ok")
    c = Client()
    c.force_login(op)
    page = c.get("/audit/").content.decode()
    assert f'<a class="run-link" href="/runs/{dead.pk}/">run #{dead.pk}</a>' in page
    assert f'href="/runs/job/{holder.job_id}/"' in page
    assert c.get(f"/runs/job/{holder.job_id}/").url == f"/runs/{holder.pk}/"
    assert page.count('class="run-link"') == 2  # an entry naming no run links none


@pytest.mark.parametrize(
    ("raw", "kept"),
    [
        ("stop\x1b[2J now", "stop[2J now"),
        ("nul\x00here", "nulhere"),
        ("c1\x9bcontrol\x7f", "c1control"),
        ("lone \ud800 surrogate", "lone surrogate"),
        ("  two\n\tlines  ", "two lines"),
        ("Zoë 🚀", "Zoë 🚀"),
    ],
)
def test_a_reason_header_is_kept_without_control_characters(raw: str, kept: str) -> None:
    """``clean_reason`` (the ``X-Audit-Reason`` header's path): no NUL for PostgreSQL to
    refuse after the action ran, no ESC to reach an operator's terminal."""
    assert clean_reason(raw) == kept
    entry = record_audit(user="cli", action="x", target="t", outcome="ok", reason=raw)
    assert AuditEntry.objects.get(pk=entry.pk).detail == {"reason": kept}


@pytest.mark.parametrize(
    ("typed", "problem"),
    [
        ("fine, with a tab\tand a newline\n", None),
        ("x" * 500, None),
        ("x" * 501, '"reason" must be a string (≤ 500 characters)'),
        (5, '"reason" must be a string (≤ 500 characters)'),
        ("esc\x1b", '"reason" must not hold control characters (NUL, ESC, …)'),
        ("nul\x00", '"reason" must not hold control characters (NUL, ESC, …)'),
        ("surrogate\udc80", '"reason" must not hold control characters (NUL, ESC, …)'),
    ],
)
def test_a_typed_reason_is_checked_before_its_action(typed: object, problem: str | None) -> None:
    assert reason_problem(typed) == problem
