"""The version state machine, its invariants and the database constraints behind them,
on the real database with the real deploy lock (Redlock over three redis-servers)."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, connection, connections, transaction

from dashboard.locks import leases
from dashboard.locks.fencing import next_token
from dashboard.models import AnalyzerVersion, AuditEntry, Rollout, RolloutEvent
from dashboard.rollouts import drains
from dashboard.rollouts import start as rollouts_start
from dashboard.rollouts import steps as rollouts_steps
from dashboard.rollouts.deploy_lock import takeover_rollout
from dashboard.rollouts.driver import RolloutDriver
from dashboard.versions import state_machine
from dashboard.versions.state_machine import (
    InvalidConfig,
    InvalidTransition,
    RolloutBusy,
    RolloutConflict,
    RolloutError,
    ensure_baseline,
)
from tests.support.checked_threads import CheckedThread
from tests.support.rollouts import (  # noqa: F401 (fixture)
    DRIVERS,
    PASSING,
    RENAMES,
    _release_drivers,
    live_events,
    start,
    state,
    verify,
    wait_for,
)
from workers.analysis.analyzer import DEFAULT
from workers.locks import keys

pytestmark = pytest.mark.django_db(transaction=True)
S = AnalyzerVersion.State


def transitions(version: AnalyzerVersion) -> list[tuple[str, str]]:
    return list(
        RolloutEvent.objects.filter(version=version, action="transition")
        .order_by("id")
        .values_list("from_state", "to_state")
    )


def test_the_baseline_is_the_deployed_default_config_and_is_current() -> None:
    base = ensure_baseline(actor="setup")
    assert base.state == S.CURRENT
    assert base.fingerprint == DEFAULT.fingerprint()
    assert transitions(base) == [("", "registered"), ("registered", "current")]
    assert ensure_baseline(actor="setup").pk == base.pk  # idempotent


def test_a_rollout_walks_every_state_to_current_and_records_each_step() -> None:
    with live_events() as collect:
        ro, driver = start()
        token = int(driver.token or 0)
        base = ro.previous
        assert base is not None and ro.state == Rollout.State.ACTIVE
        v = ro.version
        rollouts_steps.begin_warming(rollout=ro, token=token, actor="alice")
        rollouts_steps.record_verdict(rollout=ro, verdict=PASSING, token=token, actor="alice")
        assert AnalyzerVersion.objects.get(pk=v.pk).verified_at is not None
        for p in (10, 50, 100):
            ro = rollouts_steps.set_ramp(rollout=ro, percent=p, token=token, actor="alice")
            row = AnalyzerVersion.objects.get(pk=v.pk)
            assert (row.state, row.ramp_percent, ro.step_index) == (S.RAMPING, p, ro.steps.index(p))
        ro = rollouts_steps.promote(rollout=ro, token=token, actor="alice")
        events = collect(14)
    assert ro.state == Rollout.State.COMPLETED and ro.finished_at is not None
    # The outcome names the version, not the state it had before the step ("(ramping)").
    assert ro.outcome == f"{v.queue}@{v.fingerprint[:8]} is current"
    assert (state(v.pk), state(base.pk)) == (S.CURRENT, S.DRAINING)
    assert AnalyzerVersion.objects.get(pk=v.pk).ramp_percent == 0
    assert transitions(v) == [
        ("", "registered"),
        ("registered", "warming"),
        ("warming", "verified"),
        ("verified", "ramping"),
        ("ramping", "ramping"),
        ("ramping", "ramping"),
        ("ramping", "current"),
    ]
    assert transitions(base)[-1] == ("current", "draining")
    # Every transition carries the lock's token and has its audit row.
    moves = RolloutEvent.objects.filter(rollout=ro, action="transition")
    assert set(moves.values_list("token", flat=True)) == {token}
    audited = AuditEntry.objects.filter(action="rollout.transition")
    # + three registrations/adoptions outside the rollout: baseline ×2, new version ×1 …
    assert audited.count() == moves.count() + 3
    assert audited.filter(outcome="ok ramping → current", actor="alice").count() == 1
    # … and went out live, after commit, with the per-state name.
    names = [e["event"] for e in events if e["type"] == "rollout.changed"]
    assert names == [
        "rollout.registered",  # the baseline …
        "rollout.current",
        "rollout.registered",  # … then the new version
        "rollout.pending",
        "rollout.lock_taken",
        "rollout.active",
        "rollout.warming",
        "rollout.verified",
        "rollout.ramping",
        "rollout.ramping",
        "rollout.ramping",
        "rollout.draining",  # the baseline, superseded in the promote's transaction
        "rollout.current",
        "rollout.completed",
    ]
    last = events[-2]
    assert last["fingerprint"] == v.fingerprint and last["version_state"] == "current"
    drained = drains.check_version_drain(version=base, actor="t")
    assert not drained and drains.check_version_drain(version=base, actor="t")
    assert state(base.pk) == S.DRAINED


@pytest.mark.parametrize(
    ("prepare", "to", "kwargs", "message"),
    [
        ("registered", S.RAMPING, {"ramp_percent": 10}, "not allowed"),
        ("registered", S.VERIFIED, {}, "not allowed"),
        ("registered", S.CURRENT, {}, "first version"),
        ("warming", S.RAMPING, {"ramp_percent": 10}, "not allowed"),
        ("warming", S.VERIFIED, {"detail": {"verdict": {"ok": False}}}, "no passing"),
        ("warming", S.VERIFIED, {}, "no passing"),
        ("verified", S.RAMPING, {"ramp_percent": 0}, "1..100"),
        ("verified", S.RAMPING, {"ramp_percent": 101}, "1..100"),
        ("verified", S.RAMPING, {}, "1..100"),
        ("verified", S.CURRENT, {}, "not allowed"),
        ("verified", S.DRAINED, {}, "not allowed"),
    ],
)
def test_each_forbidden_transition_is_refused_and_changes_nothing(
    prepare: str, to: str, kwargs: dict, message: str
) -> None:
    ro, driver = start()
    token = int(driver.token or 0)
    if prepare in {"warming", "verified"}:
        rollouts_steps.begin_warming(rollout=ro, token=token, actor="a")
    if prepare == "verified":
        rollouts_steps.record_verdict(rollout=ro, verdict=PASSING, token=token, actor="a")
    before = RolloutEvent.objects.count(), AuditEntry.objects.count()
    with pytest.raises(InvalidTransition, match=message):
        state_machine.do_transition(
            version=ro.version_id, to=to, actor="a", token=token, rollout=ro, **kwargs
        )
    assert state(ro.version_id) == prepare
    assert (RolloutEvent.objects.count(), AuditEntry.objects.count()) == before


def test_the_current_version_only_leaves_when_another_takes_its_place() -> None:
    base = ensure_baseline(actor="setup")
    token = next_token(keys.deploy("analysis"))
    with pytest.raises(InvalidTransition, match="make another version current"):
        state_machine.do_transition(version=base, to=S.DRAINING, actor="a", token=token)
    assert state(base.pk) == S.CURRENT


def test_a_second_ramping_version_is_refused() -> None:
    ro, driver = start()
    verify(ro, driver)
    token = int(driver.token or 0)
    rollouts_steps.set_ramp(rollout=ro, percent=10, token=token, actor="a")
    other = state_machine.register_version(config={"ignore_whitespace": True}, actor="a")
    # Force it to verified with a raw write (as if a bug skipped the gate's function) …
    AnalyzerVersion.objects.filter(pk=other.pk).update(
        state=S.VERIFIED, verified_at=ro.version.created_at
    )
    # … the transition function still refuses a second ramping version.
    with pytest.raises(InvalidTransition, match="already has a ramping"):
        state_machine.do_transition(
            version=other, to=S.RAMPING, actor="a", token=token, ramp_percent=5
        )
    assert state(other.pk) == S.VERIFIED


def test_the_database_refuses_a_second_current_or_ramping_version_even_from_raw_writes() -> None:
    base = ensure_baseline(actor="setup")
    a = state_machine.register_version(config=RENAMES, actor="a")
    b = state_machine.register_version(config={"ignore_whitespace": True}, actor="a")
    with pytest.raises(IntegrityError), transaction.atomic():
        AnalyzerVersion.objects.filter(pk=a.pk).update(state=S.CURRENT)
    with pytest.raises(IntegrityError), transaction.atomic():
        AnalyzerVersion.objects.create(queue="analysis", fingerprint="f" * 16, state=S.CURRENT)
    stamp = base.created_at
    AnalyzerVersion.objects.filter(pk=a.pk).update(
        state=S.RAMPING, ramp_percent=10, verified_at=stamp
    )
    with pytest.raises(IntegrityError), transaction.atomic():
        AnalyzerVersion.objects.filter(pk=b.pk).update(
            state=S.RAMPING, ramp_percent=5, verified_at=stamp
        )
    with pytest.raises(IntegrityError), transaction.atomic():
        AnalyzerVersion.objects.filter(pk=a.pk).update(ramp_percent=101)
    with pytest.raises(IntegrityError), transaction.atomic():
        AnalyzerVersion.objects.filter(pk=b.pk).update(ramp_percent=20)  # not ramping
    with pytest.raises(IntegrityError), transaction.atomic():
        AnalyzerVersion.objects.filter(pk=b.pk).update(state=S.VERIFIED)  # gate not passed
    # Another queue has its own current version.
    AnalyzerVersion.objects.create(queue="other", fingerprint="e" * 16, state=S.CURRENT)
    assert AnalyzerVersion.objects.filter(state=S.CURRENT).count() == 2


def test_the_database_refuses_a_second_active_rollout_of_a_queue() -> None:
    start()
    other = state_machine.register_version(config={"ignore_whitespace": True}, actor="a")
    with pytest.raises(IntegrityError), transaction.atomic():
        Rollout.objects.create(queue="analysis", version=other, started_by="raw")
    Rollout.objects.create(queue="analysis", version=other, started_by="raw", state="failed")


def test_a_second_start_is_refused_at_once_naming_the_holder_and_since_when() -> None:
    ro, driver = start(actor="alice")
    with pytest.raises(RolloutBusy) as err:
        rollouts_start.start_rollout(config={"ignore_whitespace": True}, actor="bob")
    text = str(err.value)
    assert f"rollout #{ro.pk}" in text and "started by alice" in text
    assert driver.name in text and ro.lock_since.isoformat() in text
    assert Rollout.objects.count() == 1


def test_a_deploy_lock_held_outside_any_rollout_also_refuses_a_start(redis_nodes) -> None:
    from dashboard.locks import leases

    ensure_baseline(actor="setup")
    lock = leases.redlock().acquire(
        keys.deploy("analysis"), ttl=10, holder={"worker": "ops-manual-hold"}
    )
    try:
        with pytest.raises(RolloutBusy, match=r"ops-manual-hold.*since"):
            rollouts_start.start_rollout(config=RENAMES, actor="bob", enqueue_driver=False)
    finally:
        lock.release()
    assert rollouts_start.start_rollout(config=RENAMES, actor="bob", enqueue_driver=False).pk


@pytest.mark.parametrize(
    ("config", "steps", "error", "message"),
    [
        ({"renames": True}, None, InvalidConfig, "unknown key"),
        ({"detect_renames": "yes"}, None, InvalidConfig, "true or false"),
        ({"exclude_paths": "*.md"}, None, InvalidConfig, "not a string"),
        ({}, None, RolloutError, "already current"),
        (RENAMES, [], RolloutError, "at least one"),
        (RENAMES, [50, 10], RolloutError, "increase"),
        (RENAMES, [0, 100], RolloutError, "1..100"),
    ],
)
def test_bad_starts_are_refused_with_a_reason(config, steps, error, message) -> None:
    ensure_baseline(actor="setup")
    with pytest.raises(error, match=message):
        rollouts_start.start_rollout(config=config, steps=steps, actor="a", enqueue_driver=False)
    assert not Rollout.objects.exists()


def test_a_stale_token_cannot_change_routing_after_a_takeover() -> None:
    ro, old = start()
    verify(ro, old)
    stale = int(old.token or 0)
    new = takeover_rollout(rollout=ro, actor="bob", reason="test", force=True, ttl=5.0)
    DRIVERS.append(new)
    try:
        assert int(new.token or 0) > stale
        with pytest.raises(RolloutConflict, match="taken over"):
            rollouts_steps.set_ramp(rollout=ro, percent=10, token=stale, actor="alice")
        assert state(ro.version_id) == S.VERIFIED
        ro = rollouts_steps.set_ramp(rollout=ro, percent=10, token=int(new.token or 0), actor="bob")
        assert state(ro.version_id) == S.RAMPING
        take = RolloutEvent.objects.get(rollout=ro, action="takeover")
        assert take.detail["previous"]["token"] == stale and take.detail["forced"] is True
        assert AuditEntry.objects.filter(action="rollout.takeover", actor="bob").exists()
    finally:
        new.release()
        old.lost.set()  # its lease was broken by the forced takeover
        old.release()


def test_rollback_mid_ramp_routes_back_then_drains_on_two_empty_checks() -> None:
    ro, driver = start()
    verify(ro, driver)
    token = int(driver.token or 0)
    rollouts_steps.set_ramp(rollout=ro, percent=50, token=token, actor="a")
    ro = rollouts_steps.rollback(rollout=ro, token=token, actor="carol", reason="bad numbers")
    assert ro.state == Rollout.State.ROLLING_BACK
    assert state(ro.version_id) == S.DRAINING and state(ro.previous_id) == S.CURRENT
    assert AnalyzerVersion.objects.get(pk=ro.version_id).ramp_percent == 0
    # A queued job of the bad version: not drained, and the count starts over.
    busy = {"queued": 1, "started": 0, "scheduled": 0, "runs": 1}
    assert not drains.check_drain(rollout=ro, token=token, actor="a", counts=busy)
    assert not drains.check_drain(rollout=ro, token=token, actor="a")  # real counts: empty
    assert drains.check_drain(rollout=ro, token=token, actor="a")
    ro.refresh_from_db()
    assert ro.state == Rollout.State.ROLLED_BACK and state(ro.version_id) == S.DRAINED
    previous = AnalyzerVersion.objects.get(pk=ro.previous_id)
    assert ro.outcome == f"rolled back to {previous.queue}@{previous.fingerprint[:8]}"


def test_rollback_mid_warming_leaves_the_previous_version_current() -> None:
    ro, driver = start()
    token = int(driver.token or 0)
    rollouts_steps.begin_warming(rollout=ro, token=token, actor="a")
    ro = rollouts_steps.rollback(rollout=ro, token=token, actor="a")
    assert (state(ro.version_id), state(ro.previous_id)) == (S.DRAINING, S.CURRENT)


def test_rollback_after_promote_makes_the_previous_version_current_again() -> None:
    ro, driver = start()
    verify(ro, driver)
    token = int(driver.token or 0)
    rollouts_steps.set_ramp(rollout=ro, percent=100, token=token, actor="a")
    rollouts_steps.promote(rollout=ro, token=token, actor="a")
    driver.release()
    # The promoted rollout released its lock; the rollback takes it again (new token).
    from dashboard.rollouts.deploy_lock import rollback_rollout

    ro = rollback_rollout(rollout=ro.pk, actor="dave", reason="regression", ttl=5.0)
    assert ro.state == Rollout.State.ROLLING_BACK
    assert (state(ro.previous_id), state(ro.version_id)) == (S.CURRENT, S.DRAINING)
    assert state_machine.current_version().pk == ro.previous_id
    assert ro.lock_token is not None and ro.lock_token > token
    # It made one drain check and released its lock; the reconciler's check is the
    # second empty one in a row and finishes the drain without any token.
    assert RolloutEvent.objects.filter(rollout=ro, action="drain.check").count() == 1
    assert drains.reconcile_drains() == 1
    ro.refresh_from_db()
    assert ro.state == Rollout.State.ROLLED_BACK


def test_a_failed_verdict_fails_the_rollout_and_touches_no_routing() -> None:
    ro, driver = start()
    token = int(driver.token or 0)
    rollouts_steps.begin_warming(rollout=ro, token=token, actor="a")
    bad = {"ok": False, "summary": "failed: coverage 1/4"}
    ro = rollouts_steps.record_verdict(rollout=ro, verdict=bad, token=token, actor="a")
    assert ro.state == Rollout.State.FAILED and ro.outcome == "failed: coverage 1/4"
    assert state(ro.version_id) == S.WARM_FAILED and state(ro.previous_id) == S.CURRENT
    driver.release()
    # A failed version can be rolled out again (it must warm and pass the gate again).
    again = rollouts_start.start_rollout(config=RENAMES, actor="a", enqueue_driver=False)
    assert again.version_id == ro.version_id


def test_operator_requests_reach_the_driver_once() -> None:
    ro, driver = start()
    verify(ro, driver)
    rollouts_start.request_action(rollout=ro, action="promote", actor="erin")
    with pytest.raises(RolloutBusy, match="pending request"):
        rollouts_start.request_action(
            rollout=ro, action="set_ramp", actor="frank", params={"percent": 30}
        )
    assert driver.tick()
    assert AnalyzerVersion.objects.get(pk=ro.version_id).ramp_percent == ro.steps[0]
    assert Rollout.objects.get(pk=ro.pk).pending_action is None
    mover = RolloutEvent.objects.filter(rollout=ro, to_state=S.RAMPING).get()
    assert mover.actor == "erin" and mover.token == driver.token
    with pytest.raises(RolloutError, match="unknown action"):
        rollouts_start.request_action(rollout=ro, action="explode", actor="erin")
    # A requested rollback carries the operator's reason onto the timeline.
    rollouts_start.request_action(
        rollout=ro, action="rollback", actor="frank", params={"reason": "dead letters"}
    )
    assert driver.tick()
    back = RolloutEvent.objects.filter(rollout=ro, to_state=S.DRAINING).get()
    assert (back.actor, back.reason) == ("frank", "dead letters")
    assert Rollout.objects.get(pk=ro.pk).state == Rollout.State.ROLLING_BACK
    driver.release()


def test_a_driver_of_a_rollout_that_is_not_pending_refuses_to_start() -> None:
    ro, driver = start()
    second = RolloutDriver(ro.pk, ttl=5.0)
    with pytest.raises(RolloutError, match="already ran"):
        second.acquire()
    driver.release()


def test_the_checklist_lists_each_step_and_keeps_hostile_text_inert() -> None:
    from dashboard.rollouts.checklist import describe_rollout, rollout_checklist

    ro, driver = start(actor="eve|<script>alert(1)</script>\n# injected")
    verify(ro, driver)
    token = int(driver.token or 0)
    rollouts_steps.set_ramp(rollout=ro, percent=10, token=token, actor="a")
    rollouts_steps.rollback(rollout=ro, token=token, actor="a", reason="bad | numbers\n`x`")
    md = rollout_checklist(ro)
    assert "<script>" not in md and "\n# injected" not in md
    assert "eve\\|&lt;script&gt;alert(1)&lt;/script&gt; # injected" in md
    assert "bad \\| numbers 'x'" in md
    assert "- [x] Ramp 0% → 10%" in md and "- [ ] Promoted to current" in md
    # Every timeline row is one table row of six cells.
    rows = [ln for ln in md.splitlines() if ln.startswith("| 20")]
    assert len(rows) == RolloutEvent.objects.filter(rollout=ro).count()
    assert all(ln.replace("\\|", "").count("|") == 7 for ln in rows)
    data = describe_rollout(Rollout.objects.get(pk=ro.pk), timeline=True)
    assert data["state"] == "rolling_back" and data["lock_token"] == token
    assert [e["action"] for e in data["timeline"]][:3] == ["rollout", "lock.taken", "rollout"]


def test_a_rollback_right_after_a_promote_request_supersedes_it() -> None:
    """A rollback a moment after a promote request (still pending: the driver has not
    polled) is never refused for it: it replaces the promote, so the version never
    ramps; a second rollback (or an abort) meanwhile is the same request, not an error."""
    ro, driver = start()
    verify(ro, driver)
    rollouts_start.request_action(rollout=ro, action="promote", actor="erin")
    back = rollouts_start.request_action(
        rollout=ro, action="rollback", actor="frank", params={"reason": "wrong numbers"}
    )
    assert back.pending_action["action"] == "rollback"
    same = rollouts_start.request_action(rollout=ro, action="abort", actor="gina")
    assert same.pending_action == back.pending_action
    superseded = RolloutEvent.objects.get(rollout=ro, action="action.superseded")
    assert superseded.actor == "frank" and superseded.detail["superseded"]["action"] == "promote"
    assert driver.tick()
    ro.refresh_from_db()
    assert ro.state == Rollout.State.ROLLING_BACK and ro.pending_action is None
    assert state(ro.version_id) == S.DRAINING
    assert not RolloutEvent.objects.filter(rollout=ro, to_state=S.RAMPING).exists()
    driver.release()
    empty = {"queued": 0, "started": 0, "scheduled": 0, "runs": 0}
    drains.check_drain(rollout=ro, token=None, actor="t", counts=empty)
    assert drains.check_drain(rollout=ro, token=None, actor="t", counts=empty)
    # Once the driver claimed a promote, a rollback is the next request: both run.
    again, d2 = start(config={"ignore_whitespace": True})
    verify(again, d2)
    rollouts_start.request_action(rollout=again, action="promote", actor="erin")
    assert d2.tick()
    rollouts_start.request_action(rollout=again, action="rollback", actor="frank")
    d2.tick()
    assert Rollout.objects.get(pk=again.pk).state == Rollout.State.ROLLING_BACK
    moves = RolloutEvent.objects.filter(rollout=again, action="transition")
    assert [m.to_state for m in moves.order_by("at", "id")][-2:] == [S.RAMPING, S.DRAINING]


def test_actions_that_do_not_apply_to_a_rollouts_state_are_refused_before_anything() -> None:
    """Each operator action checks the rollout's state first (``start.refusal``): a
    promote before the gate, an abort or takeover of an ended rollout, a rollback of
    one whose version is no longer current — refused, naming the state, nothing written."""
    ro, driver = start()
    with pytest.raises(InvalidTransition, match="registered: nothing to promote"):
        rollouts_start.request_action(rollout=ro, action="promote", actor="erin")
    assert Rollout.objects.get(pk=ro.pk).pending_action is None
    verify(ro, driver)
    token = int(driver.token or 0)
    rollouts_steps.set_ramp(rollout=ro, percent=100, token=token, actor="a")
    rollouts_steps.promote(rollout=ro, token=token, actor="a")
    driver.release()
    ro = Rollout.objects.get(pk=ro.pk)
    assert rollouts_start.refusal(ro, "rollback") is None  # rollback after promote: yes
    for action, text in [
        ("abort", "is completed: it has ended, nothing to abort (roll it back instead)"),
        ("takeover", "is completed: it has ended, nothing to takeover"),
        ("promote", "is completed: nothing to promote"),
    ]:
        assert text in (rollouts_start.refusal(ro, action) or ""), action
    # A later rollout supersedes it: nothing of the first one to roll back any more.
    later, d2 = start(config={"ignore_whitespace": True})
    first = Rollout.objects.get(pk=ro.pk)
    assert f"rollout #{later.pk} of 'analysis' is active" in rollouts_start.refusal(
        first, "rollback"
    )
    verify(later, d2)
    t2 = int(d2.token or 0)
    rollouts_steps.set_ramp(rollout=later, percent=100, token=t2, actor="a")
    rollouts_steps.promote(rollout=later, token=t2, actor="a")
    d2.release()
    assert "is no longer current (draining)" in rollouts_start.refusal(first, "rollback")
    events = RolloutEvent.objects.count()
    with pytest.raises(InvalidTransition, match="no longer current"):
        rollouts_start.check_applies(first, "rollback")
    assert RolloutEvent.objects.count() == events


def test_a_start_refused_for_a_held_deploy_lock_leaves_no_version_behind() -> None:
    """A queue that never had a version adopts the deployed default first (the
    baseline); with the deploy lock held by someone else the start is refused — and
    leaves no ``registered`` baseline (or any other version) behind."""
    lock = leases.redlock().acquire(keys.deploy("analysis"), ttl=10.0, holder={"worker": "ops"})
    try:
        with pytest.raises(RolloutBusy, match="held by ops"):
            rollouts_start.start_rollout(config=RENAMES, actor="ci", enqueue_driver=False)
    finally:
        lock.release()
    assert list(AnalyzerVersion.objects.values_list("state", flat=True)) == []
    assert Rollout.objects.count() == 0


def test_a_start_that_loses_the_race_for_the_queue_leaves_no_version_behind() -> None:
    """Two starts of different configs at once: both pass the busy check, the second
    waits for the first's transaction and is refused by the one-active-rollout
    constraint — and its version's registration goes with it (one transaction).
    PostgreSQL: the wait is seen in ``pg_stat_activity``, so the interleaving is exact."""
    if connection.vendor != "postgresql":
        pytest.skip("the loser's wait is observed in pg_stat_activity (PostgreSQL)")
    ensure_baseline(actor="setup")
    outcome: list[object] = []

    def loser() -> None:
        try:
            rollouts_start.start_rollout(
                config={"ignore_whitespace": True}, actor="late", enqueue_driver=False
            )
        except RolloutBusy as exc:
            outcome.append(exc)
        finally:
            connection.close()

    thread = CheckedThread(target=loser)
    with transaction.atomic():
        won = rollouts_start.start_rollout(config=RENAMES, actor="first", enqueue_driver=False)
        thread.start()
        wait_for(lambda: _lock_waiters() == 1, 30, "the second start to wait for the first")
    thread.join(30)
    assert len(outcome) == 1 and f"rollout #{won.pk}" in str(outcome[0])
    assert Rollout.objects.count() == 1
    assert sorted(AnalyzerVersion.objects.values_list("state", flat=True)) == [
        S.CURRENT, S.REGISTERED,
    ]  # fmt: skip
    assert not AnalyzerVersion.objects.filter(config__ignore_whitespace=True).exists()


def _lock_waiters() -> int:
    with connections["default"].cursor() as cur:
        # Inside a transaction the statistics views are a snapshot: take a fresh one.
        cur.execute("select pg_stat_clear_snapshot()")
        cur.execute(
            "select count(*) from pg_stat_activity where datname = current_database() "
            "and wait_event_type = 'Lock'"
        )
        return int(cur.fetchone()[0])
