"""End to end, as an operator runs it (the CLI path, docs/rollouts.md#runbook-cli): a real
worker pool (``workers.pool.Pool`` children, as ``up`` runs them) follows the versions table;
``manage.py rollout start --set detect_renames=true --auto --wait`` returns once the new
version is current; the catch-up brings the repository under it and the API serves the
new numbers; ``manage.py rollout rollback`` makes the API serve the old numbers the moment
it returns."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from dashboard.models import AnalyzerVersion, Commit, Repository, Rollout
from dashboard.repositories.summaries import repository_summary
from dashboard.rollouts.drains import reconcile_drains
from dashboard.versions.state_machine import ensure_baseline
from tests.support.checked_threads import CheckedThread
from tests.support.processes import worker_env
from tests.support.rollouts import analysed, wait_for
from workers.pool import Pool

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def manage(
    env: dict[str, str], *args: str, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def test_a_rollout_and_its_rollback_from_the_cli_through_a_real_pool(
    tmp_path: Path, settings: Any, client: Client
) -> None:
    base = ensure_baseline(actor="setup")
    repo, origin = analysed(tmp_path, "r")
    before = repository_summary(repo, base.fingerprint)
    env = worker_env(settings, tmp_path, GITWARD_WORKER_DEAD_AFTER="3")
    pool = Pool(1, manage_py=ROOT / "manage.py", env=env, grace=30, poll=0.5)
    stop = threading.Event()

    def supervise() -> None:  # what `up`'s supervisor thread does
        while not stop.wait(0.5):
            pool.check()

    pool.start()
    thread = CheckedThread(target=supervise, name="pool supervisor", daemon=True)
    thread.start()
    client.force_login(User.objects.create_user("viewer", password="pw-viewer-123"))
    try:
        started = manage(
            env, "rollout", "start", "--set", "detect_renames=true", "--steps", "100", "--auto",
            "--warm-repositories", "1", "--warm-threshold", "1", "--option", "step_pause=0",
            "--option", "min_samples=0", "--wait", "--timeout", "120",
        )  # fmt: skip
        assert started.returncode == 0, started.stderr + started.stdout
        ro = Rollout.objects.get()
        assert f"rollout {ro.pk} completed" in started.stdout
        new = AnalyzerVersion.objects.get(pk=ro.version_id)
        assert new.state == "current"
        status = json.loads(manage(env, "rollout", "status", "--json").stdout)
        assert {v["fingerprint"]: v["state"] for v in status["versions"]} == {
            new.fingerprint: "current", base.fingerprint: "draining",
        }  # fmt: skip

        # The catch-up re-syncs the repository under the new version (its own workers).
        def caught_up() -> bool:
            ready = Repository.objects.filter(
                pk=repo.pk, status="ready", fingerprint=new.fingerprint
            )
            stored = Commit.objects.filter(repository=repo, fingerprint=new.fingerprint).count()
            return ready.exists() and stored == len(origin.shas())

        wait_for(caught_up, timeout=120, what="the catch-up")
        body = client.get(f"/api/repos/{repo.pk}?summary=1").json()
        assert body["fingerprint"] == new.fingerprint
        assert body["summary"]["totals"] != before["totals"]  # renames: one file, 0/0 lines
        rolled = manage(env, "rollout", "rollback", str(ro.pk), "--reason", "e2e", "--timeout", "0")
        assert rolled.returncode == 0, rolled.stderr
        body = client.get(f"/api/repos/{repo.pk}?summary=1").json()
        assert body["fingerprint"] == base.fingerprint
        assert body["summary"]["totals"] == before["totals"]
        # The new version drains (reconciler) and its workers are stopped by the pool.
        wait_for(lambda: reconcile_drains() or AnalyzerVersion.objects.get(pk=new.pk).state
                 == "drained", timeout=60, what="the drain")  # fmt: skip
        wait_for(lambda: all(new.fingerprint not in s for s in pool.specs()), timeout=30,
                 what="the drained version's workers stopped")  # fmt: skip
    finally:
        stop.set()
        thread.join(timeout=10)
        pool.stop()
