"""dashboard.accounts.auth_backend: the request's user in one plain SELECT, the same user the ORM
gives, the same refusals (inactive, deleted, new password), sessions of Django's ModelBackend still
valid, and one password check per failed login. Real database (SQLite, and PostgreSQL under
DATABASE_URL)."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, authenticate
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from dashboard.accounts.auth_backend import UserBackend

pytestmark = pytest.mark.django_db

PASSWORD = "pw-users-123456"
OURS = "dashboard.accounts.auth_backend.UserBackend"
DJANGOS = "django.contrib.auth.backends.ModelBackend"


def _user_queries(client: Client, path: str = "/repos/") -> list[str]:
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(path).status_code == 200
    table = connection.ops.quote_name(User._meta.db_table)
    return [q["sql"] for q in ctx.captured_queries if f"FROM {table}" in q["sql"]]


def test_it_is_the_first_backend_and_djangos_stays_listed() -> None:
    assert settings.AUTHENTICATION_BACKENDS == [OURS, DJANGOS]


def test_a_page_loads_its_user_with_one_select_by_id_without_limit() -> None:
    """The ORM's ``get`` adds ``LIMIT 21``; ours is the plain SELECT by primary key."""
    User.objects.create_user("users-select", password=PASSWORD)
    client = Client()
    assert client.login(username="users-select", password=PASSWORD)
    assert client.session[BACKEND_SESSION_KEY] == OURS
    (sql,) = _user_queries(client)
    assert sql.startswith("SELECT ") and "LIMIT" not in sql.upper()
    assert connection.ops.quote_name("id") in sql.split("WHERE", 1)[1]


def test_it_gives_the_same_user_the_orm_gives_every_field_converted() -> None:
    user = User.objects.create_user("users-same", email="a@example.org", password=PASSWORD)
    user.is_staff = True
    user.first_name = "Ada"
    user.save()
    Client().login(username="users-same", password=PASSWORD)  # sets last_login
    orm = User.objects.get(pk=user.pk)
    ours = UserBackend().get_user(user.pk)
    assert ours is not None and ours._state.adding is False and ours._state.db == "default"
    for field in User._meta.concrete_fields:
        mine, theirs = getattr(ours, field.attname), getattr(orm, field.attname)
        assert (mine, type(mine)) == (theirs, type(theirs)), field.name
    assert ours.last_login is not None and ours.last_login.tzinfo is not None
    assert ours.is_staff is True and ours.is_superuser is False  # bools, not 0/1 (SQLite)
    assert ours.get_session_auth_hash() == orm.get_session_auth_hash()


def test_it_refuses_an_inactive_a_missing_and_a_malformed_user() -> None:
    user = User.objects.create_user("users-inactive", password=PASSWORD)
    backend = UserBackend()
    assert backend.get_user(user.pk) is not None
    User.objects.filter(pk=user.pk).update(is_active=False)
    assert backend.get_user(user.pk) is None
    assert backend.get_user(user.pk + 1000) is None
    assert backend.get_user("not-an-id") is None


def test_deactivation_and_a_new_password_log_out_at_the_next_request() -> None:
    user = User.objects.create_user("users-logout", password=PASSWORD)
    client = Client()
    assert client.login(username="users-logout", password=PASSWORD)
    assert client.get("/repos/").status_code == 200
    user.set_password("another-password-789")
    user.save()  # Django's session hash changes: the old session is refused
    res = client.get("/repos/")
    assert res.status_code == 302 and res["Location"].startswith("/login/")
    assert client.login(username="users-logout", password="another-password-789")
    User.objects.filter(pk=user.pk).update(is_active=False)
    res = client.get("/repos/")
    assert res.status_code == 302 and res["Location"].startswith("/login/")


def test_a_session_logged_in_through_djangos_backend_stays_valid() -> None:
    """Sessions from before this backend store Django's path: still served."""
    user = User.objects.create_user("users-old", password=PASSWORD)
    client = Client()
    client.force_login(user, backend=DJANGOS)
    assert client.session[BACKEND_SESSION_KEY] == DJANGOS
    assert client.get("/repos/").status_code == 200


def test_permissions_are_djangos() -> None:
    user = User.objects.create_user("users-perm", password=PASSWORD, is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="retry_jobrun"))
    ours = UserBackend().get_user(user.pk)
    assert ours.has_perm("dashboard.retry_jobrun")
    assert not ours.has_perm("dashboard.discard_jobrun")


def test_a_permission_set_is_djangos_in_one_query() -> None:
    """Own and group permissions, read in one query; the same set as ModelBackend's;
    none for an inactive user; a superuser's are every permission."""
    from django.contrib.auth.backends import ModelBackend
    from django.contrib.auth.models import Group

    group = Group.objects.create(name="users-ops")
    group.permissions.add(Permission.objects.get(codename="view_jobrun"))
    group.permissions.add(Permission.objects.get(codename="retry_jobrun"))
    user = User.objects.create_user("users-set", password=PASSWORD, is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="retry_jobrun"))  # also via group
    user.user_permissions.add(Permission.objects.get(codename="pause_queue"))
    user.groups.add(group)
    expected = ModelBackend().get_all_permissions(User.objects.get(pk=user.pk))
    assert expected == {"dashboard.view_jobrun", "dashboard.retry_jobrun", "dashboard.pause_queue"}
    ours = UserBackend().get_user(user.pk)
    with CaptureQueriesContext(connection) as ctx:
        assert ours.get_all_permissions() == expected
        assert ours.has_perm("dashboard.view_jobrun") and not ours.has_perm(
            "dashboard.discard_jobrun"
        )
    assert len(ctx.captured_queries) == 1
    User.objects.filter(pk=user.pk).update(is_active=False)
    assert UserBackend().get_all_permissions(User.objects.get(pk=user.pk)) == set()
    boss = User.objects.create_superuser("users-boss", password=PASSWORD)
    assert UserBackend().get_all_permissions(boss) == ModelBackend().get_all_permissions(
        User.objects.get(pk=boss.pk)
    )
    # Revoked: the next request's user object reads the set again.
    group.permissions.remove(Permission.objects.get(codename="view_jobrun"))
    User.objects.filter(pk=user.pk).update(is_active=True)
    assert not UserBackend().get_user(user.pk).has_perm("dashboard.view_jobrun")


class _Counting(PBKDF2PasswordHasher):
    calls = 0

    def encode(self, password: str, salt: str, iterations: int | None = None) -> str:
        type(self).calls += 1
        return super().encode(password, salt, iterations)


def test_a_failed_login_checks_the_password_once(settings: object) -> None:
    """Two ModelBackend-like backends would hash a wrong password twice."""
    settings.PASSWORD_HASHERS = [f"{__name__}._Counting"]  # type: ignore[attr-defined]
    User.objects.create_user("users-once", password=PASSWORD)
    _Counting.calls = 0
    assert authenticate(username="users-once", password="wrong-password") is None
    assert _Counting.calls == 1
    _Counting.calls = 0
    assert authenticate(username="nobody-here", password="wrong-password") is None
    assert _Counting.calls == 1  # the timing-equaliser hash, once
    assert authenticate(username="users-once", password=PASSWORD) is not None
