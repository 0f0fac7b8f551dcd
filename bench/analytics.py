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

``--seeded`` (with ``--commits 1000000``) stores a synthetic history directly instead, as
``bench/pages.py`` does (SQLite ``executemany``, PostgreSQL ``COPY``, in batches): one
non-merge commit every 8 minutes from 2005 (1,000,000 commits: 15 years, 182 months), every
40th a merge, 200 authors with a skewed share of the commits, each working mostly in 3 of
40 directories, 1 to 40 files a commit (2.7 on average) with a few hot files per
directory. Each view is timed over the whole history, the last 365 and 90 days and a
window inside the history not aligned on months, ``--rounds`` times after one warm-up
(median and p95, ms); the views not served from the per-month aggregates
(docs/analytics.md#performance) ``--slow-rounds`` times (default 1: they take seconds). The
aggregates' first computation (every month at once) is timed apart (``cold``), and the
file views read every stored row (``Scope.aggregates=False``) beside them.

    .venv/bin/python bench/analytics.py --seeded --commits 1000000 [--rounds 20]
        [--database-url postgres://postgres@127.0.0.1:5432/aggregates_bench]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
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


def quantiles(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    p95 = ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]
    return {"median_ms": round(statistics.median(ordered), 1), "p95_ms": round(p95, 1)}


def timed_p95(fn: Callable[[], Any], rounds: int, warm: bool = True) -> dict[str, float]:
    if warm:
        fn()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return quantiles(times)


SEED_BATCH = 50_000
SEED_START = datetime(2005, 1, 1, tzinfo=UTC)


def seeded_commit(rng: random.Random, i: int) -> tuple[int, bool, list[tuple[str, int, int]]]:
    """Commit ``i`` of the seeded history: its author, whether it is a merge, its files."""
    author = int(rng.paretovariate(1.2)) % 200
    merge = i % 40 == 39
    count = min(40, 1 + int(rng.expovariate(0.6)))
    files: dict[str, tuple[int, int]] = {}
    for _ in range(count):
        area = (author * 3 + rng.randrange(3)) % 40 if rng.random() < 0.9 else rng.randrange(40)
        k = int(rng.paretovariate(1.1)) % 60
        files[f"d{area}/m{k % 5}/f{k}.py"] = (rng.randrange(1, 30), rng.randrange(0, 20))
    return author, merge, [(p, a, d) for p, (a, d) in files.items()]


def seed_history(repo_id: int, fp: str, n: int) -> int:
    """Store ``n`` seeded commits and their file rows; returns the file rows stored."""
    from django.db import connection, transaction

    from dashboard.models import Commit, FileChange
    from dashboard.repositories.commit_counts import add_stored
    from dashboard.repositories.commits import COMMIT_COLUMNS, FILE_COLUMNS

    qn = connection.ops.quote_name
    rng = random.Random(7)
    commit_cols = ", ".join(qn(Commit._meta.get_field(c).column) for c in COMMIT_COLUMNS)
    file_cols = ", ".join(qn(FileChange._meta.get_field(c).column) for c in FILE_COLUMNS)
    stored = 0
    for lo in range(0, n, SEED_BATCH):
        rows, files_of = [], []
        for i in range(lo, min(n, lo + SEED_BATCH)):
            author, merge, files = seeded_commit(rng, i)
            when = SEED_START + timedelta(minutes=8 * i)
            at: Any = str(when.replace(tzinfo=None)) if connection.vendor == "sqlite" else when
            who = (f"Dev {author}", f"dev{author}@example.com")
            rows.append((repo_id, fp, f"{i:040x}", f"{i - 1:040x}" if i else "", *who, *who,
                         at, 0, *who, at, 0, f"change {i}", merge, len(files),
                         sum(a for _, a, _ in files), sum(d for _, _, d in files), 1))  # fmt: skip
            files_of.append(files)
        with transaction.atomic(), connection.cursor() as cur:
            raw = cur.cursor
            raw.execute(f"SELECT COALESCE(MAX(id), 0) FROM {qn(Commit._meta.db_table)}")
            (before,) = raw.fetchone()
            if connection.vendor == "postgresql":
                with raw.copy(f"COPY {qn(Commit._meta.db_table)} ({commit_cols}) FROM STDIN") as cp:
                    for row in rows:
                        cp.write_row(row)
            else:
                marks = ", ".join(["?"] * len(COMMIT_COLUMNS))
                raw.executemany(
                    f"INSERT INTO {qn(Commit._meta.db_table)} ({commit_cols}) VALUES ({marks})",
                    rows,
                )
            raw.execute(f"SELECT id, sha FROM {qn(Commit._meta.db_table)} WHERE id > {int(before)}")
            ids = {sha: cid for cid, sha in raw.fetchall()}
            add_stored(repo_id, fp, len(rows))
            file_rows = [
                (ids[row[2]], repo_id, fp, path, a, d, False, "Python")
                for row, files in zip(rows, files_of, strict=True)
                for path, a, d in files
            ]
            stored += len(file_rows)
            if connection.vendor == "postgresql":
                table = qn(FileChange._meta.db_table)
                with raw.copy(f"COPY {table} ({file_cols}) FROM STDIN") as cp:
                    for row in file_rows:
                        cp.write_row(row)
            else:
                marks = ", ".join(["?"] * len(FILE_COLUMNS))
                raw.executemany(
                    f"INSERT INTO {qn(FileChange._meta.db_table)} ({file_cols}) VALUES ({marks})",
                    file_rows,
                )
    if connection.vendor == "postgresql":
        with connection.cursor() as cur:
            cur.execute("ANALYZE")
    return stored


def seeded_main(args: argparse.Namespace) -> None:
    """The ``--seeded`` mode (see the module's docstring)."""
    tmp = Path(tempfile.mkdtemp(prefix="gitward-bench-analytics-"))
    out: dict[str, Any] = {"commits": args.commits, "load_average": list(os.getloadavg())}
    with live.redis_nodes(tmp) as nodes:
        setup_django(tmp, nodes, args.database_url)
        from django.conf import settings
        from django.utils import timezone

        from dashboard import analytics
        from dashboard.models import Commit, MonthAggregate, Repository
        from dashboard.repositories import current_fingerprint

        repo = Repository.objects.create(
            url="https://example.com/big/seeded.git", status="ready",
            commits_total=args.commits, synced_at=timezone.now(), analyzed_at=timezone.now(),
        )  # fmt: skip
        fp = current_fingerprint()
        t0 = time.perf_counter()
        out["stored_file_rows"] = seed_history(repo.pk, fp, args.commits)
        out["seed_s"] = round(time.perf_counter() - t0, 1)
        last = SEED_START + timedelta(minutes=8 * (args.commits - 1))
        span = last - SEED_START
        last_day = last.date().isoformat()
        windows = {
            "whole history": analytics.parse_window(),
            "last 365 days": analytics.parse_window(until=last_day, last="365"),
            "last 90 days": analytics.parse_window(until=last_day, last="90"),
            "mid-history": analytics.parse_window(
                (SEED_START + span * 0.37).date().isoformat(),
                (SEED_START + span * 0.61).date().isoformat(),
            ),
        }
        whole = analytics.Scope.of(repo, windows["whole history"], fp)
        t0 = time.perf_counter()
        analytics.file_hotspots(whole)
        out["cold: every month aggregated (s)"] = round(time.perf_counter() - t0, 1)
        out["aggregate_rows"] = MonthAggregate.objects.filter(repository=repo).count()
        hot = analytics.file_hotspots(whole)[0]["path"]
        for label, window in windows.items():
            scope = analytics.Scope.of(repo, window, fp)
            raw = dataclasses.replace(scope, aggregates=False)
            fast: dict[str, Callable[[], Any]] = {
                "hotspots (files)": lambda s=scope: analytics.file_hotspots(s),
                "age (files)": lambda s=scope: analytics.file_age(s),
            }
            slow: dict[str, Callable[[], Any]] = {
                "hotspots (files), every stored row": lambda s=raw: analytics.file_hotspots(s),
                "age (files), every stored row": lambda s=raw: analytics.file_age(s),
                "hotspots (directories)": lambda s=scope: analytics.directory_hotspots(s),
                "age (directories)": lambda s=scope: analytics.directory_age(s),
                "coupling (files)": lambda s=scope: analytics.file_coupling(s),
                "coupling (directories, depth 2)": lambda s=scope: analytics.directory_coupling(
                    s, depth=2
                ),
                "coupled with the top hotspot": lambda s=scope: analytics.coupled_with(s, hot),
                "ownership (files)": lambda s=scope: analytics.file_ownership(s),
                "ownership (directories)": lambda s=scope: analytics.directory_ownership(s),
                "knowledge at risk": lambda s=scope: analytics.knowledge_at_risk(s),
                "authors": lambda s=scope: analytics.authors(s),
            }
            out[label] = {
                "commits": Commit.objects.filter(repository=repo, is_merge=False)
                .filter(**_bounds(window))
                .count(),
                **{name: timed_p95(fn, args.rounds) for name, fn in fast.items()},
            }
            if args.slow_rounds:
                out[label].update(
                    {name: timed_p95(fn, args.slow_rounds, warm=False) for name, fn in slow.items()}
                )
            print(json.dumps({label: out[label]}), file=sys.stderr, flush=True)
        out["vendor"] = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
        out["load_average_after"] = list(os.getloadavg())
    print(json.dumps(out, indent=2))
    shutil.rmtree(tmp, ignore_errors=True)


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
    parser.add_argument("--seeded", action="store_true", help="store a seeded history directly")
    parser.add_argument("--slow-rounds", type=int, default=1)
    args = parser.parse_args()
    if args.seeded:
        seeded_main(args)
        return
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
