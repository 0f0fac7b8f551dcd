"""Real RQ workers for the rollout wiring tests: one in-process worker per analyzer
version, each loading exactly that version's config (as ``manage.py worker --analyzer
FP`` does), run in burst mode until every queue is quiet."""

from __future__ import annotations

from rq import SimpleWorker

from dashboard.infra import queues
from dashboard.locks import worker_beats
from dashboard.management.commands.worker import worker_queues
from dashboard.models import AnalyzerVersion, Commit, JobAttempt, JobRun, Repository
from dashboard.versions import state_machine
from tests.support.stored_commits import assert_counts_exact
from workers.jobs import load_versions
from workers.pool import PauseAware, version_config


class _Worker(PauseAware, SimpleWorker):
    pass


def _burst(names: list[str], fingerprint: str) -> int:
    load_versions([version_config(fingerprint)])
    try:
        worker = _Worker([queues.queue(n) for n in names], connection=queues.worker_connection())
        # What run_one_worker does first: report the version it loaded.
        worker_beats.beat(name=f"test-worker-{fingerprint[:8]}", queues_=names, version=fingerprint)
        worker.apply_pauses()
        worker.work(burst=True, with_scheduler=True, logging_level="WARNING")
        return worker.successful_job_count + worker.failed_job_count
    finally:
        load_versions([])


def run_version_workers(*, served_only: bool = False) -> int:
    """Rounds of: the served version's worker (sync, its analysis queue, maintenance),
    then one worker per other staffed version (its physical queue only), until a round
    runs no job. Returns the jobs run."""
    total = 0
    while True:
        served = state_machine.served_fingerprint()
        ran = _burst(worker_queues(served), served)
        if not served_only:
            for fp in (
                AnalyzerVersion.objects.filter(state__in=state_machine.STAFFED)
                .exclude(fingerprint=served)
                .values_list("fingerprint", flat=True)
            ):
                ran += _burst([state_machine.physical_queue("analysis", fp)], fp)
        total += ran
        if not ran:
            return total


def assert_complete_under(fingerprint: str) -> None:
    """Every repository ready, with every commit of its last sync stored under
    ``fingerprint``, and the kept counts of stored commits exact."""
    assert_counts_exact()
    for repo in Repository.objects.all():
        stored = Commit.objects.filter(repository=repo, fingerprint=fingerprint).count()
        assert (repo.status, repo.fingerprint, stored) == (
            Repository.Status.READY,
            fingerprint,
            repo.commits_total,
        ), repo.error


def assert_no_job_ran_twice() -> None:
    """No run has two successful attempts, and no commit was stored twice for one
    fingerprint (the per-fingerprint chunk plan covers each commit once)."""
    for run in JobRun.objects.all():
        ok = JobAttempt.objects.filter(run=run, outcome=JobAttempt.Outcome.SUCCEEDED).count()
        assert ok <= 1, f"{run.job_id} succeeded {ok} times"
    for repo in Repository.objects.all():
        for fp in set(Commit.objects.filter(repository=repo).values_list("fingerprint", flat=True)):
            shas = list(
                Commit.objects.filter(repository=repo, fingerprint=fp).values_list("sha", flat=True)
            )
            assert len(shas) == len(set(shas))
