"""``manage.py worker [--workers N] [--burst] [--analyzer FP [--shared]] [--queues Q,…]
[--express]``.

Without ``--workers 1`` it supervises a pool (``workers.pool.Pool``) that runs workers
for every staffed analyzer version and the ``rollouts`` driver queue, following the
versions table without a restart. ``--workers 1`` runs one worker in this process:

* ``--analyzer FP``: it loads that version's config and listens on its physical queue
  (``analysis@<fp8>``); ``--shared`` adds the sync and maintenance queues;
* ``--queues Q,…``: exactly those queues (e.g. ``rollouts``);
* neither: the served (current) version with the shared queues;
* ``--express``: the worker takes only small interactive jobs (the reserved interactive
  slot, docs/scheduling.md#the-reserved-interactive-slot).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from dashboard.infra import MAINTENANCE_QUEUE, SYNC_QUEUE, RedisUnavailable, redis_urls
from dashboard.versions import served_fingerprint
from dashboard.web.humanize import count
from workers.analysis import AnalyzerConfig, queue_name
from workers.pool import Pool, run_one_worker, version_config


def worker_queues(fingerprint: str | None = None, *, shared: bool = True) -> list[str]:
    """The queues of one worker of version ``fingerprint`` (default: the served one)."""
    fp = fingerprint or served_fingerprint()
    return [SYNC_QUEUE, queue_name(fp), MAINTENANCE_QUEUE] if shared else [queue_name(fp)]


class Command(BaseCommand):
    help = "Run gitward workers (one process per worker)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--workers", type=int, default=None, help="processes (default $WORKERS)"
        )
        parser.add_argument("--burst", action="store_true", help="exit when the queues are empty")
        parser.add_argument("--analyzer", default=None, help="analyzer fingerprint to load")
        parser.add_argument("--shared", action="store_true", help="also sync and maintenance")
        parser.add_argument("--queues", default=None, help="comma-separated queue names")
        parser.add_argument(
            "--express", action="store_true", help="take only small interactive jobs"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            redis_urls()
        except RedisUnavailable as exc:
            raise CommandError(str(exc)) from None
        size = options["workers"] if options["workers"] is not None else settings.WORKERS
        if size < 1:
            raise CommandError("--workers must be at least 1")
        if size == 1 or options["burst"]:
            names, configs = self._one(options)
            try:
                run_one_worker(
                    names, burst=options["burst"], configs=configs, express=options["express"]
                )
            except ValueError as exc:
                raise CommandError(str(exc)) from None
            return
        pool = Pool(size, manage_py=Path(settings.BASE_DIR) / "manage.py")
        stop = {"now": False}

        def on_signal(signum: int, frame: Any) -> None:
            stop["now"] = True

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        pool.start()
        self.stdout.write(f"started {count(len(pool.children), 'worker')}: {pool.specs()}")
        while not stop["now"]:
            pool.check()
            time.sleep(1)
        pool.stop()

    def _one(self, options: dict[str, Any]) -> tuple[list[str], list[AnalyzerConfig]]:
        if options["queues"]:
            names = [n.strip() for n in options["queues"].split(",") if n.strip()]
            if not names:
                raise CommandError("--queues names no queue")
            return names, []
        fp = options["analyzer"] or served_fingerprint()
        try:
            config = version_config(fp)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        shared = options["shared"] or not options["analyzer"]
        return worker_queues(fp, shared=shared), [config]
