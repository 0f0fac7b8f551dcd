"""``manage.py fair_group [NAME [WEIGHT | --clear]]``: list, set or clear the fairness
weight of a repository group (docs/scheduling.md#group-weights). Audited as ``cli``."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from dashboard.management.operator import CLI_OPERATOR
from dashboard.management.terminal import plain
from dashboard.runs import group_weights, set_group_weight

__all__ = ["Command"]


class Command(BaseCommand):
    help = "List, set or clear a repository group's fairness weight."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("name", nargs="?", help="group: host/owner, a directory, or a name")
        parser.add_argument("weight", nargs="?", help="runs of each of its repositories that "
                            "may wait in one queue at once (0: no limit)")  # fmt: skip
        parser.add_argument("--clear", action="store_true", help="remove the group's weight")

    def handle(self, *args: Any, **options: Any) -> None:
        name, raw = options["name"], options["weight"]
        if name is None:
            for group, set_to in sorted(group_weights().items()):
                self.stdout.write(f"{plain(group)}\t{set_to}")
            return
        if options["clear"] == (raw is not None):
            raise CommandError("give a WEIGHT or --clear (one of them)")
        weight: int | None = None
        if raw is not None:
            try:
                weight = int(raw)
            except ValueError:
                raise CommandError(
                    f"weight must be a whole number, not {plain(repr(raw))}"
                ) from None
        try:
            self.stdout.write(plain(set_group_weight(name, weight, user=CLI_OPERATOR)))
        except ValueError as exc:
            raise CommandError(str(exc)) from None
