"""Writing analysed chunks and reading commits back."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from itertools import chain
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone as djtz

from dashboard.infra import DB_INT_MAX
from dashboard.locks import check_token
from dashboard.models import Chunk, CoAuthor, Commit, FileChange, MonthStamp, Repository
from dashboard.repositories.commit_counts import add_stored
from workers.analysis import CommitRecord
from workers.runtime import failpoint


class ChunkMismatch(RuntimeError):
    """git returned other commits than the chunk planned (history rewritten?)."""


COMMIT_COLUMNS = (
    "repository_id", "fingerprint", "sha", "parents", "author_name", "author_email",
    "author_canonical_name", "author_canonical_email", "authored_at", "author_tz",
    "committer_name", "committer_email", "committed_at", "committer_tz", "subject",
    "is_merge", "files_changed", "insertions", "deletions", "token",
)  # fmt: skip
FILE_COLUMNS = (
    "commit_id", "repository_id", "fingerprint", "path", "added", "deleted", "binary",
    "language",
)  # fmt: skip

CO_AUTHOR_COLUMNS = ("commit_id", "name", "email")


def co_author_identity(value: str) -> tuple[str, str]:
    """A ``Co-authored-by:`` value, ``Name <email>``, as (name, email); a value without
    ``<…>`` is all e-mail (docs/analytics.md#co-authors)."""
    name, sep, rest = value.rpartition("<")
    if not sep:
        return "", _text(value.strip())
    return _text(name.strip()), _text(rest.split(">", 1)[0].strip())


#: Minutes east of UTC per tzinfo: the parser shares one tzinfo object per offset.
_OFFSETS: dict[tzinfo | None, int] = {}


def _offset_minutes(moment: datetime) -> int:
    tz = moment.tzinfo
    minutes = _OFFSETS.get(tz)
    if minutes is None:
        off = moment.utcoffset()
        minutes = int(off.total_seconds() // 60) if off is not None else 0
        if len(_OFFSETS) < 10_000:
            _OFFSETS[tz] = minutes
    return minutes


def _sqlite_datetime(moment: datetime) -> str:
    """What Django's SQLite backend stores for an aware datetime (naive UTC text, as
    ``adapt_datetimefield_value`` makes it with ``USE_TZ``), without its per-call checks."""
    return moment.astimezone(UTC).isoformat(" ")[:-6]  # str(naive) without "+00:00"


def _identity(moment: datetime) -> datetime:
    return moment  # psycopg adapts an aware datetime to timestamptz itself


def _text(value: str, limit: int | None = None) -> str:
    """Repository text as the database can store it (PostgreSQL refuses NUL)."""
    if "\x00" in value:
        value = value.replace("\x00", "\ufffd")
    return value[:limit] if limit else value


def _table(model: Any) -> str:
    return str(connection.ops.quote_name(model._meta.db_table))


def _columns(model: Any, columns: Sequence[str]) -> str:
    qn = connection.ops.quote_name
    return ", ".join(qn(model._meta.get_field(c).column) for c in columns)


def bump_months(repo_id: int, fp: str, instants: Iterable[datetime]) -> int:
    """Bump the version of every UTC month holding one of ``instants`` (committer dates
    of commits being inserted or deleted), creating its stamp when missing; returns the
    months bumped. Call it inside the transaction that writes those commits
    (docs/analytics.md#performance): the month's ``MonthAggregate`` rows stop being
    current when it commits, together with the rows it changed.

    Race: a reader computing the month's aggregates holds the stamp row locked
    (``analytics.aggregates``); this upsert takes the same row lock (SQLite: one write
    transaction at a time), so either the reader committed first and this bump marks its
    rows stale, or this write committed first and the reader's statements, which start
    after it got the lock, see the new rows. A stamp the reader inserted but has not
    committed makes this INSERT wait for it, then take the UPDATE branch."""
    months = sorted({at.astimezone(UTC).date().replace(day=1) for at in instants})
    if not months:
        return 0
    table = _table(MonthStamp)
    cols = _columns(MonthStamp, ("repository", "fingerprint", "month", "version"))
    with connection.cursor() as cursor:
        cursor.executemany(
            f"INSERT INTO {table} ({cols}) VALUES (%s, %s, %s, 0) "  # noqa: S608
            "ON CONFLICT (repository_id, fingerprint, month) "
            f"DO UPDATE SET version = {table}.version + 1",
            [(repo_id, fp, connection.ops.adapt_datefield_value(m)) for m in months],
        )
    return len(months)


class _Rows:
    """Everything ``write_chunk`` inserts, built before its transaction: per commit its
    row (``COMMIT_COLUMNS``), and its files' rows ``(k, path, added, deleted, binary,
    language)`` with ``k`` the commit's index in the chunk, in chunk order. One pass over
    the files of each commit, one tuple per file: the repository and fingerprint, the same
    for every row, are added by the insert (``_insert_sqlite``: literals of the statement;
    ``_copy_postgresql``: per row), and so is the commit id, which only exists inside the
    transaction (SQLite: ``k`` plus the first id, in SQL; nothing is re-tupled)."""

    __slots__ = ("co_authors", "commits", "files", "fp", "repo_id", "shas")

    def __init__(self, repo_id: int, fp: str, records: Sequence[CommitRecord], token: int) -> None:
        stamp = _sqlite_datetime if connection.vendor == "sqlite" else _identity
        self.repo_id = repo_id
        self.fp = fp
        self.shas = [r.sha for r in records]
        self.commits: list[tuple[Any, ...]] = []
        self.files: list[list[tuple[Any, ...]]] = []
        #: Per commit its co-authors' (name, email), the e-mails distinct.
        self.co_authors: list[list[tuple[str, str]]] = []
        for k, r in enumerate(records):
            people: dict[str, str] = {}
            for value in r.co_authors:
                name, email = co_author_identity(value)
                if email:
                    people.setdefault(email, name)
            self.co_authors.append([(n, e) for e, n in people.items()])
            insertions = deletions = 0
            rows = []
            # Unpacked, not read by attribute (a NamedTuple property call per field).
            # A path cannot hold NUL: the parser split the -z stream at NUL (_text).
            for path, added, deleted, binary, language, _old in r.files:
                insertions += added
                deletions += deleted
                rows.append((k, path, added, deleted, binary, language))
            self.files.append(rows)
            self.commits.append(
                (
                    repo_id,
                    fp,
                    r.sha,
                    " ".join(r.parents),
                    _text(r.author_name),
                    _text(r.author_email),
                    _text(r.author_canonical_name),
                    _text(r.author_canonical_email),
                    stamp(r.authored_at),
                    _offset_minutes(r.authored_at),
                    _text(r.committer_name),
                    _text(r.committer_email),
                    stamp(r.committed_at),
                    _offset_minutes(r.committed_at),
                    _text(r.subject),
                    r.is_merge,
                    len(r.files),
                    insertions,
                    deletions,
                    token,
                )
            )


def _insert_sqlite(fresh: list[int], rows: _Rows) -> int:
    """SQLite: two ``executemany`` INSERTs in the caller's (IMMEDIATE) transaction; WAL
    and ``synchronous=NORMAL`` are set per connection in settings, so the commit does
    not wait for an fsync. The commit ids are chosen here, after the table's
    AUTOINCREMENT high-water mark, so each file row carries its commit's id as a plain
    value: no index lookup per file row, nothing read back.

    Race: the ids are read and used inside the caller's IMMEDIATE transaction, which
    holds SQLite's single write lock from its ``BEGIN``: no other connection can insert a
    commit (or move ``sqlite_sequence``) between this read and our commit, so the ids are
    free. Explicit ids above the mark move it themselves (AUTOINCREMENT semantics), so
    an id is never handed out twice, not even one of a deleted row. Returns the number
    of commit rows inserted (sqlite3 sums ``executemany``'s changes)."""
    table = _table(Commit)
    commit_sql = (
        f"INSERT INTO {table} (id, {_columns(Commit, COMMIT_COLUMNS)}) "  # noqa: S608
        f"VALUES ({', '.join(['?'] * (len(COMMIT_COLUMNS) + 1))})"
    )
    # The raw sqlite3 cursor: Django's wrapper would only rewrite %s to ? on every call.
    with connection.cursor() as cursor:
        raw = cursor.cursor
        raw.execute(
            f"SELECT max(coalesce((SELECT seq FROM sqlite_sequence WHERE name = ?), 0), "  # noqa: S608
            f"coalesce((SELECT max(id) FROM {table}), 0))",
            [Commit._meta.db_table],
        )
        first = int(raw.fetchone()[0]) + 1
        commits = rows.commits
        raw.executemany(commit_sql, [(first + pos, *commits[i]) for pos, i in enumerate(fresh)])
        inserted = int(raw.rowcount)
        # The fresh commit at position ``pos`` got id ``first + pos``; a file row carries
        # that position and the statement adds ``first``. Identifiers come from model
        # metadata; ``first`` and the repository id are integers and the fingerprint a
        # quoted literal (``_sql_text``), the same for every row of the chunk; everything
        # from the repository (paths, languages) is a bound parameter: no injection.
        start = fresh[0]
        # the usual case: nothing of the chunk (or of its slice) stored yet, so the fresh
        # commits are one run of indexes and a file row's ``k`` minus the run's start is
        # its commit's position: the rows go in as built
        run = fresh[-1] - start + 1 == len(fresh)
        file_sql = (
            f"INSERT INTO {_table(FileChange)} ({_columns(FileChange, FILE_COLUMNS)}) "  # noqa: S608
            f"VALUES (? + {(first - start) if run else first:d}, {int(rows.repo_id):d}, "
            f"{_sql_text(rows.fp)}, ?, ?, ?, ?, ?)"
        )
        files = rows.files
        if run:
            raw.executemany(file_sql, chain.from_iterable(files[start : fresh[-1] + 1]))
        else:  # re-number the files of the fresh commits by their position among them
            raw.executemany(
                file_sql, ((pos, *row[1:]) for pos, i in enumerate(fresh) for row in files[i])
            )
        co_sql = (
            f"INSERT INTO {_table(CoAuthor)} ({_columns(CoAuthor, CO_AUTHOR_COLUMNS)}) "  # noqa: S608
            f"VALUES (? + {first:d}, ?, ?)"
        )
        people = [(pos, n, e) for pos, i in enumerate(fresh) for n, e in rows.co_authors[i]]
        if people:
            raw.executemany(co_sql, people)
    return inserted


def _sql_text(value: str) -> str:
    """``value`` as an SQL string literal (standard quoting: a quote is doubled; SQLite
    has no backslash escapes). Only for our own values, such as a fingerprint."""
    if "\x00" in value:
        raise ValueError("an SQL literal cannot hold NUL")
    return "'" + value.replace("'", "''") + "'"


def _copy_postgresql(fresh: list[int], rows: _Rows) -> int:
    """PostgreSQL: ``COPY … FROM STDIN`` through psycopg's ``cursor.copy()``, in the
    caller's transaction. The commit ids are drawn from the table's own identity sequence
    first, so commits and their files are both copied with nothing read back. Returns
    the number of commit rows COPY reported copied."""
    with connection.cursor() as cursor:
        raw = cursor.cursor
        # The commit of this transaction does not wait for its WAL flush (SQLite's
        # synchronous=NORMAL, in PostgreSQL terms). Safe: a server crash can only lose
        # the whole transaction (rows and the chunk's DONE mark together), never part of
        # it, and only until the next synchronous commit, which flushes the WAL up to
        # itself: the attempt's own "succeeded" record comes after this one, so a chunk
        # is never recorded done without its rows. A lost chunk stays open and is retried.
        raw.execute("SET LOCAL synchronous_commit TO OFF")
        raw.execute(
            "SELECT nextval(pg_get_serial_sequence(%s, 'id')) FROM generate_series(1, %s)",
            [Commit._meta.db_table, len(fresh)],
        )
        ids = [row[0] for row in raw.fetchall()]
        commit_copy = f"COPY {_table(Commit)} (id, {_columns(Commit, COMMIT_COLUMNS)}) FROM STDIN"
        with raw.copy(commit_copy) as copy:
            for cid, i in zip(ids, fresh, strict=True):
                copy.write_row((cid, *rows.commits[i]))
        inserted = int(raw.rowcount)
        file_copy = f"COPY {_table(FileChange)} ({_columns(FileChange, FILE_COLUMNS)}) FROM STDIN"
        repo_id, fp = rows.repo_id, rows.fp
        with raw.copy(file_copy) as copy:
            for cid, i in zip(ids, fresh, strict=True):
                for _k, path, added, deleted, binary, language in rows.files[i]:
                    copy.write_row((cid, repo_id, fp, path, added, deleted, binary, language))
        people = [
            (cid, n, e) for cid, i in zip(ids, fresh, strict=True) for n, e in rows.co_authors[i]
        ]
        if people:
            co_copy = (
                f"COPY {_table(CoAuthor)} ({_columns(CoAuthor, CO_AUTHOR_COLUMNS)}) FROM STDIN"
            )
            with raw.copy(co_copy) as copy:
                for row in people:
                    copy.write_row(row)
    return inserted


def stored_shas(repo_id: int, fp: str, shas: Sequence[str]) -> set[str]:
    """The shas of ``shas`` already stored for (repository, fingerprint): one query that
    probes the unique index once per sha, its 1,000 shas passed as one array (PostgreSQL)
    or as a JSON array read by ``json_each`` (SQLite) instead of 1,000 bound parameters
    quoted one by one.

    On PostgreSQL the probe is spelled as a ``LATERAL … LIMIT 1`` per sha, not as
    ``sha = ANY(array)``: with no statistics for the repository (a backfill that began
    after the table's last ``ANALYZE``: autovacuum analyses a big table rarely, and a new
    repository's rows are not in its statistics until then) the planner expects one row
    for (repository, fingerprint) and keeps ``ANY`` as a filter, scanning every stored
    commit of the repository and comparing each to the whole array. That made each call
    grow with the history (471 ms at 171,000 stored commits against 17 ms per sha probe;
    docs/scheduling.md, "Stored-commit checks on PostgreSQL"). A ``LIMIT`` inside the
    lateral subquery keeps the planner from flattening it into a join, so the plan is an
    index probe per sha whatever the statistics say."""
    sql, params = stored_shas_query(connection.vendor, repo_id, fp, shas)
    with connection.cursor() as cursor:
        cursor.cursor.execute(sql, params)
        return {row[0] for row in cursor.cursor.fetchall()}


def stored_shas_query(
    vendor: str, repo_id: int, fp: str, shas: Sequence[str]
) -> tuple[str, list[object]]:
    """``stored_shas``'s SQL and parameters for a database ``vendor`` (its plan is tested)."""
    commits = _table(Commit)
    if vendor == "postgresql":
        probe = (
            "SELECT c.sha FROM unnest(%s::text[]) AS s(sha) CROSS JOIN LATERAL ("  # noqa: S608 - identifiers from model metadata
            f"SELECT sha FROM {commits} "
            "WHERE repository_id = %s AND fingerprint = %s AND sha = s.sha LIMIT 1) AS c"
        )
        return probe, [list(shas), repo_id, fp]
    return (
        f"SELECT sha FROM {commits} "  # noqa: S608 - identifiers from model metadata
        "WHERE repository_id = ? AND fingerprint = ? "
        "AND sha IN (SELECT value FROM json_each(?))",
        [repo_id, fp, json.dumps(list(shas))],
    )


def write_chunk(
    *,
    chunk: Chunk,
    records: Sequence[CommitRecord],
    token: int | None,
    wanted: Callable[[], bool] | None = None,
    pause: Callable[[], None] | None = None,
) -> int:
    """Store every commit of ``chunk``, fenced; return rows inserted.

    1. Build the rows before any transaction (no database lock held meanwhile).
    2. Check the fencing token of the chunk lock is still the newest (row locked until
       commit, see ``check_token``): a holder whose lease ran out writes nothing.
    3. Write nothing if the chunk was dropped meanwhile (a rewritten history, see
       ``chunk_plans._drop_unreachable``).
    4. Skip commits already stored for this fingerprint (another chunk or an earlier
       attempt wrote them): the unique (repository, fingerprint, sha) constraint is the
       last line of defence; this check keeps the common case free of errors.
    5. Insert the commits and their file rows with the database's fastest bulk path
       (SQLite ``executemany``, PostgreSQL ``COPY``); mark the chunk done.
    6. Add the number of commit rows the database reported inserted to the stored
       count (``commit_counts.add_stored``), last, in the same transaction.

    PostgreSQL does all of it in one transaction. On SQLite, whose single write lock a
    large chunk's transaction would hold for seconds, step 5 goes slice by slice (about
    ``GITWARD_SQLITE_WRITE_SLICE`` rows each, ``_slices``), and after each slice
    ``wanted()`` is asked whether another writer should get the lock now (a bulk chunk's
    job: whether express work runs). If so, the transaction commits what it wrote so
    far (steps 5 and 6 for those slices), ``pause()`` runs (the job holds its next slice
    back while express work runs and checks its lease), and a new transaction goes on
    from step 2 (docs/scheduling.md#bulk-writes-in-slices-on-sqlite). With nobody
    waiting it stays one transaction, as on PostgreSQL. Only the transaction that writes
    the last slice marks the chunk done, so a chunk is never done without every row; a
    crash or a lost lease between two transactions leaves whole commits stored and
    counted, which the chunk's next attempt skips (step 4), as it skips another chunk's.
    """
    planned = chunk.sha_list()
    got = [r.sha for r in records]
    if got != planned:
        raise ChunkMismatch(
            f"chunk {chunk.key}: git returned {len(got)} commits, {len(planned)} planned"
        )
    rows = _Rows(chunk.repository_id, chunk.fingerprint, records, token or 0)
    if connection.vendor == "sqlite":
        parts = _slices(rows, int(settings.SQLITE_WRITE_SLICE))
    else:
        parts = [range(len(rows.shas))]
    inserted = done = 0
    while done < len(parts):
        if done and pause is not None:
            pause()
        written, done = _write_slices(chunk, rows, parts, done, records, token, wanted)
        if written is None:  # the chunk was dropped
            break
        inserted += written
    return inserted


def _slices(rows: _Rows, size: int) -> list[range]:
    """The chunk's commits cut in runs of at least ``size`` rows each (a commit's row
    and its file rows; the last run may be smaller), in chunk order."""
    out: list[range] = []
    start = weight = 0
    for i, files in enumerate(rows.files):
        weight += 1 + len(files)
        if weight >= size:
            out.append(range(start, i + 1))
            start, weight = i + 1, 0
    if start < len(rows.files) or not out:
        out.append(range(start, len(rows.files)))
    return out


def _write_slices(
    chunk: Chunk,
    rows: _Rows,
    parts: list[range],
    first: int,
    records: Sequence[CommitRecord],
    token: int | None,
    wanted: Callable[[], bool] | None,
) -> tuple[int | None, int]:
    """Steps 2–6 of ``write_chunk`` in one transaction, for ``parts[first]`` and the
    slices after it until ``wanted()`` asks for the lock or the last slice is written
    (which marks the chunk done). Returns (rows inserted, index of the next slice to
    write); rows ``None``: the chunk was dropped, nothing written."""
    repo_id, fp = rows.repo_id, rows.fp
    with transaction.atomic():
        # Race: the token check comes first, before any row is written. It locks the
        # token row (PostgreSQL FOR UPDATE; SQLite's IMMEDIATE transaction already holds
        # the write lock), so no newer token can be issued between this check and our
        # commit. COPY and executemany are statements of this same transaction: if the
        # check fails, or anything after it, nothing of it becomes visible. Each
        # transaction checks again: a lease lost between two stores nothing more.
        check_token(chunk.lock_key(), token)
        # Race: a plan after a rewritten history drops this chunk (its commits are no
        # longer all reachable) while it was analysed. The plan's UPDATE and this lock
        # take the chunk row in turn (SQLite: one write transaction at a time): a drop
        # committed first is seen here and nothing is written; one that comes after
        # waits for this commit and then deletes what it stored that is unreachable
        # (so a drop between two transactions also removes the earlier ones' commits).
        state = (
            Chunk.objects.select_for_update().filter(pk=chunk.pk).values_list("state", flat=True)
        ).first()
        if state in (None, Chunk.State.DROPPED):
            return None, first
        inserted = 0
        n = first
        while n < len(parts):
            part = parts[n]
            existing = stored_shas(repo_id, fp, [rows.shas[i] for i in part])
            fresh = [i for i in part if rows.shas[i] not in existing]
            got = 0
            if fresh:
                if connection.vendor == "postgresql":
                    got = _copy_postgresql(fresh, rows)
                else:
                    got = _insert_sqlite(fresh, rows)
            if got:
                bump_months(repo_id, fp, (records[i].committed_at for i in fresh))
            inserted += got
            n += 1
            if n < len(parts) and wanted is not None and wanted():
                break  # commit what is written: another writer waits for the lock
        if n == len(parts):
            failpoint("analyze.writing", chunk.repository.name)
            Chunk.objects.filter(pk=chunk.pk).update(
                state=Chunk.State.DONE, token=token, error="", finished_at=djtz.now()
            )
        # Last statement before the commit: on PostgreSQL it row-locks the count, so
        # concurrent chunk writes of this repository wait for each other only for the
        # commit itself. Exact because it is what this transaction inserted, and it
        # rolls back with the rows (see dashboard.repositories.commit_counts).
        add_stored(repo_id, fp, inserted)
    return inserted, n


# ---------------------------------------------------------------------------- reads


def _local(moment: datetime, offset_minutes: int) -> str:
    return moment.astimezone(timezone(timedelta(minutes=offset_minutes))).isoformat()


def commit_dict(c: Commit, files: Iterable[FileChange] | None = None) -> dict[str, Any]:
    """A commit in the API shape (docs/api.md); dates keep their own offset."""
    out: dict[str, Any] = {
        "sha": c.sha,
        "parents": c.parent_list(),
        "author_name": c.author_name,
        "author_email": c.author_email,
        "authored_at": _local(c.authored_at, c.author_tz),
        "committer_name": c.committer_name,
        "committer_email": c.committer_email,
        "committed_at": _local(c.committed_at, c.committer_tz),
        "subject": c.subject,
        "is_merge": c.is_merge,
        "files_changed": c.files_changed,
        "insertions": c.insertions,
        "deletions": c.deletions,
    }
    if files is not None:
        out["files"] = [
            {
                "path": f.path,
                "added": f.added,
                "deleted": f.deleted,
                "binary": f.binary,
                "language": f.language,
            }
            for f in files
        ]
    return out


class BadCursor(ValueError):
    pass


def _encode_cursor(c: Commit) -> str:
    raw = json.dumps([c.committed_at.isoformat(), c.pk]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[datetime, int]:
    """A cursor ``_encode_cursor`` could have made, or ``BadCursor``: an aware time that
    converts to UTC (year 1 at +14:00 does not: ``OverflowError`` where the database
    driver converts it) and an id in the 64-bit range (docs/api.md#limits)."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        stamp, pk = json.loads(base64.urlsafe_b64decode(padded.encode()))
        when = datetime.fromisoformat(stamp)
        if when.tzinfo is None or isinstance(pk, bool) or not isinstance(pk, int):
            raise ValueError("not a cursor of ours")
        if not 0 < pk <= DB_INT_MAX:
            raise ValueError("id out of range")
        return when.astimezone(UTC), pk
    except (ValueError, TypeError, OverflowError, RecursionError, binascii.Error) as exc:
        raise BadCursor("invalid cursor") from exc


def commit_page(
    repo: Repository,
    *,
    fingerprint: str,
    limit: int = 50,
    cursor: str | None = None,
    with_files: bool = False,
) -> tuple[list[Commit], str | None]:
    """Newest first, keyset-paginated on (committed_at, id): each page is one index
    range scan, as fast at commit 100,000 as at commit 1."""
    qs = Commit.objects.filter(repository=repo, fingerprint=fingerprint)
    if cursor:
        stamp, pk = _decode_cursor(cursor)
        qs = qs.filter(Q(committed_at__lt=stamp) | Q(committed_at=stamp, pk__lt=pk))
    rows = list(qs.order_by("-committed_at", "-id")[: limit + 1])
    nxt = _encode_cursor(rows[limit - 1]) if len(rows) > limit else None
    rows = rows[:limit]
    if with_files:
        by_commit: dict[int, list[FileChange]] = {}
        for f in FileChange.objects.filter(commit__in=[r.pk for r in rows]).order_by("id"):
            by_commit.setdefault(f.commit_id, []).append(f)
        for r in rows:
            r.file_rows = by_commit.get(r.pk, [])
    return rows, nxt


def iter_commits(repo: Repository, *, fingerprint: str) -> Iterable[dict[str, Any]]:
    """Every stored commit with its files, in storage order, streamed in batches."""
    last_id = 0
    while True:
        batch = list(
            Commit.objects.filter(
                repository=repo, fingerprint=fingerprint, pk__gt=last_id
            ).order_by("id")[:1000]
        )
        if not batch:
            return
        files: dict[int, list[FileChange]] = {}
        for f in FileChange.objects.filter(commit__in=[c.pk for c in batch]).order_by("id"):
            files.setdefault(f.commit_id, []).append(f)
        for c in batch:
            yield commit_dict(c, files.get(c.pk, []))
        last_id = batch[-1].pk
