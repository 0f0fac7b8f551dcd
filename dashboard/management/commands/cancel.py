"""``manage.py cancel (--repo ID|URL | --run ID | [--state S] [--queue Q] [--repo-id N])``:
cancel analysis (docs/lifecycle.md#cancelling). Audited as the actor ``cli``."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from dashboard.infra import is_db_id
from dashboard.management.operator import CLI_OPERATOR
from dashboard.management.terminal import plain
from dashboard.models import JobRun, Repository
from dashboard.repositories import resolve_repository
from dashboard.runs import Cancelled, CancelRefused, cancel_filtered, cancel_repository, cancel_run
from dashboard.web.humanize import count


class Command(BaseCommand):
    help = "Cancel the analysis of a repository, one run, or every run a filter selects."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--repo", help="a repository (id or URL): cancel its analysis")
        parser.add_argument("--run", type=int, help="a run id")
        parser.add_argument("--state", default="", help="filter: queued, failed or running")
        parser.add_argument("--queue", default="", help="filter: a queue name")
        parser.add_argument("--repo-id", type=int, help="filter: a repository id")

    def handle(self, *args: Any, **options: Any) -> None:
        filtered = bool(options["state"] or options["queue"] or options["repo_id"] is not None)
        if sum([options["repo"] is not None, options["run"] is not None, filtered]) != 1:
            raise CommandError(
                "choose one of --repo, --run, or a filter (--state/--queue/--repo-id)"
            )
        for name in ("run", "repo_id"):
            if options[name] is not None and not is_db_id(options[name]):
                raise CommandError(f"--{name.replace('_', '-')} must be an id (1 … 2^63-1)")
        user = CLI_OPERATOR
        try:
            if options["repo"] is not None:
                try:
                    repo = resolve_repository(options["repo"])
                except Repository.DoesNotExist:
                    raise CommandError(f"no repository {plain(repr(options['repo']))}") from None
                done = cancel_repository(repo, user)
                repo.refresh_from_db()
                self.stdout.write(f"{_said(done)}; {plain(repo.name)} is {repo.status}")
                return
            if options["run"] is not None:
                run = JobRun.objects.select_related("repository").filter(pk=options["run"]).first()
                if run is None:
                    raise CommandError(f"no run {options['run']}")
                self.stdout.write(_said(cancel_run(run, user)))
                return
            done = cancel_filtered(
                user, state=options["state"], queue=options["queue"], repo=options["repo_id"]
            )
        except CancelRefused as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(_said(done))


def _said(done: Cancelled) -> str:
    return (
        f"{count(len(done.runs), 'run')} cancelled ({done.dequeued} dequeued, "
        f"{done.stopped} running stopped, {count(len(done.fenced), 'lock')} fenced)"
    )
