"""dashboard.runs.dead_letters: grouping dead runs by root cause, retry and discard (once
each, however often asked), and tracked bulk actions in batches — real DB and Redis."""

from __future__ import annotations

import pytest
from django.utils import timezone

from dashboard.infra import queues
from dashboard.models import AuditEntry, BulkAction, Chunk, JobRun, Repository
from dashboard.runs import dead_letters
from tests.support.live_tap import Tap

pytestmark = pytest.mark.django_db(transaction=True)


def dead_runs(n: int, *, cause: str = "c1", kind: str = JobRun.Kind.ANALYZE) -> list[JobRun]:
    repo = Repository.objects.create(
        url=f"https://example.com/t/{cause}-{n}.git", status=Repository.Status.FAILED
    )
    out = []
    for i in range(n):
        chunk = Chunk.objects.create(
            repository=repo,
            fingerprint="f" * 16,
            key=f"{i:04x}aaaa",
            shas="x",
            size=1,
            state=Chunk.State.FAILED,
            error="boom",
        )
        out.append(
            JobRun.objects.create(
                job_id=f"job-{cause}-{i}",
                kind=kind,
                queue="analysis",
                repository=repo,
                chunk=chunk if kind == JobRun.Kind.ANALYZE else None,
                state=JobRun.State.DEAD,
                attempts=3,
                cause_key=cause,
                cause=f"Error {cause}",
                finished_at=timezone.now(),
            )
        )
    return out


def test_dead_letters_are_grouped_by_cause_largest_first() -> None:
    dead_runs(3, cause="aaa")
    dead_runs(1, cause="bbb")
    groups = dead_letters.list_groups()
    assert [(g["group"], g["count"], g["cause"]) for g in groups] == [
        ("aaa", 3, "Error aaa"),
        ("bbb", 1, "Error bbb"),
    ]
    assert groups[0]["repositories"] == 1
    (run, *_) = dead_letters.group_runs("aaa")
    assert run["group"] == "aaa" and run["history"] == []


def test_a_retry_moves_a_dead_run_once_and_reopens_its_chunk_and_repository() -> None:
    (run,) = dead_runs(1)
    assert dead_letters.retry_runs([run.pk]) == 1
    assert dead_letters.retry_runs([run.pk]) == 0  # a double click
    run.refresh_from_db()
    assert run.state == JobRun.State.QUEUED and run.budget_used == 0
    assert Chunk.objects.get(pk=run.chunk_id).state == Chunk.State.QUEUED
    assert Repository.objects.get().status == Repository.Status.ANALYZING
    assert queues.queue("analysis").job_ids == [run.rq_id()]


def test_retrying_another_versions_dead_chunk_leaves_its_failed_repository_alone() -> None:
    """The repository failed for its own (served) chunk; a canary's dead chunk never
    failed it (docs/lifecycle.md#statuses), so retrying that one does not reopen it."""
    (run,) = dead_runs(1)
    Repository.objects.update(fingerprint="s" * 16)
    JobRun.objects.filter(pk=run.pk).update(fingerprint="c" * 16)
    assert dead_letters.retry_runs([run.pk]) == 1
    assert Chunk.objects.get(pk=run.chunk_id).state == Chunk.State.QUEUED
    assert Repository.objects.get().status == Repository.Status.FAILED


def test_retrying_a_dead_sync_queues_its_repository_again() -> None:
    (run,) = dead_runs(1, kind=JobRun.Kind.SYNC)
    JobRun.objects.filter(pk=run.pk).update(generation=1)
    dead_letters.retry_runs([run.pk])
    assert Repository.objects.get().status == Repository.Status.QUEUED


def test_discard_parks_dead_runs_for_good() -> None:
    runs = dead_runs(2)
    assert dead_letters.discard_runs([r.pk for r in runs]) == 2
    assert dead_letters.retry_runs([r.pk for r in runs]) == 0
    assert dead_letters.list_groups() == []


def test_a_bulk_action_works_in_batches_reports_progress_and_is_audited(monkeypatch) -> None:
    monkeypatch.setattr(dead_letters, "BATCH", 2)
    dead_runs(5, cause="aaa")
    dead_runs(1, cause="bbb")
    action = dead_letters.new_bulk(kind="retry", selector={"group": "aaa"}, actor="ops")
    assert action.total == 5
    tap = Tap()
    done = dead_letters.run_bulk(action.pk)
    assert done.state == BulkAction.State.DONE and done.done == 5
    assert JobRun.objects.filter(state=JobRun.State.DEAD).count() == 1  # group bbb
    events = tap.until(lambda evs: any(e["type"] == "dlq.changed" for e in evs))
    progress = [e["done"] for e in events if e["type"] == "action.progress"]
    assert progress == [2, 4, 5, 5]  # three batches, then "done"
    entry = AuditEntry.objects.get(action="dlq.retry")
    assert entry.actor == "ops" and entry.outcome == "5 runs" and entry.target == "group aaa"
    # Run again (a redelivered job): the action is done, nothing moves twice.
    assert dead_letters.run_bulk(action.pk).done == 5


def test_a_bulk_action_is_enqueued_on_the_maintenance_queue() -> None:
    dead_runs(1)
    action = dead_letters.start_bulk(kind="discard", selector={"all": True}, user="ops")
    (job,) = queues.queue(queues.MAINTENANCE_QUEUE).jobs
    assert job.func_name == "workers.jobs.run_bulk_action" and job.args == (action.pk,)
    with pytest.raises(ValueError):
        dead_letters.new_bulk(kind="explode", selector={"all": True}, actor="ops")


def test_acting_on_named_runs_now_is_audited() -> None:
    runs = dead_runs(2)
    assert dead_letters.act_now(kind="discard", run_ids=[runs[0].pk], user="ops") == 1
    entry = AuditEntry.objects.get(action="dlq.discard")
    assert entry.outcome == "1 run discarded"
    assert JobRun.objects.get(pk=runs[1].pk).state == JobRun.State.DEAD
