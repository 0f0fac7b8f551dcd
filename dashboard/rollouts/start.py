"""Rollouts (docs/rollouts.md): one attempt to bring an analyzer version live on a queue.

This module starts a rollout (``start_rollout``: validated, refused while the queue is
busy, its driver enqueued) and takes operators' requests to its driver
(``request_action``). A rollout owns the queue's deploy lock through a driver
(``dashboard.rollouts.deploy_lock``); the driver's steps, each one transaction that moves the
version through ``dashboard.versions.state_machine.do_transition`` (which checks the token), are in
``dashboard.rollouts.steps``; drains in ``dashboard.rollouts.drains``.
"""

from __future__ import annotations

import itertools
import logging
import socket
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone
from rq.exceptions import DuplicateJobError
from rq.job import Job

from dashboard import infra, locks
from dashboard.models import AnalyzerVersion, Rollout, RolloutEvent
from dashboard.rollouts.checks import validate_checks
from dashboard.rollouts.freeze import refuse_frozen_request, refuse_if_frozen
from dashboard.versions import (
    QUEUE,
    InvalidTransition,
    RolloutBusy,
    RolloutError,
    actor_name,
    current_version,
    describe_lock,
    ensure_baseline,
    find_version,
    fingerprint_config,
    no_workers_reason,
    publish_rollout_event,
    record_event,
    register_version,
)
from workers import locks as workers_locks

DEFAULT_STEPS = (10, 50, 100)
#: Version states a rollout may start from (a re-activation starts from drained).
STARTABLE = frozenset(
    {
        AnalyzerVersion.State.REGISTERED,
        AnalyzerVersion.State.WARM_FAILED,
        AnalyzerVersion.State.DRAINED,
    }
)
#: The Redis queue rollout drivers run on (``workers.jobs.drive_rollout``).
DRIVER_QUEUE = "rollouts"

log = logging.getLogger(__name__)
S = AnalyzerVersion.State


def active_rollout(queue: str = QUEUE) -> Rollout | None:
    return Rollout.objects.filter(queue=queue, state__in=Rollout.ACTIVE_STATES).first()


def ended_state(rollout_id: int) -> str | None:
    """The rollout's state if it has ended, else None (also for no such rollout: the
    driver then fails on it, naming it)."""
    state = Rollout.objects.filter(pk=rollout_id).values_list("state", flat=True).first()
    return None if state is None or state in Rollout.ACTIVE_STATES else str(state)


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

    info = locks.redlock().inspect(workers_locks.deploy(queue))
    if info is None:
        return None
    return f"the deploy lock of {queue!r} is held by {describe_lock(info)}"


OPTIONS: dict[str, Any] = {
    "step_pause": 60.0,
    "min_samples": 20,
    "warm_timeout": 600.0,
    # docs/rollouts.md#step-deadlines: how long a step may stay inconclusive, what then,
    # and how many shadow commits the driver may send to the canary per step.
    "step_deadline": 900.0,
    "on_inconclusive": "pause",
    "shadow_commits": 50,
    # docs/rollouts.md#checks-and-gates: this rollout's own PromQL checks.
    "checks": [],
}
#: What an inconclusive step does at its deadline (``on_inconclusive``).
POLICIES = ("pause", "fail")


def validate_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """Driver knobs with their defaults (``OPTIONS``); unknown or negative ones refused,
    ``on_inconclusive`` one of ``POLICIES``."""
    out = dict(OPTIONS)
    for key, value in (options or {}).items():
        if key not in OPTIONS:
            raise RolloutError(f"unknown rollout option {key!r}")
        if key == "checks":
            try:
                out[key] = validate_checks(value)
            except ValueError as exc:
                raise RolloutError(str(exc)) from None
            continue
        if key == "on_inconclusive":
            if value not in POLICIES:
                raise RolloutError(f"on_inconclusive must be one of pause, fail, not {value!r}")
            out[key] = value
            continue
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


def _code_rollout_without_workers(
    version: AnalyzerVersion, base: AnalyzerVersion | None
) -> str | None:
    """Why a *code* rollout (its version's code differs from ``base``'s, the version it
    replaces) cannot go on: no live worker runs its code, so nothing could warm, ramp or
    serve it (docs/rollouts.md#code-rollouts-bluegreen). None for a configuration
    rollout, or while workers of the code live."""
    if base is None or version.code_version == base.code_version:
        return None
    return no_workers_reason(version)


def start_rollout(
    *,
    queue: str = QUEUE,
    config: Mapping[str, Any] | None = None,
    version: str | None = None,
    steps: Sequence[int] | None = None,
    auto: bool = False,
    actor: Any,
    warm_set: Mapping[str, Any] | None = None,
    options: Mapping[str, Any] | None = None,
    enqueue_driver: bool = True,
) -> Rollout:
    """Create a rollout of ``config`` (a configuration of this process's code) or of the
    known ``version`` (a fingerprint or a prefix of one: a code rollout of a version
    learned from its workers, docs/rollouts.md#code-rollouts-bluegreen) on ``queue`` in
    state ``pending``; refuse at once if the queue already has one (``RolloutBusy``
    naming its holder and since when).

    1. Validate config, steps and options; the config must not be the current
       version's (a queue without one first adopts the deployed default: the baseline).
       A version of another code than the current one's needs a live worker of its code.
    2. Refuse if an active rollout row exists for the queue, or its deploy lock is held.
       Then register the version (idempotent); it must be registered, warm_failed or
       drained (startable).
    3. Create the row. Race: two starts at once both pass step 2; the partial unique
       constraint ``rollout_one_active_per_queue`` lets exactly one INSERT commit and
       the loser (IntegrityError) is refused naming the winner.
    4. After commit, enqueue the driver (``workers.jobs.drive_rollout``) on the
       ``rollouts`` queue; it takes ``locks:queue:{queue}:deploy`` and moves the rollout
       to ``active``. ``enqueue_driver=False`` leaves that to the caller (tests, or
       ``manage.py rollout drive``). With the queue server unreachable the rollout
       stays pending and the reconciler enqueues its driver once the server answers
       (:func:`reconcile_pending_drivers`).
    """
    chosen = validate_steps(steps)
    knobs = validate_options(options)
    refuse_if_frozen("start")  # docs/rollouts.md#freeze-windows: a 409 naming the window
    if (config is None) == (version is None):
        raise RolloutError("give either a configuration or a version's fingerprint to roll out")
    known = find_version(version, queue=queue) if version is not None else None
    fp = known.fingerprint if known is not None else fingerprint_config(config or {})[0]
    current = current_version(queue) or ensure_baseline(queue=queue, actor=actor)
    if current is not None and current.fingerprint == fp:
        raise RolloutError(f"{current} is already current: nothing to roll out")
    if known is not None and (why := _code_rollout_without_workers(known, current)):
        raise RolloutError(f"start refused: {why}")
    # Refused before anything is written: a refused start leaves no trace but its message.
    busy = busy_message(queue) or _lock_busy_message(queue)
    if busy:
        raise RolloutBusy(busy)
    who = f"{actor_name(actor)}@{socket.gethostname()}"
    try:
        # One transaction from the registration to the rollout row: a start refused
        # after its version was registered (a state that cannot be rolled out, or a
        # concurrent start that won the queue) rolls the registration back with it, so
        # a refused start leaves no ``registered`` version behind.
        with transaction.atomic():
            registered = known or register_version(queue=queue, config=config or {}, actor=actor)
            # Lock the queue's versions (pk order, as ``do_transition`` does) and check
            # the state on the locked row. Race: a retire of this version locks the
            # same rows and refuses while a rollout targets it, so either it committed
            # first and the state check below refuses, or it waits and sees this
            # rollout (docs/rollouts.md#ending-a-rollout).
            rows = {
                v.pk: v
                for v in AnalyzerVersion.objects.select_for_update()
                .filter(queue=queue)
                .order_by("pk")
            }
            target = rows[registered.pk]
            if target.state not in STARTABLE:
                raise RolloutError(f"{target} cannot be rolled out from state {target.state}")
            ro = Rollout.objects.create(
                queue=queue,
                version=target,
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
                target,
                "rollout",
                "",
                Rollout.State.PENDING,
                actor,
                "started",
                None,
                # "driver": a driver job is owed to this rollout (the reconciler enqueues
                # it if the queue server did not take it: reconcile_pending_drivers).
                {"steps": chosen, "auto": auto, "config": target.config, "driver": enqueue_driver},
            )
            publish_rollout_event(target, ro, Rollout.State.PENDING)
            if enqueue_driver:
                transaction.on_commit(lambda: enqueue_driver_or_leave(ro.pk))
    except IntegrityError:
        busy = busy_message(queue)
        raise RolloutBusy(busy or f"{queue!r} is already being rolled out") from None
    return ro


def driver_job_id(rollout_id: int, *, takeover: bool = False) -> str:
    return f"rollout-{rollout_id}-{'takeover' if takeover else 'start'}"


def enqueue_driver_or_leave(rollout_id: int) -> bool:
    """``enqueue_driver_job``, except that an unreachable queue server leaves the rollout
    pending for :func:`reconcile_pending_drivers` (an on-commit callback must not fail
    the request that committed the rollout)."""
    try:
        return enqueue_driver_job(rollout_id)
    except infra.QueueUnavailable as exc:
        log.warning("rollout %s: driver left for the reconciler: %s", rollout_id, exc)
        return False


def reconcile_pending_drivers() -> int:
    """Enqueue the driver of every pending rollout that is owed one (started with
    ``enqueue_driver``) and whose driver job is not in Redis: the queue server was
    unreachable when it started, or lost the job (restarted empty, flushed). Returns
    how many were enqueued; raises ``QueueUnavailable`` while the server is down.

    Races: two reconcilers enqueue through RQ's ``unique`` enqueue (one job). A driver
    job that ran, ended and expired while its rollout is still pending is enqueued
    again, which is safe: a driver takes the rollout's deploy lock first, and a second
    delivery finds the rollout no longer pending and stops (``deploy_lock``).
    """
    conn = infra.connection()
    owed = Rollout.objects.filter(
        state=Rollout.State.PENDING, events__action="rollout", events__detail__driver=True
    ).values_list("pk", flat=True)
    enqueued = 0
    for pk in sorted(set(owed)):
        if not Job.exists(driver_job_id(pk), connection=conn) and enqueue_driver_job(pk):
            log.info("rollout %s: driver enqueued by the reconciler", pk)
            enqueued += 1
    return enqueued


def enqueue_driver_job(rollout_id: int, *, takeover: bool = False, actor: str = "system") -> bool:
    """Put the rollout's driver on the ``rollouts`` queue; False if that job exists.

    The id is deterministic (one driver job per rollout and mode) and the enqueue is
    RQ's ``unique`` one (check-and-save in one script), so two enqueuers give one job.
    No job timeout: the driver lives as long as the rollout (its lease, not RQ, bounds
    a dead one).
    """

    try:
        infra.queue(DRIVER_QUEUE).enqueue(
            "workers.jobs.drive_rollout",
            rollout_id,
            takeover,
            actor,
            job_id=driver_job_id(rollout_id, takeover=takeover),
            job_timeout=-1,
            unique=True,
            result_ttl=3600,
            failure_ttl=7 * 24 * 3600,
        )
    except DuplicateJobError:
        return False
    return True


# ---------------------------------------------------------------------------- operator actions

ACTIONS = frozenset({"promote", "rollback", "set_ramp", "abort"})
#: Requests that end a rollout: they supersede a pending promote / set ramp (a rollback
#: a moment after a promote request is never refused for it) and are idempotent.
ENDING = frozenset({"rollback", "abort"})


def refusal(rollout: Rollout, action: str) -> str | None:
    """Why ``action`` does not apply to the rollout in its current state, or None.

    The one check every operator action (API, CLI, the Rollouts page) makes before it
    touches the rollout or its deploy lock (docs/rollouts.md#operator-actions):

    * ``promote`` / ``set_ramp``: the rollout is ``active`` (its driver took the lock)
      and its version passed the gate (verified or ramping);
    * ``abort``: the rollout has not ended (pending, active, rolling back) — from each
      of those states it ends it;
    * ``rollback``: the rollout has not ended, or it completed, its version is still
      current and no other rollout of the queue is in progress (re-opening it then
      would take that rollout's deploy lock);
    * ``takeover``: the rollout has not ended.

    A read: the domain step re-checks under the rollout row's lock.
    """
    pk, state = rollout.pk, rollout.state
    version = AnalyzerVersion.objects.get(pk=rollout.version_id)
    ended = state not in Rollout.ACTIVE_STATES
    if action in {"promote", "set_ramp"}:
        verb = "promote" if action == "promote" else "set the ramp of"
        if state == Rollout.State.PENDING:
            return (
                f"rollout #{pk} is pending (no driver took its deploy lock yet): "
                f"nothing to {verb} yet"
            )
        if state != Rollout.State.ACTIVE:
            return f"rollout #{pk} is {state}: nothing to {verb}"
        if version.state not in {S.VERIFIED, S.RAMPING}:
            return (
                f"{version} is {version.state}: nothing to {verb} before it passed the warming gate"
            )
        previous = rollout.previous if rollout.previous_id is not None else None
        if why := _code_rollout_without_workers(version, previous):
            return f"{why}: nothing to {verb}"
        return None
    if action in {"abort", "takeover"}:
        if ended:
            hint = (
                " (roll it back instead)"
                if state == Rollout.State.COMPLETED and action == "abort"
                else ""
            )
            return f"rollout #{pk} is {state}: it has ended, nothing to {action}{hint}"
        return None
    if action == "rollback":
        if not ended:
            return None
        if state != Rollout.State.COMPLETED:
            return f"rollout #{pk} is {state}: it has ended, nothing to roll back"
        if version.state != S.CURRENT:
            return (
                f"rollout #{pk} completed, but {version} is no longer current ({version.state}): "
                "nothing to roll back"
            )
        if rollout.previous_id is None:
            return f"{version} has no previous version to roll back to"
        other = (
            Rollout.objects.filter(queue=rollout.queue, state__in=Rollout.ACTIVE_STATES)
            .exclude(pk=pk)
            .first()
        )
        if other is not None:
            return (
                f"rollout #{other.pk} of {rollout.queue!r} is {other.state}: end it before "
                f"rolling back rollout #{pk}"
            )
        return None
    return f"unknown action {action!r}"


def check_applies(rollout: Rollout | int, action: str) -> Rollout:
    """The rollout, fresh, if ``action`` applies to it now (:func:`refusal`); else
    ``InvalidTransition`` (a 409 over the API, one line from the CLI)."""
    pk = rollout if isinstance(rollout, int) else rollout.pk
    ro = Rollout.objects.select_related("version", "previous").get(pk=pk)
    why = refusal(ro, action)
    if why:
        raise InvalidTransition(why)
    return ro


def request_action(
    *, rollout: Rollout | int, action: str, actor: Any, params: Mapping[str, Any] | None = None
) -> Rollout:
    """Ask the rollout's driver (the deploy-lock holder) to ``promote``, ``rollback``,
    ``set_ramp`` (``params={"percent": p}``) or ``abort``; it runs it with its token
    within a poll interval. Refused (``InvalidTransition``) when the action does not
    apply to the rollout's state (:func:`refusal`).

    One request at a time: a conditional UPDATE on an empty ``pending_action`` makes
    two operators' clicks give one request and one refusal — except that a rollback or
    abort supersedes a pending promote / set ramp (recorded as ``action.superseded``),
    and a second rollback or abort while one is pending is that request (no error).

    Race: the driver claims a request with a conditional UPDATE on the exact request
    it read (``RolloutDriver.tick``). A rollback that replaced the promote first is
    the one the driver claims; if the driver claimed the promote first, the rollback
    is a new request, run on the next tick, after the promote. Either way it runs.
    """
    if action not in ACTIONS:
        raise RolloutError(f"unknown action {action!r}")
    pk = rollout if isinstance(rollout, int) else rollout.pk
    check_applies(pk, action)
    refuse_frozen_request(pk, action, params)  # docs/rollouts.md#freeze-windows
    request = {
        "action": action,
        "actor": actor_name(actor),
        "params": dict(params or {}),
        "at": timezone.now().isoformat(),
    }
    with transaction.atomic():
        row = Rollout.objects.filter(pk=pk, state__in=Rollout.ACTIVE_STATES)
        updated = row.filter(pending_action__isnull=True).update(
            pending_action=request, updated_at=timezone.now()
        )
        superseded: dict[str, Any] | None = None
        if not updated and action in ENDING:
            locked = Rollout.objects.select_for_update(of=("self",)).filter(pk=pk).first()
            pending = locked.pending_action if locked is not None else None
            if locked is not None and locked.is_active and pending:
                if pending.get("action") in ENDING:
                    return Rollout.objects.select_related("version").get(pk=pk)
                updated = row.filter(pending_action=pending).update(
                    pending_action=request, updated_at=timezone.now()
                )
                superseded = pending if updated else None
        ro = Rollout.objects.select_related("version").get(pk=pk)
        if not updated:
            if not ro.is_active:
                raise InvalidTransition(f"rollout #{pk} is {ro.state}: nothing to {action}")
            raise RolloutBusy(f"rollout #{pk} already has a pending request: {ro.pending_action}")
        if superseded is not None:
            record_event(
                ro, ro.version, "action.superseded", "", "", actor,
                f"{superseded.get('action')} superseded by {action}", None,
                {"superseded": superseded},
            )  # fmt: skip
        record_event(ro, ro.version, "action.requested", "", "", actor, action, None, request)
    return ro


def events(rollout: Rollout) -> Iterable[RolloutEvent]:
    return RolloutEvent.objects.filter(rollout=rollout).order_by("at", "id")
