"""Repositories: submitting them, their status changes (claimed by a sync, completed),
and reading their state. Emits ``repo.changed`` (``publish_repo_changed``)."""

from __future__ import annotations

import functools
import ipaddress
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, F, Q, QuerySet
from django.utils import timezone

from dashboard import infra, runs
from dashboard.infra import publish_event
from dashboard.models import Chunk, CommitCount, JobRun, Repository
from dashboard.repositories.commit_counts import stored_commits, stored_commits_subquery
from dashboard.runs import enqueue_after_commit, ensure_run
from dashboard.versions import served_fingerprint
from workers.remotes import InvalidRemote, Remote, RemotePolicy, normalise_branch, parse_remote

__all__ = [
    "InvalidRemote",
    "claim_sync",
    "complete_repository",
    "current_fingerprint",
    "get_or_create_repository",
    "publish_repo_changed",
    "refresh_repository",
    "repository_status",
    "repository_with_status",
    "submit_repository",
]


def current_fingerprint() -> str:
    """The fingerprint readers are served (``versions.served_fingerprint``): the current
    analyzer version's. Read per call, so a promote or rollback shows at once."""
    return served_fingerprint()


def remote_policy() -> RemotePolicy:
    nets = tuple(ipaddress.ip_network(n, strict=False) for n in settings.ALLOWED_HOSTS_NETS)
    return RemotePolicy(
        local_roots=tuple(settings.LOCAL_ROOTS),
        allowed_nets=nets,
        resolve_hosts=settings.RESOLVE_HOSTS,
    )


def validate_remote(url: str) -> Remote:
    return parse_remote(url, remote_policy())


def get_or_create_repository(*, url: str, branch: str | None, user: Any) -> tuple[Repository, bool]:
    """Validate the remote (``InvalidRemote``), then get or create its row by normalised
    URL and branch; ``user`` is recorded as the submitter of a new one.

    Race: two identical submissions at once. ``get_or_create`` relies on the unique
    (url, branch) constraint, so both get the same row and ``created`` is true for one;
    what each caller does next (enqueue, re-analyse) keys on that."""
    remote = validate_remote(url)
    return Repository.objects.get_or_create(
        url=remote.url,
        branch=normalise_branch(branch),
        defaults={
            "fetch_url": remote.git_url(),
            "submitted_by": user if getattr(user, "pk", None) else None,
        },
    )


def submit_repository(
    *, url: str, branch: str | None = None, user: Any = None
) -> tuple[Repository, bool]:
    """Validate, get-or-create the repository, and enqueue its sync after commit.

    Returns ``(repository, created)``. Re-submitting a ready or failed repository starts
    a new sync generation (new commits are analysed; stored ones are not redone);
    re-submitting one that is still in progress changes nothing.

    Race: two identical submissions at once. ``get_or_create`` relies on the unique
    (url, branch) constraint, so both get the same row; only the creator enqueues. For a
    re-submission the state change is a conditional UPDATE (status ready/failed →
    queued, generation + 1) and only the caller whose UPDATE matched a row enqueues.
    The sync job id contains the generation, so even a repeated enqueue is one job.

    The write counts as express work while it runs (``infra.express_writing``): on
    SQLite a backfill's chunk begins no further write slice meanwhile, so a submission
    waits for one slice at most (docs/scheduling.md#bulk-writes-in-slices-on-sqlite).
    """
    with infra.express_writing("submit"), transaction.atomic():
        repo, created = get_or_create_repository(url=url, branch=branch, user=user)
        if not created:
            updated = Repository.objects.filter(
                pk=repo.pk, status__in=[Repository.Status.READY, Repository.Status.FAILED]
            ).update(
                status=Repository.Status.QUEUED,
                generation=F("generation") + 1,
                error="",
                priority=runs.INTERACTIVE,
                updated_at=timezone.now(),
            )
            repo.refresh_from_db()
            if not updated:
                return repo, False
        run = ensure_sync_run(repo)
        enqueue_after_commit([run.pk])
    return repo, created


def refresh_repository(*, repo_id: int, fingerprint: str, priority: int = runs.CATCH_UP) -> bool:
    """Start a new sync generation of a repository whose results under ``fingerprint``
    lag (a promote or rollback changed the served version); True if this call did.
    ``priority`` is the generation's scheduling class (docs/scheduling.md#classes): a
    catch-up's by default, a scheduled refresh or push passes ``runs.REFRESH``, a
    re-analyse click ``runs.INTERACTIVE``.

    Race: two catch-ups (or a catch-up and a user's re-submission) at once. The change
    is one conditional UPDATE — ready/failed, or analysing for another fingerprint
    (its open chunks are a closed version's, cancelled) — so exactly one caller moves
    the row to queued and enqueues; the others match nothing.
    """
    with transaction.atomic():
        updated = (
            Repository.objects.filter(pk=repo_id)
            .filter(
                Q(status__in=[Repository.Status.READY, Repository.Status.FAILED])
                | (Q(status=Repository.Status.ANALYZING) & ~Q(fingerprint=fingerprint))
            )
            .update(
                status=Repository.Status.QUEUED,
                generation=F("generation") + 1,
                error="",
                priority=priority,
                updated_at=timezone.now(),
            )
        )
        if not updated:
            return False
        repo = Repository.objects.get(pk=repo_id)
        enqueue_after_commit([ensure_sync_run(repo).pk])
    return True


def ensure_sync_run(repo: Repository) -> JobRun:
    return ensure_run(
        kind=JobRun.Kind.SYNC,
        job_id=repo.sync_job_id(),
        queue=infra.SYNC_QUEUE,
        repository_id=repo.pk,
        generation=repo.generation,
        fingerprint=current_fingerprint(),
    )


def claim_sync(*, repo_id: int, generation: int) -> Repository | None:
    """Move a queued (or already syncing) repository of this generation to syncing and
    return it; None if the job is of a superseded generation or the repository moved
    on, in which case the sync does nothing.

    Race: a re-submission bumps the generation at the same moment. Both are
    conditional UPDATEs on the row: either this one matches first (and the new
    generation's sync runs after it) or it matches nothing.
    """
    claimed = Repository.objects.filter(
        pk=repo_id,
        generation=generation,
        status__in=[Repository.Status.QUEUED, Repository.Status.SYNCING],
    ).update(status=Repository.Status.SYNCING, updated_at=timezone.now())
    if not claimed:
        return None
    return Repository.objects.get(pk=repo_id)


def complete_repository(*, repo_id: int, fingerprint: str) -> bool:
    """Mark the repository ready if no chunk of this fingerprint is open or failed.

    Race: the last two chunks finish at once. Each runs this after its own commit, with
    the repository row locked, so the later one always sees both chunks done. A sync
    planning new chunks holds the same row lock (``chunk_plans.plan_repository``), so a
    completion check never sees a half-written plan.
    """
    with transaction.atomic():
        repo = Repository.objects.select_for_update().filter(pk=repo_id).first()
        if repo is None or repo.status != Repository.Status.ANALYZING:
            return False
        if repo.fingerprint != fingerprint:
            return False
        chunks = Chunk.objects.filter(repository_id=repo_id, fingerprint=fingerprint)
        if chunks.filter(state__in=[Chunk.State.QUEUED, Chunk.State.RUNNING]).exists():
            return False
        now = timezone.now()
        failed = chunks.filter(state=Chunk.State.FAILED).first()
        if failed is not None:
            # Every chunk has ended and one is dead: the repository shows why.
            Repository.objects.filter(pk=repo_id).update(
                status=Repository.Status.FAILED, error=failed.error, updated_at=now
            )
            return False
        Repository.objects.filter(pk=repo_id).update(
            status=Repository.Status.READY, analyzed_at=now, updated_at=now, error=""
        )
        return True


def publish_repo_changed(repo_id: int) -> None:
    """The repository's status/progress changed: watchers and operators get its state."""
    repo = Repository.objects.filter(pk=repo_id).first()
    if repo is not None:
        publish_event("repo.changed", {"repo": repo_id, **repository_status(repo)}, repo_id=repo_id)


def resolve_repository(ref: str) -> Repository:
    """A repository by id or by URL (normalised); raises Repository.DoesNotExist."""
    ref = ref.strip()
    # ASCII digits only ("²" is a digit to isdigit, not to int), and an id fits 64 bits
    if ref.isascii() and ref.isdigit() and int(ref) < 2**62:
        return Repository.objects.get(pk=int(ref))
    try:
        url = validate_remote(ref).url
    except InvalidRemote:
        url = ref
    repo = Repository.objects.filter(Q(url=url) | Q(url=ref)).order_by("branch").first()
    if repo is None:
        raise Repository.DoesNotExist(f"no repository {ref!r}")
    return repo


def commits_analyzed(repo: Repository, fingerprint: str | None = None) -> int:
    """Commits stored under ``fingerprint`` (default: the served one): the kept count,
    one row read, never a ``COUNT(*)`` over the history
    (``dashboard.repositories.commit_counts``)."""
    return stored_commits(repo.pk, fingerprint or current_fingerprint())


def repository_status(repo: Repository) -> dict[str, Any]:
    """The API shape (docs/api.md) plus progress and chunk counts."""
    fp = current_fingerprint()
    analyzed = commits_analyzed(repo, fp)
    chunks = dict.fromkeys(Chunk.State.values, 0)
    for state, n in (
        Chunk.objects.filter(repository=repo, fingerprint=fp)
        .values_list("state")
        .annotate(n=Count("id"))
    ):
        chunks[state] = n
    return _status(repo, fp, analyzed, chunks)


def repository_with_status(
    repo_id: int, *, fingerprint: str | None = None
) -> tuple[Repository, dict[str, Any]] | None:
    """The row and its ``repository_status`` (under ``fingerprint``, default the served
    one) in ONE query besides the fingerprint's, for the repository page: the stored-
    commit count (``commit_counts``) and the chunk count of each state are scalar
    subqueries of the row's SELECT (was three queries: the row, the count, the chunks'
    GROUP BY). Raw SQL (``_status_sql``): the same SELECT through the ORM's
    ``Subquery``/``Coalesce`` cost more CPU to build and compile than the queries it
    replaced (SQLite, one-off timing with the fingerprint's query: ORM 3.1–3.6 ms, the
    separate queries 1.1–1.5 ms, this 0.4–0.5 ms). None when there is no such
    repository."""
    fp = fingerprint or current_fingerprint()
    states = Chunk.State.values
    params: list[Any] = [fp]
    for state in states:
        params += [fp, state]
    params.append(repo_id)
    found = list(Repository.objects.raw(_status_sql(connection.vendor), params))
    if not found:
        return None
    repo = found[0]
    chunks = {state: int(getattr(repo, f"chunks_{state}")) for state in states}
    return repo, _status(repo, fp, int(repo.n_analyzed), chunks)


@functools.cache
def _status_sql(vendor: str) -> str:
    """``repository_with_status``'s SELECT: identifiers from the models' metadata, every
    value a parameter (the fingerprint, then fingerprint and state per chunk state, then
    the id). Each subquery is one lookup in a unique or covering index (the kept count's
    (repository, fingerprint); the chunks' (repository, fingerprint, state)). ``vendor``
    keys the cache: identifier quoting is the connection's."""
    qn = connection.ops.quote_name
    pk = qn(Repository._meta.pk.column)
    repo_t, chunk_t, count_t = (qn(m._meta.db_table) for m in (Repository, Chunk, CommitCount))
    chunk_repo = qn(Chunk._meta.get_field("repository").column)
    count_repo = qn(CommitCount._meta.get_field("repository").column)
    fp_c, state_c, commits_c = qn("fingerprint"), qn("state"), qn("commits")
    per_state = "".join(
        f", (SELECT COUNT(*) FROM {chunk_t} c WHERE c.{chunk_repo} = r.{pk}"  # noqa: S608
        f" AND c.{fp_c} = %s AND c.{state_c} = %s) AS {qn('chunks_' + state)}"
        for state in Chunk.State.values
    )
    return (
        f"SELECT r.*, COALESCE((SELECT k.{commits_c} FROM {count_t} k"  # noqa: S608
        f" WHERE k.{count_repo} = r.{pk} AND k.{fp_c} = %s), 0) AS {qn('n_analyzed')}"
        f"{per_state} FROM {repo_t} r WHERE r.{pk} = %s"
    )


def _status(repo: Repository, fp: str, analyzed: int, chunks: dict[str, int]) -> dict[str, Any]:
    return {
        "id": repo.pk,
        "url": repo.shown_url,
        "name": repo.name,
        "branch": repo.branch,
        "status": repo.status,
        "head": repo.head or None,
        "commits_total": repo.commits_total,
        "commits_analyzed": analyzed,
        "progress": _progress(repo, fp, analyzed),
        "chunks": chunks,
        "fingerprint": fp,
        "error": repo.error or None,
        "created_at": repo.created_at.isoformat(),
        "analyzed_at": repo.analyzed_at.isoformat() if repo.analyzed_at else None,
    }


# ---------------------------------------------------------------------------- listing

LIST_PAGE = 50


def _progress(repo: Repository, fingerprint: str, analyzed: int) -> float:
    """Percent of the repository's commits stored under the served ``fingerprint``.
    "ready" means 100 % only for the version it was analysed under: after a promote a
    repository is ready under the previous version until the catch-up re-analyses it."""
    if repo.status == Repository.Status.READY and repo.fingerprint == fingerprint:
        return 100.0
    if repo.commits_total:
        return round(min(100.0, 100.0 * analyzed / repo.commits_total), 1)
    return 0.0


def repository_rows(
    repos: QuerySet[Repository], *, limit: int | None = None
) -> list[dict[str, Any]]:
    """The list shape (``repository_status`` without chunk counts) of these
    repositories in ONE query: the analysed-commit count is a subquery reading the
    kept count's row (``commit_counts``), not a query per row nor a count of commits."""
    fp = current_fingerprint()
    annotated = repos.annotate(n_analyzed=stored_commits_subquery(fp))
    if limit is not None:
        annotated = annotated[:limit]
    return [
        {
            "id": r.pk,
            "url": r.shown_url,
            "name": r.name,
            "branch": r.branch,
            "status": r.status,
            "head": r.head or None,
            "commits_total": r.commits_total,
            "commits_analyzed": r.n_analyzed,
            "progress": _progress(r, fp, r.n_analyzed),
            "error": r.error or None,
            "repo": r,
        }
        for r in annotated
    ]


def repository_list(
    *, text: str = "", status: str = "", before: int | None = None, limit: int = LIST_PAGE
) -> tuple[list[dict[str, Any]], int | None]:
    """A page of repositories, newest first (keyset on the id: ``before`` is the id of
    the last row of the previous page), searched by URL and filtered by status.
    Returns the rows and the next cursor (None at the end). One query."""
    qs = Repository.objects.order_by("-id")
    if text.strip():
        qs = qs.filter(url__icontains=text.strip()[:200])
    if status:
        qs = qs.filter(status=status)
    if before is not None:
        qs = qs.filter(pk__lt=before)
    rows = repository_rows(qs, limit=limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    return rows, (rows[-1]["id"] if more and rows else None)
