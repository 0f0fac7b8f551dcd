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

from django.db import transaction
from django.utils import timezone

from dashboard.infra import QueueUnavailable
from dashboard.models import AnalyzerVersion, Rollout
from dashboard.repositories import enqueue_catch_up
from dashboard.runs import cancel_runs
from dashboard.versions import (
    InvalidTransition,
    check_fence,
    do_transition,
    publish_rollout_event,
    record_event,
    served_fingerprint,
)

S = AnalyzerVersion.State
log = logging.getLogger(__name__)


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
            outcome=f"{ro.version} is current",
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


def rollback(*, rollout: Rollout | int, token: int, actor: Any, reason: str = "") -> Rollout:
    """Route back to the previous version at once; the new one starts draining.

    * new version warming / warm_failed / verified / ramping: it → draining; the
      previous version is still current, so routing is back the moment this commits.
    * new version current (after promote): previous → current, which supersedes the new
      one → draining in the same transaction; the previous results are still stored, so
      they are served at once.

    The rollout becomes ``rolling_back`` until ``drains.check_drain`` sees the new
    version empty twice; a completed rollout (promoted, lock released) can be rolled
    back by a holder that re-took the deploy lock.
    """

    def step(ro: Rollout) -> None:
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

    return _locked_step(rollout, step)


def abort_in_place(ro: Rollout, *, token: int, actor: Any, reason: str) -> Rollout:
    """Roll back (or, for a version never warmed, abort) as the lock holder."""
    state = AnalyzerVersion.objects.values_list("state", flat=True).get(pk=ro.version_id)
    if state == S.REGISTERED or ro.state == Rollout.State.PENDING:
        return _locked_step(
            ro,
            lambda locked: set_rollout_state(
                rollout=locked,
                to=Rollout.State.ABORTED,
                actor=actor,
                token=token,
                reason=reason,
                outcome=f"aborted: {reason}",
            ),
        )
    return rollback(rollout=ro, token=token, actor=actor, reason=reason)
