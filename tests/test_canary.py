"""Canary routing: a deterministic split by the idempotency key's hash, retries pinned to
their version while it is routable, nothing routed to a version that has not passed the
warming gate."""

from __future__ import annotations

import hashlib

import pytest

from dashboard import rollouts
from dashboard.canary import NoRoutableVersion, bucket, queue_for, route, version_for
from dashboard.models import AnalyzerVersion
from dashboard.rollouts import ensure_baseline
from tests.rollout_support import PASSING, _release_drivers, start  # noqa: F401 (fixture)

S = AnalyzerVersion.State
KEYS = [f"analyze-{i % 97}-{hashlib.sha1(str(i).encode()).hexdigest()}" for i in range(10_000)]


@pytest.mark.parametrize("p", [1, 5, 10, 25, 50, 75, 90, 99])
def test_the_split_is_within_three_points_of_p_over_ten_thousand_keys(p: int) -> None:
    share = sum(route(k, p) for k in KEYS) / len(KEYS)
    assert abs(share - p / 100) <= 0.03, share


def test_the_split_is_stable_per_key_and_only_grows_with_the_ramp() -> None:
    first = [route(k, 10) for k in KEYS]
    assert first == [route(k, 10) for k in KEYS]
    assert [bucket(k) for k in KEYS[:50]] == [bucket(k) for k in KEYS[:50]]
    for low, high in [(10, 50), (50, 100)]:
        # A key on the canary at a lower ramp stays on it at a higher one.
        assert all(route(k, high) for k in KEYS if route(k, low))
    assert not any(route(k, 0) for k in KEYS) and all(route(k, 100) for k in KEYS)
    # The bucket is the key's own SHA-256, not Python's per-process hash().
    key = "analyze-1-abc"
    want = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") % 10_000
    assert bucket(key) == want
    with pytest.raises(ValueError):
        route(key, 101)


@pytest.mark.django_db(transaction=True)
def test_queue_for_routes_by_ramp_keeps_retries_and_never_reaches_an_unverified_version() -> None:
    base = ensure_baseline(actor="t")
    base_q = f"analysis@{base.fingerprint[:8]}"
    ro, driver = start()
    new_q = f"analysis@{ro.version.fingerprint[:8]}"
    token = int(driver.token or 0)
    # Registered, warming: the gate is closed, nothing is routed there — not even a
    # "retry" that claims to belong to it.
    assert {queue_for("analysis", k) for k in KEYS[:300]} == {base_q}
    rollouts.begin_warming(rollout=ro, token=token, actor="t")
    assert queue_for("analysis", KEYS[0], attempt_version=ro.version.fingerprint) == base_q
    rollouts.record_verdict(rollout=ro, verdict=PASSING, token=token, actor="t")
    assert {queue_for("analysis", k) for k in KEYS[:300]} == {base_q}  # verified, 0 %
    rollouts.set_ramp(rollout=ro, percent=30, token=token, actor="t")
    routed = {k: queue_for("analysis", k) for k in KEYS[:2000]}
    assert set(routed.values()) == {base_q, new_q}
    assert abs(sum(q == new_q for q in routed.values()) / 2000 - 0.30) <= 0.04
    assert all((routed[k] == new_q) == route(k, 30) for k in routed)
    # Retries stay on their version (by full or short fingerprint) while it is routable.
    on_base = next(k for k, q in routed.items() if q == base_q)
    on_new = next(k for k, q in routed.items() if q == new_q)
    assert queue_for("analysis", on_base, attempt_version=ro.version.fingerprint) == new_q
    assert queue_for("analysis", on_new, attempt_version=base.fingerprint[:8]) == base_q
    # Rolled back: the new version is draining, its retries are routed afresh (to the base).
    rollouts.rollback(rollout=ro, token=token, actor="t")
    assert queue_for("analysis", on_new, attempt_version=ro.version.fingerprint) == base_q
    assert {queue_for("analysis", k) for k in KEYS[:300]} == {base_q}
    assert version_for("analysis", on_new).pk == base.pk


@pytest.mark.django_db(transaction=True)
def test_a_queue_without_a_current_version_routes_nowhere() -> None:
    with pytest.raises(NoRoutableVersion, match="no current"):
        queue_for("analysis", "k")
