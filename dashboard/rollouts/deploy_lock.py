"""The deploy lock of a rollout and the driver that holds it (docs/locks.md, docs/rollouts.md).

Where the lock lives. A rollout outlives the HTTP request or CLI call that starts it, so
``locks:queue:{queue}:deploy`` is held by a **driver**, not by the caller:

* ``workers.jobs.drive_rollout(rollout_id)`` — an RQ job on the ``rollouts`` queue, run
  by a worker of the ``up``/``worker`` pool (enqueued by ``start_rollout`` after commit), or
* ``manage.py rollout drive ID`` — the same driver in the foreground (SIGTERM releases
  the lock; the rollout then waits for a takeover).

The driver (``dashboard.rollouts.driver.RolloutDriver``) takes the
lock with a fencing token, keeps it alive from a heartbeat thread, runs operators'
requests and, with ``auto``, advances the rollout; every routing change it makes
presents its token.

If the driver dies its lease runs out after one TTL; ``takeover_rollout`` then takes the
lock with a *new* token (the dead holder's token is stale from that moment: any routing
change it still attempts is rejected by ``rollouts.do_transition``), and
``abort_rollout`` / ``rollback_rollout`` route back. ``force=True`` breaks a lease that is
still running (emergency rollback); both are audited.
"""

from __future__ import annotations

import time
from typing import Any

from dashboard import locks
from dashboard.models import Rollout
from dashboard.rollouts import start
from dashboard.rollouts.driver import RolloutDriver
from dashboard.rollouts.steps import abort_in_place
from workers import locks as workers_locks

R = Rollout.State

__all__ = [
    "abort_rollout",
    "driver_alive",
    "holder_alive",
    "rollback_rollout",
    "takeover_rollout",
]


def takeover_rollout(
    *, rollout: Rollout | int, actor: Any, reason: str, force: bool = False, **driver: Any
) -> RolloutDriver:
    """Take over a rollout whose holder died (its lease ran out) — or, with ``force``,
    one whose holder is alive. Returns a driver holding the lock with a new token in
    this process; call ``run()`` to keep driving or ``release()``. Audited. Refused
    (``InvalidTransition``) for a rollout that has ended (``start.refusal``)."""
    pk = start.check_applies(rollout, "takeover").pk
    d = RolloutDriver(pk, **driver)
    d.acquire(actor=actor, takeover=True, force=force, reason=reason or "takeover")
    return d


def rollback_rollout(
    *,
    rollout: Rollout | int,
    actor: Any,
    reason: str = "rollback",
    force: bool = False,
    wait: float = 0.0,
    **driver: Any,
) -> Rollout:
    """The one-button rollback.

    0. Refuse (``InvalidTransition``, before the lock is touched) a rollout it does not
       apply to (``start.refusal``): one that ended other than completed, a completed
       one whose version is no longer current, or one completed while another rollout
       of the queue is in progress (that rollout's driver holds the deploy lock).
    1. Take the deploy lock: a new lease with a new token when the holder is gone (a
       completed rollout, or a dead driver); a live holder's lease only with ``force``
       (emergency rollback, audited) — otherwise the request goes to that holder
       (``request_action``, which lets a rollback supersede a pending promote) and this
       returns at once. A lease still in Redis that is not a live holder's (a dead
       driver's, not yet expired) is broken only with ``force`` too.
    2. Route back (``rollouts.rollback``): the previous version's stored results are
       served from the moment it commits.
    3. Drain: tick until the new version is drained or ``wait`` seconds passed, then
       release the lock. Drain bookkeeping needs no token, so an unfinished drain is
       completed later by any driver or the reconciler (``drains.check_drain``).
    """
    return _end(rollout, "rollback", actor, reason, force, wait, driver)


def abort_rollout(
    *,
    rollout: Rollout | int,
    actor: Any,
    reason: str = "abort",
    force: bool = False,
    wait: float = 0.0,
    **driver: Any,
) -> Rollout:
    """End a rollout that has not ended, from any of its states (pending, active,
    rolling back; docs/rollouts.md#ending-a-rollout): a live driver is asked (unless
    ``force``), a dead or absent one's lock is taken here. A version the rollout never
    routed to (registered, warm_failed, drained, retired) is left as it is and the
    rollout is aborted; otherwise the version is rolled back and drains. A completed
    rollout is refused (``InvalidTransition``: roll it back instead)."""
    return _end(rollout, "abort", actor, reason, force, wait, driver)


def _end(
    rollout: Rollout | int,
    action: str,
    actor: Any,
    reason: str,
    force: bool,
    wait: float,
    driver: dict[str, Any],
) -> Rollout:
    ro = start.check_applies(rollout, action)
    pk = ro.pk
    if ro.is_active and holder_alive(ro) and not force:
        return start.request_action(
            rollout=ro, action=action, actor=actor, params={"reason": reason}
        )
    d = RolloutDriver(pk, **driver)
    d.acquire(actor=actor, takeover=True, force=force, reason=reason or action)
    try:
        token = int(d.token or 0)
        ro = Rollout.objects.select_related("version").get(pk=pk)
        abort_in_place(ro, token=token, actor=actor, reason=reason, reopen=action == "rollback")
        deadline = time.monotonic() + wait
        while d.tick() and time.monotonic() < deadline:
            time.sleep(d.poll)
    finally:
        d.release(actor=actor, reason=f"{action} routed")
    return Rollout.objects.get(pk=pk)


def holder_alive(ro: Rollout) -> bool:
    """The rollout's deploy lock is in Redis under its recorded token (a live driver)."""
    info = locks.redlock().inspect(workers_locks.deploy(ro.queue))
    return bool(info and (info.get("holder") or {}).get("token") == ro.lock_token)


def driver_alive(ro: Rollout) -> bool:
    """Whether the rollout's recorded driver still holds its lease (read-only)."""
    return ro.is_active and holder_alive(ro)
