"""``manage.py ready``: is this process able to serve? Exit 0, or one line and exit 1.

The checks (database, migrations, lock quorum, queue Redis) are ``dashboard.operations.readiness``,
the same ones ``GET /readyz`` answers over HTTP. Used by the worker containers'
readiness probes (a worker serves no HTTP); the web image's HEALTHCHECK uses ``/readyz``.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from dashboard.operations import check_readiness


class Command(BaseCommand):
    help = "Exit 0 when the database, a majority of lock masters and the queue Redis are ready."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--timeout", type=float, default=1.0, help="seconds per Redis PING (default 1)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        timeout = options["timeout"]
        if timeout <= 0:
            raise CommandError("--timeout must be positive")
        readiness = check_readiness(timeout=timeout)
        if not readiness.ready:
            raise CommandError("not ready: " + readiness.problem_line())
        if options["verbosity"] >= 1:
            self.stdout.write("ready")
