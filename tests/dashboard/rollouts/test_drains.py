"""Drain checks (``dashboard.rollouts.drains``) against transitions of the same queue, on
the real database: the lock order they share (docs/rollouts.md#lock-order)."""

from __future__ import annotations

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone

from dashboard.infra import queues
from dashboard.models import AnalyzerVersion, JobRun, Repository, RolloutEvent
from dashboard.rollouts import drains
from dashboard.runs import attempts as runs_attempts
from dashboard.versions import state_machine
from dashboard.versions.state_machine import ensure_baseline
from tests.support.checked_threads import CheckedThread
from tests.support.rollouts import wait_for

pytestmark = pytest.mark.django_db(transaction=True)
S = AnalyzerVersion.State
EMPTY = {"queued": 0, "started": 0, "scheduled": 0, "runs": 0}


def _lock_waiters() -> int:
    with connections["default"].cursor() as cur:
        # Inside a transaction the statistics views are a snapshot: take a fresh one.
        cur.execute("select pg_stat_clear_snapshot()")
        cur.execute(
            "select count(*) from pg_stat_activity where datname = current_database() "
            "and wait_event_type = 'Lock'"
        )
        return int(cur.fetchone()[0])


def test_a_drain_check_and_a_transition_of_the_same_queue_do_not_deadlock() -> None:
    """Versions v1 (current) < v2 (draining, its first empty check done) < v3 (drained)
    by pk. A transaction holds v1 while a retire of v3 (which locks the queue's
    versions in pk order) and then the second drain check of v2 queue up behind it.
    When it lets go, the retire takes v1 and goes on to v2: the drain check must not
    hold v2 meanwhile. It did (it locked its own row first, then the queue's versions
    in pk order inside the transition): PostgreSQL found the cycle and aborted one of
    the two with "deadlock detected". Now it locks the queue's versions in pk order
    too, waits behind the retire, and both succeed."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks: SQLite serialises every writer instead")
    v1 = ensure_baseline(actor="setup")
    v2 = state_machine.register_version(config={"detect_renames": True}, actor="setup")
    v3 = state_machine.register_version(config={"ignore_whitespace": True}, actor="setup")
    AnalyzerVersion.objects.filter(pk=v2.pk).update(state=S.DRAINING, verified_at=v1.created_at)
    AnalyzerVersion.objects.filter(pk=v3.pk).update(state=S.DRAINED, verified_at=v1.created_at)
    assert v1.pk < v2.pk < v3.pk
    assert not drains.check_version_drain(version=v2.pk, actor="t", counts=EMPTY)  # one empty
    errors: list[BaseException] = []

    def run(step) -> None:
        try:
            step()
        except BaseException as exc:  # reported below, with its message
            errors.append(exc)
        finally:
            connections.close_all()

    retire = CheckedThread(
        target=run,
        args=(lambda: state_machine.retire_version(fingerprint=v3.fingerprint, actor="ops"),),
    )
    drain = CheckedThread(
        target=run,
        args=(lambda: drains.check_version_drain(version=v2.pk, actor="t", counts=EMPTY),),
    )
    with transaction.atomic():
        list(AnalyzerVersion.objects.select_for_update().filter(pk=v1.pk))
        retire.start()
        wait_for(lambda: _lock_waiters() == 1, 30, "the retire to wait for v1")
        drain.start()
        wait_for(lambda: _lock_waiters() == 2, 30, "the drain check to wait")
    retire.join(60)
    drain.join(60)
    assert errors == [], [str(e) for e in errors]
    states = dict(AnalyzerVersion.objects.values_list("pk", "state"))
    assert states == {v1.pk: S.CURRENT, v2.pk: S.DRAINED, v3.pk: S.RETIRED}
    assert RolloutEvent.objects.filter(version_id=v2.pk, action="drain.check").count() == 2


def test_a_leftover_job_in_a_closed_versions_queue_does_not_keep_it_draining() -> None:
    """A job of a run that no longer waits sits in a draining version's queue — here a
    second copy of an attempt the run has already spent (the reconciler re-enqueues a
    run it judges stale; the claim makes the copy a no-op), its run dead-lettered
    since. No worker takes a job from a closed gate's queue: the drain counted it for
    ever and the rollout stayed rolling back. The drain check removes such leftovers
    (and only those: a waiting run's job is the reconciler's to cancel), so two
    checks drain the version."""
    ensure_baseline(actor="setup")
    v = state_machine.register_version(config={"detect_renames": True}, actor="setup")
    repo = Repository.objects.create(url="https://example.invalid/r.git")
    name = state_machine.physical_queue("analysis", v.fingerprint)
    run = runs_attempts.ensure_run(
        kind=JobRun.Kind.ANALYZE, job_id="leftover", queue=name,
        repository_id=repo.pk, fingerprint=v.fingerprint,
    )  # fmt: skip
    assert queues.enqueue_unique(
        queues.queue(name), "workers.jobs.analyze_chunk", run.pk, 1, job_id=run.rq_id()
    )
    attempt = runs_attempts.begin_attempt(run_id=run.pk, number=1, worker="w")
    assert attempt is not None
    runs_attempts.fail_attempt(attempt, KeyError("lost"), permanent=True)
    AnalyzerVersion.objects.filter(pk=v.pk).update(
        state=S.DRAINING, state_changed_at=timezone.now()
    )
    v.refresh_from_db()
    assert drains.drain_counts(v) == {"queued": 1, "started": 0, "scheduled": 0, "runs": 0}
    drains.reconcile_drains()
    assert drains.reconcile_drains() == 1
    assert AnalyzerVersion.objects.get(pk=v.pk).state == S.DRAINED
    assert queues.queue(name).count == 0


def test_a_waiting_runs_job_is_not_swept_but_counted() -> None:
    """The sweep leaves a waiting run's next attempt alone: it is counted (the drain
    waits) until the run is cancelled."""
    ensure_baseline(actor="setup")
    v = state_machine.register_version(config={"detect_renames": True}, actor="setup")
    repo = Repository.objects.create(url="https://example.invalid/w.git")
    name = state_machine.physical_queue("analysis", v.fingerprint)
    run = runs_attempts.ensure_run(
        kind=JobRun.Kind.ANALYZE, job_id="waiting", queue=name,
        repository_id=repo.pk, fingerprint=v.fingerprint,
    )  # fmt: skip
    assert queues.enqueue_unique(
        queues.queue(name), "workers.jobs.analyze_chunk", run.pk, 1, job_id=run.rq_id()
    )
    AnalyzerVersion.objects.filter(pk=v.pk).update(
        state=S.DRAINING, state_changed_at=timezone.now()
    )
    v.refresh_from_db()
    assert drains.sweep_leftovers(v) == 0
    assert not drains.check_version_drain(version=v.pk, actor="t")
    assert not drains.check_version_drain(version=v.pk, actor="t")
    assert queues.queue(name).job_ids == [run.rq_id()]
