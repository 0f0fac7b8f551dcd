"""The driver's steps of a rollout (docs/rollouts.md): each one transaction, under the rollout
row's lock, that moves its version through ``dashboard.versions.state_machine.do_transition`` (which
checks the deploy lock's token) and records what happened on the rollout's timeline.

The driver (``dashboard.rollouts.driver``) calls them with its token; ``dashboard.rollouts.start``
re-exports them, so callers keep one import.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from dashboard.infra import QueueUnavailable
from dashboard.models import AnalyzerVersion, Rollout
from dashboard.repositories import enqueue_catch_up
from dashboard.rollouts.pins import clear_pins
from dashboard.runs import cancel_runs
from dashboard.versions import (
    InvalidTransition,
    RolloutBusy,
    check_fence,
    do_transition,
    physical_queue,
    publish_rollout_event,
    record_event,
    served_fingerprint,
)

S = AnalyzerVersion.State
log = logging.getLogger(__name__)


def other_active_rollout(ro: Rollout) -> Rollout | None:
    """Another rollout of ``ro``'s queue still in progress (at most one can be: the
    partial unique constraint), or None. A completed rollout may be re-opened by a
    rollback only while this is None (docs/rollouts.md#operator-actions)."""
    return (
        Rollout.objects.filter(queue=ro.queue, state__in=Rollout.ACTIVE_STATES)
        .exclude(pk=ro.pk)
        .first()
    )


def locked_rollout(rollout: Rollout | int) -> Rollout:
    """The rollout row, locked (``SELECT … FOR UPDATE``) until the caller's transaction
    ends, with its versions: two holders' steps on one rollout run one after the other."""
    pk = rollout if isinstance(rollout, int) else rollout.pk
    return (
        Rollout.objects.select_for_update(of=("self",))
        .select_related("version", "previous")
        .get(pk=pk)
    )


def _locked_step(rollout: Rollout | int, step: Callable[[Rollout], object]) -> Rollout:
    """Run one step in one transaction on the locked rollout row (``locked_rollout``),
    then return the row as committed: ``step`` may have changed it, its version and
    its timeline, and a concurrent step waited for the lock, so the re-read is fresh."""
    with transaction.atomic():
        ro = locked_rollout(rollout)
        step(ro)
    return Rollout.objects.get(pk=ro.pk)


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
    if to != Rollout.State.ACTIVE:  # ends or rolls back: its pins go (docs/rollouts.md#pinning)
        clear_pins(rollout, actor=actor, reason=f"rollout {to}")
    publish_rollout_event(rollout.version, rollout, to)
    return rollout


def begin_warming(*, rollout: Rollout | int, token: int, actor: Any) -> Rollout:
    """registered | warm_failed | drained → warming (the holder then analyses the warm set)."""

    def step(ro: Rollout) -> None:
        do_transition(
            version=ro.version_id,
            to=S.WARMING,
            actor=actor,
            token=token,
            rollout=ro,
            detail={"warm_set": _warm_summary(ro.warm_set)},
        )

    return _locked_step(rollout, step)


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

    def step(ro: Rollout) -> None:
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

    return _locked_step(rollout, step)


def record_diff(
    *, rollout: Rollout | int, diff: Mapping[str, Any], token: int, actor: Any
) -> Rollout:
    """Store the result diff of the warm set (new version vs current), fenced."""

    def step(ro: Rollout) -> None:
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

    return _locked_step(rollout, step)


def set_ramp(*, rollout: Rollout | int, percent: int, token: int, actor: Any) -> Rollout:
    """verified | ramping → ramping(percent): that share of new work now goes to the
    version (``dashboard.versions.canary.route``)."""

    def step(ro: Rollout) -> None:
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

    return _locked_step(rollout, step)


def version_name(version: AnalyzerVersion | None) -> str:
    """``analysis@3f2a9c1e``: a version as an outcome names it. Not ``str(version)``,
    whose state is the one read before the step changed it ("(ramping) is current")."""
    return physical_queue(version.queue, version.fingerprint) if version is not None else "—"


def promote(*, rollout: Rollout | int, token: int, actor: Any) -> Rollout:
    """ramping → current (the previous current → draining, in the same transaction);
    the rollout completes. The driver then releases the deploy lock."""

    def step(ro: Rollout) -> None:
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
            outcome=f"{version_name(ro.version)} is current",
        )
        closed = [ro.previous.fingerprint] if ro.previous is not None else []
        served = ro.version.fingerprint
        transaction.on_commit(lambda: rerouted(closed=closed, served=served, rollout=ro.pk))

    return _locked_step(rollout, step)


def rerouted(*, closed: Sequence[str], served: str, rollout: int | None = None) -> dict[str, int]:
    """After a promote or rollback committed: cancel the queued work of the versions
    whose gate just closed (``runs.cancel_runs``; their workers take no job, and the
    served version has its own plan) and start the catch-up that brings every
    repository up to date under the served fingerprint (``chunk_plans.catch_up``: batches on
    the maintenance queue, deduplicated). Recorded on the rollout's timeline.

    Only the fast path: with the queue server unreachable the version change stands and
    both are left to the reconciler, which cancels closed versions' queued runs and
    enqueues the catch-up every round while a repository lags (docs/rollouts.md#wiring);
    raising here would fail the caller after its commit."""
    cancelled: dict[str, int] = {}
    note = ""
    try:
        for fp in closed:
            cancelled[fp] = cancel_runs(fingerprint=fp, reason="analyzer version closed")
        enqueue_catch_up(served)
    except QueueUnavailable as exc:
        log.warning("after the version change: %s; left for the reconciler", exc)
        note = " (queue server unreachable: left for the reconciler)"
    if rollout is not None:
        ro = Rollout.objects.select_related("version").get(pk=rollout)
        with transaction.atomic():
            record_event(
                ro, ro.version, "jobs.moved", "", "", "system",
                f"cancelled {sum(cancelled.values())} queued job(s); catch-up of {served[:12]}"
                f"{note}",
                None, {"cancelled": cancelled, "catch_up": served},
            )  # fmt: skip
    return cancelled


def rollback(
    *, rollout: Rollout | int, token: int, actor: Any, reason: str = "", reopen: bool = True
) -> Rollout:
    """Route back to the previous version at once; the new one starts draining.

    * new version warming / warm_failed / verified / ramping: it → draining; the
      previous version is still current, so routing is back the moment this commits.
    * new version current (after promote): previous → current, which supersedes the new
      one → draining in the same transaction; the previous results are still stored, so
      they are served at once.

    The rollout becomes ``rolling_back`` until ``drains.check_drain`` sees the new
    version empty twice; a completed rollout (promoted, lock released) can be rolled
    back by a holder that re-took the deploy lock (``reopen``; an abort passes False
    and is refused instead), unless another rollout of the queue is in progress
    (``RolloutBusy``: re-opening it would break the one-active-rollout rule).
    """

    def step(ro: Rollout) -> None:
        version = AnalyzerVersion.objects.get(pk=ro.version_id)
        why = reason or "rollback"
        if ro.state == Rollout.State.COMPLETED:
            if not reopen:
                raise InvalidTransition(
                    f"rollout #{ro.pk} is completed: nothing to abort (roll it back instead)"
                )
            if version.state != S.CURRENT:
                raise InvalidTransition(
                    f"rollout #{ro.pk} completed, but {version} is no longer current "
                    f"({version.state}): nothing to roll back"
                )
            # Re-opened by a rollback after promote. Checked here, on the locked row, and
            # guarded by the partial unique constraint (below): a rollout of the queue that
            # started meanwhile makes this a refusal, never an IntegrityError.
            other = other_active_rollout(ro)
            if other is not None:
                raise RolloutBusy(
                    f"rollout #{other.pk} of {ro.queue!r} is {other.state}: end it before "
                    f"rolling back rollout #{ro.pk}"
                )
        elif ro.state not in Rollout.ACTIVE_STATES:
            raise InvalidTransition(f"rollout #{ro.pk} is {ro.state}: nothing to roll back")
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
            # Re-opened last, after the transitions locked the queue's versions: a start
            # of the queue inserts its rollout while it holds those locks, so re-opening
            # first (an active row under the partial unique index) and then waiting for
            # the versions would make a cycle with it on PostgreSQL. A start that won
            # meanwhile makes the save fail: refused, and the transaction (the
            # transitions with it) rolls back.
            ro.state, ro.finished_at = Rollout.State.ACTIVE, None
            try:
                with transaction.atomic():
                    ro.save(update_fields=["state", "finished_at", "updated_at"])
            except IntegrityError:
                raise RolloutBusy(
                    f"another rollout of {ro.queue!r} started: end it before rolling back "
                    f"rollout #{ro.pk}"
                ) from None
        set_rollout_state(
            rollout=ro, to=Rollout.State.ROLLING_BACK, actor=actor, token=token, reason=why
        )
        closed = [version.fingerprint]
        served = served_fingerprint(ro.queue)
        transaction.on_commit(lambda: rerouted(closed=closed, served=served, rollout=ro.pk))

    return _locked_step(rollout, step)


#: Version states a rollout that has not routed anything finds its version in: its
#: driver never began warming (registered, or a re-activation of warm_failed or drained
#: that had not begun), or the version was retired meanwhile. Ending such a rollout
#: touches no version.
UNTOUCHED = frozenset({S.REGISTERED, S.WARM_FAILED, S.DRAINED, S.RETIRED})


def abort_in_place(
    ro: Rollout, *, token: int, actor: Any, reason: str, reopen: bool = True
) -> Rollout:
    """End the rollout as the lock holder, from whichever state it is in
    (docs/rollouts.md#ending-a-rollout):

    * pending or active with its version untouched (``UNTOUCHED``): aborted, no
      version transition (a drained version being re-activated stays drained);
    * rolling back: already routed back; it ends once drained (``rolled_back`` at once
      if its version is drained or retired already);
    * otherwise: rolled back (``rollback``; ``reopen`` as there).
    """

    def end(locked: Rollout) -> None:
        state = AnalyzerVersion.objects.values_list("state", flat=True).get(pk=locked.version_id)
        if locked.state == Rollout.State.ROLLING_BACK:
            if state in {S.DRAINED, S.RETIRED}:
                set_rollout_state(
                    rollout=locked, to=Rollout.State.ROLLED_BACK, actor=actor, token=token,
                    reason="drained", outcome=f"rolled back to {version_name(locked.previous)}",
                )  # fmt: skip
            return
        if locked.state in {Rollout.State.PENDING, Rollout.State.ACTIVE} and state in UNTOUCHED:
            set_rollout_state(
                rollout=locked, to=Rollout.State.ABORTED, actor=actor, token=token,
                reason=reason, outcome=f"aborted: {reason}",
            )  # fmt: skip
            return
        raise _RollBack

    try:
        return _locked_step(ro, end)
    except _RollBack:
        return rollback(rollout=ro, token=token, actor=actor, reason=reason, reopen=reopen)


class _RollBack(Exception):
    """``abort_in_place``'s locked check found a version to route back from."""


def end_unrollable(*, rollout: Rollout | int, token: int, actor: Any) -> Rollout | None:
    """The driver's way out when its rollout's version can no longer be rolled out
    (retired meanwhile, or in a state no step moves it from): the rollout fails with
    the reason, instead of being ticked for ever. Returns None (nothing done) if the
    version is in a state the driver handles after all."""
    done: list[Rollout] = []

    def step(ro: Rollout) -> None:
        version = AnalyzerVersion.objects.get(pk=ro.version_id)
        if ro.state != Rollout.State.ACTIVE or version.state in DRIVEN:
            return
        set_rollout_state(
            rollout=ro, to=Rollout.State.FAILED, actor=actor, token=token,
            reason=f"{version} is {version.state}: it can no longer be rolled out",
            outcome=f"failed: {version} is {version.state}",
        )  # fmt: skip
        done.append(ro)

    out = _locked_step(rollout, step)
    return out if done else None


#: Version states the driver moves a rollout's version on from (``RolloutDriver._advance``).
DRIVEN = frozenset({S.REGISTERED, S.WARM_FAILED, S.DRAINED, S.WARMING, S.VERIFIED, S.RAMPING})
