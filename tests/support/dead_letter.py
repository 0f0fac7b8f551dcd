"""One dead letter written into a running ``manage.py up`` from another process, as a
worker writes one: a repository row and one analysis run of it, created, claimed and
dead-lettered through the real attempt path (``runs.begin_attempt`` / ``fail_attempt``)
in one transaction, so no other process ever sees the run queued.

``python -m tests.support.dead_letter NAME`` (in the ``up``'s environment) prints the
run's id."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")

import django

django.setup()

from django.db import transaction  # noqa: E402

from dashboard.models import JobRun, Repository  # noqa: E402
from dashboard.runs.attempts import begin_attempt, ensure_run, fail_attempt  # noqa: E402


def main(name: str) -> int:
    with transaction.atomic():
        url = f"https://example.invalid/{name}.git"
        repo = Repository.objects.create(url=url, fetch_url=url)
        run = ensure_run(
            kind=JobRun.Kind.ANALYZE,
            job_id=f"deadletter-{name}",
            queue="analyze",
            repository_id=repo.pk,
        )
        attempt = begin_attempt(run_id=run.pk, number=1, worker="deadletter")
        assert attempt is not None
        fail_attempt(attempt, KeyError(f"{name} lost its history"), permanent=True)
    print(run.pk, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
