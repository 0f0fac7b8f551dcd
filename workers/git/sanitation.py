"""What dead writers leave behind in a repository's workspace, and its removal.

A git killed mid-write (its worker SIGKILLed, its lease lost and its process group
killed, the host crashed) leaves lock files (``refs/…/<ref>.lock``, ``HEAD.lock``,
``config.lock``), object temporaries (``objects/pack/tmp_pack_*``, ``tmp_idx_*``,
``tmp_obj_*``) and perhaps a ``.pack`` renamed in without its ``.idx``; a dead sync
leaves a half-built clone in ``workspace/tmp``.  A leftover lock file makes the next
writer fail ("Unable to create '…/head.lock': File exists"), so it must go before the
next fetch; object leftovers are only garbage (git never uses a pack without its index).

Everything here runs under the mirror's host lock (:func:`~workers.git.host_lock.hold_mirror`,
taken here, re-entrant for a caller that already holds it).  What that proves:

1. Every gitward process writes a mirror and its temporaries only while it holds the
   host lock, for as long as its git runs (``Runner.run`` returns once git has exited).
   Git's own background writers are off (``gc.auto=0``, ``maintenance.auto=false``), and
   nothing but gitward writes a workspace (each host has its own).
2. A holder that dies releases the lock, and the git it started dies with it (``setpriv
   --pdeathsig KILL``).  The kernel closes the dead holder's files (releasing the flock)
   a moment before it sends that signal, so that git may finish at most the system call
   it is in: whatever that creates is a leftover for the next sanitation, and whatever
   it renames or deletes was not going to be used.
3. So with the host lock ours, the writer of every **lock file** is gone: lock files are
   taken by that git itself (``fetch``, ``update-ref``), never by its helpers.  They are
   removed however young, so a retry right after a crash does not fail on them.
4. Not so for **object files**: git's helpers (``index-pack``, ``unpack-objects``) are
   its children, and the death signal is not inherited; an orphaned ``index-pack`` may
   still be finishing a pack (renaming the ``.pack`` in, then linking its ``.idx``) for
   a while after its git died.  These are removed only when nothing has written or
   renamed them for :data:`STALE_AFTER` seconds.  Keeping a young one costs nothing (git
   ignores it); a later sanitation removes it.

Readers are unaffected: they take no lock files (``GIT_OPTIONAL_LOCKS=0``) and never open
a pack without its index.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from workers.git.host_lock import Check, hold_mirror, unchecked
from workers.git.workspace import mirror_path, temporaries

#: Object leftovers (git temporaries, files of an incomplete pack) are removed only when
#: nothing has written or renamed them for this many seconds (module docstring, 4).
STALE_AFTER = 10.0

#: Lock files git leaves behind when a writer dies mid-update (index, refs, config, …).
_LOCK_SUFFIX = ".lock"
#: Temporary files of git's object writers: packs and their indexes being received
#: (index-pack, pack-objects) and loose objects being written.
_TMP_PREFIXES = ("tmp_pack_", "tmp_idx_", "tmp_rev_", "tmp_obj_")
#: The files of one pack ``pack-<hash>.*``.
_PACK_EXTS = frozenset({"pack", "idx", "keep", "rev", "bitmap", "mtimes", "promisor"})


def remove_stale_temporaries(workspace: Path, repo_id: int, *, check: Check | None = None) -> int:
    """Delete half-finished clones of one repository (and mirrors moved aside) from
    ``workspace/tmp``; return how many.

    Takes the host lock (waiting as :func:`hold_mirror` does).  Only a sync holding that
    lock makes them, each under a fresh name nobody else knows, so with the lock ours
    each one is abandoned: its sync finished or died.  An orphaned ``index-pack`` still
    writing into one finds its folder gone and fails; nothing of it reaches the mirror.
    ``check`` runs before each deletion."""
    check = check or unchecked
    removed = 0
    with hold_mirror(workspace, repo_id, check=check):
        for entry in temporaries(workspace, repo_id):
            check()
            shutil.rmtree(entry, ignore_errors=True)
            removed += 1
    return removed


def remove_stale_files(
    workspace: Path,
    repo_id: int,
    *,
    check: Check | None = None,
    stale_after: float = STALE_AFTER,
    clock: Callable[[], float] = time.time,
) -> list[str]:
    """Delete what dead git writers left inside the mirror; return the relative paths.

    Takes the host lock (waiting as :func:`hold_mirror` does).  Removes every lock file
    however young, and object leftovers (git temporaries, every file of an incomplete
    pack) once nothing has written or renamed them for ``stale_after`` seconds (the later
    of mtime and ctime: git's rename of a finished ``.pack`` into place sets its ctime);
    why the two differ: module docstring.  ``check`` runs before each deletion: a lost
    lease raises there, and the rest stays."""
    check = check or unchecked
    path = mirror_path(workspace, repo_id)
    removed: list[str] = []
    with hold_mirror(workspace, repo_id, check=check):
        if not path.is_dir():
            return removed
        locks, objects = _stale_candidates(path)
        now = clock()
        for target in sorted(locks | objects):
            try:
                st = target.lstat()
            except FileNotFoundError:
                continue  # an orphaned helper renamed it meanwhile (objects only)
            if target in objects and now - max(st.st_mtime, st.st_ctime) < stale_after:
                continue
            check()
            target.unlink(missing_ok=True)
            removed.append(str(target.relative_to(path)))
    return removed


def _stale_candidates(path: Path) -> tuple[set[Path], set[Path]]:
    """``(lock files, object leftovers)``: git temporaries, and every file of an
    incomplete pack (one without both its ``.pack`` and its ``.idx``: git uses a pack
    only through its index, so it ignores such a pack, and its ``.keep``/``.rev`` with
    it)."""
    locks: set[Path] = set()
    objects: set[Path] = set()
    for dirpath, _dirnames, filenames in os.walk(path):
        for name in filenames:
            if name.endswith(_LOCK_SUFFIX):
                locks.add(Path(dirpath) / name)
            elif name.startswith(_TMP_PREFIXES):
                objects.add(Path(dirpath) / name)
    pack_dir = path / "objects" / "pack"
    if pack_dir.is_dir():
        stems: dict[str, set[str]] = {}
        for name in os.listdir(pack_dir):
            stem, dot, ext = name.rpartition(".")
            if dot and stem.startswith("pack-") and ext in _PACK_EXTS:
                stems.setdefault(stem, set()).add(ext)
        for stem, exts in stems.items():
            if not {"pack", "idx"} <= exts:
                objects.update(pack_dir / f"{stem}.{ext}" for ext in exts)
    return locks, objects
