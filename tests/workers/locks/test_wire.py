"""The bytes of a lock-script round (workers/locks/wire.py) and the connections a round
keeps per master (``Node.idle``, checked by one poll() in ``masters.stale``), against real
redis-server processes and socket pairs."""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from redis.connection import Connection
from redis.exceptions import NoScriptError

from workers.locks import LockNotAcquired, Redlock, wire
from workers.locks.masters import Node, fileno, stale
from workers.runtime.redis_server import RedisNode


def eventually(predicate: Callable[[], object], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return bool(predicate())


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisNode]:
    started = RedisNode(Path(tmp_path_factory.mktemp("wire")) / "n").start()
    yield started
    started.kill()


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    a.setblocking(False)
    yield a, b
    a.close()
    b.close()


def test_pack_writes_what_redis_py_would() -> None:
    args = ("EVALSHA", "ab" * 20, 2, "locks:a", "locks:é", '{"nonce":"x",}', 30000, b"\x00\r\n")
    assert wire.pack(*args) == b"".join(Connection().pack_command(*args))


def test_a_reply_is_read_across_partial_reads(pair: tuple[socket.socket, socket.socket]) -> None:
    ours, master = pair
    fd = ours.fileno()
    assert wire.read(fd, b"") == (b"", None, False)  # nothing there yet: not an error
    master.sendall(b":-1")
    buf, reply, complete = wire.read(fd, b"")
    assert (buf, reply, complete) == (b":-1", None, False)
    master.sendall(b"2\r\n")
    assert wire.read(fd, buf) == (b"", -12, True)


def test_an_error_line_becomes_the_exception_redis_py_raises(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    ours, master = pair
    master.sendall(b"-NOSCRIPT No matching script. Please use EVAL.\r\n")
    _, reply, complete = wire.read(ours.fileno(), b"")
    assert complete and isinstance(reply, NoScriptError)


@pytest.mark.parametrize(
    "sent",
    [b":1\r\n:1\r\n", b"+OK\r\n", b"$1\r\nx\r\n", b"*0\r\n"],
    ids=["two replies", "status", "bulk", "array"],
)
def test_a_framing_it_cannot_trust_is_an_error(
    pair: tuple[socket.socket, socket.socket], sent: bytes
) -> None:
    ours, master = pair
    master.sendall(sent)
    with pytest.raises(wire.WireError):
        wire.read(ours.fileno(), b"")


def test_a_closed_socket_is_a_connection_error(pair: tuple[socket.socket, socket.socket]) -> None:
    ours, master = pair
    master.close()
    with pytest.raises(redis.ConnectionError):
        wire.read(ours.fileno(), b"")


def read_reply(fd: int) -> object:
    """Wait (bounded) for one whole reply on ``fd``."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    buf = b""
    while True:
        assert poller.poll(5000), "no reply within 5 s"
        buf, reply, complete = wire.read(fd, buf)
        if complete:
            return reply


def test_a_script_round_trip_on_a_real_master(node: RedisNode) -> None:
    conn = Node(node.url, 0.5).pool.get_connection()
    try:
        fd = fileno(conn)
        wire.write(conn, fd, wire.pack("EVAL", "return tonumber(ARGV[1]) + 1", 0, 41))
        assert read_reply(fd) == 42
        wire.write(conn, fd, wire.pack("EVALSHA", "0" * 40, 0))
        assert isinstance(read_reply(fd), NoScriptError)
    finally:
        conn.disconnect()


def test_stale_names_the_connections_their_master_closed(node: RedisNode) -> None:
    pool = Node(node.url, 0.5).pool
    conns = [pool.get_connection() for _ in range(3)]
    try:
        assert stale(conns) == set()
        # The master drops one of them (as a restart or its idle timeout would).
        host, port = conns[1]._sock.getsockname()[:2]
        assert node.client().client_kill(f"{host}:{port}")
        assert eventually(lambda: stale(conns) == {1})
        conns[2].disconnect()  # closed on our side meanwhile
        assert stale(conns) == {1, 2}
    finally:
        for c in conns:
            c.disconnect()


def test_a_round_replaces_kept_connections_of_a_restarted_master_without_an_error(
    tmp_path: Path,
) -> None:
    masters = [RedisNode(tmp_path / f"m{i}").start() for i in range(3)]
    rl = Redlock([m.url for m in masters], retry_count=0, node_timeout=2.0)
    try:
        # Long node timeouts and TTLs: neither is the point, and a first round on a loaded
        # machine (new connections, scripts loaded) was seen to take 4 s of a 5 s TTL.
        rl.acquire("locks:wire", ttl=30.0).release()
        assert all(node.idle for node in rl.nodes), "every master's connection is kept"
        masters[0].restart(empty=True)  # its kept socket is now closed by the server
        assert eventually(lambda: stale(rl.nodes[0].idle) == {0})
        lock = rl.acquire("locks:wire", ttl=30.0)
        lock.release()
        first = rl.stats()["nodes"][rl.nodes[0].name]
        # Without the check the round would write on the dead socket: an error vote.
        assert first["errors"] == 0, first
    finally:
        rl.close()
        for m in masters:
            m.kill()


def test_a_tls_master_is_never_written_raw() -> None:
    assert Node("redis://127.0.0.1:1/0", 0.5).raw
    assert Node("unix:///tmp/nowhere.sock", 0.5).raw
    assert not Node("rediss://127.0.0.1:1/0", 0.5).raw  # TLS records, not RESP, on the socket


def test_rounds_through_redis_py_work_as_the_raw_ones(tmp_path: Path) -> None:
    # The path a TLS master takes (send_packed_command / read_response), on plain masters:
    # acquire, refusal, extend, release, and NOSCRIPT after a restart answered by EVAL.
    masters = [RedisNode(tmp_path / f"m{i}").start() for i in range(3)]
    rl = Redlock([m.url for m in masters], retry_count=0, node_timeout=2.0)
    other = Redlock([m.url for m in masters], retry_count=0, node_timeout=2.0)
    for node in rl.nodes:
        node.raw = False
    try:
        lock = rl.acquire("locks:tls", ttl=30.0)
        with pytest.raises(LockNotAcquired):
            other.acquire("locks:tls", ttl=30.0)
        lock.extend()
        lock.release()
        masters[1].restart(empty=True)  # stale connection and no scripts on master 1
        lock = rl.acquire("locks:tls", ttl=30.0)
        assert eventually(lambda: (rl.inspect("locks:tls") or {}).get("agreeing") == 3)
        lock.release()
        assert rl.inspect("locks:tls") is None
    finally:
        rl.close()
        other.close()
        for m in masters:
            m.kill()
