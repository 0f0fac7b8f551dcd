"""The scheduled verifier and the integrity group (docs/analytics.md#verification).

Each ready repository gets a ``Verification`` row for the served analyzer fingerprint. A
reconciler round (``schedule_verifications``) enqueues a pass of every due one as a
low-priority job on the maintenance queue (``workers.jobs.verify_repository``): one job id
per repository, so never more than one pass in flight for it. The pass
(``run_verification``) is ``verify.verify_repository`` with ``GITWARD_VERIFY_SAMPLE``
commits; its result is recorded on the row: what was sampled, the head verified, each
mismatch naming its commit, path and field. A mismatch opens the row in the integrity
group (``open_mismatches``) and, with ``GITWARD_VERIFY_ON_MISMATCH=withhold``, withholds
that version's results (``withheld_reason``) until a re-analysis (a newer sync generation)
or an admin's audited ``clear_mismatch``."""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import F, Min, Q, Sum
from django.utils import timezone

from dashboard import infra, runs
from dashboard.accounts import record_audit
from dashboard.analytics.verify import CannotVerify, verify_repository
from dashboard.infra import publish_event
from dashboard.models import Repository, Verification
from dashboard.repositories import current_fingerprint, repository_status

__all__ = [
    "VERIFY_FUNC",
    "badge_text",
    "clear_mismatch",
    "job_id",
    "mismatch_marks_of",
    "mismatch_text",
    "open_mismatch_count",
    "open_mismatch_marks",
    "open_mismatches",
    "record_result",
    "run_verification",
    "schedule_verifications",
    "verification_metrics",
    "verification_status",
    "withheld_reason",
]

#: The RQ entry point of one pass (its dotted path is stored in Redis).
VERIFY_FUNC = "workers.jobs.verify_repository"

#: Mismatch entries kept on a row (the count is exact; the list is what the pages show).
KEPT = 50


def job_id(repo_id: int) -> str:
    """The one RQ job id of a repository's pass, whatever the fingerprint: at most one
    pass per repository is queued or running (``infra.enqueue_unique``)."""
    return f"verify-{repo_id}"


def _stale_after() -> timedelta:
    """A pass claimed longer ago than this lost its job (a worker killed with it, Redis
    flushed): the next round may enqueue it again."""
    return timedelta(seconds=2 * float(settings.JOB_TIMEOUT))


def schedule_verifications(*, now: datetime | None = None) -> dict[str, int]:
    """One round: give ready repositories without one a row for the served fingerprint
    (due at once), then enqueue at most ``GITWARD_VERIFY_BATCH`` due passes. A row is due
    when its ``next_at`` has come or its repository was re-analysed since its last pass
    (a newer generation), and no pass of it is in flight. Raises ``QueueUnavailable``
    while the queue server is unreachable (the claim is given back first).

    Race: two reconcilers run a round at once. Each claims a due row with a conditional
    UPDATE on the ``enqueued_at`` it read, so one of them enqueues it; and the job id is
    the repository's (``job_id``), enqueued with RQ's unique check-and-save, so even a
    claim taken over from a stale one cannot put a second pass of the repository in a
    queue while the first is queued or running."""
    if float(settings.VERIFY_INTERVAL) <= 0:
        return {"created": 0, "enqueued": 0}
    now = now or timezone.now()
    fp = current_fingerprint()
    batch = int(settings.VERIFY_BATCH)
    missing = (
        Repository.objects.filter(status=Repository.Status.READY)
        .exclude(pk__in=Verification.objects.filter(fingerprint=fp).values("repository_id"))
        .values_list("pk", flat=True)
    )
    created = 0
    for pk in list(missing[: batch * 10]):
        # get_or_create: a concurrent round creating the same row loses on the unique
        # (repository, fingerprint) constraint and reads the winner's row instead.
        created += Verification.objects.get_or_create(
            repository_id=pk, fingerprint=fp, defaults={"next_at": now}
        )[1]
    due = (
        Verification.objects.filter(fingerprint=fp, repository__status=Repository.Status.READY)
        .filter(Q(next_at__lte=now) | ~Q(generation=F("repository__generation")))
        .filter(Q(enqueued_at__isnull=True) | Q(enqueued_at__lt=now - _stale_after()))
        .order_by("next_at")
    )
    enqueued = 0
    q = infra.queue(infra.MAINTENANCE_QUEUE)
    for row in list(due[:batch]):
        if not Verification.objects.filter(pk=row.pk, enqueued_at=row.enqueued_at).update(
            enqueued_at=now
        ):
            continue  # another round claimed it
        try:
            if infra.enqueue_unique(
                q,
                VERIFY_FUNC,
                row.repository_id,
                fp,
                job_id=job_id(row.repository_id),
                priority=runs.VERIFICATION,  # the last class (docs/scheduling.md#classes)
            ):
                enqueued += 1
        except infra.QueueUnavailable:
            Verification.objects.filter(pk=row.pk, enqueued_at=now).update(enqueued_at=None)
            raise
    return {"created": created, "enqueued": enqueued}


def run_verification(repo_id: int, fingerprint: str) -> str:
    """One scheduled pass (the body of ``workers.jobs.verify_repository``): verify, then
    record the result and schedule the next pass. A repository that is gone, no longer
    ready, or was re-synced during the pass records nothing and is looked at again at
    the next round.

    Race: a sync started during the pass writes new commits while the pass counts the
    stored totals, which would differ from git's at the old head without anything being
    wrong. Every sync starts a new generation (``refresh_repository``'s UPDATE) before it
    writes a row, so a pass whose repository still has the generation and head it read
    at its start saw no write of a sync; one that does not is thrown away."""
    repo = Repository.objects.filter(pk=repo_id).first()
    row = Verification.objects.filter(repository_id=repo_id, fingerprint=fingerprint).first()
    if repo is None or row is None:
        return "nothing to verify: the repository or its schedule is gone"
    interval = timedelta(seconds=float(settings.VERIFY_INTERVAL) * random.uniform(0.9, 1.1))
    if repo.status != Repository.Status.READY:
        _release(row, next_at=timezone.now() + interval)
        return f"not verified: the repository is {repo.status}"
    generation, head = repo.generation, repo.head
    try:
        result = verify_repository(
            repo, sample=int(settings.VERIFY_SAMPLE), fingerprint=fingerprint
        )
    except CannotVerify as exc:
        _release(row, next_at=timezone.now() + interval)
        return f"not verified: {exc}"
    except BaseException:
        _release(row, next_at=row.next_at)
        raise
    now_repo = Repository.objects.filter(pk=repo_id).values("generation", "head", "status").first()
    if now_repo != {"generation": generation, "head": head, "status": Repository.Status.READY}:
        _release(row, next_at=timezone.now())
        return "not recorded: the repository was synced during the pass"
    saved = record_result(row, result, generation=generation, next_at=timezone.now() + interval)
    return str(verification_status_of(saved)["badge"])


def _release(row: Verification, *, next_at: datetime | None) -> None:
    Verification.objects.filter(pk=row.pk).update(enqueued_at=None, next_at=next_at)


def _entries(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The result's mismatches flattened to one entry per commit, path and field (the
    totals' as ``totals.<name>`` with no commit)."""
    out: list[dict[str, Any]] = []
    for m in result["mismatches"]:
        for f in m.get("fields") or [{"path": "", "field": "row", "git": m["git"],
                                      "stored": m["stored"]}]:  # fmt: skip
            out.append({"sha": m["sha"], **f})
    totals = result["totals"]
    if totals["git"] is not None:
        for name, stored in totals["stored"].items():
            if totals["git"][name] != stored:
                out.append({"sha": "", "path": "", "field": f"totals.{name}",
                            "git": totals["git"][name], "stored": stored})  # fmt: skip
    return out


def _key(entry: dict[str, Any]) -> str:
    return f"{entry['sha']}:{entry['path']}:{entry['field']}"


def record_result(
    row: Verification, result: dict[str, Any], *, generation: int, next_at: datetime | None
) -> Verification:
    """Store one pass's result on ``row`` (sampled, mismatches, the head verified), add
    to the running totals, end the claim and set the next time. Mismatches open the row
    in the integrity group, and withhold the results under the ``withhold`` policy; the
    same mismatches an admin cleared before stay cleared (only flagged)."""
    entries = _entries(result)
    commits = {e["sha"] for e in entries if e["sha"]}
    count = len(commits) + (1 if any(not e["sha"] for e in entries) else 0)
    accepted = row.state == Verification.State.CLEARED and {_key(e) for e in entries} <= set(
        row.accepted
    )
    if not entries:
        state = Verification.State.OK
    elif accepted:
        state = Verification.State.CLEARED
    else:
        state = Verification.State.MISMATCH
    withhold = state == Verification.State.MISMATCH and settings.VERIFY_ON_MISMATCH == "withhold"
    Verification.objects.filter(pk=row.pk).update(
        state=state,
        generation=generation,
        head=result["head"],
        sampled=result["sampled"],
        mismatch_count=count,
        mismatches=entries[:KEPT],
        totals=result["totals"],
        accepted=row.accepted if accepted else [],
        withheld=withhold,
        checked_at=timezone.now(),
        next_at=next_at,
        enqueued_at=None,
        sampled_total=F("sampled_total") + result["sampled"],
        mismatches_total=F("mismatches_total") + count,
    )
    row.refresh_from_db()
    _publish(row.repository_id)
    return row


def _publish(repo_id: int) -> None:
    """Tell the repository's watchers and the operators: the page swaps in its badge
    and results (withheld or served again), the live ops view its integrity count."""
    repo = Repository.objects.filter(pk=repo_id).first()
    if repo is not None:
        payload = {"repo": repo_id, **repository_status(repo), "integrity": True}
        publish_event("repo.changed", payload, repo_id=repo_id)


def _served_row(repo: Repository) -> Verification | None:
    return Verification.objects.filter(repository=repo, fingerprint=current_fingerprint()).first()


def withheld_reason(repo: Repository) -> str | None:
    """``results withheld: integrity mismatch in commit X`` while the served version's
    results of ``repo`` are withheld, else None. A newer sync generation than the one
    verified (a re-analysis) lifts it at once; its own pass may withhold again."""
    row = _served_row(repo)
    if row is None or not row.withheld or row.generation != repo.generation:
        return None
    return "results withheld: integrity mismatch " + mismatch_text(row.mismatches)


def mismatch_text(entries: list[dict[str, Any]]) -> str:
    """Where the first mismatch is: ``in commit X (added of path)``, ``in the totals (…)``."""
    first = entries[0] if entries else {"sha": "", "field": "", "path": ""}
    if not first["sha"]:
        return f"in the totals ({first['field'].removeprefix('totals.')})"
    what = f"{first['field']} of {first['path']}" if first["path"] else first["field"]
    return f"in commit {first['sha']} ({what})"


def _ago(seconds: float) -> str:
    if seconds < 60:
        return "just now"
    if seconds < 3600:
        return f"{int(seconds // 60)} min ago"
    if seconds < 86400:
        return f"{int(seconds // 3600)} h ago"
    return f"{int(seconds // 86400)} d ago"


def verification_status_of(row: Verification, repo: Repository | None = None) -> dict[str, Any]:
    """``row`` as the API's ``verification`` object (docs/api.md)."""
    age = (timezone.now() - row.checked_at).total_seconds() if row.checked_at else None
    withheld = row.withheld and (repo is None or row.generation == repo.generation)
    status = {
        "state": row.state,
        "fingerprint": row.fingerprint,
        "head": row.head or None,
        "sampled": row.sampled,
        "mismatches": row.mismatch_count,
        "details": row.mismatches[:20],
        "checked_at": row.checked_at.isoformat() if row.checked_at else None,
        "age_seconds": round(age, 1) if age is not None else None,
        "next_at": row.next_at.isoformat() if row.next_at else None,
        "in_flight": row.enqueued_at is not None,
        "withheld": withheld,
        "reason": ("results withheld: integrity mismatch " + mismatch_text(row.mismatches))
        if withheld
        else None,
        "cleared_by": row.cleared_by or None,
        "cleared_at": row.cleared_at.isoformat() if row.cleared_at else None,
        "policy": settings.VERIFY_ON_MISMATCH,
    }
    status["badge"] = badge_text(status)
    return status


def verification_status(
    repo: Repository, *, fingerprint: str | None = None
) -> dict[str, Any] | None:
    """The verification of ``repo`` under ``fingerprint`` (default: the served version),
    or None before its first row."""
    row = Verification.objects.filter(
        repository=repo, fingerprint=fingerprint or current_fingerprint()
    ).first()
    return None if row is None else verification_status_of(row, repo)


def badge_text(status: dict[str, Any] | None) -> str:
    """The badge line: ``verified: 500 commits sampled, 0 mismatches, 2 h ago``."""
    if status is None or status["checked_at"] is None:
        return "not verified yet"
    n, bad = status["sampled"], status["mismatches"]
    head = "verified" if status["state"] == Verification.State.OK else "integrity mismatch"
    if status["state"] == Verification.State.CLEARED:
        head = "verified (mismatch cleared)"
    return (
        f"{head}: {n} commit{'' if n == 1 else 's'} sampled, "
        f"{bad} mismatch{'' if bad == 1 else 'es'}, {_ago(status['age_seconds'])}"
    )


def open_mismatches(*, limit: int = 100) -> list[dict[str, Any]]:
    """The integrity group: every open mismatch (newest first), with its repository."""
    rows = (
        Verification.objects.filter(state=Verification.State.MISMATCH)
        .select_related("repository")
        .order_by("-checked_at", "-id")[:limit]
    )
    return [
        {
            "id": r.pk,
            "repository": {
                "id": r.repository_id,
                "name": r.repository.name,
                "url": r.repository.shown_url,
            },
            **verification_status_of(r, r.repository),
        }
        for r in rows
    ]


def open_mismatch_marks(*, limit: int = 50) -> list[list[Any]]:
    """What the live view compares to know the integrity group changed: ``[id,
    checked_at]`` of the newest ``limit`` open mismatches, in the order the Dead letters
    page shows them (``open_mismatches(limit=50)``). A new pass of an open row moves its
    ``checked_at``; a clear drops its row; a new mismatch adds one. JSON-safe: it rides
    in the operations snapshot (docs/live-view.md)."""
    rows = (
        Verification.objects.filter(state=Verification.State.MISMATCH)
        .order_by("-checked_at", "-id")
        .values_list("id", "checked_at")[:limit]
    )
    return [[pk, at.isoformat() if at else None] for pk, at in rows]


def mismatch_marks_of(rows: list[dict[str, Any]]) -> list[list[Any]]:
    """``open_mismatch_marks`` of rows ``open_mismatches`` returned: what the page was
    rendered from, to compare with a snapshot's."""
    return [[r["id"], r["checked_at"]] for r in rows]


def open_mismatch_count() -> int:
    """How many mismatches the integrity group holds (the live view's figure)."""
    return Verification.objects.filter(state=Verification.State.MISMATCH).count()


def clear_mismatch(verification_id: int, *, user: Any, reason: str | None = None) -> bool:
    """Close an open mismatch and serve its results again; audited. The mismatches it
    cleared are remembered: a later pass finding only those flags them without opening
    the group again; a new one opens it. False when it was not open.

    Race: two admins clear at once, or a pass records while an admin clears. The UPDATE
    is conditional on the state being ``mismatch``: one clear wins; a pass recorded
    first leaves either a new open mismatch (cleared now) or none (nothing to clear)."""
    row = Verification.objects.filter(pk=verification_id).select_related("repository").first()
    if row is None:
        return False
    actor = getattr(user, "username", None) or (user if isinstance(user, str) else "system")
    keys = [_key(e) for e in row.mismatches]
    cleared = Verification.objects.filter(
        pk=verification_id, state=Verification.State.MISMATCH
    ).update(
        state=Verification.State.CLEARED,
        withheld=False,
        cleared_by=str(actor)[:150],
        cleared_at=timezone.now(),
        accepted=keys,
    )
    if cleared:
        _publish(row.repository_id)
    record_audit(
        user=user,
        action="integrity.clear",
        target=f"repository {row.repository.name} (#{row.repository_id}), "
        f"version {row.fingerprint[:12]}",
        outcome=("cleared: " + mismatch_text(row.mismatches).removeprefix("in "))
        if cleared
        else "nothing to clear: no open mismatch",
        detail={"verification": row.pk, "mismatches": row.mismatches[:10]},
        reason=reason,
    )
    return bool(cleared)


def verification_metrics() -> dict[str, float]:
    """Figures for ``/metrics``: commits sampled and mismatches found (running totals),
    open mismatches, withheld versions, and the age of the stalest verification of a ready
    repository under the served version (0 when there is none)."""
    totals = Verification.objects.aggregate(
        sampled=Sum("sampled_total"), mismatches=Sum("mismatches_total")
    )
    fp = current_fingerprint()
    served = Verification.objects.filter(fingerprint=fp, repository__status=Repository.Status.READY)
    oldest = served.aggregate(oldest=Min("checked_at"))["oldest"]
    return {
        "sampled": float(totals["sampled"] or 0),
        "mismatches": float(totals["mismatches"] or 0),
        "open": float(open_mismatch_count()),
        "withheld": float(Verification.objects.filter(withheld=True).count()),
        "unverified": float(served.filter(checked_at__isnull=True).count()),
        "oldest_age": (timezone.now() - oldest).total_seconds() if oldest else 0.0,
    }
