"""workers/runtime/fork_safety.py: os.fork() waits until the guarded thread leaves its round, and a
child forked right after can use SQLite at once (the hang this guard exists to prevent)."""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path

from tests.support.checked_threads import CheckedThread
from workers.runtime.fork_safety import ForkGuard


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


def _child_writes_around_the_parents_close(db: Path, *, keep_open: bool) -> list[str]:
    """A thread of this process opens an SQLite (WAL) connection; we fork; the child
    commits "before", waits until the parent has closed that connection, commits
    "after". Returns what the database holds once the child is gone."""
    setup = sqlite3.connect(db, isolation_level=None)
    setup.execute("pragma journal_mode=wal")
    setup.execute("create table t (x)")
    setup.close()
    held: list[sqlite3.Connection] = []

    def open_one() -> None:
        conn = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
        conn.execute("select count(*) from t").fetchone()
        held.append(conn)

    opener = CheckedThread(target=open_one)
    opener.start()
    opener.join()
    if not keep_open:
        held[0].close()
    wrote, closed = os.pipe(), os.pipe()
    pid = os.fork()
    if pid == 0:  # child: leave without running the parent's cleanup
        try:
            own = sqlite3.connect(db, isolation_level=None)
            own.execute("insert into t values ('before')")
            os.write(wrote[1], b"1")
            os.read(closed[0], 1)
            own.execute("insert into t values ('after')")
            own.close()
            os._exit(0)
        except BaseException:
            os._exit(3)
    os.read(wrote[0], 1)
    if keep_open:
        held[0].close()  # SQLite thinks this is the last connection: checkpoint, delete WAL
    os.write(closed[1], b"1")
    assert os.waitpid(pid, 0)[1] == 0
    return [row[0] for row in sqlite3.connect(db).execute("select x from t order by rowid")]


def test_an_sqlite_connection_open_across_a_fork_loses_the_childs_commits(
    tmp_path: Path,
) -> None:
    """Why a worker forks its work horse with no SQLite connection open in any thread
    (workers/pool.py, the heartbeat): sqlite.org/howtocorrupt.html §2.6. The child
    inherits SQLite's record that its process holds the shared lock, so its own
    connection takes none; the parent's close then sees itself as the last connection,
    checkpoints and deletes the WAL file, and the child's next commit goes to the
    deleted file: reported committed, never seen again."""
    assert _child_writes_around_the_parents_close(tmp_path / "a.db", keep_open=True) == ["before"]
    assert _child_writes_around_the_parents_close(tmp_path / "b.db", keep_open=False) == [
        "before",
        "after",
    ]
