"""dashboard.runs.waiting: every waiting run's position equals the place the real queue
then hands it out at (drained by claims, as workers do), the ETA is position over the
queue's measured throughput, and each reason names what really holds the run."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from dashboard.infra import queues
from dashboard.models import JobRun, Repository
from dashboard.runs import attempts, dispatch, waiting
from tests.dashboard.runs.test_dispatch import QUEUE, enqueue_all, listed, repo_with_runs

pytestmark = pytest.mark.django_db(transaction=True)


def answer(run: JobRun) -> dict[str, object]:
    found = waiting.run_waiting(JobRun.objects.select_related("repository").get(pk=run.pk))
    assert found is not None
    return found


def drain_by_claims() -> list[int]:
    """Take the queue's head and claim it (which releases the next parked run), as a
    worker does, until the queue is empty; the run ids in the order handed out."""
    conn = queues.connection()
    key = queues.queue(QUEUE).key
    order = []
    while (raw := conn.lpop(key)) is not None:
        job = raw.decode()
        run = JobRun.objects.get(job_id=job.rsplit("-a", 1)[0])
        assert attempts.begin_attempt(run_id=run.pk, number=1, worker="w1") is not None
        order.append(run.pk)
    return order


@pytest.mark.parametrize("weight", [1, 2])
def test_every_position_is_where_the_queue_really_hands_the_run_out(settings, weight) -> None:
    settings.FAIR_WEIGHT = weight
    _, big = repo_with_runs("big", 7)
    _, other = repo_with_runs("other", 4)
    _, small = repo_with_runs("small", 1)
    for runs in (big, other, small):
        enqueue_all(runs)
    everyone = big + other + small
    predicted = {run.pk: answer(run)["position"] for run in everyone}
    actual = {pk: i + 1 for i, pk in enumerate(drain_by_claims())}
    assert predicted == actual


def test_reasons_name_the_repositories_ahead_and_the_share_in_use(settings) -> None:
    settings.FAIR_WEIGHT = 2
    _, big = repo_with_runs("big", 4)
    _, small = repo_with_runs("small", 1)
    enqueue_all(big)
    enqueue_all(small)
    assert listed() == [big[0].rq_id(), big[1].rq_id(), small[0].rq_id()]
    head = answer(big[0])
    assert head["position"] == 1 and head["reason"] == "next in its class (interactive)"
    assert answer(small[0])["reason"] == "behind 1 repository in its class (interactive)"
    parked = answer(big[3])
    assert parked["position"] == 5
    assert parked["reason"] == (
        "fair share: 2 of its repository's runs already wait in analysis (weight 2); "
        "1 of its runs before it; behind 1 repository in its class (interactive)"
    )


def test_a_more_urgent_class_ahead_is_named_and_counted(settings) -> None:
    settings.FAIR_WEIGHT = 2
    _, refresh = repo_with_runs("scheduled", 1, priority=dispatch.REFRESH)
    _, mine = repo_with_runs("clicked", 1)
    enqueue_all(refresh)
    enqueue_all(mine)
    assert listed() == [mine[0].rq_id(), refresh[0].rq_id()]  # placed ahead of the refresh
    behind = answer(refresh[0])
    assert behind["position"] == 2 and behind["class"] == "refresh"
    assert behind["reason"] == "behind 1 more urgent job"


def test_eta_is_position_over_the_measured_throughput(settings) -> None:
    settings.FAIR_WEIGHT = 2
    _, runs = repo_with_runs("big", 3)
    enqueue_all(runs)
    assert answer(runs[0])["eta_seconds"] is None  # nothing finished: no estimate
    _, done = repo_with_runs("done", 30)
    JobRun.objects.filter(pk__in=[r.pk for r in done]).update(
        state=JobRun.State.SUCCEEDED, finished_at=timezone.now() - timedelta(seconds=5)
    )
    rate = 30 / waiting.THROUGHPUT_WINDOW
    assert answer(runs[1])["eta_seconds"] == round(2 / rate, 1)


def test_a_scheduled_retry_and_a_paused_queue_say_so(settings) -> None:
    settings.FAIR_WEIGHT = 2
    _, runs = repo_with_runs("r", 1)
    run = JobRun.objects.select_related("repository").get(pk=runs[0].pk)
    attempts.enqueue_run(run, delay=60)
    found = answer(run)
    assert found["position"] is None
    assert 55 <= found["eta_seconds"] <= 60
    assert found["reason"].startswith("next attempt in ")
    queues.set_paused(QUEUE, True)
    assert answer(run)["reason"].startswith(f"queue {QUEUE} is paused; ")


def test_a_reason_provider_appended_to_the_list_is_asked(settings, monkeypatch) -> None:
    """The hook other holds (per-host fetch limits) add their sentence through."""
    _, runs = repo_with_runs("r", 1)
    enqueue_all(runs)
    providers = [*waiting.REASON_PROVIDERS, lambda ctx: f"host limit for run {ctx.run.pk}"]
    monkeypatch.setattr(waiting, "REASON_PROVIDERS", providers)
    assert answer(runs[0])["reason"].endswith(f"; host limit for run {runs[0].pk}")


def test_a_repository_in_progress_shows_its_first_run_and_its_last_ones_eta(settings) -> None:
    settings.FAIR_WEIGHT = 1
    _, first = repo_with_runs("first", 2)
    repo, runs = repo_with_runs("second", 3, status=Repository.Status.ANALYZING)
    enqueue_all(first)
    enqueue_all(runs)
    found = waiting.repository_waiting(repo)
    assert found is not None
    assert found["position"] == 2  # behind "first"'s one run in RQ
    assert found["reason"] == (
        "behind 1 repository in its class (interactive); 2 more of its runs parked"
    )
    Repository.objects.filter(pk=repo.pk).update(status=Repository.Status.READY)
    repo.refresh_from_db()
    assert waiting.repository_waiting(repo) is None


def test_a_run_deferred_behind_a_lock_names_the_run_holding_it(settings, healthy_masters) -> None:
    """The run's last attempt was deferred (another job holds its chunk's lock) and its
    next attempt is scheduled: the reason names the holder's run and the lease left."""
    from dashboard.locks import redlock

    _, runs = repo_with_runs("r", 1)
    _, others = repo_with_runs("holder", 1)
    run = JobRun.objects.select_related("repository", "chunk").get(pk=runs[0].pk)
    attempt = attempts.begin_attempt(run_id=run.pk, number=1, worker="w1")
    assert attempt is not None
    lock = redlock().acquire([run.chunk.lock_key()], ttl=30.0,
                             holder={"job": others[0].rq_id(), "worker": "w2"})  # fmt: skip
    try:
        assert attempts.defer_attempt(attempt, delay=20.0, reason="lock held")
        run = JobRun.objects.select_related("repository", "chunk").get(pk=run.pk)
        found = waiting.run_waiting(run)
        assert found is not None and found["position"] is None
        reason = str(found["reason"])
        assert reason.startswith(f"lock held by run {others[0].pk}, "), reason
        assert reason.split(", ")[1].split(" s left")[0] in {"28", "29", "30"}
    finally:
        lock.release()


def test_a_chunk_on_its_mirror_hosts_queue_says_where_not_that_it_is_missing(settings) -> None:
    """docs/scheduling.md#mirror-affinity: the run is in no shared list, but it is not lost;
    the answer names the worker host's queue and drops the "not in its queue" sentence."""
    from dashboard.runs import affinity
    from tests.dashboard.runs.test_attempts import a_chunk_run, a_repo

    settings.AFFINITY_WAIT = 10.0  # the harness turns affinity off
    repo = a_repo()
    run = a_chunk_run(repo)
    affinity.record_mirror(repo.pk, "h1")
    affinity.beat_host("h1")
    assert attempts.enqueue_run(run)
    reason = str(answer(run)["reason"])
    assert reason.startswith("on worker host h1's queue (it holds the mirror); any host from ")
    assert "not in its queue yet" not in reason
    assert affinity.move_overdue([run.queue], wait=0) == 1  # now on the shared queue
    assert "on worker host" not in str(answer(run)["reason"])


def test_a_sync_held_by_its_git_hosts_limit_names_the_limit(settings) -> None:
    """docs/scheduling.md#per-host-fetch-limits, through the run's waiting answer."""
    from dashboard.runs import fetch_limits
    from tests.dashboard.runs.test_attempts import a_sync_run
    from workers.git import HostLimit

    settings.FETCH_LIMITS = {"github.com": HostLimit(concurrency=1)}
    repo = Repository.objects.create(url="https://github.com/team/tool")
    run = a_sync_run(repo)
    assert attempts.enqueue_run(run)
    assert "host limit" not in str(answer(run)["reason"])
    with fetch_limits.fetch_gate().slot("github.com"):
        assert str(answer(run)["reason"]).endswith("host limit github.com 1/1")
