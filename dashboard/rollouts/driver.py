"""The rollout driver (docs/locks.md, docs/rollouts.md): holds one rollout's deploy lock
and drives it.

It takes ``locks:queue:{queue}:deploy`` with our Redlock (fencing token from the
database), extends it from a heartbeat thread every TTL/3 and stamps
``Rollout.heartbeat_at`` with each extension, polls the rollout row for operators'
requests (``rollouts.request_action``) and, with ``auto``, advances it: warm → verify →
diff → ramp steps with a health check → promote, or roll back. Every routing change it
makes presents its token. Where the driver runs, and what happens when it dies, is in
``dashboard.rollouts.deploy_lock``.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import close_old_connections, transaction
from django.utils import timezone

from dashboard import locks, observability, versions
from dashboard.accounts import record_audit
from dashboard.locks import check_token
from dashboard.models import AnalyzerVersion, Rollout, RolloutEvent
from dashboard.rollouts import checks, contract, drains, freeze, start, steps, waiting, warming
from dashboard.rollouts.steps import abort_in_place
from dashboard.versions import RolloutBusy, RolloutError, canary_health, describe_lock
from workers import locks as workers_locks
from workers.locks import Lock, LockLost, LockNotAcquired, Redlock

log = logging.getLogger(__name__)

S = AnalyzerVersion.State
R = Rollout.State


def _redlock() -> Redlock:

    return locks.redlock()


class RolloutDriver:
    """Holds one rollout's deploy lock and drives the rollout.

    Not thread-safe beyond its own heartbeat: one thread calls ``acquire``/``tick``/
    ``run``/``release``.
    """

    def __init__(
        self,
        rollout_id: int,
        *,
        ttl: float | None = None,
        name: str | None = None,
        redlock: Redlock | None = None,
        poll: float = 0.5,
        step_pause: float | None = None,
        warm_timeout: float | None = None,
        min_samples: int | None = None,
        warmer: Callable[[Rollout], object] | None = None,
    ) -> None:
        """Knobs left ``None`` come from the rollout's ``options`` (then ``OPTIONS``)."""
        options = start.validate_options(
            Rollout.objects.values_list("options", flat=True).get(pk=rollout_id)
        )
        self.rollout_id = rollout_id
        self.ttl = float(ttl if ttl is not None else settings.LOCK_TTL)
        self.name = name or f"rollout-driver@{socket.gethostname()}:{os.getpid()}"
        self._redlock = redlock
        self.poll = poll
        self.step_pause = float(options["step_pause"] if step_pause is None else step_pause)
        self.warm_timeout = float(options["warm_timeout"] if warm_timeout is None else warm_timeout)
        self.min_samples = int(options["min_samples"] if min_samples is None else min_samples)
        self.warmer = warmer
        #: The rollout's options (``step_deadline``, ``on_inconclusive``, ``shadow_commits``).
        self.options = options
        self.lock: Lock | None = None
        #: Set once the lease is gone (failed extension, or another holder's token).
        self.lost = threading.Event()
        self.stopping = threading.Event()
        self._hb_stop = threading.Event()
        self._hb: threading.Thread | None = None
        #: Heartbeats that failed for another reason than a lost lease (and were retried).
        self.heartbeat_errors = 0

    @property
    def redlock(self) -> Redlock:
        return self._redlock or _redlock()

    @property
    def token(self) -> int | None:
        return self.lock.token if self.lock is not None else None

    # ------------------------------------------------------------------------ the lock

    def acquire(
        self,
        *,
        actor: Any = "system",
        takeover: bool = False,
        force: bool = False,
        reason: str = "",
    ) -> Rollout:
        """Take the rollout's deploy lock and record this driver as its holder.

        1. ``takeover=False``: the rollout must be ``pending`` (its first driver).
           ``takeover=True``: it must be active, or completed (a rollback after promote).
        2. A lease still in Redis refuses a takeover (naming its holder) unless ``force``:
           then it is deleted by its nonce (compare-and-delete: a newer lease is never
           touched).
        3. Acquire with Redlock; the token comes from ``dashboard.locks.fencing.next_token`` and
           is newer than every token issued before, the old holder's included.
        4. In one transaction: re-check the rollout's state, record holder, token, since,
           heartbeat; pending → active; a ``lock.taken`` or ``takeover`` event (audited).
           Race: two takeovers at once — Redlock lets one hold the lease; if both got it
           one after the other, the later one has the larger token and ``check_token``
           refuses the earlier one's record.
        5. Start the heartbeat.
        """
        ro = Rollout.objects.select_related("version").get(pk=self.rollout_id)
        if not takeover and ro.state != R.PENDING:
            raise RolloutError(f"rollout #{ro.pk} is {ro.state}: its driver already ran")
        if takeover and not (ro.is_active or ro.state == R.COMPLETED):
            raise RolloutError(f"rollout #{ro.pk} is {ro.state}: nothing to take over")
        if takeover and ro.state == R.COMPLETED:
            # Re-opened by a rollback: never while another rollout of the queue is in
            # progress — its driver holds this very lock (docs/rollouts.md#operator-actions).
            other = steps.other_active_rollout(ro)
            if other is not None:
                raise RolloutBusy(
                    f"rollout #{other.pk} of {ro.queue!r} is {other.state} and holds its "
                    f"deploy lock: end it before rolling back rollout #{ro.pk}"
                )
        key = workers_locks.deploy(ro.queue)
        held = self.redlock.inspect(key)
        if held is not None and takeover:
            own = (held.get("holder") or {}).get("token") == ro.lock_token
            if not force:
                raise RolloutBusy(
                    f"the deploy lock of {ro.queue!r} is still held by {describe_lock(held)}"
                    f"{'' if own else f', not by rollout #{ro.pk}'}; wait for the lease to "
                    "run out or force the takeover"
                )
            if held.get("nonce"):
                # An explicit force only, and audited before the lease is touched: the
                # record stays even if the acquire below fails (docs/security.md).
                record_audit(
                    user=actor,
                    action="rollout.lock.break",
                    target=key,
                    outcome=f"forced: broke the lease of {describe_lock(held)}",
                    detail={
                        "rollout": ro.pk,
                        "own": own,
                        "holder": held.get("holder") or {},
                        "reason": reason,
                    },
                )
                self.redlock.force_release(key, str(held["nonce"]))
        holder = {"worker": self.name, "job": f"rollout-{ro.pk}", "version": ro.version.fingerprint}
        try:
            lock = self.redlock.acquire(key, ttl=self.ttl, holder=holder)
        except LockNotAcquired:
            raise RolloutBusy(
                f"the deploy lock of {ro.queue!r} is held by "
                f"{describe_lock(self.redlock.inspect(key))}"
            ) from None
        try:
            with transaction.atomic():
                ro = (
                    Rollout.objects.select_for_update(of=("self",))
                    .select_related("version")
                    .get(pk=ro.pk)
                )
                check_token(key, lock.token)
                if not takeover and ro.state != R.PENDING:
                    raise RolloutError(f"rollout #{ro.pk} is {ro.state}: its driver already ran")
                old = {
                    "holder": ro.lock_holder,
                    "token": ro.lock_token,
                    "heartbeat_at": ro.heartbeat_at.isoformat() if ro.heartbeat_at else None,
                }
                now = timezone.now()
                ro.lock_holder = self.name
                ro.lock_token = lock.token
                ro.lock_since = now
                ro.heartbeat_at = now
                ro.save(
                    update_fields=[
                        "lock_holder",
                        "lock_token",
                        "lock_since",
                        "heartbeat_at",
                        "updated_at",
                    ]
                )
                versions.record_event(
                    ro,
                    ro.version,
                    "takeover" if takeover else "lock.taken",
                    "",
                    "",
                    actor,
                    reason or ("takeover" if takeover else "deploy lock taken"),
                    lock.token,
                    {
                        "key": key,
                        "holder": self.name,
                        "forced": force,
                        **({"previous": old} if takeover else {}),
                    },
                )
                versions.publish_rollout_event(
                    ro.version, ro, "takeover" if takeover else "lock_taken"
                )
                if ro.state == R.PENDING:
                    steps.set_rollout_state(
                        rollout=ro,
                        to=R.ACTIVE,
                        actor=actor,
                        token=lock.token,
                        reason="deploy lock taken",
                    )
        except BaseException:
            try:
                lock.release()
            except Exception:
                log.warning("could not release the deploy lock of rollout #%s", ro.pk)
            raise
        self.lock = lock
        self._start_heartbeat()
        return Rollout.objects.get(pk=ro.pk)

    def _start_heartbeat(self) -> None:
        self._hb_stop.clear()
        self._hb = threading.Thread(
            target=self._heartbeat, name=f"rollout-heartbeat-{self.rollout_id}", daemon=True
        )
        self._hb.start()

    def _heartbeat(self) -> None:
        """Extend every TTL/3. A failed extension, or a rollout row that names another
        token (taken over), ends the lease for this driver: ``lost`` is set and no further
        routing change of ours can pass ``do_transition``'s token check anyway.

        Any other error (the database refuses the ``heartbeat_at`` stamp, a master
        answers garbage) is logged and counted (``heartbeat_errors``, and
        ``gitward_rollout_heartbeat_errors_total``) and the beat goes
        on at its next interval: the lease is the Redis one, extended on its own, so a
        database blip neither ends the drive nor lets the lease lapse unnoticed. The
        thread never dies silently: whatever ends it sets ``lost`` unless it was asked
        to stop, so ``tick`` returns False and the drive ends
        (docs/rollouts.md#the-drivers-heartbeat).
        """
        lock = self.lock
        assert lock is not None
        try:
            while not self._hb_stop.wait(self.ttl / 3.0):
                try:
                    lock.extend(self.ttl)
                    stamped = Rollout.objects.filter(
                        pk=self.rollout_id, lock_token=lock.token
                    ).update(heartbeat_at=timezone.now())
                except LockLost as exc:
                    log.warning("rollout #%s: deploy lock lost: %s", self.rollout_id, exc)
                    self.lost.set()
                    return
                except Exception as exc:
                    self.heartbeat_errors += 1
                    observability.count_rollout_heartbeat_error()
                    log.warning(
                        "rollout #%s: heartbeat failed (%s: %s); retrying in %.1fs",
                        self.rollout_id, type(exc).__name__, exc, self.ttl / 3.0,
                    )  # fmt: skip
                    # A broken connection is replaced on the next beat, not reused.
                    close_old_connections()
                    continue
                if not stamped:
                    self.lost.set()
                    return
        except BaseException:
            log.exception("rollout #%s: heartbeat thread died", self.rollout_id)
            raise
        finally:
            if not self._hb_stop.is_set():
                self.lost.set()
            close_old_connections()

    def release(self, *, actor: Any = "system", reason: str = "") -> None:
        """Stop the heartbeat and release the lease (a lost one is only forgotten)."""
        lock, self.lock = self.lock, None
        if lock is None:
            return
        self._hb_stop.set()
        if self._hb is not None and self._hb is not threading.current_thread():
            self._hb.join()
        released = False
        if not self.lost.is_set():
            try:
                lock.release()
                released = True
            except Exception as exc:
                log.warning("rollout #%s: deploy lock release failed: %s", self.rollout_id, exc)
        with transaction.atomic():
            ro = Rollout.objects.select_related("version").get(pk=self.rollout_id)
            versions.record_event(
                ro,
                ro.version,
                "lock.released" if released else "lock.lost",
                "",
                "",
                actor,
                reason or ("deploy lock released" if released else "lease lost"),
                lock.token,
                {"key": lock.key, "holder": self.name},
            )
            versions.publish_rollout_event(
                ro.version, ro, "lock_released" if released else "lock_lost"
            )

    # ------------------------------------------------------------------------ driving

    def tick(self) -> bool:
        """One pass: run a requested action, then (``auto``) advance. False when the
        driver has nothing more to do (rollout finished, or lease lost)."""
        if self.lost.is_set() or self.lock is None:
            return False
        ro = Rollout.objects.select_related("version", "previous").get(pk=self.rollout_id)
        if ro.lock_token != self.token:
            self.lost.set()
            return False
        token = int(self.lock.token or 0)
        request = ro.pending_action
        if request:
            # Claim the request: a conditional UPDATE, so a request is executed once even
            # if a second driver (takeover) polls the same row. Claim and action commit
            # together: whoever waits for ``pending_action`` to clear (the CLI, the
            # buttons) then reads the action's result, never the state before it; and an
            # action that fails outright leaves its request pending for the next tick.
            with transaction.atomic():
                claimed = Rollout.objects.filter(pk=ro.pk, pending_action=request).update(
                    pending_action=None
                )
                if claimed:
                    self._run_action(ro, request, token)
            ro = Rollout.objects.select_related("version", "previous").get(pk=ro.pk)
        if ro.state in {R.COMPLETED, R.ROLLED_BACK, R.FAILED, R.ABORTED}:
            return False
        try:
            self._advance(ro, token)
        except versions.RolloutConflict:
            self.lost.set()
            return False
        ro.refresh_from_db()
        return ro.is_active

    def _run_action(self, ro: Rollout, request: dict[str, Any], token: int) -> None:
        actor = request.get("actor", "system")
        action = request.get("action")
        try:
            freeze.refuse_frozen_request(ro.pk, str(action), request.get("params"))
            if action == "promote":
                # An operator's promote asks the gates due too (docs/rollouts.md#checks-and-gates).
                gate = checks.ask_gates(ro, fresh=True) if ro.step_index >= 0 else None
                if gate is not None and gate["verdict"] != "pass":
                    raise RolloutError(f"promote held by a gate: {gate['summary']}")
                self._next_step(ro, token, actor)
            elif action == "set_ramp":
                steps.set_ramp(
                    rollout=ro, percent=int(request["params"]["percent"]), token=token, actor=actor
                )
            elif action in {"rollback", "abort"}:
                # The operator's reason (the confirm step's text) goes on the timeline and
                # the checklist's rollback steps, not only on the audit row of the click.
                why = str((request.get("params") or {}).get("reason") or "").strip()
                abort_in_place(ro, token=token, actor=actor, reason=why or str(action))
        except (RolloutError, KeyError, ValueError, TypeError) as exc:
            with transaction.atomic():
                versions.record_event(
                    ro,
                    ro.version,
                    "action.failed",
                    "",
                    "",
                    actor,
                    str(action),
                    token,
                    {"error": str(exc)},
                )

    def _next_step(self, ro: Rollout, token: int, actor: Any) -> None:
        state = AnalyzerVersion.objects.values_list("state", flat=True).get(pk=ro.version_id)
        if state == S.VERIFIED:
            steps.set_ramp(rollout=ro, percent=ro.steps[0], token=token, actor=actor)
        elif state == S.RAMPING and ro.step_index + 1 < len(ro.steps):
            steps.set_ramp(
                rollout=ro, percent=ro.steps[ro.step_index + 1], token=token, actor=actor
            )
        elif state == S.RAMPING:
            steps.promote(rollout=ro, token=token, actor=actor)
        else:
            raise RolloutError(f"{ro.version} is {state}: nothing to promote yet")

    def _advance(self, ro: Rollout, token: int) -> None:

        actor = self.name
        version = AnalyzerVersion.objects.get(pk=ro.version_id)
        if ro.state == R.ROLLING_BACK:
            drains.check_drain(rollout=ro, token=token, actor=actor)
            return
        if version.state not in steps.DRIVEN:
            # Retired meanwhile (or moved by hand): no step applies, so end the rollout
            # rather than tick for ever (docs/rollouts.md#ending-a-rollout).
            steps.end_unrollable(rollout=ro, token=token, actor=actor)
            return
        if version.state in {S.REGISTERED, S.WARM_FAILED, S.DRAINED}:
            if not ro.warm_set.get("items") and ro.previous is not None:
                spec = {k: v for k, v in ro.warm_set.items() if k != "items"}
                ro.warm_set = warming.select_warm_set(
                    fingerprint=ro.previous.fingerprint,
                    **{
                        k: spec[k]
                        for k in ("repositories", "commits_per_repository", "threshold")
                        if k in spec
                    },
                )
                ro.save(update_fields=["warm_set", "updated_at"])
            ro = steps.begin_warming(rollout=ro, token=token, actor=actor)
            if self.warmer is not None:
                result = self.warmer(ro)
                with transaction.atomic():
                    versions.record_event(
                        ro, ro.version, "warming.enqueued", "", "", actor,
                        "warm set enqueued to the new version's queue", token,
                        dict(result) if isinstance(result, dict) else {},
                    )  # fmt: skip
            return
        if version.state == S.WARMING:
            verdict = warming.verify_warm_set(version=version, warm_set=ro.warm_set)
            # The result contract, checked on the warm commits stored so far: a broken
            # one fails the verdict at once (docs/rollouts.md#result-contract).
            verdict = contract.judge_warming(ro, verdict, token=token)
            _record_progress(ro, verdict, token, actor)
            since = version.state_changed_at or ro.created_at
            timed_out = timezone.now() - since > timedelta(seconds=self.warm_timeout)
            passed = verdict["checks"]
            definitive = not all(passed.get(k, True) for k in ("errors", "fingerprint", "contract"))
            if verdict["ok"] or definitive or timed_out:
                if timed_out and not verdict["ok"]:
                    verdict["summary"] += f" (gave up after {self.warm_timeout:.0f}s)"
                steps.record_verdict(rollout=ro, verdict=verdict, token=token, actor=actor)
            return
        if version.state in {S.VERIFIED, S.RAMPING} and contract.broken(
            ro, token=token, actor=actor
        ):
            return  # rolled back: the result contract (docs/rollouts.md#result-contract)
        if version.state == S.VERIFIED:
            if not ro.diff and ro.previous is not None:
                diff = warming.diff_results(
                    base=ro.previous.fingerprint, new=version.fingerprint, warm_set=ro.warm_set
                )
                steps.record_diff(rollout=ro, diff=diff, token=token, actor=actor)
            if ro.auto and not self._frozen(ro, token, f"ramp to {ro.steps[0]}%"):
                steps.set_ramp(rollout=ro, percent=ro.steps[0], token=token, actor=actor)
            return
        if version.state == S.RAMPING:
            checks.measure_step(ro)  # recorded for manual rollouts too (the page shows them)
        if version.state == S.RAMPING and ro.auto:
            started = ro.step_started_at or timezone.now()
            if timezone.now() - started < timedelta(seconds=self.step_pause):
                return
            health = canary_health(rollout=ro, since=started, min_samples=self.min_samples)
            # The operator's checks beside the health check (docs/rollouts.md#checks-and-gates).
            measured = checks.step_checks(ro)
            if health["verdict"] == "fail" or measured["verdict"] == "fail":
                # Also from a paused step: a failing canary is never left serving.
                why = health["summary"] if health["verdict"] == "fail" else measured["summary"]
                what = "canary health check" if health["verdict"] == "fail" else "step check"
                abort_in_place(ro, token=token, actor=actor, reason=f"{what} failed: {why}")
            elif waiting.paused(ro) is not None:
                return  # paused at its deadline: an operator promotes or rolls back
            elif health["verdict"] == "pass" and measured["verdict"] == "pass":
                if not self._frozen(ro, token, _next_label(ro)):
                    gate = checks.ask_gates(ro)
                    if gate["verdict"] == "pass":
                        self._next_step(ro, token, actor)
                    elif gate["verdict"] == "fail":
                        abort_in_place(
                            ro, token=token, actor=actor, reason=f"gate refused: {gate['summary']}"
                        )
                    elif gate["verdict"] == "inconclusive":
                        self._past_deadline(ro, token, {**health, "summary": gate["summary"]})
            else:
                if health["verdict"] != "pass":
                    self._shadow(ro, token, health)
                summary = "; ".join(
                    t for t in (
                        health["summary"] if health["verdict"] != "pass" else "",
                        measured["summary"],
                    ) if t
                )  # fmt: skip
                self._past_deadline(ro, token, {**health, "summary": summary})

    def _past_deadline(self, ro: Rollout, token: int, health: dict[str, Any]) -> None:
        """An inconclusive step (health, checks or a gate that did not answer) follows
        ``on_inconclusive`` once its deadline passed (docs/rollouts.md#step-deadlines)."""
        deadline = waiting.deadline_of(ro)
        if deadline is not None and timezone.now() >= deadline:
            self._deadline(ro, token, {**health, "verdict": "inconclusive"})

    def _shadow(self, ro: Rollout, token: int, health: dict[str, Any]) -> None:
        """Live traffic too thin for the step's health check: send the canary a bounded,
        deterministic sample of real work once per step (docs/rollouts.md#shadow-samples):
        the samples it lacks, at most ``shadow_commits``. Recorded as ``shadow.enqueued``
        (also when nothing was left to send, so the waiting reason can say so)."""
        if waiting.step_event(ro, "shadow.enqueued") is not None:
            return
        need = max(0, self.min_samples - int(health["canary"]["samples"]))
        count = min(need, int(self.options["shadow_commits"]))
        if count < 1:
            return
        result = warming.shadow_rollout(ro, count)
        if "skipped" in result:
            return  # another planner holds the warming lock: tried again next tick
        percent = ro.steps[ro.step_index]
        with transaction.atomic():
            versions.record_event(
                ro, ro.version, "shadow.enqueued", "", "", self.name,
                f"step {percent}%: {result['commits']} commits of {result['repositories']} "
                "repositories sent to the canary as shadow work", token,
                {**result, "step_index": ro.step_index, "percent": percent, "samples":
                 health["canary"]["samples"], "min_samples": self.min_samples},
            )  # fmt: skip
        versions.publish_rollout_event(ro.version, ro, "shadow")

    def _deadline(self, ro: Rollout, token: int, health: dict[str, Any]) -> None:
        """The step is still inconclusive at its deadline: follow ``on_inconclusive``
        (docs/rollouts.md#step-deadlines). ``pause`` records the step as paused (the
        driver stops advancing it; promote and rollback still work); ``fail`` rolls it
        back. Either way a ``step.deadline`` event says so — never silence.

        Race: an operator's promote or rollback cannot slip in between the health check
        and this event: requests run in this thread, at the start of ``tick``. A promote
        on a later tick starts a new step (a new ``step_started_at``), so the pause,
        which is read per step (``waiting.paused``), no longer applies to it."""
        policy = str(self.options["on_inconclusive"])
        percent = ro.steps[ro.step_index]
        summary = health["summary"]
        then = "paused for an operator" if policy == "pause" else "rolled back"
        reason = f"step {percent}%: still inconclusive at its deadline ({summary}): {then}"
        with transaction.atomic():
            versions.record_event(
                ro, ro.version, "step.deadline", "", "", self.name, reason, token,
                {"policy": policy, "step_index": ro.step_index, "percent": percent,
                 "summary": summary, "verdict": health["verdict"],
                 "samples": health["canary"]["samples"], "min_samples": self.min_samples},
            )  # fmt: skip
        versions.publish_rollout_event(ro.version, ro, "paused" if policy == "pause" else "failed")
        if policy == "fail":
            abort_in_place(ro, token=token, actor=self.name, reason=reason)

    def _frozen(self, ro: Rollout, token: int, step: str) -> bool:
        """An ``auto`` step advance waits out a freeze (docs/rollouts.md#freeze-windows),
        saying on the timeline which window and until when."""
        return freeze.driver_waits(ro, token=token, actor=self.name, step=step)

    def run(self, *, stop: threading.Event | None = None) -> str:
        """Tick every ``poll`` seconds until the rollout ends, the lease is lost or
        ``stop`` is set; release the lock; return the rollout's state."""
        stop = stop or self.stopping
        try:
            while not stop.is_set() and self.tick():
                stop.wait(self.poll)
        finally:
            self.release(actor=self.name, reason="stopped" if stop.is_set() else "rollout finished")
            close_old_connections()
        return str(Rollout.objects.values_list("state", flat=True).get(pk=self.rollout_id))


def _next_label(ro: Rollout) -> str:
    """What the next step advance of a ramping rollout is, in words."""
    nxt = ro.step_index + 1
    return f"ramp to {ro.steps[nxt]}%" if nxt < len(ro.steps) else "promote to current"


def _record_progress(ro: Rollout, verdict: dict[str, Any], token: int, actor: Any) -> None:
    """A ``warming.progress`` event whenever the stored count of the warm set changed
    (the rollout page's bar and the timeline read it)."""
    last = (
        RolloutEvent.objects.filter(rollout=ro, action="warming.progress")
        .order_by("-at", "-id")
        .first()
    )
    stored = int(verdict.get("stored", 0))
    if last is not None and last.detail.get("stored") == stored:
        return
    with transaction.atomic():
        versions.record_event(
            ro, ro.version, "warming.progress", "", "", actor,
            f"{stored}/{verdict.get('expected', 0)} warm commits stored", token,
            {"stored": stored, "expected": verdict.get("expected", 0),
             "coverage": verdict.get("coverage")},
        )  # fmt: skip
