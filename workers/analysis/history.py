"""Streaming commit-history extraction from a (bare) git repository.

One ``git log`` process per :func:`stream_commits` call; its output is parsed incrementally
(64 KiB blocks), so memory is bounded by the largest single commit record, never by the
length of the history.  Semantics are docs/analysis.md#analysis-semantics: per-file
``--numstat`` against the *first parent* (root commits against the empty tree), no rename
detection by default, binary files reported with ``binary=True`` and 0/0 lines.

Notes / decisions:

* ``git log --no-walk=unsorted --stdin`` prints the given commits in the given order and
  still honours ``--diff-merges=first-parent`` (checked against ``git diff --numstat
  <first-parent> <merge>`` in the tests).  Git prints each commit only once, so duplicate
  shas in the input are yielded once (first occurrence).
* Text (names, e-mails, subject) is decoded as UTF-8 with ``errors="replace"``:
  surrogate escapes cannot be stored in PostgreSQL, so undecodable bytes become U+FFFD.
  Paths are names, so two must never merge: a path that is not UTF-8 becomes git's
  quoted form instead (``workers.git.path_text``), one-to-one.
  Git itself re-encodes commit messages to UTF-8 (``i18n.logOutputEncoding``).
* The analysis options come from one :class:`workers.analysis.analyzer.AnalyzerConfig` (the
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
from pathlib import Path
from typing import IO, Protocol

from workers.analysis.analyzer import DEFAULT, AnalyzerConfig
from workers.analysis.chunks import ShaList
from workers.analysis.numstat import (
    _FORMAT,
    MAX_FILES,
    MAX_RECORD_BYTES,
    CommitRecord,
    CommitTooLarge,
    FileStat,
    HistoryError,
    _parse_log,
)
from workers.git import command, death_prefix, follow_niceness, hardened_env

__all__ = [
    "CommitRecord",
    "CommitTooLarge",
    "FileStat",
    "GitRunner",
    "HistoryError",
    "default_git_runner",
    "list_commits",
    "renamed_commits",
    "stream_commits",
]

READ_BLOCK = 64 * 1024
STDERR_LIMIT = 2048


class GitRunner(Protocol):
    """Starts ``git <args>`` for the repository ``cwd`` with stdout (and stderr) piped."""

    def __call__(
        self, args: list[str], *, cwd: str | Path, stdin: int | None
    ) -> subprocess.Popen[bytes]: ...


def default_git_runner(
    args: list[str], *, cwd: str | Path, stdin: int | None
) -> subprocess.Popen[bytes]:
    """Run ``git`` (args exclude the executable) with ``GIT_DIR=cwd`` and the same fixed
    environment and ``-c`` overrides as :mod:`workers.git.runner` (nothing inherited from the
    caller's environment: no ``GIT_EXTERNAL_DIFF``, ``GIT_PAGER``, ``GIT_CONFIG_*``).

    The process gets its own session/process group so it can be killed as a whole, and
    that session the caller's niceness (``follow_niceness``).
    """
    env = hardened_env({"LC_ALL": "C"})
    env["GIT_DIR"] = os.fspath(cwd)
    proc = subprocess.Popen(
        [*death_prefix(), *command(args)],
        cwd=cwd,
        env=env,
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    follow_niceness(proc.pid)
    return proc


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
    killed at that point, so a git bomb costs bounded time and memory
    (docs/security.md#g19).  Subjects are cut to ``max_subject`` characters (docs/security.md#g21).
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
) -> ShaList:
    """All commit shas reachable from ``ref`` but not from ``exclude``, oldest first.

    ``git rev-list --reverse --topo-order --parents --stdin`` (the parents only mark the
    merges, which weigh more when chunks are cut: ``ShaList.weights``); the exclusions
    are passed as ``^rev``
    lines on stdin (equivalent to ``--not``, and also supported by git < 2.42).
    Takes no analyzer config on purpose: which commits exist does not depend on the
    version (a commit touching only excluded paths is still analysed, with no files).
    The result is a :class:`workers.analysis.chunks.ShaList` (20 bytes a commit, filled block
    by block from git's output, no ``str`` per commit): a sync holds whole histories.
    """
    lines = [_check_rev(ref)] + [b"^" + _check_rev(x) for x in exclude]
    runner = git or default_git_runner
    proc = _Proc(
        runner(
            ["rev-list", "--reverse", "--topo-order", "--parents", "--stdin"],
            cwd=git_dir,
            stdin=subprocess.PIPE,
        ),
        b"\n".join(lines) + b"\n",
    )
    out = ShaList()
    finished = False
    try:
        pending = b""
        for block in proc.blocks():
            if pending:
                block = pending + block
            cut = block.rfind(b"\n") + 1
            pending = block[cut:]
            out.extend_parent_lines(block[:cut])
        proc.finish()
        if pending:
            out.extend_parent_lines(pending + b"\n")
        finished = True
    except ValueError as exc:
        raise HistoryError(f"unexpected git rev-list output: {exc}") from exc
    finally:
        if not finished:
            proc.kill()
    return out


def renamed_commits(
    git_dir: str | Path, shas: Iterable[str], *, git: GitRunner | None = None
) -> set[str]:
    """The commits among ``shas`` in which git reports a rename: ``git log -M
    --name-status`` against the first parent, exactly as ``detect_renames`` analyses
    them (``-M``, ``--diff-merges=first-parent``, ``--root``), from one git process.

    The result contract asks it about the commits whose stored numbers changed only
    (docs/rollouts.md#result-contract), so its cost is bounded by those. Parsed from
    ``-z`` output token by token (a status, then one path, or two for a rename or
    copy), so no path can pass for a status or a commit. Raises :class:`HistoryError`
    if git fails (an unknown sha, a missing mirror).
    """
    lines = list(dict.fromkeys(_check_rev(s) for s in shas))
    if not lines:
        return set()
    args = [
        "log",
        "--no-walk=unsorted",
        "--stdin",
        "-z",
        "-M",
        "--name-status",
        "--diff-merges=first-parent",
        "--root",
        "--no-color",
        "--no-ext-diff",
        "--no-textconv",
        "--format=%x01%H",
    ]
    runner = git or default_git_runner
    proc = _Proc(runner(args, cwd=git_dir, stdin=subprocess.PIPE), b"\n".join(lines) + b"\n")
    finished = False
    try:
        out = b"".join(proc.blocks())
        proc.finish()
        finished = True
    finally:
        if not finished:
            proc.kill()
    renamed: set[str] = set()
    current = ""
    tokens = out.split(b"\0")
    i = 0
    while i < len(tokens):
        token = tokens[i].lstrip(b"\n")
        if token.startswith(b"\x01"):
            current = token[1:].decode("ascii", "replace")
            i += 1
        elif not token:
            i += 1
        else:
            status = token[:1]
            if status == b"R":
                renamed.add(current)
            i += 3 if status in (b"R", b"C") else 2
    return renamed
