"""The redis-py internals workers/locks/ relies on, checked against the installed
redis-py (pyproject pins the range these tests were run with). If redis-py changes their
shape, these fail loudly here instead of the Redlock quietly taking its slow path or
failing every call.

* ``ConnectionPool._available_connections``: a list of idle connections, the most recently
  released last, that ``get_connection()`` pops from the end.
* ``Connection._sock``: ``None`` until connected, then the socket (its ``fileno()`` is
  polled, written and read by workers/locks/wire.py), ``None`` again after ``disconnect()``.
* ``redis._parsers._RESP2Parser.parse_error``: an error line to the exception redis-py
  raises for it (``NoScriptError`` for NOSCRIPT), used by workers/locks/wire.py.
"""

from __future__ import annotations

import os
import select
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis._parsers import _RESP2Parser
from redis.exceptions import NoScriptError

from workers.locks.masters import Node, fileno, has_idle_connection
from workers.runtime.redis_server import RedisNode


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisNode]:
    started = RedisNode(Path(tmp_path_factory.mktemp("internals")) / "n").start()
    yield started
    started.kill()


def test_the_installed_redis_py_is_in_the_pinned_range() -> None:
    major, minor = (int(x) for x in redis.__version__.split(".")[:2])
    assert (6, 4) <= (major, minor) < (7, 0), redis.__version__


def test_the_pool_keeps_idle_connections_in_a_list_popped_from_the_end(node: RedisNode) -> None:
    pool = Node(node.url, 0.5).pool
    assert isinstance(pool._available_connections, list)
    assert pool._available_connections == []
    assert not has_idle_connection(pool)
    first = pool.get_connection()
    second = pool.get_connection()
    pool.release(first)
    pool.release(second)
    assert pool._available_connections == [first, second]
    assert has_idle_connection(pool)
    assert pool.get_connection() is second  # the last released is handed out first
    pool.release(second)
    pool.disconnect()


def test_a_connection_has_a_socket_only_while_connected(node: RedisNode) -> None:
    pool = Node(node.url, 0.5).pool
    conn = pool.make_connection()
    assert conn._sock is None
    conn.connect()
    assert isinstance(conn._sock, socket.socket)
    assert fileno(conn) == conn._sock.fileno() > 0
    conn.disconnect()
    assert conn._sock is None
    # An idle pooled connection that was disconnected is not "idle and connected".
    live = pool.get_connection()
    pool.release(live)
    live.disconnect()
    assert not has_idle_connection(pool)


def test_a_reply_can_be_polled_on_the_socket_and_read_with_read_response(node: RedisNode) -> None:
    pool = Node(node.url, 0.5).pool
    conn = pool.get_connection()
    try:
        conn.send_command("PING")
        poller = select.poll()
        poller.register(fileno(conn), select.POLLIN)
        assert poller.poll(2000), "no reply became readable on the polled descriptor"
        assert conn.read_response() in (b"PONG", "PONG")
        # Two pipelined commands on one connection are answered in order (what the release
        # queued behind a pending SET relies on).
        conn.send_command("SET", "internals:k", "v")
        conn.send_command("DEL", "internals:k")
        assert conn.read_response() in (b"OK", "OK", True)
        assert conn.read_response() == 1
    finally:
        pool.release(conn)
        pool.disconnect()


def test_the_resp2_parser_maps_an_error_line_to_redis_py_exceptions() -> None:
    # workers/locks/wire.py reads a script's reply itself and lets redis-py name the error.
    assert isinstance(_RESP2Parser.parse_error("NOSCRIPT No matching script."), NoScriptError)
    busy = _RESP2Parser.parse_error("BUSY Redis is busy running a script.")
    assert isinstance(busy, redis.ResponseError) and "busy" in str(busy).lower()
    other = _RESP2Parser.parse_error("ERR something")
    assert type(other) is redis.ResponseError and str(other) == "something"


def test_a_pooled_connection_can_be_written_and_read_on_its_descriptor(node: RedisNode) -> None:
    # The wire bypasses Connection.send_command/read_response on the socket redis-py opened:
    # both must keep working on that connection afterwards (its parser buffer untouched).
    pool = Node(node.url, 0.5).pool
    conn = pool.get_connection()
    try:
        fd = fileno(conn)
        os.write(fd, b"*3\r\n$4\r\nEVAL\r\n$8\r\nreturn 7\r\n$1\r\n0\r\n")
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        assert poller.poll(2000)
        assert os.read(fd, 4096) == b":7\r\n"
        conn.send_command("PING")
        assert conn.read_response() in (b"PONG", "PONG")
    finally:
        pool.release(conn)
        pool.disconnect()
