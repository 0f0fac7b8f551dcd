"""The wire format of one lock-script call: a RESP command packed once per round, written
straight to each master's socket, and its one-line reply read back from the socket.

Every lock script (``workers.locks.scripts``) answers with an integer (``:1``) or, when the
master refuses to run it, an error line (``-NOSCRIPT …``, ``-BUSY …``, ``-READONLY …``). A
round writes the same bytes to every master (the scripts' SHA1 is computed from the source,
so it is the same everywhere) and reads each reply with one ``os.read`` once poll() says it
is there, instead of going through redis-py's per-connection packing and its
poll-before-every-send/recv socket timeouts. That is what makes a three-master round cost
little more than one redis-py call.

redis-py internals used (pinned in tests/workers/locks/test_redis_internals.py):
``Connection._sock``
(via ``masters.fileno``) and ``_RESP2Parser.parse_error`` (error line → the exception class
redis-py itself would raise, e.g. ``NoScriptError``).

Plain TCP and unix sockets only: a TLS master (``rediss://``, ``Node.raw`` false) gets the
same packed bytes through redis-py's ``send_packed_command`` and its reply through
``read_response``.

Safety: a connection is only written to by the round that holds it, and only ever carries
one unanswered command there; a reply is complete at its first CRLF. Bytes after it (never
sent by a master for one command) or a reply still partial when its master is given up on
mean the connection's framing can no longer be trusted: the caller closes it, never
returning it to the pool.
"""

from __future__ import annotations

import os
from typing import Any

import redis
from redis._parsers import _RESP2Parser

#: Longest reply line accepted (an error message); anything longer is a broken framing.
MAX_REPLY = 64 * 1024


class WireError(redis.ConnectionError):
    """The connection's framing is broken (a reply we cannot parse, or trailing bytes)."""


def pack(*args: str | int | bytes) -> bytes:
    """One RESP command (array of bulk strings)."""
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        if isinstance(arg, bytes):
            data = arg
        elif isinstance(arg, str):
            data = arg.encode()
        else:
            data = b"%d" % arg
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def write(conn: Any, fd: int, data: bytes) -> None:
    """Write ``data`` on ``conn``: one ``os.write`` (a small command fits the empty send
    buffer of an idle connection), then redis-py's socket (bounded by its timeout) for any
    rest. Raises ``redis.TimeoutError`` / ``redis.ConnectionError`` as redis-py would."""
    try:
        try:
            sent = os.write(fd, data)
        except BlockingIOError:
            sent = 0
        if sent < len(data):
            conn._sock.sendall(data[sent:])
    except TimeoutError as exc:
        raise redis.TimeoutError("Timeout writing to socket") from exc
    except OSError as exc:
        raise redis.ConnectionError(f"Error while writing to socket: {exc}") from exc


def read(fd: int, buf: bytes) -> tuple[bytes, object | None, bool]:
    """Read what arrived on ``fd`` after ``buf`` (the partial reply so far).

    Returns ``(buf, reply, complete)``: while ``complete`` is false, ``buf`` is the partial
    reply to pass in next time. A complete reply is an ``int`` or a redis-py
    ``ResponseError`` instance (returned, not raised). Raises ``redis.ConnectionError`` on
    EOF or a socket error (as redis-py would) and :class:`WireError` on a framing it cannot
    trust.
    """
    try:
        chunk = os.read(fd, 4096)
    except BlockingIOError:
        return buf, None, False  # poll() said readable, but nothing is there yet
    except OSError as exc:
        raise redis.ConnectionError(f"Error while reading from socket: {exc}") from exc
    if not chunk:
        raise redis.ConnectionError("Connection closed by server.")
    buf += chunk
    end = buf.find(b"\r\n")
    if end < 0:
        if len(buf) > MAX_REPLY:
            raise WireError("reply line too long")
        return buf, None, False
    if end + 2 != len(buf):
        raise WireError(f"unexpected bytes after the reply: {buf[end + 2 : end + 34]!r}")
    kind, body = buf[:1], buf[1:end]
    if kind == b":":
        return b"", int(body), True
    if kind == b"-":
        error = _RESP2Parser.parse_error(body.decode("utf-8", errors="replace"))  # type: ignore[no-untyped-call]
        return b"", error, True
    raise WireError(f"unexpected reply {buf[:32]!r}")
