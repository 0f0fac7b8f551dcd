"""Fencing tokens in the real database: strictly increasing, and a stale holder's write
is rejected with nothing written."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from dashboard.commits import write_chunk
from dashboard.fencing import StaleToken, check_token, next_token
from dashboard.models import Chunk, Commit, FileChange, Repository
from dashboard.repositories import current_fingerprint
from tests.gitrepo import GitRepo
from workers.history import stream_commits

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

    threads = [threading.Thread(target=take) for _ in range(8)]
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
