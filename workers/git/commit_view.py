"""One commit of a mirror as the commit page shows it, read through GitPython.

The hot analysis path streams one ``git log`` per chunk (:mod:`workers.analysis.history`); pages
read single objects, so they use GitPython where it fits: the commit object through its
object database (``git cat-file --batch``), the mirror's head through its reference
reader (plain file reads, no process), and the patch through its command layer, streamed
and bounded here.

Every git process GitPython starts runs exactly like :mod:`workers.git.runner`'s: the
command goes through ``runner.command`` (hooks, fsmonitor, pager, external diff,
protocols… all disabled by ``-c``) and runs under ``env -i`` with
``gitproc.hardened_env()``, so nothing of the web server's environment (``GIT_DIR``,
``GIT_CONFIG_PARAMETERS``, ``GIT_EXTERNAL_DIFF``…) reaches git: GitPython itself copies
``os.environ`` into every child, which is why the environment is replaced by ``env -i``
rather than updated. Each git gets its own session, so a timeout kills it whole.

Hostile data stays data: the message is decoded with the commit's own ``encoding``
header when Python knows it (else UTF-8), undecodable bytes become U+FFFD, and every
size is bounded (the message, each file's patch, the whole patch, the files shown, the
time git may take). Reads need no lock (see :mod:`workers.git.mirror`).
"""

from __future__ import annotations

import codecs
import configparser
import contextlib
import os
import re
import shutil
import signal
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

# GitPython looks for git when imported and raises ImportError without one, which would
# stop every process (web, workers, ``manage.py check``) at start-up with GitPython's
# message. Quiet here: pages that read a mirror report a missing git themselves, and
# git's absence is the hardening checks' to report, not an import error's.
os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")

import git

from workers.git.mirror import HEAD_REF, mirror_head
from workers.git.paths import path_text
from workers.git.runner import command, hardened_env

__all__ = [
    "EMPTY_TREE",
    "CommitMissing",
    "CommitText",
    "FilePatch",
    "Limits",
    "MirrorMissing",
    "MirrorState",
    "Patch",
    "mirror_state",
    "open_mirror",
    "read_message",
    "read_patch",
]

#: The empty tree: what a root commit is diffed against.
EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
_HEX = re.compile(rb"[0-9a-f]{40}")
_ENV = shutil.which("env") or "/usr/bin/env"


class MirrorMissing(LookupError):
    """This host has no (readable) mirror of the repository."""


class CommitMissing(LookupError):
    """The mirror has no such commit."""


@dataclass(frozen=True)
class Limits:
    """Bounds of one commit page: bytes kept per file and in all, files with a patch,
    bytes git may send in all (what is over a file's bound is read and dropped, so a
    huge file does not hide the next ones), the message's bytes, git's time."""

    file_bytes: int = 64 * 1024
    total_bytes: int = 1024 * 1024
    files: int = 300
    read_bytes: int = 32 * 1024 * 1024
    message_bytes: int = 256 * 1024
    timeout: float = 20.0


class HardenedGit(git.Git):
    """GitPython's command runner, starting git as :mod:`workers.git.runner` does."""

    def execute(self, command_: Any, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        if isinstance(command_, list | tuple) and command_:
            env = hardened_env({"GIT_DIR": str(self.working_dir)})
            command_ = [
                _ENV,
                "-i",
                *(f"{k}={v}" for k, v in env.items()),
                *command([str(a) for a in command_[1:]]),
            ]
            kwargs.setdefault("start_new_session", True)  # own group: killpg reaches it all
        return super().execute(command_, *args, **kwargs)


class _Mirror(git.Repo):
    GitCommandWrapperType = HardenedGit


@contextlib.contextmanager
def open_mirror(path: Path) -> Iterator[git.Repo]:
    """The bare mirror at ``path`` as a GitPython ``Repo`` whose git is hardened; its
    persistent ``cat-file`` processes are stopped on exit."""
    if not (path / "HEAD").is_file() or not (path / "objects").is_dir():
        raise MirrorMissing(f"no mirror of this repository on this host ({path.name})")
    try:
        repo = _Mirror(str(path), search_parent_directories=False)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError, OSError) as exc:
        raise MirrorMissing(f"the mirror cannot be opened: {type(exc).__name__}") from None
    except configparser.Error:  # GitPython parses the mirror's config as it opens
        raise MirrorMissing("the mirror cannot be opened: its git config is unreadable") from None
    try:
        yield repo
    finally:
        repo.close()


@dataclass(frozen=True)
class MirrorState:
    """What the repository page shows of this host's mirror: whether it is here, the
    commit its head ref names, and when that ref last moved (a fetch that brought
    nothing new leaves it)."""

    present: bool
    head: str | None = None
    head_moved_at: datetime | None = None


def mirror_state(path: Path) -> MirrorState:
    """Resolve the mirror's head ref from the ref files themselves
    (``workers.git.mirror.mirror_head``: the loose ref, else ``packed-refs``; safe without
    the mirror's lock, see there), with no GitPython repository opened and no git
    process: the repository page asks on every view (under load the web processes'
    CPU per request counts, BENCHMARKS.md: opening the repository cost ~0.4 ms), and a
    mirror GitPython cannot open (a broken ``config``) still shows its head instead of
    failing the page. The ref is only ever written as a sha (a sync's refspec), never a
    symbolic ref."""
    if not (path / "HEAD").is_file():
        return MirrorState(present=False)
    if not (path / "objects").is_dir():  # what ``open_mirror`` refuses as no mirror
        return MirrorState(present=True)
    head = mirror_head(path) or ""
    moved = None
    for candidate in (path / HEAD_REF, path / "packed-refs"):
        with contextlib.suppress(OSError):
            moved = datetime.fromtimestamp(candidate.stat().st_mtime, UTC)
            break
    return MirrorState(present=True, head=head if _HEX.fullmatch(head.encode()) else None,
                       head_moved_at=moved)  # fmt: skip


# ---------------------------------------------------------------------------- message


@dataclass(frozen=True)
class CommitText:
    """The full message of a commit as stored, decoded, and what it was decoded from."""

    message: str
    encoding: str
    truncated: bool
    tree: str
    parents: tuple[str, ...]


def _decoder(name: str) -> str:
    """The codec to read a message declared as ``name``: itself if Python knows it as a
    text encoding, else UTF-8 (git's default)."""
    try:
        info = codecs.lookup(name)
    except (LookupError, ValueError):
        return "utf-8"
    return info.name if getattr(info, "_is_text_encoding", True) else "utf-8"


def read_message(repo: git.Repo, sha: str, limits: Limits = Limits()) -> CommitText:
    """The commit object ``sha`` read through GitPython's object database; at most
    ``limits.message_bytes`` of its message are kept."""
    try:
        # One request to GitPython's persistent ``cat-file --batch``: type, size, data.
        stream = repo.odb.stream(bytes.fromhex(sha))
    except (ValueError, git.GitCommandError, OSError) as exc:
        raise CommitMissing(f"commit {sha[:12]} is not in the mirror") from exc
    kind = stream.type.decode() if isinstance(stream.type, bytes) else str(stream.type)
    size = int(stream.size)
    budget = limits.message_bytes + 64 * 1024  # headers (parents, signatures) first
    raw = stream.read(min(size, budget)) if kind == "commit" else b""
    # GitPython's stream drains the unread rest when it is dropped, keeping the shared
    # cat-file process in step for the next object.
    del stream
    if kind != "commit":
        raise CommitMissing(f"{sha[:12]} is a {kind}, not a commit")
    head, _, body = raw.partition(b"\n\n")
    encoding, tree, parents = "", "", []
    for line in head.split(b"\n"):
        if line.startswith(b"tree "):
            tree = line[5:].decode("ascii", "replace")
        elif line.startswith(b"parent "):
            parents.append(line[7:].decode("ascii", "replace"))
        elif line.startswith(b"encoding "):
            encoding = line[9:].decode("ascii", "replace").strip()[:40]
    truncated = size > len(raw) or len(body) > limits.message_bytes
    text = body[: limits.message_bytes].decode(_decoder(encoding or "utf-8"), "replace")
    return CommitText(
        message=text.replace("\x00", "\ufffd"),
        encoding=encoding or "UTF-8",
        truncated=truncated,
        tree=tree,
        parents=tuple(parents),
    )


# ---------------------------------------------------------------------------- patch


@dataclass
class FilePatch:
    """One file's part of the patch: its path (the new one; the old one for a deleted
    file), what happened to it, and its text, cut at ``Limits.file_bytes``."""

    path: str
    status: str = "modified"  # added, deleted, modified
    binary: bool = False
    truncated: bool = False
    size: int = 0  # bytes git sent for this file (kept or not)
    chunks: list[bytes] = field(default_factory=list, repr=False)
    kept: int = 0

    @property
    def text(self) -> str:
        return b"".join(self.chunks).decode("utf-8", "replace").replace("\x00", "\ufffd")


@dataclass(frozen=True)
class Patch:
    """The commit's patch against ``base`` (its first parent, the empty tree for a root
    commit): the files git sent, in its order; ``truncated`` when a bound stopped the
    reading (``more_files``: later files not shown), ``error`` when git failed."""

    base: str
    files: tuple[FilePatch, ...]
    truncated: bool
    more_files: bool
    error: str = ""


_ESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}


def _unquote(text: str) -> tuple[str, str]:
    """Git's C-style quoted path at the start of ``text`` → (path, rest after it); the
    path's bytes as ``surrogateescape`` text (``_path`` makes the stored form of it)."""
    out = bytearray()
    i = 1
    while i < len(text):
        ch = text[i]
        if ch == '"':
            return out.decode("utf-8", "surrogateescape"), text[i + 1 :]
        if ch == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt in "01234567" and re.fullmatch(r"[0-7]{3}", text[i + 1 : i + 4]):
                out.append(int(text[i + 1 : i + 4], 8))
                i += 4
                continue
            out.append(_ESCAPES.get(nxt, ord(nxt) if ord(nxt) < 128 else 63))
            i += 2
            continue
        out += ch.encode("utf-8", "surrogateescape")
        i += 1
    return out.decode("utf-8", "surrogateescape"), ""


def _header_paths(line: str) -> tuple[str, str]:
    """``a`` and ``b`` paths of a ``diff --git a/X b/Y`` line (prefixes removed)."""
    rest = line[len("diff --git ") :].rstrip("\n")
    if rest.startswith('"'):
        a, tail = _unquote(rest)
        tail = tail.lstrip(" ")
        b = _unquote(tail)[0] if tail.startswith('"') else tail
    elif rest.endswith('"') and ' "' in rest:
        a, _, quoted = rest.rpartition(' "')
        b = _unquote('"' + quoted)[0]
    else:
        # Unquoted names may hold spaces; without rename detection both are the same,
        # so the line is "a/" + P + " b/" + P.
        n = (len(rest) - 5) // 2
        if n > 0 and rest[: n + 2] == "a/" + rest[n + 5 :] and rest[n + 2 : n + 5] == " b/":
            a, b = rest[: n + 2], "b/" + rest[n + 5 :]
        else:
            a, _, b = rest.partition(" b/")
            b = "b/" + b
    return _path(a.removeprefix("a/")), _path(b.removeprefix("b/"))


def _path(escaped: str) -> str:
    """A header path (its bytes as ``surrogateescape`` text) in the form the analysis
    stores (``path_text``): the stored file rows and the patch's files then match, and
    no lone surrogate reaches a page or a JSON body."""
    return path_text(escaped.encode("utf-8", "surrogateescape"))


def _stop(proc: Any) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def read_patch(
    repo: git.Repo, sha: str, parents: Sequence[str], limits: Limits = Limits()
) -> Patch:
    """The patch of ``sha`` against its first parent (or the empty tree), streamed from
    one ``git diff-tree`` through GitPython's command layer, within ``limits``.

    Same diff as the stored stats (:mod:`workers.analysis.history`): first parent, no rename
    detection, no external diff or textconv; ``--full-index`` and fixed ``a/``/``b/``
    prefixes whatever the mirror's config says."""
    base = parents[0] if parents else EMPTY_TREE
    args = ["-r", "-p", "--no-color", "--no-ext-diff", "--no-textconv", "--no-renames",
            "--no-relative", "--full-index", "--src-prefix=a/", "--dst-prefix=b/",
            "--end-of-options", base, sha]  # fmt: skip
    proc = repo.git.diff_tree(*args, as_process=True)
    popen = proc.proc
    timer = threading.Timer(limits.timeout, _stop, [popen])
    timer.daemon = True
    timer.start()
    files: list[FilePatch] = []
    stopped = more = False
    try:
        stopped, more = _consume(popen.stdout, files, limits)
    finally:
        timer.cancel()
        _stop(popen)
        err = popen.stderr.read(4096) if popen.stderr else b""
        code = popen.wait()
    error = ""
    if code not in (0, -signal.SIGKILL) and not files:
        last = err.decode("utf-8", "replace").strip().splitlines()[-1:] or [f"exit {code}"]
        error = f"git diff-tree failed: {last[0][:300]}"
    elif code == -signal.SIGKILL and not stopped:
        stopped = more = True  # the timer stopped git: what came is shown
    return Patch(base=base, files=tuple(files), truncated=stopped, more_files=more, error=error)


def _consume(stdout: IO[bytes], files: list[FilePatch], limits: Limits) -> tuple[bool, bool]:
    """Split git's patch into files while reading it; returns (stopped by a bound,
    files left unread)."""
    read = kept = 0
    at_line_start = True
    current: FilePatch | None = None
    a_path = ""
    while True:
        piece = stdout.readline(64 * 1024)  # a bounded read even for one huge line
        if not piece:
            return False, False
        read += len(piece)
        line_start, at_line_start = at_line_start, piece.endswith(b"\n")
        if line_start and piece.startswith(b"diff --git "):
            if len(files) >= limits.files:
                return True, True
            a, b = _header_paths(piece.decode("utf-8", "surrogateescape"))
            current = FilePatch(path=b or a)
            files.append(current)
            a_path = a
        elif current is None:
            continue
        elif line_start and piece.startswith((b"Binary files ", b"GIT binary patch")):
            current.binary = True
        elif line_start and piece.startswith(b"new file mode"):
            current.status = "added"
        elif line_start and piece.startswith(b"deleted file mode"):
            current.status, current.path = "deleted", a_path or current.path
        current.size += len(piece)
        room = min(limits.file_bytes - current.kept, limits.total_bytes - kept)
        over_total = limits.total_bytes - kept < len(piece)
        if not current.truncated and room >= len(piece):
            current.chunks.append(piece)
            current.kept += len(piece)
            kept += len(piece)
        elif not current.truncated:
            current.truncated = True
            if room > 0 and line_start:  # keep whole lines only
                cut = piece.rfind(b"\n", 0, room)
                if cut >= 0:
                    current.chunks.append(piece[: cut + 1])
                    current.kept += cut + 1
                    kept += cut + 1
            if over_total:
                return True, True  # the page's bound, not only this file's
        if read >= limits.read_bytes:
            return True, True
