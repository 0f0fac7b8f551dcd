"""How many commits are stored per (repository, analyzer fingerprint), without counting.

``COUNT(*)`` of a repository's commits is a scan of every one of its index entries
(3.2 s per request at 1,000,000 commits, made three times by the repository page).
``CommitCount`` keeps the number on a row instead: ``write_chunk`` is the only writer of
commits and adds, in its own transaction, the number of rows its INSERT or COPY
reported inserted (``add_stored``); readers look up one row (``stored_commits``).
Besides deleting the repository (which cascades to its counts), only a plan after a
rewritten history deletes commits, those no longer reachable from the head
(``chunk_plans._drop_unreachable``): it subtracts the rows its DELETE reported deleted,
in its own transaction (``remove_stored``), and adds them to ``pruned``.

Why the number stays exact (``COUNT(*)`` of the same rows):

- It is the database's row count of the statements that inserted the rows, not the
  chunk's planned size: a retried dead chunk overlapping a re-planned one, or a commit
  already stored by an earlier attempt, adds only what this transaction inserted.
- The bump is a statement of the fenced write transaction (after ``check_token``): if
  the transaction rolls back (stale token, unique-constraint clash with a concurrent
  writer of the same sha, a crash) the bump rolls back with the rows.
- Concurrent bumps do not lose updates: the upsert adds in the database
  (``commits = commits + n``), never a value read into Python. On SQLite the write
  transaction is ``BEGIN IMMEDIATE``, so writers run one at a time; on PostgreSQL the
  upsert row-locks the count until commit, and a second writer's ``ON CONFLICT DO
  UPDATE`` waits and then adds to the committed value (two first inserts of the row
  meet the unique constraint: one inserts, the other updates).

The migration that added the table back-filled it with ``COUNT(*)`` per group.
"""

from __future__ import annotations

from django.db import connection
from django.db.models import BigIntegerField, F, OuterRef, Subquery
from django.db.models.functions import Coalesce

from dashboard.models import CommitCount

__all__ = [
    "add_stored",
    "pruned_commits",
    "remove_stored",
    "stored_commits",
    "stored_commits_subquery",
]


def stored_commits(repo_id: int, fingerprint: str) -> int:
    """Commits stored for the repository under ``fingerprint``: one unique-index lookup."""
    n = (
        CommitCount.objects.filter(repository_id=repo_id, fingerprint=fingerprint)
        .values_list("commits", flat=True)
        .first()
    )
    return int(n or 0)


def pruned_commits(repo_id: int, fingerprint: str, *, lock: bool = False) -> int:
    """Commits ever deleted for the repository under ``fingerprint`` because a rewrite
    made them unreachable (``remove_stored``); it only grows. ``lock``: row-lock the
    count until the caller's transaction ends (PostgreSQL; SQLite's write transaction
    holds the database), so no prune commits before it does."""
    rows = CommitCount.objects.filter(repository_id=repo_id, fingerprint=fingerprint)
    if lock:
        rows = rows.select_for_update()
    n = rows.values_list("pruned", flat=True).first()
    return int(n or 0)


def stored_commits_subquery(fingerprint: str, outer: str = "pk") -> Coalesce:
    """``stored_commits`` as an expression for ``annotate`` over repositories (one query
    for a whole list): 0 where nothing is stored."""
    count = CommitCount.objects.filter(repository=OuterRef(outer), fingerprint=fingerprint)
    return Coalesce(
        Subquery(count.values("commits")[:1], output_field=BigIntegerField()),
        0,
        output_field=BigIntegerField(),
    )


def add_stored(repo_id: int, fingerprint: str, inserted: int) -> None:
    """Add ``inserted`` commits just stored by the caller's transaction. Must run inside
    ``write_chunk``'s fenced transaction, with the number the INSERT/COPY reported (see
    the module docstring for why that is race-free)."""
    if inserted <= 0:
        return
    qn = connection.ops.quote_name
    table = qn(CommitCount._meta.db_table)
    repo_col = qn(CommitCount._meta.get_field("repository").column)
    fp_col = qn("fingerprint")
    n_col = qn("commits")
    # Identifiers from model metadata, values as parameters. The same upsert spelling on
    # SQLite (3.24+) and PostgreSQL.
    sql = (
        f"INSERT INTO {table} ({repo_col}, {fp_col}, {n_col}) VALUES (%s, %s, %s) "  # noqa: S608
        f"ON CONFLICT ({repo_col}, {fp_col}) "
        f"DO UPDATE SET {n_col} = {table}.{n_col} + excluded.{n_col}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [repo_id, fingerprint, inserted])


def remove_stored(repo_id: int, fingerprint: str, deleted: int) -> None:
    """Subtract ``deleted`` commits just deleted by the caller's transaction (a plan
    dropping commits a rewrite made unreachable) and add them to ``pruned``. In the
    same transaction as the DELETE, with the number it reported: exact for the same
    reasons as ``add_stored`` (an UPDATE computed in the database, rolled back with the
    rows)."""
    if deleted <= 0:
        return
    CommitCount.objects.filter(repository_id=repo_id, fingerprint=fingerprint).update(
        commits=F("commits") - deleted, pruned=F("pruned") + deleted
    )
