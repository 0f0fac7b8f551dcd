"""The dispatcher: which runs go to RQ now, which wait parked in the database, and in
which scheduling class each one is (docs/scheduling.md).

RQ queues are FIFO. So that one large history cannot make every other repository wait
for all its chunks, at most ``weight`` analyze runs of one repository wait in one RQ
queue at once (``GITWARD_FAIR_WEIGHT``, or the repository's ``fair_weight``); its
other runs stay ``queued`` with ``parked`` set, and one is released each time one of its
waiting runs is claimed by a worker (``runs.release_parked``), so it joins the tail of
the queue behind the other repositories' runs: round-robin across repositories. Running
runs do not count: the limit is on what waits, so a repository alone in the fleet still
keeps every worker busy.

The scheduling class (0 interactive, 1 scheduled refresh, 2 catch-up, 3 verification)
decides where a job enters its RQ queue (``infra.place``: behind the last job of its
class or a more urgent one), so a more urgent class is taken first and each class stays
FIFO, round-robin inside it.

The policy itself (``split``, ``rotation``) is pure, so tests can state its invariants
over any input; the functions below it read and write the rows.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Iterable, Sequence
from pathlib import PurePosixPath
from typing import Any, TypeVar
from urllib.parse import urlsplit

from django.conf import settings
from django.db import transaction

from dashboard.accounts import record_audit
from dashboard.models import FairGroup, JobRun, Repository

__all__ = [
    "CATCH_UP",
    "CLASS_NAMES",
    "INTERACTIVE",
    "REFRESH",
    "VERIFICATION",
    "admit",
    "express",
    "group_of",
    "group_weights",
    "parked_slots",
    "rotation",
    "run_class",
    "set_group_weight",
    "split",
    "take_parked",
    "waiting_count",
    "weight_of",
]

#: Scheduling classes, most urgent first (docs/scheduling.md#classes).
INTERACTIVE = 0
REFRESH = 1
CATCH_UP = 2
VERIFICATION = 3
CLASS_NAMES = {
    INTERACTIVE: "interactive",
    REFRESH: "refresh",
    CATCH_UP: "catch-up",
    VERIFICATION: "verification",
}

#: The states in which a run waits for an attempt (in RQ unless parked).
WAITING = (JobRun.State.QUEUED, JobRun.State.FAILED)

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)


# ---------------------------------------------------------------------------- policy (pure)


def split(waiting: int, weight: int, candidates: Sequence[T]) -> tuple[list[T], list[T]]:
    """``(to RQ, to park)`` for ``candidates`` (in order) of one repository and queue
    that already has ``waiting`` runs in RQ: the first ``weight - waiting`` go, the rest
    are parked. ``weight`` 0 is no limit. Order is kept in both lists."""
    if weight <= 0:
        return list(candidates), []
    free = max(0, weight - waiting)
    return list(candidates[:free]), list(candidates[free:])


def rotation(backlogs: dict[K, int], weights: dict[K, int], rounds: int) -> list[K]:
    """The order in which parked runs of several repositories (``backlogs``: parked runs
    per key) reach a FIFO queue in ``rounds`` rounds, each round every key with a
    backlog releasing up to its weight (keys in the order given): the prediction
    ``waiting.py`` gives a parked run's position from. Pure."""
    left = dict(backlogs)
    order: list[K] = []
    for _ in range(rounds):
        if not any(left.values()):
            break
        for key in backlogs:
            take = min(left[key], max(1, weights.get(key, 1)))
            order += [key] * take
            left[key] -= take
    return order


# ---------------------------------------------------------------------------- rows


def group_of(repo: Repository) -> str:
    """The repository's fairness group (docs/scheduling.md#group-weights): its
    ``fair_group`` when set, else the owner its URL names: ``host/owner`` for a remote
    (``github.com/pallets`` for ``https://github.com/pallets/flask.git``; the host alone
    for a URL without an owner), the parent directory for a local path."""
    if repo.fair_group:
        return str(repo.fair_group)
    url = str(repo.url)
    parts = urlsplit(url)
    if parts.scheme and parts.netloc:
        host, path = (parts.hostname or ""), parts.path
    elif ":" in url and not url.startswith("/"):  # scp-like: user@host:owner/name
        host, path = url.split(":", 1)
        host = host.rsplit("@", 1)[-1]
    else:
        return str(PurePosixPath(url).parent)
    segments = [seg for seg in path.split("/") if seg]
    return f"{host}/{segments[0]}" if len(segments) > 1 else host


def group_weights() -> dict[str, int]:
    """Every configured group's weight, by name."""
    return dict(FairGroup.objects.values_list("name", "weight"))


def weight_of(repo: Repository, groups: dict[str, int] | None = None) -> int:
    """How many of ``repo``'s analyze runs may wait in one RQ queue (0: no limit): its
    own ``fair_weight``, else its group's weight (``FairGroup``), else
    ``GITWARD_FAIR_WEIGHT``. ``groups`` (``group_weights()``) saves a query per call."""
    if repo.fair_weight is not None:
        return int(repo.fair_weight)
    name = group_of(repo)
    if groups is not None:
        weight = groups.get(name)
    else:
        weight = FairGroup.objects.filter(name=name).values_list("weight", flat=True).first()
    return int(settings.FAIR_WEIGHT if weight is None else weight)


def set_group_weight(name: str, weight: int | None, *, user: Any) -> str:
    """Set (``weight``) or remove (None) a group's weight; audited as
    ``fair_group.set`` / ``fair_group.cleared``. Returns what changed, one line.
    Raises ``ValueError`` for an empty name or a weight outside 0–1000.

    Takes effect at the next admission or release of the group's repositories (the
    share is read each time); runs already waiting in RQ stay where they are."""
    name = name.strip()
    if not name or len(name) > 200:
        raise ValueError("a group name is 1 to 200 characters")
    if weight is None:
        deleted, _ = FairGroup.objects.filter(name=name).delete()
        outcome = f"group {name}: weight cleared" if deleted else f"group {name}: no weight set"
        record_audit(user=user, action="fair_group.cleared", target=name, outcome=outcome)
        return outcome
    if not 0 <= int(weight) <= 1000:
        raise ValueError("a weight is 0 (no limit) to 1000")
    FairGroup.objects.update_or_create(name=name, defaults={"weight": int(weight)})
    outcome = f"group {name}: weight {int(weight)}"
    record_audit(user=user, action="fair_group.set", target=name, outcome=outcome)
    return outcome


def run_class(run: JobRun) -> int:
    """The run's scheduling class: an analyze run of another version than its
    repository's last plan (a ramping version's shadow chunk, a warm set) is
    verification; every other run is in its repository's class (``priority``, set by
    what started its generation)."""
    repo = run.repository
    if run.kind == JobRun.Kind.ANALYZE and run.fingerprint and run.fingerprint != repo.fingerprint:
        return VERIFICATION
    return int(repo.priority)


def express(run: JobRun) -> bool:
    """Whether the reserved interactive slot may take the run's job
    (docs/scheduling.md#the-reserved-interactive-slot): the run is interactive and its
    repository's known history is small (``GITWARD_INTERACTIVE_MAX_COMMITS``; 0, so
    small, before its first sync has counted it). A large backfill's chunks are not, so
    they never hold the slot, whatever their class."""
    if run_class(run) != INTERACTIVE:
        return False
    return int(run.repository.commits_total) <= int(settings.INTERACTIVE_MAX_COMMITS)


def waiting_count(repo_id: int, queue: str, *, exclude: Iterable[int] = ()) -> int:
    """Analyze runs of the repository in ``queue`` that wait and are not parked (in RQ,
    scheduled for a retry, or a sync's inline chunk not claimed yet)."""
    return (
        JobRun.objects.filter(
            repository_id=repo_id,
            queue=queue,
            kind=JobRun.Kind.ANALYZE,
            state__in=WAITING,
            parked=False,
        )
        .exclude(pk__in=list(exclude))
        .count()
    )


def admit(runs: Sequence[JobRun]) -> list[JobRun]:
    """Of ``runs`` (queued, about to be enqueued for their first dispatch), the ones to
    put in RQ now; the analyze runs beyond their repository's share are parked instead
    (their ``parked`` set in the database). Runs of other kinds all go.

    Race: two admissions or releases for one repository at once. Each locks the
    repository row first (``select_for_update``, what ``plan_repository`` locks too),
    so they count and mark one after the other; on SQLite the write lock serialises them.
    A count that is off anyway (a run claimed meanwhile) only lets one run more or fewer
    wait: the share is a target, never what keeps work from being lost."""
    go: list[JobRun] = [r for r in runs if r.kind != JobRun.Kind.ANALYZE]
    groups: dict[tuple[int, str], list[JobRun]] = defaultdict(list)
    for run in runs:
        if run.kind == JobRun.Kind.ANALYZE:
            groups[(run.repository_id, run.queue)].append(run)
    for (repo_id, queue), members in groups.items():
        with transaction.atomic():
            repo = Repository.objects.select_for_update().get(pk=repo_id)
            members.sort(key=lambda r: r.pk)
            waiting = waiting_count(repo_id, queue, exclude=[r.pk for r in members])
            now, later = split(waiting, weight_of(repo), members)
            if later:
                JobRun.objects.filter(
                    pk__in=[r.pk for r in later], state=JobRun.State.QUEUED
                ).update(parked=True)
            if now:
                JobRun.objects.filter(pk__in=[r.pk for r in now], parked=True).update(parked=False)
        go += now
    return go


def take_parked(repo_id: int, queue: str) -> list[JobRun]:
    """Unpark as many of the repository's parked runs in ``queue`` as its share has
    room for (oldest first) and return them, for the caller to enqueue.

    Crash safety: the unpark commits before the enqueue. A process that dies between
    the two leaves the run queued, unparked and without an RQ job, which the
    reconciler's step 2 enqueues like any run whose job is missing. A process that dies
    before this (a claim committed, its release never ran) leaves the runs parked with
    a free slot: the reconciler calls this for every such repository (``parked_slots``)."""
    with transaction.atomic():
        repo = Repository.objects.select_for_update().get(pk=repo_id)
        weight = weight_of(repo)
        parked = JobRun.objects.filter(
            repository_id=repo_id, queue=queue, state=JobRun.State.QUEUED, parked=True
        ).order_by("pk")
        if weight > 0:
            free = max(0, weight - waiting_count(repo_id, queue))
            if not free:
                return []
            parked = parked[:free]
        ids = list(parked.values_list("pk", flat=True))
        JobRun.objects.filter(pk__in=ids, state=JobRun.State.QUEUED, parked=True).update(
            parked=False
        )
    return list(JobRun.objects.filter(pk__in=ids).select_related("repository").order_by("pk"))


def parked_slots() -> list[tuple[int, str]]:
    """``(repository id, queue)`` of every repository with parked runs in a queue: the
    reconciler's safety net releases each (``take_parked`` releases nothing where the
    share is full)."""
    return sorted(
        set(
            JobRun.objects.filter(state=JobRun.State.QUEUED, parked=True).values_list(
                "repository_id", "queue"
            )
        )
    )
