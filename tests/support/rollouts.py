"""Shared helpers of the rollout tests: a real deploy lock, a verdict, live-event capture."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.utils import timezone

from dashboard.infra.events import OPS_GROUP
from dashboard.locks.fencing import next_token
from dashboard.models import AnalyzerVersion, Chunk, Repository, Rollout, WorkerBeat
from dashboard.repositories.commits import write_chunk
from dashboard.repositories.lifecycle import submit_repository
from dashboard.rollouts import start as rollouts_start
from dashboard.rollouts import steps
from dashboard.rollouts.driver import RolloutDriver
from dashboard.versions import state_machine
from dashboard.versions.state_machine import ensure_baseline
from tests.conftest import run_workers
from tests.support.gitrepo import GitRepo
from workers.analysis.analyzer import AnalyzerConfig
from workers.analysis.history import stream_commits
from workers.git.workspace import mirror_path

#: Drivers started by a test; released after it so no heartbeat outlives its test.
DRIVERS: list[RolloutDriver] = []


@pytest.fixture(autouse=True)
def _release_drivers() -> Iterator[None]:
    yield
    while DRIVERS:
        d = DRIVERS.pop()
        with contextlib.suppress(Exception):
            d.release()


RENAMES = {"detect_renames": True}
PASSING = {"ok": True, "summary": "passed: test verdict", "checks": {}}


def start(config: dict[str, Any] | None = None, **kw: Any) -> tuple[Rollout, RolloutDriver]:
    """Baseline + a rollout of ``config`` whose driver (this process) holds the lock."""
    ensure_baseline(actor="setup")
    ro = rollouts_start.start_rollout(
        config=config or RENAMES, actor=kw.pop("actor", "alice"), enqueue_driver=False, **kw
    )
    driver = RolloutDriver(ro.pk, ttl=5.0)
    driver.acquire(actor="alice")
    DRIVERS.append(driver)
    return Rollout.objects.get(pk=ro.pk), driver


def verify(ro: Rollout, driver: RolloutDriver) -> Rollout:
    token = int(driver.token or 0)
    steps.begin_warming(rollout=ro, token=token, actor="alice")
    return steps.record_verdict(rollout=ro, verdict=PASSING, token=token, actor="alice")


def completed_and_running() -> tuple[Rollout, Rollout, RolloutDriver]:
    """Rollout A of ``RENAMES`` promoted to current (completed, its lock released) and
    rollout B of another config running, its driver (this process) holding the deploy
    lock: ``(A, B, B's driver)``."""
    a, da = start()
    verify(a, da)
    token = int(da.token or 0)
    steps.set_ramp(rollout=a, percent=100, token=token, actor="alice")
    steps.promote(rollout=a, token=token, actor="alice")
    da.release()
    b, db = start({"ignore_whitespace": True}, actor="bob")
    return Rollout.objects.get(pk=a.pk), b, db


def state(pk: int) -> str:
    return str(AnalyzerVersion.objects.values_list("state", flat=True).get(pk=pk))


def wait_for(condition: Callable[[], Any], timeout: float = 20.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or condition}")
        time.sleep(0.05)


@contextmanager
def live_events() -> Iterator[Callable[[int], list[dict[str, Any]]]]:
    """Subscribe to the operators' group; yields ``collect(n)`` returning the events
    received until ``n`` arrived (bounded wait) or none came for a while. Audit rows,
    which go out live too (``audit.recorded``), are not counted: each transition's
    audit row is checked in the database instead."""
    layer = get_channel_layer()
    assert layer is not None
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(OPS_GROUP, channel)

    async def receive_all(n: int) -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = []
        while len(got) < n:
            try:
                msg = await asyncio.wait_for(layer.receive(channel), timeout=5)
            except TimeoutError:
                break
            if msg["event"].get("type") != "audit.recorded":  # the audit log's own feed
                got.append(msg["event"])
        return got

    try:
        yield lambda n: async_to_sync(receive_all)(n)
    finally:
        async_to_sync(layer.group_discard)(OPS_GROUP, channel)


# ---------------------------------------------------------------- analysed repositories


def history_with_renames(path: Path) -> GitRepo:
    repo = GitRepo.create(path)
    body = "".join(f"line {i}\n" for i in range(40))
    repo.commit("start", {"src/a.py": body, "README.md": "hi\n"})
    repo.commit("rename a", {"src/a.py": None, "src/b.py": body})  # 100 % similar
    repo.commit("edit b", {"src/b.py": body + "more\n"})
    repo.commit("move and tweak", {"src/b.py": None, "lib/b.py": body + "more\nagain\n"})
    repo.commit("docs", {"README.md": "hi\nthere\n"})
    return repo


def analysed(tmp_path: Path, name: str) -> tuple[Repository, GitRepo]:
    origin = history_with_renames(tmp_path / name)
    repo, _ = submit_repository(url=str(origin.path))
    run_workers()
    repo.refresh_from_db()
    assert repo.status == Repository.Status.READY, repo.error
    return repo, origin


def analyse_as(version: AnalyzerVersion, repo: Repository, shas: list[str]) -> int:
    """What the new version's worker does for one chunk: stream with its config, write
    under the chunk lock's newest fencing token."""
    chunk = Chunk.objects.create(
        repository=repo,
        fingerprint=version.fingerprint,
        key=f"{shas[0]}..{shas[-1]}" if len(shas) > 1 else shas[0],
        shas="\n".join(shas),
        size=len(shas),
    )
    cfg = version.config
    records = list(
        stream_commits(
            mirror_path(settings.WORKSPACE, repo.pk),
            shas,
            config=AnalyzerConfig.from_mapping(cfg),
        )
    )
    return write_chunk(chunk=chunk, records=records, token=next_token(chunk.lock_key()))


def report_worker(version: AnalyzerVersion) -> None:
    WorkerBeat.objects.create(
        name=f"w-{version.fp12}", host="h", pid=1, version=version.fingerprint,
        queues=state_machine.physical_queue("analysis", version.fingerprint),
        last_seen=timezone.now(),
    )  # fmt: skip
