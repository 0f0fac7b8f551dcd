"""Canary routing (docs/rollouts.md): which version's physical queue a piece of work goes to.

``route`` is pure: a deterministic hash of the work's idempotency key against the ramp
percentage, so a key routes the same way on every host and every call while the ramp is
unchanged, and raising the ramp only moves keys *onto* the new version (a key in the
10 % bucket is also in the 50 % one).
"""

from __future__ import annotations

import hashlib
from typing import Any

from dashboard.models import AnalyzerVersion, JobAttempt, JobRun, Rollout, RolloutPin
from dashboard.models import AnalyzerVersion as AV
from dashboard.versions.state_machine import (
    QUEUE,
    ROUTABLE,
    RolloutError,
    physical_queue,
    served_fingerprint,
)

S = AnalyzerVersion.State

#: Buckets per percent: ramps are whole percentages, buckets are finer so that the split
#: does not depend on rounding.
_SCALE = 10_000


def bucket(idempotency_key: str) -> int:
    """The key's place in [0, 10000): the first 8 bytes of its SHA-256, reduced."""
    digest = hashlib.sha256(idempotency_key.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") % _SCALE


def route(idempotency_key: str, ramp_percent: int) -> bool:
    """True when the work goes to the ramping version: its bucket is below ``p``% of
    the range. ``0`` routes nothing, ``100`` everything."""
    if not 0 <= ramp_percent <= 100:
        raise ValueError(f"ramp_percent must be 0..100, not {ramp_percent}")
    return bucket(idempotency_key) < ramp_percent * (_SCALE // 100)


class NoRoutableVersion(RolloutError):
    """The logical queue has no current version (call ``ensure_baseline`` first)."""


def version_for(
    queue: str = QUEUE, key: str = "", attempt_version: str | None = None
) -> AnalyzerVersion:
    """The version that runs work ``key`` of logical ``queue``.

    1. A retry (``attempt_version`` = the fingerprint its earlier attempt ran under)
       stays on that version while it is still routable (verified, ramping, current):
       an analysis never mixes versions mid-way. Once its version is closed (draining
       after a rollback, or never verified) it is routed afresh.
    2. Otherwise the ramping version if ``route(key, p)`` or the key's repository is
       pinned to it (``pinned``), else the current one.

    Race: routing may change right after this read. The job then sits on a queue whose
    version is draining; the rollback moves queued jobs back to the previous version's
    queue, and a worker refuses work of a fingerprint that is not its own, so no job
    reaches a closed version's results.
    """
    rows = list(
        AnalyzerVersion.objects.filter(queue=queue, state__in=ROUTABLE).only(
            "fingerprint", "state", "ramp_percent", "queue"
        )
    )
    if attempt_version:
        for v in rows:
            if v.fingerprint == attempt_version or (
                len(attempt_version) < len(v.fingerprint)
                and v.fingerprint.startswith(attempt_version)
            ):
                return v
    current = next((v for v in rows if v.state == S.CURRENT), None)
    ramping = next((v for v in rows if v.state == S.RAMPING), None)
    if ramping is not None and (route(key, ramping.ramp_percent) or pinned(ramping, key)):
        return ramping
    if current is None:
        raise NoRoutableVersion(f"{queue!r} has no current analyzer version")
    return current


def pinned(ramping: AnalyzerVersion, key: str) -> bool:
    """True when ``key`` is a repository's (``repo:<id>``) and an operator pinned that
    repository to ``ramping`` (docs/rollouts.md#pinning): its active rollout has a pin.
    A rollout that ends clears its pins in the same transaction, and only an active
    rollout's pins count, so a pin never outlives the ramp."""
    prefix, _, rest = key.partition(":")
    if prefix != "repo" or not rest.isdigit():
        return False
    return RolloutPin.objects.filter(
        repository_id=int(rest),
        rollout__version=ramping,
        rollout__state__in=Rollout.ACTIVE_STATES,
    ).exists()


def queue_for(queue: str, key: str, attempt_version: str | None = None) -> str:
    """Physical queue name (``analysis@3f2a9c1e``) for work ``key``; see ``version_for``."""
    v = version_for(queue, key, attempt_version)
    return physical_queue(v.queue, v.fingerprint)


def repository_key(repo_id: int) -> str:
    """The idempotency key routing uses for a repository's analysis: a repository is
    routed as a whole, so its canary results are complete, not a scatter of chunks."""
    return f"repo:{repo_id}"


def planned_fingerprints(queue: str = QUEUE, key: str = "") -> list[str]:
    """The fingerprints a sync plans work for: the served one first (its results are
    what readers see, so it is always brought up to date), then the ramping version's
    if ``key`` routes to it (a shadow analysis: the canary's health and numbers are
    measured on it, readers still see the current version until promotion).

    A queue with no version at all serves the deployed default (``served_fingerprint``).
    """
    served = served_fingerprint(queue)
    out = [served]
    try:
        chosen = version_for(queue, key)
    except NoRoutableVersion:
        return out
    if chosen.fingerprint not in out:
        out.append(chosen.fingerprint)
    return out


def _attempt_stats(fingerprint: str, since: Any) -> dict[str, Any]:

    rows = list(
        JobAttempt.objects.filter(
            run__kind=JobRun.Kind.ANALYZE,
            run__fingerprint=fingerprint,
            started_at__gte=since,
            outcome__in=[
                JobAttempt.Outcome.SUCCEEDED,
                JobAttempt.Outcome.FAILED,
                JobAttempt.Outcome.CRASHED,
            ],
        ).values_list("outcome", "started_at", "finished_at")
    )
    failed = sum(1 for o, _, _ in rows if o != JobAttempt.Outcome.SUCCEEDED)
    durations = [(f - s).total_seconds() for o, s, f in rows if f is not None and o == "succeeded"]
    dead = JobRun.objects.filter(
        kind=JobRun.Kind.ANALYZE,
        fingerprint=fingerprint,
        state=JobRun.State.DEAD,
        finished_at__gte=since,
    ).count()
    return {
        "samples": len(rows),
        "failed": failed,
        "failure_rate": failed / len(rows) if rows else 0.0,
        "dead": dead,
        "mean_seconds": sum(durations) / len(durations) if durations else None,
    }


def canary_health(*, rollout: Any, since: Any, min_samples: int = 20) -> dict[str, Any]:
    """Compare the ramping version with the current one over attempts started since
    ``since`` (the step's start): ``{"verdict": "pass" | "fail" | "inconclusive", ...}``.

    * inconclusive — fewer than ``min_samples`` finished attempts on the canary;
    * fail — canary failure rate > max(1.5 × baseline, baseline + 2 points), or more
      dead letters than the baseline, or mean run time > 1.5 × baseline (+1 s);
    * pass — otherwise.
    """

    canary = _attempt_stats(rollout.version.fingerprint, since)
    current = AV.objects.filter(queue=rollout.queue, state=S.CURRENT).first()
    base = _attempt_stats(current.fingerprint, since) if current is not None else None
    b_rate = base["failure_rate"] if base else 0.0
    b_dead = base["dead"] if base else 0
    reasons: list[str] = []
    if canary["samples"] < min_samples:
        verdict = "inconclusive"
        reasons.append(f"{canary['samples']}/{min_samples} samples")
    else:
        if canary["failure_rate"] > max(1.5 * b_rate, b_rate + 0.02):
            reasons.append(f"failure rate {canary['failure_rate']:.1%} vs {b_rate:.1%}")
        if canary["dead"] > b_dead:
            reasons.append(f"{canary['dead']} dead letter(s) vs {b_dead}")
        b_mean = base["mean_seconds"] if base else None
        c_mean = canary["mean_seconds"]
        if b_mean is not None and c_mean is not None and c_mean > 1.5 * b_mean + 1.0:
            reasons.append(f"mean run {c_mean:.1f}s vs {b_mean:.1f}s")
        verdict = "fail" if reasons else "pass"
    return {
        "verdict": verdict,
        "canary": canary,
        "baseline": base,
        "summary": "; ".join(reasons) or "healthy",
    }
