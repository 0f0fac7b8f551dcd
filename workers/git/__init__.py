"""Git, hardened: the git runner, mirrors and their limits, refused fetches, the fsck
policy, workspace sanitation, the per-host mirror lock, the commit view and the text of
paths that are not UTF-8.
See docs/security.md and docs/lifecycle.md."""

from __future__ import annotations

from workers.git.commit_view import (
    CommitMissing,
    Limits,
    MirrorMissing,
    MirrorState,
    mirror_state,
    open_mirror,
    read_message,
    read_patch,
)
from workers.git.fetch_errors import RepositoryUnavailable
from workers.git.mirror import mirror_head, pins_for, update_mirror
from workers.git.paths import path_text
from workers.git.runner import GitError, ProcessGroups, Runner, command, death_prefix, hardened_env
from workers.git.workspace import mirror_path

__all__ = [
    "CommitMissing",
    "GitError",
    "Limits",
    "MirrorMissing",
    "MirrorState",
    "ProcessGroups",
    "RepositoryUnavailable",
    "Runner",
    "command",
    "death_prefix",
    "hardened_env",
    "mirror_head",
    "mirror_path",
    "mirror_state",
    "open_mirror",
    "path_text",
    "pins_for",
    "read_message",
    "read_patch",
    "update_mirror",
]
