"""dashboard.accounts.first_admin.ensure_admin: the first user, created once, never over an
existing one."""

from __future__ import annotations

import pytest
from django.contrib.auth import authenticate, get_user_model
from django.db import connection

from dashboard.accounts.first_admin import ensure_admin

pytestmark = pytest.mark.django_db


def test_with_no_user_an_admin_is_created_with_a_generated_password_shown_once() -> None:
    password = ensure_admin()
    assert password and len(password) >= 16
    admin = get_user_model().objects.get()
    assert admin.username == "admin" and admin.is_superuser and admin.is_staff
    assert authenticate(username="admin", password=password) == admin
    assert ensure_admin() is None  # a second start: nothing new, nothing printed
    assert get_user_model().objects.count() == 1


def test_a_password_from_the_environment_is_used_and_not_printed(settings: object) -> None:
    settings.ADMIN_PASSWORD = "from-the-env-123"  # type: ignore[attr-defined]
    assert ensure_admin() is None
    assert authenticate(username="admin", password="from-the-env-123") is not None


def test_an_existing_user_means_no_admin_is_created() -> None:
    get_user_model().objects.create_user("alice", password="pw-alice-123")
    assert ensure_admin() is None
    assert list(get_user_model().objects.values_list("username", flat=True)) == ["alice"]


@pytest.mark.django_db(transaction=True)  # autocommit, as ``up`` runs it
def test_a_concurrent_start_that_created_admin_first_is_not_an_error() -> None:
    """The race of two ``up`` processes: both see no user; the other one inserts
    ``admin`` first (here: right after this one's existence check, from a hook on the
    real database connection), so this one's create fails on the unique username and
    is ignored."""
    User = get_user_model()
    raced: list[str] = []

    def other_up_wins(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        result = execute(sql, params, many, context)
        if not raced and sql.lstrip().upper().startswith("SELECT") and "auth_user" in sql:
            raced.append(sql)
            User.objects.create_superuser("admin", "", "pw-first-123")
        return result

    with connection.execute_wrapper(other_up_wins):
        assert ensure_admin() is None
    assert raced, "the existence check was not seen"
    assert User.objects.count() == 1
    assert authenticate(username="admin", password="pw-first-123") is not None
