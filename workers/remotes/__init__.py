"""Remote repository URLs: their grammar, the policy on what may be fetched, remote
hosts and addresses, branch names, and redaction of credentials. See docs/security.md."""

from __future__ import annotations

from workers.remotes.branches import normalise_branch
from workers.remotes.parse import Remote, parse_remote
from workers.remotes.policy import InvalidRemote, RemotePolicy
from workers.remotes.redaction import redact

__all__ = ["InvalidRemote", "Remote", "RemotePolicy", "normalise_branch", "parse_remote", "redact"]
