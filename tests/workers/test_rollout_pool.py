"""The worker pool follows the versions table with real ``manage.py worker``
children: a warming version gets its own worker, which loads that version's config and
analyses the warm set; once the version's gate closes its worker takes no job (a real
worker process, observed over its own dequeue cycles); a superseded or drained version's
workers are stopped, all without restarting the pool."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
from rq import Worker
from rq.job import Job

from dashboard.infra import queues
from dashboard.models import AnalyzerVersion, Commit, JobRun, WorkerBeat
from dashboard.rollouts import drains, start
from dashboard.rollouts.driver import RolloutDriver
from dashboard.rollouts.warming import warm_rollout
from dashboard.versions import state_machine
from dashboard.versions.state_machine import ensure_baseline
from tests.support.processes import ended, worker_env
from tests.support.rollouts import (  # noqa: F401 (fixture)
    DRIVERS,
    RENAMES,
    _release_drivers,
    analysed,
    wait_for,
)
from workers.pool import Pool

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
S = AnalyzerVersion.State


def replan(pool: Pool) -> list[Any]:
    pool._next_plan = 0.0  # the next check re-reads the versions table now
    pool.check()
    return sorted(pool.specs())


def rq_heartbeat(pid: int) -> Any:
    name = f"{socket.gethostname()}.{pid}"
    w = Worker.find_by_key(
        Worker.redis_worker_namespace_prefix + name, connection=queues.worker_connection()
    )
    return w.last_heartbeat if w is not None else None


def test_the_pool_staffs_each_version_and_a_closed_gate_takes_no_job(
    tmp_path: Path, settings: Any
) -> None:
    base = ensure_baseline(actor="setup")
    repo, origin = analysed(tmp_path, "r")
    ro = start.start_rollout(
        config=RENAMES, actor="ci", enqueue_driver=False,
        warm_set={"repositories": 1, "commits_per_repository": 10, "threshold": 1.0},
    )  # fmt: skip
    driver = RolloutDriver(ro.pk, ttl=5.0, warmer=warm_rollout)
    driver.acquire(actor="ci")
    DRIVERS.append(driver)
    env = worker_env(settings, tmp_path, GITWARD_WORKER_DEAD_AFTER="3")
    pool = Pool(1, manage_py=ROOT / "manage.py", env=env, grace=30)
    pool.start()
    try:
        assert sorted(pool.specs()) == [
            ("--analyzer", base.fingerprint, "--shared"), ("--queues", "rollouts"),
        ]  # fmt: skip
        driver.tick()  # warming: the warmer put the warm set on the new version's queue
        new = AnalyzerVersion.objects.get(pk=ro.version_id)
        assert new.state == S.WARMING
        assert replan(pool) == sorted([
            ("--analyzer", base.fingerprint, "--shared"), ("--analyzer", new.fingerprint),
            ("--queues", "rollouts"),
        ])  # fmt: skip
        # The new version's own worker analyses the warm set with its config: the
        # rename is one file under the new fingerprint, two under the base one.
        wait_for(
            lambda: Commit.objects.filter(repository=repo, fingerprint=new.fingerprint).count()
            == 5, timeout=90, what="the warm set under the new fingerprint",
        )  # fmt: skip
        renamed = origin.shas()[3]  # "rename a"
        by_fp = dict(
            Commit.objects.filter(repository=repo, sha=renamed).values_list(
                "fingerprint", "files_changed"
            )
        )
        assert by_fp == {base.fingerprint: 2, new.fingerprint: 1}
        beat = WorkerBeat.objects.get(version=new.fingerprint, stopped_at__isnull=True)
        assert beat.queues == state_machine.physical_queue("analysis", new.fingerprint)
        # Close the gate (rollback: warming → draining). Its worker switches to nothing.
        start.request_action(rollout=ro, action="rollback", actor="ops")
        driver.tick()
        assert AnalyzerVersion.objects.get(pk=new.pk).state == S.DRAINING
        wait_for(lambda: WorkerBeat.objects.get(pk=beat.pk).queues == queues.IDLE_QUEUE,
                 timeout=30, what="the closed gate")  # fmt: skip
        job = queues.queue(state_machine.physical_queue("analysis", new.fingerprint)).enqueue(
            "os.getpid"
        )
        seen = {rq_heartbeat(beat.pid)}
        wait_for(lambda: seen.add(rq_heartbeat(beat.pid)) or len(seen) >= 3, timeout=30,
                 what="two dequeue cycles of the closed worker")  # fmt: skip
        assert Job.fetch(job.id, connection=queues.connection()).get_status() == "queued"
        # Control: the same worker takes it the moment the gate opens again (the
        # rollback edge draining → current), so the refusal above was the gate's.
        state_machine.do_transition(
            version=new.pk, to=S.CURRENT, actor="ops", token=driver.token, rollout=ro
        )
        wait_for(lambda: Job.fetch(job.id, connection=queues.connection()).get_status()
                 == "finished", timeout=30, what="the reopened gate")  # fmt: skip
        # New current: the pool moves the shared workers to it; the old one drains.
        old_shared = next(c for s, c in pool.children if "--shared" in s)
        assert replan(pool) == sorted([
            ("--analyzer", new.fingerprint, "--shared"), ("--analyzer", base.fingerprint),
            ("--queues", "rollouts"),
        ])  # fmt: skip
        old_shared.wait(timeout=30)  # warm shutdown of the superseded version's worker
        assert JobRun.objects.filter(state="running").count() == 0
        # Drained (two empty checks): its worker is stopped, without a pool restart.
        drains.reconcile_drains()
        drains.reconcile_drains()
        assert AnalyzerVersion.objects.get(pk=base.pk).state == S.DRAINED
        drained = next(c for s, c in pool.children if s == ("--analyzer", base.fingerprint))
        assert replan(pool) == sorted([
            ("--analyzer", new.fingerprint, "--shared"), ("--queues", "rollouts"),
        ])  # fmt: skip
        drained.wait(timeout=30)
    finally:
        pool.stop()


def test_a_drain_stops_jobs_running_past_the_timeout(tmp_path: Path, settings: Any) -> None:
    """Rollback while the new version's worker is mid-job: the job may finish; one still
    running after the drain timeout is stopped (its horse killed, its retry cancelled by
    the closed gate) and the version then drains."""
    import subprocess
    import sys

    ensure_baseline(actor="setup")
    analysed(tmp_path, "r")
    ro = start.start_rollout(
        config=RENAMES, actor="ci", enqueue_driver=False,
        warm_set={"repositories": 1, "commits_per_repository": 10, "threshold": 1.0},
    )  # fmt: skip
    driver = RolloutDriver(ro.pk, ttl=5.0, warmer=warm_rollout)
    driver.acquire(actor="ci")
    DRIVERS.append(driver)
    driver.tick()
    new = AnalyzerVersion.objects.get(pk=ro.version_id)
    env = worker_env(settings, tmp_path, GITWARD_FAILPOINTS="analyze.parsing=sleep:120")
    worker = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "worker", "--workers", "1",
         "--analyzer", new.fingerprint], env=env,
    )  # fmt: skip
    try:
        run = wait_for(
            lambda: JobRun.objects.filter(fingerprint=new.fingerprint, state="running").first(),
            timeout=90, what="the warm job running",
        )  # fmt: skip
        start.request_action(rollout=ro, action="rollback", actor="ops")
        driver.tick()
        assert AnalyzerVersion.objects.get(pk=new.pk).state == S.DRAINING
        assert drains.reconcile_drains() == 0  # within the timeout: it may finish
        assert JobRun.objects.get(pk=run.pk).state == "running"
        drains.reconcile_drains(stop_after=0)  # past it: stopped
        job_id = run.rq_id(run.attempts)
        wait_for(lambda: Job.fetch(job_id, connection=queues.connection()).get_status()
                 == "stopped", timeout=30, what="the horse killed")  # fmt: skip
        run.refresh_from_db()
        assert run.state == JobRun.State.DISCARDED  # its retry met the closed gate
        [attempt] = run.attempt_rows.all()
        assert attempt.outcome == "crashed" and "drained for more than 0s" in attempt.error
        wait_for(lambda: not driver.tick(), timeout=30, what="the drain")
        assert AnalyzerVersion.objects.get(pk=new.pk).state == S.DRAINED
        assert not Commit.objects.filter(fingerprint=new.fingerprint).exists()
        assert worker.poll() is None  # only the job's horse was stopped
    finally:
        with ended(worker):  # a worker that outlives its 60 s is killed with its tree
            worker.terminate()
            worker.wait(timeout=60)
