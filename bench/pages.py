"""Server time of the repository page, a commit page and ``GET /api/repos/<id>/commits/
<sha>`` with 1,000,000 stored commits (goal: each under 100 ms).

One repository: a real git repository of 12 commits, mirrored where the web process
reads it (``workspace/mirrors/1.git``), plus 999,988 synthetic commits with one file row
each, inserted directly (SQLite ``executemany``, PostgreSQL ``COPY``) in batches under the
served fingerprint, each batch adding what it inserted to the kept count of stored
commits (``commit_counts.add_stored``, as ``write_chunk`` does), so the tables hold
1,000,000 commits and 1,000,000 file rows. The summary is computed once (a worker does
that when a repository finishes), then every page is requested through Django's test
client (the whole middleware stack and template rendering, no network) ``--rounds``
times after one warm-up; printed: the median and max wall time and the median CPU time
(this process, SQLite included, plus its git children: what a request costs whatever
the machine's load). The anchor — ``/healthz`` through the same client, i.e. a
request's fixed cost — is measured in the same run. 3 local Redis masters (the
repository page reads its live locks). Prints JSON; nothing is asserted.

    .venv/bin/python bench/pages.py [--commits 1000000] [--rounds 20]
        [--database-url postgres://postgres@127.0.0.1:5432/gw_pages_bench]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from siblings import sibling  # noqa: E402  (bench/ is the script's directory)

live = sibling("live")

from tests.support.gitrepo import GitRepo  # noqa: E402

BATCH = 50_000


def real_repository(tmp: Path) -> GitRepo:
    repo = GitRepo.create(tmp / "origin")
    for i in range(12):
        body = "".join(f"line {j} of change {i}\n" for j in range(40 + i * 10))
        repo.commit(f"change {i}\n\nwhy change {i} was made", {f"src/m{i % 3}.py": body})
    return repo


def seed(repo_id: int, fp: str, n: int, real: list[dict[str, Any]]) -> None:
    """``real`` commits (from git) plus synthetic ones up to ``n``, newest last."""
    from django.db import connection, transaction

    from dashboard.models import Commit, FileChange
    from dashboard.repositories.commit_counts import add_stored
    from dashboard.repositories.commits import COMMIT_COLUMNS, FILE_COLUMNS

    qn = connection.ops.quote_name
    start = datetime(1990, 1, 1, tzinfo=UTC)  # 1,000,000 minutes later: 1991-11
    synthetic = n - len(real)

    def stamp(moment: datetime) -> Any:
        return str(moment.replace(tzinfo=None)) if connection.vendor == "sqlite" else moment

    def commit_row(i: int) -> tuple[Any, ...]:
        if i < synthetic:
            sha, parents = f"{i:040x}", (f"{i - 1:040x}" if i else "")
            when, subject, files, lines = start + timedelta(minutes=i), f"synthetic {i}", 1, 3
        else:
            r = real[i - synthetic]
            sha, parents, when = r["sha"], r["parents"], r["when"]
            subject, files, lines = r["subject"], len(r["files"]), r["lines"]
        return (repo_id, fp, sha, parents, f"Dev {i % 500}", f"dev{i % 500}@example.com",
                f"Dev {i % 500}", f"dev{i % 500}@example.com", stamp(when), 0,
                f"Dev {i % 500}", f"dev{i % 500}@example.com", stamp(when), 0, subject,
                False, files, lines, 0, 1)  # fmt: skip

    commit_cols = ", ".join(qn(Commit._meta.get_field(c).column) for c in COMMIT_COLUMNS)
    file_cols = ", ".join(qn(FileChange._meta.get_field(c).column) for c in FILE_COLUMNS)
    for lo in range(0, n, BATCH):
        rows = [commit_row(i) for i in range(lo, min(n, lo + BATCH))]
        with transaction.atomic(), connection.cursor() as cur:
            raw = cur.cursor
            if connection.vendor == "postgresql":
                with raw.copy(f"COPY {qn(Commit._meta.db_table)} ({commit_cols}) FROM STDIN") as cp:
                    for row in rows:
                        cp.write_row(row)
                inserted = raw.rowcount
                raw.execute(
                    f"SELECT id, sha FROM {qn(Commit._meta.db_table)} "
                    "WHERE repository_id = %s AND fingerprint = %s AND sha = ANY(%s)",
                    [repo_id, fp, [r[2] for r in rows]],
                )
            else:
                marks = ", ".join(["?"] * len(COMMIT_COLUMNS))
                raw.executemany(
                    f"INSERT INTO {qn(Commit._meta.db_table)} ({commit_cols}) VALUES ({marks})",
                    rows,
                )
                inserted = raw.rowcount
                raw.execute(
                    f"SELECT id, sha FROM {qn(Commit._meta.db_table)} WHERE id > ?",
                    [lo],
                )
            ids = dict((sha, cid) for cid, sha in raw.fetchall())
            add_stored(repo_id, fp, inserted)  # as write_chunk does, in the same transaction
            files: list[tuple[Any, ...]] = []
            for i in range(lo, min(n, lo + BATCH)):
                sha = rows[i - lo][2]
                if i < synthetic:
                    files.append((ids[sha], repo_id, fp, f"src/f{i % 2000}.py", 2, 1, False,
                                  "Python"))  # fmt: skip
                else:
                    for path, added, deleted in real[i - synthetic]["files"]:
                        files.append((ids[sha], repo_id, fp, path, added, deleted, False,
                                      "Python"))  # fmt: skip
            if connection.vendor == "postgresql":
                table = qn(FileChange._meta.db_table)
                with raw.copy(f"COPY {table} ({file_cols}) FROM STDIN") as cp:
                    for row in files:
                        cp.write_row(row)
            else:
                marks = ", ".join(["?"] * len(FILE_COLUMNS))
                raw.executemany(
                    f"INSERT INTO {qn(FileChange._meta.db_table)} ({file_cols}) VALUES ({marks})",
                    files,
                )


def real_commits(repo: GitRepo) -> list[dict[str, Any]]:
    out = []
    for sha in reversed(repo.shas()):
        meta = repo.git("show", "-s", "--format=%P%x00%ct%x00%s", sha).strip().split("\0")
        numstat = repo.git("show", "--format=", "--numstat", sha).split("\n")
        files = [(p, int(a), int(d)) for a, d, p in (ln.split("\t") for ln in numstat if ln)]
        out.append({"sha": sha, "parents": meta[0], "subject": meta[2],
                    "when": datetime.fromtimestamp(int(meta[1]), UTC), "files": files,
                    "lines": sum(a + d for _, a, d in files)})  # fmt: skip
    return out


PROFILE = False


def timed(client: Any, path: str, rounds: int) -> dict[str, float]:
    res = client.get(path)  # warm-up
    assert res.status_code == 200, (path, res.status_code)
    if PROFILE:  # where one request's time goes, to stderr
        profile = cProfile.Profile()
        profile.runcall(client.get, path)
        stats = pstats.Stats(profile, stream=sys.stderr)
        print(f"--- {path}", file=sys.stderr)
        stats.sort_stats("cumulative").print_stats(40)
    times, cpu = [], []
    for _ in range(rounds):
        c0 = _cpu_s()
        t0 = time.perf_counter()
        res = client.get(path)
        times.append((time.perf_counter() - t0) * 1000)
        cpu.append((_cpu_s() - c0) * 1000)
        assert res.status_code == 200
    return {"median_ms": round(statistics.median(times), 1), "max_ms": round(max(times), 1),
            "cpu_median_ms": round(statistics.median(cpu), 1)}  # fmt: skip


def _cpu_s() -> float:
    """CPU seconds of this process (the web code and SQLite, which runs in it) plus its
    finished children (the git processes a commit page starts): what a request costs
    whatever the machine's load, unlike its wall time."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--commits", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--database-url", default="")
    parser.add_argument("--profile", action="store_true", help="cProfile one request per page")
    args = parser.parse_args()
    global PROFILE
    PROFILE = args.profile
    tmp = Path(tempfile.mkdtemp(prefix="gitward-bench-pages-"))
    out: dict[str, Any] = {"commits": args.commits, "load_average": os.getloadavg()[0]}
    with live.redis_nodes(tmp) as nodes:
        for key in list(os.environ):
            if key.startswith(("REDIS_URL", "GITWARD_", "DATABASE_URL")):
                del os.environ[key]
        os.environ.update(
            DJANGO_SETTINGS_MODULE="dashboard.settings",
            GITWARD_VAR_DIR=str(tmp / "var"),
            DATABASE_URL=args.database_url or f"sqlite:///{tmp / 'var' / 'db.sqlite3'}",
            REDIS_URLS=",".join(n.url for n in nodes),
            GITWARD_LOG_LEVEL="WARNING",
        )
        import django

        django.setup()
        from django.conf import settings
        from django.contrib.auth.models import User
        from django.core.management import call_command
        from django.db import connection
        from django.test import Client
        from django.test.utils import CaptureQueriesContext
        from django.utils import timezone

        from dashboard.models import Repository
        from dashboard.repositories.lifecycle import current_fingerprint
        from dashboard.repositories.summaries import repository_summary
        from workers.git.mirror import HEAD_REF
        from workers.git.workspace import mirror_path

        (tmp / "var").mkdir(parents=True, exist_ok=True)
        call_command("migrate", verbosity=0)
        origin = real_repository(tmp)
        real = real_commits(origin)
        repo = Repository.objects.create(url="https://example.com/big/history.git",
                                         status="ready", head=real[-1]["sha"],
                                         commits_total=args.commits,
                                         synced_at=timezone.now(),
                                         analyzed_at=timezone.now())  # fmt: skip
        mirror = mirror_path(Path(settings.WORKSPACE), repo.pk)
        mirror.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "clone", "--quiet", "--bare", str(origin.path), str(mirror)],
                       check=True)  # fmt: skip
        subprocess.run(["git", "--git-dir", str(mirror), "update-ref", HEAD_REF, "HEAD"],
                       check=True)  # fmt: skip
        fp = current_fingerprint()
        t0 = time.perf_counter()
        seed(repo.pk, fp, args.commits, real)
        out["seed_s"] = round(time.perf_counter() - t0, 1)
        t0, c0 = time.perf_counter(), _cpu_s()
        with CaptureQueriesContext(connection) as summary_queries:
            repository_summary(repo, fp)
        out["summary_cold_s"] = round(time.perf_counter() - t0, 1)
        out["summary_cold_cpu_s"] = round(_cpu_s() - c0, 2)
        # where the cold summary's time goes: its slowest statements (seconds, SQL head)
        out["summary_queries"] = sorted(
            ([float(q["time"]), q["sql"][:90]] for q in summary_queries.captured_queries),
            reverse=True,
        )[:6]
        settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]
        client = Client()
        client.force_login(User.objects.create_superuser("bench", password="bench-pass-123"))
        sha = real[-2]["sha"]
        out["anchor /healthz"] = timed(client, "/healthz", args.rounds)
        out["repository page"] = timed(client, f"/repos/{repo.pk}/", args.rounds)
        out["commit page"] = timed(client, f"/repos/{repo.pk}/commits/{sha}/", args.rounds)
        out["commit page (7-digit prefix)"] = timed(
            client, f"/repos/{repo.pk}/commits/{sha[:7]}/", args.rounds
        )
        out["commit API"] = timed(client, f"/api/repos/{repo.pk}/commits/{sha}", args.rounds)
        out["vendor"] = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
    print(json.dumps(out, indent=2))
    shutil.rmtree(tmp, ignore_errors=True)  # a 1,000,000-commit database is ~1 GB


if __name__ == "__main__":
    main()
