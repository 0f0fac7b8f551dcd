"""Per-author and per-file views inside a window (docs/analytics.md#authors-and-files): the
authors of a repository with their commits and lines; one author's activity per week, files
and languages; one file's history, authors, churn and coupled files. Non-merge commits, as
everywhere in the analytics; authors by canonical (``.mailmap``) email, through the identity
map. A commit is credited to its author and to each ``Co-authored-by:`` co-author, each
with the whole commit: its count and its lines (docs/analytics.md#co-authors)."""

from __future__ import annotations

from typing import Any

from django.db import connection

from dashboard.analytics.coupling import Thresholds, coupled_with
from dashboard.analytics.rows import Scope, as_instant, author_names, fetch
from dashboard.models import Commit, FileChange

_C = Commit._meta.db_table
_F = FileChange._meta.db_table


def _week() -> str:
    """The Monday (UTC) of a commit's committer date (``k.at``), as ``YYYY-MM-DD`` text."""
    if connection.vendor == "sqlite":
        return "date(k.at, 'weekday 0', '-6 days')"
    return "to_char(date_trunc('week', k.at AT TIME ZONE 'UTC'), 'YYYY-MM-DD')"


def _credited(scope: Scope) -> tuple[str, list[Any]]:
    """``commits`` and ``credits`` (rows.Scope), and ``credited(person, id, at, ins, del)``:
    one row per commit and person credited with it."""
    commits, params = scope.commits_cte()
    credits, credit_params = scope.credits_cte()
    sql = (
        f"{commits}, {credits}, credited AS (SELECT cr.person AS person, k.id AS id, "  # noqa: S608
        "k.at AS at, k.ins AS ins, k.del AS del FROM commits k "
        "JOIN credits cr ON cr.rev = k.id)"
    )
    return sql, [*params, *credit_params]


def authors(scope: Scope, *, limit: int = 100) -> list[dict[str, Any]]:
    """The window's credited people, most commits first: commits, lines, first and last
    commit (a co-author is credited with the whole commit)."""
    head, params = _credited(scope)
    found = fetch(
        f"WITH {head} SELECT person, COUNT(*), SUM(ins), SUM(del), MIN(at), MAX(at) "  # noqa: S608
        "FROM credited GROUP BY person ORDER BY COUNT(*) DESC, person LIMIT %s",
        [*params, limit],
    )
    names = author_names(scope)
    return [
        {
            "author": email,
            "name": names.get(email, email),
            "commits": int(n),
            "insertions": int(ins or 0),
            "deletions": int(dels or 0),
            "first_commit_at": as_instant(first).isoformat(),
            "last_commit_at": as_instant(last).isoformat(),
        }
        for email, n, ins, dels, first, last in found
    ]


def author_activity(scope: Scope, author: str, *, limit: int = 100) -> dict[str, Any] | None:
    """One person's commits (authored or co-authored) and lines per week, their most
    changed files and their languages inside the window; None when they have no commit
    there."""
    head, params = _credited(scope)
    mine = f"WITH {head}, mine AS (SELECT id, at, ins, del FROM credited WHERE person = %s) "  # noqa: S608
    params = [*params, author]
    (row,) = fetch(
        f"{mine}SELECT COUNT(*), SUM(ins), SUM(del), MIN(at), MAX(at) FROM mine",  # noqa: S608
        params,
    )
    n, ins, dels, first, last = row
    if not n:
        return None
    name = author_names(scope).get(author, author)
    weekly = fetch(
        f"{mine}SELECT {_week()} AS week, COUNT(*), SUM(k.ins), SUM(k.del) "  # noqa: S608
        "FROM mine k GROUP BY week ORDER BY week",
        params,
    )
    files_sql, file_params = scope.file_filter()
    files = fetch(
        f"{mine}SELECT f.path, COUNT(*), SUM(f.added), SUM(f.deleted) "  # noqa: S608
        f"FROM mine k JOIN {_F} f ON f.commit_id = k.id WHERE 1 = 1{files_sql} "
        "GROUP BY f.path ORDER BY COUNT(*) DESC, f.path LIMIT %s",
        [*params, *file_params, limit],
    )
    languages = fetch(
        f"{mine}SELECT f.language, COUNT(*), SUM(f.added + f.deleted) "  # noqa: S608
        f"FROM mine k JOIN {_F} f ON f.commit_id = k.id WHERE f.language <> ''{files_sql} "
        "GROUP BY f.language ORDER BY SUM(f.added + f.deleted) DESC, f.language",
        [*params, *file_params],
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
    files_sql, file_params = scope.file_filter()
    join = f"FROM {_C} c JOIN {_F} f ON f.commit_id = c.id WHERE {where}{files_sql} AND f.path = %s"
    params = [*params, *file_params, path]
    (totals,) = fetch(f"SELECT COUNT(*), SUM(f.added), SUM(f.deleted) {join}", params)
    if not totals[0]:
        return None
    credits, credit_params = scope.credits_cte()
    per_author = fetch(
        f"WITH {credits} SELECT cr.person, COUNT(*), SUM(f.added), SUM(f.deleted) "
        f"{join.replace('WHERE', 'JOIN credits cr ON cr.rev = c.id WHERE', 1)} "
        "GROUP BY cr.person ORDER BY COUNT(*) DESC, cr.person",
        [*credit_params, *params],
    )
    names = author_names(scope)
    commits = fetch(
        f"SELECT c.sha, c.committed_at, {scope.author()}, c.author_canonical_name, "
        f"c.subject, f.added, f.deleted, f.binary {join} "
        "ORDER BY c.committed_at DESC, c.id DESC LIMIT %s",
        [*params, limit],
    )
    return {
        "path": path,
        "revs": int(totals[0]),
        "added": int(totals[1] or 0),
        "deleted": int(totals[2] or 0),
        "authors": [
            {
                "author": e,
                "name": names.get(e, e),
                "revs": int(k),
                "added": int(a or 0),
                "deleted": int(d or 0),
            }
            for e, k, a, d in per_author
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
