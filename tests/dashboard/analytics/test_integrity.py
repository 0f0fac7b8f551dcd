"""dashboard.analytics.integrity: the scheduled verifier, with real git, real Redis and a
real RQ worker. A failpoint that alters one stored file row in 1 of 1,000 commits is
caught within one cycle and its commit named; the schedule never has two passes of a
repository queued; the withhold policy replaces numbers by the reason until an audited
clear; the badge is on the pages."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from rq import Queue
from rq.job import Job, JobStatus

from dashboard.analytics.integrity import (
    clear_mismatch,
    job_id,
    open_mismatches,
    run_verification,
    schedule_verifications,
    verification_metrics,
    withheld_reason,
)
from dashboard.infra import queues
from dashboard.infra.events import repo_group
from dashboard.models import ApiToken, AuditEntry, FileChange, Repository, Verification
from dashboard.operations.prometheus import metrics_text
from dashboard.operations.reconciler import reconcile
from dashboard.repositories import current_fingerprint
from tests.conftest import run_workers
from tests.support.analytics_history import analysed, build
from tests.support.gitrepo import GitRepo
from tests.support.live_tap import Tap

pytestmark = pytest.mark.django_db(transaction=True)


def _maintenance() -> list[str]:
    return Queue(queues.MAINTENANCE_QUEUE, connection=queues.connection()).get_job_ids()


def _finished(repo_id: int) -> str:
    """What the repository's pass returned; it must have finished, its queue empty."""
    job = Job.fetch(job_id(repo_id), connection=queues.connection())
    assert job.get_status() == JobStatus.FINISHED and _maintenance() == []
    return str(job.return_value())


def _thousand_commits(path: Path) -> GitRepo:
    """1,000 commits on one branch, written by one ``git fast-import``: each rewrites one
    of 25 files with 1 to 9 lines."""
    repo = GitRepo.create(path)
    out = []
    for i in range(1000):
        message = f"change {i}\n".encode()
        content = "".join(f"{i}-{j}\n" for j in range(i % 9 + 1)).encode()
        out.append(b"commit refs/heads/main\n")
        out.append(f"mark :{i + 1}\n".encode())
        out.append(f"committer Ada <ada@example.com> {1_700_000_000 + 60 * i} +0000\n".encode())
        out.append(f"data {len(message)}\n".encode() + message)
        if i:
            out.append(f"from :{i}\n".encode())
        out.append(f"M 100644 inline f{i % 25}.txt\n".encode())
        out.append(f"data {len(content)}\n".encode() + content + b"\n")
    repo.git("fast-import", "--quiet", input=b"".join(out))
    return repo


def _git_rows(repo: GitRepo) -> dict[str, list[tuple[str, int, int]]]:
    """Each commit's numstat rows from one ``git log`` (the test's own reading of git)."""
    rows: dict[str, list[tuple[str, int, int]]] = {}
    sha = ""
    for line in repo.git("log", "--no-renames", "--numstat", "--format=@%H").splitlines():
        if line.startswith("@"):
            sha = line[1:]
            rows[sha] = []
        elif line.strip():
            added, deleted, path = line.split("\t", 2)
            rows[sha].append((path, int(added), int(deleted)))
    return rows


@pytest.mark.slow
def test_a_failpoint_altering_one_row_in_1000_commits_is_caught_in_one_cycle(
    tmp_path: Path, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    origin = _thousand_commits(tmp_path / "origin")
    # ``alter`` fires once across every process (GITWARD_FAILPOINTS_ONCE): exactly one
    # chunk's first commit gets one added line more than git counts.
    monkeypatch.setenv("GITWARD_FAILPOINTS", "analyze.alter_row=alter")
    monkeypatch.setenv("GITWARD_FAILPOINTS_ONCE", str(tmp_path / "once"))
    (tmp_path / "once").mkdir()
    repo = analysed(origin)
    monkeypatch.delenv("GITWARD_FAILPOINTS")
    assert os.listdir(tmp_path / "once") == ["analyze.alter_row"]  # it fired, once
    git_rows = _git_rows(origin)
    stored: dict[str, list[tuple[str, int, int]]] = {}
    for sha, path, added, deleted in FileChange.objects.filter(repository=repo).values_list(
        "commit__sha", "path", "added", "deleted"
    ):
        stored.setdefault(sha, []).append((path, added, deleted))
    altered = [sha for sha in git_rows if sorted(stored[sha]) != sorted(git_rows[sha])]
    assert len(git_rows) == 1000 and len(altered) == 1  # 1 of 1,000 commits
    # One cycle: the sample covers every stored commit (GITWARD_VERIFY_SAMPLE above the
    # 1,000 stored), so the altered commit is in it with certainty, not by chance.
    settings.VERIFY_INTERVAL = 3600.0
    settings.VERIFY_SAMPLE = 5000
    assert reconcile()["verifications"] == 1  # the reconciler's round enqueues the pass
    assert _maintenance() == [job_id(repo.pk)]
    run_workers()  # a real RQ worker runs it
    assert _finished(repo.pk).startswith("integrity mismatch: 1000 commits sampled, 2 mismatches")
    row = Verification.objects.get(repository=repo, fingerprint=current_fingerprint())
    assert row.state == Verification.State.MISMATCH and row.sampled == 1000
    assert row.mismatch_count == 2  # the commit, and the insertions total it shifts
    first = row.mismatches[0]
    path, added, _ = git_rows[altered[0]][0]
    assert first == {"sha": altered[0], "path": path, "field": "added", "git": added,
                     "stored": added + 1}  # fmt: skip
    assert row.mismatches[1]["field"] == "totals.insertions"
    assert [m["id"] for m in open_mismatches()] == [row.pk]
    assert verification_metrics()["mismatches"] == 2.0


def test_the_schedule_keeps_at_most_one_pass_per_repository(tmp_path: Path, settings: Any) -> None:
    repo = analysed(build(tmp_path / "origin"))
    settings.VERIFY_INTERVAL = 0.0
    assert schedule_verifications() == {"created": 0, "enqueued": 0}  # off
    settings.VERIFY_INTERVAL = 3600.0
    assert schedule_verifications() == {"created": 1, "enqueued": 1}
    assert schedule_verifications() == {"created": 0, "enqueued": 0}  # in flight
    # a claim thought lost (older than twice the job timeout) is taken again, but the
    # pass is still queued under the repository's job id: no second one
    Verification.objects.update(enqueued_at="2000-01-01T00:00:00Z")
    assert schedule_verifications() == {"created": 0, "enqueued": 0}
    assert _maintenance() == [job_id(repo.pk)]
    run_workers()
    assert _finished(repo.pk) == "verified: 32 commits sampled, 0 mismatches, just now"
    row = Verification.objects.get(repository=repo)
    assert (row.state, row.sampled, row.mismatch_count, row.enqueued_at) == ("ok", 32, 0, None)
    assert row.head == repo.head and row.generation == repo.generation
    assert schedule_verifications()["enqueued"] == 0  # not due for an hour
    # a re-analysis (a newer sync generation) makes it due at once
    Repository.objects.filter(pk=repo.pk).update(generation=repo.generation + 1)
    assert schedule_verifications()["enqueued"] == 1
    assert _maintenance() == [job_id(repo.pk)]
    assert verification_metrics()["sampled"] == 32.0


def test_withhold_hides_results_until_an_audited_clear(
    tmp_path: Path, settings: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = analysed(build(tmp_path / "origin"))
    settings.VERIFY_INTERVAL = 3600.0
    settings.VERIFY_ON_MISMATCH = "withhold"
    fp = current_fingerprint()
    row = FileChange.objects.filter(repository=repo, path="handbook/guide.md").order_by("id")[3]
    FileChange.objects.filter(pk=row.pk).update(deleted=row.deleted + 5)
    schedule_verifications()
    tap = Tap(repo_group(repo.pk))  # the repository page's watchers
    run_verification(repo.pk, fp)
    tap.until(lambda evs: any(e["type"] == "repo.changed" and e.get("integrity") for e in evs))
    sha = row.commit.sha
    reason = f"results withheld: integrity mismatch in commit {sha} (deleted of handbook/guide.md)"
    assert withheld_reason(repo) == reason
    root = User.objects.create_superuser("root", password="pw-root-123456")
    api = Client(HTTP_AUTHORIZATION=f"Bearer {ApiToken.issue(root)[1]}")
    detail = api.get(f"/api/repos/{repo.pk}", {"summary": "1"}).json()
    assert detail["withheld"] == reason and detail["summary"] is None
    assert detail["verification"]["details"][0]["sha"] == sha
    for url in (f"/api/repos/{repo.pk}/hotspots", f"/api/repos/{repo.pk}/commits"):
        res = api.get(url)
        assert (res.status_code, res.json()) == (409, {"error": reason})
    pages = Client()
    pages.force_login(root)
    page = pages.get(f"/repos/{repo.pk}/").content.decode()
    assert reason in page and 'id="commit-table"' not in page
    shown = pages.get(f"/repos/{repo.pk}/analytics/hotspots/")
    assert shown.status_code == 409 and reason in shown.content.decode()
    listed = api.get("/api/integrity").json()
    assert listed["open"] == 1 and listed["mismatches"][0]["repository"]["id"] == repo.pk
    assert sha in pages.get("/dead-letters/").content.decode()  # beside the dead letters
    ver = Verification.objects.get(repository=repo)
    call_command("verify", "--open")
    assert capsys.readouterr().out == (
        f"#{ver.pk} {repo.name}: integrity mismatch: 32 commits sampled, 1 mismatch, just now; "
        f"in commit {sha} (deleted of handbook/guide.md); results withheld\n"
    )
    # the clear: audited, results served again; a second one has nothing to clear
    assert api.post(f"/api/integrity/{ver.pk}/clear").json() == {"cleared": True, "id": ver.pk}
    assert api.post(f"/api/integrity/{ver.pk}/clear").status_code == 409
    entries = list(AuditEntry.objects.filter(action="integrity.clear").order_by("id"))
    assert [e.outcome for e in entries] == [
        f"cleared: commit {sha} (deleted of handbook/guide.md)",
        "nothing to clear: no open mismatch",
    ]
    assert api.get(f"/api/repos/{repo.pk}/hotspots").status_code == 200
    # the same mismatch found again stays cleared (flagged); a new one reopens the group
    run_verification(repo.pk, fp)
    ver.refresh_from_db()
    assert (ver.state, ver.withheld) == ("cleared", False)
    other = FileChange.objects.filter(repository=repo).exclude(pk=row.pk).order_by("id")[0]
    FileChange.objects.filter(pk=other.pk).update(added=other.added + 1)
    run_verification(repo.pk, fp)
    ver.refresh_from_db()
    assert (ver.state, ver.withheld) == ("mismatch", True)
    # a re-analysis (newer generation) lifts the withhold at once
    Repository.objects.filter(pk=repo.pk).update(generation=repo.generation + 1)
    repo.refresh_from_db()
    assert withheld_reason(repo) is None
    call_command("verify", "--clear", str(ver.pk))
    assert capsys.readouterr().out == f"cleared integrity mismatch #{ver.pk}\n"
    with pytest.raises(CommandError, match=f"no open integrity mismatch #{ver.pk}"):
        call_command("verify", "--clear", str(ver.pk))
    assert AuditEntry.objects.filter(action="integrity.clear").order_by("id").last().actor == "cli"
    assert clear_mismatch(ver.pk, user="cli") is False


def test_flag_policy_and_the_badge_on_the_pages(tmp_path: Path, settings: Any) -> None:
    repo = analysed(build(tmp_path / "origin"))
    settings.VERIFY_INTERVAL = 3600.0
    root = User.objects.create_superuser("root", password="pw-root-123456")
    pages = Client()
    pages.force_login(root)
    assert "not verified yet" not in pages.get(f"/repos/{repo.pk}/").content.decode()
    schedule_verifications()
    assert "not verified yet" in pages.get(f"/repos/{repo.pk}/").content.decode()
    run_workers()
    badge = "verified: 32 commits sampled, 0 mismatches, just now"
    assert badge in pages.get(f"/repos/{repo.pk}/").content.decode()
    assert badge in pages.get(f"/repos/{repo.pk}/analytics/hotspots/").content.decode()
    # flag (the default): a mismatch is shown and listed, the numbers still served
    row = FileChange.objects.filter(repository=repo).order_by("id")[0]
    FileChange.objects.filter(pk=row.pk).update(binary=not row.binary)
    run_verification(repo.pk, current_fingerprint())
    page = pages.get(f"/repos/{repo.pk}/").content.decode()
    assert "integrity mismatch: 32 commits sampled, 1 mismatch, just now" in page
    assert 'id="commit-table"' in page and withheld_reason(repo) is None
    assert [m["details"][0]["field"] for m in open_mismatches()] == ["binary"]
    assert "gitward_verify_open_mismatches 1.0" in metrics_text()
