"""Per-repository aggregates (DESIGN §3), computed in SQL and cached per fingerprint."""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Count, F, Max, Min, Sum
from django.db.models.functions import TruncWeek

from dashboard.models import Commit, FileChange, Repository, Summary

TOP = 10


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
        {"week": row["week"].date().isoformat(), "commits": row["commits"]}
        for row in commits.annotate(week=TruncWeek("authored_at"))
        .values("week")
        .annotate(commits=Count("id"))
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


def repository_summary(repo: Repository, fingerprint: str) -> dict[str, Any]:
    """Cached aggregates; recomputed when the number of stored commits changed.

    Race: two readers recompute at once; both write the same data, the unique
    (repository, fingerprint) constraint keeps one row, the loser updates it.
    """
    count = Commit.objects.filter(repository=repo, fingerprint=fingerprint).count()
    cached = Summary.objects.filter(repository=repo, fingerprint=fingerprint).first()
    if cached is not None and cached.commits == count:
        return dict(cached.data)
    data = compute_summary(repo, fingerprint)
    try:
        with transaction.atomic():
            Summary.objects.update_or_create(
                repository=repo,
                fingerprint=fingerprint,
                defaults={"commits": data["totals"]["commits"], "data": data},
            )
    except IntegrityError:
        pass
    return data
