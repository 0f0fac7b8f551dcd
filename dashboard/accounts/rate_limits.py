"""Per-user rate limits, counted in Redis so every web process shares them.

A fixed one-minute window per (scope, user): ``INCR`` + ``EXPIRE`` in one MULTI, so
concurrent requests from many processes are counted exactly.

If the queue server cannot be reached (``QueueUnavailable``: refused, or no answer
within ``GITWARD_QUEUE_TIMEOUT``; at once while its circuit is open) the limit **fails
open**, logged: these limits protect capacity, not authentication, and refusing every
request because the counter is down would turn one component's outage into a full one.
Submissions are then accepted into the database and enqueued by the reconciler later.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import redis
from django.conf import settings

from dashboard import infra

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    limit: int
    remaining: int
    retry_after: int


def limits() -> dict[str, int]:
    return {"submit": settings.RATE_SUBMIT_PER_MINUTE, "api": settings.RATE_API_PER_MINUTE}


def check(scope: str, user: Any) -> Verdict:
    """Count one request of ``user`` in ``scope``; say whether it is allowed."""
    limit = limits()[scope]
    if limit <= 0:
        return Verdict(True, 0, 0, 0)
    window = int(time.time() // 60)
    who = getattr(user, "pk", None) or "anon"
    key = f"gitward:ratelimit:{scope}:{who}:{window}"
    try:
        pipe = infra.connection().pipeline(transaction=True)
        pipe.incr(key)
        pipe.expire(key, 120)
        count = int(pipe.execute()[0])
    except (redis.RedisError, infra.RedisUnavailable) as exc:
        log.warning("rate limit %s not enforced (Redis unavailable): %s", scope, exc)
        return Verdict(True, limit, limit, 0)
    retry_after = 60 - int(time.time()) % 60
    return Verdict(count <= limit, limit, max(0, limit - count), retry_after)
