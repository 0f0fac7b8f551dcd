"""Rollouts (DESIGN §7): one attempt to bring an analyzer version live on a queue.

A rollout owns the queue's deploy lock through a driver (``dashboard.deploylock``); the
functions below that take ``token`` are the driver's steps, each one transaction that
moves the version through ``dashboard.versions.do_transition`` (which checks the token).
Operators' actions reach the driver through :func:`request_action`.

The version-level names (``do_transition``, ``register_version``, errors, states) are
re-exported here so callers need one import.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone
from rq.command import send_stop_job_command
from rq.exceptions import DuplicateJobError

from dashboard import leases, queues
from dashboard.models import AnalyzerVersion, JobRun, Rollout, RolloutEvent
from dashboard.plans import enqueue_catch_up
from dashboard.runs import cancel_runs, crash_attempt
from dashboard.versions import (
    ALLOWED,
    QUEUE,
    ROUTABLE,
    STAFFED,
    TOKENLESS,
    InvalidConfig,
    InvalidTransition,
    RolloutBusy,
    RolloutConflict,
    RolloutError,
    actor_name,
    check_fence,
    check_version_drain,
    current_version,
    describe_lock,
    do_transition,
    drain_counts,
    ensure_baseline,
    fingerprint_config,
    physical_queue,
    publish_rollout_event,
    ramping_version,
    record_event,
    register_version,
    served_fingerprint,
)
from workers import lockkeys

__all__ = [
    "ALLOWED", "QUEUE", "ROUTABLE", "STAFFED", "TOKENLESS", "InvalidConfig",
    "InvalidTransition", "RolloutBusy", "RolloutConflict", "RolloutError", "actor_name",
    "check_version_drain", "current_version", "describe_lock", "do_transition", "drain_counts",
    "ensure_baseline",
    "fingerprint_config", "physical_queue", "ramping_version", "register_version",
]  # fmt: skip

DEFAULT_STEPS = (10, 50, 100)
#: The Redis queue rollout drivers run on (``dashboard.deploylock.drive_rollout``).
DRIVER_QUEUE = "rollouts"
S = AnalyzerVersion.State


def active_rollout(queue: str = QUEUE) -> Rollout | None:
    return Rollout.objects.filter(queue=queue, state__in=Rollout.ACTIVE_STATES).first()


def _describe_holder(ro: Rollout) -> str:
    if ro.lock_since is not None:
        return (
            f"rollout #{ro.pk} of {ro.queue}@{ro.version.fp12} (started by {ro.started_by}); "
            f"deploy lock held by {ro.lock_holder} since {ro.lock_since.isoformat()}"
        )
    return (
        f"rollout #{ro.pk} of {ro.queue}@{ro.version.fp12}, started by {ro.lock_holder} "
        f"since {ro.created_at.isoformat()} (its driver has not taken the deploy lock yet)"
    )


def busy_message(queue: str) -> str | None:
    """Why a new rollout of ``queue`` would be refused now, or None."""
    ro = active_rollout(queue)
    if ro is not None:
        return f"{queue!r} is already being rolled out: {_describe_holder(ro)}"
    return None


def _lock_busy_message(queue: str) -> str | None:
    """A deploy lock held in Redis without an active rollout (a baseline adoption, or
    an operator's manual hold): refused too, naming its holder."""

    info = leases.redlock().inspect(lockkeys.deploy(queue))
    if info is None:
        return None
    return f"the deploy lock of {queue!r} is held by {describe_lock(info)}"


OPTIONS = {"step_pause": 60.0, "min_samples": 20, "warm_timeout": 600.0}


def validate_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """Driver knobs with their defaults (``OPTIONS``); unknown or negative ones refused."""
    out = dict(OPTIONS)
    for key, value in (options or {}).items():
        if key not in OPTIONS:
            raise RolloutError(f"unknown rollout option {key!r}")
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise RolloutError(f"{key} must be a non-negative number, not {value!r}")
        out[key] = type(OPTIONS[key])(value)
    return out


def validate_steps(steps: Sequence[int] | None) -> list[int]:
    chosen = list(DEFAULT_STEPS if steps is None else steps)
    if not chosen:
        raise RolloutError("steps must name at least one ramp percentage")
    if any(not isinstance(s, int) or isinstance(s, bool) or not 1 <= s <= 100 for s in chosen):
        raise RolloutError(f"steps must be percentages 1..100, not {chosen}")
    if any(b <= a for a, b in itertools.pairwise(chosen)):
        raise RolloutError(f"steps must increase, not {chosen}")
    return chosen


def start_rollout(
    *,
    queue: str = QUEUE,
    config: Mapping[str, Any],
    steps: Sequence[int] | None = None,
    auto: bool = False,
    actor: Any,
    warm_set: Mapping[str, Any] | None = None,
    options: Mapping[str, Any] | None = None,
    enqueue_driver: bool = True,
) -> Rollout:
    """Create a rollout of ``config`` on ``queue`` in state ``pending``; refuse at once if
    the queue already has one (``RolloutBusy`` naming its holder and since when).

    1. Validate config, steps and options; the config must not be the current
       version's (a queue without one first adopts the deployed default: the baseline).
    2. Refuse if an active rollout row exists for the queue, or its deploy lock is held.
       Then register the version (idempotent); it must be registered, warm_failed or
       drained (startable).
    3. Create the row. Race: two starts at once both pass step 2; the partial unique
       constraint ``rollout_one_active_per_queue`` lets exactly one INSERT commit and
       the loser (IntegrityError) is refused naming the winner.
    4. After commit, enqueue the driver (``dashboard.deploylock.drive_rollout``) on the
       ``rollouts`` queue; it takes ``locks:queue:{queue}:deploy`` and moves the rollout
       to ``active``. ``enqueue_driver=False`` leaves that to the caller (tests, or
       ``manage.py rollout drive``).
    """
    chosen = validate_steps(steps)
    knobs = validate_options(options)
    fp, _ = fingerprint_config(config)
    current = current_version(queue) or ensure_baseline(queue=queue, actor=actor)
    if current is not None and current.fingerprint == fp:
        raise RolloutError(f"{current} is already current: nothing to roll out")
    # Refused before anything is written: a refused start leaves no trace but its message.
    busy = busy_message(queue) or _lock_busy_message(queue)
    if busy:
        raise RolloutBusy(busy)
    version = register_version(queue=queue, config=config, actor=actor)
    if version.state not in {S.REGISTERED, S.WARM_FAILED, S.DRAINED}:
        raise RolloutError(f"{version} cannot be rolled out from state {version.state}")
    who = f"{actor_name(actor)}@{socket.gethostname()}"
    try:
        with transaction.atomic():
            ro = Rollout.objects.create(
                queue=queue,
                version=version,
                previous=current_version(queue),
                steps=chosen,
                auto=auto,
                started_by=actor_name(actor),
                lock_holder=who,
                warm_set=dict(warm_set or {}),
                options=knobs,
            )
            record_event(
                ro,
                version,
                "rollout",
                "",
                Rollout.State.PENDING,
                actor,
                "started",
                None,
                {"steps": chosen, "auto": auto, "config": version.config},
            )
            publish_rollout_event(version, ro, Rollout.State.PENDING)
            if enqueue_driver:
                transaction.on_commit(lambda: enqueue_driver_job(ro.pk))
    except IntegrityError:
        busy = busy_message(queue)
        raise RolloutBusy(busy or f"{queue!r} is already being rolled out") from None
    return ro


def enqueue_driver_job(rollout_id: int, *, takeover: bool = False, actor: str = "system") -> bool:
    """Put the rollout's driver on the ``rollouts`` queue; False if that job exists.

    The id is deterministic (one driver job per rollout and mode) and the enqueue is
    RQ's ``unique`` one (check-and-save in one script), so two enqueuers give one job.
    No job timeout: the driver lives as long as the rollout (its lease, not RQ, bounds
    a dead one).
    """

    mode = "takeover" if takeover else "start"
    try:
        queues.queue(DRIVER_QUEUE).enqueue(
            "dashboard.deploylock.drive_rollout",
            rollout_id,
            takeover,
            actor,
            job_id=f"rollout-{rollout_id}-{mode}",
            job_timeout=-1,
            unique=True,
            result_ttl=3600,
            failure_ttl=7 * 24 * 3600,
        )
    except DuplicateJobError:
        return False
    return True


def set_rollout_state(
    *,
    rollout: Rollout,
    to: str,
    actor: Any,
    token: int | None,
    reason: str = "",
    detail: Mapping[str, Any] | None = None,
    outcome: str | None = None,
) -> Rollout:
    """Change the rollout's own state (pending/active/rolling_back/terminal), recorded.

    Called inside the holder's transaction; terminal states stamp ``finished_at``.
    """
    src = rollout.state
    if src == to:
        return rollout
    if src not in Rollout.ACTIVE_STATES:
        raise InvalidTransition(f"rollout #{rollout.pk} is already {src}")
    rollout.state = to
    fields = ["state", "updated_at"]
    if to not in Rollout.ACTIVE_STATES:
        rollout.finished_at = timezone.now()
        fields.append("finished_at")
    if outcome is not None:
        rollout.outcome = outcome
        fields.append("outcome")
    rollout.save(update_fields=fields)
    record_event(rollout, rollout.version, "rollout", src, to, actor, reason, token, detail)
    publish_rollout_event(rollout.version, rollout, to)
    return rollout


def _locked_rollout(rollout: Rollout | int) -> Rollout:
    pk = rollout if isinstance(rollout, int) else rollout.pk
    return (
        Rollout.objects.select_for_update(of=("self",))
        .select_related("version", "previous")
        .get(pk=pk)
    )


def begin_warming(*, rollout: Rollout | int, token: int, actor: Any) -> Rollout:
    """registered | warm_failed | drained → warming (the holder then analyses the warm set)."""
    with transaction.atomic():
        ro = _locked_rollout(rollout)
        do_transition(
            version=ro.version_id,
            to=S.WARMING,
            actor=actor,
            token=token,
            rollout=ro,
            detail={"warm_set": _warm_summary(ro.warm_set)},
        )
    return Rollout.objects.get(pk=ro.pk)


def _warm_summary(warm_set: Mapping[str, Any]) -> dict[str, Any]:
    items = warm_set.get("items") or []
    return {
        "repositories": len(items),
        "commits": sum(len(shas) for _, shas in items),
        "threshold": warm_set.get("threshold"),
    }


def record_verdict(
    *, rollout: Rollout | int, verdict: Mapping[str, Any], token: int, actor: Any
) -> Rollout:
    """Store the warming verdict: warming → verified if it passed, else → warm_failed
    and the rollout fails (routing untouched: nothing was ever routed to the version)."""
    with transaction.atomic():
        ro = _locked_rollout(rollout)
        ro.verdict = dict(verdict)
        ro.save(update_fields=["verdict", "updated_at"])
        record_event(
            ro,
            ro.version,
            "verdict",
            "",
            "",
            actor,
            verdict.get("summary", ""),
            token,
            {"verdict": dict(verdict)},
        )
        ok = verdict.get("ok") is True
        do_transition(
            version=ro.version_id,
            to=S.VERIFIED if ok else S.WARM_FAILED,
            actor=actor,
            token=token,
            rollout=ro,
            detail={"verdict": dict(verdict)},
        )
        if not ok:
            set_rollout_state(
                rollout=ro,
                to=Rollout.State.FAILED,
                actor=actor,
                token=token,
                reason="warming gate failed",
                outcome=str(verdict.get("summary", "warming gate failed")),
            )
    return Rollout.objects.get(pk=ro.pk)


def record_diff(
    *, rollout: Rollout | int, diff: Mapping[str, Any], token: int, actor: Any
) -> Rollout:
    with transaction.atomic():
        ro = _locked_rollout(rollout)
        check_fence(ro.queue, ro, token)
        ro.diff = dict(diff)
        ro.save(update_fields=["diff", "updated_at"])
        record_event(
            ro,
            ro.version,
            "diff",
            "",
            "",
            actor,
            str(diff.get("summary", "")),
            token,
            {"summary": diff.get("summary"), "commits_changed": diff.get("commits_changed")},
        )
    return Rollout.objects.get(pk=ro.pk)


def set_ramp(*, rollout: Rollout | int, percent: int, token: int, actor: Any) -> Rollout:
    """verified | ramping → ramping(percent): that share of new work now goes to the
    version (``dashboard.canary.route``)."""
    with transaction.atomic():
        ro = _locked_rollout(rollout)
        do_transition(
            version=ro.version_id,
            to=S.RAMPING,
            actor=actor,
            token=token,
            rollout=ro,
            ramp_percent=percent,
        )
        index = ro.steps.index(percent) if percent in ro.steps else ro.step_index
        ro.step_index = index
        ro.step_started_at = timezone.now()
        ro.save(update_fields=["step_index", "step_started_at", "updated_at"])
    return Rollout.objects.get(pk=ro.pk)


def promote(*, rollout: Rollout | int, token: int, actor: Any) -> Rollout:
    """ramping → current (the previous current → draining, in the same transaction);
    the rollout completes. The driver then releases the deploy lock."""
    with transaction.atomic():
        ro = _locked_rollout(rollout)
        do_transition(
            version=ro.version_id,
            to=S.CURRENT,
            actor=actor,
            token=token,
            rollout=ro,
            reason="promoted",
        )
        set_rollout_state(
            rollout=ro,
            to=Rollout.State.COMPLETED,
            actor=actor,
            token=token,
            reason="promoted",
            outcome=f"{ro.version} is current",
        )
        closed = [ro.previous.fingerprint] if ro.previous is not None else []
        served = ro.version.fingerprint
        transaction.on_commit(lambda: rerouted(closed=closed, served=served, rollout=ro.pk))
    return Rollout.objects.get(pk=ro.pk)


def rerouted(*, closed: Sequence[str], served: str, rollout: int | None = None) -> dict[str, int]:
    """After a promote or rollback committed: cancel the queued work of the versions
    whose gate just closed (``runs.cancel_runs``; their workers take no job, and the
    served version has its own plan) and start the catch-up that brings every
    repository up to date under the served fingerprint (``plans.catch_up``: batches on
    the maintenance queue, deduplicated). Recorded on the rollout's timeline."""
    cancelled = {fp: cancel_runs(fingerprint=fp, reason="analyzer version closed") for fp in closed}
    enqueue_catch_up(served)
    if rollout is not None:
        ro = Rollout.objects.select_related("version").get(pk=rollout)
        with transaction.atomic():
            record_event(
                ro, ro.version, "jobs.moved", "", "", "system",
                f"cancelled {sum(cancelled.values())} queued job(s); catch-up of {served[:12]}",
                None, {"cancelled": cancelled, "catch_up": served},
            )  # fmt: skip
    return cancelled


def rollback(*, rollout: Rollout | int, token: int, actor: Any, reason: str = "") -> Rollout:
    """Route back to the previous version at once; the new one starts draining.

    * new version warming / warm_failed / verified / ramping: it → draining; the
      previous version is still current, so routing is back the moment this commits.
    * new version current (after promote): previous → current, which supersedes the new
      one → draining in the same transaction; the previous results are still stored, so
      they are served at once.

    The rollout becomes ``rolling_back`` until :func:`check_drain` sees the new version
    empty twice; a completed rollout (promoted, lock released) can be rolled back by a
    holder that re-took the deploy lock.
    """
    with transaction.atomic():
        ro = _locked_rollout(rollout)
        version = AnalyzerVersion.objects.get(pk=ro.version_id)
        why = reason or "rollback"
        if version.state == S.CURRENT:
            if ro.previous_id is None:
                raise InvalidTransition(f"{version} has no previous version to roll back to")
            do_transition(
                version=ro.previous_id,
                to=S.CURRENT,
                actor=actor,
                token=token,
                rollout=ro,
                reason=why,
            )
        elif version.state in {S.WARMING, S.WARM_FAILED, S.VERIFIED, S.RAMPING}:
            do_transition(
                version=version, to=S.DRAINING, actor=actor, token=token, rollout=ro, reason=why
            )
        elif version.state != S.DRAINING:
            raise InvalidTransition(f"{version} cannot be rolled back from {version.state}")
        if ro.state == Rollout.State.COMPLETED:
            # Re-opened by a rollback after promote: the partial unique constraint refuses
            # it if another rollout of the queue is active meanwhile.
            ro.state, ro.finished_at = Rollout.State.ACTIVE, None
            ro.save(update_fields=["state", "finished_at", "updated_at"])
        set_rollout_state(
            rollout=ro, to=Rollout.State.ROLLING_BACK, actor=actor, token=token, reason=why
        )
        closed = [version.fingerprint]
        served = served_fingerprint(ro.queue)
        transaction.on_commit(lambda: rerouted(closed=closed, served=served, rollout=ro.pk))
    return Rollout.objects.get(pk=ro.pk)


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
        ro = _locked_rollout(rollout)
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
                outcome=f"rolled back to {ro.previous}",
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
            send_stop_job_command(queues.connection(), run.rq_id(run.attempts))
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


# ---------------------------------------------------------------------------- operator actions

ACTIONS = frozenset({"promote", "rollback", "set_ramp", "abort"})


def request_action(
    *, rollout: Rollout | int, action: str, actor: Any, params: Mapping[str, Any] | None = None
) -> Rollout:
    """Ask the rollout's driver (the deploy-lock holder) to ``promote``, ``rollback``,
    ``set_ramp`` (``params={"percent": p}``) or ``abort``; it runs it with its token
    within a poll interval. One request at a time: a conditional UPDATE on an empty
    ``pending_action`` makes two operators' clicks give one request and one refusal.
    """
    if action not in ACTIONS:
        raise RolloutError(f"unknown action {action!r}")
    pk = rollout if isinstance(rollout, int) else rollout.pk
    request = {
        "action": action,
        "actor": actor_name(actor),
        "params": dict(params or {}),
        "at": timezone.now().isoformat(),
    }
    with transaction.atomic():
        updated = Rollout.objects.filter(
            pk=pk, state__in=Rollout.ACTIVE_STATES, pending_action__isnull=True
        ).update(pending_action=request, updated_at=timezone.now())
        ro = Rollout.objects.select_related("version").get(pk=pk)
        if not updated:
            if not ro.is_active:
                raise RolloutError(f"rollout #{pk} is {ro.state}: nothing to {action}")
            raise RolloutBusy(f"rollout #{pk} already has a pending request: {ro.pending_action}")
        record_event(ro, ro.version, "action.requested", "", "", actor, action, None, request)
    return ro


def events(rollout: Rollout) -> Iterable[RolloutEvent]:
    return RolloutEvent.objects.filter(rollout=rollout).order_by("at", "id")
