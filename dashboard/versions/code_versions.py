"""Code versions: what gitward learns from the workers that run.

See docs/rollouts.md#code-rollouts-bluegreen.

A worker reports its analysis code's version (``workers.analysis.CODE_VERSION``) with its
heartbeat. A code version gitward has no analyzer version of is *learned*: a version of
that code with the current configuration is registered (state ``registered``), ready to
be rolled out like a configuration (``POST /api/rollouts {"version": FP}``). Which
workers can serve a version is a matter of code: a worker loads only the versions whose
fingerprint its own code computes, so a version's workers are the live workers of its
code version (``live_workers``).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from dashboard.models import AnalyzerVersion, WorkerBeat
from dashboard.versions.state_machine import (
    QUEUE,
    RolloutError,
    VersionNotFound,
    current_version,
    physical_queue,
    register_version,
)
from workers import analysis

__all__ = [
    "find_version",
    "learn_code_version",
    "live_workers",
    "no_workers_reason",
    "version_rows",
]


def learn_code_version(
    code_version: str,
    *,
    declared: Iterable[str] = (),
    queue: str = QUEUE,
    actor: Any = "system",
) -> AnalyzerVersion | None:
    """Register the version of ``code_version`` with the current configuration (the
    deployed default on a queue without a current version) if the queue has no version
    of that code yet; return it, or None when the code was known. ``declared`` is what
    that code declares it changes (``workers.analysis.DECLARED_EFFECT``), kept on the
    version so that the result contract knows it in any process, whatever code that
    process runs (docs/rollouts.md#result-contract).

    Race: two workers of a new code register at once. Both may find no version of the
    code, but both register the same (queue, fingerprint) — the fingerprint is a function
    of the code and the current configuration — and ``register_version`` is a
    ``get_or_create`` under the unique (queue, fingerprint) constraint: one INSERT commits,
    the other reads that row back. Only a promotion to another configuration between the
    two reads gives two versions of the code, each a real configuration of it.
    """
    if (
        not code_version
        or AnalyzerVersion.objects.filter(queue=queue, code_version=code_version).exists()
    ):
        return None
    current = current_version(queue)
    config = dict(current.config) if current is not None else analysis.DEFAULT.to_dict()
    version = register_version(
        queue=queue,
        config=config,
        actor=actor,
        code_version=code_version,
        reason=f"learned: a worker runs code {code_version}",
    )
    effect = sorted(set(declared) & set(analysis.EFFECT_FIELDS))
    if effect and version.declared_effect != effect:
        # Two workers of the code racing here write the same list (it is part of the
        # code, as the code version is), so the last write is as good as the first.
        AnalyzerVersion.objects.filter(pk=version.pk).update(declared_effect=effect)
        version.declared_effect = effect
    return version


def live_workers() -> dict[str, list[dict[str, Any]]]:
    """Live worker heartbeats (not stopped, seen within ``WORKER_DEAD_AFTER``) by code
    version: ``{code_version: [{name, host, version, queues}, …]}``, names sorted
    (``queues``: what the worker listens on now, after pauses and gates)."""
    cutoff = timezone.now() - timedelta(seconds=settings.WORKER_DEAD_AFTER)
    found: dict[str, list[dict[str, Any]]] = defaultdict(list)
    rows = (
        WorkerBeat.objects.filter(stopped_at__isnull=True, last_seen__gte=cutoff)
        .order_by("name")
        .values("name", "host", "version", "code_version", "queues")
    )
    for row in rows:
        found[row["code_version"]].append(
            {
                "name": row["name"],
                "host": row["host"],
                "version": row["version"],
                "queues": [q for q in row["queues"].split(",") if q],
            }
        )
    return dict(found)


def _workers_of(version: AnalyzerVersion, live: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    mine = live.get(version.code_version, [])
    own = physical_queue(version.queue, version.fingerprint)
    return {
        "count": len(mine),
        "hosts": sorted({w["host"] for w in mine}),
        "serving": sum(1 for w in mine if own in w["queues"]),
    }


def version_rows(queue: str | None = None) -> list[dict[str, Any]]:
    """Every analyzer version (oldest first), as ``GET /api/versions`` shows it: its
    fingerprint, code version, configuration, state, ramp and live workers — the workers
    whose code can load it (``count``, ``hosts``) and how many of those listen on its
    physical queue now (``serving``: none while its gate is closed)."""
    live = live_workers()
    rows = AnalyzerVersion.objects.order_by("pk")
    if queue is not None:
        rows = rows.filter(queue=queue)
    return [
        {
            "fingerprint": v.fingerprint,
            "queue": v.queue,
            "physical_queue": physical_queue(v.queue, v.fingerprint),
            "code_version": v.code_version,
            "declared_effect": list(v.declared_effect or []),
            "config": v.config,
            "state": v.state,
            "ramp_percent": v.ramp_percent,
            "workers": _workers_of(v, live),
            "created_at": v.created_at.isoformat(),
        }
        for v in rows
    ]


def find_version(fingerprint: Any, *, queue: str = QUEUE) -> AnalyzerVersion:
    """The version of ``queue`` whose fingerprint is ``fingerprint`` or starts with it
    (4 to 64 hex digits naming exactly one). ``RolloutError`` / ``VersionNotFound``."""
    prefix = fingerprint.strip().lower() if isinstance(fingerprint, str) else ""
    if not re.fullmatch(r"[0-9a-f]{4,64}", prefix):
        raise RolloutError(f"a fingerprint is 4 to 64 hexadecimal digits, not {fingerprint!r}")
    found = list(AnalyzerVersion.objects.filter(queue=queue, fingerprint__startswith=prefix)[:2])
    if not found:
        raise VersionNotFound(
            f"no version {prefix} on {queue!r} (GET /api/versions lists them; a code version "
            "is learned when one of its workers starts)"
        )
    if len(found) > 1:
        raise RolloutError(f"{prefix} names more than one version of {queue!r}: give more digits")
    return found[0]


def no_workers_reason(version: AnalyzerVersion) -> str | None:
    """Why ``version`` cannot be warmed, ramped or promoted for want of workers, or None:
    no live worker runs its code (docs/rollouts.md#code-rollouts-bluegreen)."""
    if live_workers().get(version.code_version):
        return None
    return (
        f"{version} has no live worker: no worker runs its code {version.code_version} "
        "(start the workers of that code first, then try again)"
    )
