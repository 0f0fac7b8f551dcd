"""dashboard.versions.state_machine: the version state machine called directly (rollouts driving it
end to end are in tests/dashboard/rollouts/test_start.py and
tests/dashboard/rollouts/test_driver.py)."""

from __future__ import annotations

import pytest

from dashboard.locks import leases
from dashboard.models import AnalyzerVersion, AuditEntry, RolloutEvent
from dashboard.versions.state_machine import (
    ALLOWED,
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
from workers.analysis import analyzer
from workers.locks import keys

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
    lock = leases.redlock().acquire(keys.deploy("analysis"), ttl=30, holder={"t": 1})
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
    key = keys.deploy("analysis")
    old = leases.redlock().acquire(key, ttl=30, holder={"who": "old"})
    old.release()
    newer = leases.redlock().acquire(key, ttl=30, holder={"who": "new"})
    try:
        with pytest.raises(RolloutConflict):
            do_transition(version=new, to=S.WARMING, actor="old", token=old.token)
        assert AnalyzerVersion.objects.get(pk=new.pk).state == S.REGISTERED
    finally:
        newer.release()


# ------------------------------------------------------------ every edge, both ways

STAMP = "2026-01-01T00:00:00Z"
ALL_STATES = list(S.values)


def _as(version: AnalyzerVersion, state: str) -> AnalyzerVersion:
    """Put ``version`` in ``state`` with a raw write (what the database allows)."""
    fields: dict = {"state": state, "ramp_percent": 10 if state == S.RAMPING else 0}
    if state in {S.VERIFIED, S.RAMPING, S.CURRENT, S.DRAINING, S.DRAINED}:
        fields["verified_at"] = STAMP
    AnalyzerVersion.objects.filter(pk=version.pk).update(**fields)
    return AnalyzerVersion.objects.get(pk=version.pk)


def _prepared(src: str) -> tuple[AnalyzerVersion, int]:
    """A version of the queue in ``src`` (the baseline itself for ``current``) and the
    newest deploy-lock token."""
    base = ensure_baseline()
    new = base if src == S.CURRENT else _as(register_version(config=NEW, actor="t"), src)
    token = leases.redlock().acquire(keys.deploy("analysis"), ttl=30, holder={}).token
    return new, int(token)


def _edge_kwargs(src: str, to: str) -> dict:
    if to == S.RAMPING:
        return {"ramp_percent": 20}
    if to == S.VERIFIED:
        return {"detail": {"verdict": {"ok": True, "summary": "t"}}}
    return {}


#: The state machine of docs/rollouts.md#states, written out (not read from the code,
#: so a changed edge in ``versions.ALLOWED`` fails here): the forward path, the warming
#: failure and its retry, the rollback edges (→ draining; draining/drained → current),
#: drain bookkeeping and retirement, and a rolled-back version rolled out again.
ALLOWED_EDGES = [
    (S.REGISTERED, S.WARMING), (S.REGISTERED, S.CURRENT), (S.REGISTERED, S.RETIRED),
    (S.WARMING, S.VERIFIED), (S.WARMING, S.WARM_FAILED), (S.WARMING, S.DRAINING),
    (S.WARM_FAILED, S.WARMING), (S.WARM_FAILED, S.DRAINING), (S.WARM_FAILED, S.RETIRED),
    (S.VERIFIED, S.RAMPING), (S.VERIFIED, S.DRAINING),
    (S.RAMPING, S.RAMPING), (S.RAMPING, S.CURRENT), (S.RAMPING, S.DRAINING),
    (S.DRAINING, S.DRAINED), (S.DRAINING, S.CURRENT),
    (S.DRAINED, S.RETIRED), (S.DRAINED, S.WARMING), (S.DRAINED, S.CURRENT),
]  # fmt: skip
FORBIDDEN_EDGES = [(a, b) for a in ALL_STATES for b in ALL_STATES if (a, b) not in ALLOWED_EDGES]


def test_the_code_allows_exactly_the_designed_edges() -> None:
    assert sorted((a, b) for a in ALLOWED for b in ALLOWED[a]) == sorted(ALLOWED_EDGES)


@pytest.mark.parametrize(("src", "to"), ALLOWED_EDGES)
def test_every_allowed_edge_moves_the_version_and_is_recorded(src: str, to: str) -> None:
    if (src, to) == (S.REGISTERED, S.CURRENT):
        # Only a queue's first version: another queue, without a baseline.
        first = register_version(queue="fresh", config=NEW, actor="t")
        token = leases.redlock().acquire(keys.deploy("fresh"), ttl=30, holder={}).token
        moved = do_transition(version=first, to=to, actor="t", token=token)
        assert moved.state == S.CURRENT
        return
    version, token = _prepared(src)
    base = AnalyzerVersion.objects.get(queue="analysis", state=S.CURRENT)
    moved = do_transition(version=version, to=to, actor="t", token=token, **_edge_kwargs(src, to))
    assert moved.state == to
    assert RolloutEvent.objects.filter(version=version, from_state=src, to_state=to).exists()
    if to == S.CURRENT:  # the old current is superseded in the same transaction
        assert AnalyzerVersion.objects.get(pk=base.pk).state == S.DRAINING
        assert AnalyzerVersion.objects.filter(queue="analysis", state=S.CURRENT).count() == 1


@pytest.mark.parametrize(("src", "to"), FORBIDDEN_EDGES)
def test_every_other_edge_is_refused_and_changes_nothing(src: str, to: str) -> None:
    version, token = _prepared(src)
    before = (RolloutEvent.objects.count(), AuditEntry.objects.count())
    with pytest.raises(InvalidTransition):
        do_transition(version=version, to=to, actor="t", token=token, **_edge_kwargs(src, to))
    assert AnalyzerVersion.objects.get(pk=version.pk).state == src
    assert (RolloutEvent.objects.count(), AuditEntry.objects.count()) == before
