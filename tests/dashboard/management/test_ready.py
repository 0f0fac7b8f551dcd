"""``manage.py ready``: the readiness check behind the image's HEALTHCHECK and the k8s probe.

Every case runs against real redis-server processes started here (three lock masters and
a separate queue Redis, as in compose.yaml) that are stopped, killed or SIGSTOPped for
real, and a real database: the test database, or a fresh SQLite file in a subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from workers.runtime.redis_server import RedisNode, free_port

ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.django_db


@pytest.fixture
def cluster(tmp_path: Path, settings: object) -> Iterator[dict[str, list[RedisNode]]]:
    """Three lock masters and a queue Redis of this test's own, wired into settings."""
    masters = [RedisNode(tmp_path / f"lock{i}").start() for i in range(3)]
    queue = RedisNode(tmp_path / "queue").start()
    settings.REDIS_URLS = [n.url for n in masters]  # type: ignore[attr-defined]
    settings.REDIS_URL = queue.url  # type: ignore[attr-defined]
    try:
        yield {"masters": masters, "queue": [queue]}
    finally:
        for node in [*masters, queue]:
            node.kill()


def ready(capsys: pytest.CaptureFixture[str]) -> str:
    """Run the command in-process; return its output, or raise CommandError."""
    call_command("ready", "--timeout", "0.5")
    return capsys.readouterr().out.strip()


def test_it_is_ready_when_everything_answers(cluster, capsys) -> None:
    assert ready(capsys) == "ready"


def test_it_stays_ready_with_one_lock_master_down(cluster, capsys) -> None:
    cluster["masters"][1].stop()
    assert ready(capsys) == "ready"


def test_it_fails_without_a_majority_of_lock_masters(cluster, capsys) -> None:
    a, b, _ = cluster["masters"]
    a.stop()
    b.kill()
    with pytest.raises(CommandError) as err:
        ready(capsys)
    message = str(err.value)
    assert "lock masters: 1/3 answer PING (need 2)" in message
    assert f"127.0.0.1:{a.port}" in message and f"127.0.0.1:{b.port}" in message
    assert "queue" not in message and "database" not in message
    assert "\n" not in message


def test_a_stalled_master_counts_as_down(cluster, capsys) -> None:
    """SIGSTOP: the socket accepts but never answers; the PING timeout bounds the check."""
    a, b, _ = cluster["masters"]
    a.stop()
    b.pause()
    try:
        with pytest.raises(CommandError, match=r"lock masters: 1/3 answer PING"):
            ready(capsys)
    finally:
        b.resume()
    assert ready(capsys) == "ready"  # resumed: two of three answer again


def test_it_names_the_queue_redis_when_it_is_down(cluster, capsys) -> None:
    queue = cluster["queue"][0]
    queue.stop()
    with pytest.raises(CommandError) as err:
        ready(capsys)
    assert str(err.value) == f"not ready: queue Redis 127.0.0.1:{queue.port} does not answer PING"
    queue.start()
    assert ready(capsys) == "ready"


def test_it_never_prints_a_redis_password(cluster, capsys, settings) -> None:
    queue = cluster["queue"][0]
    settings.REDIS_URL = f"redis://:s3cret-pw@127.0.0.1:{queue.port}/0"
    queue.stop()
    with pytest.raises(CommandError) as err:
        ready(capsys)
    assert "s3cret-pw" not in str(err.value)
    assert f"127.0.0.1:{queue.port}" in str(err.value)


def _manage_ready(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "ready", "--timeout", "0.5"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _env(tmp_path: Path, cluster: dict[str, list[RedisNode]], database_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITWARD_", "REDIS_URL"))}
    env.update(
        DATABASE_URL=database_url,
        REDIS_URLS=",".join(n.url for n in cluster["masters"]),
        REDIS_URL=cluster["queue"][0].url,
        GITWARD_VAR_DIR=str(tmp_path / "var"),
    )
    return env


def test_the_exit_code_follows_the_migrations(cluster, tmp_path: Path) -> None:
    """A fresh database is not ready (exit 1, one line on stderr); after migrate it is."""
    env = _env(tmp_path, cluster, f"sqlite:///{tmp_path / 'fresh.sqlite3'}")
    before = _manage_ready(env)
    assert before.returncode == 1
    lines = before.stderr.strip().splitlines()
    assert len(lines) == 1, before.stderr
    assert "migrations not applied" in lines[0] and "lock masters" not in lines[0]
    migrate = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "migrate", "--noinput", "-v", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert migrate.returncode == 0, migrate.stderr
    after = _manage_ready(env)
    assert (after.returncode, after.stdout.strip(), after.stderr) == (0, "ready", "")


def test_an_unreachable_database_is_one_line(cluster, tmp_path: Path) -> None:
    nobody = free_port()
    env = _env(tmp_path, cluster, f"postgres://gitward@127.0.0.1:{nobody}/gitward")
    done = _manage_ready(env)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("CommandError: not ready: database unreachable")


def test_it_names_missing_configuration(cluster, capsys, settings) -> None:
    settings.REDIS_URLS = []
    settings.REDIS_URL = ""
    with pytest.raises(CommandError) as err:
        ready(capsys)
    assert str(err.value) == (
        "not ready: lock masters: REDIS_URLS is empty; queue Redis: REDIS_URL is empty"
    )


def test_a_bad_timeout_is_refused(cluster) -> None:
    with pytest.raises(CommandError, match="--timeout must be positive"):
        call_command("ready", "--timeout", "0")


def test_a_malformed_queue_url_is_reported_not_a_traceback(cluster, capsys, settings) -> None:
    settings.REDIS_URL = "http://127.0.0.1:1/0"
    with pytest.raises(CommandError, match=r"^not ready: queue Redis 127\.0\.0\.1:1 does not"):
        ready(capsys)
