"""Where git really reads a local repository from (docs/security.md#g22).

A local path under ``GITWARD_LOCAL_ROOTS`` is not the whole story: git follows
redirections written inside the repository. ``git fetch /path`` runs ``git upload-pack
/path``, which finds the repository as git's ``enter_repo`` does (``/path/.git``,
``/path``, ``/path.git/.git``, ``/path.git``; a regular file there is a *gitfile*,
``gitdir: /elsewhere``), then takes its objects and refs from the ``commondir`` the
repository names, and its objects also from every directory listed in
``objects/info/alternates`` (nested, relative to the objects directory that lists them).
Symbolic links inside any of these directories are followed too. Any of them can name a
repository outside the roots, whose objects the fetch would then copy into a mirror that
every user can read.

``check_local_repository`` follows each of these paths as git would and refuses the
repository unless every one resolves (symlinks and ``..`` resolved) under a root.
``objects/info/http-alternates`` is only read by the dumb HTTP transport, never by a
local fetch; a local repository that has one is refused all the same when an entry
names another server or a directory outside the roots, so that nothing it names is
ever fetched.

It is a check, not a sandbox: it runs at submission and again at the start of every
sync and every fetch an analysis makes (``parse_remote`` each time), so a repository
changed after it was accepted is refused by its next sync. A writer of the roots racing
a running fetch is outside what this can see: only trusted people should be able to
write under the roots (docs/security.md#g22).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path

from workers.remotes.policy import InvalidRemote

__all__ = ["MAX_ENTRIES", "check_local_repository"]

#: enter_repo's suffixes, in its order: the first that is a gitfile or a git directory wins.
_SUFFIXES = ("/.git", "", ".git/.git", ".git")
#: Object directories followed through alternates at most (git stops at depth 5).
_MAX_OBJECT_DIRS = 64
#: Entries of a repository's directories looked at, at most: a bound on the work.
MAX_ENTRIES = 1_000_000
_HEX = frozenset("0123456789abcdef")


def check_local_repository(path: Path, roots: Sequence[Path]) -> None:
    """Raise :class:`InvalidRemote` unless every path git follows to read the repository
    at ``path`` (already resolved, under a root) lies under one of ``roots`` (resolved).
    A directory that holds no repository passes: git refuses to fetch it anyway."""
    inside = _Inside(roots)
    gitdir = _gitdir(str(path), inside)
    if gitdir is None:
        return
    common = _common_dir(gitdir, inside)
    budget = [MAX_ENTRIES]
    _no_links_out(gitdir, inside, budget)
    if common != gitdir:
        _no_links_out(common, inside, budget)
    _alternates(common / "objects", inside, budget)


class _Inside:
    def __init__(self, roots: Sequence[Path]) -> None:
        self.roots = [Path(os.path.realpath(r)) for r in roots]

    def real(self, path: str | Path, what: str) -> Path:
        """``path`` resolved; InvalidRemote naming ``what`` if it is outside the roots."""
        real = Path(os.path.realpath(path))
        if not any(real == r or real.is_relative_to(r) for r in self.roots):
            raise InvalidRemote(f"the local repository's {what} is not under an allowed root")
        return real


def _gitdir(path: str, inside: _Inside) -> Path | None:
    """The git directory ``git upload-pack path`` opens (git's ``enter_repo``)."""
    for suffix in _SUFFIXES:
        candidate = path + suffix
        try:
            mode = os.stat(candidate).st_mode
        except OSError:
            continue
        if stat.S_ISREG(mode):
            return _gitfile(candidate, inside)
        if stat.S_ISDIR(mode) and _is_git_directory(Path(candidate)):
            return inside.real(candidate, "git directory")
    return None


def _gitfile(path: str, inside: _Inside) -> Path:
    """The directory a ``.git`` file (``gitdir: X``, X relative to the file's folder)
    names; refused when it is unreadable, outside the roots or not a repository."""
    try:
        with open(path, "rb") as f:
            text = f.read(4096).decode("utf-8")
    except (OSError, UnicodeDecodeError):
        raise InvalidRemote("the local repository's .git file cannot be read") from None
    first = text.splitlines()[0] if text else ""
    if not first.startswith("gitdir: ") or not first[8:].strip():
        raise InvalidRemote("the local repository's .git file is not 'gitdir: <path>'")
    target = os.path.join(os.path.dirname(path), first[8:].rstrip("\r\n"))
    real = inside.real(target, ".git file target")
    if not _is_git_directory(real):
        raise InvalidRemote("the local repository's .git file names no git directory")
    return real


def _common_dir(gitdir: Path, inside: _Inside) -> Path:
    """The ``commondir`` the git directory names (objects and refs live there), or
    itself."""
    try:
        text = (gitdir / "commondir").read_bytes().decode("utf-8")
    except FileNotFoundError:
        return gitdir
    except (OSError, UnicodeDecodeError):
        raise InvalidRemote("the local repository's commondir file cannot be read") from None
    line = text.splitlines()[0].strip() if text.strip() else ""
    if not line:
        return gitdir
    return inside.real(os.path.join(gitdir, line), "commondir")


def _is_git_directory(path: Path) -> bool:
    """git's ``is_git_directory``: a valid ``HEAD``, and ``objects`` and ``refs``
    (in the ``commondir`` if there is one)."""
    head = path / "HEAD"
    try:
        if head.is_symlink():
            if not os.readlink(head).startswith("refs/"):
                return False
        else:
            data = head.read_bytes()[:256].decode("ascii", "replace")
            if data.startswith("ref:"):
                if not data[4:].lstrip().startswith("refs/"):
                    return False
            elif not (len(data.strip()) in (40, 64) and set(data.strip()) <= _HEX):
                return False
    except OSError:
        return False
    common = path
    try:
        line = (path / "commondir").read_bytes().decode("utf-8", "replace").splitlines()
        if line and line[0].strip():
            common = Path(os.path.join(path, line[0].strip()))
    except OSError:
        pass
    return os.access(common / "objects", os.X_OK) and os.access(common / "refs", os.X_OK)


def _no_links_out(top: Path, inside: _Inside, budget: list[int]) -> None:
    """Every symbolic link in ``top``'s tree resolves under the roots (git follows them)."""
    for root, dirs, files in os.walk(top, followlinks=False):
        for name in (*dirs, *files):
            budget[0] -= 1
            if budget[0] < 0:
                raise InvalidRemote("the local repository has too many files to check")
            full = os.path.join(root, name)
            if os.path.islink(full):
                inside.real(full, "symbolic link " + repr(os.path.relpath(full, top))[:80])


def _alternates(objects: Path, inside: _Inside, budget: list[int]) -> None:
    """Follow ``objects/info/alternates`` (and what they list, recursively) and check
    ``info/http-alternates`` of each objects directory."""
    seen: set[Path] = set()
    todo = [objects]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        if len(seen) > _MAX_OBJECT_DIRS:
            raise InvalidRemote("the local repository lists too many alternate object directories")
        for entry in _lines(current / "info" / "alternates"):
            real = inside.real(os.path.join(current, entry), "objects/info/alternates entry")
            if real not in seen:
                _no_links_out(real, inside, budget)
                todo.append(real)
        for entry in _lines(current / "info" / "http-alternates"):
            if "://" in entry or ":" in entry.split("/", 1)[0]:
                raise InvalidRemote(
                    "the local repository's objects/info/http-alternates names another server"
                )
            inside.real(os.path.join(current, entry), "objects/info/http-alternates entry")


def _lines(path: Path) -> Iterator[str]:
    """The entries of an alternates file as git reads them: one path a line, blank lines
    and ``#`` comments skipped, a line starting with ``"`` C-unquoted."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    except OSError:
        raise InvalidRemote(f"the local repository's {path.name} file cannot be read") from None
    for raw in data.split(b"\n"):
        line = raw.rstrip(b"\r")
        if not line or line.startswith(b"#"):
            continue
        if line.startswith(b'"'):
            line = _unquote(line)
        text = line.decode("utf-8", "surrogateescape")
        if "\0" in text:
            raise InvalidRemote(f"the local repository's {path.name} file is malformed")
        yield text


_ESCAPES = {b"a": 7, b"b": 8, b"t": 9, b"n": 10, b"v": 11, b"f": 12, b"r": 13, b'"': 34, b"\\": 92}


def _unquote(line: bytes) -> bytes:
    """git's C-style quoting (``"a\\"b\\303\\251"``) undone."""
    out = bytearray()
    i = 1
    while i < len(line):
        ch = line[i : i + 1]
        if ch == b'"':
            return bytes(out)
        if ch == b"\\":
            octal = line[i + 1 : i + 4]
            if len(octal) == 3 and all(48 <= c <= 55 for c in octal):
                out.append(int(octal, 8) & 0xFF)
                i += 4
                continue
            code = _ESCAPES.get(line[i + 1 : i + 2])
            if code is None:
                raise InvalidRemote("the local repository's alternates file is malformed")
            out.append(code)
            i += 2
            continue
        out += ch
        i += 1
    raise InvalidRemote("the local repository's alternates file is malformed")
