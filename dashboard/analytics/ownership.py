"""Ownership and knowledge (docs/analytics.md#ownership-and-knowledge), per file and per
directory, over a window's non-merge commits.

An author's share of a file is the revisions (commits) of theirs that changed it over all
its revisions; the main developer has the largest share (ties: the smaller email).
Fragmentation is code-maat's fractal value, 1 - sum(share^2): 0 when one author made every
change. A directory's changes are the commits that changed a file in it; its bus factor is
the fewest authors whose changes add up to more than half of them. Knowledge at risk: the
authors with no commit in the last ``inactive_days`` before the window's end (over the
whole stored history, not only the window), and the files of the window that no active
author changed.

Credit (docs/analytics.md#co-authors): a revision counts once for each person credited
with it, its author and each ``Co-authored-by:`` co-author. ``revs`` stays the number of
revisions; ``credits`` is the sum of the per-person counts, and the shares,
fragmentation and bus factor are taken over credits (equal to ``revs`` when no commit
has a co-author)."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

from dashboard.analytics.author_months import (
    file_credits_aggregated,
    last_seen_aggregated,
    names_aggregated,
)
from dashboard.analytics.dir_aggregates import co_credits, dir_names, dir_parts
from dashboard.analytics.rows import (
    Scope,
    as_instant,
    author_names,
    directory_ctes,
    fetch,
)
from dashboard.analytics.window import Window
from dashboard.models import Commit


def _shares(counts: dict[str, int], revs: int) -> dict[str, Any]:
    """Main developer, share, fragmentation and bus factor of one entity's per-person
    credits, over ``revs`` revisions."""
    total = sum(counts.values())
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    main, main_revs = ranked[0]
    bus, covered = 0, 0
    for _, n in ranked:
        bus += 1
        covered += n
        if 2 * covered > total:
            break
    return {
        "revs": revs,
        "authors": len(counts),
        "main_dev": main,
        "main_dev_revs": main_revs,
        "ownership": round(main_revs / total, 4),
        "fragmentation": round(1 - sum((n / total) ** 2 for n in counts.values()), 4),
        "bus_factor": bus,
        "credits": total,
    }


def _by_author(rows: list[tuple[Any, ...]]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = defaultdict(dict)
    for entity, author, n in rows:
        out[entity][author] = int(n)
    return out


def _file_credits(scope: Scope) -> tuple[dict[str, dict[str, int]], dict[str, int]]:
    """Per file, each credited person's revisions; and each file's revisions."""
    if scope.aggregates:  # docs/analytics.md#performance
        return file_credits_aggregated(scope)
    head, params = scope.rows_cte()
    credits, credit_params = scope.credits_cte()
    per = _by_author(
        fetch(
            f"WITH {head}, {credits} SELECT s.path, cr.person, COUNT(*) FROM scoped s "  # noqa: S608
            "JOIN credits cr ON cr.rev = s.rev GROUP BY s.path, cr.person",
            [*params, *credit_params],
        )
    )
    revs = fetch(f"WITH {head} SELECT path, COUNT(*) FROM scoped GROUP BY path", params)  # noqa: S608
    return per, {path: int(n) for path, n in revs}


def _names(scope: Scope) -> dict[str, str]:
    return names_aggregated(scope) if scope.aggregates else author_names(scope)


def file_ownership(scope: Scope, *, limit: int = 200) -> list[dict[str, Any]]:
    """Per file: revisions, authors, main developer and their share, fragmentation and bus
    factor; the most changed files first."""
    per, revs = _file_credits(scope)
    names = _names(scope)
    # The order needs only each file's revisions: the shares of the first ``limit``.
    shown = sorted(per, key=lambda path: (-revs[path], path))[:limit]
    rows = [{"path": path, **_shares(per[path], revs[path])} for path in shown]
    for row in rows:
        row["main_dev_name"] = names.get(row["main_dev"], row["main_dev"])
    return rows


def _directory_credits(
    scope: Scope, depth: int
) -> tuple[dict[str, dict[str, int]], dict[str, int]]:
    """Per directory, each credited person's commits; and each directory's commits,
    from every stored row of the scope."""
    head, params = scope.rows_cte()
    credits, credit_params = scope.credits_cte()
    dirs, name = directory_ctes("scoped", depth, ("rev", "path"))
    per = _by_author(
        fetch(
            f"WITH {head}, {credits}, {dirs} SELECT d.dir, cr.person, COUNT(DISTINCT d.rev) "  # noqa: S608
            f"FROM {name} d JOIN credits cr ON cr.rev = d.rev GROUP BY d.dir, cr.person",
            [*params, *credit_params],
        )
    )
    revs = {
        d: int(n)
        for d, n in fetch(
            f"WITH {head}, {dirs} SELECT dir, COUNT(DISTINCT rev) FROM {name} GROUP BY dir",  # noqa: S608
            params,
        )
    }
    return per, revs


def directory_ownership(scope: Scope, *, depth: int = 1) -> list[dict[str, Any]]:
    """Per directory (first ``depth`` levels): its changes (distinct commits), authors,
    main developer, share, fragmentation and bus factor, with every author's changes;
    the lowest bus factor first, then the most changed."""
    parts = dir_parts(scope, depth)
    if parts is not None:
        # docs/analytics.md#performance: the authors' own commits per directory from the
        # aggregates (they add up to its commits), then the co-authors' credits.
        per = _by_author(
            fetch(
                f"WITH {parts.sql} SELECT dir, author, SUM(revs) FROM dparts "  # noqa: S608
                "GROUP BY dir, author",
                parts.params,
            )
        )
        revs = {d: sum(counts.values()) for d, counts in per.items()}
        for d, person, n in co_credits(scope, depth):
            per[d][person] = per[d].get(person, 0) + n
        names = dir_names(scope, parts)
    else:
        per, revs = _directory_credits(scope, depth)
        names = author_names(scope)
    rows = []
    for directory, counts in per.items():
        row = {"directory": directory, **_shares(counts, revs[directory])}
        row["main_dev_name"] = names.get(row["main_dev"], row["main_dev"])
        row["by_author"] = [
            {"author": a, "name": names.get(a, a), "revs": n}
            for a, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        ]
        rows.append(row)
    rows.sort(key=lambda r: (r["bus_factor"], -r["revs"], r["directory"]))
    return rows


def last_seen(scope: Scope) -> dict[str, Any]:
    """Each credited person's last commit (committer date; authored or co-authored) up to
    the window's end, over the whole stored history: inactivity is not bounded by the
    window's start."""
    whole = scope.within(Window(None, scope.window.end))
    if scope.aggregates:  # docs/analytics.md#performance
        return last_seen_aggregated(whole)
    credits, params = whole.credits_cte()
    rows = fetch(
        f"WITH {credits} SELECT cr.person, MAX(c.committed_at) FROM credits cr "  # noqa: S608
        f"JOIN {Commit._meta.db_table} c ON c.id = cr.rev GROUP BY cr.person",
        params,
    )
    return {author: as_instant(at) for author, at in rows}


def knowledge_at_risk(scope: Scope, *, inactive_days: int = 90) -> dict[str, Any]:
    """The inactive authors (no commit in ``inactive_days`` before the window's end) and,
    for each, the files of the window that only inactive authors changed."""
    if inactive_days < 1:
        raise ValueError("inactive_days must be at least 1")
    reference = scope.window.reference()
    # A cutoff before year 1 (a window ending in its first days) is the earliest instant:
    # no commit is older, so no author is inactive.
    floor = datetime.min.replace(tzinfo=UTC)
    cutoff = max(reference, floor + timedelta(days=inactive_days)) - timedelta(days=inactive_days)
    seen = last_seen(scope)
    inactive = {a for a, at in seen.items() if at < cutoff}
    per, _revs = _file_credits(scope)
    names = _names(scope.within(Window(None, scope.window.end)))
    files: dict[str, list[str]] = defaultdict(list)
    for path, counts in per.items():
        if set(counts) <= inactive:
            for author in counts:
                files[author].append(path)
    authors = [
        {
            "author": a,
            "name": names.get(a, a),
            "last_commit_at": seen[a].isoformat(),
            "files": sorted(files.get(a, [])),
        }
        for a in sorted(inactive, key=lambda a: (seen[a], a))
    ]
    return {
        "inactive_days": inactive_days,
        "cutoff": cutoff.isoformat(),
        "authors": authors,
        "files_at_risk": sum(1 for counts in per.values() if set(counts) <= inactive),
    }
