"""``REDIS_URL`` in its Sentinel form: parsing, and a real master + replica + Sentinel.

The master is SIGKILLed; the Sentinel promotes the replica (down-after 1 s), and the
test checks that queue writes, RQ enqueues and the channel layer then reach the promoted
replica through the same ``REDIS_URL``, without a restart.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from dashboard.infra import queues
from dashboard.operations.readiness import queue_check
from dashboard.settings import channel_layer_host
from tests.dashboard.test_settings import manage
from workers.runtime.redis_server import RedisNode, find_redis_server, free_port
from workers.runtime.redis_urls import SentinelTarget, parse_sentinel_url

SERVICE = "gwqueue"


# ---------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "redis+sentinel://10.0.0.1:26379,10.0.0.2:26380/mymaster/2",
            SentinelTarget((("10.0.0.1", 26379), ("10.0.0.2", 26380)), "mymaster", 2),
        ),
        (
            "redis+sentinel://s1/mymaster",
            SentinelTarget((("s1", 26379),), "mymaster", 0),
        ),
        (
            "redis+sentinel://:p%40ss@s1:1,s2:2/m/0",
            SentinelTarget((("s1", 1), ("s2", 2)), "m", 0, None, "p@ss"),
        ),
        (
            "redis+sentinel://app:secret@s1:1/m",
            SentinelTarget((("s1", 1),), "m", 0, "app", "secret"),
        ),
    ],
)
def test_it_parses_the_sentinel_form(url: str, expected: SentinelTarget) -> None:
    assert parse_sentinel_url(url) == expected


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("redis+sentinel:///mymaster", "at least one Sentinel"),
        ("redis+sentinel://s1:26379", "master group name"),
        ("redis+sentinel://s1:26379/", "master group name"),
        ("redis+sentinel://s1:26379/m/x", "db number"),
        ("redis+sentinel://s1:26379/m/0/extra", "db number"),
        ("redis+sentinel://s1:notaport/m", "bad Sentinel port"),
        ("redis+sentinel://s1,,s2/m", "empty Sentinel host"),
        ("redis+sentinel://s1/m?db=1", "no query"),
    ],
)
def test_it_refuses_bad_sentinel_forms(url: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_sentinel_url(url)


def test_a_bad_redis_url_stops_start_up_with_one_line(tmp_path: Path) -> None:
    result = manage(tmp_path, "check", REDIS_URL="redis+sentinel://s1:26379")
    assert result.returncode == 1
    assert "REDIS_URL must be redis+sentinel://" in result.stderr
    assert "master group name" in result.stderr
    assert "Traceback" not in result.stderr
    plain = manage(tmp_path, "check", REDIS_URL="http://example.org/")
    assert plain.returncode == 1 and "REDIS_URL must be" in plain.stderr


# ---------------------------------------------------------------------------- real Sentinel


def _wait(what: str, condition: Callable[[], object], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if condition():
                return
        except redis.RedisError:
            pass
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


class _Process:
    def __init__(self, args: list[str]) -> None:
        self.proc = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def sentinel_group(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A master, a replica of it, and one Sentinel monitoring them (quorum 1)."""
    master = RedisNode(tmp_path / "master").start()
    # RedisNode checks that the server answering on its port is its own process: a port
    # that was free a moment ago can be taken by another test's server meanwhile, and a
    # master answering in the replica's place has no master_link_status (CI saw that).
    replica = RedisNode(tmp_path / "replica").start()
    replica_port = replica.port
    replica_client = replica.client(socket_timeout=1)
    replica_client.replicaof("127.0.0.1", master.port)
    sentinel_port = free_port()
    conf = tmp_path / "sentinel.conf"
    conf.write_text(
        f"port {sentinel_port}\nbind 127.0.0.1\ndir {tmp_path}\n"
        f"sentinel monitor {SERVICE} 127.0.0.1 {master.port} 1\n"
        f"sentinel down-after-milliseconds {SERVICE} 1000\n"
        f"sentinel failover-timeout {SERVICE} 5000\n"
    )
    sentinel = _Process([find_redis_server(), str(conf), "--sentinel"])
    sentinel_client = redis.Redis(port=sentinel_port, socket_timeout=1)
    try:
        _wait(
            "replica in sync",
            lambda: replica_client.info("replication").get("master_link_status") == "up",
        )
        _wait(
            "our Sentinel answers",
            lambda: sentinel_client.info("server").get("process_id") == sentinel.proc.pid,
        )
        _wait(
            "Sentinel sees the replica",
            lambda: sentinel_client.execute_command("SENTINEL", "REPLICAS", SERVICE),
        )
        yield {
            "url": f"redis+sentinel://127.0.0.1:{sentinel_port}/{SERVICE}/0",
            "master": master.client(socket_timeout=1),
            "master_node": master,
            "master_port": master.port,
            "replica": replica_client,
            "replica_port": replica_port,
            "sentinel": sentinel_client,
        }
    finally:
        sentinel.kill()
        replica.kill()
        master.kill()


def _point_at(settings: Any, url: str) -> None:
    settings.QUEUE_TIMEOUT = 0.5
    settings.REDIS_URL = url
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "dashboard.infra.events.ResilientChannelLayer",
            "CONFIG": {"hosts": [channel_layer_host(url, 0.5)]},
        }
    }
    queues.CIRCUIT.reset()


def _channel_round_trip() -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        layer = get_channel_layer()
        assert layer is not None
        name = await layer.new_channel()
        await layer.group_add("sentinel-test", name)
        await layer.group_send("sentinel-test", {"type": "ping", "n": 1})
        return await layer.receive(name)  # type: ignore[no-any-return]

    return async_to_sync(go)()


@pytest.mark.django_db
@pytest.mark.slow  # a master, a replica and a Sentinel, through a real failover
def test_queues_and_the_channel_layer_follow_the_master_through_a_failover(
    settings: Any, sentinel_group: dict[str, Any]
) -> None:
    _point_at(settings, sentinel_group["url"])
    assert queues.safe_queue_url() == sentinel_group["url"]

    # Discovery: the first write goes to the master the Sentinel names.
    queues.connection().set("gw:before", "1")
    assert sentinel_group["master"].get("gw:before") == b"1"
    assert queues.enqueue_unique(queues.queue("sentinel"), "builtins.len", "ab", job_id="j1")
    assert sentinel_group["master"].llen("rq:queue:sentinel") == 1
    assert _channel_round_trip() == {"type": "ping", "n": 1}
    assert _queue_problem(sentinel_group["url"], timeout=1.0) is None
    assert queues.queue_server()["ok"] is True
    assert _queue_problem(sentinel_group["url"], timeout=1.0) is None  # manage.py ready

    # Redis replicates asynchronously: a write the replica has not acknowledged is lost
    # in a failover (that is Redis's contract, not ours). WAIT until it has j1, so the
    # count below checks what we claim: the queue follows the master with what it held.
    assert sentinel_group["master"].execute_command("WAIT", 1, 5000) == 1

    # The master dies (SIGKILL); the Sentinel notices after down-after-milliseconds and
    # promotes the replica.
    sentinel_group["master_node"].kill()
    _wait(
        "the Sentinel to name the replica",
        lambda: (
            int(
                sentinel_group["sentinel"].execute_command(
                    "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE
                )[1]
            )
            == sentinel_group["replica_port"]
        ),
    )
    _wait(
        "the replica to be promoted",
        lambda: sentinel_group["replica"].info("replication")["role"] == "master",
    )

    def write_lands() -> bool:
        try:
            queues.connection().set("gw:after", "2")
        except queues.QueueUnavailable:  # the old connection's last word; it reconnects
            return False
        return True

    _wait("a queue write after the failover", write_lands)
    assert sentinel_group["replica"].get("gw:after") == b"2"
    assert queues.enqueue_unique(queues.queue("sentinel"), "builtins.len", "cd", job_id="j2")
    assert sentinel_group["replica"].llen("rq:queue:sentinel") == 2  # j1 replicated, j2 new
    assert _channel_round_trip() == {"type": "ping", "n": 1}
    assert _queue_problem(sentinel_group["url"], timeout=1.0) is None


def test_ready_names_the_sentinels_when_none_answers(tmp_path: Path) -> None:
    url = f"redis+sentinel://127.0.0.1:{free_port()}/{SERVICE}/0"
    problem = _queue_problem(url, timeout=0.3)
    assert problem is not None and "127.0.0.1:" in problem and "PING" in problem


def _queue_problem(url: str, *, timeout: float) -> str | None:
    """The readiness check of the queue server (``/readyz`` and ``manage.py ready``):
    None when it answers, else what failed."""
    check = queue_check(url, timeout=timeout)
    return None if check.ok else check.detail
