"""Scrape cost of ``GET /metrics`` at scale, and the cost of recording metrics per job.

1. Scrape: 100,000 succeeded runs and 100,000 dead letters (40 root causes, 20
   repositories) in SQLite, 3 local Redis masters, the telemetry hash filled by a few
   thousand recorded job attempts over 4 queues and versions; ``metrics_text()`` (the
   whole server-side work of a scrape) timed cold (dead-letter group counts computed at
   every scrape, ``GITWARD_METRICS_CACHE_SECONDS=0``: 10 rounds), warm (the default:
   counts reused while the dead set is unchanged, 20 rounds) and right after a change of
   the dead set (5 rounds).
2. Recording: what one job attempt adds — the lifecycle counters and histograms of
   ``dashboard.observability.counters`` plus its two flushes to Redis — timed over 2,000 attempts,
   and set against the analysis benchmark's end-to-end time (BENCHMARKS.md).

Prints JSON; nothing here is asserted by a test.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from siblings import sibling  # noqa: E402  (bench/ is the script's directory)

live = sibling("live")


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="gitward-bench-metrics-"))
    out: dict[str, Any] = {}
    with live.redis_nodes(tmp) as nodes:
        live.setup_django(tmp, nodes)
        from django.db import connection

        from dashboard.models import JobRun
        from dashboard.observability import counters
        from dashboard.operations.prometheus import metrics_text

        t0 = time.perf_counter()
        live.fill(100_000, 1_000, 1)
        cols = [f.column for f in JobRun._meta.concrete_fields if f.column != "id"]
        select = ", ".join(
            "job_id || '-ok'" if c == "job_id" else "'succeeded'" if c == "state" else c
            for c in cols
        )
        with connection.cursor() as cur:
            cur.execute(
                f"INSERT INTO dashboard_jobrun ({', '.join(cols)}) "
                f"SELECT {select} FROM dashboard_jobrun WHERE state = 'dead'"
            )
        out["runs"] = JobRun.objects.count()
        out["dead_letters"] = JobRun.objects.filter(state="dead").count()
        out["fill_s"] = round(time.perf_counter() - t0, 1)

        class Run:
            def __init__(self, i: int) -> None:
                self.queue = ["sync", "analysis@aaaaaaaa", "analysis@bbbbbbbb", "maintenance"][
                    i % 4
                ]
                self.version = ["a" * 64, "b" * 64][i % 2]
                self.fingerprint = self.version
                self.error = "WorkerDied" if i % 50 == 0 else ""
                from django.utils import timezone

                self.started_at = timezone.now()
                self.finished_at = None

        kinds = ["job.started", "job.succeeded"]
        t0 = time.perf_counter()
        attempts = 2_000
        for i in range(attempts):
            run = Run(i)
            for kind in kinds if i % 10 else ["job.started", "job.failed"]:
                counters.record_run_event(kind, run)
            counters.observe(counters.LOCK_ACQUIRE_SECONDS, 0.004)
            counters.count(counters.LOCK_COUNTERS["acquired"], 1)
            counters.count(counters.LOCK_COUNTERS["releases"], 1)
        per_attempt = (time.perf_counter() - t0) / attempts
        out["record_ms_per_attempt"] = round(per_attempt * 1000, 3)
        out["telemetry_fields"] = len(counters.read_all())
        # The analysis benchmark (BENCHMARKS.md): 28 attempts (1 sync + 27 chunks), 7.15 s.
        out["analysis_overhead_pct"] = round(28 * per_attempt / 7.15 * 100, 3)

        from django.conf import settings

        from dashboard.runs import dead_letter_counts

        def scrapes(rounds: int) -> tuple[list[float], str]:
            metrics_text()  # warm up (queries compiled, connections open, counts cached)
            took = []
            for _ in range(rounds):
                t = time.perf_counter()
                text = metrics_text()
                took.append(time.perf_counter() - t)
            return took, text

        # Cold: the dead-letter group counts computed at every scrape (what every scrape
        # paid before dashboard/runs/dead_letter_counts.py; GITWARD_METRICS_CACHE_SECONDS=0).
        settings.METRICS_CACHE_SECONDS = 0
        cold, _ = scrapes(10)
        out["scrape_cold_ms_median"] = round(statistics.median(cold) * 1000, 1)
        out["scrape_cold_ms_max"] = round(max(cold) * 1000, 1)
        # Warm: the default; counts reused while the dead set is unchanged (the usual
        # scrape: between two scrapes no run died, was retried or discarded).
        settings.METRICS_CACHE_SECONDS = 30.0
        times, text = scrapes(20)
        # One death between two scrapes: the next scrape recomputes (then reuses again).
        after_change = []
        for _ in range(5):
            dead_letter_counts.changed()
            t = time.perf_counter()
            metrics_text()
            after_change.append(time.perf_counter() - t)
        out["scrape_after_a_change_ms_median"] = round(statistics.median(after_change) * 1000, 1)
        from dashboard.operations import prometheus as m

        parts = {}
        for name in ("_aggregated", "_queues", "_runs", "_workers", "_masters", "_rollouts"):
            took = []
            for _ in range(5):
                t = time.perf_counter()
                list(getattr(m, name)())
                took.append(time.perf_counter() - t)
            parts[name.strip("_")] = round(statistics.median(took) * 1000, 1)
        out["scrape_parts_ms"] = parts
        out["scrape_warm_ms_median"] = round(statistics.median(times) * 1000, 1)
        out["scrape_warm_ms_max"] = round(max(times) * 1000, 1)
        out["exposition_bytes"] = len(text)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
