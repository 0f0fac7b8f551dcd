"""``manage.py precompute [REPO] [--enqueue]`` — compute the aggregates the whole-history
analytics views read, for one repository or every ready one, here and now (or enqueue
the background job with ``--enqueue``); one line per repository
(docs/analytics.md#precomputation). A bad repository is one line and exit 1."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from dashboard import analytics
from dashboard.infra import QueueUnavailable
from dashboard.models import Repository
from dashboard.repositories import current_fingerprint, resolve_repository


class Command(BaseCommand):
    help = "Compute the analytics aggregates of the whole history now (or --enqueue the job)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "repo", nargs="?", help="repository id or URL (default: every ready one)"
        )
        parser.add_argument(
            "--enqueue",
            action="store_true",
            help="put the low-priority precompute job on the maintenance queue instead",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["repo"]:
            try:
                repos = [resolve_repository(options["repo"])]
            except Repository.DoesNotExist:
                raise CommandError(f"no repository {options['repo'][:200]!r}") from None
        else:
            repos = list(Repository.objects.filter(status=Repository.Status.READY).order_by("pk"))
        fp = current_fingerprint()
        for repo in repos:
            if options["enqueue"]:
                try:
                    queued = analytics.enqueue_precompute(repo.pk, fp, force=True)
                except QueueUnavailable as exc:
                    raise CommandError(f"queue server unavailable: {exc}") from None
                what = "enqueued" if queued else "already pending"
                self.stdout.write(f"repository {repo.pk}: precompute job {what}")
                continue
            self.stdout.write(analytics.run_precompute(repo.pk, fp))
