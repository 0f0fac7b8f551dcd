"""A file view's read while a writer holds the lock its stale months need
(docs/analytics.md#performance), beside its anchor: the same read with no writer.

A synthetic history (``bench/analytics.py --seeded``'s, ``--commits`` of it, stored
directly) on SQLite (a file, WAL, as deployed) unless ``--database-url``. Its months are
aggregated once, then before every round each month's version moves on (stale, as a write
of its commits leaves it) and the whole-history file hotspots are timed:

- ``no writer``: the stale months are recomputed inside the read (the anchor);
- ``writer holding the lock``: another connection holds the lock for ``--hold`` seconds
  (SQLite: BEGIN IMMEDIATE, the database's write lock; PostgreSQL: the stamp rows FOR
  UPDATE, as a fenced write holds them) and the read falls back to the stored rows for
  every busy month (``LOCK_WAIT_MS``, 50 ms each at most);
- ``writer, waiting as before``: the same with ``LOCK_WAIT_MS`` set past the hold, as
  the read behaved before the fallback: it waits for the writer.

Median and max of ``--rounds`` in ms, the load average before and after. Prints JSON;
nothing is asserted.

    .venv/bin/python bench/aggregates_writer.py [--commits 100000] [--rounds 5] [--hold 3]
        [--database-url postgres://postgres@127.0.0.1:5432/aggregates_writer_bench]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from siblings import sibling  # noqa: E402  (bench/ is the script's directory)

__all__ = ["main"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commits", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--hold", type=float, default=3.0, help="seconds the writer holds")
    parser.add_argument("--database-url", default="")
    args = parser.parse_args()
    bench = sibling("analytics")
    tmp = Path(tempfile.mkdtemp(prefix="gitward-bench-aggwriter-"))
    out: dict[str, Any] = {"commits": args.commits, "hold_s": args.hold,
                           "load_average": list(os.getloadavg())}  # fmt: skip
    with bench.live.redis_nodes(tmp) as nodes:
        bench.setup_django(tmp, nodes, args.database_url)
        from django.conf import settings
        from django.db import connection, transaction
        from django.db.models import F
        from django.utils import timezone

        from dashboard import analytics
        from dashboard.analytics import aggregates
        from dashboard.models import MonthStamp, Repository
        from dashboard.repositories import current_fingerprint

        repo = Repository.objects.create(
            url="https://example.com/big/seeded.git", status="ready",
            commits_total=args.commits, synced_at=timezone.now(), analyzed_at=timezone.now(),
        )  # fmt: skip
        fp = current_fingerprint()
        bench.seed_history(repo.pk, fp, args.commits)
        whole = analytics.Scope.of(repo, analytics.parse_window(), fp)
        want = analytics.file_hotspots(whole)  # every month aggregated
        stamps = MonthStamp.objects.filter(repository=repo, fingerprint=fp)
        out["months"] = stamps.count()

        def one(writer: bool) -> float:
            stamps.update(version=F("version") + 1)
            holding, done = threading.Event(), threading.Event()

            def hold() -> None:
                try:
                    with transaction.atomic():
                        list(stamps.select_for_update().values_list("pk"))
                        holding.set()
                        done.wait(args.hold)
                finally:
                    connection.close()

            thread = threading.Thread(target=hold)
            if writer:
                thread.start()
                holding.wait()
            t0 = time.perf_counter()
            got = analytics.file_hotspots(whole)
            took = (time.perf_counter() - t0) * 1000
            done.set()
            if writer:
                thread.join()
            assert got == want, "the read differs from the stored rows"
            return took

        def rounds(writer: bool) -> dict[str, float]:
            times = [one(writer) for _ in range(args.rounds)]
            return {"median_ms": round(statistics.median(times), 1),
                    "max_ms": round(max(times), 1)}  # fmt: skip

        out["no writer (stale months recomputed)"] = rounds(False)
        out["writer holding the lock (stored rows)"] = rounds(True)
        aggregates.LOCK_WAIT_MS = int(args.hold * 1000 + 60_000)
        out["writer, waiting as before"] = rounds(True)
        out["vendor"] = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
        out["load_average_after"] = list(os.getloadavg())
    print(json.dumps(out, indent=2))
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
