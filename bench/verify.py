"""The scheduled verifier's cost as a share of analysis time
(docs/analytics.md#the-scheduled-verifier).

``bench/analysis.py``'s synthetic history is analysed by gitward's own pipeline in this
process (submit, then a burst RQ worker draining the queues; ``bench/analytics.py``'s
setup), then one verification pass (``analytics.verify_repository``: a sample of stored
commits re-derived one ``git diff-tree`` each, and the totals counted again at the head)
is timed ``--rounds`` times at the default sample (500) and once over every stored commit.
Printed as JSON: the analysis time, each pass's median time, and their ratios to it
(``pass / analysis``), plus the share of one worker a repository's passes take at the
default interval (``pass / GITWARD_VERIFY_INTERVAL``), and the 1-minute load average at
the start and end (the machine may be shared: say so beside any figure). Nothing is
asserted.

    .venv/bin/python bench/verify.py [--commits 3000] [--rounds 3] [--sample 500]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from siblings import sibling  # noqa: E402  (bench/ is the script's directory)

bench_analytics = sibling("analytics")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--commits", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sample", type=int, default=500)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gitward-bench-verify-"))
    out: dict[str, Any] = {"commits": args.commits, "load_average_start": os.getloadavg()[0]}
    origin = tmp / "origin"
    bench_analytics.synth.build_repository(origin, args.commits, seed=7)
    with bench_analytics.live.redis_nodes(tmp) as nodes:
        bench_analytics.setup_django(tmp, nodes, "")
        from django.conf import settings
        from rq import SimpleWorker

        from dashboard import analytics
        from dashboard.infra import queues
        from dashboard.management.commands.worker import worker_queues
        from dashboard.models import Commit
        from dashboard.repositories import submit_repository
        from workers.pool import PauseAware

        class Worker(PauseAware, SimpleWorker):
            pass

        t0 = time.perf_counter()
        repo, _ = submit_repository(url=str(origin))
        worker = Worker(
            [queues.queue(n) for n in worker_queues()], connection=queues.worker_connection()
        )
        worker.work(burst=True, with_scheduler=True, logging_level="WARNING")
        repo.refresh_from_db()
        assert repo.status == "ready", repo.error
        analysis = time.perf_counter() - t0
        stored = Commit.objects.filter(repository=repo).count()
        out.update(analyse_s=round(analysis, 2), stored_commits=stored)

        def one(sample: int) -> float:
            t = time.perf_counter()
            result = analytics.verify_repository(repo, sample=sample, seed=1)
            assert result["agrees"], result["mismatches"][:3]
            return time.perf_counter() - t

        sampled = statistics.median(one(args.sample) for _ in range(args.rounds))
        full = one(stored)
        interval = float(settings.VERIFY_INTERVAL)
        out.update(
            sample=args.sample,
            pass_s=round(sampled, 3),
            pass_over_analysis=round(sampled / analysis, 4),
            full_pass_s=round(full, 3),
            full_pass_over_analysis=round(full / analysis, 4),
            verify_interval_s=interval,
            worker_share_at_interval=round(sampled / interval, 6) if interval else None,
            load_average_end=os.getloadavg()[0],
        )
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
