"""Cancelling a running analysis (docs/lifecycle.md#cancelling) with a real forking worker:
the work horse is held mid-job by a failpoint while its ``git log`` still runs; the cancel
stops the job (git's process is gone), releases its lock, and a write under its token
afterwards is refused by fencing; nothing of the chunk is stored, and re-analysing the
repository finishes it with the same worker."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client

from dashboard.locks import leases
from dashboard.locks.fencing import StaleToken
from dashboard.models import AuditEntry, Chunk, Commit, JobRun, Repository
from dashboard.repositories.commits import write_chunk
from dashboard.repositories.lifecycle import submit_repository
from tests.conftest import run_syncs_only
from tests.support.gitrepo import GitRepo
from tests.support.processes import end_tree, worker_env
from tests.support.sysproc import children, proc_state
from workers.analysis.history import stream_commits
from workers.git.workspace import mirror_path
from workers.runtime.process_tree import descendants

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("healthy_masters")]

#: Files per commit: each commit's ``--numstat`` record is larger than a pipe's buffer
#: (64 KiB), so with the horse stopped after reading the first record, git is still alive,
#: blocked writing the next one.
FILES = 3000


def wide_history(path: Path) -> GitRepo:
    repo = GitRepo.create(path)
    for n in range(3):
        for i in range(FILES):
            repo.write(f"d{n}/file-{i:05}.txt", f"{n}\n")
        repo.git("add", "-A")  # one git process, not one per file
        repo.commit(f"wide {n}")
    return repo


def wait_for(what: str, probe, timeout: float = 90):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (found := probe()) is not None and found is not False:
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def dead(pid: int) -> bool:
    """Gone, or a zombie (it runs nothing; its reaping is its new parent's business)."""
    return proc_state(pid) in {"gone", "Z"}


@pytest.mark.slow
def test_cancelling_a_running_analysis_kills_git_releases_the_lock_and_fences_late_writes(
    settings, tmp_path: Path
) -> None:
    origin = wide_history(tmp_path / "origin")
    repo, _ = submit_repository(url=str(origin.path))
    run_syncs_only()  # the chunk is planned and queued; the forking worker analyses it
    chunk = Chunk.objects.get(repository=repo)
    admin = User.objects.create_superuser("root", password="pw-root-123")
    env = worker_env(settings, tmp_path, GITWARD_FAILPOINTS="analyze.parsing=stop",
                     GITWARD_FAILPOINTS_ONCE=str(tmp_path))  # fmt: skip
    worker = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "worker", "--workers", "1"], env=env
    )
    try:
        # 1. The horse stops itself after the first record; its git log is still running.
        horse = wait_for("the horse at its failpoint", lambda: next(
            (p for p in children(worker.pid) if proc_state(p) == "T"), None))  # fmt: skip
        git = [p for p in descendants(horse) if "git" in Path(f"/proc/{p}/cmdline").read_text()]
        assert git and all(proc_state(p) in {"S", "R"} for p in git), [proc_state(p) for p in git]
        run = JobRun.objects.get(kind="analyze")
        assert run.state == JobRun.State.RUNNING and run.token is not None
        assert leases.redlock().inspect(chunk.lock_key()) is not None

        # 2. Cancel it over the API, as the page's button does.
        client = Client()
        client.force_login(admin)
        res = client.post(f"/api/runs/{run.pk}/cancel", data="{}", content_type="application/json")
        assert res.status_code == 200, res.content
        body = res.json()
        assert body["cancelled"] == 1 and body["stopped"] == 1
        assert chunk.lock_key() in body["fenced"]

        # 3. The lock is released at once; the horse and its git process die.
        assert leases.redlock().inspect(chunk.lock_key()) is None
        wait_for("the horse to die", lambda: dead(horse))
        wait_for("git to die", lambda: all(dead(p) for p in git))

        # 4. A write under the cancelled run's token is refused; nothing is half-written.
        path = mirror_path(Path(settings.WORKSPACE), repo.pk)
        records = list(stream_commits(path, chunk.sha_list()))
        with pytest.raises(StaleToken):
            write_chunk(chunk=chunk, records=records, token=run.token)
        assert Commit.objects.count() == 0
        run.refresh_from_db()
        assert run.state == JobRun.State.DISCARDED and run.error == "cancelled by root"
        repo.refresh_from_db()
        assert (repo.status, repo.error) == ("failed", "cancelled by root")
        chunk.refresh_from_db()
        assert chunk.state == Chunk.State.QUEUED
        entry = AuditEntry.objects.get(action="run.cancel")
        assert entry.user == admin and "1 running stopped" in entry.outcome

        # 5. The worker lives on: re-analysing finishes the repository, each commit once.
        assert worker.poll() is None
        res = client.post(f"/api/repos/{repo.pk}/reanalyse", data=json.dumps({}),
                          content_type="application/json")  # fmt: skip
        assert res.status_code == 202
        wait_for("the re-analysis", lambda: Repository.objects.get(pk=repo.pk).status == "ready",
                 timeout=120)  # fmt: skip
        assert Commit.objects.count() == 3
        assert set(Commit.objects.values_list("token", flat=True)) != {run.token}
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            end_tree(worker)
