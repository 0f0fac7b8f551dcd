"""The job lifecycle: attempts, retries, the dead-letter queue, retry/discard (CLI, API,
bulk), the reconciler after Redis loss, and workspace sanitation — against real Redis,
git, RQ workers and the database."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from dashboard.infra import queues
from dashboard.models import (
    AuditEntry,
    BulkAction,
    Chunk,
    Commit,
    JobAttempt,
    JobRun,
    Repository,
)
from dashboard.operations.reconciler import reconcile
from dashboard.repositories.lifecycle import submit_repository
from dashboard.runs.attempts import normalise_message
from dashboard.runs.dead_letters import list_groups, retry_runs, run_bulk, start_bulk
from tests.conftest import run_syncs_only, run_workers
from tests.support.checked_threads import at_once
from tests.support.gitrepo import GitRepo
from workers.git.mirror import packs_intact
from workers.git.workspace import mirror_path
from workers.runtime.redis_server import RedisNode

pytestmark = pytest.mark.django_db(transaction=True)


def make_repo(tmp_path: Path, name: str, commits: int = 3) -> GitRepo:
    repo = GitRepo.create(tmp_path / name)
    for i in range(commits):
        repo.commit(f"{name} {i}", {f"{name}.txt": f"{i}\n" * (i + 1)})
    return repo


def poison(monkeypatch, name: str = "poison") -> None:
    monkeypatch.setenv("GITWARD_FAILPOINTS", f"analyze.parsing#{name}=raise")


def test_a_failing_job_is_dead_lettered_after_exactly_three_attempts(
    tmp_path: Path, monkeypatch
) -> None:
    poison(monkeypatch)
    bad, _ = submit_repository(url=str(make_repo(tmp_path, "poison").path))
    good, _ = submit_repository(url=str(make_repo(tmp_path, "healthy").path))
    run_workers()
    run = JobRun.objects.get(repository=bad, kind="analyze")
    assert run.state == JobRun.State.DEAD and run.attempts == 3
    attempts = list(JobAttempt.objects.filter(run=run))
    assert [a.outcome for a in attempts] == ["failed"] * 3
    assert all("FailpointError" in a.error and "Traceback" in a.traceback for a in attempts)
    bad.refresh_from_db()
    assert bad.status == Repository.Status.FAILED and "FailpointError" in bad.error
    good.refresh_from_db()
    assert good.status == Repository.Status.READY  # the poison blocked nothing
    assert Chunk.objects.get(repository=bad).state == Chunk.State.FAILED
    [group] = list_groups()
    assert group["count"] == 1 and group["repositories"] == 1
    assert group["cause"].startswith("FailpointError: failpoint analyze.parsing")
    assert "jobs.py:_analyze" in group["cause"]


def test_root_causes_ignore_numbers_shas_paths_and_quoted_values() -> None:
    a = normalise_message("repository 12 at '/tmp/x/y.git' lost 3f9a2b1c at 0.5s")
    b = normalise_message("repository 97 at '/srv/other.git' lost deadbeef12 at 12s")
    assert a == b


def test_retrying_a_dead_letter_twice_concurrently_runs_it_once(
    tmp_path: Path, monkeypatch
) -> None:
    poison(monkeypatch)
    repo, _ = submit_repository(url=str(make_repo(tmp_path, "poison").path))
    run_workers()
    run = JobRun.objects.get(kind="analyze")
    assert run.state == JobRun.State.DEAD
    monkeypatch.delenv("GITWARD_FAILPOINTS")  # the bug got fixed
    moved = at_once(lambda _: retry_runs([run.pk]), 4)
    assert sorted(moved) == [0, 0, 0, 1]
    assert queues.analysis_queue(run.fingerprint).count == 1
    run_workers()
    run.refresh_from_db()
    assert run.state == JobRun.State.SUCCEEDED and run.attempts == 4 and run.budget_base == 3
    assert JobAttempt.objects.filter(run=run, outcome="succeeded").count() == 1
    repo.refresh_from_db()
    assert repo.status == Repository.Status.READY
    assert Commit.objects.filter(repository=repo).count() == 3


def test_bulk_retry_of_a_group_is_tracked_and_audited(tmp_path: Path, monkeypatch) -> None:
    poison(monkeypatch)
    repo, _ = submit_repository(url=str(make_repo(tmp_path, "poison").path))
    run_workers()
    template = JobRun.objects.get(kind="analyze")
    # 1,500 more dead letters of the same cause (far more than one batch).
    JobRun.objects.bulk_create(
        [
            JobRun(
                job_id=f"synthetic-{i}",
                kind="analyze",
                queue=template.queue,
                repository=repo,
                state=JobRun.State.DEAD,
                attempts=3,
                cause_key=template.cause_key,
                cause=template.cause,
            )
            for i in range(1500)
        ]
    )
    action = start_bulk(kind="discard", selector={"group": template.cause_key}, user="tester")
    assert action.total == 1501
    done = run_bulk(action.pk)
    assert (done.state, done.done) == (BulkAction.State.DONE, 1501)
    assert JobRun.objects.filter(state=JobRun.State.DISCARDED).count() == 1501
    entry = AuditEntry.objects.get(action="dlq.discard")
    assert entry.actor == "tester" and entry.outcome == "1501 runs"
    assert run_bulk(action.pk).done == 1501  # re-running a finished action changes nothing


def test_the_dlq_command_lists_retries_and_refuses_bad_arguments(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    poison(monkeypatch)
    submit_repository(url=str(make_repo(tmp_path, "poison").path))
    run_workers()
    call_command("dlq", "list", "--json")
    [group] = json.loads(capsys.readouterr().out)
    call_command("dlq", "list")
    listed = capsys.readouterr().out
    assert " 1 run  1 repository  " in listed and " runs " not in listed and " repos " not in listed
    seen = datetime.fromisoformat(group["last_seen"]).astimezone(UTC)
    assert f"last {seen:%Y-%m-%d %H:%M:%S} UTC  " in listed  # no microseconds, no offset
    with pytest.raises(CommandError, match="exactly one"):
        call_command("dlq", "retry")
    monkeypatch.delenv("GITWARD_FAILPOINTS")
    call_command("dlq", "retry", "--group", group["group"])
    assert capsys.readouterr().out.strip() == "1 run re-queued"  # not "1 runs"
    call_command("dlq", "retry", "--group", group["group"])  # already retried: nothing
    assert capsys.readouterr().out.strip() == "0 runs re-queued"
    run_workers()
    assert Repository.objects.get().status == Repository.Status.READY
    assert AuditEntry.objects.filter(action="dlq.retry", actor="cli").count() == 2
    call_command("dlq", "list")
    assert "empty" in capsys.readouterr().out


@pytest.mark.parametrize("role", ["anonymous", "user", "staff", "permitted"])
def test_dlq_actions_need_staff_and_the_explicit_permission(
    role: str, tmp_path: Path, monkeypatch
) -> None:
    poison(monkeypatch)
    submit_repository(url=str(make_repo(tmp_path, "poison").path))
    run_workers()
    run = JobRun.objects.get(kind="analyze")
    client = Client()
    if role != "anonymous":
        user = User.objects.create_user(role, is_staff=role in {"staff", "permitted"})
        if role == "permitted":
            user.user_permissions.add(
                *Permission.objects.filter(codename__in=["retry_jobrun", "discard_jobrun"])
            )
        client.force_login(user)
    expected = {"anonymous": 401, "user": 403, "staff": 403, "permitted": 200}[role]
    # A permitted retry moves the run; the discard after it finds nothing dead left.
    for endpoint, moved in (("/api/dlq/retry", 1), ("/api/dlq/discard", 0)):
        res = client.post(endpoint, {"runs": [run.pk]}, content_type="application/json")
        assert res.status_code == expected, (endpoint, res.content)
        assert res.json() == ({"moved": moved} if expected == 200 else res.json())
        assert expected == 200 or "error" in res.json()
    run.refresh_from_db()
    assert run.state == ("queued" if role == "permitted" else "dead")
    if role in {"user", "staff"}:
        assert AuditEntry.objects.filter(outcome__startswith="refused").count() == 2


def test_the_api_lists_groups_with_attempt_history_and_runs_bulk_actions(
    tmp_path: Path, monkeypatch
) -> None:
    poison(monkeypatch)
    submit_repository(url=str(make_repo(tmp_path, "poison").path))
    run_workers()
    admin = User.objects.create_superuser("root", password="pw-root-12345")
    client = Client()
    client.force_login(admin)
    body = client.get("/api/dlq").json()
    assert body["dead"] == 1
    group = body["groups"][0]["group"]
    detail = client.get(f"/api/dlq/{group}").json()
    history = detail["runs"][0]["history"]
    assert [h["number"] for h in history] == [1, 2, 3]
    assert client.get("/api/dlq/nosuchgroup").status_code == 404
    bad = client.post("/api/dlq/retry", {"runs": "x"}, content_type="application/json")
    assert bad.status_code == 400
    res = client.post("/api/dlq/retry", {"group": group}, content_type="application/json")
    assert res.status_code == 202
    action_id = res.json()["id"]
    monkeypatch.delenv("GITWARD_FAILPOINTS")
    run_workers()  # the maintenance queue runs the bulk action, then the retried job
    action = client.get(f"/api/actions/{action_id}").json()
    assert (action["state"], action["done"], action["total"]) == ("done", 1, 1)
    assert Repository.objects.get().status == Repository.Status.READY


def test_the_reconciler_recovers_every_run_after_redis_is_flushed(
    tmp_path: Path, redis_nodes: list[RedisNode]
) -> None:
    repos = [submit_repository(url=str(make_repo(tmp_path, f"r{i}", 4).path))[0] for i in range(3)]
    for node in redis_nodes:  # every queued job vanishes
        node.client().flushall()
    assert reconcile()["requeued"] == 3
    assert reconcile()["requeued"] == 0  # idempotent: nothing is enqueued twice

    run_syncs_only()
    redis_nodes[0].restart(empty=True)  # the queue node restarts empty mid-run
    assert reconcile()["requeued"] == 3  # the planned analyze runs come back
    run_workers()
    for repo in repos:
        repo.refresh_from_db()
        assert repo.status == Repository.Status.READY
        assert Commit.objects.filter(repository=repo).count() == 4


def test_a_run_whose_worker_died_is_retried_by_the_reconciler(tmp_path: Path, settings) -> None:
    from django.utils import timezone

    from dashboard.models import WorkerBeat
    from dashboard.runs.attempts import begin_attempt

    repo, _ = submit_repository(url=str(make_repo(tmp_path, "orphan").path))
    run = JobRun.objects.get(kind="sync")
    # A worker claimed the attempt, then vanished: its heartbeat is older than the limit.
    old = timezone.now() - timezone.timedelta(seconds=settings.WORKER_DEAD_AFTER + 5)
    WorkerBeat.objects.create(name="ghost.1", host="ghost", pid=1, last_seen=old)
    assert begin_attempt(run_id=run.pk, number=1, worker="ghost.1")
    JobRun.objects.filter(pk=run.pk).update(started_at=old)
    WorkerBeat.objects.filter(name="ghost.1").update(last_seen=old)  # ...and then went silent
    assert reconcile()["crashed"] == 1
    crashed = JobAttempt.objects.get(run=run, number=1)
    assert crashed.outcome == "crashed" and "worker died" in crashed.error
    run_workers()
    run.refresh_from_db()
    assert run.state == JobRun.State.SUCCEEDED and run.attempts == 2
    repo.refresh_from_db()
    assert repo.status == Repository.Status.READY


def test_a_damaged_workspace_is_repaired_or_recloned(tmp_path: Path, settings) -> None:
    origin = make_repo(tmp_path, "damaged", 6)
    repo, _ = submit_repository(url=str(origin.path))
    run_workers()
    path = mirror_path(Path(settings.WORKSPACE), repo.pk)
    origin.git("gc", "-q")
    # A dead writer's lock files, a half-finished clone, and a truncated packfile.
    (path / "index.lock").write_text("")
    (path / "refs" / "gitward").mkdir(parents=True, exist_ok=True)
    (path / "refs" / "gitward" / "head.lock").write_text("")
    half = Path(settings.WORKSPACE) / "tmp" / f"{repo.pk}-deadbeef.git"
    half.mkdir(parents=True)
    (half / "HEAD").write_text("ref: refs/heads/main\n")
    subprocess_repack(path)
    pack = next((path / "objects" / "pack").glob("*.pack"))
    with pack.open("r+b") as f:
        f.truncate(pack.stat().st_size // 2)
    assert not packs_intact(path)
    origin.commit("new work", {"more.txt": "more\n"})
    submit_repository(url=str(origin.path))
    run_workers()
    repo.refresh_from_db()
    assert repo.status == Repository.Status.READY, repo.error
    assert Commit.objects.filter(repository=repo).count() == 7
    assert packs_intact(path)
    assert not list(path.rglob("*.lock")) and not half.exists()


def subprocess_repack(path: Path) -> None:
    import subprocess

    subprocess.run(["git", "--git-dir", str(path), "repack", "-adq"], check=True)


OLD = "2020-01-01T00:00:00.000000Z"


@pytest.mark.parametrize(
    "case", ["ended", "dequeued-and-lost", "started-by-dead-worker", "overdue"]
)
def test_the_reconciler_revives_runs_whose_job_can_no_longer_run(case: str, tmp_path: Path) -> None:
    """Found by bench/chaos.py: a job that exists in Redis is not necessarily alive."""
    repo, _ = submit_repository(url=str(make_repo(tmp_path, "stuck").path))
    run = JobRun.objects.get(kind="sync")
    conn = queues.connection()
    key = f"rq:job:{run.rq_id()}"
    q = queues.queue(run.queue)
    if case == "ended":  # the horse was killed before it claimed the attempt
        conn.hset(key, mapping={"status": "failed"})
    elif case == "dequeued-and-lost":  # the worker died between dequeue and start
        conn.lrem(q.key, 0, run.rq_id())
        conn.hset(key, mapping={"enqueued_at": OLD})
    elif case == "started-by-dead-worker":
        conn.lrem(q.key, 0, run.rq_id())
        conn.hset(key, mapping={"status": "started", "worker_name": "ghost.1", "enqueued_at": OLD})
    else:  # scheduled long ago, and nothing promoted it
        conn.lrem(q.key, 0, run.rq_id())
        conn.hset(key, mapping={"status": "scheduled", "enqueued_at": OLD})
        conn.zadd(f"rq:scheduled:{run.queue}", {run.rq_id(): 1})
    first = reconcile()
    assert first["requeued"] + first["promoted"] == 1  # overdue: promoted by the same round
    # After the round the job is runnable exactly once.
    assert q.get_job_ids().count(run.rq_id()) == 1
    assert reconcile()["requeued"] == 0  # and a second round leaves it alone
    run_workers()
    repo.refresh_from_db()
    assert repo.status == Repository.Status.READY
    assert JobRun.objects.get(pk=run.pk).attempts == 1


def test_due_scheduled_jobs_are_promoted_once_without_rq_s_scheduler(tmp_path: Path) -> None:
    from dashboard.runs.attempts import enqueue_run

    submit_repository(url=str(make_repo(tmp_path, "later").path))
    run = JobRun.objects.get(kind="sync")
    q = queues.queue(run.queue)
    q.remove(run.rq_id())
    queues.connection().delete(f"rq:job:{run.rq_id()}")
    assert enqueue_run(run, delay=2.0)
    assert q.count == 0
    assert queues.promote_due_jobs([run.queue]) == 0  # not due yet: left scheduled
    deadline = time.monotonic() + 30
    while (promoted := queues.promote_due_jobs([run.queue])) == 0 and (time.monotonic() < deadline):
        time.sleep(0.05)
    assert promoted == 1
    assert queues.promote_due_jobs([run.queue]) == 0  # ZREM made the first caller the only one
    assert q.get_job_ids() == [run.rq_id()]


def test_a_paused_queue_feeds_no_worker_until_resumed(tmp_path: Path) -> None:
    op = make_user_with("op", "pause_queue", "view_jobrun")
    client = Client()
    client.force_login(op)
    res = client.post("/api/queues/pause", {"queue": "sync"}, content_type="application/json")
    assert res.json() == {"queue": "sync", "paused": True, "changed": True}
    repo, _ = submit_repository(url=str(make_repo(tmp_path, "held").path))
    run_workers()
    repo.refresh_from_db()
    assert repo.status == Repository.Status.QUEUED  # nothing was taken from "sync"
    assert queues.queue("sync").count == 1
    status = client.get("/api/status").json()
    assert next(q for q in status["queues"] if q["name"] == "sync")["paused"] is True
    client.post("/api/queues/resume", {"queue": "sync"}, content_type="application/json")
    run_workers()
    repo.refresh_from_db()
    assert repo.status == Repository.Status.READY
    assert list(
        AuditEntry.objects.filter(action__startswith="queue.").values_list("action", flat=True)
    ) == ["queue.resume", "queue.pause"]
    plain = Client()
    plain.force_login(User.objects.create_user("plain", is_staff=True))
    refused = plain.post("/api/queues/pause", {"queue": "sync"}, content_type="application/json")
    assert refused.status_code == 403
    bad = client.post("/api/queues/pause", {"queue": "nope"}, content_type="application/json")
    assert bad.status_code == 400


def make_user_with(name: str, *perms: str) -> User:
    user = User.objects.create_user(name, is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=perms))
    return user


def test_runs_can_be_searched_and_paged(tmp_path: Path, monkeypatch) -> None:
    poison(monkeypatch)
    submit_repository(url=str(make_repo(tmp_path, "poison").path))
    submit_repository(url=str(make_repo(tmp_path, "healthy").path))
    run_workers()
    client = Client()
    client.force_login(make_user_with("op", "view_jobrun"))
    dead = client.get("/api/runs?state=dead").json()["results"]
    assert [r["repository"]["url"].rsplit("/", 1)[-1] for r in dead] == ["poison"]
    found = client.get("/api/runs?q=FailpointError").json()["results"]
    assert {r["id"] for r in found} == {r["id"] for r in dead}
    first = client.get("/api/runs?limit=2").json()
    second = client.get(f"/api/runs?limit=2&before={first['next']}").json()
    assert len(first["results"]) == 2 and first["next"]
    assert not {r["id"] for r in first["results"]} & {r["id"] for r in second["results"]}
    assert client.get("/api/runs?state=nope").status_code == 400
    assert client.get("/api/runs?repo=x").status_code == 400
    plain = Client()
    plain.force_login(User.objects.create_user("plain"))
    assert plain.get("/api/runs").status_code == 403
