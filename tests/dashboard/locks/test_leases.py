"""dashboard.locks.leases: a job's lease as the live view and the Locks table see it, and
forced release, against three real Redis masters and the real database."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from django.db import connections, transaction
from django.utils import timezone

from dashboard.infra import queues
from dashboard.locks import leases
from dashboard.locks.fencing import StaleToken, check_token, next_token
from dashboard.models import AuditEntry, Chunk, Commit, Repository, WorkerBeat
from dashboard.repositories.commits import write_chunk
from dashboard.repositories.lifecycle import submit_repository
from tests.conftest import run_syncs_only
from tests.support.checked_threads import CheckedThread
from tests.support.gitrepo import GitRepo
from tests.support.live_tap import Tap
from tests.support.lock_timing import LEASE_TTL
from tests.support.processes import proc_state, worker_env
from workers.analysis.history import stream_commits
from workers.git.workspace import mirror_path
from workers.locks import LockLost, LockNotAcquired, keys

ROOT = Path(__file__).resolve().parents[3]
#: Every master here answers (those killed refuse at once): the healthy masters'
#: node timeout, not 50 ms a loaded machine can exceed (tests/support/lock_timing.py).
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("healthy_masters")]


def synced_chunk(git_repo: GitRepo) -> Chunk:
    """Submit and run only the sync: one chunk planned, its mirror fetched."""
    repo, _ = submit_repository(url=str(git_repo.path))
    run_syncs_only()
    return Chunk.objects.get(repository=repo)


def wait_for(condition, *, timeout: float = 30.0, what: str = "condition") -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_it_describes_every_kind_of_key_for_people() -> None:
    chunk_key = keys.chunk(7, "a1b2c3d4e5f6..0a1b2c3d4e5f")
    assert leases.describe_resource(chunk_key) == {
        "key": chunk_key,
        "repo": 7,
        "what": "commits a1b2c3d4..0a1b2c3d",
    }
    assert leases.describe_resource(keys.mirror(3))["what"] == "mirror"
    assert leases.describe_resource("locks:elsewhere") == {
        "key": "locks:elsewhere",
        "repo": None,
        "what": "locks:elsewhere",
    }


def test_a_held_lease_is_reported_acquired_extended_then_released(settings) -> None:
    settings.LOCK_TTL = LEASE_TTL  # heartbeat every TTL/3 (1 s)
    key = keys.mirror(5)
    holder = leases.job_holder(worker="w1", job="sync-5-g1", attempt=1, version="v")
    tap = Tap()
    acquired: list[int | None] = []
    with leases.hold_lease(
        key, holder=holder, on_lost=lambda: None, on_acquired=lambda lk: acquired.append(lk.token)
    ) as lock:
        assert acquired == [lock.token] and lock.token is not None
        tap.until(lambda evs: any(e["type"] == "lock.extended" for e in evs))
        wait_for(
            lambda: queues.connection().hget(leases.EXTENSIONS_HASH, key) is not None,
            what="the extension count",
        )
        assert int(queues.connection().hget(leases.EXTENSIONS_HASH, key)) >= 1
    tap.until(lambda evs: any(e["type"] == "lock.released" for e in evs))
    first = next(e for e in tap.events if e["type"] == "lock.acquired")
    assert first["key"] == key and first["repo"] == 5 and first["what"] == "mirror"
    assert first["worker"] == "w1" and first["job"] == "sync-5-g1"
    assert first["token"] == lock.token and first["pid"] == os.getpid()
    assert first["agreeing"] >= 2 and first["masters"] == 3
    # Released: the lock and its extension count are gone.
    assert queues.connection().hget(leases.EXTENSIONS_HASH, key) is None
    assert leases.redlock().inspect(key) is None


def test_a_lost_lease_runs_the_jobs_reaction_first_then_tells_the_live_view(
    redis_nodes, settings
) -> None:
    settings.LOCK_TTL = LEASE_TTL
    key = keys.mirror(6)
    killed = threading.Event()
    tap = Tap()
    holder = leases.job_holder(worker="w1", job="sync-6-g1", attempt=1, version="v")
    with (
        pytest.raises(LockLost),
        leases.hold_lease(key, holder=holder, on_lost=killed.set) as lock,
    ):
        for node in redis_nodes:  # every master loses the key (restarted empty)
            node.client().delete(key)
        assert killed.wait(10), "the heartbeat never noticed the lost lease"
        assert lock.lost.is_set()
    tap.until(lambda evs: any(e["type"] == "lock.lost" for e in evs))
    lost = next(e for e in tap.events if e["type"] == "lock.lost")
    assert lost == {**lost, "key": key, "job": "sync-6-g1"}


def test_the_lease_callbacks_hand_back_the_database_connections_of_their_threads() -> None:
    """``extended`` runs on the heartbeat's callback thread, which lives as long as the
    lease; ``lost`` on a thread that ends right after it (``workers.locks.heartbeat``).
    A connection either kept (the job's ``on_lost`` reaction queried, say) would hold a
    slot of a pooled process's connections, for good once its thread has ended
    (``dashboard.infra.dbpool``). Checked on the callbacks' threads themselves, so on SQLite
    too (the pool's own count is tests/conftest.py's ``_no_pool_slot_left_behind``)."""
    key = keys.mirror(7)
    observer = leases.LeaseObserver(
        key, job="sync-7-g1", on_lost=lambda: bool(Repository.objects.exists())
    )
    kept: dict[str, bool] = {}

    def call(name: str, lock: object) -> None:
        Repository.objects.exists()  # whatever else the thread did: it has a connection
        getattr(observer, name)(lock)
        kept[name] = connections["default"].connection is not None

    with leases.redlock().hold([key], ttl=30.0) as lock:
        for name in ("extended", "lost"):
            thread = CheckedThread(target=call, args=(name, lock), name=f"lease-{name}")
            thread.start()
            thread.join()
    assert kept == {"extended": False, "lost": False}


def test_lock_rows_show_the_holder_and_flag_one_whose_worker_stopped_beating() -> None:
    repo = Repository.objects.create(url="https://example.com/a/widget.git")
    other = Repository.objects.create(url="https://example.com/a/other.git")
    WorkerBeat.objects.create(name="alive", host="h", pid=1, last_seen=timezone.now())
    rl = leases.redlock()
    mine = rl.acquire([keys.mirror(repo.pk)], ttl=30.0, holder={"worker": "alive", "job": "j1"})
    rl.acquire([keys.mirror(other.pk)], ttl=30.0, holder={"worker": "ghost", "job": "j2"})
    queues.connection().hset(leases.EXTENSIONS_HASH, keys.mirror(repo.pk), "4")
    rows = {r["key"]: r for r in leases.lock_rows()}
    row = rows[keys.mirror(repo.pk)]
    assert row["repo"] == repo.pk and row["repo_name"] == "widget" and row["what"] == "mirror"
    assert row["worker"] == "alive" and row["job"] == "j1" and row["token"] == mine.token
    assert row["agreeing"] == 3 and row["extensions"] == 4 and row["stale"] is False
    assert rows[keys.mirror(other.pk)]["stale"] is True  # "ghost" never beat
    assert [r["key"] for r in leases.lock_rows(repo_id=repo.pk)] == [keys.mirror(repo.pk)]
    assert leases.held_count() == 2


def test_it_releases_only_the_locks_of_the_dead_process() -> None:
    rl = leases.redlock()
    dead = {"worker": "w", "host": "h1", "pid": 4242}
    rl.acquire([keys.mirror(1)], ttl=30.0, holder=dead)
    rl.acquire([keys.mirror(2)], ttl=30.0, holder={**dead, "pid": 4243})
    rl.acquire([keys.mirror(3)], ttl=30.0, holder={**dead, "host": "h2"})
    assert leases.release_locks_of(host="h1", pid=4242) == 1
    assert rl.inspect(keys.mirror(1)) is None
    assert rl.inspect(keys.mirror(2)) is not None
    assert rl.inspect(keys.mirror(3)) is not None


def test_forcing_a_free_key_changes_nothing_and_is_audited() -> None:
    key = keys.mirror(9)
    assert leases.force_release_lock(key=key, user="ops") == {"released": 0, "token": None}
    entry = AuditEntry.objects.get(action="lock.force_release")
    assert entry.outcome == "not held" and entry.target == key


def test_a_forced_release_fences_the_old_holder_and_announces_it() -> None:
    key = keys.mirror(11)
    old = leases.redlock().acquire([key], ttl=30.0, holder={"worker": "w", "job": "j"})
    tap = Tap()
    out = leases.force_release_lock(key=key, user="ops")
    assert out["released"] == 3 and out["token"] > old.token and out["holder"]["job"] == "j"
    assert leases.redlock().inspect(key) is None
    with pytest.raises(StaleToken), transaction.atomic():
        check_token(key, old.token)
    tap.until(lambda evs: any(e["type"] == "lock.released" for e in evs))
    event = next(e for e in tap.events if e["type"] == "lock.released")
    assert event["forced"] is True and event["token"] == out["token"]


@pytest.mark.slow
def test_a_job_that_acquires_during_a_forced_release_keeps_its_writes(
    git_repo: GitRepo, settings, tmp_path: Path
) -> None:
    """The operator's release runs in its own process and is frozen
    (SIGSTOP) between its two steps; a job acquires the lock in that gap if it can. Its
    writes must be accepted: the release bumps the token *before* deleting the lock, so
    nobody can acquire in the gap, and whoever acquires afterwards gets a newer token.
    (Bump after delete, and the job acquired in the gap with a token the bump then made
    stale: its legitimate write was rejected.)"""
    chunk = synced_chunk(git_repo)
    key = chunk.lock_key()
    rl = leases.redlock()
    old = rl.acquire([key], ttl=30.0, holder={"worker": "paused-holder"})
    env = worker_env(settings, tmp_path, GITWARD_FAILPOINTS="lock.force_release.fenced=stop")
    script = (
        "import json, sys, django; django.setup();"
        "from dashboard.locks.leases import force_release_lock;"
        "print(json.dumps(force_release_lock(key=sys.argv[1], user='ops')))"
    )
    env["DJANGO_SETTINGS_MODULE"] = "dashboard.settings"
    operator = subprocess.Popen(
        [sys.executable, "-c", script, key], env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        wait_for(
            lambda: proc_state(operator.pid) == "T",
            timeout=60,
            what="the release to reach its midpoint",
        )
        # The gap: a job tries to take the lock while the release is half done.
        try:
            job = rl.acquire([key], ttl=30.0, holder={"worker": "next-job"})
        except LockNotAcquired:
            job = None  # the old lease still stands until the release's delete
        os.kill(operator.pid, signal.SIGCONT)
        out, _ = operator.communicate(timeout=60)
    finally:
        if operator.poll() is None:
            os.kill(operator.pid, signal.SIGCONT)
            operator.kill()
            operator.wait()
    assert operator.returncode == 0
    result = json.loads(out.strip().splitlines()[-1])
    assert result["released"] >= 2 and result["token"] > old.token
    if job is None:
        job = rl.acquire([key], ttl=30.0, holder={"worker": "next-job"})
    # The job's write is accepted; the evicted holder's is not.
    path = mirror_path(Path(settings.WORKSPACE), chunk.repository_id)
    records = list(stream_commits(path, chunk.sha_list()))
    with pytest.raises(StaleToken):
        write_chunk(chunk=chunk, records=records, token=old.token)
    assert write_chunk(chunk=chunk, records=records, token=job.token) == 3
    assert set(Commit.objects.values_list("token", flat=True)) == {job.token}
    assert next_token(key) == job.token + 1  # the job's token was the newest
    job.release()
