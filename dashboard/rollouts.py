"""Analyzer versions and their rollouts (DESIGN §7): the state machine and its invariants.

Every state change of an ``AnalyzerVersion`` goes through :func:`do_transition`::

    registered → warming → verified → ramping(p%) → current → draining → drained → retired
    warming → warm_failed → warming (retry)
    warming | warm_failed | verified | ramping → draining          (abort / rollback)
    draining | drained → current                                   (rollback to previous)
    drained → warming                                              (re-activation)
    registered → current                   (the queue's first version only: the baseline)

``current → draining`` is never asked for directly: it happens inside the transition that
makes another version current, so a queue always has a current version once it had one.

Invariants, enforced by ``do_transition`` in one transaction that locks every version of
the queue (``SELECT … FOR UPDATE``) and repeated by database constraints (see
``AnalyzerVersion.Meta``): at most one current and one ramping version per queue;
``ramp_percent`` in 0..100 and non-zero only while ramping; only verified versions are
routable. Every transition but the drain bookkeeping presents the deploy lock's fencing
token, checked against ``dashboard.fencing`` with ``locks:queue:{queue}:deploy`` as the
resource: a holder whose lease was taken over is rejected with :class:`RolloutConflict`.
Each transition writes a ``RolloutEvent`` and an ``AuditEntry`` and, after commit,
publishes a live ``rollout.<state>`` event.

The lock itself is held by a driver (``dashboard.deploylock``); the functions below that
take ``token`` are what a driver calls. Operators' actions reach the driver through
:func:`request_action`.
"""

from __future__ import annotations

import itertools
import socket
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from dashboard.audit import record_audit
from dashboard.fencing import StaleToken, check_token
from dashboard.live import EVENT_TYPES, publish_event
from dashboard.models import AnalyzerVersion, Rollout, RolloutEvent
from workers import analyzer, lockkeys

QUEUE = "analysis"
DEFAULT_STEPS = (10, 50, 100)
#: The Redis queue rollout drivers run on (``dashboard.deploylock.drive_rollout``).
DRIVER_QUEUE = "rollouts"

S = AnalyzerVersion.State

ALLOWED: dict[str, frozenset[str]] = {
    S.REGISTERED: frozenset({S.WARMING, S.CURRENT}),
    S.WARMING: frozenset({S.VERIFIED, S.WARM_FAILED, S.DRAINING}),
    S.WARM_FAILED: frozenset({S.WARMING, S.DRAINING, S.RETIRED}),
    S.VERIFIED: frozenset({S.RAMPING, S.DRAINING}),
    S.RAMPING: frozenset({S.RAMPING, S.CURRENT, S.DRAINING}),
    S.CURRENT: frozenset(),  # only superseded, inside another version's → current
    S.DRAINING: frozenset({S.DRAINED, S.CURRENT}),
    S.DRAINED: frozenset({S.RETIRED, S.WARMING, S.CURRENT}),
    S.RETIRED: frozenset(),
}
#: States whose versions may receive routed jobs (the gate is open).
ROUTABLE = frozenset({S.VERIFIED, S.RAMPING, S.CURRENT})
#: States whose versions need workers running (``up``/``worker`` pool, next wave).
STAFFED = frozenset({S.WARMING, S.VERIFIED, S.RAMPING, S.CURRENT, S.DRAINING})
#: Bookkeeping the drain reconciler does without the deploy lock.
TOKENLESS = frozenset({S.DRAINED, S.RETIRED})


class RolloutError(Exception):
    """A refused rollout action; the message is written for the operator."""


class RolloutBusy(RolloutError):
    """The queue already has a rollout (or its deploy lock is held): names the holder."""


class InvalidTransition(RolloutError):
    """The state machine or an invariant forbids this change."""


class RolloutConflict(RolloutError):
    """A stale fencing token: a newer holder (takeover) owns the queue's routing."""


class InvalidConfig(RolloutError, ValueError):
    """An analyzer config that no version could load."""


# ---------------------------------------------------------------------------- versions


def actor_name(actor: Any) -> str:
    return str(getattr(actor, "username", None) or actor or "system")[:150]


def fingerprint_config(config: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """``(fingerprint, normalised config)`` of an analyzer config.

    The only place that knows how a fingerprint is computed: it builds the worker's own
    ``workers.analyzer.AnalyzerConfig`` and asks it, so the fingerprint is the one a
    worker that loaded this config reports. Unknown keys and wrong types are refused.
    """
    known = {"detect_renames", "ignore_whitespace", "exclude_paths"}
    unknown = sorted(set(config) - known)
    if unknown:
        raise InvalidConfig(f"unknown analyzer config key(s): {', '.join(unknown)}")
    for key in ("detect_renames", "ignore_whitespace"):
        if key in config and not isinstance(config[key], bool):
            raise InvalidConfig(f"{key} must be true or false, not {config[key]!r}")
    paths = config.get("exclude_paths", ())
    if isinstance(paths, str) or not all(isinstance(p, str) and p for p in paths):
        raise InvalidConfig("exclude_paths must be a list of non-empty glob patterns")
    cfg = analyzer.AnalyzerConfig(
        detect_renames=bool(config.get("detect_renames", False)),
        ignore_whitespace=bool(config.get("ignore_whitespace", False)),
        exclude_paths=tuple(paths),
    )
    normalised = {
        "detect_renames": cfg.detect_renames,
        "ignore_whitespace": cfg.ignore_whitespace,
        "exclude_paths": list(cfg.exclude_paths),
    }
    return cfg.fingerprint(), normalised


def physical_queue(queue: str, fingerprint: str) -> str:
    """The RQ queue one version consumes behind a logical queue (``analysis@3f2a9c1e``)."""
    return analyzer.queue_name(fingerprint).replace("analysis@", f"{queue}@", 1)


def current_version(queue: str = QUEUE) -> AnalyzerVersion | None:
    return AnalyzerVersion.objects.filter(queue=queue, state=S.CURRENT).first()


def ramping_version(queue: str = QUEUE) -> AnalyzerVersion | None:
    return AnalyzerVersion.objects.filter(queue=queue, state=S.RAMPING).first()


def active_rollout(queue: str = QUEUE) -> Rollout | None:
    return Rollout.objects.filter(queue=queue, state__in=Rollout.ACTIVE_STATES).first()


def register_version(
    *, queue: str = QUEUE, config: Mapping[str, Any], actor: Any
) -> AnalyzerVersion:
    """Get or create the version of ``config`` on ``queue`` (idempotent on the fingerprint).

    Race: two registrations of one config; the unique (queue, fingerprint) constraint
    keeps one row and the loser reads it back.
    """
    lockkeys.deploy(queue)  # validates the queue name
    fp, normalised = fingerprint_config(config)
    try:
        with transaction.atomic():
            version, created = AnalyzerVersion.objects.get_or_create(
                queue=queue,
                fingerprint=fp,
                defaults={"code_version": analyzer.CODE_VERSION, "config": normalised},
            )
            if created:
                _event(None, version, "transition", "", S.REGISTERED, actor, "registered", None)
                _publish(version, None, S.REGISTERED)
    except IntegrityError:
        version = AnalyzerVersion.objects.get(queue=queue, fingerprint=fp)
    return version


# ---------------------------------------------------------------------------- events


def _event(
    rollout: Rollout | None,
    version: AnalyzerVersion | None,
    action: str,
    from_state: str,
    to_state: str,
    actor: Any,
    reason: str,
    token: int | None,
    detail: Mapping[str, Any] | None = None,
) -> RolloutEvent:
    """One timeline row and its audit entry, in the caller's transaction."""
    event = RolloutEvent.objects.create(
        rollout=rollout,
        version=version,
        action=action,
        from_state=from_state,
        to_state=to_state,
        actor=actor_name(actor),
        reason=reason,
        token=token,
        detail=dict(detail or {}),
    )
    target = f"rollout #{rollout.pk}" if rollout is not None else ""
    if version is not None:
        target = f"{target} {version.queue}@{version.fp12}".strip()
    change = f" {from_state or '∅'} → {to_state}" if to_state else ""
    record_audit(
        user=actor,
        action=f"rollout.{action}",
        target=target,
        outcome=f"ok{change}",
        detail={"reason": reason, "token": token, **dict(detail or {})},
    )
    return event


def _publish(version: AnalyzerVersion | None, rollout: Rollout | None, state: str) -> None:
    """``rollout.<state>`` after commit (``rollout.changed`` carrying it while
    ``dashboard.live`` does not list the per-state types yet)."""
    kind = f"rollout.{state}"
    payload: dict[str, Any] = {"event": kind, "state": state}
    if version is not None:
        payload.update(
            key=f"{version.queue}@{version.fp12}",
            queue=version.queue,
            fingerprint=version.fingerprint,
            version_state=version.state,
            ramp_percent=version.ramp_percent,
        )
    if rollout is not None:
        payload.update(rollout=rollout.pk, rollout_state=rollout.state)
    publish_event(kind if kind in EVENT_TYPES else "rollout.changed", payload)


# ---------------------------------------------------------------------------- the transition


def _check_fence(queue: str, rollout: Rollout | None, token: int | None) -> None:
    try:
        check_token(lockkeys.deploy(queue), token)
    except StaleToken as exc:
        raise RolloutConflict(
            f"routing change refused: {exc}; the deploy lock of {queue!r} was taken over"
        ) from exc
    if rollout is not None and rollout.lock_token != token:
        raise RolloutConflict(
            f"routing change refused: token {token} is not rollout #{rollout.pk}'s "
            f"(it holds {rollout.lock_token})"
        )


def do_transition(
    *,
    version: AnalyzerVersion | int,
    to: str,
    actor: Any,
    token: int | None,
    rollout: Rollout | int | None = None,
    ramp_percent: int | None = None,
    reason: str = "",
    detail: Mapping[str, Any] | None = None,
) -> AnalyzerVersion:
    """Move ``version`` to state ``to``; return it refreshed.

    1. In one transaction, lock every version of the queue (and the rollout row), so two
       transitions of one queue serialise: the invariants are checked on fresh rows.
    2. Check the fencing token (``token`` must be the newest for the queue's deploy lock,
       and the rollout's own) unless ``to`` is drain bookkeeping (drained, retired).
    3. Check the edge (``ALLOWED``) and the invariants: ramping needs the gate passed
       (``verified_at``), 1 ≤ p ≤ 100, no other ramping version and a current one;
       verified needs a passing ``detail["verdict"]``; registered → current only for
       a queue without a current version.
    4. Write: a version becoming current supersedes the old current (→ draining, its own
       event); ramp_percent is p while ramping and 0 otherwise.
    5. Record a RolloutEvent + AuditEntry per changed version; publish after commit.

    Raises InvalidTransition, RolloutConflict. The partial unique constraints make a
    concurrent writer that bypassed this function fail with IntegrityError instead.
    """
    version_id = version if isinstance(version, int) else version.pk
    rollout_id = rollout if isinstance(rollout, int) or rollout is None else rollout.pk
    with transaction.atomic():
        queue = AnalyzerVersion.objects.values_list("queue", flat=True).get(pk=version_id)
        rows = {
            v.pk: v
            for v in AnalyzerVersion.objects.select_for_update().filter(queue=queue).order_by("pk")
        }
        row = rows[version_id]
        ro = (
            Rollout.objects.select_for_update().get(pk=rollout_id)
            if rollout_id is not None
            else None
        )
        if to not in TOKENLESS:
            _check_fence(queue, ro, token)
        src = row.state
        if to not in ALLOWED.get(src, frozenset()):
            hint = " (make another version current instead)" if src == S.CURRENT else ""
            raise InvalidTransition(f"{row}: {src} → {to} is not allowed{hint}")
        others = [v for v in rows.values() if v.pk != row.pk]
        current = next((v for v in others if v.state == S.CURRENT), None)
        now = timezone.now()
        extra: dict[str, Any] = dict(detail or {})
        if to == S.RAMPING:
            if row.verified_at is None:
                raise InvalidTransition(f"{row}: the warming gate has not passed")
            if ramp_percent is None or not 1 <= int(ramp_percent) <= 100:
                raise InvalidTransition(f"ramp must be 1..100 percent, not {ramp_percent!r}")
            if any(v.state == S.RAMPING for v in others):
                raise InvalidTransition(f"{queue!r} already has a ramping version")
            if current is None:
                raise InvalidTransition(f"{queue!r} has no current version to ramp from")
            if src == S.RAMPING and int(ramp_percent) == row.ramp_percent:
                return row
            extra["ramp_from"] = row.ramp_percent
            extra["ramp_percent"] = int(ramp_percent)
        elif to == S.VERIFIED:
            verdict = extra.get("verdict")
            if not isinstance(verdict, Mapping) or verdict.get("ok") is not True:
                raise InvalidTransition(f"{row}: no passing warming verdict")
        elif to == S.CURRENT and src == S.REGISTERED and current is not None:
            raise InvalidTransition(
                f"{row}: only a queue's first version becomes current without warming"
            )
        if to == S.CURRENT and current is not None:
            # Superseded in the same transaction: the queue is never without a current
            # version, and never has two (the partial unique index would refuse it).
            _apply(current, S.DRAINING, now, 0, ro, actor, reason or "superseded", token, {})
        _apply(
            row,
            to,
            now,
            int(ramp_percent) if to == S.RAMPING and ramp_percent is not None else 0,
            ro,
            actor,
            reason,
            token,
            extra,
        )
    return row


def _apply(
    row: AnalyzerVersion,
    to: str,
    now: Any,
    ramp: int,
    ro: Rollout | None,
    actor: Any,
    reason: str,
    token: int | None,
    detail: Mapping[str, Any],
) -> None:
    src = row.state
    row.state = to
    row.ramp_percent = ramp
    row.state_changed_at = now
    if to == S.VERIFIED:
        row.verified_at = now
    elif to in {S.WARMING, S.WARM_FAILED}:
        row.verified_at = None  # a re-warm must pass the gate again
    row.save(
        update_fields=["state", "ramp_percent", "state_changed_at", "verified_at", "updated_at"]
    )
    _event(ro, row, "transition", src, to, actor, reason, token, detail)
    _publish(row, ro, to)


# ---------------------------------------------------------------------------- rollouts


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


def describe_lock(info: dict[str, Any] | None) -> str:
    """``driver@host:pid (token 7) since 2026-12-01T13:50:02+00:00, 21.4s left``."""
    if not info:
        return "nobody"
    holder = info.get("holder") or {}
    who = holder.get("worker") or f"{holder.get('host')}:{holder.get('pid')}"
    since = holder.get("acquired_at")
    when = (
        datetime.fromtimestamp(float(since), tz=timezone.get_current_timezone()).isoformat()
        if isinstance(since, int | float)
        else "an unknown time"
    )
    left = info.get("ttl_ms", 0) / 1000
    return f"{who} (token {holder.get('token')}) since {when}, {left:.1f}s left"


def _lock_busy_message(queue: str) -> str | None:
    """A deploy lock held in Redis without an active rollout (a baseline adoption, or
    an operator's manual hold): refused too, naming its holder."""
    from dashboard import queues

    info = queues.redlock().inspect(lockkeys.deploy(queue))
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

    1. Validate config and steps; the config must not be the current version's.
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
    current = current_version(queue)
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
            _event(
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
            _publish(version, ro, Rollout.State.PENDING)
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
    from rq.exceptions import DuplicateJobError

    from dashboard import queues

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


def describe_rollout(ro: Rollout, *, timeline: bool = False) -> dict[str, Any]:
    """A rollout as JSON (the API's and ``rollout status --json``'s shape)."""
    v, prev = ro.version, ro.previous
    out: dict[str, Any] = {
        "id": ro.pk,
        "queue": ro.queue,
        "state": ro.state,
        "version": {
            "fingerprint": v.fingerprint,
            "state": v.state,
            "ramp_percent": v.ramp_percent,
            "config": v.config,
            "queue": physical_queue(v.queue, v.fingerprint),
        },
        "previous": {
            "fingerprint": prev.fingerprint,
            "state": prev.state,
            "queue": physical_queue(prev.queue, prev.fingerprint),
        }
        if prev
        else None,
        "steps": ro.steps,
        "step_index": ro.step_index,
        "auto": ro.auto,
        "started_by": ro.started_by,
        "lock_holder": ro.lock_holder,
        "lock_token": ro.lock_token,
        "lock_since": ro.lock_since.isoformat() if ro.lock_since else None,
        "heartbeat_at": ro.heartbeat_at.isoformat() if ro.heartbeat_at else None,
        "pending_action": ro.pending_action,
        "verdict": ro.verdict,
        "diff": ro.diff,
        "outcome": ro.outcome,
        "created_at": ro.created_at.isoformat(),
        "finished_at": ro.finished_at.isoformat() if ro.finished_at else None,
    }
    if timeline:
        out["timeline"] = [
            {
                "at": e.at.isoformat(),
                "actor": e.actor,
                "action": e.action,
                "from": e.from_state,
                "to": e.to_state,
                "token": e.token,
                "reason": e.reason,
                "detail": e.detail,
                "version": e.version.fingerprint if e.version else None,
            }
            for e in RolloutEvent.objects.filter(rollout=ro)
            .select_related("version")
            .order_by("at", "id")
        ]
    return out


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
    _event(rollout, rollout.version, "rollout", src, to, actor, reason, token, detail)
    _publish(rollout.version, rollout, to)
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
        _event(
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
        _check_fence(ro.queue, ro, token)
        ro.diff = dict(diff)
        ro.save(update_fields=["diff", "updated_at"])
        _event(
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
    return Rollout.objects.get(pk=ro.pk)


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
    return Rollout.objects.get(pk=ro.pk)


def drain_counts(version: AnalyzerVersion) -> dict[str, int]:
    """What still waits for or runs on ``version``: its physical RQ queue (queued,
    started, scheduled) and its job runs in the database (queued, running)."""
    from rq.registry import ScheduledJobRegistry, StartedJobRegistry

    from dashboard import queues
    from dashboard.models import JobRun

    name = physical_queue(version.queue, version.fingerprint)
    q = queues.queue(name)
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
        row = AnalyzerVersion.objects.select_for_update().get(pk=pk)
        if row.state != S.DRAINING:
            return row.state in {S.DRAINED, S.RETIRED}
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


def reconcile_drains(*, actor: Any = "reconciler") -> int:
    """One drain check of every draining version (superseded ones after a promote,
    and those of rollbacks whose driver died); returns how many became drained."""
    done = 0
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
        _event(ro, ro.version, "action.requested", "", "", actor, action, None, request)
    return ro


def events(rollout: Rollout) -> Iterable[RolloutEvent]:
    return RolloutEvent.objects.filter(rollout=rollout).order_by("at", "id")
