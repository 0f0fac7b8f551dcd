"""dashboard.runs.dispatch: the fairness policy as a pure function (Hypothesis over any
backlogs and weights), then parking and releasing against the real database and a real
Redis queue, and the reconciler's release of a share a crash left free."""

from __future__ import annotations

import math
from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dashboard.infra import queues
from dashboard.models import Chunk, JobRun, Repository
from dashboard.operations.reconciler import reconcile
from dashboard.runs import attempts, dispatch

# ---------------------------------------------------------------------------- pure policy


@given(
    waiting=st.integers(0, 10),
    weight=st.integers(0, 6),
    candidates=st.lists(st.integers(), max_size=30),
)
def test_split_sends_exactly_the_free_share_in_order_and_parks_the_rest(
    waiting: int, weight: int, candidates: list[int]
) -> None:
    now, later = dispatch.split(waiting, weight, candidates)
    assert now + later == candidates  # every candidate once, order kept
    if weight == 0:
        assert later == []  # no limit: FIFO
    else:
        assert len(now) == min(len(candidates), max(0, weight - waiting))
        # work-conserving: a run is parked only while the share is full
        assert not later or waiting + len(now) >= weight


def simulate(backlogs: dict[str, int], weights: dict[str, int]) -> list[str]:
    """One FIFO queue fed by the dispatcher's policy: every repository's runs admitted
    with ``split``, and each dispatch (a worker's claim) releasing its repository's next
    parked runs with ``split`` again. Returns the repositories in dispatch order."""
    queue: deque[str] = deque()
    parked = {}
    waiting = dict.fromkeys(backlogs, 0)
    for repo, n in backlogs.items():
        now, later = dispatch.split(0, weights[repo], list(range(n)))
        queue.extend([repo] * len(now))
        waiting[repo] = len(now)
        parked[repo] = later
    order = []
    while queue:
        repo = queue.popleft()
        order.append(repo)
        waiting[repo] -= 1
        now, parked[repo] = dispatch.split(waiting[repo], weights[repo], parked[repo])
        queue.extend([repo] * len(now))
        waiting[repo] += len(now)
    assert not any(parked.values())  # nothing left behind: the queue emptied last
    return order


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from("abcdefgh"),
        st.tuples(st.integers(1, 40), st.integers(1, 3)),
        min_size=1,
    )
)
def test_round_robin_bounds_every_repositorys_wait_by_its_own_work(
    repos: dict[str, tuple[int, int]],
) -> None:
    """However large one backlog is, repository r's k-th run is dispatched within
    ceil(k / w_r) rounds of the queue (at most W = sum of weights jobs each): its wait
    depends on its own work and the weights, never on another repository's backlog."""
    backlogs = {r: n for r, (n, _) in repos.items()}
    weights = {r: w for r, (_, w) in repos.items()}
    order = simulate(backlogs, weights)
    assert sorted(order) == sorted(r for r, n in backlogs.items() for _ in range(n))
    total = sum(weights.values())
    for repo in backlogs:
        positions = [i + 1 for i, r in enumerate(order) if r == repo]
        for k, position in enumerate(positions, start=1):
            assert position <= math.ceil(k / weights[repo]) * total, (repo, k, order)


def test_without_fairness_the_queue_is_fifo_and_a_backlog_blocks_everyone() -> None:
    order = simulate({"big": 50, "small": 2}, {"big": 0, "small": 0})
    assert order == ["big"] * 50 + ["small"] * 2  # the property above fails for "small"


def test_rotation_predicts_one_release_per_repository_per_round() -> None:
    order = dispatch.rotation({1: 3, 2: 1, 3: 2}, {1: 1, 2: 1, 3: 2}, rounds=3)
    assert order == [1, 2, 3, 3, 1, 1]


# ---------------------------------------------------------------------------- rows

pytestmark = pytest.mark.django_db(transaction=True)

QUEUE = "analysis"


def repo_with_runs(name: str, n: int, **fields: object) -> tuple[Repository, list[JobRun]]:
    repo = Repository.objects.create(url=f"https://example.com/team/{name}.git", **fields)
    runs = []
    for i in range(n):
        sha = f"{i + 1:040x}"
        chunk = Chunk.objects.create(repository=repo, key=sha, shas=sha, size=1)
        runs.append(
            attempts.ensure_run(
                kind=JobRun.Kind.ANALYZE,
                job_id=chunk.job_id(),
                queue=QUEUE,
                repository_id=repo.pk,
                chunk_id=chunk.pk,
            )
        )
    return repo, runs


def listed() -> list[str]:
    return queues.queue(QUEUE).get_job_ids()


def enqueue_all(runs: list[JobRun]) -> None:
    for run in dispatch.admit(runs):
        attempts.enqueue_run(run)


def test_admit_parks_what_is_beyond_the_share_and_a_claim_releases_the_next(settings) -> None:
    settings.FAIR_WEIGHT = 2
    _, runs = repo_with_runs("big", 5)
    enqueue_all(runs)
    assert listed() == [r.rq_id() for r in runs[:2]]
    assert list(JobRun.objects.order_by("pk").values_list("parked", flat=True)) == [
        False, False, True, True, True,
    ]  # fmt: skip
    attempt = attempts.begin_attempt(run_id=runs[0].pk, number=1, worker="w1")
    assert attempt is not None
    # The claim freed a place in the share: the oldest parked run joined the queue's tail.
    queues.queue(QUEUE).remove(runs[0].rq_id())  # what the worker's dequeue did
    assert listed() == [runs[1].rq_id(), runs[2].rq_id()]
    assert not JobRun.objects.get(pk=runs[2].pk).parked


def test_weight_zero_is_fifo_and_a_repositorys_own_weight_overrides_the_default(
    settings,
) -> None:
    settings.FAIR_WEIGHT = 0
    _, fifo = repo_with_runs("fifo", 4)
    enqueue_all(fifo)
    assert listed() == [r.rq_id() for r in fifo]
    _, own = repo_with_runs("own", 4, fair_weight=1)
    enqueue_all(own)
    assert listed() == [r.rq_id() for r in fifo] + [own[0].rq_id()]


def test_small_repositories_submitted_after_a_backlog_enter_the_queue_before_it(
    settings,
) -> None:
    settings.FAIR_WEIGHT = 1
    _, big = repo_with_runs("big", 30)
    enqueue_all(big)
    smalls = [repo_with_runs(f"s{i}", 2)[1] for i in range(3)]
    for runs in smalls:
        enqueue_all(runs)
    assert listed() == [big[0].rq_id()] + [runs[0].rq_id() for runs in smalls]


def test_the_reconciler_releases_a_share_a_crash_left_free(settings) -> None:
    """The claim committed and the process died before its release (the window that
    ``dispatch.release`` failpoint opens in tests/system/test_fairness.py): the
    repository's waiting runs ended, its parked ones stay parked with nothing to
    release them, until the reconciler's round does."""
    settings.FAIR_WEIGHT = 2
    _, runs = repo_with_runs("big", 6)
    enqueue_all(runs)
    for run in runs[:2]:  # claimed and finished; their releases were lost
        JobRun.objects.filter(pk=run.pk).update(state=JobRun.State.SUCCEEDED, attempts=1)
        queues.queue(QUEUE).remove(run.rq_id())
    assert listed() == []
    result = reconcile()
    assert result["released"] == 2
    assert listed() == [runs[2].rq_id(), runs[3].rq_id()]
    assert list(JobRun.objects.filter(parked=True).order_by("pk").values_list("pk", flat=True)) == [
        runs[4].pk,
        runs[5].pk,
    ]
    assert reconcile()["released"] == 0  # the share is full again: idempotent


def test_a_cancelled_waiting_run_frees_its_place_for_the_next(settings) -> None:
    from dashboard.runs.cancels import cancel_runs_matching

    settings.FAIR_WEIGHT = 1
    _, runs = repo_with_runs("big", 3)
    enqueue_all(runs)
    cancel_runs_matching(JobRun.objects.filter(pk=runs[0].pk), by="test")
    assert listed() == [runs[1].rq_id()]


def test_run_class_puts_another_versions_chunks_in_verification() -> None:
    _, runs = repo_with_runs("r", 1, fingerprint="a" * 16, priority=dispatch.REFRESH)
    JobRun.objects.filter(pk=runs[0].pk).update(fingerprint="a" * 16)
    run = JobRun.objects.select_related("repository").get(pk=runs[0].pk)
    assert dispatch.run_class(run) == dispatch.REFRESH
    run.fingerprint = "b" * 16
    assert dispatch.run_class(run) == dispatch.VERIFICATION


def test_only_small_interactive_runs_are_express_and_their_jobs_carry_the_mark(settings) -> None:
    """docs/scheduling.md#the-reserved-interactive-slot: a run is express when it is
    interactive and its repository's known history is at most
    ``GITWARD_INTERACTIVE_MAX_COMMITS``; ``enqueue_run`` marks its job so, and the
    reserved slot's take finds it behind a large backfill's interactive chunks."""
    settings.FAIR_WEIGHT = 0
    settings.INTERACTIVE_MAX_COMMITS = 100
    _, big = repo_with_runs("big", 3, commits_total=200_000)
    _, small = repo_with_runs("small", 1, commits_total=40)
    _, refresh = repo_with_runs("refreshed", 1, commits_total=40, priority=dispatch.REFRESH)
    _, new = repo_with_runs("new", 1)  # before its first sync: nothing counted yet
    loaded = lambda rs: [JobRun.objects.select_related("repository").get(pk=r.pk) for r in rs]  # noqa: E731
    assert [dispatch.express(r) for r in loaded(big + small + refresh + new)] == [
        False, False, False, True, False, True,
    ]  # fmt: skip
    enqueue_all(loaded(big + refresh + small + new))
    q = queues.queue(QUEUE)
    assert queues.take_express(q) == small[0].rq_id()
    assert queues.take_express(q) == new[0].rq_id()
    assert queues.take_express(q) is None
    assert listed() == [r.rq_id() for r in big + refresh]


def test_a_repositorys_group_is_its_own_name_or_the_owner_its_url_names() -> None:
    def group(url: str, fair_group: str = "") -> str:
        return dispatch.group_of(Repository(url=url, fair_group=fair_group))

    assert group("https://github.com/pallets/flask.git") == "github.com/pallets"
    assert group("https://user@git.example.com:8443/a/b/c.git") == "git.example.com/a"
    assert group("https://example.com/solo.git") == "example.com"
    assert group("git@github.com:pallets/flask.git") == "github.com/pallets"
    assert group("/srv/git/team/repo") == "/srv/git/team"
    assert group("https://github.com/pallets/flask.git", "batch") == "batch"


def test_a_groups_weight_applies_to_its_repositories_without_a_weight_of_their_own(
    settings,
) -> None:
    """docs/scheduling.md#group-weights: the repository's own weight, else its group's,
    else ``GITWARD_FAIR_WEIGHT``; admission parks by it."""
    settings.FAIR_WEIGHT = 1
    team, team_runs = repo_with_runs("a", 5)  # https://example.com/team/a.git
    own, own_runs = repo_with_runs("b", 5, fair_weight=2)
    other = Repository.objects.create(url="https://other.example.com/x/y.git")
    assert dispatch.group_of(team) == "example.com/team"
    assert dispatch.set_group_weight("example.com/team", 3, user="test") == (
        "group example.com/team: weight 3")  # fmt: skip
    assert [dispatch.weight_of(r) for r in (team, own, other)] == [3, 2, 1]
    assert dispatch.weight_of(team, dispatch.group_weights()) == 3
    enqueue_all(team_runs + own_runs)
    assert listed() == [r.rq_id() for r in team_runs[:3] + own_runs[:2]]
    assert JobRun.objects.filter(parked=True).count() == 2 + 3
    assert dispatch.set_group_weight("example.com/team", None, user="test").endswith("cleared")
    assert dispatch.weight_of(team) == 1
    from dashboard.models import AuditEntry

    assert list(AuditEntry.objects.order_by("pk").values_list("action", flat=True)) == [
        "fair_group.set", "fair_group.cleared"]  # fmt: skip
    for bad in [("", 1), ("g", -1), ("g", 1001), ("x" * 201, 1)]:
        with pytest.raises(ValueError):
            dispatch.set_group_weight(*bad, user="test")
