"""The ``git log -z --numstat`` stream gitward reads, and its parser (at C speed).

One commit is a header token and its numstat entries, all NUL-terminated (the format
is :func:`_parse_log`'s docstring; git's options are
:func:`workers.analysis.history.stream_commits`'s).
The parser splits whole 64 KiB blocks at NUL and entries at their tabs with one C call
each, decodes and classifies each distinct path once per stream, and builds each file
and commit as one tuple: nothing else is allocated per file.  Results are exactly git's
(tests/workers/analysis/test_history.py, test_quirks.py and test_analyzer.py compare with git
itself).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import NamedTuple

from workers.analysis.languages import language_for
from workers.git import path_text

MAX_RECORD_BYTES = 64 * 1024 * 1024
#: Default bound on the files of one commit (a git bomb's root commit has ~10^9 paths):
#: docs/security.md#g19.
MAX_FILES = 250_000

_HEADER_FIELDS = 11  # sha, parents, an, ae, aN, aE, ad, cn, ce, cd, subject
#: The header, then a token of its own (after a NUL, starting with \x1d) holding the
#: values of the commit's ``Co-authored-by:`` trailers, \x1f-separated, continuation
#: lines unfolded (docs/analytics.md#co-authors).
_FORMAT = (
    "%x1e"
    + "%x1f".join(["%H", "%P", "%an", "%ae", "%aN", "%aE", "%ad", "%cn", "%ce", "%cd", "%s"])
    + "%x00%x1d%(trailers:key=Co-authored-by,valueonly,unfold,separator=%x1f)"
)
#: At most this many co-authors are kept per commit, each at most this long.
MAX_CO_AUTHORS = 100
MAX_CO_AUTHOR_CHARS = 1024


class HistoryError(RuntimeError):
    """git failed, or produced output this module cannot parse."""


class CommitTooLarge(HistoryError):
    """One commit's record exceeds a bound (bytes or files): a permanent failure."""


class FileStat(NamedTuple):
    """One file of a commit's diff. A tuple (immutable, cheap to build: the parser makes
    one per file and nothing else)."""

    path: str  # workers.git.path_text: UTF-8 as is, else git's quoted form (one-to-one)
    added: int  # 0 for binary
    deleted: int  # 0 for binary
    binary: bool
    language: str  # workers.analysis.languages.language_for(path); "" if unknown
    old_path: str | None = None  # the path before a detected rename (detect_renames only)


class CommitRecord(NamedTuple):
    """One commit as git reports it (docs/analysis.md#analysis-semantics). A tuple, like
    :class:`FileStat`."""

    sha: str
    parents: tuple[str, ...]
    author_name: str  # raw %an
    author_email: str  # raw %ae
    author_canonical_name: str  # mailmap-aware %aN
    author_canonical_email: str  # mailmap-aware %aE
    authored_at: datetime  # timezone-aware, the commit's own offset
    committer_name: str
    committer_email: str
    committed_at: datetime
    subject: str  # %s, truncated to max_subject characters
    is_merge: bool
    files: tuple[FileStat, ...]
    #: The ``Co-authored-by:`` trailer values (``Name <email>``), in message order.
    co_authors: tuple[str, ...] = ()

    @property
    def files_changed(self) -> int:
        return len(self.files)

    @property
    def insertions(self) -> int:
        return sum(f.added for f in self.files)

    @property
    def deletions(self) -> int:
        return sum(f.deleted for f in self.files)


_TZ_CACHE: dict[str, timezone] = {}


#: What git's own ``git log`` shows for an identity whose date it cannot parse.
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: The latest instant Python (and so Django) can hold; later git dates are clamped to it.
LATEST = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)


def _parse_date(raw: str) -> datetime:
    """Parse git's ``--date=raw`` form: ``<unix seconds> <+|-><digits>``.

    The offset is read as git reads it (``+hhmm`` as a number: hours = n // 100,
    minutes = n % 100, so ``-1260`` is -13:00 and ``+51800`` is +518:00); one that Python
    cannot represent (24 h or more) falls back to UTC.  git prints nothing for an identity
    it cannot parse (fsck's ``missingEmail``, ``badDate``): that is the epoch, as in
    ``git log``.  A date past year 9999 (git allows ~year 292 billion) is clamped to
    :data:`LATEST`."""
    if not raw:
        return EPOCH
    ts_b, _, off_b = raw.partition(" ")
    ts = int(ts_b)  # git prints ASCII digits; anything else raises ValueError
    tz = _TZ_CACHE.get(off_b)
    if tz is None:
        digits = off_b[1:]
        if len(off_b) < 2 or off_b[0] not in "+-" or not (digits.isascii() and digits.isdigit()):
            raise ValueError(f"bad timezone {off_b!r}")
        hours, minutes = divmod(int(digits), 100)
        total = hours * 60 + minutes
        delta = timedelta(minutes=-total if off_b[0] == "-" else total)
        tz = timezone(delta) if abs(delta) < timedelta(hours=24) else UTC
        if len(off_b) == 5:  # bounded: at most 2 * 10**4 well-formed offsets
            _TZ_CACHE[off_b] = tz
    try:
        return datetime.fromtimestamp(ts, tz)
    except (OverflowError, ValueError, OSError):
        return LATEST if ts > 0 else EPOCH


#: Builds a NamedTuple from a tuple of its fields without its Python-level ``__new__``.
_new_tuple = tuple.__new__


def _co_authors(token: bytes) -> tuple[str, ...]:
    """The trailer token's values (without its \\x1d), bounded (docs/security.md#g21)."""
    values = token.decode("utf-8", "replace").split("\x1f")
    kept = (v.strip()[:MAX_CO_AUTHOR_CHARS] for v in values[:MAX_CO_AUTHORS])
    return tuple(v for v in kept if v)


def _header_record(
    header: bytes, files: list[FileStat], max_subject: int, co_authors: tuple[str, ...] = ()
) -> CommitRecord:
    """A :class:`CommitRecord` from one header token (without its \\x1e) and its files.

    The header is decoded once as a whole and then split: \\x1f is ASCII, so a UTF-8
    decoder with ``errors="replace"`` ends any broken sequence at it exactly as it would
    at the end of a field decoded on its own (the quirk tests compare with git)."""
    h = header.decode("utf-8", "replace").split("\x1f", _HEADER_FIELDS - 1)
    if len(h) != _HEADER_FIELDS:
        raise HistoryError(f"malformed commit header: {header[:200]!r}")
    try:
        authored = _parse_date(h[6])
        committed = _parse_date(h[9])
    except ValueError as exc:
        raise HistoryError(f"malformed commit header for {h[0]}: {exc}") from None
    parents = tuple(h[1].split())
    subject = h[10]
    if len(subject) > max_subject:
        subject = subject[:max_subject]
    return _new_tuple(
        CommitRecord,
        (h[0], parents, h[2], h[3], h[4], h[5], authored, h[7], h[8], committed, subject,
         len(parents) > 1, tuple(files), co_authors),
    )  # fmt: skip


#: Paths decoded and classified per stream; bounded so a history of unique paths
#: (a git bomb) cannot grow it without limit.
_PATH_CACHE_LIMIT = 100_000


def _parse_log(
    blocks: Iterable[bytes],
    *,
    max_subject: int,
    max_record_bytes: int | None = None,
    max_files: int = MAX_FILES,
) -> Iterator[CommitRecord]:
    """Parse ``git log -z --numstat --format=<_FORMAT>`` output, block by block.

    The format: tokens are NUL-terminated.  A token starting with \\x1e is a commit
    header, its 11 fields separated by \\x1f (the subject is the last field and cannot
    contain NUL).  Other tokens are numstat entries ``added\\tdeleted\\tpath`` (the first
    one after a header is prefixed by \\n; binary files have ``-`` for both numbers);
    with rename detection an entry ``added\\tdeleted\\t`` is followed by two raw path
    tokens (old, new), which may contain any byte but NUL, so they are consumed by
    position: ``added\\tdeleted\\t\\0old\\0new\\0`` is one file: ``path`` new,
    ``old_path`` old.

    Speed: each 64 KiB block is split at NUL by one C call; an entry is split at its two
    tabs by another; a path is decoded and classified (:func:`language_for`) once per
    stream (``paths`` cache) and each file is one tuple (:class:`FileStat`).  Nothing
    else is allocated per file.
    """
    header: bytes | None = None  # the current commit's header (without \x1e)
    co_authors: tuple[str, ...] = ()  # the current commit's trailer values
    files: list[FileStat] = []
    size = 0  # bytes of the current commit's record
    pending = b""
    # rename state: the numbers of a rename entry waiting for its paths; 2 = old, 1 = new
    want_paths = 0
    ren_added = ren_deleted = 0
    ren_binary = False
    ren_old = b""
    limit = MAX_RECORD_BYTES if max_record_bytes is None else max_record_bytes
    paths: dict[bytes, tuple[str, str]] = {}
    add = files.append

    def path_of(raw: bytes) -> tuple[str, str]:
        hit = paths.get(raw)
        if hit is None:
            # Distinct names stay distinct (a lossy decode would merge two undecodable
            # ones); the language comes from the name as it reads.
            text = path_text(raw)
            hit = (text, language_for(raw.decode("utf-8", "replace")))
            if len(paths) >= _PATH_CACHE_LIMIT:
                paths.clear()
            paths[raw] = hit
        return hit

    def too_large(what: str) -> CommitTooLarge:
        assert header is not None
        sha = header.split(b"\x1f", 1)[0].decode("utf-8", "replace")
        return CommitTooLarge(f"commit {sha} is too large ({what})")

    for block in blocks:
        if pending:
            block = pending + block
        tokens = block.split(b"\0")
        pending = tokens.pop()
        if len(pending) > limit:
            raise CommitTooLarge(f"commit record too large (more than {limit} bytes)")
        for tok in tokens:
            if want_paths:
                size += len(tok)
                want_paths -= 1
                if want_paths:
                    ren_old = tok
                else:
                    path, lang = path_of(tok)
                    old = path_text(ren_old)
                    add(_new_tuple(FileStat, (path, ren_added, ren_deleted, ren_binary, lang, old)))
                continue
            first = tok[:1]
            if first == b"\n":
                tok = tok[1:]
                first = tok[:1]
            if not tok:
                continue
            if first == b"\x1e":
                if tok.count(b"\x1f") < _HEADER_FIELDS - 1:
                    raise HistoryError(f"malformed commit header: {tok[:200]!r}")
                if header is not None:
                    yield _header_record(header, files, max_subject, co_authors)
                    files.clear()
                header = tok[1:]
                co_authors = ()
                size = len(tok)
                continue
            if first == b"\x1d" and header is not None and not files:
                # The header's trailer token (_FORMAT): numstat entries start with a
                # digit or "-", so no file entry starts with \x1d.
                size += len(tok)
                if size > limit:
                    raise too_large(f"record of more than {limit} bytes")
                co_authors = _co_authors(tok[1:])
                continue
            if header is None:
                raise HistoryError(f"unexpected git output: {tok[:200]!r}")
            size += len(tok)
            if size > limit:
                raise too_large(f"record of more than {limit} bytes")
            if len(files) >= max_files:
                raise too_large(f"changes more than {max_files} files")
            parts = tok.split(b"\t", 2)
            if len(parts) != 3:
                raise HistoryError(f"malformed numstat entry: {tok[:200]!r}")
            a, d, path_b = parts
            if a == b"-" and d == b"-":
                added = deleted = 0
                binary = True
            else:
                try:
                    added = int(a)
                    deleted = int(d)
                except ValueError:
                    raise HistoryError(f"malformed numstat entry: {tok[:200]!r}") from None
                binary = False
            if path_b:
                hit = paths.get(path_b)
                path, lang = path_of(path_b) if hit is None else hit
                add(_new_tuple(FileStat, (path, added, deleted, binary, lang, None)))
            else:  # rename/copy: old and new path follow as separate tokens
                want_paths = 2
                ren_added, ren_deleted, ren_binary = added, deleted, binary
    if pending.strip(b"\n"):  # -w with an all-whitespace diff leaves a bare "\n"
        raise HistoryError(f"truncated git output: {pending[:200]!r}")
    if want_paths:
        raise HistoryError("truncated git output (rename paths missing)")
    if header is not None:
        yield _header_record(header, files, max_subject, co_authors)
