"""Git, hardened: the git runner, mirrors and their limits, refused fetches, the fsck
policy, workspace sanitation, the per-host mirror lock, per-git-host fetch limits, the
commit view and the text of paths that are not UTF-8.
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
from workers.git.fetch_errors import RateLimited, RepositoryUnavailable
from workers.git.fetch_limits import (
    FetchGate,
    HostBusy,
    HostLimit,
    HostStatus,
    back_off,
    host_status,
    known_hosts,
    parse_limits,
    wait_reason,
)
from workers.git.mirror import mirror_head, pins_for, update_mirror
from workers.git.paths import path_text
from workers.git.runner import (
    GitError,
    ProcessGroups,
    Runner,
    command,
    death_prefix,
    follow_niceness,
    hardened_env,
)
from workers.git.workspace import mirror_path

__all__ = [
    "CommitMissing",
    "FetchGate",
    "GitError",
    "HostBusy",
    "HostLimit",
    "HostStatus",
    "Limits",
    "MirrorMissing",
    "MirrorState",
    "ProcessGroups",
    "RateLimited",
    "RepositoryUnavailable",
    "Runner",
    "back_off",
    "command",
    "death_prefix",
    "follow_niceness",
    "hardened_env",
    "host_status",
    "known_hosts",
    "mirror_head",
    "mirror_path",
    "mirror_state",
    "open_mirror",
    "parse_limits",
    "path_text",
    "pins_for",
    "read_message",
    "read_patch",
    "update_mirror",
    "wait_reason",
]
