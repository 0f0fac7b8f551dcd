"""Analyzer versions (docs/rollouts.md#states): the state machine, its invariants, its events.

Every state change of an ``AnalyzerVersion`` goes through :func:`do_transition`::

    registered → warming → verified → ramping(p%) → current → draining → drained → retired
    warming → warm_failed → warming (retry)
    warming | warm_failed | verified | ramping → draining          (abort / rollback)
    draining | drained → current                                   (rollback to previous)
    drained → warming                                              (re-activation)
    registered → current                   (the queue's first version only: the baseline)
    registered → retired                   (a learned code version never rolled out)

``current → draining`` is never asked for directly: it happens inside the transition that
makes another version current, so a queue always has a current version once it had one.

Invariants, enforced by ``do_transition`` in one transaction that locks every version of
the queue (``SELECT … FOR UPDATE``) and repeated by database constraints (see
``AnalyzerVersion.Meta``): at most one current and one ramping version per queue;
``ramp_percent`` in 0..100 and non-zero only while ramping; only verified versions are
routable. Every transition but the drain bookkeeping presents the deploy lock's fencing
token, checked against ``dashboard.locks.fencing`` with ``locks:queue:{queue}:deploy`` as the
resource: a holder whose lease was taken over is rejected with :class:`RolloutConflict`.
Each transition writes a ``RolloutEvent`` and an ``AuditEntry`` and, after commit,
publishes a live ``rollout.<state>`` event. Rollouts (``dashboard.rollouts.start``) drive
versions through these transitions.
"""

from __future__ import annotations

import contextlib
import re
import socket
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from dashboard import locks
from dashboard.accounts import record_audit
from dashboard.infra import EVENT_TYPES, publish_event
from dashboard.locks import StaleToken, check_token
from dashboard.models import AnalyzerVersion, Rollout, RolloutEvent
from workers import analysis
from workers import locks as workers_locks
from workers.locks import LockNotAcquired

QUEUE = "analysis"

S = AnalyzerVersion.State

ALLOWED: dict[str, frozenset[str]] = {
    # registered: a configuration given to a start, or a code version a worker reported
    # (``dashboard.versions.code_versions.learn_code_version``); both start the same way.
    S.REGISTERED: frozenset({S.WARMING, S.CURRENT, S.RETIRED}),
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
#: States whose workers take jobs from their physical queue: the routable ones plus
#: warming (its warm set is enqueued straight to its queue, never routed). A worker of
#: any other state (draining, drained, …) listens on nothing: its gate is closed.
GATE_OPEN = frozenset({S.WARMING, S.VERIFIED, S.RAMPING, S.CURRENT})
#: Bookkeeping the drain reconciler does without the deploy lock.
TOKENLESS = frozenset({S.DRAINED, S.RETIRED})
#: States a version may be retired from (``retire_version``): registered, drained,
#: warm_failed.
RETIRABLE = frozenset(src for src, targets in ALLOWED.items() if S.RETIRED in targets)


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


class VersionNotFound(RolloutError, LookupError):
    """No version of the queue has that fingerprint (or prefix)."""


# ---------------------------------------------------------------------------- versions


def actor_name(actor: Any) -> str:
    return str(getattr(actor, "username", None) or actor or "system")[:150]


def fingerprint_config(
    config: Mapping[str, Any], *, code_version: str | None = None
) -> tuple[str, dict[str, Any]]:
    """``(fingerprint, normalised config)`` of an analyzer config under ``code_version``
    (default: this process's own code, ``workers.analysis.CODE_VERSION``).

    The only place that knows how a fingerprint is computed: it builds the worker's own
    ``workers.analysis.analyzer.AnalyzerConfig`` and asks it, so the fingerprint is the one a
    worker of that code that loaded this config reports. Unknown keys and wrong types are
    refused.
    """
    try:
        cfg = analysis.AnalyzerConfig.from_mapping(dict(config))
    except analysis.InvalidConfig as exc:
        raise InvalidConfig(str(exc)) from exc
    return cfg.fingerprint(code_version or analysis.CODE_VERSION), cfg.to_dict()


def physical_queue(queue: str, fingerprint: str) -> str:
    """The RQ queue one version consumes behind a logical queue (``analysis@3f2a9c1e``)."""
    return analysis.queue_name(fingerprint).replace("analysis@", f"{queue}@", 1)


def current_version(queue: str = QUEUE) -> AnalyzerVersion | None:
    return AnalyzerVersion.objects.filter(queue=queue, state=S.CURRENT).first()


def ramping_version(queue: str = QUEUE) -> AnalyzerVersion | None:
    return AnalyzerVersion.objects.filter(queue=queue, state=S.RAMPING).first()


def served_fingerprint(queue: str = QUEUE) -> str:
    """The fingerprint whose results readers are shown: the current version's, or the
    deployed default's on a queue that never had a version (no rollout yet)."""
    fp = (
        AnalyzerVersion.objects.filter(queue=queue, state=S.CURRENT)
        .values_list("fingerprint", flat=True)
        .first()
    )
    return str(fp) if fp else analysis.DEFAULT.fingerprint()


def closed_queue_names(queue: str = QUEUE) -> set[str]:
    """Physical queues of versions whose gate is closed (not ``GATE_OPEN``): their
    workers must take no job from them."""
    return {
        physical_queue(queue, fp)
        for fp in AnalyzerVersion.objects.filter(queue=queue)
        .exclude(state__in=GATE_OPEN)
        .values_list("fingerprint", flat=True)
    }


def version_of(fingerprint: str, queue: str = QUEUE) -> AnalyzerVersion | None:
    return AnalyzerVersion.objects.filter(queue=queue, fingerprint=fingerprint).first()


def register_version(
    *,
    queue: str = QUEUE,
    config: Mapping[str, Any],
    actor: Any,
    code_version: str | None = None,
    reason: str = "registered",
) -> AnalyzerVersion:
    """Get or create the version of ``config`` under ``code_version`` (default: this
    process's code) on ``queue`` (idempotent on the fingerprint).

    Race: two registrations of one config; the unique (queue, fingerprint) constraint
    keeps one row and the loser reads it back (on PostgreSQL its INSERT waits for the
    winner's transaction, then fails on the index; the savepoint of ``atomic`` keeps the
    caller's transaction usable).
    """
    workers_locks.deploy(queue)  # validates the queue name
    code = code_version or analysis.CODE_VERSION
    fp, normalised = fingerprint_config(config, code_version=code)
    try:
        with transaction.atomic():
            version, created = AnalyzerVersion.objects.get_or_create(
                queue=queue,
                fingerprint=fp,
                defaults={"code_version": code, "config": normalised},
            )
            if created:
                record_event(None, version, "transition", "", S.REGISTERED, actor, reason, None)
                publish_rollout_event(version, None, S.REGISTERED)
    except IntegrityError:
        version = AnalyzerVersion.objects.get(queue=queue, fingerprint=fp)
    return version


# ---------------------------------------------------------------------------- events


def record_event(
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


def publish_rollout_event(
    version: AnalyzerVersion | None, rollout: Rollout | None, state: str
) -> None:
    """``rollout.<state>`` after commit (``rollout.changed`` carrying it while
    ``dashboard.infra.events`` does not list the per-state types yet)."""
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


def check_fence(queue: str, rollout: Rollout | None, token: int | None) -> None:
    try:
        check_token(workers_locks.deploy(queue), token)
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
        # Lock order everywhere: the rollout row, then the queue's versions (by pk), then
        # the fencing counter (check_token): two transitions of one queue cannot deadlock.
        ro = (
            Rollout.objects.select_for_update().get(pk=rollout_id)
            if rollout_id is not None
            else None
        )
        queue = AnalyzerVersion.objects.values_list("queue", flat=True).get(pk=version_id)
        rows = {
            v.pk: v
            for v in AnalyzerVersion.objects.select_for_update().filter(queue=queue).order_by("pk")
        }
        row = rows[version_id]
        if to not in TOKENLESS:
            check_fence(queue, ro, token)
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
        elif to == S.RETIRED:
            # A rollout that targets the version would find it gone and could never be
            # driven or aborted (docs/rollouts.md#ending-a-rollout). Race: a start of
            # this version locks these same version rows before it inserts its rollout
            # (``dashboard.rollouts.start.start_rollout``), so either it committed first
            # and is seen here, or it waits for us and sees the version retired.
            targeted = (
                Rollout.objects.filter(version_id=row.pk, state__in=Rollout.ACTIVE_STATES)
                .order_by("pk")
                .first()
            )
            if targeted is not None:
                raise InvalidTransition(
                    f"{row} is the target of rollout #{targeted.pk} ({targeted.state}): "
                    "abort that rollout before retiring the version"
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
    record_event(ro, row, "transition", src, to, actor, reason, token, detail)
    publish_rollout_event(row, ro, to)


# ---------------------------------------------------------------------------- the deploy lock


def retire_version(
    *, fingerprint: str, actor: Any, queue: str = QUEUE, reason: str = ""
) -> AnalyzerVersion:
    """registered | drained | warm_failed → retired (docs/rollouts.md#states): the
    version is done for good — never staffed, routed or rolled out again (its stored
    results stay, unserved).

    ``fingerprint`` may be a prefix naming exactly one version of ``queue``. Drain
    bookkeeping, so no deploy-lock token (``TOKENLESS``): a retired version has no gate
    to close and no work to route; ``do_transition`` still refuses any other source
    state (a current, ramping or draining version cannot be retired).
    """
    prefix = (fingerprint or "").strip().lower()
    if not re.fullmatch(r"[0-9a-f]{4,64}", prefix):
        raise RolloutError(f"a fingerprint is 4 to 64 hexadecimal digits, not {fingerprint!r}")
    found = list(AnalyzerVersion.objects.filter(queue=queue, fingerprint__startswith=prefix)[:2])
    if not found:
        raise VersionNotFound(f"no version {prefix} on {queue!r}")
    if len(found) > 1:
        raise RolloutError(f"{prefix} names more than one version of {queue!r}: give more digits")
    return do_transition(
        version=found[0], to=S.RETIRED, actor=actor, token=None, reason=reason or "retired"
    )


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


def ensure_baseline(*, queue: str = QUEUE, actor: Any = "system") -> AnalyzerVersion:
    """The queue's current version; on a queue that never had one, register the
    deployed default config and make it current (registered → current, the only edge
    that skips the gate) under a short hold of the deploy lock."""
    current = current_version(queue)
    if current is not None:
        return current

    # The lock first, then the version: a refused adoption (the lock is held) leaves
    # no registered version behind (docs/rollouts.md#refusals-leave-nothing-behind).
    key = workers_locks.deploy(queue)
    try:
        lock = locks.redlock().acquire(
            key,
            ttl=max(settings.LOCK_TTL, 5.0),
            holder={"worker": f"baseline@{socket.gethostname()}"},
        )
    except LockNotAcquired:
        held = describe_lock(locks.redlock().inspect(key))
        raise RolloutBusy(f"the deploy lock of {queue!r} is held by {held}") from None
    try:
        # InvalidTransition: another process made a version current meanwhile.
        with contextlib.suppress(InvalidTransition), transaction.atomic():
            version = register_version(
                queue=queue,
                config={
                    "detect_renames": analysis.DEFAULT.detect_renames,
                    "ignore_whitespace": analysis.DEFAULT.ignore_whitespace,
                    "exclude_paths": list(analysis.DEFAULT.exclude_paths),
                },
                actor=actor,
            )
            do_transition(
                version=version,
                to=S.CURRENT,
                actor=actor,
                token=lock.token,
                reason="baseline: the deployed default analyzer",
            )
    finally:
        lock.release()
    current = current_version(queue)
    assert current is not None
    return current
