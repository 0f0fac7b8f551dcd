"""dashboard/infra/dbpool.py and the database 503 (dashboard/middleware.py ``server_error``), on a
real PostgreSQL (the machine's, ``127.0.0.1:5432``; each test makes its own role and
database, from a template migrated once per module): a web process under many
concurrent requests holds at most ``GITWARD_DB_POOL_SIZE`` connections, a forked child
never uses its parent's connection, and a database that refuses connections is a
readable 503, never a 500."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.dashboard.web.test_probes import serving, wait_for

ROOT = Path(__file__).resolve().parents[3]
ADMIN = "postgres://postgres@127.0.0.1:5432/postgres"
PREFIX = f"gw_pool_{os.getpid()}"


def _admin() -> psycopg.Connection[Any]:
    try:
        return psycopg.connect(ADMIN, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        pytest.skip(f"no PostgreSQL on 127.0.0.1:5432: {exc}")


@pytest.fixture(scope="module")
def template() -> Iterator[str]:
    """A migrated database to copy (``CREATE DATABASE … TEMPLATE``: a migrate per test
    would cost a minute each)."""
    name = f"{PREFIX}_template"
    with _admin() as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.execute(f'CREATE DATABASE "{name}"')
    env = {k: v for k, v in os.environ.items() if not k.startswith("GITWARD_")}
    env["DATABASE_URL"] = f"postgres://postgres@127.0.0.1:5432/{name}"
    done = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "migrate", "--noinput", "-v", "0"],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    yield name
    with _admin() as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')


@pytest.fixture
def database(template: str, request: pytest.FixtureRequest) -> Iterator[dict[str, str]]:
    """A copy of the template owned by a role of its own (not a superuser, whose
    connections no ``CONNECTION LIMIT`` bounds), at most 3 connections."""
    role = f"{PREFIX}_{re.sub(r'[^a-z0-9]+', '_', request.node.name.lower())[-20:]}"
    name = f"{role}_db"
    with _admin() as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.execute(f'DROP ROLE IF EXISTS "{role}"')
        admin.execute(f'CREATE ROLE "{role}" LOGIN CONNECTION LIMIT 3')
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}" OWNER "{role}"')
        admin.execute(f'ALTER DATABASE "{name}" OWNER TO "{role}"')
        with psycopg.connect(f"{ADMIN.rsplit('/', 1)[0]}/{name}", autocommit=True) as db:
            for table in db.execute(
                "select tablename from pg_tables where schemaname = 'public'"
            ).fetchall():
                db.execute(f'ALTER TABLE "{table[0]}" OWNER TO "{role}"')
            for seq in db.execute(
                "select sequencename from pg_sequences where schemaname = 'public'"
            ).fetchall():
                db.execute(f'ALTER SEQUENCE "{seq[0]}" OWNER TO "{role}"')
    yield {"role": role, "name": name, "url": f"postgres://{role}@127.0.0.1:5432/{name}"}
    with _admin() as admin:
        admin.execute(
            "select pg_terminate_backend(pid) from pg_stat_activity where usename = %s", (role,)
        )
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'DROP ROLE IF EXISTS "{role}"')


def _connections_of(admin: psycopg.Connection[Any], role: str) -> int:
    row = admin.execute("select count(*) from pg_stat_activity where usename = %s", (role,))
    return int(row.fetchone()[0])  # type: ignore[index]


def _status(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes, str]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=60) as res:
            return res.status, res.read(), res.headers.get("Content-Type", "")
    except urllib.error.HTTPError as err:
        return err.code, err.read(), err.headers.get("Content-Type", "")


@pytest.mark.slow  # a PostgreSQL database, a uvicorn server and four redis-servers
def test_many_concurrent_requests_to_one_web_process_hold_at_most_the_pool_size(
    tmp_path: Path, database: dict[str, str]
) -> None:
    # The role may hold 3 connections: before the pool, each in-flight request held one
    # of its own, and the 4th concurrent request was refused ("too many connections for
    # role": a 500, now a 503). (/readyz checks on a direct connection of its own.)
    extra = {"GITWARD_DB_POOL_SIZE": "3", "GITWARD_DB_POOL_TIMEOUT": "30"}
    with serving(tmp_path, database["url"], None, extra_env=extra, migrate=False) as srv:
        bad_token = (srv["base"] + "/api/status", {"Authorization": "Bearer not-a-token"})
        seen: list[int] = []
        done = threading.Event()

        def watch() -> None:
            with _admin() as admin:
                while not done.is_set():
                    seen.append(_connections_of(admin, database["role"]))
                    done.wait(0.01)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            with ThreadPoolExecutor(max_workers=40) as pool:
                codes = list(pool.map(lambda _: _status(*bad_token)[0], range(160)))
        finally:
            done.set()
            watcher.join(30)
        assert codes == [401] * 160  # each looked its token up in the database
        assert seen and max(seen) <= 3


_FORK_SCRIPT = """
import os
from django.db import connection

def backend():
    with connection.cursor() as cur:
        cur.execute("select pg_backend_pid()")
        return cur.fetchone()[0]

def in_child():
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.write(w, str(backend()).encode())
        finally:
            os._exit(0)
    os.close(w)
    got = int(os.read(r, 64) or b"0")
    os.waitpid(pid, 0)
    return got

held = backend()
child_while_held = in_child()  # the parent's connection open at the fork
again = backend()  # the parent's session survived the child
connection.close()  # back to the pool (if any), idle there at the next fork
child_after_close = in_child()
print(held, child_while_held, again, child_after_close, backend())
"""


@pytest.mark.parametrize("pool_size", ["3", "0"])
def test_a_forked_child_never_uses_its_parents_connection(
    database: dict[str, str], pool_size: str
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GITWARD_")}
    env.update(DATABASE_URL=database["url"], GITWARD_DB_POOL_SIZE=pool_size)
    done = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "shell", "-c", _FORK_SCRIPT],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    held, child_held, again, child_closed, last = map(int, done.stdout.splitlines()[-1].split())
    assert child_held not in (0, held)
    assert again == held
    assert child_closed not in (0, held, child_held)
    assert last > 0


@pytest.mark.slow  # a PostgreSQL database, a uvicorn server and four redis-servers
@pytest.mark.parametrize("pool_size", ["3", "0"])
def test_a_database_refusing_connections_is_a_readable_503(
    tmp_path: Path, database: dict[str, str], pool_size: str
) -> None:
    extra = {"GITWARD_DB_POOL_SIZE": pool_size, "GITWARD_DB_POOL_TIMEOUT": "1"}
    with serving(tmp_path, database["url"], None, extra_env=extra, migrate=False) as srv:
        with _admin() as admin:
            admin.execute(f'ALTER ROLE "{database["role"]}" CONNECTION LIMIT 0')
            admin.execute(
                "select pg_terminate_backend(pid) from pg_stat_activity where usename = %s",
                (database["role"],),
            )
        # A session cookie: the session middleware's query is the first to fail.
        code, body, kind = _status(srv["base"] + "/", {"Cookie": "sessionid=" + "x" * 32})
        assert code == 503, body[:300]
        assert kind.startswith("text/html")
        assert b"the database is not answering; try again in a moment." in body
        assert b"Traceback" not in body and b"OperationalError" not in body
        code, body, kind = _status(
            srv["base"] + "/api/status", {"Authorization": "Bearer not-a-token"}
        )
        assert code == 503, body[:300]
        assert kind == "application/json"
        assert body == b'{"error": "the database is not answering"}'
        with _admin() as admin:
            admin.execute(f'ALTER ROLE "{database["role"]}" CONNECTION LIMIT 3')
        wait_for(srv["base"] + "/readyz", 200)  # and back once it answers


@pytest.mark.slow  # a PostgreSQL database, a uvicorn server and four redis-servers
def test_every_page_request_hands_its_pooled_connection_back(
    tmp_path: Path, database: dict[str, str]
) -> None:
    """A page whose session middleware queries (a session cookie) takes a pooled
    connection; it must be back in the pool when the request ends. With a pool of 2
    and a 2 s timeout, a request that kept its connection would leave the third
    sequential request waiting out the timeout (a 503): 30 in a row must all be
    answered, each by the session lookup (a cookie of no session: the login page)."""
    extra = {"GITWARD_DB_POOL_SIZE": "2", "GITWARD_DB_POOL_TIMEOUT": "2"}
    with serving(tmp_path, database["url"], None, extra_env=extra, migrate=False) as srv:
        cookie = {"Cookie": "sessionid=" + "q" * 32}
        pages = [_status(srv["base"] + "/repos/", cookie)[0] for _ in range(30)]
        api = [
            _status(srv["base"] + "/api/status", {"Authorization": "Bearer not-a-token"})[0]
            for _ in range(10)
        ]
        assert pages == [200] * 30  # redirected to the login page (urllib follows)
        assert api == [401] * 10
        with _admin() as admin:
            assert _connections_of(admin, database["role"]) <= 3  # 2 pooled + /readyz's
