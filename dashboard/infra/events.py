"""Live events: the only place that names channel groups and event types.

Events are published **after commit** through ``publish_event``, which checks the type
is known and the payload is JSON-safe. This module knows Channels and JSON and nothing
of the domain: callers build the payload (``dashboard.repositories.lifecycle`` the repository
state, ``dashboard.locks.leases`` the lock rows) and this module delivers what it is given.
Each web process's feeds (``dashboard.live.fanout``) coalesce bursts per group.
Publishing never fails the caller: if the channel layer is down the live view misses an
event, the job does not.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Coroutine
from contextvars import ContextVar, Token
from typing import Any

import redis
from channels.layers import get_channel_layer
from channels_redis.core import RedisChannelLayer
from django.conf import settings
from django.db import transaction

from dashboard.infra import activity_feed, queues

log = logging.getLogger(__name__)

#: Operators' view (locks, queues, workers, DLQ): needs ``dashboard.view_jobrun``.
OPS_GROUP = "live.ops"
#: The Rollouts pages: only ``rollout.*`` events (also sent to ``OPS_GROUP``), so a
#: flood of job and lock events never reaches them. Needs ``dashboard.view_jobrun``.
ROLLOUTS_GROUP = "live.rollouts"
#: The repository list (any logged-in user, like the list itself): only the events that
#: change a row (``REPO_LIST_TYPES``).
REPOS_GROUP = "live.repos"
REPO_LIST_TYPES = frozenset({"repo.changed", "job.progress"})

EVENT_TYPES = frozenset(
    {
        "lock.acquired",
        "lock.extended",
        "lock.released",
        "lock.lost",
        "job.queued",
        "job.started",
        "job.progress",
        "job.succeeded",
        "job.failed",
        "job.dead",
        "job.deferred",
        "worker.heartbeat",
        "fetch.changed",
        "dlq.changed",
        "action.progress",
        "repo.changed",
        "rollout.changed",
        "audit.recorded",
    }
)


def repo_group(repo_id: int) -> str:
    """Watchers of one repository's page (any logged-in user)."""
    return f"live.repo.{int(repo_id)}"


def user_group(user_id: int) -> str:
    """All sockets of one user: closed together when the user logs out."""
    return f"live.user.{int(user_id)}"


def close_user_sockets(user_id: int) -> None:
    # If the layer is down the socket lives until its next reconnect check.
    send_to_groups([user_group(user_id)], {"type": "session.ended"}, what="session.ended")


def coalesce_key(event: dict[str, Any]) -> str:
    """Events with the same key replace each other within one flush window: the client
    only needs the newest state of each lock, run, repository or worker."""
    kind = str(event["type"])
    family = kind.split(".", 1)[0]
    for field in ("key", "run", "repo", "worker", "action", "entry"):
        if field in event:
            return f"{family}:{field}:{event[field]}"
    return kind


def publish_event(kind: str, payload: dict[str, Any], *, repo_id: int | None = None) -> None:
    """Send ``{type: kind, at, ...payload}`` to operators (and to the repository's
    watchers) once the current transaction commits (at once outside one); events worth
    a line in the overview's feed are kept there too (``dashboard.infra.activity_feed``)."""
    if kind not in EVENT_TYPES:
        raise ValueError(f"unknown live event type {kind!r}")
    event = {"type": kind, "at": round(time.time(), 3), **payload}
    json.dumps(event)  # JSON-safe, or TypeError now rather than in the consumer
    message = {"type": "live.event", "event": event}

    def send() -> None:
        PUBLISHED.add()  # drops this process's cached snapshot (dashboard.live.snapshots)
        OWN_EVENTS.record(_actor())
        groups = [OPS_GROUP]
        if kind.startswith("rollout."):
            groups.append(ROLLOUTS_GROUP)
        if kind in REPO_LIST_TYPES:
            groups.append(REPOS_GROUP)
        if repo_id is not None:
            groups.append(repo_group(repo_id))
        send_to_groups(groups, message, what=kind)
        activity_feed.record(event)

    # Outside a transaction the event goes at once without asking the database:
    # ``on_commit`` would open a connection only to read its autocommit flag, and the
    # lease observers publish from the heartbeat's threads (``dashboard.locks.leases``),
    # which would then open and close one per extension. No race: the flag is this
    # thread's connection's own state.
    if transaction.get_connection().in_atomic_block:
        transaction.on_commit(send)
    else:
        send()


# ---------------------------------------------------------------------------- delivery


class _Dropped:
    """Events not delivered because the channel layer (the queue server) was down."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count = 0

    def add(self, n: int = 1) -> None:
        with self.lock:
            self.count += n


DROPPED = _Dropped()
#: Events this process published (committed) since start: a change counter.
PUBLISHED = _Dropped()

#: The request being served on this thread (``EventActorMiddleware``): whose action an
#: event published now is.
_REQUEST: ContextVar[Any] = ContextVar("gitward_live_request", default=None)


def serving_request(request: Any) -> Token[Any]:
    """Mark ``request`` as the one this context serves (reset with the token after)."""
    return _REQUEST.set(request)


def served_request(token: Token[Any]) -> None:
    _REQUEST.reset(token)


def _actor() -> int | None:
    """The id of the logged-in user whose request publishes now, else None (a
    background thread, an anonymous request: nobody in particular)."""
    request = _REQUEST.get()
    user = getattr(request, "user", None) if request is not None else None
    if user is None or not user.is_authenticated:
        return None
    return int(user.pk)


class _OwnEvents:
    """When this process last published an event for each user (their own action) and
    for nobody in particular: so that a page of a user may be drawn from a copy built
    before somebody else's action, never before their own (``snapshots.shared_snapshot``).
    Wall-clock times, compared with the copies' build start times. Entries older than
    ``KEEP`` seconds are dropped once there are more than ``LIMIT`` (a copy is never
    served that old)."""

    KEEP = 120.0
    LIMIT = 1024

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_user: dict[int, float] = {}
        self.anyone = 0.0

    def record(self, user_id: int | None) -> None:
        now = time.time()
        with self.lock:
            if user_id is None:
                self.anyone = now
                return
            self.by_user[user_id] = now
            if len(self.by_user) > self.LIMIT:
                cutoff = now - self.KEEP
                self.by_user = {u: t for u, t in self.by_user.items() if t >= cutoff}

    def last_for(self, user_id: int | None) -> float:
        """The latest event published here that ``user_id``'s page must show: their own
        or nobody's in particular (for no user: any event at all)."""
        with self.lock:
            if user_id is None:
                return max([self.anyone, *self.by_user.values()])
            return max(self.anyone, self.by_user.get(user_id, 0.0))


OWN_EVENTS = _OwnEvents()


def published_count() -> int:
    """How many events this process has published: changes when it changed something."""
    return PUBLISHED.count


def dropped_events() -> int:
    """Live events this process dropped (queue server down or too slow) since start."""
    return DROPPED.count


class _SendLoop:
    """One event loop per process, in a daemon thread, that every send runs on.

    ``async_to_sync`` made a new loop per event, and channels-redis keeps its connections
    per loop, so each event paid a loop, a thread hop, a TCP connect and a close: five
    times per analyze job (started, lock acquired, progress, lock released, succeeded).
    Here the loop and its connections are made once per process.

    Race (fork): a forked child (an RQ work horse) has no copy of the loop's thread, and
    the lock may have been held by another thread at the fork. ``os.register_at_fork``
    forgets both in the child, which makes its own loop on its first send; the parent's
    connections it inherited (keyed by the parent's loop in channels-redis) are never
    used by it. A send that overruns is cancelled by its own ``asyncio.timeout`` on the
    loop; the caller waits at most a second longer than that.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None

    def forget(self) -> None:
        self._lock = threading.Lock()
        self._loop = None

    def _running(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="gitward-live", daemon=True).start()
                self._loop = loop
            return self._loop

    def run(self, deliver: Callable[[], Coroutine[Any, Any, None]], *, timeout: float) -> None:
        future = asyncio.run_coroutine_threadsafe(deliver(), self._running())
        try:
            future.result(timeout + 1.0)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise


_LOOP = _SendLoop()
os.register_at_fork(after_in_child=_LOOP.forget)


def send_to_groups(groups: list[str], message: dict[str, Any], *, what: str) -> bool:
    """Deliver ``message`` to ``groups``, bounded by ``GITWARD_QUEUE_TIMEOUT`` per group;
    never raises. While the queue server is known down (``queues.CIRCUIT``) nothing is
    tried. A dropped event only costs the live view a refresh (clients re-ask for a
    snapshot on reconnect); it is counted in ``dropped_events()``."""
    layer = get_channel_layer()
    if layer is None:
        return True
    try:
        queues.CIRCUIT.check()
    except queues.QueueUnavailable:
        DROPPED.add()
        return False
    timeout = float(settings.QUEUE_TIMEOUT)

    async def deliver() -> None:
        async with asyncio.timeout(timeout * len(groups)):  # no extra task per send
            for group in groups:
                await layer.group_send(group, message)

    try:
        _LOOP.run(deliver, timeout=timeout * len(groups))
    except Exception as exc:  # the live view is best effort; the job goes on
        DROPPED.add()
        if isinstance(exc, OSError | TimeoutError | redis.RedisError):
            queues.CIRCUIT.trip(exc)
        log.debug("live event %s not sent: %s", what, exc)
        return False
    return True


#: While the channel layer cannot be reached, a consumer's receive loop retries this often.
RECEIVE_RETRY_SECONDS = 1.0
#: A lost or refused connection (not a timeout or cancellation of a healthy receive).
_LAYER_FAILURES = (OSError, redis.ConnectionError)


class ResilientChannelLayer(RedisChannelLayer):
    """channels-redis on the queue server, made to survive losing it.

    * ``receive`` (every consumer's loop) waits and retries instead of raising, so a
      socket stays open through an outage (it gets snapshots, not events);
    * ``group_add``/``group_discard`` are bounded by ``GITWARD_QUEUE_TIMEOUT`` and raise
      ``TimeoutError`` rather than hang on a stalled server (consumers catch it and join
      again later: a server restarted empty has forgotten every membership anyway).
    """

    async def receive(self, channel: str) -> Any:
        while True:
            try:
                return await super().receive(channel)
            except _LAYER_FAILURES as exc:
                log.debug("channel layer receive failed (retrying): %s", exc)
                await asyncio.sleep(RECEIVE_RETRY_SECONDS)

    async def group_add(self, group: str, channel: str) -> None:
        await asyncio.wait_for(super().group_add(group, channel), float(settings.QUEUE_TIMEOUT))

    async def group_discard(self, group: str, channel: str) -> None:
        await asyncio.wait_for(super().group_discard(group, channel), float(settings.QUEUE_TIMEOUT))
