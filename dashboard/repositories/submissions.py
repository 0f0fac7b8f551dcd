"""A submission by a user, from the form or ``POST /api/repos`` (docs/api.md).

A new URL and branch creates the repository and queues its sync. A duplicate (the same
normalised URL and branch) returns the existing repository **unchanged**: submitting is
open to every logged-in user, re-analysing is not. Only a user who may re-analyse
(``reanalysis.PERMISSION``, as for the repository page's button) re-analyses a ready or
failed repository by submitting it again, and then exactly as the button does: through
``reanalysis.reanalyse``, so the new sync is audited as ``repo.reanalyse``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from django.db import transaction

from dashboard.models import Repository
from dashboard.repositories.lifecycle import ensure_sync_run, get_or_create_repository
from dashboard.repositories.reanalysis import may_reanalyse, reanalyse
from dashboard.runs import enqueue_after_commit

__all__ = ["CREATED", "EXISTING", "REANALYSED", "Submission", "user_submission"]

CREATED = "created"
EXISTING = "existing"
REANALYSED = "reanalysed"


class Submission(NamedTuple):
    repository: Repository
    #: ``CREATED`` (its sync is queued), ``EXISTING`` (nothing changed) or
    #: ``REANALYSED`` (a new sync generation is queued, audited).
    outcome: str


def user_submission(*, url: str, branch: str | None, user: Any) -> Submission:
    """Validate (``InvalidRemote``), then create the repository or find the existing one.

    Race: two identical submissions at once. ``get_or_create`` relies on the unique
    (url, branch) constraint, so both get the same row and only the creator queues a
    sync. A duplicate never moves the row itself: a re-analysis is ``reanalyse``'s
    conditional UPDATE (ready/failed → queued), so concurrent duplicates by users who
    may re-analyse start one sync, and each is audited with what it did.
    """
    with transaction.atomic():
        repo, created = get_or_create_repository(url=url, branch=branch, user=user)
        if created:
            enqueue_after_commit([ensure_sync_run(repo).pk])
            return Submission(repo, CREATED)
    reanalysable = repo.status in {Repository.Status.READY, Repository.Status.FAILED}
    if reanalysable and may_reanalyse(user):
        status, _ = reanalyse(repo, user)
        repo.refresh_from_db()
        if status == 202:
            return Submission(repo, REANALYSED)
    return Submission(repo, EXISTING)
