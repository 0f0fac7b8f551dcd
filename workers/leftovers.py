"""What dead writers leave behind in a repository's workspace, and its removal.

A git killed mid-write (its worker SIGKILLed, its lease lost and its process group
killed, the host crashed) leaves lock files (``refs/…/<ref>.lock``, ``HEAD.lock``,
``config.lock``), its temporaries (``objects/pack/tmp_pack_*``, ``tmp_idx_*``, …) and
perhaps a ``.pack`` renamed in without its ``.idx``; a dead sync leaves a half-built
clone in ``workspace/tmp``.  A leftover lock file makes the next writer fail ("Unable to
create '…/head.lock': File exists"), so it must go before the next fetch.

Everything here runs under the mirror's host lock (:func:`~workers.hostlock.hold_mirror`,
taken here, re-entrant for a caller that already holds it), and that alone proves the
writer of every leftover gone, so no age is asked of them:

1. Every gitward process writes a mirror and its temporaries only while it holds the
   host lock, for as long as its git runs (``Runner.run`` returns once git has exited).
   Git's own background writers are off (``gc.auto=0``, ``maintenance.auto=false``).
2. A holder that dies releases the lock, and its git dies with it (``setpriv
   --pdeathsig KILL``).  The kernel closes the dead holder's files (releasing the flock)
   a moment before it sends that signal, so its git may finish at most the system call
   it is in: whatever that creates is a dead writer's leftover for the next sanitation,
   and whatever it renames or deletes was never going to be used.
3. Nothing but gitward writes a workspace: each host has its own, and no operator's
   git belongs in it.  So an age condition ("untouched for N seconds") would protect
   no live writer; it would only keep a git's ref lock that died a moment ago, and make
   the retry's fetch fail on it.

Readers are unaffected: they take no lock files (``GIT_OPTIONAL_LOCKS=0``) and never open
a pack without its index.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from workers.hostlock import Check, hold_mirror, unchecked
from workers.workspace import mirror_path, temporaries

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
    lock writes them, so with the lock ours each one belongs to a holder that has
    finished or died.  ``check`` runs before each deletion."""
    check = check or unchecked
    removed = 0
    with hold_mirror(workspace, repo_id, check=check):
        for entry in temporaries(workspace, repo_id):
            check()
            shutil.rmtree(entry, ignore_errors=True)
            removed += 1
    return removed


def remove_stale_files(workspace: Path, repo_id: int, *, check: Check | None = None) -> list[str]:
    """Delete what dead git writers left inside the mirror; return the relative paths.

    Takes the host lock (waiting as :func:`hold_mirror` does), which proves every
    writer gone (module docstring), so every lock file, git temporary and file of an
    incomplete pack found is removed however young.  ``check`` runs before each
    deletion: a lost lease raises there, and the rest stays."""
    check = check or unchecked
    path = mirror_path(workspace, repo_id)
    removed: list[str] = []
    with hold_mirror(workspace, repo_id, check=check):
        if not path.is_dir():
            return removed
        for target in sorted(_stale_candidates(path)):
            check()
            try:
                target.unlink()
            except FileNotFoundError:
                continue  # report only what this call removed
            removed.append(str(target.relative_to(path)))
    return removed


def _stale_candidates(path: Path) -> set[Path]:
    """Lock files, git temporaries, and every file of an incomplete pack (one without
    both its ``.pack`` and its ``.idx``: git uses a pack only through its index, so it
    ignores such a pack, and its ``.keep``/``.rev``/``.bitmap`` with it)."""
    found: set[Path] = set()
    for dirpath, _dirnames, filenames in os.walk(path):
        for name in filenames:
            if name.endswith(_LOCK_SUFFIX) or name.startswith(_TMP_PREFIXES):
                found.add(Path(dirpath) / name)
    pack_dir = path / "objects" / "pack"
    if pack_dir.is_dir():
        stems: dict[str, set[str]] = {}
        for name in os.listdir(pack_dir):
            stem, dot, ext = name.rpartition(".")
            if dot and stem.startswith("pack-") and ext in _PACK_EXTS:
                stems.setdefault(stem, set()).add(ext)
        for stem, exts in stems.items():
            if not {"pack", "idx"} <= exts:
                found.update(pack_dir / f"{stem}.{ext}" for ext in exts)
    return found
