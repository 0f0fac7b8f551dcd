"""dashboard.operations.readiness, the checks called directly against real Redis masters and the
real database (``/readyz`` and ``manage.py ready`` are in tests/dashboard/web/test_probes.py and
tests/dashboard/management/test_ready.py)."""

from __future__ import annotations

import socket

import pytest
from django.db.migrations.recorder import MigrationRecorder

from dashboard.infra import queues
from dashboard.operations.readiness import CHECKS, answers_ping, check_readiness
from workers.runtime.redis_server import RedisNode

pytestmark = pytest.mark.django_db


def test_everything_up_is_ready() -> None:
    r = check_readiness()
    assert r.ready and r.failed == [] and r.problem_line() == ""
    body = r.as_dict()
    assert list(body["checks"]) == list(CHECKS)
    assert body["ready"] is True and body["failed"] == []


def test_a_minority_down_keeps_the_quorum_a_majority_down_loses_it(
    redis_nodes: list[RedisNode],
) -> None:
    try:
        redis_nodes[2].kill()
        r = check_readiness(timeout=0.5)
        assert r.ready
        assert r.as_dict()["checks"]["lock_quorum"]["detail"] == "lock masters: 2/3 answer PING"
        redis_nodes[1].kill()
        r = check_readiness(timeout=0.5)
        assert r.as_dict()["failed"] == ["lock_quorum"]
        line = r.problem_line()
        assert "1/3 answer PING (need 2)" in line
        assert f"127.0.0.1:{redis_nodes[1].port}" in line
        assert f"127.0.0.1:{redis_nodes[2].port}" in line
        assert f":{redis_nodes[0].port}" not in line
    finally:
        for n in redis_nodes:
            if not n.alive():
                n.restart()
        queues.CIRCUIT.reset()


def test_the_queue_redis_down_fails_and_names_it_without_its_password(settings) -> None:
    # A port nobody listens on: bound and closed again.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings.REDIS_URL = f"redis://:hunter2@127.0.0.1:{port}/0"
    r = check_readiness(timeout=0.5)
    assert r.as_dict()["failed"] == ["queue"]
    assert r.problem_line() == f"queue Redis 127.0.0.1:{port} does not answer PING"
    assert "hunter2" not in str(r.as_dict())


def test_empty_settings_and_bad_urls_fail(settings) -> None:
    settings.REDIS_URLS = []
    settings.REDIS_URL = ""
    r = check_readiness()
    assert r.as_dict()["failed"] == ["lock_quorum", "queue"]
    assert "REDIS_URLS is empty" in r.problem_line() and "REDIS_URL is empty" in r.problem_line()
    assert answers_ping("http://127.0.0.1:1/", timeout=0.2) is False


def test_an_unapplied_migration_is_named() -> None:
    recorder = MigrationRecorder.Migration.objects
    last = recorder.filter(app="dashboard").order_by("-name").first()
    assert last is not None
    last.delete()  # rolled back with the test's transaction
    r = check_readiness()
    assert r.as_dict()["failed"] == ["migrations"]
    assert r.problem_line() == f"database: 1 migrations not applied (first dashboard.{last.name})"
