"""Streaming commit-history extraction from a (bare) git repository.

One ``git log`` process per :func:`stream_commits` call; its output is parsed incrementally
(64 KiB blocks), so memory is bounded by the largest single commit record, never by the
length of the history.  Semantics are DESIGN.md §3: per-file ``--numstat`` against the
*first parent* (root commits against the empty tree), no rename detection by default,
binary files reported with ``binary=True`` and 0/0 lines.

Notes / decisions:

* ``git log --no-walk=unsorted --stdin`` prints the given commits in the given order and
  still honours ``--diff-merges=first-parent`` (checked against ``git diff --numstat
  <first-parent> <merge>`` in the tests).  Git prints each commit only once, so duplicate
  shas in the input are yielded once (first occurrence).
* Text (names, e-mails, subject, paths) is decoded as UTF-8 with ``errors="replace"``:
  surrogate escapes cannot be stored in PostgreSQL, so undecodable bytes become U+FFFD.
  Git itself re-encodes commit messages to UTF-8 (``i18n.logOutputEncoding``).
* The analysis options come from one :class:`workers.analyzer.AnalyzerConfig` (the
  version the worker loaded), and only become git arguments here:
  ``detect_renames`` → ``-M`` (else ``--no-renames``): a renamed file is one
  :class:`FileStat` whose ``path`` is the *new* path and ``old_path`` the old one;
  ``ignore_whitespace`` → ``-w``; ``exclude_paths`` → ``--sparse -- :(exclude,glob)P…``.
  Git applies the pathspec *before* rename detection, exactly as ``git log -M --
  :(exclude,glob)P`` does: a file renamed out of an excluded directory is an added file.
  ``--sparse`` keeps every given commit in the output, so a commit that only touches
  excluded files (or a root commit of only excluded files) is yielded with no files,
  where a plain ``git log -- <pathspec>`` would drop it.  The default config passes
  no pathspec at all, so its git command is unchanged.
* Commit timestamps keep the commit's own UTC offset; an offset git recorded that Python
  cannot represent (|offset| >= 24h) falls back to UTC.
* Mailmap: ``%aN``/``%aE`` honour ``.mailmap`` in the work tree, or ``HEAD:.mailmap`` for a
  bare repository (git's ``mailmap.blob`` default).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Generator, Iterable, Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import IO, NamedTuple, Protocol

from workers.analyzer import DEFAULT, AnalyzerConfig
from workers.gitproc import command, death_prefix, hardened_env
from workers.languages import language_for

__all__ = [
    "CommitRecord",
    "CommitTooLarge",
    "FileStat",
    "GitRunner",
    "HistoryError",
    "default_git_runner",
    "list_commits",
    "stream_commits",
]

READ_BLOCK = 64 * 1024
MAX_RECORD_BYTES = 64 * 1024 * 1024
#: Default bound on the files of one commit (a git bomb's root commit has ~10^9), G19.
MAX_FILES = 250_000
STDERR_LIMIT = 2048

_HEADER_FIELDS = 11  # sha, parents, an, ae, aN, aE, ad, cn, ce, cd, subject
_FORMAT = "%x1e" + "%x1f".join(
    ["%H", "%P", "%an", "%ae", "%aN", "%aE", "%ad", "%cn", "%ce", "%cd", "%s"]
)


class HistoryError(RuntimeError):
    """git failed, or produced output this module cannot parse."""


class CommitTooLarge(HistoryError):
    """One commit's record exceeds a bound (bytes or files): a permanent failure."""


class GitRunner(Protocol):
    """Starts ``git <args>`` for the repository ``cwd`` with stdout (and stderr) piped."""

    def __call__(
        self, args: list[str], *, cwd: str | Path, stdin: int | None
    ) -> subprocess.Popen[bytes]: ...


def default_git_runner(
    args: list[str], *, cwd: str | Path, stdin: int | None
) -> subprocess.Popen[bytes]:
    """Run ``git`` (args exclude the executable) with ``GIT_DIR=cwd`` and the same fixed
    environment and ``-c`` overrides as :mod:`workers.gitproc` (nothing inherited from the
    caller's environment: no ``GIT_EXTERNAL_DIFF``, ``GIT_PAGER``, ``GIT_CONFIG_*``).

    The process gets its own session/process group so it can be killed as a whole.
    """
    env = hardened_env({"LC_ALL": "C"})
    env["GIT_DIR"] = os.fspath(cwd)
    return subprocess.Popen(
        [*death_prefix(), *command(args)],
        cwd=cwd,
        env=env,
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


class FileStat(NamedTuple):
    """One file of a commit's diff. A tuple (immutable, cheap to build: the parser makes
    one per file and nothing else)."""

    path: str  # UTF-8 decoded with errors="replace" (see module docstring)
    added: int  # 0 for binary
    deleted: int  # 0 for binary
    binary: bool
    language: str  # workers.languages.language_for(path); "" if unknown
    old_path: str | None = None  # the path before a detected rename (detect_renames only)


class CommitRecord(NamedTuple):
    """One commit as git reports it (DESIGN §3). A tuple, like :class:`FileStat`."""

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

    @property
    def files_changed(self) -> int:
        return len(self.files)

    @property
    def insertions(self) -> int:
        return sum(f.added for f in self.files)

    @property
    def deletions(self) -> int:
        return sum(f.deleted for f in self.files)


# --------------------------------------------------------------------------- process helpers


class _Proc:
    """A running git process: feeds stdin from a thread, drains stderr from a thread."""

    def __init__(self, proc: subprocess.Popen[bytes], stdin_data: bytes | None) -> None:
        self.proc = proc
        self._stderr_tail = bytearray()
        self._threads: list[threading.Thread] = []
        if proc.stdout is None:
            self.kill()
            raise HistoryError("git runner did not pipe stdout")
        self.stdout: IO[bytes] = proc.stdout
        if proc.stdin is not None:
            t = threading.Thread(target=self._feed, args=(proc.stdin, stdin_data or b""))
            t.daemon = True
            t.start()
            self._threads.append(t)
        if proc.stderr is not None:
            t = threading.Thread(target=self._drain, args=(proc.stderr,))
            t.daemon = True
            t.start()
            self._threads.append(t)

    @staticmethod
    def _feed(pipe: IO[bytes], data: bytes) -> None:
        try:
            view = memoryview(data)
            for i in range(0, len(view), READ_BLOCK):
                pipe.write(view[i : i + READ_BLOCK])
        except (BrokenPipeError, OSError, ValueError):
            pass
        finally:
            with contextlib.suppress(OSError, ValueError):
                pipe.close()

    def _drain(self, pipe: IO[bytes]) -> None:
        try:
            while chunk := pipe.read(READ_BLOCK):
                self._stderr_tail += chunk
                if len(self._stderr_tail) > STDERR_LIMIT:
                    del self._stderr_tail[: len(self._stderr_tail) - STDERR_LIMIT]
        except (OSError, ValueError):
            pass

    def blocks(self) -> Iterator[bytes]:
        read = getattr(self.stdout, "read1", self.stdout.read)
        while chunk := read(READ_BLOCK):
            yield chunk

    def stderr_text(self) -> str:
        return bytes(self._stderr_tail).decode("utf-8", "replace").strip()

    def finish(self) -> None:
        """Wait for a normal exit; raise HistoryError on a non-zero status."""
        rc = self.proc.wait()
        self._join()
        self._close_pipes()
        if rc != 0:
            raise HistoryError(f"git exited with status {rc}: {self.stderr_text()}")

    def kill(self) -> None:
        """Kill git (its whole process group if it leads one) and reap it."""
        proc = self.proc
        if proc.poll() is None:
            try:
                if os.getpgid(proc.pid) == proc.pid:
                    os.killpg(proc.pid, signal.SIGKILL)
                else:
                    proc.kill()
            except (ProcessLookupError, PermissionError):
                pass
        self._close_pipes()
        proc.wait()
        self._join()

    def _join(self) -> None:
        for t in self._threads:
            t.join(timeout=5)

    def _close_pipes(self) -> None:
        for pipe in (self.proc.stdout, self.proc.stdin):
            if pipe is not None:
                with contextlib.suppress(OSError, ValueError):
                    pipe.close()


def _check_rev(rev: str) -> bytes:
    if not rev or rev.startswith(("-", "^")) or any(c in rev for c in "\n\r\0"):
        raise ValueError(f"invalid revision: {rev!r}")
    return rev.encode("utf-8")


# --------------------------------------------------------------------------- parsing


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


def _header_record(header: bytes, files: list[FileStat], max_subject: int) -> CommitRecord:
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
         len(parents) > 1, tuple(files)),
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
            text = raw.decode("utf-8", "replace")
            hit = (text, language_for(text))
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
                    old = ren_old.decode("utf-8", "replace")
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
                    yield _header_record(header, files, max_subject)
                    files.clear()
                header = tok[1:]
                size = len(tok)
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
        yield _header_record(header, files, max_subject)


# --------------------------------------------------------------------------- public API


def stream_commits(
    git_dir: str | Path,
    shas: Iterable[str],
    *,
    config: AnalyzerConfig = DEFAULT,
    git: GitRunner | None = None,
    max_subject: int = 65536,
    max_files: int = MAX_FILES,
    max_record_bytes: int | None = None,
) -> Generator[CommitRecord, None, None]:
    """Yield a :class:`CommitRecord` per sha, in the given order, from one git process.

    ``config`` is the analyzer version the caller loaded (module docstring): every sha
    is yielded whatever it excludes, with the files and numbers git reports under it.

    Raises :class:`HistoryError` (while iterating) if git fails, e.g. on an unknown sha,
    and :class:`CommitTooLarge` if one commit changes more than ``max_files`` files or
    its record exceeds ``max_record_bytes`` (default :data:`MAX_RECORD_BYTES`); git is
    killed at that point, so a git bomb costs bounded time and memory (G19).  Subjects
    are cut to ``max_subject`` characters (G21).
    Returns a generator: ``close()`` it (or let it be garbage-collected) to stop early;
    that kills and reaps the git process.  Arguments are validated eagerly (ValueError);
    git is only started on the first ``next()``.
    """
    seen: set[str] = set()
    lines: list[bytes] = []
    for sha in shas:
        if sha not in seen:
            seen.add(sha)
            lines.append(_check_rev(sha))
    if max_subject < 0:
        raise ValueError("max_subject must be >= 0")
    if max_files < 0 or (max_record_bytes is not None and max_record_bytes <= 0):
        raise ValueError("max_files must be >= 0 and max_record_bytes > 0")
    record_limit = MAX_RECORD_BYTES if max_record_bytes is None else max_record_bytes
    args = [
        "-c",
        "core.quotepath=off",
        "-c",
        "log.showSignature=false",
        "-c",
        "i18n.logOutputEncoding=UTF-8",
        "log",
        "--no-walk=unsorted",
        "--stdin",
        "-z",
        "--numstat",
        "-M" if config.detect_renames else "--no-renames",
        "--diff-merges=first-parent",
        "--root",
        "--no-relative",
        "--no-color",
        "--no-ext-diff",
        "--no-textconv",
        "--no-mailmap",  # %aN/%aE still apply .mailmap; this only keeps %an/%ae raw
        "--date=raw",
        f"--format={_FORMAT}",
    ]
    if config.ignore_whitespace:
        args.append("-w")
    if config.exclude_paths:
        # --sparse: show every given commit, also those the pathspec leaves with no
        # files (git log would otherwise drop them as TREESAME).  The patterns were
        # validated by AnalyzerConfig (no magic of their own, relative, no NUL).
        args += ["--sparse", "--", *(f":(exclude,glob){p}" for p in config.exclude_paths)]
    data = b"\n".join(lines) + b"\n" if lines else b""
    return _stream(
        git_dir,
        args,
        data,
        git or default_git_runner,
        max_subject,
        lines,
        (record_limit, max_files),
    )


def _stream(
    git_dir: str | Path,
    args: list[str],
    data: bytes,
    runner: GitRunner,
    max_subject: int,
    lines: list[bytes],
    limits: tuple[int, int],
) -> Generator[CommitRecord, None, None]:
    if not lines:
        return
    proc = _Proc(runner(args, cwd=git_dir, stdin=subprocess.PIPE), data)
    finished = False
    try:
        yield from _parse_log(
            proc.blocks(),
            max_subject=max_subject,
            max_record_bytes=limits[0],
            max_files=limits[1],
        )
        proc.finish()
        finished = True
    except CommitTooLarge:
        raise
    except HistoryError as exc:
        # prefer git's own error over a parse error caused by its early exit
        if proc.proc.poll() is not None and proc.proc.returncode not in (0, None):
            proc.kill()
            finished = True
            raise HistoryError(
                f"git exited with status {proc.proc.returncode}: {proc.stderr_text()}"
            ) from exc
        raise
    finally:
        if not finished:
            proc.kill()


def list_commits(
    git_dir: str | Path,
    ref: str,
    *,
    exclude: Iterable[str] = (),
    git: GitRunner | None = None,
) -> list[str]:
    """All commit shas reachable from ``ref`` but not from ``exclude``, oldest first.

    ``git rev-list --reverse --topo-order --stdin``; the exclusions are passed as ``^rev``
    lines on stdin (equivalent to ``--not``, and also supported by git < 2.42).
    Takes no analyzer config on purpose: which commits exist does not depend on the
    version (a commit touching only excluded paths is still analysed, with no files).
    """
    lines = [_check_rev(ref)] + [b"^" + _check_rev(x) for x in exclude]
    runner = git or default_git_runner
    proc = _Proc(
        runner(
            ["rev-list", "--reverse", "--topo-order", "--stdin"], cwd=git_dir, stdin=subprocess.PIPE
        ),
        b"\n".join(lines) + b"\n",
    )
    out: list[str] = []
    finished = False
    try:
        pending = b""
        for block in proc.blocks():
            if pending:
                block = pending + block
            parts = block.split(b"\n")
            pending = parts.pop()
            out.extend(p.decode("ascii") for p in parts if p)
        if pending:
            out.append(pending.decode("ascii"))
        proc.finish()
        finished = True
    finally:
        if not finished:
            proc.kill()
    return out
