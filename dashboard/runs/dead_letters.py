"""The dead-letter queue: dead runs grouped by root cause; retry and discard.

Retry gives a run a fresh attempt budget and enqueues it; discard parks it for good.
Both are conditional UPDATEs from ``dead``, so retrying the same run twice (two
operators, a double click, two bulk actions) runs it once. Bulk actions over a group
or the whole queue run as a tracked background job (``BulkAction``), in batches.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import Count, Max, Min, QuerySet
from django.utils import timezone

from dashboard import infra
from dashboard.accounts import current_reason, record_audit
from dashboard.infra import publish_event
from dashboard.models import BulkAction, Chunk, JobAttempt, JobRun, Repository
from dashboard.runs import dead_letter_counts
from dashboard.runs.attempts import enqueue_or_leave, run_text_filter

BATCH = 500


def dead_runs() -> QuerySet[JobRun]:
    return JobRun.objects.filter(state=JobRun.State.DEAD)


def list_groups() -> list[dict[str, Any]]:
    """Dead letters by root cause, largest first (one aggregate query)."""
    rows = (
        dead_runs()
        .values("cause_key")
        .annotate(
            count=Count("id"),
            first_seen=Min("finished_at"),
            last_seen=Max("finished_at"),
            repositories=Count("repository", distinct=True),
            versions=Count("fingerprint", distinct=True),
            one=Min("id"),
        )
        .order_by("-count", "cause_key")
    )
    rows = list(rows)
    causes = _causes(rows)
    return [
        {
            "group": r["cause_key"],
            "cause": causes[r["cause_key"]],
            "count": r["count"],
            "first_seen": r["first_seen"].isoformat() if r["first_seen"] else None,
            "last_seen": r["last_seen"].isoformat() if r["last_seen"] else None,
            "repositories": r["repositories"],
            "versions": r["versions"],
        }
        for r in rows
    ]


def _causes(rows: list[dict[str, Any]]) -> dict[str, str]:
    """The cause text of each group: the same for the whole group, so read from one
    run per group (``one``, the group's lowest id, taken by the grouping query itself)
    instead of aggregating 100,000 long strings; one query by primary key per 1,000
    groups (it was one query per group)."""
    ids = [r["one"] for r in rows]
    by_id: dict[int, str] = {}
    for lo in range(0, len(ids), 1000):  # within any database's limit of bound parameters
        batch = JobRun.objects.filter(pk__in=ids[lo : lo + 1000]).values_list("pk", "cause")
        by_id.update(batch)
    return {r["cause_key"]: by_id.get(r["one"]) or "" for r in rows}


def group_runs(group: str, *, limit: int = 50) -> list[dict[str, Any]]:
    """The runs of one group with their attempt history (newest first)."""
    runs = list(
        dead_runs()
        .filter(cause_key=group)
        .select_related("repository")
        .order_by("-finished_at", "-id")[:limit]
    )
    attempts: dict[int, list[JobAttempt]] = {}
    for a in JobAttempt.objects.filter(run__in=runs).order_by("number"):
        attempts.setdefault(a.run_id, []).append(a)
    return [run_dict(r, attempts.get(r.pk, [])) for r in runs]


def run_dict(run: JobRun, attempts: list[JobAttempt] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": run.pk,
        "job_id": run.job_id,
        "kind": run.kind,
        "state": run.state,
        "repository": {"id": run.repository_id, "url": run.repository.shown_url},
        "chunk": run.chunk_id,
        "fingerprint": run.fingerprint,
        "attempts": run.attempts,
        "worker": run.worker,
        "error": run.error,
        "cause": run.cause,
        "group": run.cause_key,
        "finished_at": run.finished_at.isoformat() if run.finished_at else None,
    }
    if attempts is not None:
        out["history"] = [
            {
                "number": a.number,
                "outcome": a.outcome,
                "worker": a.worker,
                "host": a.host,
                "pid": a.pid,
                "version": a.version,
                "error": a.error,
                "traceback": a.traceback,
                "started_at": a.started_at.isoformat(),
                "finished_at": a.finished_at.isoformat() if a.finished_at else None,
            }
            for a in attempts
        ]
    return out


def _selected(selector: dict[str, Any]) -> QuerySet[JobRun]:
    qs = dead_runs()
    if selector.get("all"):
        return qs
    if selector.get("group"):
        return qs.filter(cause_key=str(selector["group"]))
    ids = [int(i) for i in selector.get("runs", [])]
    return qs.filter(pk__in=ids)


def retry_runs(run_ids: list[int]) -> int:
    """Give dead runs a fresh budget and enqueue them; returns how many moved.

    Race: two retries of the same run. The UPDATE filters on ``state = dead``; only one
    matches, and only the runs it moved (re-read by id and state) are enqueued.
    """
    with transaction.atomic():
        candidates = list(
            JobRun.objects.select_for_update()
            .filter(pk__in=run_ids, state=JobRun.State.DEAD)
            .values_list("pk", flat=True)
        )
        moved = []
        for pk in candidates:
            updated = JobRun.objects.filter(pk=pk, state=JobRun.State.DEAD).update(
                state=JobRun.State.QUEUED, budget_base=_attempts(pk), error="", finished_at=None
            )
            if updated:
                moved.append(pk)
        runs = list(JobRun.objects.filter(pk__in=moved).select_related("repository"))
        chunk_ids = [r.chunk_id for r in runs if r.chunk_id]
        Chunk.objects.filter(pk__in=chunk_ids, state=Chunk.State.FAILED).update(
            state=Chunk.State.QUEUED, error=""
        )
        # Only a run that could have failed its repository moves it (``_dead_letter``): a
        # sync, or a chunk of the repository's planned version; a canary's never did.
        repo_ids = {
            r.repository_id
            for r in runs
            if r.kind == JobRun.Kind.SYNC or r.fingerprint == r.repository.fingerprint
        }
        # A repository failed by a dead chunk is analysing again; one failed by a dead
        # sync is queued again (its sync run restarts the generation).
        Repository.objects.filter(pk__in=repo_ids, status=Repository.Status.FAILED).update(
            status=Repository.Status.ANALYZING, error="", updated_at=timezone.now()
        )
        for r in runs:
            if r.kind == JobRun.Kind.SYNC:
                Repository.objects.filter(pk=r.repository_id, generation=r.generation).update(
                    status=Repository.Status.QUEUED
                )
        transaction.on_commit(lambda: [enqueue_or_leave(r) for r in runs])
        dead_letter_counts.changed()
    return len(moved)


def _attempts(pk: int) -> int:
    return int(JobRun.objects.values_list("attempts", flat=True).get(pk=pk))


def discard_runs(run_ids: list[int]) -> int:
    discarded = JobRun.objects.filter(pk__in=run_ids, state=JobRun.State.DEAD).update(
        state=JobRun.State.DISCARDED
    )
    dead_letter_counts.changed()
    return int(discarded)


# ---------------------------------------------------------------------------- bulk


def new_bulk(*, kind: str, selector: dict[str, Any], actor: str) -> BulkAction:
    """Create a tracked bulk action over the dead letters ``selector`` picks (not yet
    run: ``start_bulk`` enqueues it, the CLI runs it inline with ``run_bulk``)."""
    if kind not in {"retry", "discard"}:
        raise ValueError("kind must be retry or discard")
    return BulkAction.objects.create(
        kind=kind, selector=selector, total=_selected(selector).count(), actor=actor
    )


def start_bulk(*, kind: str, selector: dict[str, Any], user: Any) -> BulkAction:
    """Create a tracked bulk action and enqueue it (never run inside a web request)."""
    actor = user if isinstance(user, str) else getattr(user, "username", "") or "system"
    if current_reason():  # the worker records the audit entry: the reason goes along
        selector = {**selector, "reason": current_reason()}
    action = new_bulk(kind=kind, selector=selector, actor=actor)

    def enqueue() -> None:
        try:
            infra.queue(infra.MAINTENANCE_QUEUE).enqueue(
                "workers.jobs.run_bulk_action",
                action.pk,
                job_id=f"bulk-{action.pk}",
                result_ttl=3600,
            )
        except infra.QueueUnavailable as exc:
            # Nothing ran: the action ends failed (not stuck queued) and can be redone.
            BulkAction.objects.filter(pk=action.pk).update(
                state=BulkAction.State.FAILED, error=str(exc)[:500]
            )
            action.state, action.error = BulkAction.State.FAILED, str(exc)[:500]

    transaction.on_commit(enqueue)
    return action


def run_bulk(action_id: int) -> BulkAction:
    """Apply a bulk action in batches, updating its progress after each batch.

    Works through ids greater than the last one handled, so it makes progress on
    100,000 dead letters in constant memory and can resume after a crash.
    """
    claimed = BulkAction.objects.filter(
        pk=action_id, state__in=[BulkAction.State.QUEUED, BulkAction.State.RUNNING]
    ).update(state=BulkAction.State.RUNNING)
    action = BulkAction.objects.get(pk=action_id)
    if not claimed:
        return action
    apply = retry_runs if action.kind == "retry" else discard_runs
    last = 0
    done = action.done
    try:
        while True:
            ids = list(
                _selected(action.selector)
                .filter(pk__gt=last)
                .order_by("pk")
                .values_list("pk", flat=True)[:BATCH]
            )
            if not ids:
                break
            done += apply(ids)
            last = ids[-1]
            BulkAction.objects.filter(pk=action_id).update(done=done)
            publish_event(
                "action.progress",
                {
                    "action": action_id,
                    "kind": action.kind,
                    "done": done,
                    "total": action.total,
                    "state": "running",
                },
            )
    except Exception as exc:
        BulkAction.objects.filter(pk=action_id).update(
            state=BulkAction.State.FAILED, error=str(exc)[:500], finished_at=timezone.now()
        )
        record_audit(
            user=action.actor,
            action=f"dlq.{action.kind}",
            target=_target(action),
            outcome=f"failed after {done}: {exc}",
            detail={"bulk": action.pk},
            reason=str(action.selector.get("reason", "")),
        )
        raise
    BulkAction.objects.filter(pk=action_id).update(
        state=BulkAction.State.DONE, done=done, finished_at=timezone.now()
    )
    publish_event(
        "action.progress",
        {
            "action": action_id,
            "kind": action.kind,
            "done": done,
            "total": action.total,
            "state": "done",
        },
    )
    publish_event("dlq.changed", {})
    record_audit(
        user=action.actor,
        action=f"dlq.{action.kind}",
        target=_target(action),
        outcome=f"{done} run{'' if done == 1 else 's'}",
        detail={"bulk": action.pk},
        reason=str(action.selector.get("reason", "")),
    )
    return BulkAction.objects.get(pk=action_id)


def _target(action: BulkAction) -> str:
    sel = action.selector
    if sel.get("all"):
        return "all dead letters"
    if sel.get("group"):
        return f"group {sel['group']}"
    return f"runs {sel.get('runs')}"


def act_now(*, kind: str, run_ids: list[int], user: Any) -> int:
    """Retry or discard a few named runs synchronously (a button on one row), audited."""
    apply = {"retry": retry_runs, "discard": discard_runs}[kind]
    moved = apply(run_ids)
    publish_event("dlq.changed", {})
    verb = "re-queued" if kind == "retry" else "discarded"
    record_audit(
        user=user,
        action=f"dlq.{kind}",
        target=f"runs {run_ids}",
        outcome=f"{moved} run{'' if moved == 1 else 's'} {verb}",
    )
    return moved


# ---------------------------------------------------------------------------- paging

GROUP_PAGE = 25


def matching_dead_runs(text: str = "") -> QuerySet[JobRun]:
    """Dead runs whose cause, error, job id or repository URL holds ``text``."""
    qs = dead_runs()
    if text_q := run_text_filter(text):
        qs = qs.filter(text_q)
    return qs


def group_page(*, text: str = "", page: int = 1, per_page: int = GROUP_PAGE) -> dict[str, Any]:
    """One page of dead-letter groups, largest first, filtered on the server by
    ``text`` (see ``matching_dead_runs``; counts are of the matching runs).

    Groups are aggregates ordered by size, so they page by offset: the aggregate is
    one query, and the cause text is read for the groups of this page only. Returns
    ``{groups, page, pages, group_count, dead, repositories}``.
    """
    runs = matching_dead_runs(text)
    totals = runs.aggregate(
        dead=Count("id"),
        repositories=Count("repository", distinct=True),
        groups=Count("cause_key", distinct=True),
    )
    pages = max(1, -(-totals["groups"] // per_page))
    page = max(1, min(page, pages))
    rows = list(
        runs.values("cause_key")
        .annotate(
            count=Count("id"),
            first_seen=Min("finished_at"),
            last_seen=Max("finished_at"),
            repositories=Count("repository", distinct=True),
            versions=Count("fingerprint", distinct=True),
            one=Min("id"),
        )
        .order_by("-count", "cause_key")[(page - 1) * per_page : page * per_page]
    )
    causes = _causes(rows)
    groups = [
        {
            "group": r["cause_key"],
            "cause": causes.get(r["cause_key"], ""),
            "count": r["count"],
            "first_seen": r["first_seen"],
            "last_seen": r["last_seen"],
            "repositories": r["repositories"],
            "versions": r["versions"],
        }
        for r in rows
    ]
    return {
        "groups": groups,
        "page": page,
        "pages": pages,
        "group_count": totals["groups"],
        "dead": totals["dead"],
        "repositories": totals["repositories"],
    }
