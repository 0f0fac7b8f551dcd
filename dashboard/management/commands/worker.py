"""``manage.py worker [--workers N] [--burst]``: run RQ workers for gitward's queues."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from dashboard.queues import RedisUnavailable, queue_names, redis_urls
from workers.pool import Pool, run_one_worker


def worker_queues() -> list[str]:
    return queue_names()


class Command(BaseCommand):
    help = "Run gitward workers (one process per worker)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--workers", type=int, default=None, help="processes (default $WORKERS)"
        )
        parser.add_argument("--burst", action="store_true", help="exit when the queues are empty")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            redis_urls()
        except RedisUnavailable as exc:
            raise CommandError(str(exc)) from None
        count = options["workers"] if options["workers"] is not None else settings.WORKERS
        if count < 1:
            raise CommandError("--workers must be at least 1")
        if count == 1 or options["burst"]:
            run_one_worker(worker_queues(), burst=options["burst"])
            return
        pool = Pool(count, manage_py=Path(settings.BASE_DIR) / "manage.py")
        stop = {"now": False}

        def on_signal(signum: int, frame: Any) -> None:
            stop["now"] = True

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        pool.start()
        self.stdout.write(f"started {count} workers on {', '.join(worker_queues())}")
        while not stop["now"]:
            pool.check()
            time.sleep(1)
        pool.stop()
