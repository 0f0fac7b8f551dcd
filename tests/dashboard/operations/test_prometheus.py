"""dashboard.operations.prometheus and dashboard.observability.counters: ``/metrics`` is exact for
what the system holds (real queues, locks on three masters, rows in the database), and its counters
and histograms move as real jobs run — in this process, in forked work horses of two worker
processes, and in a work horse killed mid-job."""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from dashboard.infra import queues
from dashboard.locks import leases
from dashboard.locks.fencing import StaleToken, next_token
from dashboard.models import (
    AnalyzerVersion,
    ApiToken,
    Chunk,
    JobRun,
    Repository,
    Rollout,
    WorkerBeat,
)
from dashboard.observability import counters
from dashboard.operations.prometheus import metrics_text
from dashboard.repositories.commits import write_chunk
from dashboard.repositories.lifecycle import submit_repository
from tests.conftest import run_syncs_only, run_workers
from tests.support.gitrepo import GitRepo
from tests.support.lease_thief import steal_when_held
from tests.support.lock_timing import LEASE_TTL, LOST_LEASE_WORK
from tests.support.processes import ROOT, end_tree, worker_env
from tests.support.sockets import make_user
from workers.analysis.analyzer import queue_name
from workers.analysis.history import stream_commits
from workers.git.workspace import mirror_path
from workers.locks import keys
from workers.runtime.redis_server import RedisNode

#: Every master here answers (those killed refuse at once): the healthy masters'
#: node timeout, not 50 ms a loaded machine can exceed (tests/support/lock_timing.py).
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("healthy_masters")]


@pytest.fixture(autouse=True)
def _clean_counters() -> None:
    counters.discard()  # increments of earlier tests, not yet flushed


class Scrape:
    """The parsed exposition: every sample by name and labels."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.samples: list[tuple[str, dict[str, str], float]] = []
        self.families: dict[str, str] = {}
        for family in text_string_to_metric_families(text):
            self.families[family.name] = family.type
            for s in family.samples:
                self.samples.append((s.name, dict(s.labels), s.value))

    def total(self, name: str, **labels: str) -> float:
        """Sum of the samples of ``name`` whose labels include ``labels``."""
        return sum(
            v
            for n, lab, v in self.samples
            if n == name and all(lab.get(k) == want for k, want in labels.items())
        )

    def one(self, name: str, **labels: str) -> float:
        found = [
            v
            for n, lab, v in self.samples
            if n == name and all(lab.get(k) == want for k, want in labels.items())
        ]
        assert len(found) == 1, (name, labels, found)
        return found[0]


def scrape() -> Scrape:
    return Scrape(metrics_text())


def synced_chunk(git_repo: GitRepo) -> Chunk:
    """Submit and run only the sync job: one chunk planned and queued, nothing analysed."""
    repo, _ = submit_repository(url=str(git_repo.path))
    run_syncs_only()
    return Chunk.objects.get(repository=repo)


def make_repo(tmp_path: Path, name: str, commits: int = 3) -> GitRepo:
    repo = GitRepo.create(tmp_path / name)
    for i in range(commits):
        repo.commit(f"{name} {i}", {f"{name}.txt": f"{i}\n" * (i + 1)})
    return repo


def test_every_gauge_reports_what_is_there() -> None:
    repo = Repository.objects.create(url="https://example.com/t/x.git", status="ready")
    JobRun.objects.create(
        job_id="a", kind="sync", queue="sync", repository=repo, state="dead", cause_key="k1",
        cause="Boom: N @ jobs.py:_sync",
    )  # fmt: skip
    queues.queue(queues.SYNC_QUEUE).enqueue("workers.jobs.sync_repository", 1, 1, job_id="j")
    queues.set_paused(queues.MAINTENANCE_QUEUE, True)
    lock = leases.redlock().acquire([keys.mirror(repo.pk)], ttl=30.0, holder={"worker": "w"})
    lock.extend(ttl=30.0)  # what a holder's heartbeat does
    got = scrape()
    assert got.families["gitward_jobs_started"] == "counter"
    assert got.families["gitward_job_run_seconds"] == "histogram"
    assert got.one("gitward_queue_backlog", queue="sync") == 1
    assert got.one("gitward_queue_oldest_job_age_seconds", queue="sync") >= 0
    assert got.one("gitward_queue_paused", queue="maintenance") == 1
    assert got.one("gitward_queue_paused", queue="sync") == 0
    assert (
        got.one("gitward_runs", state="dead") == 1 and got.one("gitward_runs", state="queued") == 0
    )
    assert got.one("gitward_dead_letters", group="k1", cause="Boom: N @ jobs.py:_sync") == 1
    assert got.one("gitward_repositories", status="ready") == 1
    assert got.one("gitward_redis_masters_up") == 3 and got.one("gitward_redis_masters") == 3
    assert got.one("gitward_lock_quorum_state", state="ok") == 1
    assert got.one("gitward_locks_held") == 1
    # This process's own lock figures are flushed before the scrape.
    assert got.one("gitward_lock_acquired_total") == 1
    assert got.one("gitward_lock_acquire_seconds_count") == 1
    assert got.one("gitward_lock_extensions_total") == 1
    assert got.total("gitward_lock_master_calls_total") >= 3


def test_results_lagging_a_push_webhook_are_gauged_per_repository() -> None:
    now = timezone.now()
    hour = timedelta(hours=1)
    fresh = Repository.objects.create(url="https://example.com/t/fresh.git", status="ready",
                                      analyzed_at=now, pushed_at=now - hour)  # fmt: skip
    behind = Repository.objects.create(url="https://example.com/t/behind.git", status="ready",
                                       analyzed_at=now - 2*hour, pushed_at=now - hour)  # fmt: skip
    syncing = Repository.objects.create(url="https://example.com/t/busy.git", status="syncing",
                                        analyzed_at=now, pushed_at=now - 3 * hour)  # fmt: skip
    Repository.objects.create(url="https://example.com/t/nohook.git", status="ready")
    got = scrape()
    assert got.one("gitward_repositories_lagging") == 2
    assert got.one("gitward_results_lag_max_seconds") >= 3 * 3600
    assert got.one("gitward_repository_results_lag_seconds", repo=str(syncing.pk),
                   repo_name="busy") >= 3 * 3600  # fmt: skip
    assert got.one("gitward_repository_results_lag_seconds", repo=str(behind.pk),
                   repo_name="behind") >= 3600  # fmt: skip
    lagging = {
        lab["repo"] for n, lab, _ in got.samples if n == "gitward_repository_results_lag_seconds"
    }
    assert lagging == {str(syncing.pk), str(behind.pk)} and str(fresh.pk) not in lagging


def test_the_oldest_job_age_grows_with_the_head_of_the_queue() -> None:
    q = queues.queue(queues.SYNC_QUEUE)
    q.enqueue("workers.jobs.sync_repository", 1, 1, job_id="old")
    first = scrape().one("gitward_queue_oldest_job_age_seconds", queue="sync")
    deadline = time.monotonic() + 10
    while scrape().one("gitward_queue_oldest_job_age_seconds", queue="sync") <= first:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert scrape().one("gitward_queue_oldest_job_age_seconds", queue="maintenance") == 0


def test_counters_and_histograms_move_across_a_real_run(git_repo: GitRepo) -> None:
    submit_repository(url=str(git_repo.path))
    run_workers()
    assert Repository.objects.get().status == Repository.Status.READY  # one sync, one chunk
    got = scrape()
    run = JobRun.objects.get(kind="analyze")
    version = counters.version_label(run.version)
    for queue in ("sync", run.queue):
        labels = {"queue": queue, "version": version}
        assert got.one("gitward_jobs_started_total", **labels) == 1
        assert got.one("gitward_jobs_succeeded_total", **labels) == 1
        assert got.total("gitward_jobs_failed_total", **labels) == 0
        assert got.one("gitward_job_run_seconds_count", **labels) == 1
        assert got.one("gitward_job_wait_seconds_count", **labels) == 1
        assert got.one("gitward_job_run_seconds_bucket", le="+Inf", **labels) == 1
        assert 0 < got.one("gitward_job_run_seconds_sum", **labels) < 300
    # Only the sync was put on a queue: its work horse analysed the one chunk itself.
    assert got.total("gitward_jobs_enqueued_total") == 1
    # The mirror lock (sync) and the chunk lock (analyze), each taken once and released.
    assert got.one("gitward_lock_acquired_total") == 2
    assert got.one("gitward_lock_releases_total") == 2
    assert got.one("gitward_lock_acquire_seconds_count") == 2
    assert got.one("gitward_lock_refusals_total") == 0
    masters = {lab["master"] for n, lab, _ in got.samples if n == "gitward_lock_master_calls_total"}
    assert len(masters) == 3
    for master in masters:  # latency: seconds spent per master, over its calls
        assert got.one("gitward_lock_master_seconds_total", master=master) > 0
    # The gauges of the version's queue carry the counters' labels: they join in PromQL.
    labels = {"queue": run.queue, "version": version}
    assert got.one("gitward_queue_backlog", **labels) == 0
    assert got.one("gitward_queue_oldest_job_age_seconds", **labels) == 0
    assert got.one("gitward_queue_backlog", queue="sync", version="") == 0


def test_a_master_down_is_counted_as_its_errors_and_puts_the_quorum_at_risk(
    redis_nodes: list[RedisNode],
) -> None:
    down = redis_nodes[2]  # not the first: that one is the queue server here
    down.kill()
    try:
        lock = leases.redlock().acquire([keys.mirror(1)], ttl=30.0, holder={"worker": "w"})
        lock.release()
        got = scrape()
    finally:
        down.restart()
        queues.CIRCUIT.reset()
    master = f"127.0.0.1:{down.port}"
    assert got.one("gitward_lock_master_errors_total", master=master) >= 1
    others = {lab["master"] for n, lab, _ in got.samples if n == "gitward_lock_master_calls_total"}
    assert master in others and len(others) == 3
    for m in others - {master}:
        assert got.total("gitward_lock_master_errors_total", master=m) == 0
    assert got.one("gitward_redis_masters_up") == 2
    assert got.one("gitward_lock_quorum_state", state="at_risk") == 1
    assert got.one("gitward_lock_quorum_state", state="ok") == 0
    assert got.one("gitward_redis_master_up", master=down.url) == 0


def test_workers_and_the_rollout_are_reported_per_version() -> None:
    now = timezone.now()
    old = AnalyzerVersion.objects.create(
        fingerprint="a" * 64, code_version="1", state="current", verified_at=now
    )
    new = AnalyzerVersion.objects.create(
        fingerprint="b" * 64, code_version="2", state="ramping", ramp_percent=25, verified_at=now
    )
    warming = AnalyzerVersion.objects.create(
        fingerprint="c" * 64, code_version="3", state="warming"
    )
    Rollout.objects.create(version=new, previous=old, state="active", started_by="op")
    repo = Repository.objects.create(url="https://example.com/t/w.git")
    run = JobRun.objects.create(job_id="busy", kind="analyze", queue="analysis", repository=repo)
    gone = now - timedelta(seconds=settings.WORKER_DEAD_AFTER + 60)
    for name, fp, seen, current in [("w1", old, now, run), ("w2", old, now, None),
                                    ("w3", new, now, None), ("w4", new, gone, None)]:  # fmt: skip
        WorkerBeat.objects.create(name=name, host="h", pid=1, version=fp.fingerprint,
                                  last_seen=seen, current_run=current)  # fmt: skip
    got = scrape()
    a, b, c = "a" * 12, "b" * 12, "c" * 12
    assert got.one("gitward_workers", version=a, state="busy") == 1
    assert got.one("gitward_workers", version=a, state="idle") == 1
    assert got.one("gitward_workers", version=b, state="idle") == 1
    assert got.one("gitward_workers", version=b, state="dead") == 1
    assert got.one("gitward_analyzer_version_state", version=a, state="current") == 1
    assert got.one("gitward_analyzer_version_state", version=b, state="ramping") == 1
    assert got.one("gitward_analyzer_version_ramp_percent", version=b) == 25
    assert got.one("gitward_analyzer_version_gate_open", version=b) == 1
    assert got.one("gitward_analyzer_version_gate_open", version=c) == 0
    assert got.one("gitward_rollout_active", version=b, state="active") == 1
    # Each version's analysis queue is reported under the same version label.
    for fp, label in ((old, a), (new, b), (warming, c)):
        assert (
            got.one("gitward_queue_backlog", queue=queue_name(fp.fingerprint), version=label) == 0
        )


def test_a_lock_refused_under_contention_is_counted(git_repo: GitRepo, settings) -> None:
    chunk = synced_chunk(git_repo)
    before = scrape()
    other = leases.redlock().acquire([chunk.lock_key()], ttl=30.0, holder={"worker": "other"})
    run_workers()  # the analyze attempt finds the lock held and is deferred
    got = scrape()
    other.release()
    run = JobRun.objects.get(kind="analyze")
    assert run.state == JobRun.State.QUEUED
    attempts = settings.LOCK_RETRY_COUNT + 1
    refusals = got.one("gitward_lock_refusals_total") - before.one("gitward_lock_refusals_total")
    # Every attempt was refused by at least two masters (a quorum became impossible; a
    # third vote may arrive after the round was decided, and is then not counted).
    assert attempts * 2 <= refusals <= attempts * 3
    assert got.one("gitward_lock_acquire_failures_total") == 1
    assert got.one("gitward_jobs_deferred_total", queue=run.queue) == 1
    assert got.total("gitward_jobs_failed_total") == 0


def test_a_lost_lock_is_counted(
    redis_nodes: list[RedisNode], git_repo: GitRepo, settings, monkeypatch, tmp_path: Path
) -> None:
    chunk = synced_chunk(git_repo)
    key = chunk.lock_key()
    settings.LOCK_TTL = LEASE_TTL  # heartbeat every TTL/3 (1 s)
    monkeypatch.setenv("GITWARD_FAILPOINTS", f"analyze.locked=sleep:{LOST_LEASE_WORK:g}")
    monkeypatch.setenv("GITWARD_FAILPOINTS_ONCE", str(tmp_path))

    thief = steal_when_held(key, redis_nodes, timeout=10)
    run_workers()  # attempt 1 loses its lease and aborts; attempt 2 succeeds
    thief.join()
    got = scrape()
    run = JobRun.objects.get(kind="analyze")
    assert run.state == JobRun.State.SUCCEEDED
    assert got.one("gitward_lock_lost_total") == 1
    assert got.one("gitward_lock_extension_failures_total") >= 1
    labels = {"queue": run.queue}
    assert got.total("gitward_jobs_failed_total", **labels) == 1
    assert got.total("gitward_jobs_retries_total", **labels) == 1
    assert got.total("gitward_jobs_succeeded_total", **labels) == 1


def test_a_fencing_rejection_is_counted(git_repo: GitRepo, settings) -> None:
    chunk = synced_chunk(git_repo)
    key = chunk.lock_key()
    stale = leases.redlock().acquire([key], ttl=30.0, holder={"worker": "A"})
    next_token(key)  # a newer holder exists (e.g. after a forced release)
    path = mirror_path(Path(settings.WORKSPACE), chunk.repository_id)
    records = list(stream_commits(path, chunk.sha_list()))
    assert scrape().total("gitward_fencing_rejections_total") == 0
    with pytest.raises(StaleToken):
        write_chunk(chunk=chunk, records=records, token=stale.token)
    assert scrape().one("gitward_fencing_rejections_total", lock="chunk") == 1
    stale.release()


def test_a_dead_letter_is_counted_by_group(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("GITWARD_FAILPOINTS", "analyze.parsing#poison=raise")
    submit_repository(url=str(make_repo(tmp_path, "poison").path))
    run_workers()
    run = JobRun.objects.get(kind="analyze")
    assert run.state == JobRun.State.DEAD
    got = scrape()
    labels = {"queue": run.queue}
    assert got.total("gitward_jobs_started_total", **labels) == 3
    assert got.total("gitward_jobs_failed_total", **labels) == 3
    assert got.total("gitward_jobs_retries_total", **labels) == 2
    assert got.total("gitward_jobs_dead_total", **labels) == 1
    assert got.total("gitward_job_run_seconds_count", **labels) == 3
    assert got.one("gitward_dead_letters", group=run.cause_key) == 1


@pytest.mark.slow
def test_two_worker_processes_and_a_killed_work_horse_add_up(tmp_path: Path, settings) -> None:
    """Two forking ``manage.py worker --burst`` processes drain four repositories; one
    work horse SIGKILLs itself mid-analysis. Every attempt of every process is counted
    once: started = succeeded + failed, the crash is one failure, nothing is lost."""
    names = ["r0", "r1", "r2", "r3"]
    for name in names:
        submit_repository(url=str(make_repo(tmp_path, name).path))
    once = tmp_path / "once"
    once.mkdir()
    env = worker_env(settings, tmp_path, GITWARD_FAILPOINTS="analyze.parsing#r2=kill",
                     GITWARD_FAILPOINTS_ONCE=str(once))  # fmt: skip
    cmd = [sys.executable, str(ROOT / "manage.py"), "worker", "--burst"]
    procs = [subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        for p in procs:
            _, err = p.communicate(timeout=300)
            assert p.returncode == 0, err[-2000:]
    finally:
        for p in procs:  # one failed or timed out: the other is not left draining
            end_tree(p)
    # A crash found by a worker that exited before retrying leaves the retry queued.
    run_workers()
    assert set(JobRun.objects.values_list("state", flat=True)) == {"succeeded"}
    got = scrape()
    started = got.total("gitward_jobs_started_total")
    succeeded = got.total("gitward_jobs_succeeded_total")
    failed = got.total("gitward_jobs_failed_total")
    assert succeeded == 8  # four syncs, four chunks
    assert got.total("gitward_jobs_crashed_total") == 1 and failed == 1
    assert started == succeeded + failed == 9
    assert got.total("gitward_job_run_seconds_count") == 9
    assert got.total("gitward_job_wait_seconds_count") == 9
    # Every lock acquired by the horses of both processes (and the retry) was counted.
    assert got.one("gitward_lock_acquired_total") >= 8


def test_scrapes_need_an_operator_token_or_the_configured_network(settings) -> None:
    anonymous = Client(REMOTE_ADDR="10.1.2.3")
    assert anonymous.get("/metrics").status_code == 401
    settings.METRICS_NETWORKS = ["10.0.0.0/8"]
    res = anonymous.get("/metrics")
    assert res.status_code == 200 and b"gitward_jobs_started_total" in res.content
    assert Client(REMOTE_ADDR="192.168.1.1").get("/metrics").status_code == 401
    _, raw = ApiToken.issue(make_user("prom", perms=("view_jobrun",)))
    res = Client(REMOTE_ADDR="192.168.1.1").get("/metrics", HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert res.status_code == 200


def test_the_freeze_and_the_webhook_outbox_are_exported() -> None:
    """docs/rollouts.md#freeze-windows, docs/rollouts.md#notifications."""
    from django.test import override_settings

    from dashboard.rollouts import freeze
    from dashboard.versions.state_machine import ensure_baseline, record_event

    got = scrape()
    assert got.one("gitward_rollout_frozen") == 0
    assert got.total("gitward_rollout_notifications_pending") == 0
    hooks = [
        {"name": n, "url": "http://127.0.0.1:9/", "secret": "x" * 16, "format": "json"}
        for n in ("ops", "chat")
    ]
    with override_settings(ROLLOUT_WEBHOOKS=hooks):
        base = ensure_baseline(actor="setup")
        ro = Rollout.objects.create(queue="analysis", version=base, started_by="t", steps=[100])
        record_event(ro, base, "rollout", "", "pending", "t", "", None)
        record_event(ro, base, "verdict", "", "", "t", "passed", None)
        record_event(ro, base, "note", "", "", "t", "not announced", None)
        freeze.set_stop_the_line(on=True, actor="t", reason="incident")
        got = scrape()
    assert got.one("gitward_rollout_frozen", window="stop-the-line") == 1
    assert got.one("gitward_rollout_notifications_pending", endpoint="ops") == 2
    assert got.one("gitward_rollout_notifications_pending", endpoint="chat") == 2


def test_per_git_host_fetch_slots_waiters_backoffs_and_deferrals_are_exported(
    settings: object,
) -> None:
    """docs/scheduling.md#per-host-fetch-limits, as /metrics shows it."""
    from dashboard.runs.fetch_limits import fetch_gate
    from workers.git import HostLimit, back_off

    settings.FETCH_LIMITS = {"github.com": HostLimit(concurrency=3)}  # type: ignore[attr-defined]
    back_off(queues.connection(), "gitlab.com", 60)
    counters.count_fetch_host_deferral("github.com", why="limit")
    with fetch_gate().slot("github.com"):
        families = {f.name: f for f in text_string_to_metric_families(metrics_text())}
    samples = {
        (s.name, s.labels.get("host"), s.labels.get("why")): s.value
        for name in (
            "gitward_fetch_host_slots_in_use",
            "gitward_fetch_host_slots_limit",
            "gitward_fetch_host_waiting",
            "gitward_fetch_host_backoff_seconds",
            "gitward_fetch_host_deferrals",
        )
        for s in families[name].samples
    }
    assert samples[("gitward_fetch_host_slots_in_use", "github.com", None)] == 1
    assert samples[("gitward_fetch_host_slots_limit", "github.com", None)] == 3
    assert samples[("gitward_fetch_host_waiting", "github.com", None)] == 0
    assert samples[("gitward_fetch_host_backoff_seconds", "github.com", None)] == 0
    assert samples[("gitward_fetch_host_slots_in_use", "gitlab.com", None)] == 0
    assert 50 < samples[("gitward_fetch_host_backoff_seconds", "gitlab.com", None)] <= 60
    assert samples[("gitward_fetch_host_deferrals_total", "github.com", "limit")] == 1
