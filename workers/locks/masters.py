"""One master (``Node``, with the connections kept for script rounds), a vote, a pending
reply, a fan-out round, and the redis-py internals the transport relies on.

redis-py internals used (here, and ``Connection._sock`` and the RESP2 parser's error
mapping in ``workers.locks.wire``), checked by tests/workers/locks/test_redis_internals.py against
the pinned redis-py range: ``ConnectionPool._available_connections`` (peeked, never modified) and
``Connection._sock`` (its file descriptor, for poll(), write and read).
"""

from __future__ import annotations

import select
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import redis
from redis.backoff import NoBackoff
from redis.commands.core import Script
from redis.retry import Retry

from workers.locks.scripts import SCRIPTS


class Vote(NamedTuple):
    ok: bool
    reason: str
    result: object


@dataclass
class NodeStats:
    calls: int = 0
    errors: int = 0
    timeouts: int = 0
    latency_total: float = 0.0
    latency_max: float = 0.0


class Pending(NamedTuple):
    """A script sent on ``conn`` whose reply has not been read yet.

    It carries its keys and arguments so whoever reads the reply can answer a NOSCRIPT
    (a restarted master lost its script cache: the script did *not* run) with EVAL of the
    source on the same connection.
    """

    conn: Any  # a redis-py Connection (its I/O methods are untyped)
    script: Script
    sent: float
    node_deadline: float
    fd: int
    keys: tuple[str, ...]
    args: tuple[str | int, ...]

    def resend_as_eval(self) -> None:
        """Answer a NOSCRIPT reply: send the script's source (EVAL) on the same connection."""
        self.conn.send_command("EVAL", self.script.script, len(self.keys), *self.keys, *self.args)


@dataclass
class Round:
    """One fan-out: the votes counted, futures for masters answered off-thread, how many
    said yes, and (``keep_late``) connections whose reply is still outstanding."""

    votes: dict[int, Vote]
    futures: dict[int, Future[Vote]]
    yes: int
    late: dict[int, Pending] = field(default_factory=dict)
    stragglers: Any = None  # transport.Stragglers, settled with the round
    targets: tuple[int, ...] = ()  # the masters asked (all when empty)


class Node:
    """One master: a private client with the per-node timeout, and its scripts."""

    def __init__(self, target: str | redis.Redis, node_timeout: float) -> None:
        if isinstance(target, str):
            base = redis.ConnectionPool.from_url(target)
        else:
            base = target.connection_pool
        kwargs = dict(base.connection_kwargs)
        # Our own pool, so the caller's client keeps its settings. One immediate retry on a
        # dropped connection (a restarted master leaves stale pooled sockets) but never on a
        # timeout: a retry would double the per-node budget. Every script is idempotent for
        # our own nonce, so a re-sent command is harmless.
        kwargs.update(
            socket_timeout=node_timeout,
            socket_connect_timeout=node_timeout,
            retry=Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,)),
            retry_on_error=[],
            retry_on_timeout=False,
        )
        kwargs.pop("decode_responses", None)
        self.pool = redis.ConnectionPool(connection_class=base.connection_class, **kwargs)
        #: Whether script rounds may write and read this master's socket directly
        #: (``workers.locks.wire``): not through TLS, whose socket carries records.
        self.raw = not issubclass(base.connection_class, redis.SSLConnection)
        self.client = redis.Redis(connection_pool=self.pool)
        host = kwargs.get("host", kwargs.get("path", "?"))
        self.name = f"{host}:{kwargs.get('port', '')}/{kwargs.get('db', 0)}"
        self.scripts: dict[str, Script] = {
            name: self.client.register_script(src) for name, src in SCRIPTS.items()
        }
        self.stats = NodeStats()
        #: Connected connections kept out of ``pool`` for script rounds (see ``take_idle``).
        #: Each is clean (no reply outstanding) when pushed; ``list.append``/``pop`` are
        #: atomic, so two threads never get the same one. Checked out of ``pool`` (counted
        #: in use there), so ``pool.disconnect()`` still closes them.
        self.idle: list[Any] = []

    def take_idle(self) -> Any | None:
        """A connection kept by an earlier round, most recently used first, or ``None``."""
        try:
            return self.idle.pop()
        except IndexError:
            return None

    def keep(self, conn: Any) -> None:
        """Keep ``conn`` (its reply read, nothing outstanding) for the next round."""
        self.idle.append(conn)

    def forget_idle(self) -> None:
        """Drop the kept connections without closing them (after a fork: they belong to
        the parent) or after ``pool.disconnect()`` closed them."""
        self.idle = []


# redis-py internals (see the module docstring) --------------------------------------------


def has_idle_connection(pool: redis.ConnectionPool) -> bool:
    """Whether ``pool`` has an idle connection that is already connected.

    Racy by nature (another thread may take it first, and get_connection() then connects
    in the calling thread); that only costs time, bounded by the timeouts.
    """
    idle = getattr(pool, "_available_connections", None)
    if not idle:
        return False
    return getattr(idle[-1], "_sock", None) is not None


def stale(conns: list[Any]) -> set[int]:
    """Indexes into ``conns`` whose socket is readable while no reply is outstanding: the
    master closed it (a restart, a timeout) or sent something unexpected. One poll() for
    all of them; what ``ConnectionPool.get_connection`` checks per connection."""
    poller = select.poll()
    by_fd: dict[int, int] = {}
    gone: set[int] = set()
    for n, conn in enumerate(conns):
        if getattr(conn, "_sock", None) is None:  # closed meanwhile (Redlock.close)
            gone.add(n)
            continue
        fd = fileno(conn)
        by_fd[fd] = n
        poller.register(fd, select.POLLIN)
    return gone | {by_fd[fd] for fd, _event in poller.poll(0)}


def fileno(conn: Any) -> int:
    """The socket descriptor of a connected redis-py connection."""
    return int(conn._sock.fileno())


CANCELLED = Vote(False, "cancelled", None)


def done_future(vote: Vote) -> Future[Vote]:
    fut: Future[Vote] = Future()
    fut.set_result(vote)
    return fut


def judge_any(result: object) -> Vote:
    return Vote(True, "ok", result)


def releaser(keys: tuple[str, ...], prefix: str) -> Callable[[Node], object]:
    def call(node: Node) -> object:
        return node.scripts["release"](keys=keys, args=[prefix])

    return call
