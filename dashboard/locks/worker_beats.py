"""Worker heartbeats: one ``WorkerBeat`` row per worker process, in the database so a
dead worker is noticed even if Redis was flushed.

A worker is live while its row is not stopped and was seen within
``settings.WORKER_DEAD_AFTER`` seconds. Emits ``worker.heartbeat`` on every beat.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from dashboard.infra import publish_event
from dashboard.models import JobRun, WorkerBeat
from workers.analysis import CODE_VERSION, DEFAULT


def beat(
    *, name: str, queues_: list[str], version: str | None = None, code_version: str = ""
) -> None:
    """Refresh a worker's heartbeat row (called every few seconds by the worker);
    ``version`` is the fingerprint of the analyzer the worker loaded, ``code_version``
    its analysis code's version (docs/rollouts.md#code-rollouts-bluegreen)."""
    now = timezone.now()
    rss = _rss_of_tree(os.getpid())
    publish_event("worker.heartbeat", {"worker": name, "last_seen": now.isoformat(), "rss": rss})
    updated = WorkerBeat.objects.filter(name=name).update(last_seen=now, stopped_at=None, rss=rss)
    if not updated:
        WorkerBeat.objects.get_or_create(
            name=name,
            defaults={
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "version": version or DEFAULT.fingerprint(),
                "code_version": code_version or CODE_VERSION,
                "queues": ",".join(queues_),
                "last_seen": now,
            },
        )


def _rss_of_tree(pid: int) -> int:
    """Resident bytes of ``pid`` and its direct children (the work horse), from /proc."""
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    try:
        pids = [pid] + [
            int(p)
            for p in open(f"/proc/{pid}/task/{pid}/children").read().split()  # noqa: SIM115
        ]
    except OSError:
        pids = [pid]
    for p in pids:
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * page
        except (OSError, ValueError, IndexError):
            continue
    return total


def set_queues(name: str, queues_: list[str]) -> None:
    """The queues a worker listens on right now (they change with pauses and gates)."""
    WorkerBeat.objects.filter(name=name).update(queues=",".join(queues_)[:500])


def stop_beat(name: str) -> None:
    """The worker stopped cleanly: it is no longer live and runs nothing."""
    WorkerBeat.objects.filter(name=name).update(stopped_at=timezone.now(), current_run=None)


def live_worker_names() -> set[str]:
    cutoff = timezone.now() - timedelta(seconds=settings.WORKER_DEAD_AFTER)
    return set(
        WorkerBeat.objects.filter(stopped_at__isnull=True, last_seen__gte=cutoff).values_list(
            "name", flat=True
        )
    )


def orphaned_runs() -> list[JobRun]:
    """Runs marked running whose worker's heartbeat is gone: stopped, stale, or never
    seen (a run started more than WORKER_DEAD_AFTER ago by an unknown worker)."""
    cutoff = timezone.now() - timedelta(seconds=settings.WORKER_DEAD_AFTER)
    live = live_worker_names()
    return [
        run
        for run in JobRun.objects.filter(state=JobRun.State.RUNNING)
        if run.worker not in live and (run.started_at is None or run.started_at < cutoff)
    ]


def worker_rows(*, limit: int = 200) -> list[dict[str, Any]]:
    """The Workers table: newest heartbeat first, state idle | busy | dead | stopped."""
    now = timezone.now()
    cutoff = now - timedelta(seconds=settings.WORKER_DEAD_AFTER)
    rows = []
    beats = WorkerBeat.objects.select_related("current_run").order_by("-last_seen")[:limit]
    for w in beats:
        run = w.current_run
        if w.stopped_at:
            state = "stopped"
        elif w.last_seen < cutoff:
            state = "dead"
        else:
            state = "busy" if run else "idle"
        rows.append(
            {
                "name": w.name,
                "host": w.host,
                "pid": w.pid,
                "version": w.version,
                "code_version": w.code_version,
                "state": state,
                "dead": state == "dead",
                "rss_mb": round(w.rss / 2**20, 1) if w.rss else None,
                "job": run.job_id if run else None,
                "job_started_at": run.started_at.isoformat() if run and run.started_at else None,
                "last_seen": w.last_seen.isoformat(),
            }
        )
    return rows
