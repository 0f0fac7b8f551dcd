"""Per-repository aggregates (docs/analysis.md#analysis-semantics), computed in SQL and
cached per fingerprint."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.db.models import CharField, Count, F, Func, Max, Min, Sum
from django.db.models.functions import TruncWeek
from django.utils import timezone

from dashboard.models import Commit, FileChange, Repository, Summary
from dashboard.repositories.commit_counts import pruned_commits, stored_commits

TOP = 10


def _week_start() -> Any:
    """The Monday (UTC) of each commit's week. On SQLite, date() arithmetic in SQL: Django's
    TruncWeek calls a Python function per row there (measured 8x slower at 100k rows)."""
    if connection.vendor == "sqlite":
        return Func(
            F("authored_at"),
            function="date",
            template="date(%(expressions)s, 'weekday 0', '-6 days')",
            output_field=CharField(),
        )
    return TruncWeek("authored_at")


def _week_iso(value: Any) -> str:
    return value if isinstance(value, str) else value.date().isoformat()


def compute_summary(repo: Repository, fingerprint: str) -> dict[str, Any]:
    commits = Commit.objects.filter(repository=repo, fingerprint=fingerprint)
    files = FileChange.objects.filter(repository=repo, fingerprint=fingerprint)
    totals = commits.aggregate(
        commits=Count("id"),
        insertions=Sum("insertions"),
        deletions=Sum("deletions"),
        first=Min("authored_at"),
        last=Max("authored_at"),
        authors=Count("author_canonical_email", distinct=True),
    )
    merges = commits.filter(is_merge=True).count()
    authors = list(
        commits.values("author_canonical_email")
        .annotate(
            name=Max("author_canonical_name"),
            commits=Count("id"),
            insertions=Sum("insertions"),
            deletions=Sum("deletions"),
        )
        .order_by("-commits", "author_canonical_email")[:TOP]
    )
    languages = list(
        files.exclude(language="")
        .values("language")
        .annotate(lines=Sum(F("added") + F("deleted")), files=Count("id"))
        .order_by("-lines", "language")[:TOP]
    )
    hotspots = list(
        files.values("path")
        .annotate(changes=Count("id"), lines=Sum(F("added") + F("deleted")))
        .order_by("-changes", "-lines", "path")[:TOP]
    )
    weekly = [
        {
            "week": _week_iso(row["week"]),
            "commits": row["commits"],
            "insertions": row["insertions"] or 0,
            "deletions": row["deletions"] or 0,
        }
        for row in commits.annotate(week=_week_start())
        .values("week")
        .annotate(commits=Count("id"), insertions=Sum("insertions"), deletions=Sum("deletions"))
        .order_by("week")
    ]
    return {
        "totals": {
            "commits": totals["commits"],
            "merges": merges,
            "authors": totals["authors"],
            "insertions": totals["insertions"] or 0,
            "deletions": totals["deletions"] or 0,
            "first_commit_at": totals["first"].isoformat() if totals["first"] else None,
            "last_commit_at": totals["last"].isoformat() if totals["last"] else None,
        },
        "authors": [
            {
                "name": a["name"],
                "email": a["author_canonical_email"],
                "commits": a["commits"],
                "insertions": a["insertions"] or 0,
                "deletions": a["deletions"] or 0,
            }
            for a in authors
        ],
        "languages": [
            {"language": x["language"], "lines": x["lines"] or 0, "files": x["files"]}
            for x in languages
        ],
        "hotspots": [
            {"path": h["path"], "changes": h["changes"], "lines": h["lines"] or 0} for h in hotspots
        ],
        "weekly": weekly,
    }


#: While a repository is being analysed its aggregates change with every chunk; pages
#: reuse a summary at most this old instead of recomputing on every load.
REFRESH_WHILE_ACTIVE = timedelta(seconds=15)


def repository_summary(
    repo: Repository, fingerprint: str, *, stored: int | None = None
) -> dict[str, Any]:
    """Cached aggregates; recomputed when the number of stored commits changed (the
    worker that finishes a repository computes them, so readers find them warm). That
    number is the kept count (``commit_counts``), or ``stored`` if the caller read it
    already for this request.

    A plan that deletes commits a rewrite dropped (``chunk_plans._drop_unreachable``)
    deletes the cached row in its transaction, so a count that is the same again after
    the rewrite never matches data of the old history.

    Race: two readers recompute at once; both write the same data, the unique
    (repository, fingerprint) constraint keeps one row, the loser updates it.

    Race: a prune commits while this reader computes, so what it computed may count
    dropped commits. The reader reads the prune counter before computing and writes
    only if it is unchanged, checked with the count's row locked until its write
    commits: a prune committed before that check is seen (nothing written), and one
    that commits after it waits for the lock and then deletes the row written.
    """
    count = stored_commits(repo.pk, fingerprint) if stored is None else stored
    cached = Summary.objects.filter(repository=repo, fingerprint=fingerprint).first()
    if cached is not None and cached.commits == count:
        return dict(cached.data)
    if (
        cached is not None
        and repo.is_active
        and (timezone.now() - cached.computed_at < REFRESH_WHILE_ACTIVE)
    ):
        return dict(cached.data)
    pruned = pruned_commits(repo.pk, fingerprint)
    data = compute_summary(repo, fingerprint)
    try:
        with transaction.atomic():
            if pruned_commits(repo.pk, fingerprint, lock=True) != pruned:
                return data  # computed across a prune: served once, never cached
            Summary.objects.update_or_create(
                repository=repo,
                fingerprint=fingerprint,
                defaults={"commits": data["totals"]["commits"], "data": data},
            )
    except IntegrityError:
        pass
    return data
