"""Dead letters per root-cause group, as ``/metrics`` reports them — cached, because the
grouping is an aggregate over every dead run (100,000 index entries at 100,000 dead
letters: most of a scrape's time, BENCHMARKS.md) while the set changes rarely.

Correct, not merely recent: every change of the dead set through gitward — a run dying
(``dashboard.runs.attempts``), dead runs retried or discarded (``dashboard.runs.dead_letters``,
one call per batch of a bulk action) — calls ``changed()``, which bumps a generation counter on the
queue server once its transaction commits. A scrape reuses this process's cached counts only while
the generation is the one they were computed under, and for at most
``GITWARD_METRICS_CACHE_SECONDS`` (a backstop for changes made outside gitward's code, e.g.
by hand in the database). Without the queue server it computes every time.

Race: a change that commits while counts are being computed. The generation is read
*before* the query and bumped *after* the commit, so such counts are stored under the old
generation and the next scrape, seeing the new one, recomputes; counts can never be kept
under a generation that postdates a change they miss.
"""

from __future__ import annotations

import logging
import secrets
import time
from typing import Any

import redis
from django.conf import settings
from django.db import transaction
from django.db.models import Count

from dashboard import infra
from dashboard.models import JobRun

log = logging.getLogger(__name__)

GENERATION = "gitward:dlq:generation"

#: ``(generation, monotonic time, groups, causes)`` of the last computation here.
_cached: tuple[int, float, list[dict[str, Any]], dict[str, str]] | None = None


def changed() -> None:
    """The dead set changed in the current transaction (or just now, outside one)."""
    transaction.on_commit(_bump)


def _bump() -> None:
    try:
        infra.connection().incr(GENERATION)
    except (redis.RedisError, OSError) as exc:  # the TTL bounds the staleness then
        log.warning("dead-letter counts generation not bumped: %s", exc)


def _generation() -> int | None:
    """The current generation; a queue server that lost it (flushed, restarted without
    persistence) starts a random one, so counts cached before can never match it."""
    try:
        conn = infra.connection()
        raw: Any = conn.get(GENERATION)
        if raw is None:
            conn.set(GENERATION, secrets.randbits(48), nx=True)  # NX: one start wins
            raw = conn.get(GENERATION)
    except (redis.RedisError, OSError):
        return None
    return int(raw or 0)


def groups(top: int) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """``([{cause_key, n}] largest first, {cause_key: cause} for the ``top`` largest)``."""
    global _cached
    gen = _generation()
    hit = _cached
    ttl = float(settings.METRICS_CACHE_SECONDS)
    if gen is not None and hit is not None and hit[0] == gen and time.monotonic() - hit[1] < ttl:
        return hit[2], hit[3]
    found = list(
        JobRun.objects.filter(state=JobRun.State.DEAD)
        .order_by()
        .values("cause_key")
        .annotate(n=Count("id"))
        .order_by("-n", "cause_key")
    )
    # One row per group, unordered: the index on (state, cause_key) finds it at once
    # (``first()`` would sort the group by id).
    causes = {
        g["cause_key"]: next(
            iter(
                JobRun.objects.filter(state=JobRun.State.DEAD, cause_key=g["cause_key"])
                .order_by()
                .values_list("cause", flat=True)[:1]
            ),
            "",
        )
        for g in found[:top]
    }
    if gen is not None and ttl > 0:
        # One assignment: a concurrent scrape sees the old tuple or the new, never a mix.
        _cached = (gen, time.monotonic(), found, causes)
    return found, causes
