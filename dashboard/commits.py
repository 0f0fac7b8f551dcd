"""Writing analysed chunks and reading commits back."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone as djtz

from dashboard.fencing import check_token
from dashboard.models import Chunk, Commit, FileChange, Repository
from workers.failpoints import failpoint
from workers.history import CommitRecord


class ChunkMismatch(RuntimeError):
    """git returned other commits than the chunk planned (history rewritten?)."""


def _offset_minutes(moment: datetime) -> int:
    off = moment.utcoffset()
    return int(off.total_seconds() // 60) if off is not None else 0


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


def _text(value: str, limit: int | None = None) -> str:
    """Repository text as the database can store it (PostgreSQL refuses NUL)."""
    if "\x00" in value:
        value = value.replace("\x00", "\ufffd")
    return value[:limit] if limit else value


def _insert_many(model: Any, columns: Sequence[str], rows: list[tuple[Any, ...]]) -> None:
    """One ``executemany`` INSERT: an order of magnitude cheaper than building model
    instances for ``bulk_create`` (measured in bench/analysis.py)."""
    if not rows:
        return
    qn = connection.ops.quote_name
    cols = ", ".join(qn(model._meta.get_field(c).column) for c in columns)
    marks = ", ".join(["%s"] * len(columns))
    # Identifiers come from model metadata, values are parameters: no injection.
    sql = f"INSERT INTO {qn(model._meta.db_table)} ({cols}) VALUES ({marks})"  # noqa: S608
    with connection.cursor() as cursor:
        cursor.executemany(sql, rows)


def write_chunk(*, chunk: Chunk, records: Sequence[CommitRecord], token: int | None) -> int:
    """Store every commit of ``chunk`` in one transaction; return rows inserted.

    1. Build the rows before the transaction (no database lock held meanwhile).
    2. Check the fencing token of the chunk lock is still the newest (row locked until
       commit, see ``check_token``): a holder whose lease ran out writes nothing.
    3. Skip commits already stored for this fingerprint (another chunk or an earlier
       attempt wrote them): the unique (repository, fingerprint, sha) constraint is the
       last line of defence; this check keeps the common case free of errors.
    4. Insert commits, read back their ids, insert their file rows, mark the chunk done.
    """
    planned = chunk.sha_list()
    got = [r.sha for r in records]
    if got != planned:
        raise ChunkMismatch(
            f"chunk {chunk.key}: git returned {len(got)} commits, {len(planned)} planned"
        )
    repo_id = chunk.repository_id
    fp = chunk.fingerprint
    adapt = connection.ops.adapt_datetimefield_value
    commit_rows = {
        r.sha: (
            repo_id,
            fp,
            r.sha,
            " ".join(r.parents),
            _text(r.author_name, 512),
            _text(r.author_email, 512),
            _text(r.author_canonical_name, 512),
            _text(r.author_canonical_email, 512),
            adapt(r.authored_at),
            _offset_minutes(r.authored_at),
            _text(r.committer_name, 512),
            _text(r.committer_email, 512),
            adapt(r.committed_at),
            _offset_minutes(r.committed_at),
            _text(r.subject),
            r.is_merge,
            r.files_changed,
            r.insertions,
            r.deletions,
            token or 0,
        )
        for r in records
    }
    with transaction.atomic():
        check_token(chunk.lock_key(), token)
        existing = set(
            Commit.objects.filter(
                repository_id=repo_id, fingerprint=fp, sha__in=planned
            ).values_list("sha", flat=True)
        )
        fresh = [r for r in records if r.sha not in existing]
        _insert_many(Commit, COMMIT_COLUMNS, [commit_rows[r.sha] for r in fresh])
        failpoint("analyze.writing", chunk.repository.name)
        ids = dict(
            Commit.objects.filter(
                repository_id=repo_id, fingerprint=fp, sha__in=[r.sha for r in fresh]
            ).values_list("sha", "pk")
        )
        file_rows = [
            (ids[r.sha], repo_id, fp, _text(f.path), f.added, f.deleted, f.binary, f.language)
            for r in fresh
            for f in r.files
        ]
        _insert_many(FileChange, FILE_COLUMNS, file_rows)
        Chunk.objects.filter(pk=chunk.pk).update(
            state=Chunk.State.DONE, token=token, error="", finished_at=djtz.now()
        )
    return len(fresh)


# ---------------------------------------------------------------------------- reads


def _local(moment: datetime, offset_minutes: int) -> str:
    return moment.astimezone(timezone(timedelta(minutes=offset_minutes))).isoformat()


def commit_dict(c: Commit, files: Iterable[FileChange] | None = None) -> dict[str, Any]:
    """A commit in the API shape (fields of DESIGN §3); dates keep their own offset."""
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
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        stamp, pk = json.loads(base64.urlsafe_b64decode(padded.encode()))
        return datetime.fromisoformat(stamp), int(pk)
    except (ValueError, TypeError, binascii.Error) as exc:
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
