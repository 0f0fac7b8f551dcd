"""Pinning (docs/rollouts.md#pinning): an operator pins chosen repositories to a rollout's
ramping version to try it on them first, whatever the ramp percentage.

A pin is a ``RolloutPin`` row; ``dashboard.versions.canary.version_for`` routes a pinned
repository's work (key ``repo:<id>``) to the ramping version while the rollout is
active and its version ramping, and by the hash bucket otherwise. Pinning schedules a
sync of each newly pinned repository (as a push does: ``repositories.schedule_sync``),
whose plan then includes the ramping version's analysis. A rollback, an abort or the
promote ends the rollout and clears its pins (:func:`clear_pins`, called from
``steps.set_rollout_state`` in the same transaction).

Each change is one transaction on the locked rollout row and writes a ``pins.added`` /
``pins.removed`` timeline event (which ``record_event`` audits as ``rollout.pins.*``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from django.db import transaction

from dashboard.infra import QueueUnavailable
from dashboard.models import AnalyzerVersion, Repository, Rollout, RolloutPin
from dashboard.repositories import schedule_sync
from dashboard.versions import InvalidTransition, RolloutError, actor_name, record_event

__all__ = ["clear_pins", "pin_repositories", "pinned", "unpin_repositories"]

log = logging.getLogger(__name__)
S = AnalyzerVersion.State
#: At most this many repositories per request (a pin is a try-out, not a ramp).
MAX_PINS = 100


def _ids(repositories: Iterable[Any]) -> list[int]:
    try:
        ids = sorted({int(r) for r in repositories})
    except (TypeError, ValueError):
        raise RolloutError('"repositories" must be a list of repository ids') from None
    if not ids:
        raise RolloutError('"repositories" must name at least one repository id')
    if not all(0 < i < 2**63 for i in ids):
        raise RolloutError('"repositories" must be repository ids (positive integers)')
    if len(ids) > MAX_PINS:
        raise RolloutError(f"at most {MAX_PINS} repositories per request")
    return ids


def _locked_ramping(rollout_id: int, verb: str) -> Rollout:
    """The rollout row locked, if it is active with its version ramping; else
    ``InvalidTransition`` naming the state (a 409)."""
    ro = (
        Rollout.objects.select_for_update(of=("self",))
        .select_related("version")
        .filter(pk=rollout_id)
        .first()
    )
    if ro is None:
        raise Rollout.DoesNotExist(f"no rollout #{rollout_id}")
    state = AnalyzerVersion.objects.values_list("state", flat=True).get(pk=ro.version_id)
    if ro.state != Rollout.State.ACTIVE or state != S.RAMPING:
        raise InvalidTransition(
            f"rollout #{ro.pk} is {ro.state} and its version {state}: "
            f"only a ramping rollout's repositories can be {verb}"
        )
    return ro


def pin_repositories(
    *, rollout: Rollout | int, repositories: Iterable[Any], actor: Any
) -> list[int]:
    """Pin the repositories to the rollout's ramping version; returns every pinned id.
    Unknown ids are refused (``RolloutError``) before anything is written.

    Race: a rollback committing meanwhile — both lock the rollout row, so either the
    pin sees the rollout rolling back and is refused, or the rollback runs after it
    and clears the pins (``clear_pins``)."""
    ids = _ids(repositories)
    pk = rollout if isinstance(rollout, int) else rollout.pk
    with transaction.atomic():
        ro = _locked_ramping(pk, "pinned")
        known = set(Repository.objects.filter(pk__in=ids).values_list("pk", flat=True))
        missing = [i for i in ids if i not in known]
        if missing:
            raise RolloutError(f"no repository {', '.join(f'#{i}' for i in missing)}")
        had = set(RolloutPin.objects.filter(rollout=ro).values_list("repository_id", flat=True))
        new = [i for i in ids if i not in had]
        RolloutPin.objects.bulk_create(
            RolloutPin(rollout=ro, repository_id=i, pinned_by=actor_name(actor)) for i in new
        )
        record_event(
            ro, ro.version, "pins.added", "", "", actor,
            f"pinned {len(new)} repositor{'y' if len(new) == 1 else 'ies'} to {ro.version}",
            None, {"repositories": new, "pinned": sorted(had | set(new))},
        )  # fmt: skip
        transaction.on_commit(lambda: _sync(new))
    return sorted(had | set(new))


def _sync(ids: list[int]) -> None:
    """Schedule a sync of each newly pinned repository, so its plan includes the ramping
    version now. Only the fast path: unreachable, the pin still routes its next sync."""
    try:
        for repo in Repository.objects.filter(pk__in=ids):
            schedule_sync(repo)
    except QueueUnavailable as exc:
        log.warning("pinned repositories not synced now: %s", exc)


def unpin_repositories(
    *, rollout: Rollout | int, repositories: Iterable[Any], actor: Any
) -> list[int]:
    """Remove the pins; returns the ids still pinned. Work already planned for the
    ramping version stays planned (its results are a shadow until promotion)."""
    ids = _ids(repositories)
    pk = rollout if isinstance(rollout, int) else rollout.pk
    with transaction.atomic():
        ro = _locked_ramping(pk, "unpinned")
        rows = RolloutPin.objects.filter(rollout=ro, repository_id__in=ids)
        gone = sorted(rows.values_list("repository_id", flat=True))
        rows.delete()
        left = sorted(RolloutPin.objects.filter(rollout=ro).values_list("repository_id", flat=True))
        record_event(
            ro, ro.version, "pins.removed", "", "", actor,
            f"unpinned {len(gone)} repositor{'y' if len(gone) == 1 else 'ies'}", None,
            {"repositories": gone, "pinned": left},
        )  # fmt: skip
    return left


def clear_pins(ro: Rollout, *, actor: Any, reason: str) -> int:
    """Drop every pin of the rollout (it ends, or rolls back); inside the caller's
    transaction, recorded as ``pins.cleared`` when there were any."""
    rows = RolloutPin.objects.filter(rollout=ro)
    gone = sorted(rows.values_list("repository_id", flat=True))
    if not gone:
        return 0
    rows.delete()
    record_event(
        ro, ro.version, "pins.cleared", "", "", actor, f"pins cleared: {reason}", None,
        {"repositories": gone},
    )  # fmt: skip
    return len(gone)


def pinned(ro: Rollout) -> list[dict[str, Any]]:
    """The rollout's pins: ``[{"repository", "url", "pinned_by", "pinned_at"}]``."""
    return [
        {
            "repository": p.repository_id,
            "url": p.repository.url,
            "pinned_by": p.pinned_by,
            "pinned_at": p.pinned_at.isoformat(),
        }
        for p in RolloutPin.objects.filter(rollout=ro).select_related("repository")
    ]
