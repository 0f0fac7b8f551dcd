"""Per-git-host fetch limits as the job layer, the Workers page, the metrics and "why is
this waiting" see them (docs/scheduling.md#per-host-fetch-limits): the deployment's
:class:`~workers.git.FetchGate` over the queue Redis, each limited host's status, and
:func:`fetch_wait_reason`, the reason provider for one repository."""

from __future__ import annotations

import os
import re
from urllib.parse import urlsplit

from django.conf import settings

from dashboard import infra
from dashboard.models import Repository
from workers.git import FetchGate, HostStatus, host_status, known_hosts, wait_reason

__all__ = ["fetch_gate", "fetch_wait_reason", "host_of", "host_statuses"]

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
    )


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
