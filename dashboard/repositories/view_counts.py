"""Page views of repositories, counted in memory and written in batches.

The rollout warm set starts from the most-viewed repositories (``warming.select_warm_set``
ranks them by ``RepositoryView`` rows: views per repository and day, over 7 days). It
needs counts per day, not per second. Writing one ``UPDATE`` per repository page view
made every such page a database write: on SQLite a write waits for the file's single
write lock, which the analysing workers hold for each chunk they store, and it cost the
page ~2.5 ms of CPU (bench/webcost.py). Now :func:`record_view` adds to a counter in
this process, and :func:`flush_views` writes what was counted as one upsert per
(repository, day), all in one transaction:

* when a view finds the last flush ``FLUSH_SECONDS`` or more ago (that request pays one
  batched write for every view of the interval, instead of each paying its own);
* when the warm set is chosen in this process (``select_warm_set`` flushes first);
* when the process exits normally (``atexit``; a killed process loses at most the
  views of its last ``FLUSH_SECONDS``, which the ranking can spare).

So a view reaches the table at most ``FLUSH_SECONDS`` after the next view served by the
same process, or at its exit. A flush that fails (the database refusing connections, a
lock timeout) puts its counts back for the next one and does not fail the page.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections import Counter
from datetime import date

from django.db import DatabaseError, IntegrityError, connection, transaction
from django.utils import timezone

from dashboard.models import Repository, RepositoryView

log = logging.getLogger(__name__)

#: Seconds between two flushes of one process (at most; a flush needs a view to run).
FLUSH_SECONDS = 10.0

#: Views counted here and not yet written: ``{(repository_id, day): views}``.
_pending: Counter[tuple[int, date]] = Counter()
_lock = threading.Lock()
_last_flush = [time.monotonic()]


def record_view(repository_id: int) -> None:
    """Count one page view of a repository today (in memory; see the module docstring).

    Race: the views of one process are counted under ``_lock`` (concurrent requests run
    on threads of their own); the thread that finds the flush due takes the whole
    counter at once
    (:func:`flush_views`), so a view is either in the batch being written or in the
    next one, never both.
    """
    key = (repository_id, timezone.localdate())
    now = time.monotonic()
    with _lock:
        _pending[key] += 1
        due = now - _last_flush[0] >= FLUSH_SECONDS
        if due:
            _last_flush[0] = now
    if due:
        flush_views()


def pending_views() -> int:
    """Views counted in this process and not written yet."""
    with _lock:
        return sum(_pending.values())


def discard_pending() -> None:
    """Forget the views counted here and not written, and restart the flush clock
    (tests: each starts with none and a full ``FLUSH_SECONDS`` before a view flushes;
    none is written into a later test's database at exit)."""
    with _lock:
        _pending.clear()
        _last_flush[0] = time.monotonic()


def flush_views() -> int:
    """Write the views counted here: one upsert per (repository, day), adding to the
    row in the database (``views = views + n``), all in one transaction. Returns the
    views written (0 when there were none, or when the write failed and the counts were
    put back for the next flush; said in the log).

    Race: other processes flush the same rows at any time. The upsert adds in the
    database, never a value read into Python, so no view is lost or counted twice: on
    SQLite writers run one at a time (``BEGIN IMMEDIATE``); on PostgreSQL the upsert
    row-locks its row until commit, and two first inserts of a row meet the unique
    (repository, day) constraint: one inserts, the other adds to it. A repository
    deleted since its views were counted is skipped (its rows went with it); one deleted
    between that check and the insert (PostgreSQL) makes the insert fail on its foreign
    key, and that batch is dropped rather than retried for ever.
    """
    with _lock:
        batch = dict(_pending)
        _pending.clear()
    if not batch:
        return 0
    try:
        with transaction.atomic():
            alive = set(
                Repository.objects.filter(pk__in={repo for repo, _ in batch}).values_list(
                    "pk", flat=True
                )
            )
            rows = [(repo, day, n) for (repo, day), n in batch.items() if repo in alive]
            if rows:
                _upsert(rows)
    except IntegrityError:
        log.warning("page views: %d dropped (a repository was deleted meanwhile)", len(batch))
        return 0
    except DatabaseError as exc:
        with _lock:
            _pending.update(batch)
        log.warning("page views: flush failed, kept for the next one: %s", exc)
        return 0
    return sum(n for repo, _, n in rows)


def _upsert(rows: list[tuple[int, date, int]]) -> None:
    qn = connection.ops.quote_name
    meta = RepositoryView._meta
    table = qn(meta.db_table)
    repo_col = qn(meta.get_field("repository").column)
    day_col = qn(meta.get_field("day").column)
    n_col = qn(meta.get_field("views").column)
    # Identifiers from model metadata, values as parameters. The same upsert spelling on
    # SQLite (3.24+) and PostgreSQL (as ``commit_counts.add_stored``).
    values = ", ".join(["(%s, %s, %s)"] * len(rows))
    sql = (
        f"INSERT INTO {table} ({repo_col}, {day_col}, {n_col}) VALUES {values} "  # noqa: S608
        f"ON CONFLICT ({repo_col}, {day_col}) "
        f"DO UPDATE SET {n_col} = {table}.{n_col} + excluded.{n_col}"
    )
    adapt = connection.ops.adapt_datefield_value
    params = [value for repo, day, n in rows for value in (repo, adapt(day), n)]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def _flush_at_exit() -> None:
    try:
        flush_views()
    except Exception:  # the process is ending: say so, never fail its exit
        log.exception("page views: flush at exit failed")


atexit.register(_flush_at_exit)
