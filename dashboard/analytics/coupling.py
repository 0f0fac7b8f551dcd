"""Change coupling (docs/analytics.md#change-coupling), as code-maat's ``coupling``
analysis computes it, in SQL over the stored file rows of a window.

A revision is a non-merge commit; its change set is the files it changed. Revisions
changing more than ``max_changeset_size`` files are left out entirely (they count for no
file). For two files, ``shared`` is the revisions changing both, each file's ``revs`` the
revisions (kept) changing it, and

    degree = 100 * shared / ((revs_a + revs_b) / 2)

reported truncated to an integer, with ``average_revs`` rounded up, as code-maat does. A
pair is shown when its average revisions reach ``min_revs``, its shared revisions
``min_shared_revs`` and its degree ``min_coupling`` (code-maat's defaults: 5, 5, 30 and
a change set of at most 30 files)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from dashboard.analytics.coupling_aggregates import applies, coupling_ctes
from dashboard.analytics.rows import MAX_DEPTH, Scope, directory_ctes, fetch
from dashboard.models import Commit, FileChange


@dataclass(frozen=True)
class Thresholds:
    min_revs: int = 5
    min_shared_revs: int = 5
    min_coupling: int = 30
    max_changeset_size: int = 30

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer")
        if self.min_coupling > 100:
            raise ValueError("min_coupling must be between 0 and 100")
        if self.max_changeset_size < 2:
            raise ValueError("max_changeset_size must be at least 2")


def _kept(scope: Scope, t: Thresholds) -> tuple[str, list[Any]]:
    """``kept(rev, path)``: the file rows of the scope's revisions that changed at most
    ``max_changeset_size`` files (``Commit.files_changed`` is the number of its file rows,
    docs/analysis.md#analysis-semantics, so no count is needed). Through a path lens a
    change set is the files left in (docs/analytics.md#lenses), counted here once per
    commit (a window over its rows)."""
    where, params = scope.commit_filter()
    if not scope.lens.excludes_paths:
        sql = (
            "kept AS MATERIALIZED (SELECT f.commit_id AS rev, f.path AS path "  # noqa: S608
            f"FROM {Commit._meta.db_table} c JOIN {FileChange._meta.db_table} f "
            f"ON f.commit_id = c.id WHERE {where} AND c.files_changed <= %s)"
        )
        return sql, [*params, t.max_changeset_size]
    files, file_params = scope.file_filter()
    sql = (
        "kept AS MATERIALIZED (SELECT rev, path FROM (SELECT f.commit_id AS rev, "  # noqa: S608
        "f.path AS path, COUNT(*) OVER (PARTITION BY f.commit_id) AS n "
        f"FROM {Commit._meta.db_table} c JOIN {FileChange._meta.db_table} f "
        f"ON f.commit_id = c.id WHERE {where}{files}) sized WHERE n <= %s)"
    )
    return sql, [*params, *file_params, t.max_changeset_size]


def _entity_pairs(
    head: str,
    params: list[Any],
    pairs: str,
    t: Thresholds,
    *,
    limit: int,
) -> list[tuple[Any, ...]]:
    """``pairs`` (a CTE body over ``head``'s ``ents(rev, e)``: ``shared(ea, eb, shared)``,
    one row per pair) joined to each entity's revisions, the thresholds applied in SQL."""
    ctes = f"{head}, revs AS (SELECT e, COUNT(*) AS n FROM ents GROUP BY e), {pairs}"  # noqa: S608
    return _select(ctes, params, t, limit=limit)


def _select(ctes: str, params: list[Any], t: Thresholds, *, limit: int) -> list[tuple[Any, ...]]:
    """``ctes``' ``shared(ea, eb, shared)`` joined to its ``revs(e, n)``, the thresholds
    applied in SQL, strongest first."""
    sql = (
        f"WITH {ctes} "  # noqa: S608
        "SELECT p.ea, p.eb, p.shared, ra.n, rb.n FROM shared p "
        "JOIN revs ra ON ra.e = p.ea JOIN revs rb ON rb.e = p.eb "
        "WHERE p.shared >= %s AND ra.n + rb.n >= 2 * %s AND 200 * p.shared >= %s * (ra.n + rb.n) "
        "ORDER BY 200 * p.shared * 1.0 / (ra.n + rb.n) DESC, p.shared DESC, p.ea, p.eb "
        "LIMIT %s"
    )
    return fetch(sql, [*params, t.min_shared_revs, t.min_revs, t.min_coupling, limit])


#: The pairs of files: each kept row against the other rows of its commit, read through
#: the file rows' index on their commit (a self-join of the kept rows has no index, and
#: SQLite then compares every row with every other: seconds at 2,000 commits).
_FILE_PAIRS = (
    "shared AS (SELECT a.path AS ea, b.path AS eb, COUNT(*) AS shared FROM kept a "  # noqa: S608
    f"JOIN {FileChange._meta.db_table} b ON b.commit_id = a.rev AND {{join}} "
    "GROUP BY a.path, b.path)"
)


def _aggregated(
    scope: Scope, t: Thresholds, depth: int, path: str | None, limit: int
) -> list[dict[str, Any]] | None:
    """The pairs read through the per-month coupling aggregates where they are exact
    (docs/analytics.md#performance), else None (read every stored row)."""
    if not applies(scope, t.max_changeset_size):
        return None
    found = coupling_ctes(scope, t.max_changeset_size, depth=depth, path=path)
    if found is None:
        return None
    ctes, params = found
    return [_row(*r) for r in _select(ctes, params, t, limit=limit)]


def _row(a: str, b: str, shared: int, revs_a: int, revs_b: int) -> dict[str, Any]:
    average = (revs_a + revs_b) / 2
    return {
        "entity": a,
        "coupled": b,
        "degree": int(100 * shared / average),
        "average_revs": math.ceil(average),
        "shared_revs": shared,
        "revs": revs_a,
        "coupled_revs": revs_b,
    }


def file_coupling(
    scope: Scope, t: Thresholds | None = None, *, limit: int = 100
) -> list[dict[str, Any]]:
    """The coupled file pairs of the window, strongest first (``entity`` < ``coupled``)."""
    t = t or Thresholds()
    aggregated = _aggregated(scope, t, 0, None, limit)
    if aggregated is not None:
        return aggregated
    head, params = _kept(scope, t)
    head += ", ents AS (SELECT rev, path AS e FROM kept)"
    other, other_params = scope.file_filter("b")
    pairs = _FILE_PAIRS.format(join="b.path > a.path" + other)
    return [_row(*r) for r in _entity_pairs(head, [*params, *other_params], pairs, t, limit=limit)]


def coupled_with(
    scope: Scope, path: str, t: Thresholds | None = None, *, limit: int = 100
) -> list[dict[str, Any]]:
    """What changes with ``path``: its coupled files, strongest first (``entity`` is ``path``)."""
    t = t or Thresholds()
    aggregated = _aggregated(scope, t, 0, path, limit)
    if aggregated is not None:
        return aggregated
    head, params = _kept(scope, t)
    head += ", ents AS (SELECT rev, path AS e FROM kept)"
    other, other_params = scope.file_filter("b")
    pairs = _FILE_PAIRS.format(join="a.path = %s AND b.path <> a.path" + other)
    found = _entity_pairs(head, [*params, path, *other_params], pairs, t, limit=limit)
    return [_row(*r) for r in found]


def directory_coupling(
    scope: Scope, t: Thresholds | None = None, *, depth: int = 1, limit: int = 100
) -> list[dict[str, Any]]:
    """Coupling between directories (the first ``depth`` levels of each path): a
    revision's change set is the distinct directories of its files, after the
    ``max_changeset_size`` cut on its files (docs/analytics.md#change-coupling). Each
    distinct path's directory is computed once (``dirmap``); the pairs come from the
    file pairs of each commit, read through the file rows' commit index."""
    t = t or Thresholds()
    if not 1 <= depth <= MAX_DEPTH:
        raise ValueError(f"depth must be between 1 and {MAX_DEPTH}")
    aggregated = _aggregated(scope, t, depth, None, limit)
    if aggregated is not None:
        return aggregated
    head, params = _kept(scope, t)
    dirs, name = directory_ctes("paths", depth, ("path",))
    head += (
        ", paths AS (SELECT DISTINCT path FROM kept), "  # noqa: S608
        f"{dirs}, dirmap AS MATERIALIZED (SELECT path, dir FROM {name}), "
        "ents AS (SELECT DISTINCT kept.rev AS rev, dirmap.dir AS e FROM kept "
        "JOIN dirmap ON dirmap.path = kept.path)"
    )
    pairs = (
        "dirpairs AS (SELECT DISTINCT a.rev AS rev, da.dir AS ea, db.dir AS eb FROM kept a "  # noqa: S608
        f"JOIN {FileChange._meta.db_table} b ON b.commit_id = a.rev "
        "JOIN dirmap da ON da.path = a.path JOIN dirmap db ON db.path = b.path "
        "WHERE db.dir > da.dir), "
        "shared AS (SELECT ea, eb, COUNT(*) AS shared FROM dirpairs GROUP BY ea, eb)"
    )
    return [_row(*r) for r in _entity_pairs(head, params, pairs, t, limit=limit)]
