"""What each of the load test's eight screens costs the web process, per request: CPU
(``time.process_time``), wall time, database queries and Redis round trips (load test,
BENCHMARKS.md: 200 users every 2 s = 100 requests/s on 2 cores, so every page must cost a
few ms of CPU).

Django's test client in this process (middleware, view, template; no network), 3 local
Redis masters, SQLite (or ``--database-url``). Seeded with ``--repos`` repositories
(``--real`` of them real git repositories analysed by an in-process RQ worker, the rest
rows), ``--dead`` dead letters over 20 causes, and a backlog of queued syncs. Every page
is requested ``--rounds`` times after one warm-up, twice: *cold* (``GITWARD_SNAPSHOT_TTL=0``:
every request builds the operations snapshot, what one request per second per host pays)
and *warm* (the default TTL: the shared snapshot is reused, what the other requests pay).
A Redis round trip is one ``send_packed_command`` (a pipeline of any length is one).
Prints JSON (medians); nothing is asserted. ``--profile PAGE,PAGE`` prints one request's
cProfile each to stderr (``--profile-mode cold|warm``). ``--sessions N`` (default 500)
also times what a logged-in request pays to find its session and user, with database
sessions and with ``cached_db`` over the queue Redis (``session_cost``); ``--tables N``
(default 50) the repository list's, audit log's and commit table's rows alone, template loop against
``dashboard.web.prerendered_rows`` (``table_cost``).

    .venv/bin/python bench/pagecost.py [--repos 400] [--real 3] [--dead 2000] [--rounds 20]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.live import redis_nodes  # noqa: E402

PAGES = {
    "overview": "/",
    "repositories": "/repos/",
    "repository": "/repos/{repo}/",
    "locks": "/locks/",
    "workers": "/workers/",
    "dead-letters": "/dead-letters/",
    "audit": "/audit/",
    "api-status": "/api/status",
}


class RoundTrips:
    """Counts Redis round trips made by this process (every client, every node)."""

    def __init__(self) -> None:
        import redis.connection

        self.n = 0
        self.callers: dict[str, int] | None = None  # when set: round trips per caller
        cls = redis.connection.AbstractConnection
        original = cls.send_packed_command
        counter = self

        def counted(self: Any, command: Any, check_health: bool = True) -> Any:
            counter.n += 1
            if counter.callers is not None:
                where = next(
                    (
                        f"{f.filename.rsplit('/', 2)[-2]}/{f.name}"
                        for f in reversed(traceback.extract_stack()[:-1])
                        if "/dashboard/" in f.filename or "/workers/" in f.filename
                    ),
                    "?",
                )
                counter.callers[where] = counter.callers.get(where, 0) + 1
            return original(self, command, check_health)

        cls.send_packed_command = counted  # type: ignore[method-assign]


def measure(client: Any, path: str, rounds: int, trips: RoundTrips) -> dict[str, float]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    res = client.get(path)  # warm-up
    assert res.status_code == 200, (path, res.status_code)
    cpu, wall, queries, redis = [], [], [], []
    for _ in range(rounds):
        with CaptureQueriesContext(connection) as ctx:
            before = trips.n
            c0, t0 = time.process_time(), time.perf_counter()
            res = client.get(path)
            cpu.append((time.process_time() - c0) * 1000)
            wall.append((time.perf_counter() - t0) * 1000)
            redis.append(trips.n - before)
        queries.append(len(ctx.captured_queries))
        assert res.status_code == 200, (path, res.status_code)
    return {
        "cpu_ms": round(statistics.median(cpu), 2),
        "wall_ms": round(statistics.median(wall), 2),
        "queries": statistics.median(queries),
        "redis_round_trips": statistics.median(redis),
    }


def session_cost(rounds: int, cache_url: str, trips: RoundTrips) -> dict[str, Any]:
    """What a logged-in request pays to find its user: the session (``SessionStore``
    load) and the user row (``auth.get_user``: a query, and the session hash check),
    ``script_rounds`` times each, with the database sessions and with ``cached_db`` over a
    ``RedisCache`` on ``cache_url`` (a warm cache: every load is a hit). Medians per
    request of CPU, wall, queries and Redis round trips; this process only (the Redis
    server's own CPU for the GET is not in it)."""
    from importlib import import_module

    from django.conf import settings
    from django.contrib.auth import get_user
    from django.contrib.auth.models import User
    from django.db import connection
    from django.http import HttpRequest
    from django.test import Client, override_settings
    from django.test.utils import CaptureQueriesContext

    user = User.objects.get(username="bench")
    out: dict[str, Any] = {}
    engines = {
        "db": {},
        "cached_db": {
            "SESSION_ENGINE": "django.contrib.sessions.backends.cached_db",
            "SESSION_CACHE_ALIAS": "sessions",
            "CACHES": {
                **settings.CACHES,
                "sessions": {
                    "BACKEND": "django.core.cache.backends.redis.RedisCache",
                    "LOCATION": cache_url,
                },
            },
        },
    }
    for name, overrides in engines.items():
        with override_settings(**overrides):
            client = Client()
            client.force_login(user)
            key = client.cookies[settings.SESSION_COOKIE_NAME].value
            store = import_module(settings.SESSION_ENGINE).SessionStore
            cpu, wall, queries, redis = [], [], [], []
            for i in range(rounds + 1):
                request = HttpRequest()
                with CaptureQueriesContext(connection) as ctx:
                    before = trips.n
                    c0, t0 = time.process_time(), time.perf_counter()
                    request.session = store(key)
                    found = get_user(request)
                    c1, t1 = time.process_time(), time.perf_counter()
                assert found.pk == user.pk, name
                if i:  # the first one warms the cache
                    cpu.append((c1 - c0) * 1000)
                    wall.append((t1 - t0) * 1000)
                    queries.append(len(ctx.captured_queries))
                    redis.append(trips.n - before)
            out[name] = {
                "cpu_ms": round(statistics.median(cpu), 3),
                "cpu_ms_mean": round(statistics.fmean(cpu), 3),
                "wall_ms": round(statistics.median(wall), 3),
                "queries": statistics.median(queries),
                "redis_round_trips": statistics.median(redis),
            }
    return out


def table_cost(rounds: int, repo_id: int) -> dict[str, Any]:
    """The long tables alone: their rows as the template loops printed them (the loops
    kept in ``tests/support/fixtures/tablerows/``) and as ``dashboard.web.prerendered_rows`` prints
    them, for the seeded first pages (50 repositories, 100 audit entries, the analysed repository's
    commits), alternated ``script_rounds`` times in this process. Median CPU ms of one table's
    rows."""
    from django.template import Context, Template

    from dashboard.accounts.audit import audit_page, run_links
    from dashboard.models import Repository
    from dashboard.repositories.commits import commit_page
    from dashboard.repositories.lifecycle import current_fingerprint, repository_list
    from dashboard.web import ops, prerendered_rows

    fixtures = ROOT / "tests" / "fixtures" / "tablerows"
    repos, _ = repository_list()
    entries, _ = audit_page()
    ops._link_targets(entries)
    for e in entries:
        e.runs = run_links(e)
    repo = Repository.objects.get(pk=repo_id)
    commits, _ = commit_page(repo, fingerprint=current_fingerprint(), limit=50)
    link = f"/repos/{repo_id}/commits/{{}}/"
    cases = {
        "repositories": (
            Template((fixtures / "repository_loop.html").read_text()),
            {"repositories": repos, "filters": {}},
            lambda: prerendered_rows.repository_rows(repos, {}),
        ),
        "audit": (
            Template((fixtures / "audit_loop.html").read_text()),
            {"entries": entries, "filters": {}},
            lambda: prerendered_rows.audit_rows(entries, {}),
        ),
        "commits": (
            Template((fixtures / "commit_loop.html").read_text()),
            {"commits": commits, "commit_link": link},
            lambda: prerendered_rows.commit_rows(commits, link),
        ),
    }
    out: dict[str, Any] = {}
    for name, (loop, context, rows) in cases.items():
        old, new = [], []
        assert loop.render(Context(context)) == rows(), name
        for _ in range(rounds):
            c0 = time.process_time()
            loop.render(Context(context))
            c1 = time.process_time()
            rows()
            c2 = time.process_time()
            old.append((c1 - c0) * 1000)
            new.append((c2 - c1) * 1000)
        out[name] = {
            "rows": {"repositories": len(repos), "audit": len(entries)}.get(name, len(commits)),
            "template_loop_cpu_ms": round(statistics.median(old), 2),
            "tablerows_cpu_ms": round(statistics.median(new), 2),
        }
    return out


def seed(tmp: Path, repos: int, real: int, dead: int) -> int:
    """Returns the id of an analysed repository."""
    from django.conf import settings
    from django.utils import timezone

    from dashboard.accounts.audit import record_audit
    from dashboard.models import JobRun, Repository
    from dashboard.repositories.lifecycle import submit_repository
    from tests.conftest import run_workers
    from tests.support.gitrepo import GitRepo

    settings.LOCAL_ROOTS = [tmp.resolve()]
    settings.RESOLVE_HOSTS = False
    first = 0
    for i in range(real):
        origin = GitRepo.create(tmp / f"origin{i}")
        for j in range(30):
            origin.commit(f"change {j}", {f"src/m{j % 4}.py": f"line {j}\n" * (j + 1)})
        repo, _ = submit_repository(url=str(origin.path))
        first = first or repo.pk
    run_workers()
    Repository.objects.bulk_create(
        Repository(url=f"https://example.com/team/r{i}.git", status="ready")
        for i in range(repos - real)
    )
    some = list(Repository.objects.values_list("pk", flat=True)[:50])
    now = timezone.now()
    JobRun.objects.bulk_create(
        JobRun(
            job_id=f"dead-{i}",
            kind="sync",
            queue="sync",
            repository_id=some[i % len(some)],
            state="dead",
            cause_key=f"cause-{i % 20}",
            error=f"GitCommandError: cause {i % 20}",
            finished_at=now,
        )
        for i in range(dead)
    )
    for i in range(200):
        record_audit(user="bench", action="queue.pause", target=f"sync {i}", outcome="ok")
    # A backlog: queued syncs of the row-only repositories (never run here).
    for repo in Repository.objects.filter(url__startswith="https://")[:100]:
        submit_repository(url=repo.url + "x")
    return first


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repos", type=int, default=400)
    parser.add_argument("--real", type=int, default=3)
    parser.add_argument("--dead", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--database-url", default="")
    parser.add_argument("--profile", default="", help="page names (a,b): cProfile one request")
    parser.add_argument("--trips", default="", help="a page name: its round trips by caller")
    parser.add_argument("--profile-mode", default="warm", choices=["cold", "warm"])
    parser.add_argument(
        "--tables", type=int, default=50, help="rounds of the table rows alone (0: skip)"
    )
    parser.add_argument(
        "--sessions", type=int, default=500, help="rounds of the session + user cost (0: skip)"
    )
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gitward-bench-pagecost-"))
    out: dict[str, Any] = {"load_average_start": os.getloadavg()}
    with redis_nodes(tmp) as nodes:
        for key in list(os.environ):
            if key.startswith(("REDIS_URL", "GITWARD_", "DATABASE_URL")):
                del os.environ[key]
        (tmp / "var").mkdir(parents=True, exist_ok=True)
        os.environ.update(
            DJANGO_SETTINGS_MODULE="dashboard.settings",
            GITWARD_VAR_DIR=str(tmp / "var"),
            DATABASE_URL=args.database_url or f"sqlite:///{tmp / 'var' / 'db.sqlite3'}",
            REDIS_URLS=",".join(n.url for n in nodes),
            GITWARD_LOG_LEVEL="WARNING",
            GITWARD_RATE_LIMITS="false",
        )
        import django

        django.setup()
        from django.conf import settings
        from django.contrib.auth.models import User
        from django.core.management import call_command
        from django.test import Client

        call_command("migrate", verbosity=0)
        trips = RoundTrips()
        repo_id = seed(tmp, args.repos, args.real, args.dead)
        settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]
        client = Client()
        client.force_login(User.objects.create_superuser("bench", password="bench-pass-123"))
        ttl = settings.SNAPSHOT_TTL
        out["anchor /healthz"] = measure(client, "/healthz", args.rounds, trips)
        for mode, value in (("cold", 0.0), ("warm", ttl)):
            settings.SNAPSHOT_TTL = value
            out[mode] = {
                name: measure(client, path.format(repo=repo_id), args.rounds, trips)
                for name, path in PAGES.items()
            }
        settings.SNAPSHOT_TTL = 0.0 if args.profile_mode == "cold" else ttl
        if args.trips:
            trips.callers = {}
            client.get(PAGES[args.trips].format(repo=repo_id))
            out[f"round trips of one {args.profile_mode} {args.trips}"] = trips.callers
            trips.callers = None
        for name in filter(None, args.profile.split(",")):
            profile = cProfile.Profile()
            profile.runcall(client.get, PAGES[name].format(repo=repo_id))
            print(f"--- {name} ({args.profile_mode})", file=sys.stderr)
            stats = pstats.Stats(profile, stream=sys.stderr)
            stats.sort_stats("cumulative").print_stats(45)
        if args.tables:
            out["table rows"] = table_cost(args.tables, repo_id)
        if args.sessions:
            out["session + user per request"] = session_cost(args.sessions, nodes[0].url, trips)
        out["vendor"] = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
    out["load_average_end"] = os.getloadavg()
    print(json.dumps(out, indent=1))
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
