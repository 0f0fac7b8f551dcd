"""Fencing tokens in the real database: strictly increasing, and a stale holder's write
is rejected with nothing written."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from django.db import connection, transaction

from dashboard.locks.fencing import StaleToken, check_token, next_token
from dashboard.models import Chunk, Commit, FenceToken, FileChange, Repository
from dashboard.repositories.commits import write_chunk
from dashboard.repositories.lifecycle import current_fingerprint
from tests.support.checked_threads import CheckedThread
from tests.support.gitrepo import GitRepo
from workers.analysis.history import stream_commits
from workers.locks import Lock, LockNotAcquired, Redlock
from workers.runtime.redis_server import RedisNode

pytestmark = pytest.mark.django_db(transaction=True)


def test_tokens_strictly_increase_per_resource_under_concurrency() -> None:
    issued: list[int] = []
    lock = threading.Lock()
    barrier = threading.Barrier(8)

    def take() -> None:
        try:
            barrier.wait()
            for _ in range(15):
                t = next_token("locks:test:a")
                with lock:
                    issued.append(t)
        finally:
            connection.close()

    threads = [CheckedThread(target=take) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(issued) == list(range(1, 121))  # unique, gap-free, strictly increasing
    assert next_token("locks:test:b") == 1  # resources are independent


def test_check_token_accepts_only_the_newest_token() -> None:
    old = next_token("locks:r")
    new = next_token("locks:r")
    with transaction.atomic():
        check_token("locks:r", new)
    with pytest.raises(StaleToken, match="stale"), transaction.atomic():
        check_token("locks:r", old)
    with pytest.raises(StaleToken), transaction.atomic():
        check_token("locks:never-issued", 1)
    with pytest.raises(RuntimeError, match="inside"):
        check_token("locks:r", new)  # outside a transaction the check would be meaningless


def test_a_stale_holder_writes_nothing(git_repo: GitRepo, tmp_path) -> None:
    mirror = tmp_path / "mirror.git"
    git_repo.git("clone", "-q", "--bare", str(git_repo.path), str(mirror))
    repo = Repository.objects.create(url=str(git_repo.path), status=Repository.Status.ANALYZING)
    shas = git_repo.git("rev-list", "--reverse", "HEAD").split()
    chunk = Chunk.objects.create(
        repository=repo,
        fingerprint=current_fingerprint(),
        key=f"{shas[0]}..{shas[-1]}",
        shas="\n".join(shas),
        size=len(shas),
    )
    records = list(stream_commits(mirror, shas))
    first = next_token(chunk.lock_key())  # holder A
    second = next_token(chunk.lock_key())  # holder B took over after A's lease expired
    with pytest.raises(StaleToken):
        write_chunk(chunk=chunk, records=records, token=first)
    assert Commit.objects.count() == 0 and FileChange.objects.count() == 0
    chunk.refresh_from_db()
    assert chunk.state == Chunk.State.QUEUED
    assert write_chunk(chunk=chunk, records=records, token=second) == 3
    assert set(Commit.objects.values_list("token", flat=True)) == {second}
    chunk.refresh_from_db()
    assert chunk.state == Chunk.State.DONE and chunk.token == second


def test_a_token_fetched_after_the_lease_lapsed_does_not_fence_out_the_next_holder(
    redis_nodes: list[RedisNode],
) -> None:
    """A's token fetch is slow (a busy database): it finishes only after
    A's lease lapsed and B took the lock and its token. A's late increment must not be
    committed, or B's legitimate writes would be rejected as stale."""
    key = "locks:test:late-token"
    urls = [n.url for n in redis_nodes]
    a_has_quorum = threading.Event()
    b_holds = threading.Event()
    b_lock: list[Lock] = []

    def slow_source(resource: str, confirm: Callable[[int], None]) -> int:
        a_has_quorum.set()  # Redlock asks for the token only once a quorum said yes
        assert b_holds.wait(20), "B never took the lock"
        return next_token(resource, confirm)

    # Node timeouts of 0.25 s (not the 50 ms default): on a loaded machine a healthy master
    # can take longer than 50 ms, and A's round would then fail before its token fetch.
    a = Redlock(urls, retry_count=0, token_source=slow_source, node_timeout=0.25)
    b = Redlock(
        urls,
        retry_count=200,
        retry_delay=0.05,
        retry_jitter=0.02,
        token_source=next_token,
        node_timeout=0.25,
    )

    def take_over() -> None:
        try:
            # Wait for A's quorum, not for A's key on one master: on a loaded machine B's
            # SETs could overtake A's to the others, and A would fail before its token.
            assert a_has_quorum.wait(20), "A never reached a quorum"
            b_lock.append(b.acquire(key, ttl=10.0))  # granted once A's 0.5 s lease lapsed
        finally:
            b_holds.set()
            connection.close()

    thief = CheckedThread(target=take_over)
    thief.start()
    try:
        with pytest.raises(LockNotAcquired) as failure:
            a.acquire(key, ttl=0.5)
        thief.join(20)
        assert "validity" in failure.value.reasons  # A's late token was refused ...
        (holder,) = b_lock
        # ... and rolled back: B's token is still the newest, so B's write is accepted.
        assert FenceToken.objects.get(resource=key).token == holder.token
        with transaction.atomic():
            check_token(key, holder.token)
        info = b.inspect(key)
        assert info is not None and info["holder"]["token"] == holder.token
        holder.release()
    finally:
        a.close()
        b.close()
