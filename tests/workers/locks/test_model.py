"""A Hypothesis stateful model of the Redlock over three real redis-server processes.

Clients acquire, extend, release and write; an operator force-releases; masters are
stalled (SIGSTOP) and resumed, killed, restarted empty, and see their clocks jump; time
passes. Writes go through a database-free fence with the semantics of
``dashboard.locks.fencing`` (a write is accepted only with the newest token, checked in the
writing transaction of a real SQLite file). Invariants:

* tokens strictly increase, per resource, over every acquisition;
* never two holders that both write: once a write with token t was accepted, no write
  with a smaller token is;
* a holder still valid and with no data-losing fault (restart empty, clock jump, forced
  release) since it acquired is the newest token holder: its writes are accepted, so no
  discarded attempt ever fenced it out; and there is at most one such holder;
* such a holder's value is on a majority of the masters (no one else's release or
  extension touched it);
* no running master keeps a key of a failed attempt (so, certainly, none once its TTL has
  passed): a stalled master runs the release queued behind the SET when it resumes.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from tests.workers.locks.test_redlock import (  # noqa: F401  (fixtures)
    SqliteCounter,
    eventually,
    heal,
    masters,
    nodes,
)
from workers.locks import Lock, LockLost, LockNotAcquired, LockNotOwned, Redlock
from workers.locks.scripts import decode
from workers.runtime.redis_server import RedisNode

# ruff: noqa: F811  (test arguments named after the imported fixtures)

KEY = "locks:model"
TTL = 0.6


class Fence:
    """``dashboard.locks.fencing.check_token`` + a guarded write, on a real SQLite file: the
    write commits only if its token is the newest issued for the resource."""

    def __init__(self, counter: SqliteCounter) -> None:
        self.counter = counter
        with contextlib.closing(sqlite3.connect(counter.path)) as c:
            c.execute("CREATE TABLE IF NOT EXISTS writes (seq INTEGER PRIMARY KEY, token INTEGER)")
            c.commit()

    def write(self, resource: str, token: int | None) -> bool:
        with contextlib.closing(
            sqlite3.connect(self.counter.path, timeout=30, isolation_level=None)
        ) as c:
            c.execute("BEGIN IMMEDIATE")  # the check and the write in one transaction
            row = c.execute("SELECT token FROM fence WHERE resource = ?", (resource,)).fetchone()
            if token is None or row is None or int(row[0]) != token:
                c.execute("ROLLBACK")
                return False
            c.execute("INSERT INTO writes (token) VALUES (?)", (token,))
            c.execute("COMMIT")
            return True

    def accepted(self) -> list[int]:
        with contextlib.closing(sqlite3.connect(self.counter.path)) as c:
            return [int(t) for (t,) in c.execute("SELECT token FROM writes ORDER BY seq")]


class RedlockModel(RuleBasedStateMachine):
    nodes: list[RedisNode] = []
    workdir: Path = Path()

    def __init__(self) -> None:
        super().__init__()
        heal(self.nodes)
        for node in self.nodes:
            node.client().flushall()
        self.counter = SqliteCounter(self.workdir / f"model-{uuid.uuid4().hex}.sqlite3")
        self.fence = Fence(self.counter)
        self.clients = [
            Redlock([n.url for n in self.nodes], retry_count=0, token_source=self.counter)
            for _ in range(3)
        ]
        self.locks: dict[int, Lock] = {}
        self.epoch_of: dict[int, int] = {}
        self.epoch = 0  # bumped by every fault that can drop or steal a held key
        self.last_token = 0
        self.failed: list[tuple[str, float]] = []  # (attempt id, when it failed)
        self.paused: set[int] = set()

    # Clients ----------------------------------------------------------------------------

    @rule(c=st.integers(0, 2))
    def acquire(self, c: int) -> None:
        if c in self.locks:
            return
        attempt = uuid.uuid4().hex
        try:
            lock = self.clients[c].acquire(KEY, ttl=TTL, holder={"attempt": attempt})
        except LockNotAcquired:
            self.failed.append((attempt, time.monotonic()))
            return
        assert lock.token is not None and lock.token > self.last_token
        self.last_token = lock.token
        self.locks[c] = lock
        self.epoch_of[c] = self.epoch

    @rule(c=st.integers(0, 2))
    def extend(self, c: int) -> None:
        if c in self.locks:
            with contextlib.suppress(LockLost):
                self.locks[c].extend()

    @rule(c=st.integers(0, 2))
    def release(self, c: int) -> None:
        lock = self.locks.pop(c, None)
        if lock is not None:
            with contextlib.suppress(LockNotOwned):
                lock.release()

    @rule(c=st.integers(0, 2))
    def write(self, c: int) -> None:
        lock = self.locks.get(c)
        if lock is None:
            return
        try:
            lock.check()  # what every job does before writing ...
        except LockLost:
            return
        self.fence.write(KEY, lock.token)  # ... and the database decides

    @rule(c=st.integers(0, 2))
    def force_release(self, c: int) -> None:
        lock = self.locks.get(c)
        if lock is None:
            return
        # As the dashboard does: bump the token first, then compare-and-delete.
        self.counter(KEY)
        self.clients[(c + 1) % 3].force_release(KEY, lock.nonce)
        self.epoch += 1

    # Masters and time -------------------------------------------------------------------

    @rule(m=st.integers(0, 2))
    def stall_master(self, m: int) -> None:
        if self.nodes[m].alive():
            self.nodes[m].pause()
            self.paused.add(m)

    @rule(m=st.integers(0, 2))
    def resume_master(self, m: int) -> None:
        self.nodes[m].resume()
        self.paused.discard(m)

    @rule(m=st.integers(0, 2))
    def kill_master(self, m: int) -> None:
        self.nodes[m].kill()
        self.paused.discard(m)

    @rule(m=st.integers(0, 2))
    def restart_master_empty(self, m: int) -> None:
        self.nodes[m].restart(empty=True)
        self.paused.discard(m)
        self.epoch += 1

    @rule(m=st.integers(0, 2))
    def jump_master_clock(self, m: int) -> None:
        if self.nodes[m].alive() and m not in self.paused:
            self.nodes[m].client().pexpire(KEY, 1)
            self.epoch += 1

    @rule()
    def let_the_ttl_pass(self) -> None:
        """Time passes (part of the model, not a synchronisation): every lease and every
        failed attempt's TTL runs out."""
        time.sleep(TTL + 0.05)

    # Invariants -------------------------------------------------------------------------

    @invariant()
    def no_two_holders_both_write(self) -> None:
        accepted = self.fence.accepted()
        assert accepted == sorted(accepted), accepted

    @invariant()
    def a_valid_holder_is_never_fenced_out(self) -> None:
        current = self.counter.current(KEY)
        valid = {
            c: lock
            for c, lock in self.locks.items()
            if lock.valid_for() > 0 and self.epoch_of[c] == self.epoch
        }
        # Same epoch = no data-losing fault since the grant: the Redlock alone excludes ...
        assert len(valid) <= 1, valid
        # ... and the fence accepts that holder: no discarded attempt advanced the counter.
        for lock in valid.values():
            if lock.valid_for() > 0:  # (it may have run out while we looked)
                assert lock.token == current, (lock, current)

    @invariant()
    def a_valid_holder_still_holds_a_quorum(self) -> None:
        """A holder still valid, with no data-losing fault since it acquired, has its own
        value on a majority of the masters: nobody else deleted or overwrote it (a
        release or extension that matched another holder's value would). Stalled and
        dead masters cannot be read and count as holding it."""
        quorum = len(self.nodes) // 2 + 1
        for c, lock in list(self.locks.items()):
            if lock.valid_for() <= 0 or self.epoch_of[c] != self.epoch:
                continue
            present = unknown = 0
            for m, node in enumerate(self.nodes):
                if m in self.paused or not node.alive():
                    unknown += 1
                    continue
                raw = node.client(socket_timeout=2).get(KEY)
                present += isinstance(raw, bytes) and decode(raw)[0] == lock.nonce
            # Read before judging: Redis keeps a key at least as long as the client-side
            # validity, so a lease still valid now was on every master read above.
            if lock.valid_for() > 0:
                assert present + unknown >= quorum, (lock, present, unknown)

    @invariant()
    def no_key_of_a_failed_attempt_is_left(self) -> None:
        """Stronger than "once its TTL has passed": no running master keeps a key of a failed
        attempt beyond the moment it runs the SET (a stalled one: right after it resumes,
        when the release queued behind the SET runs too). The poll is far shorter than the
        TTL, so a key left to expire by itself is caught."""
        failed = {a for a, _ in self.failed}
        if not failed:
            return

        def ghosts() -> list[str]:
            found = []
            for m, node in enumerate(self.nodes):
                if m in self.paused or not node.alive():
                    continue
                raw = node.client(socket_timeout=2).get(KEY)
                if isinstance(raw, bytes) and decode(raw)[1].get("attempt") in failed:
                    found.append(node.url)
            return found

        assert eventually(lambda: not ghosts(), timeout=TTL / 2), ghosts()

    def teardown(self) -> None:
        for lock in self.locks.values():
            with contextlib.suppress(Exception):
                lock.release()
        for client in self.clients:
            client.close()
        heal(self.nodes)


@pytest.mark.slow
def test_redlock_model_under_master_faults(masters: list[RedisNode], tmp_path: Path) -> None:
    RedlockModel.nodes = masters
    RedlockModel.workdir = tmp_path
    RedlockModel.TestCase.settings = settings(
        max_examples=25,
        stateful_step_count=20,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    RedlockModel.TestCase().runTest()
