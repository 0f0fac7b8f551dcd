"""A code rollout, blue/green, with two real installs of gitward.

Two copies of this source tree stand for two commits: *blue* is this code unchanged,
*green* counts every added line ten times (one changed line of
``workers/analysis/numstat.py``), so their code versions differ and so do their numbers.
Each copy's ``manage.py worker --workers 2`` (a real pool of real RQ workers, run with
the copy as its working directory and ``PYTHONPATH``) shares this test's database and
Redis masters. Blue analyses a repository under the baseline; green's pool reports its
code and gitward learns it (a ``registered`` version); a rollout of that fingerprint
warms on green's workers only, is promoted (green serves, blue's shared workers stop)
and rolled back (blue's numbers are served again at once, green's version drains and its
workers stop). Each version's stored numbers are exactly what its code computes (git's
own count, or ten times it), and every attempt of a version ran on a worker of its code.
See docs/rollouts.md#code-rollouts-bluegreen.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dashboard.models import AnalyzerVersion, Commit, JobAttempt, Repository, Rollout, WorkerBeat
from dashboard.repositories.lifecycle import submit_repository
from dashboard.rollouts import drains, steps
from dashboard.rollouts import start as rollouts_start
from dashboard.rollouts.deploy_lock import rollback_rollout
from dashboard.rollouts.driver import RolloutDriver
from dashboard.rollouts.warming import warm_rollout
from dashboard.versions import code_versions, state_machine
from tests.support.installs import code_version_of, install, pool_of
from tests.support.processes import ended, worker_env
from tests.support.rollouts import DRIVERS, _release_drivers, history_with_renames  # noqa: F401
from workers.analysis.analyzer import CODE_VERSION

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
S = AnalyzerVersion.State


def poll(condition: Callable[[], Any], what: str, timeout: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.3)


def git_insertions(origin: Path) -> dict[str, int]:
    """Lines added per commit, as git itself counts them (first parent, no renames)."""
    out = subprocess.run(
        ["git", "-C", str(origin), "log", "--numstat", "--no-renames", "--format=@%H"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    counts: dict[str, int] = {}
    sha = ""
    for line in out.splitlines():
        if line.startswith("@"):
            sha = line[1:]
            counts[sha] = 0
        elif line.strip():
            added = line.split("\t")[0]
            counts[sha] += int(added) if added != "-" else 0
    return counts


def stored(repo: Repository, fingerprint: str) -> dict[str, int]:
    return dict(
        Commit.objects.filter(repository=repo, fingerprint=fingerprint).values_list(
            "sha", "insertions"
        )
    )


def live(code: str, **filters: Any) -> list[WorkerBeat]:
    names = {w["name"] for w in code_versions.live_workers().get(code, [])}
    return [w for w in WorkerBeat.objects.filter(name__in=names, **filters)]


def codes_of_attempts(fingerprint: str) -> set[str]:
    """The code versions of the workers that analysed any chunk of the version. (A sync
    run carries the served fingerprint it plans for; any worker with the shared queues may
    run it, and it analyses inline only what its worker loaded.)"""
    workers = set(
        JobAttempt.objects.filter(run__fingerprint=fingerprint, run__kind="analyze").values_list(
            "worker", flat=True
        )
    )
    return set(WorkerBeat.objects.filter(name__in=workers).values_list("code_version", flat=True))


@pytest.fixture
def pools(tmp_path: Path, settings: Any) -> Iterator[dict[str, Any]]:
    blue, green = install(tmp_path / "blue", patch=False), install(tmp_path / "green", patch=True)
    env = worker_env(settings, tmp_path, GITWARD_WORKER_GRACE="5")
    running: dict[str, Any] = {"blue": blue, "green": green, "env": env}
    yield running
    for name in ("green_pool", "blue_pool"):
        proc = running.get(name)
        if proc is not None:
            with ended(proc):
                proc.terminate()
                proc.wait(timeout=60)


def test_a_code_rollout_runs_on_its_own_workers_and_rolls_back(
    tmp_path: Path, pools: dict[str, Any]
) -> None:
    blue_code, green_code = code_version_of(pools["blue"]), code_version_of(pools["green"])
    assert blue_code == CODE_VERSION  # the same bytes: the same code version
    assert green_code != blue_code and green_code.split("+")[0] == blue_code.split("+")[0]

    base = state_machine.ensure_baseline(actor="setup")
    origin = history_with_renames(tmp_path / "r")
    truth = git_insertions(origin.path)
    assert len(truth) == 5 and sum(truth.values()) > 0

    # Blue alone: its pool serves the current version and analyses the repository.
    pools["blue_pool"] = pool_of(pools["blue"], pools["env"])
    repo, _ = submit_repository(url=str(origin.path))
    poll(lambda: Repository.objects.get(pk=repo.pk).status == Repository.Status.READY,
         "blue's analysis")  # fmt: skip
    assert stored(repo, base.fingerprint) == truth
    assert not AnalyzerVersion.objects.filter(code_version=green_code).exists()

    # Green starts beside it: gitward learns its code, with the current configuration.
    pools["green_pool"] = pool_of(pools["green"], pools["env"])
    learned = poll(
        lambda: AnalyzerVersion.objects.filter(code_version=green_code).first(),
        "green's code learned",
    )
    assert (learned.state, learned.config) == (S.REGISTERED, base.config)
    # with what its code declares it changes (the result contract allows exactly that)
    learned = poll(
        lambda: AnalyzerVersion.objects.filter(
            pk=learned.pk, declared_effect=["insertions"]
        ).first(),
        "green's declaration recorded",
    )
    row = poll(
        lambda: next(
            (r for r in code_versions.version_rows()
             if r["fingerprint"] == learned.fingerprint and r["workers"]["count"]), None
        ), "a live worker of green's code",
    )  # fmt: skip
    assert row["code_version"] == green_code and row["workers"]["serving"] == 0  # not warming

    # The code rollout: warming happens on green's workers (its pool staffs the version).
    ro = rollouts_start.start_rollout(
        version=learned.fingerprint, actor="ci", enqueue_driver=False,
        warm_set={"repositories": 1, "commits_per_repository": 10, "threshold": 1.0},
    )  # fmt: skip
    driver = RolloutDriver(ro.pk, ttl=5.0, warmer=warm_rollout)
    driver.acquire(actor="ci")
    DRIVERS.append(driver)

    def verified() -> bool:
        driver.tick()
        return AnalyzerVersion.objects.get(pk=learned.pk).state == S.VERIFIED

    poll(verified, "the warm set verified on green's workers", timeout=180)
    assert stored(repo, learned.fingerprint) == {sha: 10 * n for sha, n in truth.items()}
    assert stored(repo, base.fingerprint) == truth  # still served, unchanged
    assert state_machine.served_fingerprint() == base.fingerprint
    assert codes_of_attempts(learned.fingerprint) == {green_code}
    assert codes_of_attempts(base.fingerprint) == {blue_code}
    assert all(w.code_version == green_code for w in WorkerBeat.objects.filter(
        version=learned.fingerprint))  # fmt: skip

    # Promote: green serves; blue's pool stops its shared workers, green's starts them.
    token = int(driver.token or 0)
    steps.set_ramp(rollout=ro, percent=100, token=token, actor="ci")
    steps.promote(rollout=ro, token=token, actor="ci")
    driver.release()
    assert state_machine.served_fingerprint() == learned.fingerprint
    poll(lambda: live(green_code, version=learned.fingerprint, queues__contains="sync"),
         "green's shared workers")  # fmt: skip
    poll(lambda: not live(blue_code, queues__contains="sync"), "blue's shared workers gone")

    # Roll back: blue's numbers are served at once; green's version drains, its workers go.
    ro = rollback_rollout(rollout=ro.pk, actor="ops", reason="drill", wait=0)
    assert state_machine.served_fingerprint() == base.fingerprint
    assert AnalyzerVersion.objects.get(pk=base.pk).state == S.CURRENT
    assert stored(repo, base.fingerprint) == truth
    poll(lambda: live(blue_code, version=base.fingerprint, queues__contains="sync"),
         "blue's shared workers back")  # fmt: skip

    def drained() -> bool:  # the reconciler's round, asked directly
        drains.reconcile_drains()
        return AnalyzerVersion.objects.get(pk=learned.pk).state == S.DRAINED

    poll(drained, "green's version drained")
    assert Rollout.objects.get(pk=ro.pk).state == Rollout.State.ROLLED_BACK
    # Only green's driver-queue worker is left: the Deployment may be scaled down now.
    poll(lambda: [w.queues for w in live(green_code)] == ["rollouts"], "green's version unstaffed")
    assert stored(repo, learned.fingerprint) == {sha: 10 * n for sha, n in truth.items()}
    assert codes_of_attempts(learned.fingerprint) == {green_code}
