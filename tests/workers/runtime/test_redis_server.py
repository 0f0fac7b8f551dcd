"""workers.runtime.redis_server: real ``redis-server`` processes started, crashed, stopped, paused,
resumed and restarted, only ever by their own pid; ports, data and the AOF."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.support.mirror_writers import wait_for
from tests.support.sysproc import proc_state
from workers.runtime.redis_server import RedisNode, find_redis_server, free_port

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def nodes() -> Iterator[list[RedisNode]]:
    """Nodes a test starts; killed (by their own pid) at the end."""
    started: list[RedisNode] = []
    yield started
    for node in started:
        node.kill()


def started(nodes: list[RedisNode], node: RedisNode) -> RedisNode:
    nodes.append(node)
    return node.start()


def test_free_port_is_bindable_and_a_node_listens_on_the_port_it_was_given(
    tmp_path: Path, nodes: list[RedisNode]
) -> None:
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # free a moment ago, as promised
    node = started(nodes, RedisNode(tmp_path / "n", port=port))
    assert node.url == f"redis://127.0.0.1:{port}/0"
    info = node.client().info("server")
    assert info["tcp_port"] == port and info["process_id"] == node.pid
    assert node.alive() and (tmp_path / "n" / "redis.log").exists()
    assert find_redis_server() and Path(find_redis_server()).exists()


def test_two_nodes_get_different_ports_and_separate_data(
    tmp_path: Path, nodes: list[RedisNode]
) -> None:
    a = started(nodes, RedisNode(tmp_path / "a"))
    b = started(nodes, RedisNode(tmp_path / "b"))
    assert a.port != b.port and a.pid != b.pid
    a.client().set("k", "a")
    assert b.client().get("k") is None


def test_a_taken_port_fails_at_start_up_with_its_number(
    tmp_path: Path, nodes: list[RedisNode]
) -> None:
    first = started(nodes, RedisNode(tmp_path / "a"))
    clash = RedisNode(tmp_path / "b", port=first.port)
    nodes.append(clash)
    with pytest.raises(RuntimeError, match=f"port {first.port}"):
        clash.start()
    assert not clash.alive()
    assert first.client().ping()  # the other server is untouched


def test_kill_is_a_crash_and_restart_comes_back_empty_on_the_same_port(
    tmp_path: Path, nodes: list[RedisNode]
) -> None:
    node = started(nodes, RedisNode(tmp_path / "n", persistent=True))
    port, pid = node.port, node.pid
    node.client().set("k", "v")
    node.kill()
    assert not node.alive() and proc_state(pid) == "gone"  # type: ignore[arg-type]
    with pytest.raises(redis.ConnectionError):
        node.client(socket_connect_timeout=1).ping()
    node.restart()
    assert node.port == port and node.pid != pid
    assert node.client().get("k") is None  # the AOF was dropped
    node.kill()
    node.kill()  # killing a dead node is a no-op


def test_a_persistent_node_stopped_gracefully_keeps_its_data_across_a_restart(
    tmp_path: Path, nodes: list[RedisNode]
) -> None:
    node = started(nodes, RedisNode(tmp_path / "n", persistent=True))
    node.client().set("k", "v")
    node.stop()
    assert not node.alive()
    node.restart(empty=False)
    assert node.client().get("k") == b"v"
    plain = started(nodes, RedisNode(tmp_path / "p"))
    assert plain.client().config_get("appendonly") == {"appendonly": "no"}


def test_pause_stalls_the_server_with_its_socket_open_and_resume_brings_it_back(
    tmp_path: Path, nodes: list[RedisNode]
) -> None:
    node = started(nodes, RedisNode(tmp_path / "n"))
    node.pause()
    wait_for("the server to stop", lambda: proc_state(node.pid) == "T")  # type: ignore[arg-type]
    with pytest.raises(redis.TimeoutError):  # connected (the kernel accepts), no answer
        node.client(socket_timeout=0.3, socket_connect_timeout=2).ping()
    assert node.alive()
    node.resume()
    assert node.client(socket_timeout=10).ping()


def test_a_paused_node_can_still_be_killed_and_stopped(
    tmp_path: Path, nodes: list[RedisNode]
) -> None:
    a = started(nodes, RedisNode(tmp_path / "a"))
    b = started(nodes, RedisNode(tmp_path / "b"))
    a.pause()
    b.pause()
    a.kill()
    b.stop()  # SIGTERM would wait forever on a stopped process without the SIGCONT
    assert not a.alive() and not b.alive()


def test_the_debug_command_is_enabled_only_when_asked(
    tmp_path: Path, nodes: list[RedisNode]
) -> None:
    plain = started(nodes, RedisNode(tmp_path / "p"))
    with pytest.raises(redis.ResponseError):
        plain.client().execute_command("DEBUG", "SLEEP", "0")
    debug = started(nodes, RedisNode(tmp_path / "d", debug_command=True))
    assert debug.client().execute_command("DEBUG", "SLEEP", "0")


def test_a_node_never_started_has_no_pid_and_signals_nothing(tmp_path: Path) -> None:
    node = RedisNode(tmp_path / "n")
    assert node.pid is None and not node.alive()
    node.pause()
    node.resume()
    node.stop()
    node.kill()


def test_a_node_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    """``manage.py up`` SIGKILLed must not leave its embedded nodes holding their ports."""
    starter = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time\n"
         "from pathlib import Path\n"
         "from workers.runtime.redis_server import RedisNode\n"
         f"node = RedisNode(Path({str(tmp_path)!r}) / 'n').start()\n"
         "print(node.proc.pid, node.port, flush=True)\n"
         "time.sleep(300)\n"],
        stdout=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    assert starter.stdout is not None
    pid, port = map(int, starter.stdout.readline().split())
    assert redis.Redis(port=port).ping()
    starter.kill()
    starter.wait()
    deadline = time.monotonic() + 20
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists(), "the node outlived the process that started it"
