"""Canary routing: a deterministic split by the idempotency key's hash, retries pinned to
their version while it is routable, nothing routed to a version that has not passed the
warming gate."""

from __future__ import annotations

import hashlib

import pytest

from dashboard.models import AnalyzerVersion
from dashboard.rollouts import steps
from dashboard.versions import state_machine
from dashboard.versions.canary import NoRoutableVersion, bucket, queue_for, route, version_for
from dashboard.versions.state_machine import ensure_baseline
from tests.support.rollouts import PASSING, _release_drivers, start  # noqa: F401 (fixture)

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
    steps.begin_warming(rollout=ro, token=token, actor="t")
    assert queue_for("analysis", KEYS[0], attempt_version=ro.version.fingerprint) == base_q
    steps.record_verdict(rollout=ro, verdict=PASSING, token=token, actor="t")
    assert {queue_for("analysis", k) for k in KEYS[:300]} == {base_q}  # verified, 0 %
    steps.set_ramp(rollout=ro, percent=30, token=token, actor="t")
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
    steps.rollback(rollout=ro, token=token, actor="t")
    assert queue_for("analysis", on_new, attempt_version=ro.version.fingerprint) == base_q
    assert {queue_for("analysis", k) for k in KEYS[:300]} == {base_q}
    assert version_for("analysis", on_new).pk == base.pk


@pytest.mark.django_db(transaction=True)
def test_a_queue_without_a_current_version_routes_nowhere() -> None:
    with pytest.raises(NoRoutableVersion, match="no current"):
        queue_for("analysis", "k")


def _attempts(fingerprint: str, outcomes: list[str], *, seconds: float = 1.0) -> None:
    """Finished analysis attempts of ``fingerprint``, each ``seconds`` long."""
    from datetime import timedelta

    from django.utils import timezone

    from dashboard.models import JobAttempt, JobRun, Repository

    repo = Repository.objects.first() or Repository.objects.create(url="https://example.org/h")
    start = JobRun.objects.count()
    for i, outcome in enumerate(outcomes, start):
        run = JobRun.objects.create(
            job_id=f"health-{fingerprint[:6]}-{i}", kind="analyze", repository=repo,
            queue=state_machine.physical_queue("analysis", fingerprint), fingerprint=fingerprint,
            state="succeeded" if outcome == "succeeded" else "failed",
        )  # fmt: skip
        a = JobAttempt.objects.create(run=run, number=1, outcome=outcome)
        JobAttempt.objects.filter(pk=a.pk).update(
            finished_at=a.started_at + timedelta(seconds=seconds)
        )
        if outcome == "dead":
            JobAttempt.objects.filter(pk=a.pk).update(outcome="failed")
            JobRun.objects.filter(pk=run.pk).update(state="dead", finished_at=timezone.now())


@pytest.mark.django_db(transaction=True)
def test_the_health_check_compares_failures_dead_letters_and_run_time_with_current() -> None:
    """Failure rate, dead letters and latency against the current version,
    with a minimum sample; each criterion alone fails the canary."""
    from datetime import timedelta
    from types import SimpleNamespace

    from django.utils import timezone

    from dashboard.models import JobAttempt, JobRun
    from dashboard.versions.canary import canary_health

    base = ensure_baseline(actor="setup")
    new = state_machine.register_version(config={"detect_renames": True}, actor="setup")
    ro = SimpleNamespace(version=new, queue="analysis")
    since = timezone.now() - timedelta(minutes=1)

    def health() -> dict:
        return canary_health(rollout=ro, since=since, min_samples=4)

    def reset() -> None:
        JobAttempt.objects.all().delete()
        JobRun.objects.all().delete()

    _attempts(base.fingerprint, ["succeeded"] * 9 + ["failed"], seconds=2)  # 10 % failing
    _attempts(new.fingerprint, ["succeeded"] * 3, seconds=2)
    h = health()
    assert h["verdict"] == "inconclusive" and h["summary"] == "3/4 samples"
    _attempts(new.fingerprint, ["succeeded"], seconds=2)
    assert health()["verdict"] == "pass"  # 0 % failing, as fast: healthy
    # Failure rate: 2 of 8 (25 %) vs the current's 10 %.
    _attempts(new.fingerprint, ["succeeded", "succeeded", "failed", "crashed"], seconds=2)
    h = health()
    assert h["verdict"] == "fail" and h["summary"] == "failure rate 25.0% vs 10.0%"
    # Dead letters: one more than the current version's (none), at a normal failure rate.
    reset()
    _attempts(base.fingerprint, ["succeeded"] * 8 + ["failed"] * 2, seconds=2)
    _attempts(new.fingerprint, ["succeeded"] * 9 + ["dead"], seconds=2)
    h = health()
    assert h["verdict"] == "fail" and h["summary"] == "1 dead letter(s) vs 0"
    # Latency: the canary's mean run time past 1.5 × the current's (+1 s).
    reset()
    _attempts(base.fingerprint, ["succeeded"] * 5, seconds=2)
    _attempts(new.fingerprint, ["succeeded"] * 5, seconds=3.9)
    assert health()["verdict"] == "pass"  # 3.9 s ≤ 1.5 × 2 s + 1 s
    _attempts(new.fingerprint, ["succeeded"] * 5, seconds=10.1)
    h = health()
    assert h["verdict"] == "fail" and h["summary"].startswith("mean run 7.0s vs 2.0s")
