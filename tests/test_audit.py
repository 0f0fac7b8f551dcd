"""dashboard.audit: one row per operator action (the views that call it are covered in
tests/test_views.py and tests/test_api.py)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import AnonymousUser, User

from dashboard.audit import record_audit
from dashboard.models import AuditEntry

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
