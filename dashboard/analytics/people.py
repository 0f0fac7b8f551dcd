"""Per-author and per-file views inside a window (docs/analytics.md#authors-and-files): the
authors of a repository with their commits and lines; one author's activity per week, files
and languages; one file's history, authors, churn and coupled files. Non-merge commits, as
everywhere in the analytics; authors by canonical (``.mailmap``) email."""

from __future__ import annotations

from typing import Any

from django.db import connection

from dashboard.analytics.coupling import Thresholds, coupled_with
from dashboard.analytics.rows import Scope, as_instant, fetch
from dashboard.models import Commit, FileChange

_C = Commit._meta.db_table
_F = FileChange._meta.db_table


def _week() -> str:
    """The Monday (UTC) of a commit's committer date, as ``YYYY-MM-DD`` text."""
    if connection.vendor == "sqlite":
        return "date(c.committed_at, 'weekday 0', '-6 days')"
    return "to_char(date_trunc('week', c.committed_at AT TIME ZONE 'UTC'), 'YYYY-MM-DD')"


def authors(scope: Scope, *, limit: int = 100) -> list[dict[str, Any]]:
    """The window's authors, most commits first: commits, lines, files, first and last commit."""
    where, params = scope.commit_filter()
    found = fetch(
        "SELECT c.author_canonical_email, MAX(c.author_canonical_name), COUNT(*), "  # noqa: S608
        "SUM(c.insertions), SUM(c.deletions), MIN(c.committed_at), MAX(c.committed_at) "
        f"FROM {_C} c WHERE {where} GROUP BY c.author_canonical_email "
        "ORDER BY COUNT(*) DESC, c.author_canonical_email LIMIT %s",
        [*params, limit],
    )
    return [
        {
            "author": email,
            "name": name,
            "commits": int(n),
            "insertions": int(ins or 0),
            "deletions": int(dels or 0),
            "first_commit_at": as_instant(first).isoformat(),
            "last_commit_at": as_instant(last).isoformat(),
        }
        for email, name, n, ins, dels, first, last in found
    ]


def author_activity(scope: Scope, author: str, *, limit: int = 100) -> dict[str, Any] | None:
    """One author's commits and lines per week, their most changed files and their
    languages inside the window; None when they made no commit there."""
    where, params = scope.commit_filter()
    where += " AND c.author_canonical_email = %s"
    params = [*params, author]
    (row,) = fetch(
        "SELECT MAX(c.author_canonical_name), COUNT(*), SUM(c.insertions), "  # noqa: S608
        f"SUM(c.deletions), MIN(c.committed_at), MAX(c.committed_at) FROM {_C} c WHERE {where}",
        params,
    )
    name, n, ins, dels, first, last = row
    if not n:
        return None
    weekly = fetch(
        f"SELECT {_week()} AS week, COUNT(*), SUM(c.insertions), SUM(c.deletions) "  # noqa: S608
        f"FROM {_C} c WHERE {where} GROUP BY week ORDER BY week",
        params,
    )
    files = fetch(
        "SELECT f.path, COUNT(*), SUM(f.added), SUM(f.deleted) "  # noqa: S608
        f"FROM {_C} c JOIN {_F} f ON f.commit_id = c.id WHERE {where} "
        "GROUP BY f.path ORDER BY COUNT(*) DESC, f.path LIMIT %s",
        [*params, limit],
    )
    languages = fetch(
        "SELECT f.language, COUNT(*), SUM(f.added + f.deleted) "  # noqa: S608
        f"FROM {_C} c JOIN {_F} f ON f.commit_id = c.id WHERE {where} AND f.language <> '' "
        "GROUP BY f.language ORDER BY SUM(f.added + f.deleted) DESC, f.language",
        params,
    )
    return {
        "author": author,
        "name": name,
        "commits": int(n),
        "insertions": int(ins or 0),
        "deletions": int(dels or 0),
        "first_commit_at": as_instant(first).isoformat(),
        "last_commit_at": as_instant(last).isoformat(),
        "weekly": [
            {
                "week": str(w)[:10],
                "commits": int(c),
                "insertions": int(i or 0),
                "deletions": int(d or 0),
            }
            for w, c, i, d in weekly
        ],
        "files": [
            {"path": p, "revs": int(r), "added": int(a or 0), "deleted": int(d or 0)}
            for p, r, a, d in files
        ],
        "languages": [
            {"language": lang, "changes": int(k), "lines": int(lines or 0)}
            for lang, k, lines in languages
        ],
    }


def file_history(
    scope: Scope, path: str, t: Thresholds | None = None, *, limit: int = 100
) -> dict[str, Any] | None:
    """One file inside the window: its revisions and churn, its authors, its newest
    commits and the files coupled to it; None when no commit of the window changed it."""
    where, params = scope.commit_filter()
    join = f"FROM {_C} c JOIN {_F} f ON f.commit_id = c.id WHERE {where} AND f.path = %s"
    params = [*params, path]
    per_author = fetch(
        "SELECT c.author_canonical_email, MAX(c.author_canonical_name), COUNT(*), "
        f"SUM(f.added), SUM(f.deleted) {join} GROUP BY c.author_canonical_email "
        "ORDER BY COUNT(*) DESC, c.author_canonical_email",
        params,
    )
    if not per_author:
        return None
    commits = fetch(
        "SELECT c.sha, c.committed_at, c.author_canonical_email, c.author_canonical_name, "
        f"c.subject, f.added, f.deleted, f.binary {join} "
        "ORDER BY c.committed_at DESC, c.id DESC LIMIT %s",
        [*params, limit],
    )
    revs = sum(int(r[2]) for r in per_author)
    return {
        "path": path,
        "revs": revs,
        "added": sum(int(r[3] or 0) for r in per_author),
        "deleted": sum(int(r[4] or 0) for r in per_author),
        "authors": [
            {"author": e, "name": n, "revs": int(k), "added": int(a or 0), "deleted": int(d or 0)}
            for e, n, k, a, d in per_author
        ],
        "commits": [
            {
                "sha": sha,
                "committed_at": as_instant(at).isoformat(),
                "author": e,
                "name": n,
                "subject": subj,
                "added": int(a),
                "deleted": int(d),
                "binary": bool(b),
            }
            for sha, at, e, n, subj, a, d, b in commits
        ],
        "coupled": coupled_with(scope, path, t, limit=limit),
    }
