"""A repository's lifecycle across analyzer versions (docs/lifecycle.md#statuses): a
canary's dead chunk never fails a repository, the catch-up after a promote survives a
lost hook, and a rollback re-syncs only the repositories its version change left behind.
Real RQ workers (one per version, each loading its own config), real Redis, real git."""

from __future__ import annotations

from pathlib import Path

import pytest
from rq import SimpleWorker

from dashboard.infra import queues
from dashboard.locks import worker_beats
from dashboard.models import AnalyzerVersion, Chunk, Commit, JobRun, Repository, Rollout
from dashboard.operations.reconciler import reconcile
from dashboard.repositories.lifecycle import submit_repository
from dashboard.rollouts import drains, start
from dashboard.rollouts.driver import RolloutDriver
from dashboard.rollouts.warming import warm_rollout
from dashboard.runs.dead_letters import dead_runs
from dashboard.versions import state_machine
from dashboard.versions.state_machine import ensure_baseline
from tests.conftest import run_syncs_only
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
from workers.jobs import load_versions
from workers.pool import PauseAware, version_config

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
S = AnalyzerVersion.State
WARM = {"repositories": 2, "commits_per_repository": 10, "threshold": 1.0}


class _Worker(PauseAware, SimpleWorker):
    pass


def run_queue(name: str, fingerprint: str) -> int:
    """A burst worker that loaded ``fingerprint``, on the one queue ``name``."""
    load_versions([version_config(fingerprint)])
    try:
        worker = _Worker([queues.queue(name)], connection=queues.worker_connection())
        worker_beats.beat(name=f"test-{fingerprint[:8]}", queues_=[name], version=fingerprint)
        worker.work(burst=True, with_scheduler=True, logging_level="WARNING")
        return worker.successful_job_count + worker.failed_job_count
    finally:
        load_versions([])


def setup_rollout(tmp_path: Path) -> tuple[AnalyzerVersion, Rollout, RolloutDriver, list]:
    """Two repositories analysed under the baseline, and a rollout of another config
    warmed, verified and ramping at 100 % (every repository routed to the canary)."""
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
    driver.tick()  # registered → warming
    run_version_workers()
    driver.tick()  # verdict
    driver.tick()  # diff
    act(driver, ro, "set_ramp", percent=100)
    assert new_version(ro).state == S.RAMPING
    return base, Rollout.objects.get(pk=ro.pk), driver, origins


def new_version(ro: Rollout) -> AnalyzerVersion:
    return AnalyzerVersion.objects.get(pk=ro.version_id)


def act(driver: RolloutDriver, ro: Rollout, action: str, **params: object) -> None:
    """An operator's request, executed by the driver's next tick."""
    start.request_action(rollout=ro, action=action, actor="ops", params=params)
    driver.tick()


def stored(repo: Repository, fingerprint: str) -> int:
    return Commit.objects.filter(repository=repo, fingerprint=fingerprint).count()


def test_a_dead_canary_chunk_leaves_its_repository_analysing_then_ready(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The canary's chunk of a new commit dies (three attempts, dead-lettered) while the
    served version's chunk of it is still queued: the repository stays ``analyzing``,
    becomes ``ready`` with its served results complete once that chunk is done, and stays
    ``ready`` through the rollback. The dead letter is the canary's."""
    base, ro, driver, origins = setup_rollout(tmp_path)
    new = new_version(ro)
    origins[0].commit("push", {"new.txt": "x\n"})
    repo, _ = submit_repository(url=str(origins[0].path))
    run_syncs_only()  # plans one served chunk and one canary chunk, both queued
    repo.refresh_from_db()
    assert repo.status == Repository.Status.ANALYZING
    open_chunks = Chunk.objects.filter(repository=repo, state=Chunk.State.QUEUED)
    assert sorted(open_chunks.values_list("fingerprint", flat=True)) == sorted(
        [base.fingerprint, new.fingerprint]
    )

    monkeypatch.setenv("GITWARD_FAILPOINTS", f"analyze.before_write#{repo.name}=raise")
    run_queue(state_machine.physical_queue("analysis", new.fingerprint), new.fingerprint)
    dead = list(dead_runs())
    assert [(r.repository_id, r.fingerprint) for r in dead] == [(repo.pk, new.fingerprint)]
    repo.refresh_from_db()
    assert (repo.status, repo.error) == (Repository.Status.ANALYZING, "")

    monkeypatch.delenv("GITWARD_FAILPOINTS")
    run_version_workers(served_only=True)
    repo.refresh_from_db()
    assert (repo.status, repo.error) == (Repository.Status.READY, "")
    assert stored(repo, base.fingerprint) == repo.commits_total == len(origins[0].shas())

    act(driver, ro, "rollback")
    run_version_workers()
    for _ in range(5):
        if not driver.tick():
            break
    assert new_version(ro).state == S.DRAINED
    assert_complete_under(base.fingerprint)
    assert_no_job_ran_twice()
    assert list(dead_runs()) == dead  # still listed, once
