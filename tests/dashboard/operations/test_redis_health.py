"""dashboard.operations.redis_health: the health of the configured Redis masters, pinged for real
(three live redis-server processes, and a port where nothing listens)."""

from __future__ import annotations

import socket

from dashboard.operations import redis_health as health
from dashboard.operations.redis_health import quorum, safe_url
from workers.runtime.redis_server import RedisNode


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_every_master_is_pinged_and_a_dead_one_is_down(
    redis_nodes: list[RedisNode], settings
) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    settings.REDIS_URLS = [redis_nodes[0].url, redis_nodes[1].url, dead]
    nodes = health.redis_nodes()
    assert [n["up"] for n in nodes] == [True, True, False]
    assert nodes[0]["latency_ms"] >= 0 and nodes[2]["error"] == "ConnectionError"
    assert quorum(nodes) == {"up": 2, "total": 3, "needed": 2, "state": "at_risk"}


def test_quorum_states() -> None:
    up, down = {"up": True}, {"up": False}
    assert quorum([up, up, up])["state"] == "ok"
    assert quorum([up, down, down])["state"] == "lost"
    assert quorum([up])["state"] == "ok"


def test_urls_are_shown_without_their_password() -> None:
    assert safe_url("redis://:s3cret@db.internal:6379/0") == "redis://***@db.internal:6379/0"
    assert safe_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"


def test_a_ping_is_one_round_trip_on_a_kept_connection_and_a_restarted_master_is_back(
    redis_nodes: list[RedisNode], settings
) -> None:
    settings.REDIS_URLS = [redis_nodes[1].url]
    health.redis_nodes()
    clients_before = redis_nodes[1].client().info("stats")["total_connections_received"]
    for _ in range(3):
        assert health.redis_nodes()[0]["up"] is True
    # Three more pings, no new connection (a fresh client each time connected anew).
    stats = redis_nodes[1].client().info("stats")
    assert stats["total_connections_received"] == clients_before + 1  # this info client
    redis_nodes[1].kill()
    assert health.redis_nodes()[0]["up"] is False
    redis_nodes[1].restart()
    assert health.redis_nodes()[0]["up"] is True  # the kept client reconnects
