"""Websocket consumers: authenticate, check permission, join groups, forward events.

Each client gets a snapshot on connect (and whenever it asks, e.g. after a reconnect),
then events, coalesced per group and web process and flushed every
``fanout.FLUSH_SECONDS``: a burst of 10,000 events per second becomes at most one
message per flush with the newest state of each lock, run, repository and worker, the
same text for every socket of the process (``dashboard.live.fanout``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer, AsyncWebsocketConsumer

from dashboard import infra
from dashboard.live import fanout
from dashboard.live.snapshots import ops_snapshot, repository_live
from dashboard.models import Repository
from dashboard.rollouts import live_snapshot

log = logging.getLogger(__name__)

#: Clients only ever send tiny control messages; anything bigger is refused.
MAX_INBOUND_BYTES = 4096
SNAPSHOT_MIN_INTERVAL = 1.0
#: How often a socket checks whether it must re-join its groups (after an outage).
REJOIN_SECONDS = 5.0

CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_NOT_FOUND = 4404


class _Coalescing(AsyncJsonWebsocketConsumer):
    """A socket of live groups: events come through this process's feeds
    (``dashboard.live.fanout``), already coalesced and serialised once for every socket;
    only the user's own group (a logout closes the socket) is joined on the layer."""

    feed_groups: list[str]

    async def _start(self, groups: list[str]) -> None:
        self.feed_groups = groups
        self.user_group = infra.user_group(self.scope["user"].pk)
        self.hub = fanout.hub()
        self.last_snapshot = 0.0
        #: When the client last asked for a snapshot, and the task answering a request
        #: that came inside the interval (``_snapshot_requested``).
        self.requested_at = 0.0
        self.answering: asyncio.Task[None] | None = None
        self.backlog = fanout.Backlog()
        self.wake = asyncio.Event()
        self.sender: asyncio.Task[None] | None = None
        self.rejoiner: asyncio.Task[None] | None = None
        self.joined = await self._join_groups()
        #: A snapshot for this socket must be built after this (``time.monotonic``):
        #: after the join (else an event sent meanwhile is missed) and after the last
        #: event offered (else the snapshot undoes it). See ``dashboard.live.snapshots``.
        self.fresh_after = time.monotonic()
        await self.accept()
        await self.send_snapshot()
        # Events offered meanwhile wait in the backlog: the first snapshot goes first.
        self.sender = asyncio.create_task(self._send_forever())
        if not self.joined:
            self.rejoiner = asyncio.create_task(self._rejoin_until_joined())

    async def _join_groups(self) -> bool:
        """Join every group; False if the channel layer (the queue server) did not
        answer. The socket is accepted either way: it gets snapshots, and events once a
        later join succeeds (``_rejoin_until_joined`` tries again every
        ``REJOIN_SECONDS``, then sends a fresh snapshot). Joining twice is harmless."""
        try:
            for group in self.feed_groups:
                await self.hub.join(group, self)
            await self.channel_layer.group_add(self.user_group, self.channel_name)
        except Exception:  # down or stalled: degrade, retry later
            return False
        return True

    async def _rejoin_until_joined(self) -> None:
        """Only after a failed join. (A queue server restarted empty forgets the feeds'
        memberships too: each feed re-adds itself, ``fanout.REFRESH_SECONDS``.)"""
        while not self.joined:
            await asyncio.sleep(REJOIN_SECONDS)
            self.joined = await self._join_groups()
            self.fresh_after = time.monotonic()
            if self.joined:
                await self.send_snapshot()  # events were missed while away

    def offer(self, batch: fanout.Batch) -> None:
        """A feed's batch for this socket: kept, sent by ``_send_forever`` (never
        awaited here, so a slow client does not hold up the feed)."""
        self.fresh_after = time.monotonic()
        self.backlog.add(batch)
        self.wake.set()

    async def _send_forever(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            text = self.backlog.take()
            if text is not None:
                # While this awaits a slow client, offers merge into the backlog.
                await self.send(text_data=text)

    async def disconnect(self, code: int) -> None:
        tasks = ("sender", "rejoiner", "answering")
        for task in (getattr(self, name, None) for name in tasks):
            if task is not None:
                task.cancel()
        hub = getattr(self, "hub", None)
        if hub is None:
            return
        for group in self.feed_groups:
            await hub.leave(group, self)
        try:
            await self.channel_layer.group_discard(self.user_group, self.channel_name)
        except Exception as exc:  # the membership expires on its own
            log.debug("group discard failed: %s", exc)

    async def receive(
        self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any
    ) -> None:
        size = len(text_data or "") + len(bytes_data or b"")
        if size > MAX_INBOUND_BYTES or bytes_data:
            await self.close(code=1009)  # message too big / not ours
            return
        try:
            # Bounded depth, no NUL (dashboard/infra/inputs.py): a frame nested past
            # Python's recursion limit would raise RecursionError, logged as a crash.
            content = infra.parse_json(text_data or "")
        except infra.BadInput:
            await self.close(code=1003)  # not JSON we take
            return
        await self.receive_json(content, **kwargs)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if isinstance(content, dict) and content.get("type") == "snapshot":
            await self._snapshot_requested()

    async def _snapshot_requested(self) -> None:
        """A flood of requests costs at most one snapshot per ``SNAPSHOT_MIN_INTERVAL``
        per socket, and no request goes unanswered: one asked inside the interval is
        answered when it ends, by one snapshot for every request that came meanwhile.
        A page asks because an event told it something changed (docs/live-view.md); a
        dropped request would leave it showing the state before that change for good
        (the request coming while the previous snapshot was still being built, so that
        one may predate the change too).

        Race: requests and the deferred answer run on this socket's event loop only.
        ``requested_at`` is set before the answer is looked at, and the answer checks it
        after each snapshot it sent: a request that came after that snapshot's build
        began gets another one; a request never finds a finished answer task that has
        not seen it (the check and the task's end happen in one step of the loop)."""
        loop = asyncio.get_running_loop()
        self.requested_at = loop.time()
        if self.answering is not None and not self.answering.done():
            return  # the pending answer sees this request (requested_at)
        if loop.time() - self.last_snapshot >= SNAPSHOT_MIN_INTERVAL:
            await self.send_snapshot()  # inline: frames of one socket stay in order
            return
        self.answering = asyncio.create_task(self._answer_later())

    async def _answer_later(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(max(0.0, self.last_snapshot + SNAPSHOT_MIN_INTERVAL - loop.time()))
            started = loop.time()
            await self.send_snapshot()
            if self.requested_at < started:
                return

    async def session_ended(self, message: dict[str, Any]) -> None:
        """The user logged out: this socket must not outlive the session."""
        await self.close(code=CLOSE_UNAUTHENTICATED)

    async def send_snapshot(self) -> None:
        data = await self.snapshot()
        self.last_snapshot = asyncio.get_running_loop().time()
        await self.send_json({"type": "snapshot", "data": data})

    async def snapshot(self) -> dict[str, Any]:
        raise NotImplementedError

    async def _allowed(self, permission: str | None = None) -> bool:
        """Whether this socket's user may connect: signed in, and holding
        ``permission`` if one is named; otherwise the socket is closed with the code
        that says why (4401, 4403)."""
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return False
        if permission and not await database_sync_to_async(user.has_perm)(permission):
            await self.close(code=CLOSE_FORBIDDEN)
            return False
        return True


class OpsConsumer(_Coalescing):
    """Operators' live view: locks, queues, workers, Redis nodes, dead letters."""

    async def connect(self) -> None:
        if await self._allowed("dashboard.view_jobrun"):
            await self._start([infra.OPS_GROUP])

    async def snapshot(self) -> dict[str, Any]:
        # Only the dead-letter page asks for the grouping (?dlq=groups): it is the
        # costliest part of the snapshot at 100,000 dead letters.
        groups = b"dlq=groups" in self.scope.get("query_string", b"")
        data: dict[str, Any] = await database_sync_to_async(ops_snapshot)(
            user=self.scope["user"], dlq_groups=groups, not_before=self.fresh_after
        )
        return data


class RepositoryConsumer(_Coalescing):
    """One repository's page: progress, current chunk and holder, why it waits."""

    async def connect(self) -> None:
        if not await self._allowed():
            return
        self.repo_id = int(self.scope["url_route"]["kwargs"]["repo_id"])
        exists = await database_sync_to_async(Repository.objects.filter(pk=self.repo_id).exists)()
        if not exists:
            await self.close(code=CLOSE_NOT_FOUND)
            return
        await self._start([infra.repo_group(self.repo_id)])

    async def snapshot(self) -> dict[str, Any]:
        # Only the analytics pages ask for the results' marks (?results=1): two more
        # queries per snapshot (docs/live-view.md#analyses-live).
        marks = b"results=1" in self.scope.get("query_string", b"")
        data: dict[str, Any] = await database_sync_to_async(repository_live)(
            self.repo_id, marks=marks
        )
        return data


class RepositoryListConsumer(_Coalescing):
    """The repository list (any logged-in user, like the list): ``live.REPOS_GROUP``.
    Its snapshot is only a time: the page fetches its rows again after a reconnect."""

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        await self._start([infra.REPOS_GROUP])

    async def send_snapshot(self) -> None:
        self.last_snapshot = asyncio.get_running_loop().time()
        await self.send_json({"type": "snapshot", "data": {"at": time.time()}})


class RolloutsConsumer(_Coalescing):
    """The Rollouts pages: ``rollout.*`` events only (``live.ROLLOUTS_GROUP``)."""

    async def connect(self) -> None:
        if await self._allowed("dashboard.view_jobrun"):
            await self._start([infra.ROLLOUTS_GROUP])

    async def snapshot(self) -> dict[str, Any]:
        data: dict[str, Any] = await database_sync_to_async(live_snapshot)()
        return data


class UnknownPathConsumer(AsyncWebsocketConsumer):
    """Every websocket path no route names (``dashboard.asgi``): the handshake is
    refused (closed with 4404 before it is accepted; the server answers the upgrade
    with 403), where Channels' router would raise and log a traceback."""

    async def connect(self) -> None:
        await self.close(code=CLOSE_NOT_FOUND)
