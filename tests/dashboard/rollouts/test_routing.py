"""Routing of new work (docs/rollouts.md): a sync plans the served version's chunks for every
repository and the ramping version's for the repositories whose key routes to it (a
deterministic hash against p %); retries stay on their version; a worker refuses a job
of a version it did not load — handed back to its own queue if misrouted, dead-lettered
at once if the worker itself serves the wrong version."""

from __future__ import annotations

from pathlib import Path

import pytest
from rq.job import Job

from dashboard.infra import queues
from dashboard.locks.fencing import next_token
from dashboard.models import AnalyzerVersion, JobAttempt, JobRun, Repository
from dashboard.repositories import chunk_plans
from dashboard.rollouts import steps
from dashboard.runs.attempts import enqueue_run
from dashboard.versions import canary, state_machine
from dashboard.versions.state_machine import ensure_baseline
from tests.support.rollout_workers import _burst, _Worker
from tests.support.rollouts import (  # noqa: F401 (fixture)
    DRIVERS,
    RENAMES,
    _release_drivers,
    analysed,
    start,
    verify,
)
from workers.analysis.analyzer import DEFAULT
from workers.jobs import load_versions
from workers.pool import run_one_worker

pytestmark = pytest.mark.django_db(transaction=True)
S = AnalyzerVersion.State
SHAS = [f"{i:040x}" for i in range(1, 4)]


def plan(repo: Repository) -> None:
    key = repo.lock_key()
    chunk_plans.plan_repository(
        repo_id=repo.pk, generation=repo.generation, head=SHAS[-1], shas=SHAS,
        lock_key=key, token=next_token(key),
    )  # fmt: skip


def test_syncs_plan_the_canary_for_exactly_the_routed_repositories() -> None:
    ro, driver = start()
    verify(ro, driver)
    steps.set_ramp(rollout=ro, percent=30, token=int(driver.token or 0), actor="ops")
    new = AnalyzerVersion.objects.get(pk=ro.version_id)
    base = state_machine.current_version()
    repos = [Repository.objects.create(url=f"https://example.com/r{i}.git") for i in range(40)]
    for repo in repos:
        plan(repo)
    routed = {r.pk for r in repos if canary.route(canary.repository_key(r.pk), 30)}
    assert 0 < len(routed) < len(repos)  # a real split, decided by the hash alone
    runs = JobRun.objects.filter(kind="analyze")

    def planned(fp: str) -> set[int]:
        return set(runs.filter(fingerprint=fp).values_list("repository_id", flat=True))

    assert planned(base.fingerprint) == {r.pk for r in repos}
    assert planned(new.fingerprint) == routed
    assert {r.queue for r in runs.filter(fingerprint=new.fingerprint)} == {
        state_machine.physical_queue("analysis", new.fingerprint)
    }
    # The operations view (and pause/resume) know every staffed version's queue.
    assert queues.queue_names() == [
        "sync", state_machine.physical_queue("analysis", base.fingerprint),
        state_machine.physical_queue("analysis", new.fingerprint), "maintenance", "rollouts",
    ]  # fmt: skip
    # Readers still see the current version: the canary is a shadow until promotion.
    assert set(Repository.objects.values_list("fingerprint", flat=True)) == {base.fingerprint}
    # Planning again (a redelivered sync) routes the same way and adds nothing.
    before = runs.count()
    for repo in repos:
        plan(repo)
    assert runs.count() == before


def test_a_retry_stays_on_its_version_and_a_closed_versions_retry_is_cancelled() -> None:
    ro, driver = start()
    verify(ro, driver)
    token = int(driver.token or 0)
    steps.set_ramp(rollout=ro, percent=100, token=token, actor="ops")
    new = AnalyzerVersion.objects.get(pk=ro.version_id)
    repo = Repository.objects.create(url="https://example.com/r.git")
    plan(repo)
    run = JobRun.objects.filter(fingerprint=new.fingerprint).order_by("pk").first()
    assert run is not None
    own = state_machine.physical_queue("analysis", new.fingerprint)
    # Its first attempt failed (taken off the queue, as a worker does).
    queues.queue(own).remove(run.rq_id(1))
    JobRun.objects.filter(pk=run.pk).update(state="failed", attempts=1)
    run.refresh_from_db()
    assert enqueue_run(run)  # the retry: back on its own version's queue
    assert run.rq_id() in queues.queue(own).job_ids
    steps.rollback(rollout=ro, token=token, actor="ops")  # gate closes; queued work cancelled
    run.refresh_from_db()
    assert run.state == JobRun.State.DISCARDED and queues.queue(own).count == 0
    JobRun.objects.filter(pk=run.pk).update(state="failed")
    assert not enqueue_run(JobRun.objects.get(pk=run.pk))  # a late retry is cancelled too
    assert JobRun.objects.get(pk=run.pk).state == JobRun.State.DISCARDED


def test_a_misrouted_job_is_handed_back_and_a_wrong_worker_dead_letters_it(
    tmp_path: Path,
) -> None:
    base = ensure_baseline(actor="setup")
    repo, origin = analysed(tmp_path, "r")
    ro, driver = start(warm_set={"repositories": 1})
    steps.begin_warming(rollout=ro, token=int(driver.token or 0), actor="ci")
    new = AnalyzerVersion.objects.get(pk=ro.version_id)
    [run_id] = chunk_plans.plan_warm_set(
        fingerprint=new.fingerprint, items=[(repo.pk, origin.shas())]
    )
    run = JobRun.objects.get(pk=run_id)
    own = queues.queue(state_machine.physical_queue("analysis", new.fingerprint))
    wrong = queues.queue(state_machine.physical_queue("analysis", base.fingerprint))
    job = Job.fetch(run.rq_id(), connection=queues.connection())
    own.remove(job)
    wrong.enqueue_job(job)  # misrouted: the new version's chunk on the base queue
    _burst([wrong.name], base.fingerprint)  # the base worker refuses and hands it back
    run.refresh_from_db()
    assert (run.state, run.queue, run.budget_used) == ("queued", own.name, 0)
    assert JobAttempt.objects.get(run=run, number=1).outcome == JobAttempt.Outcome.DEFERRED
    assert own.job_ids == [run.rq_id()] and wrong.count == 0
    # A worker that listens on a queue of a version it did not load refuses to start…
    with pytest.raises(ValueError, match="refuses"):
        run_one_worker([own.name], burst=True, configs=[DEFAULT])
    # …and if one ran anyway, the job is dead-lettered at once, never retried 3 times.
    load_versions([DEFAULT])
    try:
        _Worker([own], connection=queues.worker_connection()).work(
            burst=True, logging_level="WARNING"
        )
    finally:
        load_versions([])
    run.refresh_from_db()
    assert run.state == JobRun.State.DEAD and "not loaded by this worker" in run.error
    assert JobAttempt.objects.filter(run=run).count() == 2
