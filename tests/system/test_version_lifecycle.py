"""A repository's lifecycle across analyzer versions (docs/lifecycle.md#statuses): a
canary's dead chunk never fails a repository, the catch-up after a promote survives a
lost hook, and a rollback re-syncs only the repositories its version change left behind.
Real RQ workers (one per version, each loading its own config), real Redis, real git."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rq import SimpleWorker

from dashboard.infra import queues
from dashboard.locks import worker_beats
from dashboard.locks.fencing import next_token
from dashboard.models import (
    AnalyzerVersion,
    Chunk,
    Commit,
    JobAttempt,
    JobRun,
    Repository,
    Rollout,
    RolloutEvent,
)
from dashboard.operations.reconciler import reconcile
from dashboard.repositories.chunk_plans import plan_repository
from dashboard.repositories.lifecycle import claim_sync, submit_repository
from dashboard.rollouts import start
from dashboard.rollouts.driver import RolloutDriver
from dashboard.rollouts.warming import warm_rollout
from dashboard.runs.dead_letters import dead_runs
from dashboard.settings import channel_layer_host
from dashboard.versions import state_machine
from dashboard.versions.state_machine import ensure_baseline
from tests.conftest import _own_node, run_syncs_only
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
from workers import jobs
from workers.jobs import load_versions
from workers.pool import PauseAware, version_config
from workers.runtime.redis_server import RedisNode

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


@pytest.fixture
def queue_node(settings: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisNode]:
    """A queue server (``REDIS_URL``) of its own, a real ``redis-server``; the three lock
    masters stay up, so the rollout's deploy lock holds while it is down."""
    node = _own_node(tmp_path_factory.mktemp("queue"))
    settings.QUEUE_TIMEOUT = 0.3
    settings.REDIS_URL = node.url
    settings.CHANNEL_LAYERS = {  # a new dict: Channels drops its cached layer
        "default": {
            "BACKEND": "dashboard.infra.events.ResilientChannelLayer",
            "CONFIG": {"hosts": [channel_layer_host(node.url, settings.QUEUE_TIMEOUT)]},
        }
    }
    queues.CIRCUIT.reset()
    yield node
    node.resume()
    node.kill()
    queues.CIRCUIT.reset()


def test_a_promote_whose_catch_up_was_lost_is_caught_up_by_the_reconciler(
    tmp_path: Path, queue_node: RedisNode
) -> None:
    """The queue server is down across the promote's commit: the version change
    stands, its after-commit catch-up is lost. Once the server is back, the reconciler
    enqueues the catch-up (once, however many rounds run) and every repository is
    brought up to date under the new version."""
    _, ro, driver, origins = setup_rollout(tmp_path)
    new = new_version(ro)
    queue_node.kill()
    act(driver, ro, "promote")  # its after-commit hook meets the dead queue server
    assert new_version(ro).state == S.CURRENT
    assert Rollout.objects.get(pk=ro.pk).state == Rollout.State.COMPLETED
    moved = RolloutEvent.objects.get(rollout=ro, action="jobs.moved")
    assert moved.reason.endswith("(queue server unreachable: left for the reconciler)")
    assert reconcile()["queue_unreachable"] == 1

    queue_node.restart()  # empty: whatever the hook might have written is gone
    queues.CIRCUIT.reset()
    run_version_workers()
    lagging = Repository.objects.exclude(fingerprint=new.fingerprint)
    assert lagging.count() == len(origins)  # nothing brought them up to date
    rounds = [reconcile().get("caught_up") for _ in range(2)]  # the second finds it queued
    run_version_workers()
    assert_complete_under(new.fingerprint)
    assert_no_job_ran_twice()
    assert rounds == [1, 0]
    assert reconcile()["caught_up"] == 0  # nothing lags any more
    syncs = JobRun.objects.filter(kind=JobRun.Kind.SYNC)
    assert syncs.count() == 2 * len(origins)  # the first sync and one catch-up each


def test_a_rollback_re_syncs_no_repository_that_failed_for_its_own_reasons(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two repositories failed under the served version, one at its sync (its remote
    is gone) and one at a chunk, while a version ramps: rolling it back re-syncs
    neither, so no dead letter, run or attempt is added; the healthy one stays
    complete. (Before, every rollback re-synced every failed repository: one new dead
    sync per rollback for the first, three more failed attempts for the second.)"""
    base, ro, driver, origins = setup_rollout(tmp_path)
    gone = history_with_renames(tmp_path / "gone")
    lost, _ = submit_repository(url=str(gone.path))
    shutil.rmtree(gone.path)
    origins[0].commit("push", {"new.txt": "x\n"})
    poisoned, _ = submit_repository(url=str(origins[0].path))
    run_syncs_only()
    monkeypatch.setenv("GITWARD_FAILPOINTS", f"analyze.before_write#{poisoned.name}=raise")
    run_version_workers()
    for repo in (lost, poisoned):
        repo.refresh_from_db()
        assert repo.status == Repository.Status.FAILED
    dead = sorted(dead_runs().values_list("pk", flat=True))
    assert {JobRun.Kind.SYNC, JobRun.Kind.ANALYZE} <= set(
        dead_runs().values_list("kind", flat=True)
    )
    runs_before = JobRun.objects.count()
    attempts_before = JobAttempt.objects.count()

    act(driver, ro, "rollback")
    run_version_workers()
    for _ in range(5):
        if not driver.tick():
            break
    assert new_version(ro).state == S.DRAINED
    assert sorted(dead_runs().values_list("pk", flat=True)) == dead
    assert (JobRun.objects.count(), JobAttempt.objects.count()) == (runs_before, attempts_before)
    for repo in (lost, poisoned):
        repo.refresh_from_db()
        assert repo.status == Repository.Status.FAILED
    healthy = Repository.objects.exclude(pk__in=[lost.pk, poisoned.pk]).get()
    assert (healthy.status, stored(healthy, base.fingerprint)) == (
        Repository.Status.READY,
        healthy.commits_total,
    )


def test_a_leftover_job_of_an_ended_run_does_not_block_the_drain(tmp_path: Path) -> None:
    """A canary chunk's attempt was delivered twice (its RQ job still queued while
    another delivery claimed and finished it): after the rollback no worker takes a job
    from the closed queue and the cancel leaves a finished run alone, so before the
    sweep the version never drained. A drain check (or the reconciler's sweep of closed
    queues: one rule, ``runs.sweep_queue``) removes that job and the drain completes;
    the finished work is not run again."""
    base, ro, driver, origins = setup_rollout(tmp_path)
    new = new_version(ro)
    origins[0].commit("push", {"new.txt": "x\n"})
    repo, _ = submit_repository(url=str(origins[0].path))
    run_syncs_only()
    canary = JobRun.objects.get(repository=repo, fingerprint=new.fingerprint, state="queued")
    closed_queue = queues.queue(state_machine.physical_queue("analysis", new.fingerprint))
    leftover = canary.rq_id()  # attempt 1's job
    assert closed_queue.get_job_ids() == [leftover]
    load_versions([version_config(new.fingerprint)])
    try:
        jobs.analyze_chunk(canary.pk, 1)  # the other delivery of attempt 1
    finally:
        load_versions([])
    canary.refresh_from_db()
    assert canary.state == JobRun.State.SUCCEEDED
    run_version_workers(served_only=True)

    act(driver, ro, "rollback")  # the cancel leaves it; the rollback's drain check does not
    for _ in range(3):
        reconcile()
    assert closed_queue.get_job_ids() == []
    assert new_version(ro).state == S.DRAINED
    assert Rollout.objects.get(pk=ro.pk).state == Rollout.State.ROLLED_BACK
    assert JobAttempt.objects.filter(run=canary).count() == 1
    assert_complete_under(base.fingerprint)
    assert_no_job_ran_twice()


def test_a_plan_that_lands_under_the_closed_version_after_the_catch_up_is_re_synced(
    tmp_path: Path,
) -> None:
    """The promote commits while a repository's sync is planning: the plan read the
    fingerprints before the commit and lands under the now closed version, after the
    catch-up passed the repository (it was mid-sync, so skipped). Its chunks are
    cancelled at enqueue (closed gate), so nothing ever completes it: before, it stayed
    ``analyzing`` under the closed version for ever. The reconciler sees it lag and
    re-syncs it under the served version."""
    base, ro, driver, origins = setup_rollout(tmp_path)
    new = new_version(ro)
    origins[0].commit("push", {"new.txt": "x\n"})
    repo, _ = submit_repository(url=str(origins[0].path))
    act(driver, ro, "promote")
    assert new_version(ro).state == S.CURRENT
    run_queue(queues.MAINTENANCE_QUEUE, new.fingerprint)  # the catch-up: repo mid-sync
    assert claim_sync(repo_id=repo.pk, generation=repo.generation) is not None
    plan_repository(  # what the racing sync's plan wrote
        repo_id=repo.pk,
        generation=repo.generation,
        head=origins[0].head(),
        shas=origins[0].shas(),
        lock_key=repo.lock_key(),
        token=next_token(repo.lock_key()),
        fingerprint=base.fingerprint,
    )
    run_version_workers()
    repo.refresh_from_db()
    assert (repo.status, repo.fingerprint) == (Repository.Status.ANALYZING, base.fingerprint)

    for _ in range(2):
        reconcile()
        run_version_workers()
    assert_complete_under(new.fingerprint)
    assert_no_job_ran_twice()
