"""``manage.py results REPO [--json] [--commits]`` — REPO is an id or a URL."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from dashboard.management.terminal import json_text, plain
from dashboard.models import Repository
from dashboard.repositories import (
    current_fingerprint,
    iter_commits,
    repository_status,
    repository_summary,
    resolve_repository,
)


class Command(BaseCommand):
    help = "Print a repository's analysis results."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("repo", help="repository id or URL")
        parser.add_argument("--json", action="store_true", help="status and aggregates as JSON")
        parser.add_argument("--commits", action="store_true", help="one JSON object per commit")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            repo = resolve_repository(options["repo"])
        except Repository.DoesNotExist:
            raise CommandError(f"no repository {plain(repr(options['repo']))}") from None
        fp = current_fingerprint()
        if options["commits"]:
            for row in iter_commits(repo, fingerprint=fp):
                self.stdout.write(json_text(row))
            return
        state = repository_status(repo)
        summary = repository_summary(repo, fp)
        if options["json"]:
            self.stdout.write(json_text(state | {"summary": summary}))
            return
        t = summary["totals"]
        lines = [
            f"{repo.name} ({repo.url}) branch {repo.branch or '(default)'}: {state['status']}",
            f"commits {t['commits']}/{state['commits_total']} · merges {t['merges']} · "
            f"authors {t['authors']} · +{t['insertions']} −{t['deletions']}",
        ]
        if state["error"]:
            lines.append(f"error: {state['error']}")
        if summary["authors"]:
            lines.append(
                "top authors: "
                + ", ".join(f"{a['name']} ({a['commits']})" for a in summary["authors"][:5])
            )
        if summary["languages"]:
            lines.append(
                "languages: "
                + ", ".join(f"{x['language']} {x['lines']}" for x in summary["languages"][:5])
            )
        if summary["hotspots"]:
            lines.append(
                "hotspots: "
                + ", ".join(f"{h['path']} ({h['changes']})" for h in summary["hotspots"][:5])
            )
        # repository data is the pusher's text: no control character reaches the terminal
        self.stdout.write("\n".join(plain(line) for line in lines))
