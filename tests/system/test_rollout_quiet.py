"""The quiet-queue rollout (docs/rollouts.md#a-canary-that-reaches-a-verdict), as a new
user tries it: one repository analysed, nothing else arriving, a real worker pool
(``workers.pool.Pool`` children, as ``up`` runs them), and ``manage.py rollout start
--set detect_renames=true [--steps 100] --auto --wait`` with the default warm set and
``min_samples`` (20). No live sample ever comes; at each step the driver sends the canary
shadow samples (the repository's commits, analysed again: the warm set took them all),
the health check passes and the rollout ends by itself with the new version current.
While it waits, ``rollout status --json`` says for what and until when. Before this,
the step stayed "inconclusive" for ever."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from dashboard.models import (
    AnalyzerVersion,
    Commit,
    FileChange,
    JobRun,
    Repository,
    Rollout,
    RolloutEvent,
)
from dashboard.repositories.lifecycle import submit_repository
from dashboard.rollouts.waiting import waiting
from dashboard.versions.state_machine import ensure_baseline
from tests.conftest import run_workers
from tests.support.checked_threads import CheckedThread
from tests.support.gitrepo import GitRepo
from tests.support.processes import worker_env
from tests.support.rollouts import wait_for
from workers.pool import Pool

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

COMMITS = 32  # fewer than the default warm set's 50 per repository: all of them warm


def manage(
    env: dict[str, str], *args: str, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def long_history(path: Path) -> GitRepo:
    """``COMMITS`` commits, a rename every fourth one."""
    repo = GitRepo.create(path)
    body = "".join(f"line {i}\n" for i in range(30))
    name = "src/m0.py"
    repo.commit("start", {name: body})
    for i in range(1, COMMITS):
        if i % 4 == 0:
            new = f"src/m{i}.py"
            repo.commit(f"rename {i}", {name: None, new: body})
            name = new
        else:
            body += f"more {i}\n"
            repo.commit(f"edit {i}", {name: body})
    return repo


@pytest.mark.parametrize("steps", [["100"], []], ids=["steps-100", "default-steps"])
def test_a_quiet_auto_rollout_gets_shadow_samples_and_ends_by_itself(
    tmp_path: Path, settings: Any, steps: list[str]
) -> None:
    base = ensure_baseline(actor="setup")
    origin = long_history(tmp_path / "quiet")
    repo, _ = submit_repository(url=str(origin.path))
    run_workers()
    repo.refresh_from_db()
    assert repo.status == Repository.Status.READY, repo.error
    assert Commit.objects.filter(repository=repo, fingerprint=base.fingerprint).count() == COMMITS
    env = worker_env(settings, tmp_path, GITWARD_WORKER_DEAD_AFTER="3")
    pool = Pool(1, manage_py=ROOT / "manage.py", env=env, grace=30, poll=0.5)
    stop = threading.Event()

    def supervise() -> None:  # what `up`'s supervisor thread does
        while not stop.wait(0.5):
            pool.check()

    result: dict[str, subprocess.CompletedProcess[str]] = {}

    def operator() -> None:
        result["start"] = manage(
            env, "rollout", "start", "--set", "detect_renames=true",
            *(["--steps", *steps] if steps else []), "--auto",
            "--option", "step_pause=0", "--step-deadline", "3600",
            "--wait", "--timeout", "240",
        )  # fmt: skip

    pool.start()
    supervisor = CheckedThread(target=supervise, name="pool supervisor", daemon=True)
    supervisor.start()
    started = CheckedThread(target=operator, name="rollout start --wait", daemon=True)
    started.start()
    try:
        # While the step waits for its samples, status says so (and until when).
        def shadowing() -> dict[str, Any] | None:
            ro = Rollout.objects.select_related("version").first()
            w = waiting(ro) if ro is not None else None
            return w if w and "shadowing" in w["reason"] else None

        seen = wait_for(shadowing, timeout=180, what="the waiting reason while shadowing")
        first = int(steps[0]) if steps else 10
        assert seen["reason"].startswith(f"step {first} %: ")
        assert "/20 samples, shadowing 20 commits of 1 repositories, deadline " in seen["reason"]
        assert seen["until"] is not None
        status = json.loads(manage(env, "rollout", "status", "--json").stdout)
        if status["rollout"] is not None:  # it may have completed meanwhile
            assert status["rollout"]["waiting"]["reason"].startswith("step ")
        started.join(timeout=280)
        assert not started.is_alive()
        out = result["start"]
        assert out.returncode == 0, out.stderr + out.stdout
        ro = Rollout.objects.get()
        assert f"rollout {ro.pk} completed" in out.stdout
        new = AnalyzerVersion.objects.get(pk=ro.version_id)
        assert new.state == "current" and ro.state == Rollout.State.COMPLETED
        # The shadow samples: the warm set (the default, 50 newest commits) took every
        # commit, so the 20 newest are analysed again under the new version, each its
        # own run, all succeeded — the 20 samples the health check counted — and each
        # commit is stored once.
        # One shadow sample per step (the same commits each step: the same state).
        newest = origin.git("rev-list", "HEAD").split()
        shadows = list(RolloutEvent.objects.filter(rollout=ro, action="shadow.enqueued"))
        assert [e.detail["percent"] for e in shadows] == [int(s) for s in steps or ro.steps]
        for shadow in shadows:
            assert shadow.detail["items"] == [[repo.pk, sha] for sha in newest[:20]]
            assert (shadow.detail["commits"], shadow.detail["repositories"]) == (20, 1)
            assert shadow.detail["reanalysed"] == 20
        stored = Commit.objects.filter(repository=repo, fingerprint=new.fingerprint)
        assert sorted(stored.values_list("sha", flat=True)) == sorted(newest)
        runs = JobRun.objects.filter(
            kind="analyze", fingerprint=new.fingerprint, chunk__key__startswith="shadow-"
        )
        assert sorted(runs.values_list("state", flat=True)) == ["succeeded"] * 20 * len(shadows)
        assert not RolloutEvent.objects.filter(rollout=ro, action="step.deadline").exists()
        # The result contract held (docs/rollouts.md#result-contract), and the commits
        # whose numbers changed are exactly those in which git itself reports a rename.
        assert ro.contract["ok"] is True and ro.contract["violating"] == 0, ro.contract
        assert ro.contract["checked"] == COMMITS
        renames = set(origin.git("log", "-M", "--diff-filter=R", "--format=%H").split())
        assert len(renames) == (COMMITS - 1) // 4

        def rows(fp: str) -> dict[str, list[tuple[str, int, int]]]:
            out: dict[str, list[tuple[str, int, int]]] = {}
            for sha, path, a, d in FileChange.objects.filter(
                repository=repo, fingerprint=fp
            ).values_list("commit__sha", "path", "added", "deleted"):
                out.setdefault(sha, []).append((path, a, d))
            return {sha: sorted(files) for sha, files in out.items()}

        old, changed = rows(base.fingerprint), rows(new.fingerprint)
        assert {sha for sha in newest if old.get(sha) != changed.get(sha)} == renames
        assert ro.contract["changed"] == ro.contract["renames"] == len(renames)
    finally:
        stop.set()
        supervisor.join(timeout=10)
        pool.stop()
