"""``manage.py verify [REPO] [--sample N] [--seed S] [--json]`` — one verification pass of
a repository's stored results against git (every ready repository when REPO is left out);
exit 2 when a difference is found (docs/analytics.md#verification). ``--open`` lists the
integrity group, ``--clear ID`` clears one of its mismatches (audited as ``cli``)."""

from __future__ import annotations

import json
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from dashboard import analytics
from dashboard.management.operator import CLI_OPERATOR
from dashboard.models import Repository
from dashboard.repositories import resolve_repository


class Command(BaseCommand):
    help = "Re-derive a sample of stored commits and the totals with git; exit 2 on a difference."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "repo", nargs="?", help="repository id or URL (default: every ready one)"
        )
        parser.add_argument(
            "--sample", type=int, default=500, help="commits re-derived (default 500)"
        )
        parser.add_argument("--seed", type=int, default=None, help="the sample's random seed")
        parser.add_argument("--json", action="store_true", help="one JSON object per repository")
        parser.add_argument(
            "--open", action="store_true", help="list the integrity group's open mismatches"
        )
        parser.add_argument(
            "--clear", type=int, metavar="ID", help="clear an open mismatch (audited)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["open"]:
            for m in analytics.open_mismatches():
                where = analytics.mismatch_text(m["details"])
                held = "; results withheld" if m["withheld"] else ""
                self.stdout.write(
                    f"#{m['id']} {m['repository']['name']}: {m['badge']}; {where}{held}"
                )
            return
        if options["clear"] is not None:
            if not analytics.clear_mismatch(options["clear"], user=CLI_OPERATOR):
                raise CommandError(f"no open integrity mismatch #{options['clear']}")
            self.stdout.write(f"cleared integrity mismatch #{options['clear']}")
            return
        if not 1 <= options["sample"] <= 100_000:
            raise CommandError("--sample must be between 1 and 100000")
        if options["repo"]:
            try:
                repos = [resolve_repository(options["repo"])]
            except Repository.DoesNotExist:
                raise CommandError(f"no repository {options['repo']!r}") from None
        else:
            repos = list(Repository.objects.filter(status=Repository.Status.READY).order_by("pk"))
        disagreed = False
        for repo in repos:
            try:
                result = analytics.verify_repository(
                    repo, sample=options["sample"], seed=options["seed"]
                )
            except analytics.CannotVerify as exc:
                raise CommandError(str(exc)) from None
            disagreed |= not result["agrees"]
            if options["json"]:
                self.stdout.write(json.dumps(result, ensure_ascii=False))
                continue
            t = result["totals"]
            line = (
                f"{repo.name}: {result['sampled']} commits sampled, "
                f"{len(result['mismatches'])} mismatches; totals "
                + (
                    "agree"
                    if t["git"] == t["stored"]
                    else f"differ: stored {t['stored']}, git {t['git']}"
                )
            )
            self.stdout.write(line)
            for m in result["mismatches"][:10]:
                self.stdout.write(f"  {m['sha']}: git {m['git']} stored {m['stored']}")
        if disagreed:
            sys.exit(2)
