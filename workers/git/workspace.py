"""Where a worker host's workspace keeps each repository's files.

Each host has its own workspace (``GITWARD_WORKSPACE``, docs/configuration.md), written only by
gitward's processes on that host::

    mirrors/{id}.git      the bare mirror (workers.git.mirror)
    mirrors/{id}.flock    its host lock, beside it, never inside it (workers.git.host_lock)
    tmp/{id}-{hex}.git    clones being built and mirrors moved aside, each under a fresh
                          name; removed by workers.git.sanitation when their writer is gone
"""

from __future__ import annotations

import uuid
from pathlib import Path


def mirror_path(workspace: Path, repo_id: int) -> Path:
    return workspace / "mirrors" / f"{repo_id}.git"


def host_lock_path(workspace: Path, repo_id: int) -> Path:
    """The file a mirror's host lock is taken on: beside the mirror, so that removing or
    replacing the mirror directory never removes the lock.  It is never deleted: a
    process that opened the old file would lock a different inode than the next one."""
    return workspace / "mirrors" / f"{repo_id}.flock"


def tmp_dir(workspace: Path) -> Path:
    return workspace / "tmp"


def new_temporary(workspace: Path, repo_id: int) -> Path:
    """A fresh, unused name in ``tmp/`` for one of the repository's temporaries (the
    folder is created; the name is not).  A crash that leaves it behind leaves it where
    :func:`temporaries` finds it."""
    root = tmp_dir(workspace)
    root.mkdir(parents=True, exist_ok=True)
    return root / f"{repo_id}-{uuid.uuid4().hex}.git"


def temporaries(workspace: Path, repo_id: int) -> list[Path]:
    """The repository's temporaries in ``tmp/`` (none of another repository's)."""
    root = tmp_dir(workspace)
    if not root.is_dir():
        return []
    return sorted(root.glob(f"{repo_id}-*.git"))
