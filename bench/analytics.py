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
(docs/analytics.md#performance) ``--slow-rounds`` times (default 1: they take seconds;
``--slow-match TEXT``: only those whose name contains TEXT). The
aggregates' first computation (every month at once) is timed apart (``cold``), the
coupling aggregates' per depth (files, directories 2 deep) with their table's rows in all
and per month and year; the file and coupling views read every stored row
(``Scope.aggregates=False``) beside them.

    .venv/bin/python bench/analytics.py --seeded --commits 1000000 [--rounds 20]
        [--database-url postgres://postgres@127.0.0.1:5432/aggregates_bench]
        [--only authors,ownership,knowledge,one]   # the views whose name holds one
        [--reuse]   # the history an earlier run seeded in --database-url (a SQLite file:
                    # sqlite:////path/db.sqlite3), not seeded again

``--seeded --precomputation`` (docs/analytics.md#precomputation) times the first
whole-history view of each analytics page (hotspots, coupling, ownership, age, authors,
one author) right after the rows are stored, without precomputation (each view computes
what it reads) and after the precompute job (``analytics.precompute``, timed too), on the
same history with the aggregates wiped in between, ``--rounds`` times; ``--minutes M``
spreads the commits M minutes apart (80: 100,000 commits over 15 years).

    .venv/bin/python bench/analytics.py --seeded --precomputation --commits 100000 --minutes 80 \
        --rounds 1 [--database-url postgres://…]
"""

from __future__ import annotations

import argparse
import dataclasses
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
from siblings import sibling  # noqa: E402  (bench/ is the script's directory)

live = sibling("live")
synth = sibling("analysis")


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


def seed_history(repo_id: int, fp: str, n: int, minutes: int = 8) -> int:
    """Store ``n`` seeded commits, ``minutes`` apart, and their file rows; returns the
    file rows stored."""
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
            when = SEED_START + timedelta(minutes=minutes * i)
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


def _pair_rows(repo: Any, depth: int) -> dict[str, Any]:
    """The coupling aggregate rows of ``repo`` at ``depth``: in all, per month (median,
    max) and per year (median, max), and how many are pairs."""
    from django.db.models import Count

    from dashboard.models import CouplingAggregate

    rows = CouplingAggregate.objects.filter(repository=repo, depth=depth)
    out: dict[str, Any] = {"total": rows.count(), "pairs": rows.filter(eb__isnull=False).count()}
    for span, name in ((1, "month"), (12, "year")):
        counts = sorted(
            rows.filter(span=span)
            .values("month")
            .annotate(n=Count("id"))
            .values_list("n", flat=True)
        )
        if counts:
            out[f"per {name} (median, max)"] = [counts[len(counts) // 2], counts[-1]]
    return out


def compare_blocks(repo: Any, fp: str, windows: dict[str, Any], rounds: int) -> dict[str, Any]:
    """``--compare-blocks``: the coupling views read through aligned blocks of years
    (docs/analytics.md#performance) beside the same views over one span per year
    (``coupling_aggregates.MAX_BLOCK_YEARS = 1``, the layout before blocks), the two
    alternating round by round in this process; cold times of the months and years, then
    of the blocks summed from those years; the aggregate rows per span; medians (p95) in
    ms and the ratio years ÷ blocks."""
    from django.db.models import Count

    from dashboard import analytics
    from dashboard.analytics import coupling_aggregates
    from dashboard.models import CouplingAggregate, FileChange

    blocks_max = coupling_aggregates.MAX_BLOCK_YEARS
    out: dict[str, Any] = {"load_average_start": list(os.getloadavg())}
    whole = analytics.Scope.of(repo, windows["whole history"], fp)

    def coupling(scope: Any, depth: int) -> Any:
        if depth:
            return analytics.directory_coupling(scope, depth=depth)
        return analytics.file_coupling(scope)

    for depth, name in ((0, "files"), (2, "directories, depth 2")):
        coupling_aggregates.MAX_BLOCK_YEARS = 1
        t0 = time.perf_counter()
        coupling(whole, depth)
        out[f"cold: months and years, {name} (s)"] = round(time.perf_counter() - t0, 1)
        coupling_aggregates.MAX_BLOCK_YEARS = blocks_max
        t0 = time.perf_counter()
        coupling(whole, depth)
        out[f"cold: blocks summed from the years, {name} (s)"] = round(time.perf_counter() - t0, 1)
        out[f"rows per span, {name}"] = dict(
            CouplingAggregate.objects.filter(repository=repo, depth=depth)
            .values_list("span")
            .annotate(n=Count("id"))
            .order_by("span")
        )
    # the file with the most revisions (one scan of the file rows)
    hot = (
        FileChange.objects.filter(repository=repo)
        .values("path")
        .annotate(n=Count("id"))
        .order_by("-n")
        .values_list("path", flat=True)[0]
    )
    for label, window in windows.items():
        scope = analytics.Scope.of(repo, window, fp)
        views: dict[str, Callable[[], Any]] = {
            "coupling (files)": lambda s=scope: analytics.file_coupling(s),
            "coupling (directories, depth 2)": lambda s=scope: analytics.directory_coupling(
                s, depth=2
            ),
            "coupled with the most changed file": lambda s=scope: analytics.coupled_with(s, hot),
        }
        row: dict[str, Any] = {}
        for name, fn in views.items():
            times: dict[int, list[float]] = {blocks_max: [], 1: []}
            for limit in (blocks_max, 1):  # warm-up, computing what is missing
                coupling_aggregates.MAX_BLOCK_YEARS = limit
                fn()
            for _ in range(rounds):
                for limit in (blocks_max, 1):
                    coupling_aggregates.MAX_BLOCK_YEARS = limit
                    t0 = time.perf_counter()
                    fn()
                    times[limit].append((time.perf_counter() - t0) * 1000)
            coupling_aggregates.MAX_BLOCK_YEARS = blocks_max
            fast, slow = quantiles(times[blocks_max]), quantiles(times[1])
            row[name] = {
                "blocks": fast,
                "years": slow,
                "years / blocks": round(slow["median_ms"] / max(fast["median_ms"], 1e-9), 2),
            }
        out[label] = row
        print(json.dumps({label: row}), file=sys.stderr, flush=True)
    return out


def seeded_main(args: argparse.Namespace) -> None:
    """The ``--seeded`` mode (see the module's docstring)."""
    tmp = Path(tempfile.mkdtemp(prefix="gitward-bench-analytics-"))
    out: dict[str, Any] = {"commits": args.commits, "load_average": list(os.getloadavg())}
    with live.redis_nodes(tmp) as nodes:
        setup_django(tmp, nodes, args.database_url)
        from django.conf import settings
        from django.utils import timezone

        from dashboard import analytics
        from dashboard.models import Commit, DirAggregate, MonthAggregate, Repository
        from dashboard.repositories import current_fingerprint

        fp = current_fingerprint()
        found = Repository.objects.filter(url="https://example.com/big/seeded.git").first()
        if args.reuse and found is not None:  # seeded by an earlier run on this database
            repo = found
        else:
            repo = Repository.objects.create(
                url="https://example.com/big/seeded.git", status="ready",
                commits_total=args.commits, synced_at=timezone.now(), analyzed_at=timezone.now(),
            )  # fmt: skip
            t0 = time.perf_counter()
            out["stored_file_rows"] = seed_history(repo.pk, fp, args.commits, args.minutes)
            out["seed_s"] = round(time.perf_counter() - t0, 1)
        last = SEED_START + timedelta(minutes=args.minutes * (args.commits - 1))
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
        if args.compare_blocks:
            out.update(compare_blocks(repo, fp, windows, args.rounds))
            out["vendor"] = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
            out["load_average_after"] = list(os.getloadavg())
            print(json.dumps(out, indent=2))
            shutil.rmtree(tmp, ignore_errors=True)
            return
        t0 = time.perf_counter()
        analytics.file_hotspots(whole)
        out["cold: every month aggregated (s)"] = round(time.perf_counter() - t0, 1)
        out["aggregate_rows"] = MonthAggregate.objects.filter(repository=repo).count()
        # ``--only`` naming no directory (coupling) view: their cold computations are
        # left out too (minutes at 1,000,000 commits).
        wanted = args.only.split(",") if args.only else []
        dirs = not wanted or any("director" in w or "coupl" in w for w in wanted)
        coupling = not wanted or any("coupl" in w for w in wanted)
        if dirs:
            t0 = time.perf_counter()
            analytics.directory_hotspots(whole)
            out["cold: every month's directories aggregated (s)"] = round(
                time.perf_counter() - t0, 1
            )
            out["directory_aggregate_rows"] = DirAggregate.objects.filter(repository=repo).count()
        vendored = analytics.build_lens({"vendored"}, repo, fp)
        hot = analytics.file_hotspots(whole)[0]["path"]
        # The coupling aggregates (docs/analytics.md#performance): computed cold for the
        # files and the directories 2 deep, then the pair table's size per month and year.
        for depth, name in ((0, "files"), (2, "directories, depth 2")) if coupling else ():
            t0 = time.perf_counter()
            if depth:
                analytics.directory_coupling(whole, depth=depth)
            else:
                analytics.file_coupling(whole)
            out[f"cold: coupling aggregated, {name} (s)"] = round(time.perf_counter() - t0, 1)
            out[f"coupling aggregate rows, {name}"] = _pair_rows(repo, depth)
        t0 = time.perf_counter()
        top = analytics.authors(whole)[0]["author"]
        out["cold: every month's per-author sums (s)"] = round(time.perf_counter() - t0, 1)
        for label, window in windows.items():
            scope = analytics.Scope.of(repo, window, fp)
            raw = dataclasses.replace(scope, aggregates=False)
            fast: dict[str, Callable[[], Any]] = {
                "hotspots (files)": lambda s=scope: analytics.file_hotspots(s),
                "age (files)": lambda s=scope: analytics.file_age(s),
                "authors": lambda s=scope: analytics.authors(s),
                "ownership (files)": lambda s=scope: analytics.file_ownership(s),
                "knowledge at risk": lambda s=scope: analytics.knowledge_at_risk(s),
                "one file (the top hotspot), without its coupled files": (
                    lambda s=scope: analytics.file_history(s, hot, coupled=False)
                ),
                "one author (the most commits)": lambda s=scope: analytics.author_activity(s, top),
                "hotspots (directories)": lambda s=scope: analytics.directory_hotspots(s),
                "hotspots (directories, depth 2)": lambda s=scope: analytics.directory_hotspots(
                    s, depth=2
                ),
                "age (directories)": lambda s=scope: analytics.directory_age(s),
                "ownership (directories)": lambda s=scope: analytics.directory_ownership(s),
                "ownership (directories, depth 2)": lambda s=scope: analytics.directory_ownership(
                    s, depth=2
                ),
                "coupling (files)": lambda s=scope: analytics.file_coupling(s),
                "coupling (directories, depth 2)": lambda s=scope: analytics.directory_coupling(
                    s, depth=2
                ),
                "coupled with the top hotspot": lambda s=scope: analytics.coupled_with(s, hot),
            }
            lensed = dataclasses.replace(scope, lens=vendored)
            slow: dict[str, Callable[[], Any]] = {
                "hotspots (files), every stored row": lambda s=raw: analytics.file_hotspots(s),
                "age (files), every stored row": lambda s=raw: analytics.file_age(s),
                "hotspots (directories), every stored row": lambda s=raw: (
                    analytics.directory_hotspots(s)
                ),
                "age (directories), every stored row": lambda s=raw: analytics.directory_age(s),
                "ownership (directories), every stored row": lambda s=raw: (
                    analytics.directory_ownership(s)
                ),
                # A path lens reads every stored row (docs/analytics.md#performance).
                "hotspots (directories), vendored lens": lambda s=lensed: (
                    analytics.directory_hotspots(s)
                ),
                "ownership (directories), vendored lens": lambda s=lensed: (
                    analytics.directory_ownership(s)
                ),
                "coupling (files), every stored row": lambda s=raw: analytics.file_coupling(s),
                "coupling (directories, depth 2), every stored row": (
                    lambda s=raw: analytics.directory_coupling(s, depth=2)
                ),
                "coupled with the top hotspot, every stored row": (
                    lambda s=raw: analytics.coupled_with(s, hot)
                ),
                "authors, every stored row": lambda s=raw: analytics.authors(s),
                "ownership (files), every stored row": lambda s=raw: analytics.file_ownership(s),
                "knowledge at risk, every stored row": lambda s=raw: analytics.knowledge_at_risk(s),
                "one file (the top hotspot)": lambda s=scope: analytics.file_history(s, hot),
                "one author (the most commits), every stored row": (
                    lambda s=raw: analytics.author_activity(s, top)
                ),
            }
            if args.only:
                wanted = args.only.split(",")
                fast = {k: f for k, f in fast.items() if any(w in k for w in wanted)}
                slow = {k: f for k, f in slow.items() if any(w in k for w in wanted)}
            out[label] = {
                "commits": Commit.objects.filter(repository=repo, is_merge=False)
                .filter(**_bounds(window))
                .count(),
                **{name: timed_p95(fn, args.rounds) for name, fn in fast.items()},
            }
            if args.slow_rounds:
                out[label].update(
                    {
                        name: timed_p95(fn, args.slow_rounds, warm=False)
                        for name, fn in slow.items()
                        if args.slow_match in name
                    }
                )
            print(json.dumps({label: out[label]}), file=sys.stderr, flush=True)
        out["vendor"] = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
        out["load_average_after"] = list(os.getloadavg())
    print(json.dumps(out, indent=2))
    shutil.rmtree(tmp, ignore_errors=True)


def precomputation_main(args: argparse.Namespace) -> None:
    """The ``--seeded --precomputation`` mode (docs/analytics.md#precomputation): the first
    whole-history
    view of each analytics page right after an analysis, without precomputation (the view
    computes its aggregates) and after the precompute job (``analytics.precompute``, timed too: the
    background work the first user no longer waits for), side by side on one seeded
    history, the aggregates wiped in between. One commit every ``--minutes`` minutes."""
    tmp = Path(tempfile.mkdtemp(prefix="gitward-bench-precomputation-"))
    out: dict[str, Any] = {"commits": args.commits, "load_average": list(os.getloadavg())}
    with live.redis_nodes(tmp) as nodes:
        setup_django(tmp, nodes, args.database_url)
        from django.conf import settings
        from django.db.models import Count
        from django.utils import timezone

        from dashboard import analytics
        from dashboard.analytics.reports import Params, report
        from dashboard.models import (
            AuthorMonth,
            AuthorWeek,
            Commit,
            CouplingAggregate,
            CouplingStamp,
            DirAggregate,
            MonthAggregate,
            MonthStamp,
            Repository,
        )
        from dashboard.repositories import current_fingerprint

        fp = current_fingerprint()
        # an earlier run's history in --database-url: stored again from scratch
        Repository.objects.filter(url="https://example.com/big/precomputation.git").delete()
        repo = Repository.objects.create(
            url="https://example.com/big/precomputation.git", status="ready",
            commits_total=args.commits, synced_at=timezone.now(), analyzed_at=timezone.now(),
        )  # fmt: skip
        t0 = time.perf_counter()
        out["stored_file_rows"] = seed_history(repo.pk, fp, args.commits, args.minutes)
        out["seed_s"] = round(time.perf_counter() - t0, 1)
        out["history"] = [
            SEED_START.date().isoformat(),
            (SEED_START + timedelta(minutes=args.minutes * (args.commits - 1))).date().isoformat(),
        ]
        # the author with the most commits, from the stored rows (no aggregate computed)
        top = (
            Commit.objects.filter(repository=repo, is_merge=False)
            .values("author_canonical_email")
            .annotate(n=Count("id"))
            .order_by("-n")
            .values_list("author_canonical_email", flat=True)
            .first()
        )
        pages: dict[str, Callable[[], Any]] = {
            kind: (lambda k=kind: report(k, repo, Params()))
            for kind in ("hotspots", "coupling", "ownership", "age", "authors")
        }
        pages["one author"] = lambda: report("authors", repo, Params(author=top))

        def first_views() -> dict[str, float]:
            times = {}
            for name, fn in pages.items():
                t = time.perf_counter()
                fn()
                times[name] = round(time.perf_counter() - t, 3)
            times["all pages"] = round(sum(times.values()), 3)
            return times

        def wipe() -> None:
            for model in (MonthAggregate, DirAggregate, AuthorMonth, AuthorWeek):
                model.objects.filter(repository=repo).delete()
            CouplingAggregate.objects.filter(repository=repo).delete()
            CouplingStamp.objects.filter(repository=repo).delete()
            MonthStamp.objects.filter(repository=repo).update(
                aggregated=None, year_aggregated=None, dir_aggregated=None,
                dir_year_aggregated=None, authors_aggregated=None, authors_year_aggregated=None,
            )  # fmt: skip

        for round_ in range(args.rounds):
            wipe()
            cold = first_views()
            wipe()
            t0 = time.perf_counter()
            result = analytics.precompute(repo.pk, fp)
            job = round(time.perf_counter() - t0, 3)
            precomputed = first_views()
            again = first_views()
            out[f"round {round_ + 1}"] = {
                "first views without precomputation (s)": cold,
                "precompute job (s, in the background)": job,
                "precompute job spans": result.spans,
                "first views after the precompute job (s)": precomputed,
                "second views (s)": again,
                "first view ratio, without / with precomputation": round(
                    cold["all pages"] / max(precomputed["all pages"], 1e-9), 1
                ),
            }
            print(json.dumps(out[f"round {round_ + 1}"]), file=sys.stderr, flush=True)
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
    parser.add_argument(
        "--slow-match", default="", help="time only the slow views whose name contains this"
    )
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="--seeded: time the history an earlier run seeded in --database-url (kept)",
    )
    parser.add_argument(
        "--only", default="", help="--seeded: time only the views whose name holds one of these"
    )
    parser.add_argument(
        "--precomputation",
        action="store_true",
        help="--seeded: first views after an analysis, without and with the precompute job",
    )
    parser.add_argument(
        "--minutes",
        type=int,
        default=8,
        help="--seeded: minutes between commits (8: 1,000,000 commits span 15 years)",
    )
    parser.add_argument(
        "--compare-blocks",
        action="store_true",
        help="--seeded: only coupling, through blocks of years beside one span per year",
    )
    args = parser.parse_args()
    if args.seeded and args.precomputation:
        precomputation_main(args)
        return
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
