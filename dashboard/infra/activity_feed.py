"""Recent activity: the newest live events, kept for the overview's feed.

``dashboard.infra.events`` delivers every event to the sockets and hands the ones worth a line
in the feed to ``record``: runs queued, started, finished or dead; locks taken, released
or lost; repositories changing status; operator actions (audit entries); rollouts. State
ticks (``job.progress``, ``lock.extended``, ``worker.heartbeat``, ``fetch.changed``, a bulk
action's running count) are left out: they would push everything else off the list within seconds.

The list is one Redis list on the queue server (``FEED_KEY``), newest first, trimmed to
``FEED_SIZE``; the operations snapshot carries the newest ``SEED`` of them, so a page
(and a socket that reconnects, or a tab shown again) starts with the recent past and
then prepends live events. Best effort like the live view: with the queue server down
nothing is recorded and the feed is empty, and no caller ever fails because of it.
"""

from __future__ import annotations

import json
import logging
from typing import Any, cast

import redis

from dashboard.infra import queues

log = logging.getLogger(__name__)

FEED_KEY = "gitward:activity"
FEED_SIZE = 200
SEED = 50
#: State ticks: not activity (see the module docstring).
TICKS = frozenset({"job.progress", "lock.extended", "worker.heartbeat", "fetch.changed"})
_FAILURES = (queues.QueueUnavailable, redis.RedisError, OSError)


def is_activity(event: dict[str, Any]) -> bool:
    kind = str(event.get("type", ""))
    if kind in TICKS:
        return False
    if kind == "action.progress":  # only a bulk action's end, not each batch
        return event.get("state") != "running"
    return True


def record(event: dict[str, Any]) -> None:
    """Prepend ``event`` to the feed if it is activity. Race: many processes push at
    once; each LPUSH+LTRIM pair runs as one MULTI transaction, and trimming to the newest
    ``FEED_SIZE`` is right whatever the interleaving (at worst two events that happened
    within a millisecond are listed in the order the queue server received them)."""
    if not is_activity(event):
        return
    try:
        pipe = queues.connection().pipeline(transaction=True)
        pipe.lpush(FEED_KEY, json.dumps(event))
        pipe.ltrim(FEED_KEY, 0, FEED_SIZE - 1)
        pipe.execute()
    except _FAILURES as exc:
        log.debug("activity not recorded: %s", exc)


def recent(limit: int = SEED) -> list[dict[str, Any]]:
    """The newest ``limit`` events, newest first ([] when the queue server is down)."""
    try:
        raw = cast(list[bytes], queues.connection().lrange(FEED_KEY, 0, max(0, limit - 1)))
    except _FAILURES:
        return []
    events: list[dict[str, Any]] = []
    for item in raw:
        try:
            events.append(json.loads(item))
        except ValueError:  # not ours: skip rather than break the page
            continue
    return events
