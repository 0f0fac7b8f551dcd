"""workers/forkguard.py: os.fork() waits until the guarded thread leaves its round, and a
child forked right after can use SQLite at once (the hang this guard exists to prevent)."""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path

from tests.threads import CheckedThread
from workers.forkguard import ForkGuard


def _fork_and_query(db: Path, forked: threading.Event, status: list[int]) -> None:
    pid = os.fork()
    if pid == 0:  # child: one query, then leave without running the parent's cleanup
        try:
            sqlite3.connect(db).execute("select count(*) from t").fetchone()
            os._exit(0)
        except BaseException:
            os._exit(3)
    forked.set()
    status.append(os.waitpid(pid, 0)[1])


def test_it_makes_fork_wait_for_the_guarded_round(tmp_path: Path) -> None:
    db = tmp_path / "db.sqlite"
    sqlite3.connect(db).execute("create table t (x)").connection.commit()
    guard = ForkGuard().install()
    inside, leave, forked = threading.Event(), threading.Event(), threading.Event()
    status: list[int] = []

    def round_of_work() -> None:
        with guard:
            sqlite3.connect(db).execute("insert into t values (1)").connection.commit()
            inside.set()
            leave.wait(30)

    worker = CheckedThread(target=round_of_work)
    worker.start()
    assert inside.wait(30)
    forker = CheckedThread(target=_fork_and_query, args=(db, forked, status))
    forker.start()
    # While the round runs the fork cannot happen: the at-fork hook waits on the guard.
    assert not forked.wait(0.5)
    leave.set()
    assert forked.wait(30)
    forker.join(30)
    worker.join(30)
    assert status == [0]  # the child queried SQLite and exited cleanly


def test_a_guard_is_usable_again_in_the_child(tmp_path: Path) -> None:
    guard = ForkGuard().install()
    pid = os.fork()
    if pid == 0:
        try:
            with guard:  # the child's copy was reset, not left held by the fork
                pass
            os._exit(0)
        except BaseException:
            os._exit(3)
    assert os.waitpid(pid, 0)[1] == 0
    with guard:
        pass
