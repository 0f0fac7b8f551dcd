"""Jobs under the lock, with real faults: a master restarted empty, a lost lease detected
by the heartbeat, and a worker process frozen (SIGSTOP) past its TTL. In every case the
stale holder writes nothing and the chunk is still stored exactly once in the end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dashboard.locks import leases
from dashboard.locks.fencing import StaleToken
from dashboard.models import Chunk, Commit, JobAttempt, JobRun, Repository
from dashboard.repositories.commits import write_chunk
from dashboard.repositories.lifecycle import submit_repository
from tests.conftest import run_syncs_only, run_workers
from tests.support.gitrepo import GitRepo
from tests.support.lease_thief import steal_when_held
from tests.support.lock_timing import HEALTHY_NODE_TIMEOUT, LEASE_TTL, LOST_LEASE_WORK
from tests.support.processes import children, end_tree, proc_state, worker_env
from workers.analysis.history import stream_commits
from workers.git.workspace import mirror_path
from workers.locks import LockLost
from workers.runtime.redis_server import RedisNode

ROOT = Path(__file__).resolve().parents[2]
#: Every master here answers (those killed refuse at once): the healthy masters'
#: node timeout, not 50 ms a loaded machine can exceed (tests/support/lock_timing.py).
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("healthy_masters")]


def synced_chunk(git_repo: GitRepo) -> Chunk:
    """Submit and run only the sync job: one chunk planned and queued, nothing analysed."""

    repo, _ = submit_repository(url=str(git_repo.path))
    run_syncs_only()
    repo.refresh_from_db()
    assert repo.status == Repository.Status.ANALYZING
    return Chunk.objects.get(repository=repo)


def test_a_master_restarted_empty_lets_a_second_holder_in_and_fencing_stops_the_first(
    redis_nodes: list[RedisNode], git_repo: GitRepo, settings
) -> None:
    chunk = synced_chunk(git_repo)
    rl = leases.redlock()
    key = chunk.lock_key()
    first = rl.acquire([key], ttl=30.0, holder={"worker": "A"})
    # Two of three masters crash and come back empty (no persistence): the known hole.
    redis_nodes[1].restart(empty=True)
    redis_nodes[2].restart(empty=True)
    second = rl.acquire([key], ttl=30.0, holder={"worker": "B"})
    assert second.token is not None and first.token is not None
    assert second.token > first.token
    path = mirror_path(Path(settings.WORKSPACE), chunk.repository_id)
    records = list(stream_commits(path, chunk.sha_list()))
    with pytest.raises(StaleToken):
        write_chunk(chunk=chunk, records=records, token=first.token)
    assert Commit.objects.count() == 0
    with pytest.raises(LockLost):
        first.extend(ttl=30.0)
    assert write_chunk(chunk=chunk, records=records, token=second.token) == 3
    second.release()


def test_a_lease_lost_mid_job_aborts_it_and_a_retry_finishes_the_chunk(
    redis_nodes: list[RedisNode], git_repo: GitRepo, settings, monkeypatch, tmp_path: Path
) -> None:
    chunk = synced_chunk(git_repo)
    key = chunk.lock_key()
    settings.LOCK_TTL = LEASE_TTL  # heartbeat every TTL/3 (1 s)
    monkeypatch.setenv("GITWARD_FAILPOINTS", f"analyze.locked=sleep:{LOST_LEASE_WORK:g}")
    monkeypatch.setenv("GITWARD_FAILPOINTS_ONCE", str(tmp_path))
    seen: dict[str, object] = {}

    # As soon as the job holds the lock, its key vanishes from every master (e.g. all
    # masters restarted). The job's heartbeat must notice and abort the job.
    thief = steal_when_held(key, redis_nodes, seen, timeout=10)
    run_workers()  # attempt 1 aborts; attempt 2 (no fault) runs in the same burst
    thief.join()
    assert seen, "the job never held the lock"
    run = JobRun.objects.get(kind="analyze")
    first, second = JobAttempt.objects.filter(run=run).order_by("number")
    assert first.outcome == "failed" and "LockLost" in first.error
    assert second.outcome == "succeeded"
    assert run.state == JobRun.State.SUCCEEDED and run.attempts == 2
    # Written once, by the second attempt, under a newer token than the first held.
    assert Commit.objects.count() == 3
    assert set(Commit.objects.values_list("token", flat=True)) == {run.token}
    assert run.token > seen["holder"]["token"]
    assert Repository.objects.get().status == Repository.Status.READY


@pytest.mark.slow
def test_a_worker_frozen_past_its_ttl_has_its_write_rejected(
    git_repo: GitRepo, settings, tmp_path: Path
) -> None:
    chunk = synced_chunk(git_repo)
    key = chunk.lock_key()
    env = worker_env(settings, tmp_path, GITWARD_LOCK_TTL=f"{LEASE_TTL:g}",
                      GITWARD_LOCK_NODE_TIMEOUT=f"{HEALTHY_NODE_TIMEOUT:g}",
                      GITWARD_FAILPOINTS="analyze.before_write=stop",
                      GITWARD_FAILPOINTS_ONCE=str(tmp_path))  # fmt: skip
    worker = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "worker", "--workers", "1"], env=env
    )
    try:
        # 1. The work horse (a forked child of the worker) freezes itself right before its
        #    write, holding the lock: SIGSTOP freezes its heartbeat thread too.
        deadline = time.monotonic() + 60
        horse = None
        while horse is None and time.monotonic() < deadline:
            horse = next((p for p in children(worker.pid) if proc_state(p) == "T"), None)
            time.sleep(0.05)
        assert horse, "the work horse never reached the failpoint"
        # 2. Its lease runs out; another holder takes the lock (newer fencing token).
        rl = leases.redlock()
        while rl.inspect(key) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        usurper = rl.acquire([key], ttl=30.0, holder={"worker": "usurper"})
        # 3. The horse wakes up and tries to write with its old token: rejected.
        os.kill(horse, signal.SIGCONT)
        while time.monotonic() < deadline:
            attempt = JobAttempt.objects.filter(run__kind="analyze", number=1).first()
            if attempt and "StaleToken" in attempt.error:
                break
            time.sleep(0.05)
        assert attempt and "StaleToken" in attempt.error
        assert Commit.objects.count() == 0
        usurper.release()
        # 4. The retry stores the chunk, once, with a token newer than the usurper's.
        while time.monotonic() < deadline:
            if Repository.objects.get().status == Repository.Status.READY:
                break
            time.sleep(0.1)
        tokens = set(Commit.objects.values_list("token", flat=True))
        assert Commit.objects.count() == 3 and len(tokens) == 1
        assert tokens.pop() > usurper.token
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            end_tree(worker)  # the worker, its (stopped) horse and anything below
