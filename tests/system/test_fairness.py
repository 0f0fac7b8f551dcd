"""Fair scheduling end to end (docs/scheduling.md), with real RQ workers, real Redis and
real git repositories: small repositories submitted after a large history finish before
its backlog does (and, as a control, not without fairness); an interactive submission
queued after a scheduled refresh runs first; a work horse SIGKILLed between claiming a
chunk and releasing the next one wedges nothing; the reserved interactive slot takes a
small submission past a large backlog, also while every regular worker is held on a long
chunk. Order is read from the attempts' ids (claim order) and the runs' states, never from
the clock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from dashboard.infra.queues import express_running
from dashboard.models import Commit, JobAttempt, JobRun, Repository
from dashboard.operations.reconciler import reconcile
from dashboard.repositories.lifecycle import submit_repository
from dashboard.repositories.refresh_schedule import refresh_due
from tests.conftest import run_syncs_only, run_workers
from tests.support.gitrepo import GitRepo
from tests.support.processes import ROOT, ended, proc_state, run_burst_worker, worker_env

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def make_repo(tmp_path: Path, name: str, commits: int) -> GitRepo:
    repo = GitRepo.create(tmp_path / name)
    add_commits(repo, name, 0, commits)
    return repo


def add_commits(repo: GitRepo, name: str, start: int, n: int) -> None:
    for i in range(start, start + n):
        repo.commit(f"{name} {i}", {f"f{i % 3}.txt": f"{name} {i}\n"})


def claims(repo: Repository, kind: str = JobRun.Kind.ANALYZE) -> list[int]:
    """Attempt ids (claim order) of the repository's runs of ``kind``."""
    return sorted(
        JobAttempt.objects.filter(run__repository=repo, run__kind=kind).values_list("pk", flat=True)
    )


def submit_large_then_small(tmp_path: Path) -> tuple[Repository, list[Repository]]:
    large = submit_repository(url=str(make_repo(tmp_path, "large", 48).path))[0]
    smalls = [
        submit_repository(url=str(make_repo(tmp_path, f"small{i}", 4).path))[0] for i in range(4)
    ]
    return large, smalls


def assert_complete(repo: Repository, commits: int) -> None:
    repo.refresh_from_db()
    assert repo.status == Repository.Status.READY, (repo.name, repo.error)
    stored = Commit.objects.filter(repository=repo)
    assert stored.count() == commits and stored.values("sha").distinct().count() == commits


@pytest.fixture
def small_chunks(settings) -> None:
    settings.CHUNK_SIZE = 2
    settings.CHUNK_MAX = 2


def test_small_repositories_finish_before_a_large_backlog_does(
    tmp_path: Path, settings, small_chunks
) -> None:
    settings.FAIR_WEIGHT = 1
    large, smalls = submit_large_then_small(tmp_path)
    run_workers()
    assert_complete(large, 48)
    for small in smalls:
        assert_complete(small, 4)
    large_claims = claims(large)
    assert len(large_claims) >= 12  # a backlog: many chunks
    last_small = max(claims(small)[-1] for small in smalls)
    # Every small repository's last chunk was claimed while most of the large one's
    # chunks still waited: round-robin lets each small one in after at most one large
    # chunk per small repository ahead of it.
    large_before = sum(1 for pk in large_claims if pk < last_small)
    assert large_before <= 1 + len(smalls), (large_before, len(large_claims))
    assert not JobRun.objects.filter(parked=True).exists()


def test_without_fairness_the_same_fleet_waits_for_the_whole_backlog(
    tmp_path: Path, settings, small_chunks
) -> None:
    """The control of the test above: with ``GITWARD_FAIR_WEIGHT=0`` (plain FIFO) the small
    repositories' chunks run after every chunk of the large one, so that test's
    assertion would fail here."""
    settings.FAIR_WEIGHT = 0
    large, smalls = submit_large_then_small(tmp_path)
    run_workers()
    large_claims = claims(large)
    inline_smalls = {claims(small)[0] for small in smalls}  # run by their syncs' horses
    rest = [pk for small in smalls for pk in claims(small) if pk not in inline_smalls]
    assert rest, "the small repositories have chunks of their own in the queue"
    assert min(rest) > large_claims[-1]


def test_an_interactive_submission_runs_before_a_scheduled_refresh_queued_first(
    tmp_path: Path, settings, small_chunks
) -> None:
    settings.FAIR_WEIGHT = 1
    settings.REFRESH_INTERVAL = 3600.0
    origin = make_repo(tmp_path, "scheduled", 2)
    scheduled = submit_repository(url=str(origin.path))[0]
    run_workers()
    add_commits(origin, "scheduled", 2, 12)
    Repository.objects.filter(pk=scheduled.pk).update(
        next_refresh_at=timezone.now() - timedelta(seconds=1), refresh_interval=3600.0
    )
    assert refresh_due()["refreshed"] == 1  # the scheduler's round queues its sync first
    scheduled.refresh_from_db()
    assert scheduled.priority == 1
    clicked = submit_repository(url=str(make_repo(tmp_path, "clicked", 12).path))[0]
    run_workers()
    assert_complete(scheduled, 14)
    assert_complete(clicked, 12)
    assert claims(clicked, JobRun.Kind.SYNC)[-1] < claims(scheduled, JobRun.Kind.SYNC)[-1]
    # The refresh's chunks: the first is analysed by its sync's horse right after the
    # sync; each one after it waited in the queue behind every interactive chunk.
    queued_refresh = [
        pk for pk in claims(scheduled) if pk > claims(scheduled, JobRun.Kind.SYNC)[-1]
    ][1:]
    assert len(queued_refresh) >= 3
    assert claims(clicked)[-1] < min(queued_refresh)


def test_a_horse_killed_between_its_claim_and_its_release_wedges_nothing(
    tmp_path: Path, settings
) -> None:
    """SIGKILL at ``dispatch.release`` (the claim committed, the next parked run not
    released yet), once, in a forking worker: the attempt is recorded as crashed and
    retried, the repository's parked runs are released (by the retry's claim or the
    reconciler's round) and everything is stored exactly once."""
    settings.FAIR_WEIGHT = 1
    large = submit_repository(url=str(make_repo(tmp_path, "large", 16).path))[0]
    small = submit_repository(url=str(make_repo(tmp_path, "small", 4).path))[0]
    once = tmp_path / "once"
    once.mkdir()
    env = worker_env(settings, tmp_path, GITWARD_FAILPOINTS="dispatch.release#large=kill",
                     GITWARD_FAILPOINTS_ONCE=str(once), GITWARD_CHUNK_SIZE="2",
                     GITWARD_CHUNK_MAX="2", GITWARD_FAIR_WEIGHT="1")  # fmt: skip
    for _ in range(3):  # a release the crash lost is the reconciler's
        result = run_burst_worker(env, timeout=300)
        assert result.returncode == 0, result.stderr[-2000:]
        if not JobRun.objects.filter(state__in=["queued", "failed", "running"]).exists():
            break
        reconcile()
    assert [p.name for p in once.iterdir()] == ["dispatch.release#large"]
    crashed = JobAttempt.objects.filter(outcome="crashed")
    assert crashed.count() == 1 and crashed.get().run.repository_id == large.pk
    assert_complete(large, 16)
    assert_complete(small, 4)
    assert not JobRun.objects.filter(parked=True).exists()


def express_env(settings, tmp_path: Path, **extra: str) -> dict[str, str]:
    settings.CHUNK_SIZE = settings.CHUNK_MAX = 2
    settings.INTERACTIVE_MAX_COMMITS = 10
    return worker_env(settings, tmp_path, GITWARD_CHUNK_SIZE="2", GITWARD_CHUNK_MAX="2",
                      GITWARD_INTERACTIVE_MAX_COMMITS="10",
                      GITWARD_FAIR_WEIGHT=str(settings.FAIR_WEIGHT), **extra)  # fmt: skip


def test_the_reserved_slot_takes_a_small_submission_past_a_large_backlog_and_nothing_else(
    tmp_path: Path, settings
) -> None:
    """docs/scheduling.md#the-reserved-interactive-slot: with the large history's
    interactive chunks all in the queue ahead (FIFO, weight 0), a worker of the reserved
    slot (``worker --express``) runs the small submission's sync and its queued second
    chunk, and not one of the large chunks (a regular worker would take those first)."""
    settings.FAIR_WEIGHT = 0
    env = express_env(settings, tmp_path)
    large = submit_repository(url=str(make_repo(tmp_path, "large", 48).path))[0]
    run_syncs_only()  # its chunks all queued, none analysed
    large_runs = JobRun.objects.filter(repository=large, kind=JobRun.Kind.ANALYZE)
    backlog = large_runs.filter(state=JobRun.State.QUEUED).count()
    assert backlog >= 12 and backlog == large_runs.count()
    small = submit_repository(url=str(make_repo(tmp_path, "small", 4).path))[0]
    result = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "worker", "--workers", "1", "--burst",
         "--express"], env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert_complete(small, 4)
    assert len(claims(small)) >= 2  # the inline chunk and those it queued behind the backlog
    assert large_runs.filter(state=JobRun.State.QUEUED).count() == backlog
    assert not JobAttempt.objects.filter(run__in=large_runs).exists()


def wait_for(what: str, check, timeout: float = 240.0) -> None:  # type: ignore[no-untyped-def]
    """Poll ``check`` until true; the timeout only keeps a broken run from hanging."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.3)


def test_with_every_regular_worker_held_on_a_long_chunk_a_submission_runs_in_the_reserved_slot(
    tmp_path: Path, settings
) -> None:
    """A pool of 2 regular workers and 1 reserved slot (``GITWARD_INTERACTIVE_WORKERS``).
    Both regular workers take a chunk of the large history and are held inside it
    (SIGSTOP at ``analyze.locked`` for that repository: a chunk that never ends). A small
    history submitted then is analysed to ready by the reserved slot while both large
    chunks are still running; without the slot it would wait for one of them."""
    settings.FAIR_WEIGHT = 2
    settings.INTERACTIVE_WORKERS = 1  # off in the test harness (tests/conftest.py)
    # The slot looks at its queues when it starts and then only when an express job is
    # enqueued (an hour between looks otherwise): the small history is ready only if its
    # enqueues wake it (docs/scheduling.md#the-reserved-interactive-slot).
    env = express_env(settings, tmp_path, GITWARD_FAILPOINTS="analyze.locked#large=stop",
                      GITWARD_WORKER_GRACE="1", GITWARD_EXPRESS_POLL="3600")  # fmt: skip
    large = submit_repository(url=str(make_repo(tmp_path, "large", 48).path))[0]
    run_syncs_only()
    large_runs = JobRun.objects.filter(repository=large, kind=JobRun.Kind.ANALYZE)
    pool = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "worker", "--workers", "2"], env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    with ended(pool):
        wait_for("both regular workers on a large chunk",
                 lambda: large_runs.filter(state=JobRun.State.RUNNING).count() == 2)  # fmt: skip
        held = set(large_runs.filter(state=JobRun.State.RUNNING).values_list("pk", flat=True))
        small = submit_repository(url=str(make_repo(tmp_path, "small", 4).path))[0]
        wait_for("the small history ready", lambda: Repository.objects.get(
            pk=small.pk).status == Repository.Status.READY)  # fmt: skip
        still = set(large_runs.filter(state=JobRun.State.RUNNING).values_list("pk", flat=True))
        assert still == held  # the regular workers never let go of their chunks
        assert not large_runs.filter(state=JobRun.State.SUCCEEDED).exists()
        assert_complete(small, 4)
        workers = set(JobAttempt.objects.filter(run__repository=small).values_list(
            "worker", flat=True))  # fmt: skip
        held_by = set(JobAttempt.objects.filter(run__in=held).values_list("worker", flat=True))
        assert len(workers) == 1 and not workers & held_by  # one worker, neither regular one
        # The held horses run large (not express) chunks: they lowered their own CPU
        # priority by GITWARD_BULK_NICE; the pool (and so the slot's horse) did not.
        base = os.getpriority(os.PRIO_PROCESS, pool.pid)
        pids = list(JobAttempt.objects.filter(run__in=held).values_list("pid", flat=True))
        assert len(pids) == 2 and all(pids)
        assert [os.getpriority(os.PRIO_PROCESS, pid) for pid in pids] == [
            min(19, base + settings.BULK_NICE)] * 2  # fmt: skip


def stopped(pid: int | None) -> bool:
    return bool(pid) and proc_state(int(pid)) == "T"  # type: ignore[arg-type]


def test_a_bulk_chunk_holds_its_write_back_while_an_express_job_runs(
    tmp_path: Path, settings
) -> None:
    """docs/scheduling.md#bulk-writes-yield-to-express-work: a small submission's sync runs on
    the reserved slot and is held inside its job (SIGSTOP after its fetch). A regular
    worker then analyses a chunk of the large history: before its write transaction it
    finds the express job running and yields (held there by ``analyze.yielding``, which
    only a yielding write reaches), with none of the large history's commits written.
    Without the yield it would write beside the small job (the failpoint never fires).
    Both histories are complete once let go."""
    env = express_env(
        settings, tmp_path, GITWARD_WORKER_GRACE="1", GITWARD_BULK_WRITE_YIELD="600",
        GITWARD_FAILPOINTS="sync.fetched#small=stop,analyze.yielding#large=stop",
    )  # fmt: skip
    large = submit_repository(url=str(make_repo(tmp_path, "large", 48).path))[0]
    run_syncs_only()
    large_runs = JobRun.objects.filter(repository=large, kind=JobRun.Kind.ANALYZE)
    small = submit_repository(url=str(make_repo(tmp_path, "small", 4).path))[0]
    small_sync = JobRun.objects.filter(repository=small, kind=JobRun.Kind.SYNC)
    worker = [sys.executable, str(ROOT / "manage.py"), "worker", "--workers", "1"]
    slot = subprocess.Popen([*worker, "--express"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    with ended(slot):
        wait_for("the small sync held on the slot",
                 lambda: stopped(small_sync.values_list("pid", flat=True).first()))  # fmt: skip
        assert not large_runs.exclude(state=JobRun.State.QUEUED).exists()  # the slot took none
        regular = subprocess.Popen(worker, env=env, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        with ended(regular):
            running = large_runs.filter(state=JobRun.State.RUNNING)

            def yielding() -> bool:
                return any(stopped(pid) for pid in running.values_list("pid", flat=True))

            def written() -> bool:  # what a chunk that does not yield gets to
                return Commit.objects.filter(repository=large).exists()

            wait_for("a large chunk yielding its write", lambda: yielding() or written())
            assert yielding() and not written()
            assert stopped(small_sync.values_list("pid", flat=True).first())  # still inside
            small_pid = int(small_sync.values_list("pid", flat=True).get())
            large_pid = int(next(p for p in running.values_list("pid", flat=True) if stopped(p)))
            os.kill(small_pid, signal.SIGCONT)
            wait_for("the small history ready", lambda: Repository.objects.get(
                pk=small.pk).status == Repository.Status.READY)  # fmt: skip
            os.kill(large_pid, signal.SIGCONT)
            wait_for("the large history ready", lambda: Repository.objects.get(
                pk=large.pk).status == Repository.Status.READY)  # fmt: skip
    assert_complete(small, 4)
    assert_complete(large, 48)


def test_a_large_submissions_sync_stops_counting_as_express_before_its_inline_chunk(
    tmp_path: Path, settings
) -> None:
    """docs/scheduling.md#bulk-writes-yield-to-express-work: a new submission's sync is express
    (its size unknown when it was enqueued). Held at ``sync.inline`` (SIGSTOP, right
    before it analyses its first chunk inline), it still counts as an express job running
    when it listed a small history (4 commits), and no longer when it listed a large one
    (48, over ``GITWARD_INTERACTIVE_MAX_COMMITS``): that chunk is bulk work, and the
    other workers' chunks of the backfill must not hold their writes back for it."""
    env = express_env(
        settings, tmp_path, GITWARD_FAILPOINTS="sync.inline#small=stop,sync.inline#large=stop"
    )
    repos = {
        name: submit_repository(url=str(make_repo(tmp_path, name, n).path))[0]
        for name, n in (("small", 4), ("large", 48))
    }
    expected = {"small": 1, "large": 0}
    worker = [sys.executable, str(ROOT / "manage.py"), "worker", "--workers", "1"]
    proc = subprocess.Popen(worker, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    with ended(proc):
        while expected:  # one worker: the two syncs run one after the other, in either order

            def held() -> str | None:
                for name in expected:
                    pid = JobRun.objects.filter(repository=repos[name], kind=JobRun.Kind.SYNC
                                                ).values_list("pid", flat=True).first()  # fmt: skip
                    if stopped(pid):
                        return name
                return None

            wait_for("a sync held before its inline chunk", lambda: held() is not None)
            name = held()
            assert name is not None
            assert express_running() == expected.pop(name), name
            pid = JobRun.objects.filter(repository=repos[name], kind=JobRun.Kind.SYNC
                                        ).values_list("pid", flat=True).get()  # fmt: skip
            os.kill(int(pid), signal.SIGCONT)
        wait_for("both histories ready", lambda: all(
            r.status == Repository.Status.READY
            for r in Repository.objects.filter(pk__in=[r.pk for r in repos.values()])))  # fmt: skip
    assert_complete(repos["small"], 4)
    assert_complete(repos["large"], 48)
