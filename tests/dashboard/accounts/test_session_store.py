"""dashboard.accounts.session_store: Django's database sessions, loaded with one plain SELECT — the
same rows, expiry, logout and password rules, on the real database."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.contrib.sessions.backends import db as django_db
from django.contrib.sessions.models import Session
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from dashboard.accounts.session_store import SessionStore

pytestmark = pytest.mark.django_db

PASSWORD = "pw-sessions-123456"


def _logged_in(name: str) -> tuple[Client, User]:
    user = User.objects.create_user(name, password=PASSWORD)
    client = Client()
    assert client.login(username=name, password=PASSWORD)
    return client, user


def _session_queries(client: Client, path: str = "/repos/") -> list[str]:
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(path).status_code == 200
    return [q["sql"] for q in ctx.captured_queries if Session._meta.db_table in q["sql"]]


def test_a_page_loads_its_session_with_one_select_of_the_data_only() -> None:
    """The session costs one query that reads only the data column of the live row
    (Django's store: the ORM's three-column ``get`` with ``LIMIT 21``)."""
    assert settings.SESSION_ENGINE == "dashboard.accounts.session_store"
    client, _ = _logged_in("sess-select")
    (sql,) = _session_queries(client)
    quote = connection.ops.quote_name
    table = quote(Session._meta.db_table)
    assert sql.startswith(f"SELECT {quote('session_data')} FROM {table} WHERE")
    assert "LIMIT" not in sql.upper() and quote("session_key") in sql


def test_a_session_deleted_anywhere_is_refused_at_the_next_request() -> None:
    """Logout in another web process is a deleted row: refused here at once (nothing
    is cached in a process)."""
    client, _ = _logged_in("sess-flush")
    assert client.get("/repos/").status_code == 200
    key = client.cookies[settings.SESSION_COOKIE_NAME].value
    other_process = SessionStore(key)
    other_process.flush()  # what logout does, served elsewhere
    res = client.get("/repos/")
    assert res.status_code == 302 and res["Location"].startswith("/login/")


def test_an_expired_session_is_refused_and_its_key_forgotten() -> None:
    client, _ = _logged_in("sess-expired")
    key = client.cookies[settings.SESSION_COOKIE_NAME].value
    Session.objects.filter(pk=key).update(expire_date=timezone.now() - timedelta(seconds=1))
    res = client.get("/repos/")
    assert res.status_code == 302 and res["Location"].startswith("/login/")
    store = SessionStore(key)
    assert store.load() == {} and store.session_key is None


def test_a_new_password_refuses_the_other_sessions() -> None:
    first, user = _logged_in("sess-password")
    second = Client()
    assert second.login(username="sess-password", password=PASSWORD)
    user.set_password(PASSWORD + "-new")
    user.save()
    for client in (first, second):
        res = client.get("/repos/")
        assert res.status_code == 302 and res["Location"].startswith("/login/")


def test_sessions_of_django_s_own_store_and_this_one_read_each_other() -> None:
    """Same table and encoding: a web process of an older version (Django's store)
    and one of this version share the logged-in users during a rollout."""
    theirs = django_db.SessionStore()
    theirs["k"] = "from django"
    theirs.save()
    assert SessionStore(theirs.session_key).load() == {"k": "from django"}
    ours = SessionStore()
    ours["k"] = "from gitward"
    ours.save()
    assert django_db.SessionStore(ours.session_key).load() == {"k": "from gitward"}
    assert SessionStore("no-such-session-key").load() == {}
    assert SessionStore(None).load() == {}
