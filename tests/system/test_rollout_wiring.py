"""The rollout wired into the running system (docs/rollouts.md#wiring): routing through the
canary, workers per version, the warmer, promote's catch-up and rollback's cancel, with
real RQ workers (one per version, each loading its own config), real Redis, real git.

Each rollback scenario ends with every repository's results complete under the
previous fingerprint and no job run twice."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client

from dashboard.infra import queues
from dashboard.models import AnalyzerVersion, JobAttempt, JobRun, Repository, Rollout
from dashboard.repositories.lifecycle import (
    current_fingerprint,
    repository_status,
    submit_repository,
)
from dashboard.repositories.summaries import repository_summary
from dashboard.rollouts import drains, start
from dashboard.rollouts.deploy_lock import rollback_rollout
from dashboard.rollouts.driver import RolloutDriver
from dashboard.rollouts.warming import warm_rollout
from dashboard.versions import state_machine
from dashboard.versions.state_machine import ensure_baseline
from tests.support.rollout_workers import (
    assert_complete_under,
    assert_no_job_ran_twice,
    run_version_workers,
)
from tests.support.rollouts import (  # noqa: F401 (fixture)
    DRIVERS,
    RENAMES,
    _release_drivers,
    history_with_renames,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
S = AnalyzerVersion.State
WARM = {"repositories": 2, "commits_per_repository": 10, "threshold": 1.0}


def setup_rollout(tmp_path: Path) -> tuple[AnalyzerVersion, Rollout, RolloutDriver, list]:
    base = ensure_baseline(actor="setup")
    origins = [history_with_renames(tmp_path / n) for n in ("one", "two")]
    for o in origins:
        submit_repository(url=str(o.path))
    run_version_workers()
    assert_complete_under(base.fingerprint)
    ro = start.start_rollout(config=RENAMES, actor="ci", enqueue_driver=False, warm_set=WARM)
    driver = RolloutDriver(ro.pk, ttl=5.0, poll=0.05, warmer=warm_rollout)
    driver.acquire(actor="ci")
    DRIVERS.append(driver)
    return base, Rollout.objects.get(pk=ro.pk), driver, origins


def new_version(ro: Rollout) -> AnalyzerVersion:
    return AnalyzerVersion.objects.get(pk=ro.version_id)


def physical(v: AnalyzerVersion):
    return queues.queue(state_machine.physical_queue("analysis", v.fingerprint))


def act(driver: RolloutDriver, ro: Rollout, action: str, **params: object) -> None:
    """An operator's request, executed by the driver's next tick."""
    start.request_action(rollout=ro, action=action, actor="ops", params=params)
    driver.tick()


def warm_and_verify(driver: RolloutDriver, ro: Rollout) -> None:
    driver.tick()  # registered → warming; the warmer enqueues the warm set
    assert new_version(ro).state == S.WARMING and physical(new_version(ro)).count > 0
    run_version_workers()  # the new version's worker analyses it
    driver.tick()  # verdict
    assert new_version(ro).state == S.VERIFIED, Rollout.objects.get(pk=ro.pk).verdict
    driver.tick()  # diff


def drain(driver: RolloutDriver, ro: Rollout) -> None:
    for _ in range(5):
        if not driver.tick():
            break
    assert Rollout.objects.get(pk=ro.pk).state == Rollout.State.ROLLED_BACK
    assert new_version(ro).state == S.DRAINED


def new_commits(origins: list) -> None:
    """A push to every origin and a re-submission: new work to route."""
    for i, o in enumerate(origins):
        o.commit(f"push {i}", {f"new/{i}.txt": "x\n" * (i + 1)})
        submit_repository(url=str(o.path))


def test_rollback_mid_warming_cancels_the_warm_set(tmp_path: Path) -> None:
    base, ro, driver, _ = setup_rollout(tmp_path)
    driver.tick()
    new = new_version(ro)
    queued = physical(new).count
    assert new.state == S.WARMING and queued == 1 + 1  # one chunk per warm repository
    warm_runs = JobRun.objects.filter(fingerprint=new.fingerprint)
    assert {r.queue for r in warm_runs} == {
        state_machine.physical_queue("analysis", new.fingerprint)
    }
    act(driver, ro, "rollback")
    assert physical(new).count == 0  # the queued warm jobs are gone from Redis…
    assert set(warm_runs.values_list("state", flat=True)) == {JobRun.State.DISCARDED}
    run_version_workers()  # …and no worker runs them
    drain(driver, ro)
    assert not JobAttempt.objects.filter(run__fingerprint=new.fingerprint).exists()
    assert current_fingerprint() == base.fingerprint
    assert_complete_under(base.fingerprint)
    assert_no_job_ran_twice()


def test_rollback_mid_ramp_cancels_routed_work_and_keeps_the_current_complete(
    tmp_path: Path,
) -> None:
    base, ro, driver, origins = setup_rollout(tmp_path)
    warm_and_verify(driver, ro)
    act(driver, ro, "set_ramp", percent=100)
    new = new_version(ro)
    assert (new.state, new.ramp_percent) == (S.RAMPING, 100)
    new_commits(origins)
    # Only the served version's worker runs: the syncs plan the current version's chunks
    # (served to readers) and, every repository being routed at 100 %, the canary's.
    run_version_workers(served_only=True)
    assert_complete_under(base.fingerprint)
    routed = JobRun.objects.filter(fingerprint=new.fingerprint, state=JobRun.State.QUEUED)
    assert routed.count() == 2 and physical(new).count == 2
    act(driver, ro, "rollback")
    assert physical(new).count == 0 and not routed.exists()
    run_version_workers()
    drain(driver, ro)
    assert_complete_under(base.fingerprint)
    assert_no_job_ran_twice()
    # The canary's work ran only for the warm set, each chunk once.
    assert JobAttempt.objects.filter(run__fingerprint=new.fingerprint).count() == 2


def test_promote_serves_the_new_numbers_and_rollback_the_old_ones_at_once(
    tmp_path: Path, client: Client
) -> None:
    base, ro, driver, origins = setup_rollout(tmp_path)
    repos = list(Repository.objects.order_by("pk"))
    before = {r.pk: repository_summary(r, base.fingerprint) for r in repos}
    warm_and_verify(driver, ro)
    act(driver, ro, "set_ramp", percent=10)
    act(driver, ro, "promote")  # 10 → 50
    act(driver, ro, "promote")  # 50 → 100
    act(driver, ro, "promote")  # after the last step: current
    new = new_version(ro)
    assert new.state == S.CURRENT and Rollout.objects.get(pk=ro.pk).state == "completed"
    assert not driver.tick()
    driver.release()
    new_commits(origins)
    run_version_workers()  # catch-up + the new commits, all under the new fingerprint
    assert_complete_under(new.fingerprint)
    client.force_login(User.objects.create_user("viewer", password="pw-viewer-123"))
    for r in repos:
        body = client.get(f"/api/repos/{r.pk}?summary=1").json()
        assert body["fingerprint"] == new.fingerprint
        assert body["summary"]["totals"] != before[r.pk]["totals"]  # renames counted once
    # The rollback: the previous results are served the moment it commits.
    rollback_rollout(rollout=ro.pk, actor="ops", reason="regression", ttl=5.0)
    assert current_fingerprint() == base.fingerprint
    for r in repos:
        status = repository_status(Repository.objects.get(pk=r.pk))
        assert status["fingerprint"] == base.fingerprint
        summary = client.get(f"/api/repos/{r.pk}?summary=1").json()["summary"]
        assert summary["totals"]["commits"] == before[r.pk]["totals"]["commits"]
    # The catch-up brings the pushes under the previous fingerprint; nothing ran twice.
    run_version_workers()
    assert_complete_under(base.fingerprint)
    assert_no_job_ran_twice()
    drains.reconcile_drains()
    drains.reconcile_drains()
    assert new_version(ro).state == S.DRAINED
    assert Rollout.objects.get(pk=ro.pk).state == Rollout.State.ROLLED_BACK
