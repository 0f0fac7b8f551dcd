"""The result contract end to end (docs/rollouts.md#result-contract): a version whose
analysis silently stores one more insertion in 1 commit in 200 (the failpoint
``analyze.perturb``, armed for its fingerprint only, in real ``manage.py worker``
processes of a real pool) is stopped by the contract in warming with no operator action
— its change (an exclusion that matches nothing) explains no changed insertion — and
the offending commits and fields are named by ``rollout status --json``, the checklist
and the Rollouts page."""

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

from dashboard.models import AnalyzerVersion, Commit, FileChange, Repository, Rollout
from dashboard.repositories.lifecycle import submit_repository
from dashboard.versions.state_machine import ensure_baseline
from tests.conftest import run_workers
from tests.support.checked_threads import CheckedThread
from tests.support.gitrepo import GitRepo
from tests.support.processes import worker_env
from workers.analysis import AnalyzerConfig
from workers.pool import Pool
from workers.runtime.failpoints import perturbs

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

COMMITS = 800
NEW = AnalyzerConfig(exclude_paths=("no-such-dir/**",))


def manage(
    env: dict[str, str], *args: str, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def long_history(path: Path, commits: int) -> GitRepo:
    """``commits`` commits (one file each, a few new lines), written by ``git
    fast-import`` with fixed dates: the same shas on every run."""
    repo = GitRepo.create(path)
    parts: list[bytes] = []
    for i in range(commits):
        message = f"edit {i}\n".encode()
        body = "".join(f"line {j} of {i}\n" for j in range(i % 5 + 1)).encode()
        stamp = 1_700_000_000 + i * 60
        parts += [
            b"commit refs/heads/main\n",
            f"mark :{i + 1}\n".encode(),
            f"author A <a@example.com> {stamp} +0000\n".encode(),
            f"committer A <a@example.com> {stamp} +0000\n".encode(),
            f"data {len(message)}\n".encode() + message,
            f"from :{i}\n".encode() if i else b"",
            f"M 100644 inline src/f{i % 7}.txt\n".encode(),
            f"data {len(body)}\n".encode() + body + b"\n",
        ]
    repo.git("fast-import", "--quiet", input=b"".join(parts))
    return repo


def test_a_version_that_silently_changes_insertions_is_stopped_by_the_contract(
    tmp_path: Path, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = ensure_baseline(actor="setup")
    origin = long_history(tmp_path / "history", COMMITS)
    repo, _ = submit_repository(url=str(origin.path))
    run_workers()
    repo.refresh_from_db()
    assert repo.status == Repository.Status.READY, repo.error
    assert Commit.objects.filter(repository=repo, fingerprint=base.fingerprint).count() == COMMITS
    new_fp = NEW.fingerprint()
    point = f"analyze.perturb#{new_fp}=perturb:200"
    with monkeypatch.context() as m:
        m.setenv("GITWARD_FAILPOINTS", point)
        perturbed = {s for s in origin.shas() if perturbs("analyze.perturb", new_fp, s)}
    assert len(perturbed) == 2  # 1 in 200 chosen by sha: 2 of these 800 (the same every run)
    env = worker_env(settings, tmp_path, GITWARD_WORKER_DEAD_AFTER="3", GITWARD_FAILPOINTS=point)
    pool = Pool(1, manage_py=ROOT / "manage.py", env=env, grace=30, poll=0.5)
    stop = threading.Event()

    def supervise() -> None:  # what `up`'s supervisor thread does
        while not stop.wait(0.5):
            pool.check()

    pool.start()
    supervisor = CheckedThread(target=supervise, name="pool supervisor", daemon=True)
    supervisor.start()
    try:
        out = manage(
            env, "rollout", "start", "--set", "exclude_paths=no-such-dir/**", "--auto",
            "--warm-commits", str(COMMITS), "--option", "step_pause=0",
            "--wait", "--timeout", "240",
        )  # fmt: skip
        # Nobody acted: the driver failed the warming verdict on the contract by itself.
        assert out.returncode != 0, out.stdout + out.stderr
        ro = Rollout.objects.select_related("version").get()
        assert ro.version.fingerprint == new_fp
        assert ro.state == Rollout.State.FAILED
        assert ro.version.state == AnalyzerVersion.State.WARM_FAILED
        assert ro.verdict["checks"]["contract"] is False and ro.verdict["ok"] is False
        assert ro.outcome.startswith("failed: result contract broken: ")
        named = {v["sha"] for v in ro.contract["violations"]}
        # Every commit named is a perturbed one, with exactly the perturbed field and
        # line; at least one was found (the check stops the rollout at the first).
        assert named and named <= perturbed
        for v in ro.contract["violations"]:
            assert v["repository"] == repo.pk and v["phase"] == "warming"
            assert v["fields"] == ["insertions"]
            row = FileChange.objects.get(commit__sha=v["sha"], fingerprint=base.fingerprint)
            assert v["detail"] == [f"{row.path} +{row.added} → +{row.added + 1}"]
        # The pairs it checked differ exactly where the failpoint struck.
        new_rows = dict(
            FileChange.objects.filter(fingerprint=new_fp).values_list("commit__sha", "added")
        )
        old_rows = dict(
            FileChange.objects.filter(
                fingerprint=base.fingerprint, commit__sha__in=list(new_rows)
            ).values_list("commit__sha", "added")
        )
        assert {s for s in new_rows if new_rows[s] != old_rows[s]} == perturbed & set(new_rows)
        # Named where an operator looks: status --json, the checklist, the page.
        status = json.loads(manage(env, "rollout", "status", "--json").stdout)
        assert status["rollout"] is None  # it ended
        assert {v["sha"] for v in status["latest"]["contract"]["violations"]} == named
        text = manage(env, "rollout", "status").stdout
        assert f"result contract (rollout {ro.pk}): broken: " in text
        checklist = manage(env, "rollout", "checklist", str(ro.pk)).stdout
        assert "- [ ] Result contract **broken: " in checklist
        for sha in named:
            assert f"commit {sha}: insertions — " in checklist
        admin = User.objects.create_superuser("root", "root@example.com", "pw")
        client = Client()
        client.force_login(admin)
        html = client.get("/rollouts/").content.decode()
        assert 'data-field="contract"' in html
        for sha in named:
            assert f'<tr data-sha="{sha}">' in html
        api = client.get(f"/api/rollouts/{ro.pk}").json()
        assert api["contract"]["ok"] is False
        assert [(v["sha"], v["fields"]) for v in api["contract"]["violations"]] == [
            (v["sha"], ["insertions"]) for v in ro.contract["violations"]
        ]
    finally:
        stop.set()
        supervisor.join(timeout=10)
        pool.stop()
