"""The bulk export (docs/analytics.md#every-stored-row) at scale: rows per second and the
memory it holds while streaming ``--rows`` synthetic file rows (default 1,000,000) and
their commits, as CSV and as NDJSON.

The rows are inserted directly (``executemany``, 20 files a commit, under the served
fingerprint) by a child process, so this one's memory is the export's alone, into a
fresh database: SQLite under a temporary directory by default, or ``--database-url``
(PostgreSQL; the database is created when missing, its repositories deleted first).
Then each export is consumed chunk by chunk (each chunk dropped, as a socket would),
timed without tracing, with the process's resident memory sampled at every chunk (peak
RSS during the export, and its growth over the RSS before it); then once more under
``tracemalloc`` for the peak of Python allocations. One export also goes through the
API view (the Django test client: authentication, the streaming response), and, as the
anchor, the files export read as one batch (the whole result at once). Prints JSON with
the load average before and after (the machine is shared); nothing is asserted.

    .venv/bin/python bench/export.py [--rows 1000000] [--database-url postgres://postgres@127.0.0.1:5432/gw_export_bench]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

FILES_PER_COMMIT = 20


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def ensure_database(url: str) -> None:
    """Create the PostgreSQL database of ``url`` when it does not exist."""
    import psycopg

    base, _, name = url.rpartition("/")
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def setup_django(tmp: Path, database_url: str) -> None:
    for key in list(os.environ):
        if key.startswith(("GITWARD_", "DATABASE_URL")):
            del os.environ[key]
    (tmp / "var").mkdir(parents=True, exist_ok=True)
    os.environ.update(
        DJANGO_SETTINGS_MODULE="dashboard.settings",
        GITWARD_VAR_DIR=str(tmp / "var"),
        DATABASE_URL=database_url or f"sqlite:///{tmp / 'var' / 'db.sqlite3'}",
        GITWARD_LOG_LEVEL="WARNING",
    )
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def insert(rows: int) -> tuple[Any, float]:
    """A repository with ``rows`` file rows over ``rows / 20`` commits; the seconds taken."""
    from django.db import connection, transaction
    from django.utils import timezone

    from dashboard.models import Commit, FileChange, Repository
    from dashboard.repositories import current_fingerprint

    Repository.objects.all().delete()
    repo = Repository.objects.create(url="https://example.com/bench/export.git", status="ready")
    fp = current_fingerprint()
    commits = rows // FILES_PER_COMMIT
    now = timezone.now()
    t0 = time.perf_counter()
    step = 5000
    with transaction.atomic():
        for start in range(0, commits, step):
            Commit.objects.bulk_create(
                Commit(
                    repository=repo, fingerprint=fp, sha=f"{i:040x}", author_name=f"a{i % 40}",
                    author_email=f"a{i % 40}@example.com", author_canonical_name=f"a{i % 40}",
                    author_canonical_email=f"a{i % 40}@example.com", authored_at=now,
                    committer_name="c", committer_email="c@example.com", committed_at=now,
                    subject=f"commit {i}", files_changed=FILES_PER_COMMIT,
                    insertions=FILES_PER_COMMIT * 3, deletions=FILES_PER_COMMIT,
                )
                for i in range(start, min(start + step, commits))
            )  # fmt: skip
    ids = list(Commit.objects.filter(repository=repo).order_by("id").values_list("id", flat=True))
    table = FileChange._meta.db_table
    sql = (
        f"INSERT INTO {table} (commit_id, repository_id, fingerprint, path, added, deleted, "
        '"binary", language) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)'
    )
    with transaction.atomic(), connection.cursor() as cursor:
        batch: list[tuple[Any, ...]] = []
        for n, cid in enumerate(ids):
            for k in range(FILES_PER_COMMIT):
                batch.append(
                    (cid, repo.pk, fp, f"src/d{(n + k) % 97}/f{k}_{n % 500}.py", 3, 1, False, "")
                )
            if len(batch) >= 20_000:
                cursor.executemany(sql, batch)
                batch = []
        if batch:
            cursor.executemany(sql, batch)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {table}")
            cursor.execute(f"ANALYZE {Commit._meta.db_table}")
    return repo, time.perf_counter() - t0


def consume(chunks: Iterable[Any]) -> tuple[int, int, int]:
    """Lines and bytes of a stream, and the highest RSS sampled at each chunk."""
    lines = size = peak = 0
    for chunk in chunks:
        lines += chunk.count("\n" if isinstance(chunk, str) else b"\n")
        size += len(chunk)
        peak = max(peak, rss_bytes())
    return lines, size, peak


def measure(repo: Any, what: str, fmt: str) -> dict[str, Any]:
    from dashboard import analytics

    export = analytics.parse_export({"what": what, "format": fmt})
    before = rss_bytes()
    t0 = time.perf_counter()
    lines, size, peak = consume(analytics.export_lines([repo], export))
    seconds = time.perf_counter() - t0
    rows = lines - (fmt == "csv")
    tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    consume(analytics.export_lines([repo], export))
    traced = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    return {
        "rows": rows,
        "seconds": round(seconds, 2),
        "rows_per_s": round(rows / seconds),
        "mb_per_s": round(size / seconds / 1e6, 1),
        "rss_before_mb": round(before / 2**20, 1),
        "rss_peak_mb": round(peak / 2**20, 1),
        "rss_growth_mb": round((peak - before) / 2**20, 1),
        "tracemalloc_peak_mb": round(traced / 2**20, 2),
    }


def through_the_api(repo: Any) -> dict[str, Any]:
    from django.conf import settings
    from django.contrib.auth.models import User
    from django.test import Client

    from dashboard.models import ApiToken

    user, _ = User.objects.get_or_create(username="bench-export")
    token = ApiToken.issue(user)[1]
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]
    client = Client()
    before = rss_bytes()
    t0 = time.perf_counter()
    res = client.get(
        f"/api/repos/{repo.pk}/export",
        {"what": "files", "format": "csv"},
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )
    chunks: Iterator[bytes] = res.streaming_content  # type: ignore[attr-defined]
    lines, _size, peak = consume(chunks)
    seconds = time.perf_counter() - t0
    return {
        "status": res.status_code,
        "rows": lines - 1,
        "rows_per_s": round((lines - 1) / seconds),
        "rss_growth_mb": round((peak - before) / 2**20, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--database-url", default="")
    parser.add_argument("--insert-into", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.insert_into:  # the child: insert, print the seconds and the repository's id
        setup_django(Path(args.insert_into), args.database_url)
        repo, seconds = insert(args.rows)
        print(json.dumps({"repo": repo.pk, "seconds": seconds}))
        return
    tmp = Path(tempfile.mkdtemp(prefix="gitward-bench-export-"))
    if args.database_url:
        ensure_database(args.database_url)
    load_before = [round(x, 2) for x in os.getloadavg()]
    # The rows are inserted by a child process, so this one's memory holds nothing of
    # the insertion and its RSS growth is the export's own.
    child = subprocess.run(
        [sys.executable, __file__, "--rows", str(args.rows), "--insert-into", str(tmp),
         "--database-url", args.database_url],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    inserted = json.loads(child.stdout.strip().splitlines()[-1])
    setup_django(tmp, args.database_url)
    from django.db import connection

    from dashboard.models import Repository

    out: dict[str, Any] = {
        "database": connection.vendor,
        "rows": args.rows,
        "load_average_before": load_before,
        "insert_s": round(inserted["seconds"], 1),
    }
    repo = Repository.objects.get(pk=inserted["repo"])
    for what, fmt in (("files", "csv"), ("files", "ndjson"), ("commits", "csv"),
                      ("commits", "ndjson")):  # fmt: skip
        out[f"{what} {fmt}"] = measure(repo, what, fmt)
        print(f"{what} {fmt}: {out[f'{what} {fmt}']}", file=sys.stderr, flush=True)
    out["files csv through the API"] = through_the_api(repo)
    # The contrast: the same export read as one batch (the whole result at once).
    import dashboard.analytics.export as module

    module.BATCH = args.rows + 1
    out["anchor: files csv in one batch"] = measure(repo, "files", "csv")
    out["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
