"""Benchmark: what pinning costs the canary's routing (docs/rollouts.md#pinning).

``dashboard.versions.canary.version_for`` decides, for each repository a sync plans, whether
its work also goes to the ramping version: a SHA-256 bucket against the ramp percentage,
and — new with pinning — for a key the bucket does not route, one indexed query for a pin
of the version's active rollout. This measures ``planned_fingerprints`` (what a sync
calls) per repository key at a 1 % ramp, three ways, interleaved over ``--rounds``:

  no ramp     only a current version: nothing to route (the anchor: the versions query)
  unpinned    a ramping version, keys whose bucket does not route and no pin exists
  pinned      the same keys, each pinned to the ramping version

and the pin lookup alone (``canary.pinned``), the part pinning adds to an unpinned call.

Prints medians per call and the ratios to the anchor; a sync's own git fetch and plan
take tens of milliseconds, so the figure to read is the absolute cost per call. One
process, a temporary SQLite database (migrated), rows created directly: no Redis, no
workers. Not a test: nothing is asserted.

    .venv/bin/python bench/pins.py [--repos 200] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repos", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gw-bench-pins-"))
    for key in [k for k in os.environ if k.startswith(("GITWARD_", "DATABASE_URL"))]:
        del os.environ[key]
    os.environ.update(
        GITWARD_VAR_DIR=str(tmp),
        DATABASE_URL=f"sqlite:///{tmp / 'db.sqlite3'}",
        DJANGO_SETTINGS_MODULE="dashboard.settings",
    )
    import django

    django.setup()
    run(args)


def run(args: argparse.Namespace) -> None:
    from django.core.management import call_command
    from django.utils import timezone

    from dashboard.models import AnalyzerVersion, Repository, Rollout, RolloutPin
    from dashboard.versions import canary

    call_command("migrate", verbosity=0)
    S = AnalyzerVersion.State
    now = timezone.now()
    AnalyzerVersion.objects.create(
        fingerprint="a" * 64, code_version="1", state=S.CURRENT, state_changed_at=now
    )
    ramping = AnalyzerVersion.objects.create(
        fingerprint="b" * 64, code_version="1", state=S.VERIFIED, verified_at=now
    )
    ro = Rollout.objects.create(version=ramping, steps=[1, 100], started_by="bench", state="active")
    repos = []
    pk = 0
    while len(repos) < args.repos:
        pk += 1
        if not canary.route(canary.repository_key(pk), 1):  # only keys the bucket leaves
            repos.append(Repository.objects.create(pk=pk, url=f"https://example.com/{pk}.git"))
    keys = [canary.repository_key(r.pk) for r in repos]

    def per_call() -> float:
        start = time.perf_counter()
        for key in keys:
            canary.planned_fingerprints(key=key)
        return (time.perf_counter() - start) / len(keys)

    def set_state(state: str) -> None:
        RolloutPin.objects.all().delete()
        if state == "no ramp":
            AnalyzerVersion.objects.filter(pk=ramping.pk).update(state=S.VERIFIED, ramp_percent=0)
            return
        AnalyzerVersion.objects.filter(pk=ramping.pk).update(state=S.RAMPING, ramp_percent=1)
        if state == "pinned":
            RolloutPin.objects.bulk_create(
                RolloutPin(rollout=ro, repository=r, pinned_by="bench") for r in repos
            )

    results: dict[str, list[float]] = {"no ramp": [], "unpinned": [], "pinned": []}
    for _ in range(args.rounds):
        for state in results:
            set_state(state)
            expected = 2 if state == "pinned" else 1
            assert len(canary.planned_fingerprints(key=keys[0])) == expected
            results[state].append(per_call())
    set_state("unpinned")
    version = AnalyzerVersion.objects.get(pk=ramping.pk)
    lookups = []
    for _ in range(args.rounds):
        start = time.perf_counter()
        for key in keys:
            canary.pinned(version, key)
        lookups.append((time.perf_counter() - start) / len(keys))
    anchor = statistics.median(results["no ramp"])
    print(f"planned_fingerprints per repository key, {args.repos} keys, {args.rounds} rounds")
    for state, values in results.items():
        med = statistics.median(values)
        print(f"  {state:9s} {med * 1e6:8.1f} µs/call  ×{med / anchor:.2f} of no ramp")
    med = statistics.median(lookups)
    print(f"  the pin lookup alone (canary.pinned): {med * 1e6:.1f} µs/call, "
          f"{med / statistics.median(results['unpinned']):.0%} of an unpinned call")  # fmt: skip


if __name__ == "__main__":
    main()
