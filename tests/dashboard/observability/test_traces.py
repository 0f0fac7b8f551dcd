"""dashboard.observability.traces: every job attempt has a complete, ordered, timed trace, shown on
the run page (``/runs/<id>/``) and by ``GET /api/runs/<id>``; real repositories, real RQ workers,
real locks on three masters."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from django.test import Client
from django.utils import timezone

from dashboard.infra import queues
from dashboard.locks import leases
from dashboard.models import ApiToken, Chunk, JobAttempt, JobRun, WorkerBeat
from dashboard.observability.logs import JsonFormatter
from dashboard.observability.traces import timeline, trace_id_of
from dashboard.repositories.lifecycle import submit_repository
from tests.conftest import run_workers
from tests.dashboard.operations.test_prometheus import make_repo, synced_chunk
from tests.support.gitrepo import GitRepo
from tests.support.live_tap import Tap
from tests.support.sockets import make_user

pytestmark = pytest.mark.django_db(transaction=True)

ANALYZE = ["queued", "dequeued", "lock wait", "git stream", "rows write", "lock held", "finished"]


def names(attempt: JobAttempt) -> list[str]:
    return [s["name"] for s in attempt.spans]


def assert_well_formed(attempt: JobAttempt) -> None:
    spans = attempt.spans
    assert spans[-1]["name"] in {"finished", "error"}, "the attempt's own span comes last"
    starts = [s["start"] for s in spans[:-1]]
    assert starts == sorted(starts), "spans are stored in the order they began"
    for s in spans:
        assert s["start"] <= s["end"], s
        assert s["end"] - s["start"] < 120, s  # plausible: nothing here takes minutes
    by = {s["name"]: s for s in spans}
    t0, t1 = by["queued"]["start"], by[spans[-1]["name"]]["end"]
    assert all(t0 <= s["start"] and s["end"] <= t1 + 1e-3 for s in spans)
    assert by["queued"]["end"] <= by["dequeued"]["end"] <= by["lock wait"]["start"] + 1e-3
    assert by["lock wait"]["end"] <= by["lock held"]["start"] + 1e-3
    # The attempt's own span covers the work from the claim to the end.
    last = spans[-1] if spans[-1]["name"] in {"finished", "error"} else by["finished"]
    assert abs(last["start"] - by["dequeued"]["end"]) < 1e-3


def test_every_attempt_has_a_complete_ordered_trace(git_repo: GitRepo) -> None:
    submit_repository(url=str(git_repo.path))
    run_workers()
    sync = JobAttempt.objects.get(run__kind="sync")
    analyze = JobAttempt.objects.get(run__kind="analyze")
    # A span that begins with another and lasts longer (the lock held) comes first.
    assert names(sync) == ["queued", "dequeued", "lock wait", "lock held", "mirror fetch",
                           "rows write", "finished"]  # fmt: skip
    assert names(analyze) == ["queued", "dequeued", "lock wait", "lock held", "git stream",
                              "rows write", "finished"]  # fmt: skip
    for attempt in (sync, analyze):
        assert_well_formed(attempt)
        run = attempt.run
        by = {s["name"]: s for s in attempt.spans}
        assert by["dequeued"]["attrs"]["worker"] == attempt.worker
        assert by["dequeued"]["attrs"]["version"] == run.version[:12]
        assert by["queued"]["attrs"]["queue"] == run.queue
        wait = by["lock wait"]["attrs"]
        assert wait["key"] == run.lock_key and wait["token"] == run.token
        assert 2 <= wait["agreeing"] <= 3 and wait["wait_ms"] >= 0  # a quorum, at least
        assert by["lock held"]["attrs"]["token"] == run.token
        assert "stored 3 commits" in by["finished"]["attrs"]["result"] or run.kind == "sync"


def test_a_deferred_attempt_shows_the_refused_lock(git_repo: GitRepo) -> None:
    chunk = synced_chunk(git_repo)
    other = leases.redlock().acquire([chunk.lock_key()], ttl=30.0, holder={"worker": "x"})
    try:
        run_workers()
    finally:
        other.release()
    attempt = JobAttempt.objects.get(run__kind="analyze")
    assert attempt.outcome == "deferred"
    by = {s["name"]: s for s in attempt.spans}
    assert by["lock wait"]["attrs"] == {"key": chunk.lock_key(), "acquired": False}
    assert "lock held" not in by and by["finished"]["attrs"]["result"].startswith("deferred")


def test_a_failed_attempt_ends_with_its_error(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("GITWARD_FAILPOINTS", "analyze.parsing#poison=raise")
    submit_repository(url=str(make_repo(tmp_path, "poison").path))
    run_workers()
    attempts = list(JobAttempt.objects.filter(run__kind="analyze").order_by("number"))
    assert len(attempts) == 3
    for a in attempts:
        assert names(a)[-1] == "error" or "error" in names(a)
        err = next(s for s in a.spans if s["name"] == "error")
        assert err["attrs"]["error"].startswith("FailpointError")
        assert "lock held" in names(a)  # the failure happened under the lock, released after


def test_timeline_lays_spans_out_to_scale() -> None:
    spans = [
        {"name": "a", "start": 100.0, "end": 101.0, "attrs": {}},
        {"name": "b", "start": 101.0, "end": 104.0, "attrs": {}},
    ]
    t = timeline(spans)
    assert t["total_ms"] == 4000.0
    a, b = t["spans"]
    assert (a["left"], a["width"], a["ms"]) == (0.0, 25.0, 1000.0)
    assert (b["left"], b["width"], b["offset_ms"]) == (25.0, 75.0, 1000.0)
    assert timeline([]) == {"total_ms": 0.0, "start": None, "spans": []}


def test_the_run_page_and_the_api_show_the_trace(git_repo: GitRepo) -> None:
    submit_repository(url=str(git_repo.path))
    run_workers()
    run = JobRun.objects.get(kind="analyze")
    op = make_user("op", staff=True, perms=("view_jobrun",))
    c = Client()
    c.force_login(op)
    page = c.get(f"/runs/{run.pk}/")
    assert page.status_code == 200
    html = page.content.decode()
    for name in ANALYZE:
        assert f'data-span="{name}"' in html
    assert html.count("<rect ") == len(ANALYZE)
    assert trace_id_of(run.job_id) in html
    _, raw = ApiToken.issue(op)
    api = Client().get(f"/api/runs/{run.pk}", HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert api.status_code == 200
    body = api.json()
    assert body["trace_id"] == trace_id_of(run.job_id) and body["state"] == "succeeded"
    [attempt] = body["history"]
    assert [s["name"] for s in attempt["timeline"]["spans"]] == names(
        JobAttempt.objects.get(run=run)
    )
    assert all(
        0 <= s["left"] <= 100 and 0 < s["width"] <= 100 for s in attempt["timeline"]["spans"]
    )
    assert Client().get(f"/api/runs/{run.pk + 999}", HTTP_AUTHORIZATION=f"Bearer {raw}").json() == {
        "error": "run not found"
    }
    plain = make_user("plain")
    c.force_login(plain)
    assert c.get(f"/runs/{run.pk}/").status_code == 403
    _, plain_raw = ApiToken.issue(plain)
    res = Client().get(f"/api/runs/{run.pk}", HTTP_AUTHORIZATION=f"Bearer {plain_raw}")
    assert res.status_code == 403
    c.force_login(op)
    assert c.get(f"/runs/{run.pk + 999}/").status_code == 404


def test_job_log_lines_carry_the_trace_context(git_repo: GitRepo) -> None:
    lines: list[str] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(self.format(record))

    handler = Capture(level=logging.DEBUG)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    old = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        submit_repository(url=str(git_repo.path))
        run_workers()
    finally:
        root.removeHandler(handler)
        root.setLevel(old)
    run = JobRun.objects.get(kind="analyze")
    mine = [json.loads(line) for line in lines if trace_id_of(run.job_id) in line]
    assert mine, "no log line of the analyze job carried its trace id"
    for entry in mine:
        assert entry["job"] == run.job_id and entry["run"] == run.pk
        assert entry["repo"] == run.repository_id
    with_lock = [e for e in mine if "lock" in e]
    assert with_lock and all(
        e["token"] == run.token and e["lock"] == run.lock_key for e in with_lock
    )
    assert all(e["worker"] == run.worker for e in with_lock)
    assert Chunk.objects.get().state == "done"
    assert queues.queue(run.queue).count == 0


def test_runs_are_linked_from_the_repository_locks_and_workers_pages(git_repo: GitRepo) -> None:
    submit_repository(url=str(git_repo.path))
    run_workers()
    run = JobRun.objects.get(kind="analyze")
    op = make_user("op", staff=True, perms=("view_jobrun",))
    c = Client()
    c.force_login(op)
    repo_page = c.get(f"/repos/{run.repository_id}/").content.decode()
    assert f'href="/runs/{run.pk}/"' in repo_page
    assert c.get(f"/runs/job/{run.job_id}/").url == f"/runs/{run.pk}/"
    assert c.get("/runs/job/no-such-job/").status_code == 404
    # A job holding a lock and a worker busy with it: both tables link to the run.
    lock = leases.redlock().acquire(
        [run.lock_key], ttl=30.0, holder={"worker": "w1", "job": run.job_id}
    )
    WorkerBeat.objects.create(name="w1", host="h", pid=1, last_seen=timezone.now(), current_run=run)
    try:
        link = f'href="/runs/job/{run.job_id}/"'
        assert link in c.get("/locks/").content.decode()
        assert link in c.get("/workers/").content.decode()
    finally:
        lock.release()
    plain = make_user("plain")
    c.force_login(plain)
    assert f"/runs/{run.pk}/" not in c.get(f"/repos/{run.repository_id}/").content.decode()


def test_the_trace_id_follows_the_run_through_its_events(git_repo: GitRepo) -> None:
    tap = Tap()
    submit_repository(url=str(git_repo.path))
    run_workers()
    run = JobRun.objects.get(kind="analyze")
    events = tap.until(
        lambda evs: any(e["type"] == "job.succeeded" and e.get("run") == run.pk for e in evs)
    )
    mine = [e for e in events if e.get("run") == run.pk]
    # analysed by the sync's work horse (workers.jobs.sync_repository): never enqueued
    assert {e["type"] for e in mine} >= {"job.started", "job.succeeded"}
    assert "job.queued" not in {e["type"] for e in mine}
    assert {e["trace"] for e in mine} == {trace_id_of(run.job_id)}
