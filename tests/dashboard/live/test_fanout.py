"""dashboard.live.fanout on the real channel layer (a real redis-server): an event reaches
every socket of two web processes with one Redis message per process, not per socket;
each process serialises a window's events once; a socket that does not drain delays
nobody else and its backlog stays bounded; the last socket to leave takes its process
out of the group; a join that failed (queue server down) can be tried again.

Two web processes are two channel layers (each its own client prefix and connections,
as two processes have) with a hub each, in one event loop. The sockets here are
``Socket`` members that record what they are offered; the consumers that are members
in production are tested through the ASGI application in test_consumers.py and
test_live.py.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import redis
from channels.layers import get_channel_layer
from django.conf import settings

from dashboard.infra import events as infra_events
from dashboard.infra.events import ResilientChannelLayer
from dashboard.live import fanout
from tests.conftest import _own_node
from workers.runtime.redis_server import RedisNode


class Socket:
    """A member as a consumer is one: ``offer`` keeps the batch and returns at once."""

    def __init__(self) -> None:
        self.batches: list[fanout.Batch] = []
        self.arrived = asyncio.Event()

    def offer(self, batch: fanout.Batch) -> None:
        self.batches.append(batch)
        self.arrived.set()

    def events(self) -> list[dict[str, Any]]:
        return [e for b in self.batches for _, e in b.items]


def second_process_layer() -> ResilientChannelLayer:
    """Another web process's channel layer on the same queue server."""
    return ResilientChannelLayer(**settings.CHANNEL_LAYERS["default"]["CONFIG"])


async def until(condition: Any, timeout: float = 10.0) -> None:
    """Wait, bounded, for ``condition()`` (polled: the offers happen in the feeds' tasks)."""
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


def zadds(node: RedisNode) -> int:
    """ZADD calls the server has run, scripts' included: channels-redis writes each
    message to a member channel with one ZADD (and each group join is one)."""
    stats = node.client().info("commandstats")
    return int(stats.get("cmdstat_zadd", {}).get("calls", 0))


def test_an_event_reaches_every_socket_of_two_processes_with_one_message_per_process(
    redis_nodes: list[RedisNode],
) -> None:
    node = redis_nodes[0]

    async def deliver(per_process: int) -> int:
        """Send one event to ``per_process`` sockets in each of two processes; return
        the ZADDs it cost (sending to each member channel, and each receive's backup)."""
        hubs = [fanout.Hub(get_channel_layer()), fanout.Hub(second_process_layer())]
        sockets = [[Socket() for _ in range(per_process)] for _ in hubs]
        for hub, mine in zip(hubs, sockets, strict=True):
            for socket in mine:
                await hub.join(infra_events.OPS_GROUP, socket)
        before = zadds(node)
        event = {"type": "job.queued", "run": per_process, "repo": 1, "at": 1.0}
        await get_channel_layer().group_send(
            infra_events.OPS_GROUP, {"type": "live.event", "event": event}
        )
        everyone = [s for mine in sockets for s in mine]
        await until(lambda: all(s.batches for s in everyone))
        cost = zadds(node) - before
        for mine in sockets:
            assert all(s.events() == [event] for s in mine)
            # One batch (one serialisation) shared by the process's sockets.
            assert len({id(s.batches[0]) for s in mine}) == 1
            assert json.loads(mine[0].batches[0].text) == {"type": "events", "events": [event]}
        for hub, mine in zip(hubs, sockets, strict=True):
            for socket in mine:
                await hub.leave(infra_events.OPS_GROUP, socket)
        return cost

    async def scenario() -> None:
        one = await deliver(1)
        # The same Redis work for 25 sockets per process as for one: per process, not
        # per socket.
        assert 0 < one <= 4 and await deliver(25) == one

    asyncio.run(scenario())


def test_a_window_coalesces_per_key_and_keeps_other_groups_apart() -> None:
    async def scenario() -> None:
        hub = fanout.Hub(get_channel_layer())
        ops, repo = Socket(), Socket()
        await hub.join(infra_events.OPS_GROUP, ops)
        await hub.join(infra_events.repo_group(7), repo)
        layer = get_channel_layer()
        # Sent before the first window ends on any machine? Not needed: whatever the
        # windows, the newest extension arrives last and the repository sees only its own.
        for i in range(50):
            event = {"type": "lock.extended", "key": "locks:x", "extensions": i}
            await layer.group_send(infra_events.OPS_GROUP, {"type": "live.event", "event": event})
        mine = {"type": "job.progress", "run": 1, "repo": 7}
        await layer.group_send(infra_events.repo_group(7), {"type": "live.event", "event": mine})
        await until(lambda: any(e.get("extensions") == 49 for e in ops.events()))
        await until(lambda: bool(repo.batches))
        for batch in ops.batches:  # within a window, one event per key
            keys = [k for k, _ in batch.items]
            assert len(keys) == len(set(keys))
        assert len(ops.events()) <= 50
        assert repo.events() == [mine] and all(e["type"] == "lock.extended" for e in ops.events())
        await hub.leave(infra_events.OPS_GROUP, ops)
        await hub.leave(infra_events.repo_group(7), repo)

    asyncio.run(scenario())


class StuckSocket(Socket):
    """A client that never reads: its sender is stuck in ``send``; offers merge."""

    def __init__(self) -> None:
        super().__init__()
        self.backlog = fanout.Backlog()

    def offer(self, batch: fanout.Batch) -> None:
        super().offer(batch)
        self.backlog.add(batch)


def test_a_socket_that_never_drains_delays_no_one_and_its_backlog_is_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fanout, "MAX_PENDING", 20)

    async def scenario() -> None:
        hub = fanout.Hub(get_channel_layer())
        stuck, others = StuckSocket(), [Socket() for _ in range(3)]
        for socket in [stuck, *others]:
            await hub.join(infra_events.OPS_GROUP, socket)
        layer = get_channel_layer()
        for i in range(100):
            event = {"type": "job.queued", "run": i}
            await layer.group_send(infra_events.OPS_GROUP, {"type": "live.event", "event": event})
        await until(lambda: all(any(e["run"] == 99 for e in s.events()) for s in others))
        await until(lambda: any(e["run"] == 99 for e in stuck.events()))
        # Finally sent: the newest 20 of the backlog, the rest counted as dropped.
        sent = json.loads(stuck.backlog.take() or "{}")
        runs = [e["run"] for e in sent["events"]]
        offered = len({e["run"] for e in stuck.events()})
        assert runs[-1] == 99 and len(runs) == min(offered, 20)
        dropped_by_feed = sum(b.dropped for b in stuck.batches)
        assert sent.get("dropped", 0) == dropped_by_feed + max(0, offered - 20)
        assert stuck.backlog.take() is None  # emptied
        for socket in [stuck, *others]:
            await hub.leave(infra_events.OPS_GROUP, socket)

    asyncio.run(scenario())


def test_one_batch_is_sent_as_its_own_text_and_several_as_their_merge() -> None:
    backlog = fanout.Backlog()
    first = fanout.make_batch([("a", {"n": 1}), ("b", {"n": 2})], 0)
    backlog.add(first)
    assert backlog.take() is first.text  # the shared text itself, not a copy
    backlog.add(first)
    backlog.add(fanout.make_batch([("a", {"n": 3})], 4))
    assert json.loads(backlog.take() or "") == {
        "type": "events",
        "events": [{"n": 2}, {"n": 3}],
        "dropped": 4,
    }


def test_the_last_socket_to_leave_takes_the_process_out_of_the_group(
    redis_nodes: list[RedisNode],
) -> None:
    client = redis_nodes[0].client()

    async def scenario() -> None:
        layer = get_channel_layer()
        hub = fanout.Hub(layer)
        key = layer._group_key(infra_events.OPS_GROUP)
        a, b = Socket(), Socket()
        await hub.join(infra_events.OPS_GROUP, a)
        await hub.join(infra_events.OPS_GROUP, b)
        assert client.zcard(key) == 1  # one member for the process
        await hub.leave(infra_events.OPS_GROUP, a)
        assert client.zcard(key) == 1
        await hub.leave(infra_events.OPS_GROUP, b)
        assert client.zcard(key) == 0 and infra_events.OPS_GROUP not in hub.feeds
        c = Socket()  # a new feed after the old one stopped
        await hub.join(infra_events.OPS_GROUP, c)
        event = {"type": "job.queued", "run": 1}
        await layer.group_send(infra_events.OPS_GROUP, {"type": "live.event", "event": event})
        await until(lambda: bool(c.batches))
        assert c.events() == [event] and not a.batches and not b.batches
        await hub.leave(infra_events.OPS_GROUP, c)

    asyncio.run(scenario())


def test_a_join_that_failed_is_tried_again(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(settings, "QUEUE_TIMEOUT", 0.3)
    node = _own_node(tmp_path_factory.mktemp("queue"))
    layer = ResilientChannelLayer(hosts=[node.url])
    node.kill()

    async def scenario() -> None:
        hub = fanout.Hub(layer)
        socket = Socket()
        with pytest.raises((redis.RedisError, OSError, TimeoutError)):
            await hub.join(infra_events.OPS_GROUP, socket)
        assert infra_events.OPS_GROUP not in hub.feeds
        await asyncio.to_thread(node.start)
        await hub.join(infra_events.OPS_GROUP, socket)
        event = {"type": "job.queued", "run": 2}
        await layer.group_send(infra_events.OPS_GROUP, {"type": "live.event", "event": event})
        await until(lambda: bool(socket.batches))
        assert socket.events() == [event]
        await hub.leave(infra_events.OPS_GROUP, socket)

    try:
        asyncio.run(scenario())
    finally:
        node.kill()
