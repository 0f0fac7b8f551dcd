"""Live events fanned out inside one web process: one channel-layer member per process
and group, however many websockets watch that group here.

A websocket does not join a live group on the channel layer itself: it joins this
process's **feed** for the group (``join``). The first socket of a group starts the
feed: one channel of its own on the layer, added to the group. An event sent to the
group is received once per web process, coalesced once per ``FLUSH_SECONDS`` window
(newest state per ``live.coalesce_key``) and serialised once; every socket of the group
is then handed the same ``Batch`` (the same text) without waiting on it
(``Member.offer``). Each socket sends from a task of its own, so a slow client only
delays itself: while its send is pending, the batches offered meanwhile are merged into
one backlog of at most ``MAX_PENDING`` events (newest kept, the rest counted as
``dropped``), which it sends next.

Before this, every socket was a member of its groups. channels-redis (4.x) already
writes one Redis message per process for them (its channels share the process's key),
but then hands a copy to each socket's receive buffer, and each socket dispatched it
with a hop to Django's one sync thread (Channels closes old database connections before
every handler), coalesced it and serialised its own JSON: 200 sockets × 10 events/s was
2,000 hops a second through one thread, and on a loaded machine the sockets fell
seconds to a minute behind, most events expiring unsent (BENCHMARKS.md, "Load —
websocket path").

Feeds live on one event loop (a web process has one; each test's ``asyncio.run`` has
its own) and the last socket to leave stops its feed and leaves the group. A feed
re-adds its channel to the group every ``REFRESH_SECONDS``: channels-redis forgets a
membership after its ``group_expiry`` (a day), and a queue server restarted empty has
forgotten them all; the next refresh brings this process's events back.
"""

from __future__ import annotations

import asyncio
import json
import logging
import weakref
from dataclasses import dataclass
from typing import Any, Protocol

from channels.layers import get_channel_layer

from dashboard import infra

log = logging.getLogger(__name__)

#: The coalescing window: at most one message per group and window to each socket.
FLUSH_SECONDS = 0.1
#: Most distinct events one window (or one slow socket's backlog) keeps.
MAX_PENDING = 2000
#: How often a feed re-adds its channel to its group (see the module docstring).
REFRESH_SECONDS = 60.0

Event = dict[str, Any]


@dataclass(frozen=True)
class Batch:
    """One window's coalesced events of one group, with their keys, and the message
    every socket is sent (serialised once)."""

    items: tuple[tuple[str, Event], ...]
    dropped: int
    text: str


def make_batch(items: list[tuple[str, Event]], dropped: int) -> Batch:
    message: dict[str, Any] = {"type": "events", "events": [e for _, e in items]}
    if dropped:
        message["dropped"] = dropped
    return Batch(tuple(items), dropped, json.dumps(message))


class Member(Protocol):
    """A websocket of this process: takes a batch at once, sends it later."""

    def offer(self, batch: Batch) -> None: ...


class Backlog:
    """What one socket has not sent yet: one shared batch (the usual case: sent as its
    text), or, when more came before the last send finished, their merge."""

    def __init__(self) -> None:
        self.shared: Batch | None = None
        self.merged: dict[str, Event] | None = None
        self.dropped = 0

    def __bool__(self) -> bool:
        return self.shared is not None or bool(self.merged) or self.dropped > 0

    def add(self, batch: Batch) -> None:
        if self.shared is None and self.merged is None:
            self.shared = batch
            return
        if self.merged is None:
            self.merged = {}
        if self.shared is not None:
            self._merge(self.shared)
            self.shared = None
        self._merge(batch)

    def _merge(self, batch: Batch) -> None:
        assert self.merged is not None
        self.dropped += batch.dropped
        for key, event in batch.items:
            self.merged.pop(key, None)  # re-insert: keeps arrival order of the newest
            self.merged[key] = event
            if len(self.merged) > MAX_PENDING:  # a slow client: keep the newest, say so
                del self.merged[next(iter(self.merged))]
                self.dropped += 1

    def take(self) -> str | None:
        """The text to send now (and empty the backlog); None if nothing is pending."""
        if not self:
            return None
        if self.shared is not None:
            text = self.shared.text
        else:
            text = make_batch(list((self.merged or {}).items()), self.dropped).text
        self.shared, self.merged, self.dropped = None, None, 0
        return text


class Feed:
    """This process's member of one group: receives, coalesces and hands out."""

    def __init__(self, hub: Hub, group: str) -> None:
        self.hub = hub
        self.group = group
        self.members: set[Member] = set()
        self.pending: dict[str, Event] = {}
        self.dropped = 0
        self.channel = ""
        self.tasks: list[asyncio.Task[None]] = []
        self.started: asyncio.Future[None] = asyncio.ensure_future(self._start())

    async def _start(self) -> None:
        layer = self.hub.layer
        self.channel = await layer.new_channel()
        await layer.group_add(self.group, self.channel)  # bounded (ResilientChannelLayer)
        self.tasks = [
            asyncio.create_task(self._receive_forever()),
            asyncio.create_task(self._flush_forever()),
        ]

    async def _receive_forever(self) -> None:
        while True:
            message = await self.hub.layer.receive(self.channel)
            if message.get("type") != "live.event":
                log.debug("feed %s ignores a %r message", self.group, message.get("type"))
                continue
            self.take(message["event"])

    def take(self, event: Event) -> None:
        key = infra.coalesce_key(event)
        self.pending.pop(key, None)
        self.pending[key] = event
        if len(self.pending) > MAX_PENDING:  # a flood: keep the newest, say so
            del self.pending[next(iter(self.pending))]
            self.dropped += 1

    def flush(self) -> None:
        if not self.pending and not self.dropped:
            return
        batch = make_batch(list(self.pending.items()), self.dropped)
        self.pending, self.dropped = {}, 0
        # A copy: a socket leaving (or joining) meanwhile changes the set, not this loop.
        for member in list(self.members):
            member.offer(batch)

    async def _flush_forever(self) -> None:
        loop = asyncio.get_running_loop()
        next_refresh = loop.time() + REFRESH_SECONDS
        while True:
            await asyncio.sleep(FLUSH_SECONDS)
            self.flush()
            if loop.time() >= next_refresh:
                next_refresh = loop.time() + REFRESH_SECONDS
                try:
                    await self.hub.layer.group_add(self.group, self.channel)
                except Exception as exc:  # down: the next refresh tries again
                    log.debug("feed %s refresh failed: %s", self.group, exc)

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        try:
            await self.hub.layer.group_discard(self.group, self.channel)
        except Exception as exc:  # the membership expires on its own
            log.debug("feed %s discard failed: %s", self.group, exc)


class Hub:
    """The feeds of one event loop on one channel layer."""

    def __init__(self, layer: Any) -> None:
        self.layer = layer
        self.feeds: dict[str, Feed] = {}

    async def join(self, group: str, member: Member) -> None:
        """Add ``member`` to this process's feed of ``group``, starting the feed (and
        joining the group on the layer) if it is the first. Raises what the layer
        raised if it could not join; the member is then in no feed of ``group``."""
        while True:
            feed = self.feeds.get(group)
            if feed is None:
                feed = self.feeds[group] = Feed(self, group)
            try:
                # Shielded: a socket closed while it waits must not cancel the start
                # the others wait on too.
                await asyncio.shield(feed.started)
            except Exception:
                if self.feeds.get(group) is feed:
                    del self.feeds[group]  # the next join starts again
                raise
            # One loop, no await since the check: the feed cannot stop in between. It
            # may have stopped while we waited (its last member left): then start anew.
            if self.feeds.get(group) is feed:
                feed.members.add(member)
                return

    async def leave(self, group: str, member: Member) -> None:
        feed = self.feeds.get(group)
        if feed is None or member not in feed.members:
            return
        feed.members.discard(member)
        if not feed.members:
            # Out of the map before the first await: a join from now on starts a new
            # feed (a new channel), never one being stopped.
            del self.feeds[group]
            await feed.stop()


_HUBS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Hub] = weakref.WeakKeyDictionary()


def hub() -> Hub:
    """This event loop's hub on the current channel layer (a test that swaps the layer
    gets a new hub; the old one's feeds end with their loop)."""
    loop = asyncio.get_running_loop()
    layer = get_channel_layer()
    found = _HUBS.get(loop)
    if found is None or found.layer is not layer:
        found = _HUBS[loop] = Hub(layer)
    return found
