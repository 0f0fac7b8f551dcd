"""The test harness's own checks (tests/conftest.py, tests/support/sysproc.py,
tests/support/db_pool_slots.py): the leftover-process check finds what a test started even once its
parent is gone; the pool-slot check counts a pooled connection another thread holds
until that thread closes it."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
import time
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from dashboard.infra.dbpool import close_thread_connections
from dashboard.models import Repository
from tests.support import db_pool_slots
from tests.support.checked_threads import CheckedThread
from tests.support.sysproc import proc_state, processes_of


def test_processes_of_finds_an_orphan_by_the_marker_it_inherited() -> None:
    # sh starts a sleep in the background and exits: the sleep is re-parented (to init
    # or a subreaper), so only the inherited environment marker still says it is ours.
    out = subprocess.run(
        ["sh", "-c", "sleep 120 >/dev/null 2>&1 & echo $!"],
        capture_output=True,
        text=True,
        check=True,
    )
    orphan = int(out.stdout)
    try:
        assert os.getppid() != orphan
        found = processes_of(str(os.getpid()), os.getpid())
        assert orphan in found and found[orphan] == "sleep 120"
        assert os.getpid() not in found
        assert processes_of("someone-else", 1 << 22).get(orphan) is None
    finally:
        os.kill(orphan, signal.SIGKILL)  # ours: its pid was printed by the sh we started


def test_processes_of_skips_zombies() -> None:
    proc = subprocess.Popen(["true"])
    try:
        while proc_state(proc.pid) not in ("Z", "gone"):
            time.sleep(0.01)  # until it exited (it is not reaped before the wait)
        assert proc.pid not in processes_of(str(os.getpid()), os.getpid())
    finally:
        proc.wait()


def _pool() -> Any:
    """This process's PostgreSQL pool (opened by a first query), or skip; with nothing
    lent to other threads once they have had 10 s to give it back. What an earlier test
    of the process left (asgiref's shared thread keeps its connection between tests until
    the fixture hands it back; a thread may still be closing) would otherwise be in
    ``before`` and then reused or returned during the test: the counts below were off by
    one under pytest-xdist, where a file's predecessor changes from run to run."""
    Repository.objects.exists()
    of = db_pool_slots.pool()
    if of is None:
        pytest.skip("the pool-slot check is for PostgreSQL with a pool (GITWARD_DB_POOL_SIZE)")
    db_pool_slots.hand_back_asgi_thread(grace=10.0)
    left = db_pool_slots.slots_left(of, before=0, grace=10.0)
    assert left == 0, f"{left} pooled connections still lent to other threads"
    return of


@pytest.mark.django_db
def test_a_connection_another_thread_holds_is_counted_until_it_closes_it() -> None:
    of = _pool()
    before = db_pool_slots.taken_by_others(of)
    holding, done = threading.Event(), threading.Event()

    def hold() -> None:
        Repository.objects.exists()
        holding.set()
        done.wait(30)
        close_thread_connections()

    started = db_pool_slots.StartedThreads()
    started.start()
    thread = CheckedThread(target=hold, name="holder")
    thread.start()
    started.stop()
    try:
        assert holding.wait(30)
        assert db_pool_slots.slots_left(of, before=before, grace=0.0) == 1
        assert "still running: ['holder']" in started.describe()
    finally:
        done.set()
        thread.join()
    assert db_pool_slots.slots_left(of, before=before, grace=10.0) == 0
    assert "ended: ['holder']" in started.describe()


@pytest.mark.django_db
def test_what_asgirefs_shared_thread_kept_is_handed_back() -> None:
    """A thread-sensitive ``sync_to_async`` outside any ``async_to_sync`` (the in-process
    ASGI app of Channels' communicator and Django's ``AsyncClient``) queries on asgiref's
    one shared thread, and plain ``sync_to_async`` never closes what it opened there."""
    of = _pool()
    before = db_pool_slots.taken_by_others(of)
    asyncio.run(sync_to_async(Repository.objects.exists, thread_sensitive=True)())
    assert db_pool_slots.slots_left(of, before=before, grace=0.0) == 1
    db_pool_slots.hand_back_asgi_thread(grace=10.0)
    assert db_pool_slots.slots_left(of, before=before, grace=0.0) == 0
