"""tests/support/channel_layer_reset.py: a receive cancelled on one event loop (a socket closed
while its receive waited) leaves channels-redis's receive state bound to that loop, and the next
loop's receive on the same layer fails; with the reset between loops (an autouse fixture between
tests) it receives.

The queue server of these tests is their own, stalled for real (SIGSTOP) so that a
receive deterministically waits for the previous message's backup cleaner."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from channels.layers import get_channel_layer
from channels_redis.core import RedisChannelLayer

from tests.conftest import _own_node
from tests.support.channel_layer_reset import reset_channel_layers, reset_receive_state
from workers.runtime.redis_server import RedisNode

#: Loop turns a step may take before the test gives up (no clock involved).
TURNS = 100_000


@pytest.fixture
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisNode]:
    node = _own_node(tmp_path_factory.mktemp("layer"))
    yield node
    node.resume()
    node.kill()


def _stall(node: RedisNode) -> None:
    """SIGSTOP the server and wait (without yielding to the loop) until it is stopped:
    nothing sent from now on is answered before ``node.resume()``."""
    node.pause()
    assert node.proc is not None
    stat = Path(f"/proc/{node.proc.pid}/stat")
    for _ in range(TURNS):
        if stat.read_text().rsplit(")", 1)[1].split()[0] == "T":
            return
    raise AssertionError("the queue server did not stop")


def _clean_key(layer: RedisChannelLayer, channel: str) -> str:
    """The key of the cleaner lock: one for every process-local channel of the layer."""
    return str(layer.prefix + layer.non_local_name(channel))


async def _until(condition: Any, what: str) -> None:
    for _ in range(TURNS):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"never happened: {what}")


async def cancel_a_receive_waiting_for_the_cleaner(
    layer: RedisChannelLayer, node: RedisNode
) -> str:
    """On this loop: receive a message, then start a second receive, which waits for
    the first message's backup cleaner (its answer stalled), and cancel it there, as
    when a socket disconnects at that moment. Returns the cleaner lock's key."""
    channel = await layer.new_channel()
    key = _clean_key(layer, channel)
    await layer.send(channel, {"type": "first"})
    assert (await layer.receive(channel))["type"] == "first"  # its cleaner is pending
    _stall(node)
    try:
        waiting = asyncio.ensure_future(layer.receive(channel))
        await _until(lambda: layer.receive_clean_locks.wait_counts.get(key) == 2, "the wait")
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
    finally:
        node.resume()
    await layer.wait_received()  # the first message's cleaner ran and released
    return key


async def receive_right_after_a_receive(layer: RedisChannelLayer, node: RedisNode) -> str:
    """On this loop: two messages received one right after the other, the second
    receive waiting for the first message's cleaner (its answer stalled)."""
    channel = await layer.new_channel()
    key = _clean_key(layer, channel)
    before = layer.receive_clean_locks.wait_counts.get(key, 0)
    await layer.send(channel, {"type": "one"})
    await layer.send(channel, {"type": "two"})
    assert (await layer.receive(channel))["type"] == "one"
    _stall(node)
    try:
        second = asyncio.ensure_future(layer.receive(channel))
        await _until(
            lambda: second.done() or layer.receive_clean_locks.wait_counts.get(key) == before + 2,
            "the second receive waiting for the first message's cleaner",
        )
    finally:
        node.resume()
    message = await asyncio.wait_for(second, 30)
    return str(message["type"])


def test_a_receive_cancelled_on_one_loop_breaks_the_next_loops_receive_without_the_reset(
    node: RedisNode,
) -> None:
    """What the flake was: channels-redis counts the cancelled waiter for ever, so the
    cleaner lock outlives its loop, bound to it."""
    layer = RedisChannelLayer(hosts=[node.url])
    key = asyncio.run(cancel_a_receive_waiting_for_the_cleaner(layer, node))
    assert layer.receive_clean_locks.wait_counts[key] == 1  # no receive left, still counted
    with pytest.raises(RuntimeError, match="bound to a different event loop"):
        asyncio.run(receive_right_after_a_receive(layer, node))


def test_after_the_reset_the_next_loop_receives(node: RedisNode) -> None:
    layer = RedisChannelLayer(hosts=[node.url])
    asyncio.run(cancel_a_receive_waiting_for_the_cleaner(layer, node))
    reset_receive_state(layer)
    assert layer.receive_clean_locks.wait_counts == {}
    assert (layer.receive_count, layer.receive_lock, layer.receive_event_loop) == (0, None, None)
    assert not layer.receive_buffer and layer.receive_cleaners == []
    assert asyncio.run(receive_right_after_a_receive(layer, node)) == "two"
    # And again on a third loop: the reset left nothing bound to the second one.
    reset_receive_state(layer)
    assert asyncio.run(receive_right_after_a_receive(layer, node)) == "two"


def test_every_test_starts_on_reset_channel_layers(
    node: RedisNode, settings: Any, request: pytest.FixtureRequest
) -> None:
    """The shared layer (the one consumers use) is reset by ``reset_channel_layers``,
    which the autouse fixture of tests/conftest.py runs before every test."""
    assert "_fresh_channel_layers" in request.fixturenames
    # A new dict, so Channels' setting_changed hook drops the cached layer.
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "dashboard.infra.events.ResilientChannelLayer",
            "CONFIG": {"hosts": [node.url]},
        }
    }
    layer = get_channel_layer()
    assert isinstance(layer, RedisChannelLayer)
    asyncio.run(cancel_a_receive_waiting_for_the_cleaner(layer, node))
    assert reset_channel_layers() == 1
    assert get_channel_layer() is layer  # the same cached layer, reset in place
    assert asyncio.run(receive_right_after_a_receive(layer, node)) == "two"
