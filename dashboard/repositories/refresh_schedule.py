"""Scheduled refresh (docs/lifecycle.md#scheduled-refresh): every repository is fetched
again on a schedule kept in its row, so results follow the remote without anyone
re-submitting, and a restart picks the schedule up where it was.

- ``Repository.next_refresh_at``: when it is due; ``refresh_interval``: the current
  interval in seconds; ``refresh_head``: the head it had when last scheduled;
  ``refresh_failures``: refreshes in a row that found it failed.
- **Adaptive**: at each due refresh, a head that moved since the last one halves the
  interval (an active repository is fetched more often), an unchanged head makes it
  1.5 times longer, within ``GITWARD_REFRESH_MIN`` … ``GITWARD_REFRESH_MAX``.
- **Backs off failing remotes**: a repository found ``failed`` doubles its interval per
  failure in a row (up to the maximum) instead of being fetched at the same rate.
- **No flood**: a round (the reconciler's) takes at most ``GITWARD_REFRESH_BATCH`` due
  repositories, oldest due first; a repository seen for the first time is given a
  random first time within its interval, so turning the schedule on (or restoring
  10,000 rows) spreads the fetches instead of starting them together. Nothing is kept in
  Redis: after a restart only the rows that are due are refreshed.

Off while ``GITWARD_REFRESH_INTERVAL`` is 0 (the default).
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from dashboard import runs
from dashboard.models import Repository
from dashboard.repositories.lifecycle import current_fingerprint, refresh_repository


def next_interval(repo: Repository) -> tuple[float, int]:
    """``(interval seconds, failures in a row)`` after a due refresh of ``repo``."""
    low, high = float(settings.REFRESH_MIN), float(settings.REFRESH_MAX)
    current = repo.refresh_interval or float(settings.REFRESH_INTERVAL)
    if repo.status == Repository.Status.FAILED:
        failures = repo.refresh_failures + 1
        return min(high, current * 2), failures
    moved = bool(repo.refresh_head) and repo.head != repo.refresh_head
    interval = current / 2 if moved else current * 1.5
    return max(low, min(high, interval)), 0


def refresh_due(*, now: datetime | None = None) -> dict[str, int]:
    """One round: give unscheduled repositories a first time, then refresh at most
    ``REFRESH_BATCH`` due ones (a new sync generation each, ``refresh_repository``) and
    schedule their next time. Returns ``{scheduled, refreshed, busy}``.

    Race: two reconcilers run a round at once. Each due row is moved to its next time by
    a conditional UPDATE on the ``next_refresh_at`` it read, so exactly one round claims
    it and refreshes it; the other matches nothing and skips it."""
    if float(settings.REFRESH_INTERVAL) <= 0:
        return {"scheduled": 0, "refreshed": 0, "busy": 0}
    now = now or timezone.now()
    base = float(settings.REFRESH_INTERVAL)
    scheduled = 0
    fresh = Repository.objects.filter(next_refresh_at__isnull=True).values_list("pk", flat=True)
    for pk in list(fresh[: int(settings.REFRESH_BATCH) * 10]):
        first = now + timedelta(seconds=random.uniform(0, base))
        scheduled += Repository.objects.filter(pk=pk, next_refresh_at__isnull=True).update(
            next_refresh_at=first, refresh_interval=base
        )
    refreshed = busy = 0
    due = Repository.objects.filter(next_refresh_at__lte=now).order_by("next_refresh_at")
    for repo in list(due[: int(settings.REFRESH_BATCH)]):
        interval, failures = next_interval(repo)
        jitter = random.uniform(0.9, 1.1)
        with transaction.atomic():
            claimed = Repository.objects.filter(
                pk=repo.pk, next_refresh_at=repo.next_refresh_at
            ).update(
                next_refresh_at=now + timedelta(seconds=interval * jitter),
                refresh_interval=interval,
                refresh_failures=failures,
                refresh_head=repo.head,
            )
            if not claimed:
                continue
            # A busy repository (syncing or analysing its served version) is not
            # refreshed now: the run in progress fetches or has fetched recently.
            if refresh_repository(
                repo_id=repo.pk, fingerprint=current_fingerprint(), priority=runs.REFRESH
            ):
                refreshed += 1
            else:
                busy += 1
    return {"scheduled": scheduled, "refreshed": refreshed, "busy": busy}
