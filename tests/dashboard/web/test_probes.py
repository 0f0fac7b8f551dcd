"""``GET /readyz`` and ``/healthz`` over HTTP, from a real server process (uvicorn serving
the ASGI app) on a database file of its own and Redis servers started here: three lock
masters and a queue Redis, stopped and started for real; the database is taken away by
putting a directory where its file was, and a PostgreSQL server of the test's own is
stopped and started again."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test import Client

from tests.support.sysproc import wait_http
from workers.runtime.redis_server import RedisNode, free_port

ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.django_db(transaction=True)


def _fresh_database(path: Path | None, env: dict[str, str]) -> None:
    """A migrated database: for a SQLite ``path``, a copy of the test database when that
    is SQLite (fast), else ``migrate`` into it (a new file or ``env``'s PostgreSQL)."""
    if path is not None and connection.vendor == "sqlite":
        src = sqlite3.connect(connection.settings_dict["NAME"])
        dst = sqlite3.connect(path)
        with dst:
            src.backup(dst)
        src.close()
        dst.close()
        return
    done = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "migrate", "--noinput", "-v", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr


@contextlib.contextmanager
def serving(
    tmp_path: Path,
    database_url: str,
    db: Path | None,
    *,
    extra_env: dict[str, str] | None = None,
    migrate: bool = True,
) -> Iterator[dict[str, Any]]:
    """A uvicorn process on ``database_url`` (migrated unless ``migrate`` is false),
    with three lock masters and a queue Redis of its own, and ``extra_env``."""
    masters = [RedisNode(tmp_path / f"lock{i}").start() for i in range(3)]
    queue = RedisNode(tmp_path / "queue").start()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITWARD_", "REDIS_URL"))}
    env.update(
        DATABASE_URL=database_url,
        REDIS_URLS=",".join(n.url for n in masters),
        REDIS_URL=queue.url,
        GITWARD_VAR_DIR=str(tmp_path / "var"),
        **(extra_env or {}),
    )
    proc = None
    try:
        if migrate:
            _fresh_database(db, env)
        proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "dashboard.asgi:application", "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/healthz", proc, timeout=90)
        yield {"base": base, "masters": masters, "queue": queue, "db": db}
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
        for node in [*masters, queue]:
            node.kill()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[dict[str, Any]]:
    db = tmp_path / "web.sqlite3"
    with serving(tmp_path, f"sqlite:///{db}", db) as srv:
        yield srv


class PostgresServer:
    """A PostgreSQL server of this test's own (``initdb`` into a temporary directory, on
    a free port), so it can really be stopped and started again; run as the ``postgres``
    user when the tests run as root (the server refuses root)."""

    def __init__(self) -> None:
        if not shutil.which("initdb") or not shutil.which("pg_ctl"):
            pytest.skip("PostgreSQL's initdb and pg_ctl are not installed")
        self.dir = Path(tempfile.mkdtemp(prefix="gitward-pg-"))
        self.port = free_port()
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            self.as_user = ["runuser", "-u", "postgres", "--"]
            shutil.chown(self.dir, "postgres")
        self._pg(["initdb", "-D", str(self.dir / "data"), "-A", "trust", "-U", "postgres"])
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/postgres"

    def _pg(self, cmd: list[str]) -> None:
        done = subprocess.run(
            [*self.as_user, *cmd], capture_output=True, text=True, timeout=300
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr

    def start(self) -> None:
        opts = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._pg(["pg_ctl", "-D", str(self.dir / "data"), "-o", opts, "-l",
                  str(self.dir / "log"), "-w", "-t", "120", "start"])  # fmt: skip

    def stop(self) -> None:
        self._pg(["pg_ctl", "-D", str(self.dir / "data"), "-m", "immediate", "-w", "stop"])

    def remove(self) -> None:
        with contextlib.suppress(AssertionError):
            self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def get(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=10) as res:
            return res.status, json.loads(res.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def wait_for(url: str, status: int, timeout: float = 30) -> dict[str, Any]:
    """Poll until ``url`` answers ``status``; its JSON body."""
    deadline = time.monotonic() + timeout
    while True:
        code, body = get(url)
        if code == status:
            return body
        if time.monotonic() > deadline:
            raise AssertionError(f"{url} stayed {code}: {body}")
        time.sleep(0.2)


@pytest.mark.slow  # a real uvicorn server and four redis-servers per test
def test_it_turns_unready_without_a_quorum_and_ready_when_it_returns(server) -> None:
    url = server["base"] + "/readyz"
    body = wait_for(url, 200)
    assert body["ready"] is True and body["failed"] == []
    assert set(body["checks"]) == {"database", "migrations", "lock_quorum", "queue"}
    a, b, _ = server["masters"]
    a.stop()
    body = wait_for(url, 200)  # one of three down: the quorum holds
    assert body["checks"]["lock_quorum"]["detail"] == "lock masters: 2/3 answer PING"
    b.stop()
    body = wait_for(url, 503)
    assert body["ready"] is False and body["failed"] == ["lock_quorum"]
    detail = body["checks"]["lock_quorum"]["detail"]
    assert "1/3 answer PING (need 2)" in detail
    assert f"127.0.0.1:{a.port}" in detail and f"127.0.0.1:{b.port}" in detail
    a.start()
    b.start()
    assert wait_for(url, 200)["ready"] is True


@pytest.mark.slow  # a real uvicorn server and four redis-servers per test
def test_it_turns_unready_without_the_database_and_ready_when_it_returns(server) -> None:
    url = server["base"] + "/readyz"
    wait_for(url, 200)
    db: Path = server["db"]
    aside = db.with_suffix(".aside")
    db.rename(aside)
    db.mkdir()  # where the file was, sqlite can open nothing
    try:
        body = wait_for(url, 503)
        assert body["failed"] == ["database", "migrations"]
        assert body["checks"]["database"]["detail"].startswith("database unreachable")
        assert body["checks"]["lock_quorum"]["ok"] and body["checks"]["queue"]["ok"]
        # Liveness is not readiness: the process still answers /healthz.
        with urllib.request.urlopen(server["base"] + "/healthz", timeout=10) as res:
            assert res.status == 200
    finally:
        db.rmdir()
        aside.rename(db)
    assert wait_for(url, 200)["ready"] is True


@pytest.mark.slow  # a PostgreSQL server, a real uvicorn server and four redis-servers
def test_it_turns_unready_when_the_postgresql_server_stops_and_ready_when_it_is_back(
    tmp_path: Path,
) -> None:
    pg = PostgresServer()
    try:
        pg.start()
        with serving(tmp_path, pg.url, None) as srv:
            url = srv["base"] + "/readyz"
            assert wait_for(url, 200)["ready"] is True
            pg.stop()  # the database server process is gone
            body = wait_for(url, 503)
            assert body["failed"] == ["database", "migrations"]
            assert body["checks"]["database"]["detail"].startswith("database unreachable")
            assert body["checks"]["lock_quorum"]["ok"] and body["checks"]["queue"]["ok"]
            with urllib.request.urlopen(srv["base"] + "/healthz", timeout=10) as res:
                assert res.status == 200  # alive, not ready
            pg.start()
            assert wait_for(url, 200, timeout=60)["ready"] is True
    finally:
        pg.remove()


@pytest.mark.slow  # a real uvicorn server and four redis-servers per test
def test_it_names_the_queue_redis(server) -> None:
    url = server["base"] + "/readyz"
    wait_for(url, 200)
    server["queue"].stop()
    body = wait_for(url, 503)
    assert body["failed"] == ["queue"]
    assert body["checks"]["queue"]["detail"] == (
        f"queue Redis 127.0.0.1:{server['queue'].port} does not answer PING"
    )
    server["queue"].start()
    wait_for(url, 200)


def test_in_process_every_check_is_reported() -> None:
    res = Client().get("/readyz")
    assert res.status_code == 200
    body = json.loads(res.content)
    assert body["failed"] == []
    assert body["checks"]["migrations"] == {"ok": True, "detail": "every migration applied"}
    assert body["checks"]["database"]["ok"] is True


def test_readyz_needs_no_login_and_leaks_no_password(settings) -> None:
    settings.REDIS_URL = f"redis://:s3cret-pw@127.0.0.1:{free_port()}/0"
    res = Client().get("/readyz")
    assert res.status_code == 503
    assert res.json()["failed"] == ["queue"]
    assert b"s3cret-pw" not in res.content
