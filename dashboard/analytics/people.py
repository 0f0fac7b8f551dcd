"""Per-author and per-file views inside a window (docs/analytics.md#authors-and-files): the
authors of a repository with their commits and lines; one author's activity per week, files
and languages; one file's history, authors, churn and coupled files. Non-merge commits, as
everywhere in the analytics; authors by canonical (``.mailmap``) email, through the identity
map. A commit is credited to its author and to each ``Co-authored-by:`` co-author, each
with the whole commit: its count and its lines (docs/analytics.md#co-authors)."""

from __future__ import annotations

from typing import Any

from django.db import connection

from dashboard.analytics.author_months import (
    author_activity_aggregated,
    authors_aggregated,
    file_totals_aggregated,
    names_aggregated,
)
from dashboard.analytics.coupling import Thresholds, coupled_with
from dashboard.analytics.rows import Scope, as_instant, author_names, fetch
from dashboard.analytics.window import Window
from dashboard.models import Commit, FileChange

_C = Commit._meta.db_table
_F = FileChange._meta.db_table


def newest_commits(scope: Scope, path: str, revisions: int, limit: int) -> list[tuple[Any, ...]]:
    """The newest ``limit`` of one file's ``revisions`` in the window (sha, date, person,
    name, subject, added, deleted, binary), newest first.

    Two ways find them (docs/analytics.md#performance). Through the file rows' path index:
    every revision of the file in the window, each with its commit, then sorted, however
    few are shown. Or from the window's commits newest first through the page index, each
    one's file rows through their commit, stopping at the ``limit``-th that changed the
    file: few reads for a file changed often, the whole window for one changed rarely.
    PostgreSQL's statistics know how often a path occurs and choose (one query, either
    way in a few ms at that size). SQLite's do not (no per-value statistics in the builds
    Python ships), and took the path index for the busiest file of a 1,000,000-commit
    history (154,000 revisions read and sorted for 100: 2.2 s). So on SQLite the choice
    is made here: the newest ``4 × limit`` commits are read first, then four times as
    many, and so on while that stays below ``revisions`` (what the path index reads);
    only when none of those held ``limit`` of the file's revisions is the path index
    read. At worst about twice the path index's reads. The answer is the same either
    way: the commits are read in the answer's own order (committer date, then id, both
    descending), so ``limit`` rows found among the newest ones are the newest of all,
    and so is whatever a read of the whole window finds. (On PostgreSQL the same steps
    measured 2–3× slower than its own choice: each step's bound reads the page index.)

    When the steps end without them (a file changed rarely in the window), SQLite is
    told which way to read too (``_path_first``): the path index holds the file's rows
    of every date, so it is read first only when those rows are fewer than the window's
    commits (by ``PATH_ROW_COST``), else the whole window newest first. Left to itself
    with a window that has a start and an end, SQLite read the window's commits and
    probed the path index for each of them, every row of the file each time (1.9 s for
    a file of six revisions in a 234,000-commit window)."""
    where, params = scope.commit_filter()
    files_sql, file_params = scope.file_filter()
    columns = (
        f"SELECT c.sha, c.committed_at, {scope.author()}, c.author_canonical_name, "
        "c.subject, f.added, f.deleted, f.binary"
    )
    order = "ORDER BY c.committed_at DESC, c.id DESC LIMIT %s"

    def newest_first(commits: str, commit_params: list[Any]) -> list[tuple[Any, ...]]:
        # No condition on the file row's repository and fingerprint (copies of its
        # commit's): without them no index leads with the path, so both databases read
        # the commits first, newest first through the page index, and stop at ``limit``.
        return fetch(
            f"{columns} FROM {_C} c JOIN {_F} f ON f.commit_id = c.id "
            f"WHERE {commits}{files_sql} AND f.path = %s {order}",
            [*commit_params, *file_params, path, limit],
        )

    bound, bound_params = _window_keys(scope)
    budget = 4 * limit
    while connection.vendor == "sqlite" and budget < revisions:
        # The committer date of the ``budget``-th newest commit of the window, from the
        # page index alone (merges counted too: the bound then reads a few more).
        found = fetch(
            f"SELECT c.committed_at FROM {_C} c WHERE {bound} "  # noqa: S608
            "ORDER BY c.committed_at DESC, c.id DESC LIMIT 1 OFFSET %s",
            [*bound_params, budget - 1],
        )
        step, step_params = where, params
        if found:
            # The bound stands for the window's start (it is inside the window): given
            # both, SQLite ranged the page index from the first one written and filtered
            # by the other, reading the whole window (36 ms against 0.4 ms for 234,000
            # commits).
            step, step_params = scope.within(Window(None, scope.window.end)).commit_filter()
            step, step_params = f"{step} AND c.committed_at >= %s", [*step_params, found[0][0]]
        rows = newest_first(step, step_params)
        if len(rows) == limit or not found:  # the newest, or the whole window read
            return rows
        budget *= 4
    if connection.vendor == "sqlite":
        if not _path_first(scope, path):
            return newest_first(where, params)  # the whole window, as the steps read it
        # The file's rows through the path index, each one's commit by key: CROSS JOIN
        # keeps that order (SQLite never reorders it). A plain join over a window with
        # both ends read every commit of the window first, probing the path index for
        # each (docs/analytics.md#performance).
        return fetch(
            f"{columns} FROM {_F} f CROSS JOIN {_C} c WHERE c.id = f.commit_id "
            f"AND {where}{files_sql} AND f.repository_id = %s AND f.fingerprint = %s "
            f"AND f.path = %s {order}",
            [*params, *file_params, scope.repo.pk, scope.fingerprint, path, limit],
        )
    # The file row's own repository and fingerprint let the path index find its rows
    # (PostgreSQL reads the commits newest first instead where its statistics say so).
    return fetch(
        f"{columns} FROM {_C} c JOIN {_F} f ON f.commit_id = c.id "
        f"WHERE {where}{files_sql} AND f.repository_id = %s AND f.fingerprint = %s "
        f"AND f.path = %s {order}",
        [*params, *file_params, scope.repo.pk, scope.fingerprint, path, limit],
    )


#: What reading one of a file's rows through the path index costs against reading one
#: commit of the window newest first through the page index (the file row and its
#: commit by key, then a sort, against an index entry and a look-up of the commit's
#: file rows): ×5 measured at 1,000,000 commits on SQLite, taken as 4 so that a close
#: call reads the path index, whose cost does not grow with the window
#: (docs/analytics.md#performance).
PATH_ROW_COST = 4


def _path_first(scope: Scope, path: str) -> bool:
    """SQLite: whether ``newest_commits`` reads the file's rows through the path index
    (every date: the index holds none) rather than the window's commits newest first:
    when the rows are fewer than the commits by ``PATH_ROW_COST``. Two counts read from
    those indexes alone, the window's stopped past that many (merges counted too)."""
    (stored,) = fetch(
        f"SELECT COUNT(*) FROM {_F} f WHERE f.repository_id = %s "  # noqa: S608
        "AND f.fingerprint = %s AND f.path = %s",
        [scope.repo.pk, scope.fingerprint, path],
    )[0]
    enough = PATH_ROW_COST * int(stored)
    bound, bound_params = _window_keys(scope)
    (commits,) = fetch(
        f"SELECT COUNT(*) FROM (SELECT 1 FROM {_C} c WHERE {bound} LIMIT %s) w",  # noqa: S608
        [*bound_params, enough + 1],
    )[0]
    return int(commits) > enough


def _window_keys(scope: Scope) -> tuple[str, list[Any]]:
    """The page index's conditions for the scope's window: repository, fingerprint and
    committer dates (every commit, merges and lenses aside)."""
    ops = connection.ops
    where = ["c.repository_id = %s", "c.fingerprint = %s"]
    params: list[Any] = [scope.repo.pk, scope.fingerprint]
    if scope.window.start is not None:
        where.append("c.committed_at >= %s")
        params.append(ops.adapt_datetimefield_value(scope.window.start))
    if scope.window.end is not None:
        where.append("c.committed_at < %s")
        params.append(ops.adapt_datetimefield_value(scope.window.end))
    return " AND ".join(where), params


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
    if scope.aggregates and not scope.lens.excludes_paths:
        # Whole months from the per-author sums (docs/analytics.md#performance).
        found = authors_aggregated(scope, limit)
        names = names_aggregated(scope)
    else:
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
    if scope.aggregates and not scope.lens.excludes_paths:
        # Whole months from the per-author sums (docs/analytics.md#performance).
        found = author_activity_aggregated(scope, author, limit)
        if found is None:
            return None
        n, ins, dels, first, last = found["totals"]
        name = names_aggregated(scope).get(author, author)
        weekly, files, languages = found["weekly"], found["files"], found["languages"]
    else:
        n, ins, dels, first, last, name, weekly, files, languages = _activity(scope, author, limit)
        if not n:
            return None
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


def _activity(scope: Scope, author: str, limit: int) -> tuple[Any, ...]:
    """``author_activity``'s rows read from every stored row of the window."""
    head, params = _credited(scope)
    mine = f"WITH {head}, mine AS (SELECT id, at, ins, del FROM credited WHERE person = %s) "  # noqa: S608
    params = [*params, author]
    (row,) = fetch(
        f"{mine}SELECT COUNT(*), SUM(ins), SUM(del), MIN(at), MAX(at) FROM mine",  # noqa: S608
        params,
    )
    n, ins, dels, first, last = row
    if not n:
        return (n, ins, dels, first, last, "", [], [], [])
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
    return (n, ins, dels, first, last, name, weekly, files, languages)


def file_history(
    scope: Scope,
    path: str,
    t: Thresholds | None = None,
    *,
    limit: int = 100,
    coupled: bool = True,
) -> dict[str, Any] | None:
    """One file inside the window: its revisions and churn, its authors, its newest
    commits and the files coupled to it (``coupled=False``: none, the coupling left
    out: bench/analytics.py times the rest apart); None when no commit of the window
    changed it."""
    where, params = scope.commit_filter()
    files_sql, file_params = scope.file_filter()
    # The file row's own repository and fingerprint (copies of its commit's) let the
    # path index find the file's rows, instead of every commit of the window probing
    # its files (docs/analytics.md#performance).
    join = (
        f"FROM {_C} c JOIN {_F} f ON f.commit_id = c.id WHERE {where}{files_sql} "
        "AND f.repository_id = %s AND f.fingerprint = %s AND f.path = %s"
    )
    params = [*params, *file_params, scope.repo.pk, scope.fingerprint, path]
    if scope.aggregates:
        # Whole months from the file's sums (docs/analytics.md#performance).
        totals, per_author = file_totals_aggregated(scope, path)
    else:
        (totals,) = fetch(f"SELECT COUNT(*), SUM(f.added), SUM(f.deleted) {join}", params)
    if not totals[0]:
        return None
    if not scope.aggregates:
        credits, credit_params = scope.credits_cte()
        per_author = fetch(
            f"WITH {credits} SELECT cr.person, COUNT(*), SUM(f.added), SUM(f.deleted) "
            f"{join.replace('WHERE', 'JOIN credits cr ON cr.rev = c.id WHERE', 1)} "
            "GROUP BY cr.person ORDER BY COUNT(*) DESC, cr.person",
            [*credit_params, *params],
        )
    names = names_aggregated(scope) if scope.aggregates else author_names(scope)
    commits = newest_commits(scope, path, int(totals[0]), limit)
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
        "coupled": coupled_with(scope, path, t, limit=limit) if coupled else [],
    }
