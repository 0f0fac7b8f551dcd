"""Drains (docs/rollouts.md): a version whose gate closed (rolled back, or superseded by a
promote) keeps its workers until nothing waits for or runs on it, checked twice.

Drain bookkeeping needs no deploy-lock token: it only records what is observed, so any
driver or the reconciler (``reconcile_drains``) can finish a drain whose driver died.
Jobs that still run ``DRAIN_STOP_AFTER`` seconds into a drain are stopped.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone
from rq.command import send_stop_job_command
from rq.registry import ScheduledJobRegistry, StartedJobRegistry

from dashboard import infra
from dashboard.models import AnalyzerVersion, JobRun, Rollout, RolloutEvent
from dashboard.rollouts.steps import locked_rollout, set_rollout_state, version_name
from dashboard.runs import crash_attempt, sweep_queue
from dashboard.versions import actor_name, do_transition, physical_queue

S = AnalyzerVersion.State


def drain_counts(version: AnalyzerVersion) -> dict[str, int]:
    """What still waits for or runs on ``version``: its physical RQ queue (queued,
    started, scheduled) and its job runs in the database (queued, running)."""

    name = physical_queue(version.queue, version.fingerprint)
    q = infra.queue(name)
    runs = JobRun.objects.filter(
        kind=JobRun.Kind.ANALYZE,
        fingerprint=version.fingerprint,
        state__in=[JobRun.State.QUEUED, JobRun.State.RUNNING],
    ).count()
    return {
        "queued": q.count,
        "started": StartedJobRegistry(queue=q).count,
        "scheduled": ScheduledJobRegistry(queue=q).count,
        "runs": runs,
    }


def sweep_leftovers(version: AnalyzerVersion) -> int:
    """Remove the leftover jobs of a draining version's physical queue (``runs.sweep_queue``:
    every job, listed or scheduled, that is not a waiting run's next attempt); returns
    how many. Without it a leftover — a second copy of an attempt the reconciler
    re-enqueued, or a job of a run that ended meanwhile — stayed in the closed queue,
    which no worker consumes, and the drain never ended: the version stayed draining
    and its rollout rolling back for ever (docs/rollouts.md#drains-and-leftover-jobs)."""
    if version.state != S.DRAINING:
        return 0
    return sweep_queue(physical_queue(version.queue, version.fingerprint))


def check_version_drain(
    *,
    version: AnalyzerVersion | int,
    actor: Any,
    rollout: Rollout | None = None,
    token: int | None = None,
    counts: Mapping[str, int] | None = None,
) -> bool:
    """One drain check of a draining version; True once it is drained.

    Drained only when this check *and the previous one since it entered draining* found
    nothing queued, started, scheduled or running (an unknown or a single empty reading
    never counts: temporal-worker-controller #573). Needs no deploy-lock token: it only
    records what is observed, so a reconciler can finish a drain whose driver died.
    Race: a job enqueued between the two checks shows on the second one (not empty), so
    the count starts over; the version is closed to routing, so nothing new is routed.
    """
    pk = version if isinstance(version, int) else version.pk
    with transaction.atomic():
        # Lock order (as ``do_transition``'s): the rollout row (``check_drain`` locked
        # it), then every version of the queue by pk — never this row alone first. A
        # lone row lock here, then ``do_transition`` locking the queue's versions in pk
        # order, deadlocked on PostgreSQL against a transition of the same queue that
        # holds a lower pk and waits for this row (docs/rollouts.md#lock-order).
        queue = AnalyzerVersion.objects.values_list("queue", flat=True).get(pk=pk)
        rows = {
            v.pk: v
            for v in AnalyzerVersion.objects.select_for_update().filter(queue=queue).order_by("pk")
        }
        row = rows[pk]
        if row.state != S.DRAINING:
            return row.state in {S.DRAINED, S.RETIRED}
        if counts is None:
            sweep_leftovers(row)
        seen = dict(counts) if counts is not None else drain_counts(row)
        empty = not any(seen.values())
        checks = RolloutEvent.objects.filter(version=row, action="drain.check")
        if row.state_changed_at is not None:
            checks = checks.filter(at__gte=row.state_changed_at)
        last = checks.order_by("-at", "-id").first()
        RolloutEvent.objects.create(
            rollout=rollout,
            version=row,
            action="drain.check",
            actor=actor_name(actor),
            token=token,
            detail={"counts": seen, "empty": empty},
        )
        if not (empty and last is not None and last.detail.get("empty") is True):
            return False
        do_transition(
            version=row,
            to=S.DRAINED,
            actor=actor,
            token=token,
            rollout=rollout,
            reason="empty on two checks",
            detail={"counts": seen},
        )
    return True


def check_drain(
    *,
    rollout: Rollout | int,
    token: int | None,
    actor: Any,
    counts: Mapping[str, int] | None = None,
) -> bool:
    """Drain check of a rolling-back rollout's version; once it is drained the rollout
    becomes ``rolled_back`` (the holder then releases the lock)."""
    with transaction.atomic():
        ro = locked_rollout(rollout)
        drained = check_version_drain(
            version=ro.version_id, actor=actor, rollout=ro, token=token, counts=counts
        )
        if drained and ro.state == Rollout.State.ROLLING_BACK:
            set_rollout_state(
                rollout=ro,
                to=Rollout.State.ROLLED_BACK,
                actor=actor,
                token=token,
                reason="drained",
                outcome=f"rolled back to {version_name(ro.previous)}",
            )
    return drained


#: A draining version's jobs still running after this many seconds are stopped.
DRAIN_STOP_AFTER = 300.0


def stop_overdue(*, version: AnalyzerVersion, stop_after: float = DRAIN_STOP_AFTER) -> int:
    """Stop the running jobs of a version draining for more than ``stop_after`` s.

    Each attempt is first recorded as crashed (a conditional UPDATE from running: if it
    finished meanwhile nothing happens), so its retry meets the closed gate and is
    cancelled (``runs.enqueue_run``); then RQ is told to kill its work horse. A write the
    horse commits between the two is a correct result of the closed version, never
    another version's. Returns how many were stopped."""
    since = version.state_changed_at
    if since is None or timezone.now() - since < timedelta(seconds=stop_after):
        return 0
    stopped = 0
    for run in JobRun.objects.filter(
        kind=JobRun.Kind.ANALYZE, fingerprint=version.fingerprint, state=JobRun.State.RUNNING
    ):
        reason = f"stopped: its analyzer version drained for more than {stop_after:.0f}s"
        if not crash_attempt(run_id=run.pk, number=run.attempts, reason=reason):
            continue
        stopped += 1
        with contextlib.suppress(Exception):  # not running in RQ any more: nothing to stop
            send_stop_job_command(infra.connection(), run.rq_id(run.attempts))
    return stopped


def reconcile_drains(*, actor: Any = "reconciler", stop_after: float = DRAIN_STOP_AFTER) -> int:
    """One drain check of every draining version (superseded ones after a promote,
    and those of rollbacks whose driver died), after stopping jobs that run past
    ``stop_after`` (``stop_overdue``); returns how many became drained."""
    done = 0
    for version in AnalyzerVersion.objects.filter(state=S.DRAINING):
        stop_overdue(version=version, stop_after=stop_after)
    for pk in AnalyzerVersion.objects.filter(state=S.DRAINING).values_list("pk", flat=True):
        ro = Rollout.objects.filter(version_id=pk, state=Rollout.State.ROLLING_BACK).first()
        if ro is not None:
            done += check_drain(rollout=ro, token=None, actor=actor)
        else:
            done += check_version_drain(version=pk, actor=actor)
    return done
