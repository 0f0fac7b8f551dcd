"""The rollout driver end to end: started through the real ``rollouts`` RQ queue and a
real RQ worker, it takes the deploy lock, warms (the test plays the new version's workers
with the real analyzer path), verifies, diffs, ramps by health-checked steps and promotes;
and it rolls back by itself when the canary's health check fails."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone
from rq import SimpleWorker
from rq.job import Job

from dashboard.infra import queues
from dashboard.locks import leases
from dashboard.models import AnalyzerVersion, JobAttempt, JobRun, Rollout, RolloutEvent
from dashboard.observability import counters
from dashboard.rollouts import start as rollouts_start
from dashboard.rollouts import steps, warming
from dashboard.rollouts.driver import RolloutDriver
from dashboard.runs import attempts as runs_attempts
from dashboard.versions import state_machine
from dashboard.versions.state_machine import ensure_baseline
from tests.support.checked_threads import CheckedThread
from tests.support.rollouts import (  # noqa: F401 (fixture)
    DRIVERS,
    PASSING,
    RENAMES,
    _release_drivers,
    analyse_as,
    analysed,
    report_worker,
    wait_for,
)
from workers.analysis.analyzer import AnalyzerConfig
from workers.jobs import load_versions
from workers.locks import keys

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
S = AnalyzerVersion.State


def test_an_automatic_rollout_runs_through_the_rollouts_queue_to_current(tmp_path: Path) -> None:
    base = ensure_baseline(actor="setup")
    repo, origin = analysed(tmp_path, "r")
    ro = rollouts_start.start_rollout(
        config=RENAMES,
        steps=[50, 100],
        auto=True,
        actor="ci",
        warm_set={"repositories": 5, "commits_per_repository": 10, "threshold": 1.0},
        options={"step_pause": 0, "min_samples": 0},
    )
    q = queues.queue(rollouts_start.DRIVER_QUEUE)
    assert q.job_ids == [f"rollout-{ro.pk}-start"]
    assert not rollouts_start.enqueue_driver_job(ro.pk)  # one driver job per rollout
    seen: dict[str, object] = {}

    def play_the_new_versions_workers() -> None:
        """Once the driver started warming: run the analyze jobs its warmer put on the
        new version's physical queue with the real job function, as the new version's
        worker (which loads its config) would, and report a worker of that fingerprint."""
        try:
            wait_for(lambda: AnalyzerVersion.objects.get(pk=ro.version_id).state == S.WARMING)
            row = Rollout.objects.get(pk=ro.pk)
            seen.update(state=row.state, token=row.lock_token, items=row.warm_set["items"])
            new = AnalyzerVersion.objects.get(pk=ro.version_id)
            load_versions([AnalyzerConfig.from_mapping(new.config)])
            physical = queues.queue(state_machine.physical_queue("analysis", new.fingerprint))
            wait_for(lambda: physical.count > 0, what="the warmer's jobs")
            for job in physical.jobs:
                physical.remove(job)
                seen.setdefault("warm_jobs", []).append(job.func(*job.args))
            report_worker(new)
        finally:
            load_versions([])
            connection.close()

    helper = CheckedThread(target=play_the_new_versions_workers, daemon=True)
    helper.start()
    # The RQ worker (main thread: it installs signal handlers) runs the driver job to
    # its end: burst mode returns once the rollout is over and the queue is empty.
    w = SimpleWorker([q], connection=queues.worker_connection())
    w.work(burst=True, logging_level="WARNING")
    helper.join(30)  # raises what the helper raised
    assert not helper.is_alive()
    job = Job.fetch(f"rollout-{ro.pk}-start", connection=queues.worker_connection())
    assert job.get_status() == "finished" and job.return_value() == "completed"
    # The driver took the lock and chose the warm set by itself.
    assert seen["state"] == "active" and seen["token"] is not None
    assert seen["items"] == [[repo.pk, origin.git("rev-list", "HEAD").split()]]
    assert seen["warm_jobs"] == ["stored 5 commits"]  # one chunk, each warm commit once
    new = AnalyzerVersion.objects.get(pk=ro.version_id)
    ro.refresh_from_db()
    assert ro.state == Rollout.State.COMPLETED, ro.outcome
    assert ro.verdict["ok"] and ro.diff["commits_changed"] >= 1
    assert (state_machine.current_version().pk, base.pk) == (new.pk, ro.previous_id)
    assert AnalyzerVersion.objects.get(pk=base.pk).state == S.DRAINING
    actions = list(
        RolloutEvent.objects.filter(rollout=ro)
        .exclude(action__in=["drain.check", "warming.progress"])
        .values_list("action", "to_state")
    )
    # Progress is recorded whenever the stored count changed (how often depends on
    # timing); the last one before the verdict counts every warm commit.
    progress = RolloutEvent.objects.filter(rollout=ro, action="warming.progress").last()
    assert progress is not None and progress.detail["stored"] == progress.detail["expected"] == 5
    assert actions == [
        ("rollout", "pending"),
        ("lock.taken", ""),
        ("rollout", "active"),
        ("transition", "warming"),
        ("warming.enqueued", ""),
        ("verdict", ""),
        ("transition", "verified"),
        ("diff", ""),
        ("transition", "ramping"),
        ("transition", "ramping"),
        ("transition", "draining"),
        ("transition", "current"),
        ("rollout", "completed"),
        ("jobs.moved", ""),  # the superseded version's queued work cancelled, catch-up started
        ("lock.released", ""),
    ]
    assert leases.redlock().inspect(keys.deploy("analysis")) is None


def attempts(repo, fingerprint: str, outcomes: list[str]) -> None:
    start = JobRun.objects.count()
    for i, outcome in enumerate(outcomes, start):
        run = JobRun.objects.create(
            job_id=f"analyze-{fingerprint[:6]}-{i}",
            kind="analyze",
            queue=state_machine.physical_queue("analysis", fingerprint),
            repository=repo,
            fingerprint=fingerprint,
            state="succeeded" if outcome == "succeeded" else "failed",
        )
        JobAttempt.objects.create(run=run, number=1, outcome=outcome, finished_at=timezone.now())


def test_a_failing_canary_is_rolled_back_by_its_driver(tmp_path: Path) -> None:
    base = ensure_baseline(actor="setup")
    from dashboard.models import Repository

    repo = Repository.objects.create(url="https://example.com/x.git")
    ro = rollouts_start.start_rollout(
        config=RENAMES,
        auto=True,
        actor="ci",
        enqueue_driver=False,
        options={"step_pause": 0, "min_samples": 4},
    )
    driver = RolloutDriver(ro.pk, ttl=5.0, warm_timeout=0)
    driver.acquire(actor="ci")
    DRIVERS.append(driver)
    token = int(driver.token or 0)
    steps.begin_warming(rollout=ro, token=token, actor="ci")
    steps.record_verdict(rollout=ro, verdict=PASSING, token=token, actor="ci")
    assert driver.tick()  # verified + auto → first step
    version = AnalyzerVersion.objects.get(pk=ro.version_id)
    assert (version.state, version.ramp_percent) == (S.RAMPING, 10)
    attempts(repo, version.fingerprint, ["failed", "succeeded", "failed"])
    attempts(repo, base.fingerprint, ["succeeded"] * 10)
    assert driver.tick()  # 3 < 4 samples: inconclusive, it waits
    assert AnalyzerVersion.objects.get(pk=ro.version_id).state == S.RAMPING
    attempts(repo, version.fingerprint, ["crashed"])
    assert driver.tick()  # 3 of 4 failed vs 0 of 10: rolled back
    ro.refresh_from_db()
    assert ro.state == Rollout.State.ROLLING_BACK
    assert AnalyzerVersion.objects.get(pk=ro.version_id).state == S.DRAINING
    assert state_machine.current_version().pk == base.pk
    why = RolloutEvent.objects.get(rollout=ro, to_state="draining", version=version)
    assert why.reason.startswith("canary health check failed: failure rate 75.0% vs 0.0%")
    # Two empty drain checks later the rollout is rolled back and the driver stops.
    assert driver.tick() and not driver.tick()
    ro.refresh_from_db()
    assert ro.state == Rollout.State.ROLLED_BACK
    assert AnalyzerVersion.objects.get(pk=ro.version_id).state == S.DRAINED


class WatchedDriver(RolloutDriver):
    """A driver that, just before it runs a claimed request, has another connection
    read what a waiting operator would see: the request and the version's state."""

    seen: list[tuple[bool, str]]

    def _run_action(self, ro, request, token) -> None:  # type: ignore[no-untyped-def]
        def look() -> None:
            try:
                pending = Rollout.objects.get(pk=ro.pk).pending_action is not None
                state = AnalyzerVersion.objects.get(pk=ro.version_id).state
                self.seen.append((pending, state))
            finally:
                connection.close()

        reader = CheckedThread(target=look)
        reader.start()
        reader.join(10)
        super()._run_action(ro, request, token)


def test_a_claimed_request_clears_only_with_its_result_committed(tmp_path: Path) -> None:
    """The CLI and the buttons wait for ``pending_action`` to clear, then read the
    result: nobody may see the request gone while its action is still to come (the
    CLI once printed ``verified 0%`` after a promote that went on to ramp)."""
    ensure_baseline(actor="setup")
    ro = rollouts_start.start_rollout(
        config=RENAMES, actor="ci", enqueue_driver=False, steps=[20, 100]
    )
    driver = WatchedDriver(ro.pk, ttl=5.0)
    driver.seen = []
    driver.acquire(actor="ci")
    DRIVERS.append(driver)
    token = int(driver.token or 0)
    steps.begin_warming(rollout=ro, token=token, actor="ci")
    steps.record_verdict(rollout=ro, verdict=PASSING, token=token, actor="ci")
    rollouts_start.request_action(rollout=ro, action="promote", actor="erin")
    assert driver.tick()
    assert driver.seen == [(True, S.VERIFIED)]  # mid-action: the request still shows
    version = AnalyzerVersion.objects.get(pk=ro.version_id)
    assert Rollout.objects.get(pk=ro.pk).pending_action is None
    assert (version.state, version.ramp_percent) == (S.RAMPING, 20)


def test_warming_that_never_completes_fails_the_gate_after_its_timeout(tmp_path: Path) -> None:
    ensure_baseline(actor="setup")
    ro = rollouts_start.start_rollout(config=RENAMES, actor="ci", enqueue_driver=False)
    driver = RolloutDriver(ro.pk, ttl=5.0, warm_timeout=0)
    driver.acquire(actor="ci")
    DRIVERS.append(driver)
    assert driver.tick()  # registered → warming (nothing analysed yet)
    assert not driver.tick()  # coverage 0 after the (zero) timeout: warm_failed
    ro.refresh_from_db()
    assert ro.state == Rollout.State.FAILED and "gave up" in ro.outcome
    assert AnalyzerVersion.objects.get(pk=ro.version_id).state == S.WARM_FAILED


def test_after_a_rollback_the_previous_results_are_served_as_stored(tmp_path: Path) -> None:
    """Rollback after promote: the previous version is current again and its stored
    results (and cached aggregates) are read back as they were: nothing recomputed."""
    from dashboard.models import Commit, Summary
    from dashboard.repositories.summaries import repository_summary

    base = ensure_baseline(actor="setup")
    repo, origin = analysed(tmp_path, "r")
    before = repository_summary(repo, base.fingerprint)
    cached_at = Summary.objects.get(repository=repo, fingerprint=base.fingerprint).computed_at
    ro = rollouts_start.start_rollout(config=RENAMES, actor="ci", enqueue_driver=False)
    driver = RolloutDriver(ro.pk, ttl=5.0)
    driver.acquire(actor="ci")
    DRIVERS.append(driver)
    token = int(driver.token or 0)
    new = AnalyzerVersion.objects.get(pk=ro.version_id)
    analyse_as(new, repo, list(reversed(origin.shas())))
    steps.begin_warming(rollout=ro, token=token, actor="ci")
    steps.record_verdict(rollout=ro, verdict=PASSING, token=token, actor="ci")
    steps.set_ramp(rollout=ro, percent=100, token=token, actor="ci")
    steps.promote(rollout=ro, token=token, actor="ci")
    driver.release()
    assert state_machine.current_version().fingerprint == new.fingerprint
    assert repository_summary(repo, new.fingerprint) != before  # renames counted once
    from dashboard.rollouts.deploy_lock import rollback_rollout

    rollback_rollout(rollout=ro.pk, actor="ops", reason="regression", ttl=5.0)
    current = state_machine.current_version()
    assert current.fingerprint == base.fingerprint
    assert repository_summary(repo, current.fingerprint) == before
    row = Summary.objects.get(repository=repo, fingerprint=base.fingerprint)
    assert row.computed_at == cached_at  # served from the cache: no recomputation
    stored = Commit.objects.filter(repository=repo, fingerprint=base.fingerprint)
    assert stored.count() == len(origin.shas()) == stored.values("sha").distinct().count()


def test_a_driver_ends_a_rollout_whose_version_can_no_longer_be_rolled_out() -> None:
    """A version retired behind a pending rollout's back (as a retire could before it
    checked for rollouts): the driver's first tick ends the rollout — failed, naming
    why — instead of ticking for ever, and the queue takes a new rollout."""
    ensure_baseline(actor="setup")
    ro = rollouts_start.start_rollout(config=RENAMES, actor="alice", enqueue_driver=False)
    AnalyzerVersion.objects.filter(pk=ro.version_id).update(state=S.RETIRED)
    driver = RolloutDriver(ro.pk, ttl=5.0)
    driver.acquire(actor="alice")
    DRIVERS.append(driver)
    assert driver.tick() is False
    ro.refresh_from_db()
    assert ro.state == Rollout.State.FAILED and "is retired" in ro.outcome
    assert AnalyzerVersion.objects.get(pk=ro.version_id).state == S.RETIRED
    driver.release()
    again = rollouts_start.start_rollout(
        config={"ignore_whitespace": True}, actor="bob", enqueue_driver=False
    )
    assert again.state == Rollout.State.PENDING


def test_a_warm_run_waiting_for_its_retry_is_not_an_error_of_the_gate(tmp_path: Path) -> None:
    """A warm-set run that failed once and waits for its retry: the driver records no
    verdict (the version keeps warming); once the retry stored its commits the gate
    passes. Only a finally failed run (dead-lettered) fails the gate."""
    base = ensure_baseline(actor="setup")
    repo, origin = analysed(tmp_path, "r")
    spec = warming.select_warm_set(fingerprint=base.fingerprint, commits_per_repository=4)
    warm = list(reversed(spec["items"][0][1]))  # oldest first
    ro = rollouts_start.start_rollout(
        config=RENAMES, actor="ci", enqueue_driver=False, warm_set=spec
    )
    driver = RolloutDriver(ro.pk, ttl=5.0, warm_timeout=600)
    driver.acquire(actor="ci")
    DRIVERS.append(driver)
    assert driver.tick()
    new = AnalyzerVersion.objects.get(pk=ro.version_id)
    assert new.state == S.WARMING
    analyse_as(new, repo, warm[:3])
    report_worker(new)
    # The fourth commit's run fails its first attempt through the real attempt path.
    run = runs_attempts.ensure_run(
        kind=JobRun.Kind.ANALYZE, job_id="warm-retry",
        queue=state_machine.physical_queue("analysis", new.fingerprint),
        repository_id=repo.pk, fingerprint=new.fingerprint,
    )  # fmt: skip
    attempt = runs_attempts.begin_attempt(run_id=run.pk, number=1, worker="w")
    assert attempt is not None
    assert runs_attempts.fail_attempt(attempt, OSError("connection reset")) == "failed"
    verdict = warming.verify_warm_set(version=new, warm_set=spec)
    assert verdict["checks"]["errors"] is True and verdict["errors"] == 0, verdict["summary"]
    assert driver.tick()
    assert AnalyzerVersion.objects.get(pk=new.pk).state == S.WARMING
    assert Rollout.objects.get(pk=ro.pk).state == Rollout.State.ACTIVE
    assert not RolloutEvent.objects.filter(rollout=ro, action="verdict").exists()
    # The retry succeeds and stores the fourth commit: the gate passes.
    retry = runs_attempts.begin_attempt(run_id=run.pk, number=2, worker="w")
    assert retry is not None
    analyse_as(new, repo, warm[3:])
    runs_attempts.succeed_attempt(retry)
    driver.tick()
    assert AnalyzerVersion.objects.get(pk=new.pk).state == S.VERIFIED
    # A dead-lettered run is final: the gate fails on it.
    dead = runs_attempts.ensure_run(
        kind=JobRun.Kind.ANALYZE, job_id="warm-dead", queue="q",
        repository_id=repo.pk, fingerprint=new.fingerprint,
    )  # fmt: skip
    final = runs_attempts.begin_attempt(run_id=dead.pk, number=1, worker="w")
    assert final is not None
    runs_attempts.fail_attempt(final, KeyError("lost"), permanent=True)
    assert warming.verify_warm_set(version=new, warm_set=spec)["errors"] == 1
    assert origin


def test_a_database_error_in_the_heartbeat_is_logged_retried_and_keeps_the_lease(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The database refuses the heartbeat's ``heartbeat_at`` stamp (a trigger raises
    on it: a real error from the real database). The heartbeat thread logs each
    failure and beats on: the lease stays extended past its TTL and the driver stays
    alive; once the database takes the stamp again ``heartbeat_at`` moves on."""
    ensure_baseline(actor="setup")
    ro = rollouts_start.start_rollout(config=RENAMES, actor="alice", enqueue_driver=False)
    driver = RolloutDriver(ro.pk, ttl=1.5)
    driver.acquire(actor="alice")
    DRIVERS.append(driver)
    table = Rollout._meta.db_table
    with connection.cursor() as cur:
        if connection.vendor == "postgresql":
            cur.execute(
                "create function refuse_heartbeat() returns trigger language plpgsql as "
                "$$ begin raise exception 'heartbeat refused by the database'; end $$"
            )
            cur.execute(
                f"create trigger refuse_heartbeat before update of heartbeat_at on {table} "
                "for each row execute function refuse_heartbeat()"
            )
        else:
            cur.execute(
                f"create trigger refuse_heartbeat before update of heartbeat_at on {table} "
                "begin select raise(abort, 'heartbeat refused by the database'); end"
            )
    try:
        # Four refused beats (every TTL/3 = 0.5 s): 2 s, longer than the lease's TTL.
        wait_for(lambda: caplog.text.count("heartbeat failed") >= 4, 30, "four refused heartbeats")
        assert "heartbeat refused by the database" in caplog.text
        counters.flush()
        counted = sum(
            value
            for field, value in counters.read_all().items()
            if counters.parse_field(field)[0] == counters.ROLLOUT_HEARTBEAT_ERRORS.name
        )
        assert counted >= 4 and driver.heartbeat_errors >= 4
        info = leases.redlock().inspect(keys.deploy("analysis"))
        assert info is not None and info["holder"]["token"] == driver.token
        assert not driver.lost.is_set() and driver.tick()
    finally:
        with connection.cursor() as cur:
            if connection.vendor == "postgresql":
                cur.execute(f"drop trigger refuse_heartbeat on {table}")
                cur.execute("drop function refuse_heartbeat()")
            else:
                cur.execute("drop trigger refuse_heartbeat")
    stamped = Rollout.objects.get(pk=ro.pk).heartbeat_at
    wait_for(lambda: Rollout.objects.get(pk=ro.pk).heartbeat_at > stamped, 30, "a new stamp")
    assert not driver.lost.is_set()
