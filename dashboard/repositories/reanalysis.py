"""Re-analysing a repository from its page: fetch the branch again and analyse what the
served analyzer version has not stored yet. Permission-checked and audited.

Needs ``dashboard.change_repository`` (Django's own model permission: staff are given it
like any other). The state change is ``repositories.refresh_repository``'s conditional
UPDATE, so a click while a sync or analysis of the served version is running, or two
clicks at once, start one sync.
"""

from __future__ import annotations

from typing import Any

from dashboard import runs
from dashboard.accounts import record_audit
from dashboard.models import Repository
from dashboard.repositories.lifecycle import current_fingerprint, refresh_repository

PERMISSION = "dashboard.change_repository"


def may_reanalyse(user: Any) -> bool:
    return bool(user.has_perm(PERMISSION))


def reanalyse(repo: Repository, user: Any) -> tuple[int, str]:
    """Start a new sync generation of ``repo``; returns (HTTP status, what happened),
    both written to the audit log."""
    target = f"repository {repo.name} (#{repo.pk}, {repo.shown_url})"
    if not may_reanalyse(user):
        record_audit(user=user, action="repo.reanalyse", target=target,
                     outcome="refused: permission denied")  # fmt: skip
        return 403, "you do not have permission to re-analyse repositories"
    if refresh_repository(
        repo_id=repo.pk, fingerprint=current_fingerprint(), priority=runs.INTERACTIVE
    ):
        outcome = "queued: the branch is fetched again and new commits analysed"
        status = 202
    else:
        outcome = f"nothing to do: the repository is {repo.status} already"
        status = 409
    record_audit(user=user, action="repo.reanalyse", target=target, outcome=outcome)
    return status, outcome
