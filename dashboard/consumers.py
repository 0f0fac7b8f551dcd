"""Websocket consumers: authenticate, check permission, join groups, forward events.

Each client gets a snapshot on connect (and whenever it asks, e.g. after a reconnect),
then events, coalesced per group and web process and flushed every
``broadcasts.FLUSH_SECONDS``: a burst of 10,000 events per second becomes at most one
message per flush with the newest state of each lock, run, repository and worker, the
same text for every socket of the process (``dashboard.broadcasts``).

The live pages ask for a snapshot about once a second while job events arrive (their
aggregates come only from snapshots). The operations socket answers such a request
with the host's shared copy (at most ``GITWARD_SNAPSHOT_TTL`` old) followed by the
events since that copy may have been built (``OpsConsumer.replays``): before, it asked
for a copy built after the last event it had sent, and with events flushed ten times a
second that was a new build for nearly every request (BENCHMARKS.md, "Live view").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from dashboard import broadcasts, live
from dashboard.models import Repository
from dashboard.rolloutboard import live_snapshot
from dashboard.snapshots import ops_snapshot, repository_live

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
    (``dashboard.broadcasts``), already coalesced and serialised once for every socket;
    only the user's own group (a logout closes the socket) is joined on the layer."""

    feed_groups: list[str]
    #: Whether a snapshot the client asks for may be an older shared copy followed by
    #: the events since (``_send_answer``): for snapshots that are shared copies.
    replays = False

    async def _start(self, groups: list[str]) -> None:
        self.feed_groups = groups
        self.user_group = live.user_group(self.scope["user"].pk)
        self.hub = broadcasts.hub()
        self.last_snapshot = 0.0
        self.backlog = broadcasts.Backlog()
        self.wake = asyncio.Event()
        #: Batches offered in the last ``GITWARD_SNAPSHOT_TTL`` (``replays`` only), with
        #: when (``time.monotonic``); the copy being read for a client's request, and
        #: the one read, for the sender (``_read_asked_snapshot``).
        self.recent: deque[tuple[float, broadcasts.Batch]] = deque()
        self.reading: asyncio.Task[None] | None = None
        self.answer: tuple[float, dict[str, Any]] | None = None
        self.sender: asyncio.Task[None] | None = None
        self.rejoiner: asyncio.Task[None] | None = None
        self.joined = await self._join_groups()
        #: A snapshot for this socket must be built after this (``time.monotonic``):
        #: after the join (else an event sent meanwhile is missed) and after the last
        #: event offered (else the snapshot undoes it). See ``dashboard.snapshots``.
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
        memberships too: each feed re-adds itself, ``broadcasts.REFRESH_SECONDS``.)"""
        while not self.joined:
            await asyncio.sleep(REJOIN_SECONDS)
            self.joined = await self._join_groups()
            self.fresh_after = time.monotonic()
            if self.joined:
                await self.send_snapshot()  # events were missed while away

    def offer(self, batch: broadcasts.Batch) -> None:
        """A feed's batch for this socket: kept, sent by ``_send_forever`` (never
        awaited here, so a slow client does not hold up the feed)."""
        now = time.monotonic()
        self.fresh_after = now
        self.backlog.add(batch)
        if self.replays:
            self.recent.append((now, batch))
            # Only what a copy may lack is kept (see ``_send_answer``).
            horizon = now - float(settings.SNAPSHOT_TTL)
            while self.recent[0][0] < horizon:
                self.recent.popleft()
        self.wake.set()

    async def _send_forever(self) -> None:
        """The one task that sends events and, with ``replays``, asked-for snapshots:
        one sender, so a snapshot and the events replayed after it are never
        interleaved with older events."""
        while True:
            await self.wake.wait()
            self.wake.clear()
            if self.answer is not None:
                begun, data = self.answer
                self.answer = None
                await self._send_answer(begun, data)
            text = self.backlog.take()
            if text is not None:
                # While this awaits a slow client, offers merge into the backlog.
                await self.send(text_data=text)

    async def _read_asked_snapshot(self) -> None:
        """Read a shared copy for a client's request (``replays``) in a task of its own,
        so events keep flowing while it is read, then hand it to the sender."""
        begun = time.monotonic()
        try:
            data = await self.snapshot(not_before=0.0)
        except Exception as exc:  # the page asks again with its next events
            log.warning("snapshot for a socket failed: %s", exc)
            return
        finally:
            self.reading = None
        self.answer = (begun, data)
        self.wake.set()

    async def _send_answer(self, begun: float, data: dict[str, Any]) -> None:
        """Send a shared copy, then the events it may lack.

        1. The copy was read from ``begun`` on, so it was built after ``begun - TTL``
           (the rule of ``snapshots.shared_snapshot``) and holds the effect of every
           event offered before that (an event is published after its change commits).
           Every socket's request within a TTL shares one build: the host builds about
           once per TTL whatever the sockets, where a copy newer than this socket's last
           event (as on connect) is a new build for nearly every request.
        2. The backlog becomes every batch offered since ``begun - TTL``, sent right
           after the snapshot, including those sent while the copy was read. Each event
           is the newest state of its lock, run or worker, so one the copy already holds
           (or one sent twice) changes nothing; the pending backlog is dropped: it is
           among those, or older. (Offer times are monotonic and the copy's wall-clock:
           a clock step could shift the horizon by the step, as for every cached copy.)
        3. The snapshot's recent activity loses the events replayed after it, so the
           page's feed lists each once, in arrival order.
        """
        horizon = begun - float(settings.SNAPSHOT_TTL)
        backlog = broadcasts.Backlog()
        replayed: set[tuple[Any, ...]] = set()
        for offered, batch in self.recent:
            if offered >= horizon:
                backlog.add(batch)
                replayed.update(_identity(event) for _, event in batch.items)
        self.backlog = backlog
        if replayed and isinstance(data.get("activity"), list):
            # A new top-level dict: the shared copy itself is never changed.
            data = {
                **data,
                "activity": [e for e in data["activity"] if _identity(e) not in replayed],
            }
        self.last_snapshot = asyncio.get_running_loop().time()
        await self.send_json({"type": "snapshot", "data": data})

    async def disconnect(self, code: int) -> None:
        tasks = ("sender", "rejoiner", "reading")
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
            await super().receive(text_data=text_data, **kwargs)
        except ValueError:  # not JSON
            await self.close(code=1003)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if isinstance(content, dict) and content.get("type") == "snapshot":
            # A flood of requests costs at most one snapshot per second per socket.
            now = asyncio.get_running_loop().time()
            if now - self.last_snapshot >= SNAPSHOT_MIN_INTERVAL:
                self.last_snapshot = now
                if self.replays:
                    if self.reading is None:  # else the copy being read answers this too
                        self.reading = asyncio.create_task(self._read_asked_snapshot())
                else:
                    await self.send_snapshot()

    async def session_ended(self, message: dict[str, Any]) -> None:
        """The user logged out: this socket must not outlive the session."""
        await self.close(code=CLOSE_UNAUTHENTICATED)

    async def send_snapshot(self) -> None:
        """A snapshot built after ``fresh_after``: on connect, after a re-join, and when
        asked by sockets without ``replays``."""
        data = await self.snapshot(not_before=self.fresh_after)
        self.last_snapshot = asyncio.get_running_loop().time()
        await self.send_json({"type": "snapshot", "data": data})

    async def snapshot(self, *, not_before: float) -> dict[str, Any]:
        """The page's state; a cached copy must have been built after ``not_before``
        (``time.monotonic``; 0: any copy fresh by the cache's own rule)."""
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

    replays = True

    async def connect(self) -> None:
        if await self._allowed("dashboard.view_jobrun"):
            await self._start([live.OPS_GROUP])

    async def snapshot(self, *, not_before: float) -> dict[str, Any]:
        # Only the dead-letter page asks for the grouping (?dlq=groups): it is the
        # costliest part of the snapshot at 100,000 dead letters.
        groups = b"dlq=groups" in self.scope.get("query_string", b"")
        data: dict[str, Any] = await database_sync_to_async(ops_snapshot)(
            user=self.scope["user"], dlq_groups=groups, not_before=not_before
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
        await self._start([live.repo_group(self.repo_id)])

    async def snapshot(self, *, not_before: float) -> dict[str, Any]:
        data: dict[str, Any] = await database_sync_to_async(repository_live)(self.repo_id)
        return data


class RepositoryListConsumer(_Coalescing):
    """The repository list (any logged-in user, like the list): ``live.REPOS_GROUP``.
    Its snapshot is only a time: the page fetches its rows again after a reconnect."""

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        await self._start([live.REPOS_GROUP])

    async def send_snapshot(self) -> None:
        self.last_snapshot = asyncio.get_running_loop().time()
        await self.send_json({"type": "snapshot", "data": {"at": time.time()}})


class RolloutsConsumer(_Coalescing):
    """The Rollouts pages: ``rollout.*`` events only (``live.ROLLOUTS_GROUP``)."""

    async def connect(self) -> None:
        if await self._allowed("dashboard.view_jobrun"):
            await self._start([live.ROLLOUTS_GROUP])

    async def snapshot(self, *, not_before: float) -> dict[str, Any]:
        data: dict[str, Any] = await database_sync_to_async(live_snapshot)()
        return data


def _identity(event: dict[str, Any]) -> tuple[Any, ...]:
    """One event, whichever copy of it (the layer's or the activity list's)."""
    return (event.get("type"), event.get("at"), live.coalesce_key(event))
