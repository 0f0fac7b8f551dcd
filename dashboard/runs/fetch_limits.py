"""Per-git-host fetch limits as the job layer, the Workers page, the metrics and "why is
this waiting" see them (docs/scheduling.md#per-host-fetch-limits): the deployment's
:class:`~workers.git.FetchGate` over the queue Redis (which publishes ``fetch.changed``
whenever it takes or lets go of a slot, starts a wait or records a backoff, so the live
Workers page asks for a new snapshot: docs/live-view.md), each limited host's status and
the Git hosts table's rows (:func:`fetch_host_rows`, in the operations snapshot), and
:func:`fetch_wait_reason`, the reason provider for one repository."""

from __future__ import annotations

import os
import re
import time
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings

from dashboard import infra
from dashboard.models import Repository
from workers.git import FetchGate, HostStatus, host_status, known_hosts, wait_reason

__all__ = ["fetch_gate", "fetch_host_rows", "fetch_wait_reason", "host_of", "host_statuses"]

_SCP = re.compile(r"^[^/@:]+@([^:/]+):")


def fetch_gate() -> FetchGate:
    """The gate every clone and fetch of this process passes (``workers.jobs._fetch``)."""
    return FetchGate(
        infra.connection(),
        settings.FETCH_LIMITS,
        wait=settings.FETCH_SLOT_WAIT,
        lease=settings.FETCH_SLOT_LEASE,
        backoff=settings.FETCH_BACKOFF,
        holder=f"{settings.HOST_ID}.{os.getpid()}",
        on_change=_publish_change,
    )


def _publish_change(host: str) -> None:
    """``fetch.changed`` to the operators: their Workers page asks for a snapshot (at
    most one a second, like every aggregate) and redraws the Git hosts table. The
    queue server down: the event is dropped (``publish_event`` never fails)."""
    infra.publish_event("fetch.changed", {"host": host})


def host_of(url: str) -> str | None:
    """The remote host a repository URL names, lower-case (None: a local path)."""
    if "://" in url:
        if url.startswith("file:"):
            return None
        return (urlsplit(url).hostname or "").lower() or None
    m = _SCP.match(url)
    return m.group(1).lower() if m else None


def fetch_wait_reason(repository: Repository) -> str | None:
    """Why a fetch of ``repository`` would wait now: ``host limit github.com 4/4``, ``host
    github.com backing off until 14:05:10 UTC``; None if it would not (or its host is
    not limited, or the queue server does not answer). For "why is this waiting"."""
    host = host_of(repository.fetch_url or repository.url)
    if host is None:
        return None
    try:
        return wait_reason(infra.connection(), host, settings.FETCH_LIMITS)
    except Exception:
        return None


def host_statuses() -> list[HostStatus]:
    """Every host fetched under a limit so far, with its use now (Workers page, metrics).
    Raises the queue server's error when it is down (the caller shows that)."""
    conn = infra.connection()
    return [host_status(conn, h, settings.FETCH_LIMITS) for h in known_hosts(conn)]


def fetch_host_rows() -> list[dict[str, Any]] | None:
    """The Workers page's Git hosts table, JSON-safe (it rides in the operations
    snapshot, docs/live-view.md): per limited host its cap, slots in use, waiters, token
    bucket (rate, burst, tokens now) and backoff (epoch seconds and ``HH:MM:SS`` UTC);
    None while the queue server does not answer (the page's banner says why)."""
    try:
        statuses = host_statuses()
    except Exception:  # down or stalled: the snapshot says so elsewhere
        return None
    return [
        {
            "host": s.host,
            "in_use": s.in_use,
            "limit": s.limit.concurrency,
            "rate": s.limit.rate,
            "burst": s.limit.burst,
            "tokens": None if s.tokens is None else round(s.tokens, 1),
            "waiting": s.waiting,
            "backoff_until": s.backoff_until,
            "backoff_text": (
                time.strftime("%H:%M:%S", time.gmtime(s.backoff_until)) if s.backoff_until else None
            ),
            "text": s.text(),
        }
        for s in statuses
    ]
