"""Live events: the only place that names channel groups and event types.

Events are published **after commit** through ``publish_event``, which checks the type
is known and the payload is JSON-safe. This module knows Channels and JSON and nothing
of the domain: callers build the payload (``dashboard.repositories`` the repository
state, ``dashboard.leases`` the lock rows) and this module delivers what it is given.
Consumers (``dashboard.consumers``) coalesce bursts per client. Publishing never fails
the caller: if the channel layer is down the live view misses an event, the job does not.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

log = logging.getLogger(__name__)

#: Operators' view (locks, queues, workers, DLQ): needs ``dashboard.view_jobrun``.
OPS_GROUP = "live.ops"
#: The Rollouts pages: only ``rollout.*`` events (also sent to ``OPS_GROUP``), so a
#: flood of job and lock events never reaches them. Needs ``dashboard.view_jobrun``.
ROLLOUTS_GROUP = "live.rollouts"

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
        "dlq.changed",
        "action.progress",
        "repo.changed",
        "rollout.changed",
    }
)


def repo_group(repo_id: int) -> str:
    """Watchers of one repository's page (any logged-in user)."""
    return f"live.repo.{int(repo_id)}"


def user_group(user_id: int) -> str:
    """All sockets of one user: closed together when the user logs out."""
    return f"live.user.{int(user_id)}"


def close_user_sockets(user_id: int) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(user_group(user_id), {"type": "session.ended"})
    except Exception as exc:  # the socket then lives until its next reconnect check
        log.warning("could not close sockets of user %s: %s", user_id, exc)


def coalesce_key(event: dict[str, Any]) -> str:
    """Events with the same key replace each other within one flush window: the client
    only needs the newest state of each lock, run, repository or worker."""
    kind = str(event["type"])
    family = kind.split(".", 1)[0]
    for field in ("key", "run", "repo", "worker", "action"):
        if field in event:
            return f"{family}:{field}:{event[field]}"
    return kind


def publish_event(kind: str, payload: dict[str, Any], *, repo_id: int | None = None) -> None:
    """Send ``{type: kind, at, ...payload}`` to operators (and to the repository's
    watchers) once the current transaction commits (at once outside one)."""
    if kind not in EVENT_TYPES:
        raise ValueError(f"unknown live event type {kind!r}")
    event = {"type": kind, "at": round(time.time(), 3), **payload}
    json.dumps(event)  # JSON-safe, or TypeError now rather than in the consumer
    message = {"type": "live.event", "event": event}

    def send() -> None:
        layer = get_channel_layer()
        if layer is None:
            return
        try:
            async_to_sync(layer.group_send)(OPS_GROUP, message)
            if kind.startswith("rollout."):
                async_to_sync(layer.group_send)(ROLLOUTS_GROUP, message)
            if repo_id is not None:
                async_to_sync(layer.group_send)(repo_group(repo_id), message)
        except Exception as exc:  # the live view is best effort; the job goes on
            log.debug("live event %s not sent: %s", kind, exc)

    transaction.on_commit(send)
