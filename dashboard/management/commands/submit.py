"""``manage.py submit URL [--branch B] [--wait] [--timeout S] [--json]``.

Exit 0 when submitted (or, with --wait, when the analysis finished); non-zero with a
one-line reason otherwise: 1 bad input or setup, 2 analysis failed, 3 timed out.
"""

from __future__ import annotations

import json
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from dashboard.infra import RedisUnavailable
from dashboard.management.terminal import plain
from dashboard.models import Repository
from dashboard.repositories import repository_status, submit_repository
from dashboard.web.humanize import count
from workers.remotes import InvalidRemote


class Command(BaseCommand):
    help = "Submit a repository for analysis."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("url")
        parser.add_argument("--branch", default=None)
        parser.add_argument("--wait", action="store_true", help="wait until analysed")
        parser.add_argument("--timeout", type=float, default=3600.0, help="seconds for --wait")
        parser.add_argument("--json", action="store_true", help="print the status as JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            repo, created = submit_repository(url=options["url"], branch=options["branch"])
        except InvalidRemote as exc:
            raise CommandError(f"invalid repository: {exc}") from None
        except RedisUnavailable as exc:
            raise CommandError(str(exc)) from None
        if options["wait"]:
            deadline = time.monotonic() + options["timeout"]
            while True:
                repo.refresh_from_db()
                if repo.status in {Repository.Status.READY, Repository.Status.FAILED}:
                    break
                if time.monotonic() > deadline:
                    self._print(repo, options)
                    raise CommandError(
                        f"timed out after {options['timeout']:g}s; repository {repo.pk} is "
                        f"{repo.status}",
                        returncode=3,
                    )
                time.sleep(0.25)
        self._print(repo, options, created=created)
        if repo.status == Repository.Status.FAILED:
            raise CommandError(
                plain(f"analysis failed: {repo.error or 'unknown error'}"), returncode=2
            )

    def _print(
        self, repo: Repository, options: dict[str, Any], *, created: bool | None = None
    ) -> None:
        state = repository_status(repo)
        if options["json"]:
            self.stdout.write(json.dumps(state))  # ASCII: every control escaped
            return
        verb = "submitted" if created else "already known:" if created is False else ""
        line = (
            f"{verb} repository {repo.pk} {repo.url} [{state['status']}] "
            f"{state['commits_analyzed']}/{count(state['commits_total'], 'commit')}"
        )
        self.stdout.write(plain(line.replace("  ", " ").strip()))
