"""Each test's channel layer receives as if new, whatever the tests before it left.

channels-redis (4.3.0) keeps per-layer receive state on the ``RedisChannelLayer``
object, and Channels caches that object per process (``channels.layers.channel_layers``)
while every test runs its sockets on a new event loop (its own ``asyncio.run``):

* ``receive_clean_locks`` (a ``ChannelLock``): one ``asyncio.Lock`` per channel key, and
  every process-local channel of the layer shares one key (``specific.<prefix>!``). The
  lock is held from before a receive's BRPOP until that message's backup-cleaning task
  has run, so a receive that follows at once waits on it, which binds the lock to that
  loop. ``ChannelLock.acquire`` counts the waiter before waiting and never uncounts it
  when the wait is cancelled (a socket disconnected at that moment): the count never
  drops back to zero, the lock is never dropped, and it stays bound to the old, closed
  loop. The next test whose receive must wait on it fails with "... is bound to a
  different event loop" (and its socket dies); a lock left held by a cleaner whose loop
  never ran it again hangs the next receive instead.
* ``receive_count`` / ``receive_lock`` / ``receive_event_loop``: one receive session per
  loop; a receive whose ``finally`` never ran (its loop closed under it) leaves the count
  up, and the next loop's receive is refused ("Two event loops are trying to
  receive()...").
* ``receive_buffer`` (per-channel queues bound to the loop that waited on them) and
  ``receive_cleaners`` (tasks of the old loop, which ``flush()``/``wait_received()``
  would wait on from the new one).

``reset_receive_state`` puts all of these back as ``RedisChannelLayer.__init__`` makes
them; ``reset_channel_layers`` does it for every layer Channels has cached. The
connection pools (``_layers``, per loop) are left alone: channels-redis drops a loop's
pools when that loop closes.
"""

from __future__ import annotations

import collections
import functools

from channels.layers import channel_layers
from channels_redis.core import BoundedQueue, ChannelLock, RedisChannelLayer


def reset_receive_state(layer: RedisChannelLayer) -> None:
    """Forget every receive of ``layer``: call only while no loop receives on it."""
    layer.receive_count = 0
    layer.receive_lock = None
    layer.receive_event_loop = None
    layer.receive_buffer = collections.defaultdict(functools.partial(BoundedQueue, layer.capacity))
    layer.receive_cleaners = []
    layer.receive_clean_locks = ChannelLock()


def reset_channel_layers() -> int:
    """Reset the receive state of every channel layer Channels has built so far (none
    is built here); return how many were reset."""
    reset = 0
    for layer in list(channel_layers.backends.values()):
        if isinstance(layer, RedisChannelLayer):
            reset_receive_state(layer)
            reset += 1
    return reset
