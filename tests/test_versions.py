"""dashboard.versions: the version state machine called directly (rollouts driving it
end to end are in tests/test_rollouts.py and tests/test_rollout_driver.py)."""

from __future__ import annotations

import pytest

from dashboard import leases
from dashboard.models import AnalyzerVersion, AuditEntry, RolloutEvent
from dashboard.versions import (
    InvalidConfig,
    InvalidTransition,
    RolloutConflict,
    closed_queue_names,
    do_transition,
    ensure_baseline,
    fingerprint_config,
    physical_queue,
    register_version,
    served_fingerprint,
)
from workers import analyzer, lockkeys

pytestmark = pytest.mark.django_db(transaction=True)

S = AnalyzerVersion.State
NEW = {"detect_renames": True, "ignore_whitespace": True, "exclude_paths": ["vendor/"]}


def test_register_is_idempotent_and_fingerprints_as_the_worker_does() -> None:
    a = register_version(config=NEW, actor="alice")
    b = register_version(config=dict(NEW), actor="bob")
    assert a.pk == b.pk and a.state == S.REGISTERED
    assert a.fingerprint == analyzer.AnalyzerConfig.from_mapping(NEW).fingerprint()
    assert fingerprint_config(NEW)[0] == a.fingerprint
    assert RolloutEvent.objects.filter(version=a, to_state=S.REGISTERED).count() == 1
    with pytest.raises(InvalidConfig):
        register_version(config={"no_such_key": 1}, actor="alice")


def test_baseline_is_the_default_config_made_current_once() -> None:
    assert served_fingerprint() == analyzer.DEFAULT.fingerprint()
    base = ensure_baseline()
    assert base.state == S.CURRENT and base.fingerprint == analyzer.DEFAULT.fingerprint()
    assert ensure_baseline().pk == base.pk
    assert AnalyzerVersion.objects.filter(state=S.CURRENT).count() == 1
    assert served_fingerprint() == base.fingerprint
    assert physical_queue("analysis", base.fingerprint) == analyzer.queue_name(base.fingerprint)
    assert physical_queue("other", base.fingerprint).startswith("other@")


def test_transitions_need_the_newest_deploy_token_and_an_allowed_edge() -> None:
    ensure_baseline()
    new = register_version(config=NEW, actor="alice")
    lock = leases.redlock().acquire(lockkeys.deploy("analysis"), ttl=30, holder={"t": 1})
    try:
        with pytest.raises(InvalidTransition):
            do_transition(version=new, to=S.RAMPING, actor="alice", token=lock.token,
                          ramp_percent=10)  # fmt: skip
        with pytest.raises(RolloutConflict, match="stale"):
            do_transition(version=new, to=S.WARMING, actor="alice", token=lock.token - 1)
        assert AnalyzerVersion.objects.get(pk=new.pk).state == S.REGISTERED
        moved = do_transition(version=new, to=S.WARMING, actor="alice", token=lock.token)
        assert moved.state == S.WARMING
    finally:
        lock.release()
    event = RolloutEvent.objects.filter(version=new, to_state=S.WARMING).get()
    assert (event.from_state, event.actor, event.token) == (S.REGISTERED, "alice", lock.token)
    assert AuditEntry.objects.filter(actor="alice").exists()
    # warming's gate is open; a registered version's is closed.
    other = register_version(config={**NEW, "exclude_paths": []}, actor="alice")
    closed = closed_queue_names()
    assert physical_queue("analysis", other.fingerprint) in closed
    assert physical_queue("analysis", new.fingerprint) not in closed


def test_a_taken_over_lock_fences_out_the_old_holder() -> None:
    ensure_baseline()
    new = register_version(config=NEW, actor="alice")
    key = lockkeys.deploy("analysis")
    old = leases.redlock().acquire(key, ttl=30, holder={"who": "old"})
    old.release()
    newer = leases.redlock().acquire(key, ttl=30, holder={"who": "new"})
    try:
        with pytest.raises(RolloutConflict):
            do_transition(version=new, to=S.WARMING, actor="old", token=old.token)
        assert AnalyzerVersion.objects.get(pk=new.pk).state == S.REGISTERED
    finally:
        newer.release()
