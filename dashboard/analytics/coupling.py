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

from dashboard.analytics.rows import Scope, directory_ctes, fetch


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
    """``scoped``, ``sized`` (revisions small enough) and ``kept(rev, path)``."""
    head, params = scope.rows_cte()
    sql = (
        f"{head}, sized AS (SELECT rev FROM scoped GROUP BY rev HAVING COUNT(*) <= %s), "  # noqa: S608
        "kept AS (SELECT scoped.rev AS rev, scoped.path AS path FROM scoped "
        "JOIN sized ON sized.rev = scoped.rev)"
    )
    return sql, [*params, t.max_changeset_size]


def _entity_pairs(
    head: str, params: list[Any], entities: str, t: Thresholds, *, of: str | None, limit: int
) -> list[tuple[Any, ...]]:
    """Pairs of ``entities(rev, e)`` with their shared and individual revisions, the
    thresholds applied in SQL; ``of`` keeps only the pairs of that one entity."""
    if of is None:
        pair_join, pair_params = "a.e < b.e", []
    else:
        pair_join, pair_params = "a.e = %s AND b.e <> a.e", [of]
    sql = (
        f"WITH {head}, revs AS (SELECT e, COUNT(*) AS n FROM {entities} GROUP BY e), "  # noqa: S608
        f"pairs AS (SELECT a.e AS ea, b.e AS eb, COUNT(*) AS shared FROM {entities} a "
        f"JOIN {entities} b ON b.rev = a.rev AND {pair_join} GROUP BY a.e, b.e "
        "HAVING COUNT(*) >= %s) "
        "SELECT p.ea, p.eb, p.shared, ra.n, rb.n FROM pairs p "
        "JOIN revs ra ON ra.e = p.ea JOIN revs rb ON rb.e = p.eb "
        "WHERE ra.n + rb.n >= 2 * %s AND 200 * p.shared >= %s * (ra.n + rb.n) "
        "ORDER BY 200 * p.shared * 1.0 / (ra.n + rb.n) DESC, p.shared DESC, p.ea, p.eb "
        "LIMIT %s"
    )
    return fetch(
        sql,
        [*params, *pair_params, t.min_shared_revs, t.min_revs, t.min_coupling, limit],
    )


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


def coupling(
    scope: Scope, t: Thresholds | None = None, *, limit: int = 100
) -> list[dict[str, Any]]:
    """The coupled file pairs of the window, strongest first (``entity`` < ``coupled``)."""
    t = t or Thresholds()
    head, params = _kept(scope, t)
    head += ", ents AS (SELECT rev, path AS e FROM kept)"
    return [_row(*r) for r in _entity_pairs(head, params, "ents", t, of=None, limit=limit)]


def coupled_with(
    scope: Scope, path: str, t: Thresholds | None = None, *, limit: int = 100
) -> list[dict[str, Any]]:
    """What changes with ``path``: its coupled files, strongest first (``entity`` is ``path``)."""
    t = t or Thresholds()
    head, params = _kept(scope, t)
    head += ", ents AS (SELECT rev, path AS e FROM kept)"
    return [_row(*r) for r in _entity_pairs(head, params, "ents", t, of=path, limit=limit)]


def directory_coupling(
    scope: Scope, t: Thresholds | None = None, *, depth: int = 1, limit: int = 100
) -> list[dict[str, Any]]:
    """Coupling between directories (the first ``depth`` levels of each path): a
    revision's change set is the distinct directories of its files, after the
    ``max_changeset_size`` cut on its files (docs/analytics.md#change-coupling)."""
    t = t or Thresholds()
    head, params = _kept(scope, t)
    dirs, name = directory_ctes("kept", depth, ("rev", "path"))
    head += f", {dirs}, ents AS (SELECT DISTINCT rev, dir AS e FROM {name})"  # noqa: S608
    return [_row(*r) for r in _entity_pairs(head, params, "ents", t, of=None, limit=limit)]
