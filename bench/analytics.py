"""Server time of every analytics view (docs/analytics.md) over a synthetic history,
beside its anchor: ``git log --no-merges --numstat`` over the same window, the one git
command every view can be reproduced from.

The repository is ``bench/analysis.py``'s synthetic history (``git fast-import``: 40
authors, 11 directories, topic branches merged every 15-60 commits), analysed by
gitward's own pipeline in this process (submit, then a burst RQ worker draining the
queues), so the rows are exactly what a deployment stores. Then each view is computed
``--rounds`` times after one warm-up, for the whole history and for the last 90 and
365 days of it; printed: the median and max wall time in ms, and the anchor's (``git
log`` of the same window, output read and discarded: git's own cost of the raw data,
before any aggregation). SQLite by default; ``--database-url`` for PostgreSQL. Prints
JSON; nothing is asserted.

``--exclude LENS[,LENS]`` computes every view through those lenses (docs/analytics.md#lenses):
run it with and without to see what a lens costs.

``--pydriller N`` adds PyDriller's process metrics (ChangeSet, CodeChurn,
ContributorsCount; the bench extra) over the newest N commits, beside the views that give
the same per-file figures over the same commits (PyDriller walks merges too; the views
leave them out).

    .venv/bin/python bench/analytics.py [--commits 12000] [--rounds 7] [--pydriller 3000]
        [--database-url postgres://postgres@127.0.0.1:5432/gw_analytics_bench]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(
        f"_gitward_bench_{name}", ROOT / "bench" / f"{name}.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


live = _load("live")
synth = _load("analysis")


def timed(fn: Callable[[], Any], rounds: int) -> dict[str, float]:
    fn()  # warm-up
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return {"median_ms": round(statistics.median(times), 1), "max_ms": round(max(times), 1)}


def paired(plain: Callable[[], Any], lensed: Callable[[], Any], rounds: int) -> dict[str, float]:
    """Both variants timed in alternation (so a change of load hits both alike): their
    medians in ms and the lensed one's ratio to the plain one."""
    plain()
    lensed()
    a: list[float] = []
    b: list[float] = []
    for _ in range(rounds):
        for fn, times in ((plain, a), (lensed, b)):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1000)
    pm, lm = statistics.median(a), statistics.median(b)
    return {"plain_ms": round(pm, 1), "lensed_ms": round(lm, 1), "ratio": round(lm / pm, 2)}


def git_log(origin: Path, args: list[str]) -> Callable[[], None]:
    def run() -> None:
        subprocess.run(
            ["git", "-C", str(origin), "log", "--no-merges", "--no-renames", "--numstat",
             "--format=%H %cI %aE", *args],
            check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip

    return run


def setup_django(tmp: Path, nodes: list[Any], database_url: str) -> None:
    """Django in this process on a fresh database (SQLite under ``tmp`` unless
    ``database_url``), ``nodes`` as the Redis masters, ``tmp`` as the local root
    submissions may use; no inherited gitward settings."""
    for key in list(os.environ):
        if key.startswith(("REDIS_URL", "GITWARD_", "DATABASE_URL")):
            del os.environ[key]
    (tmp / "var").mkdir(parents=True, exist_ok=True)
    os.environ.update(
        DJANGO_SETTINGS_MODULE="dashboard.settings",
        GITWARD_VAR_DIR=str(tmp / "var"),
        GITWARD_LOCAL_ROOTS=str(tmp),
        DATABASE_URL=database_url or f"sqlite:///{tmp / 'var' / 'db.sqlite3'}",
        REDIS_URLS=",".join(n.url for n in nodes),
        GITWARD_LOG_LEVEL="WARNING",
    )
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--commits", type=int, default=12_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--database-url", default="")
    parser.add_argument(
        "--pydriller",
        type=int,
        default=0,
        metavar="N",
        help="also time PyDriller's process metrics over the newest N commits (bench extra)",
    )
    parser.add_argument("--exclude", default="", help="lenses every view leaves out")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gitward-bench-analytics-"))
    out: dict[str, Any] = {
        "commits": args.commits,
        "load_average": os.getloadavg()[0],
        "exclude": args.exclude,
    }
    origin = tmp / "origin"
    t0 = time.perf_counter()
    synth.build_repository(origin, args.commits, seed=7)
    out["build_s"] = round(time.perf_counter() - t0, 1)
    with live.redis_nodes(tmp) as nodes:
        setup_django(tmp, nodes, args.database_url)
        from rq import SimpleWorker

        from dashboard import analytics
        from dashboard.infra import queues
        from dashboard.management.commands.worker import worker_queues
        from dashboard.models import Commit, FileChange
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
        out["analyse_s"] = round(time.perf_counter() - t0, 1)
        out["stored_commits"] = Commit.objects.filter(repository=repo).count()
        out["stored_file_rows"] = FileChange.objects.filter(repository=repo).count()
        last_day = (
            subprocess.run(
                ["git", "-C", str(origin), "log", "-1", "--format=%cd", "--date=format:%Y-%m-%d"],
                check=True, capture_output=True, text=True,
            ).stdout.strip()
        )  # fmt: skip
        windows = {
            "whole history": analytics.parse_window(),
            "last 365 days": analytics.parse_window(until=last_day, last="365"),
            "last 90 days": analytics.parse_window(until=last_day, last="90"),
        }
        fp = analytics.Scope.of(repo, windows["whole history"]).fingerprint
        lens = analytics.build_lens(analytics.parse_exclude(args.exclude), repo, fp)
        hot_file = analytics.file_hotspots(
            analytics.Scope.of(repo, windows["whole history"], fp, lens)
        )[0]
        for label, window in windows.items():
            scope = analytics.Scope.of(repo, window, fp, lens)
            views: dict[str, Callable[[], Any]] = {
                "anchor: git log --numstat": git_log(origin, window.git_args()),
                "coupling (files)": lambda s=scope: analytics.file_coupling(s),
                "coupling (directories, depth 2)": lambda s=scope: analytics.directory_coupling(
                    s, depth=2
                ),
                "coupled with the top hotspot": lambda s=scope: analytics.coupled_with(
                    s, hot_file["path"]
                ),
                "ownership (files)": lambda s=scope: analytics.file_ownership(s),
                "ownership (directories)": lambda s=scope: analytics.directory_ownership(s),
                "knowledge at risk": lambda s=scope: analytics.knowledge_at_risk(s),
                "age (files)": lambda s=scope: analytics.file_age(s),
                "age (directories)": lambda s=scope: analytics.directory_age(s),
                "hotspots (files)": lambda s=scope: analytics.file_hotspots(s),
                "hotspots (directories)": lambda s=scope: analytics.directory_hotspots(s),
            }
            out[label] = {
                "commits": Commit.objects.filter(repository=repo, is_merge=False)
                .filter(**_bounds(window))
                .count(),
                **{name: timed(fn, args.rounds) for name, fn in views.items()},
            }
        if args.exclude:  # the lens's cost: each view with and without it, alternating
            whole = windows["whole history"]
            plain_scope = analytics.Scope.of(repo, whole, fp)
            lensed_scope = analytics.Scope.of(repo, whole, fp, lens)
            out["lens_cost (whole history)"] = {
                name: paired(lambda f=f: f(plain_scope), lambda f=f: f(lensed_scope), args.rounds)
                for name, f in {
                    "coupling (files)": analytics.file_coupling,
                    "ownership (files)": analytics.file_ownership,
                    "knowledge at risk": analytics.knowledge_at_risk,
                    "age (directories)": analytics.directory_age,
                    "hotspots (files)": analytics.file_hotspots,
                    "authors": analytics.authors,
                }.items()
            }
        if args.pydriller:
            out["pydriller"] = pydriller_side_by_side(origin, repo, args.pydriller)
        from django.conf import settings

        out["vendor"] = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
    print(json.dumps(out, indent=2))
    shutil.rmtree(tmp, ignore_errors=True)


def pydriller_side_by_side(origin: Path, repo: Any, newest: int) -> dict[str, Any]:
    """PyDriller's per-file process metrics (ChangeSet, CodeChurn, ContributorsCount: each
    walks the commits again) since the committer date of the ``newest``-th newest commit,
    once each, beside the gitward views that give the same per-file figures over the same
    commits (every file: ``limit`` 10,000), each timed once after a warm-up."""
    from datetime import UTC, datetime

    from pydriller.metrics.process.change_set import ChangeSet
    from pydriller.metrics.process.code_churn import CodeChurn
    from pydriller.metrics.process.contributors_count import ContributorsCount

    from dashboard import analytics

    newest_args = ["--no-merges", f"--skip={newest - 1}", "-1", "--format=%ct"]
    stamp = subprocess.run(
        ["git", "-C", str(origin), "log", *newest_args], check=True, capture_output=True, text=True
    ).stdout.strip()
    since = datetime.fromtimestamp(int(stamp), UTC)
    to = datetime.now(UTC)
    theirs = {}
    for metric in (ChangeSet, CodeChurn, ContributorsCount):
        t0 = time.perf_counter()
        metric(str(origin), since=since, to=to)
        theirs[metric.__name__] = round(time.perf_counter() - t0, 2)
    scope = analytics.Scope.of(repo, analytics.Window(since, None))
    ours = {
        "hotspots (files: revisions, churn, authors)": timed(
            lambda: analytics.file_hotspots(scope, limit=10_000), 1
        )["median_ms"],
        "ownership (files: authors and shares)": timed(
            lambda: analytics.file_ownership(scope, limit=10_000), 1
        )["median_ms"],
        "coupling (files)": timed(lambda: analytics.file_coupling(scope), 1)["median_ms"],
    }
    total_theirs = sum(theirs.values())
    total_ours = sum(ours.values()) / 1000
    return {
        "since": since.isoformat(),
        "pydriller_s": theirs,
        "gitward_ms": ours,
        "ratio": round(total_theirs / total_ours, 1) if total_ours else None,
    }


def _bounds(window: Any) -> dict[str, Any]:
    bounds = {}
    if window.start:
        bounds["committed_at__gte"] = window.start
    if window.end:
        bounds["committed_at__lt"] = window.end
    return bounds


if __name__ == "__main__":
    main()
