"""``manage.py dlq list|retry|discard [--group G] [--all] [--run ID ...] [--json]``."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from dashboard.accounts import record_audit
from dashboard.runs import list_groups, new_bulk, run_bulk
from dashboard.web.humanize import count


class Command(BaseCommand):
    help = "Inspect and act on the dead-letter queue."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("action", choices=["list", "retry", "discard"])
        parser.add_argument("--group", help="a root-cause group (from `dlq list`)")
        parser.add_argument("--all", action="store_true", help="every dead letter")
        parser.add_argument("--run", type=int, action="append", default=[], help="a run id")
        parser.add_argument("--json", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["action"] == "list":
            groups = list_groups()
            if options["json"]:
                self.stdout.write(json.dumps(groups))
                return
            if not groups:
                self.stdout.write("the dead-letter queue is empty")
            for g in groups:
                self.stdout.write(
                    f"{g['group']}  {count(g['count'], 'run'):>10}  "
                    f"{count(g['repositories'], 'repository,repositories')}  "
                    f"last {_when(g['last_seen'])}  {g['cause']}"
                )
            return
        chosen = [bool(options["group"]), options["all"], bool(options["run"])]
        if sum(chosen) != 1:
            raise CommandError("choose exactly one of --group G, --all, --run ID")
        selector: dict[str, Any] = (
            {"group": options["group"]}
            if options["group"]
            else {"all": True}
            if options["all"]
            else {"runs": options["run"]}
        )
        # The CLI is not a web request: it runs the same tracked bulk action inline.
        action = new_bulk(kind=options["action"], selector=selector, actor="cli")
        try:
            action = run_bulk(action.pk)
        except Exception as exc:
            record_audit(user="cli", action=f"dlq.{options['action']}", target=str(selector),
                         outcome=f"failed: {exc}")  # fmt: skip
            raise CommandError(f"{options['action']} failed: {exc}") from None
        verb = "re-queued" if options["action"] == "retry" else "discarded"
        self.stdout.write(f"{count(action.done, 'run')} {verb}")


def _when(value: object) -> str:
    """``2026-12-01 16:22:46 UTC``: the JSON's ISO time without microseconds."""
    try:
        at = datetime.fromisoformat(str(value)).astimezone(UTC)
    except ValueError:
        return str(value)
    return at.strftime("%Y-%m-%d %H:%M:%S UTC")
