"""Benchmark: time from the rollback call to the previous version's results being served.

Anchor: what a system that keeps one set of results would pay instead — recomputing every
repository under the previous analyzer (measured here as the initial analysis of the same
repositories with the same workers).

One run, in this process: a temporary var dir, SQLite (migrated), 3 local redis-server
nodes, ``--repos`` synthetic repositories of ``--commits`` commits with renames. They are
analysed under the baseline (the anchor's clock), then ``detect_renames=true`` is rolled
out the way an operator does it — warm (the driver's warmer, the new version's own worker),
verify, ramp to 100 %, promote, the catch-up analysed under the new fingerprint — and the
repositories' API (``GET /api/repos/<id>?summary=1`` through Django's request handler)
serves the new numbers. Then the clock starts, the Rollouts page's rollback button is
clicked (its POST through Django's request handler: permission check, audit row, then
``rollback_rollout`` — take the deploy lock, route back, cancel the new version's queued
work, release), and the
clock stops once every repository's API answer carries the baseline fingerprint and its
baseline totals. Repeated ``--rounds`` times (the version is re-activated from drained;
its results are already stored, so later rounds warm instantly). Workers are in-process
RQ workers, one per version, each loading its version's config. Not a test.

    .venv/bin/python bench/rollback.py [--repos 10] [--commits 200] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def make_repo(path: Path, commits: int, seed: int) -> None:
    """A history where every fifth commit renames a file (so the versions differ)."""
    env = {**os.environ, "GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@x",
           "GIT_COMMITTER_NAME": "a", "GIT_COMMITTER_EMAIL": "a@x"}  # fmt: skip
    subprocess.run(["git", "init", "-q", "-b", "main", str(path)], check=True)
    body = "".join(f"line {i} of {seed}\n" for i in range(30))
    name = "src/f0.py"
    (path / "src").mkdir()
    for i in range(commits):
        if i % 5 == 4:
            new = f"src/f{i}.py"
            (path / name).rename(path / new)
            name = new
        else:
            (path / name).write_text(body + f"edit {i}\n")
        subprocess.run(["git", "-C", str(path), "add", "-A"], check=True)
        subprocess.run(["git", "-C", str(path), "commit", "-qm", f"c{i}"], check=True, env=env)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repos", type=int, default=10)
    parser.add_argument("--commits", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from workers.runtime.redis_server import RedisNode

    tmp = Path(tempfile.mkdtemp(prefix="gw-bench-rollback-"))
    var = tmp / "var"
    var.mkdir()
    nodes = [RedisNode(tmp / f"redis{i}", persistent=False).start() for i in range(3)]
    try:
        for key in [
            k for k in os.environ if k.startswith(("REDIS_URL", "GITWARD_", "DATABASE_URL"))
        ]:
            del os.environ[key]
        os.environ.update(
            GITWARD_VAR_DIR=str(var),
            DATABASE_URL=f"sqlite:///{var / 'db.sqlite3'}",
            GITWARD_WORKSPACE=str(var / "workspace"),
            GITWARD_LOCAL_ROOTS=str(tmp),
            REDIS_URLS=",".join(n.url for n in nodes),
            GITWARD_RETRY_BACKOFF="0",
            DJANGO_SETTINGS_MODULE="dashboard.settings",
        )
        import django

        django.setup()
        run(tmp, args)
    finally:
        for n in nodes:
            n.kill()


def run(tmp: Path, args: Any) -> None:
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.test import Client
    from rq import SimpleWorker

    from dashboard.infra import queues
    from dashboard.locks import worker_beats
    from dashboard.management.commands.worker import worker_queues
    from dashboard.models import AnalyzerVersion, Repository
    from dashboard.repositories.lifecycle import submit_repository
    from dashboard.rollouts import drains
    from dashboard.rollouts import start as rollouts_start
    from dashboard.rollouts.driver import RolloutDriver
    from dashboard.rollouts.warming import warm_rollout
    from dashboard.versions import state_machine
    from workers.jobs import load_versions
    from workers.pool import PauseAware, version_config

    class W(PauseAware, SimpleWorker):
        pass

    def burst(names: list[str], fp: str) -> int:
        load_versions([version_config(fp)])
        w = W([queues.queue(n) for n in names], connection=queues.connection())
        worker_beats.beat(name=f"bench-{fp[:8]}", queues_=names, version=fp)
        w.apply_pauses()
        w.work(burst=True, with_scheduler=True, logging_level="ERROR")
        return w.successful_job_count + w.failed_job_count

    def drain_all() -> None:
        while True:
            served = state_machine.served_fingerprint()
            ran = burst(worker_queues(served), served)
            for fp in (
                AnalyzerVersion.objects.filter(state__in=state_machine.STAFFED)
                .exclude(fingerprint=served)
                .values_list("fingerprint", flat=True)
            ):
                ran += burst([state_machine.physical_queue("analysis", fp)], fp)
            if not ran:
                return

    call_command("migrate", verbosity=0)
    base = state_machine.ensure_baseline(actor="bench")
    for i in range(args.repos):
        make_repo(tmp / f"repo{i}", args.commits, i)
    start = time.perf_counter()
    for i in range(args.repos):
        submit_repository(url=str(tmp / f"repo{i}"))
    drain_all()
    anchor = time.perf_counter() - start
    assert Repository.objects.filter(status="ready").count() == args.repos
    client = Client(HTTP_HOST="localhost")
    client.force_login(User.objects.create_superuser("bench", password="bench-pass-123"))
    ids = list(Repository.objects.values_list("pk", flat=True))

    def served() -> dict[int, tuple[str, Any]]:
        out = {}
        for pk in ids:
            body = client.get(f"/api/repos/{pk}?summary=1").json()
            out[pk] = (body["fingerprint"], body["summary"]["totals"])
        return out

    before = served()
    calls: list[float] = []
    totals: list[float] = []
    reads: list[float] = []
    passes: list[int] = []
    for _ in range(args.rounds):
        ro = rollouts_start.start_rollout(
            config={"detect_renames": True}, actor="bench", enqueue_driver=False,
            warm_set={"repositories": args.repos, "commits_per_repository": 50, "threshold": 1.0},
        )  # fmt: skip
        d = RolloutDriver(ro.pk, ttl=10.0, warmer=warm_rollout)
        d.acquire(actor="bench")
        d.tick()
        drain_all()
        d.tick()
        d.tick()
        for action, params in (("set_ramp", {"percent": 100}), ("promote", {})):
            rollouts_start.request_action(rollout=ro, action=action, actor="bench", params=params)
            d.tick()
        d.release()
        drain_all()
        new = AnalyzerVersion.objects.get(pk=ro.version_id).fingerprint
        promoted = served()
        assert all(fp == new for fp, _ in promoted.values())
        assert all(promoted[pk][1] != before[pk][1] for pk in ids)
        r0 = time.perf_counter()
        served()  # one pass of reads alone (what the figure below includes)
        reads.append(time.perf_counter() - r0)
        t0 = time.perf_counter()
        # The click: the Rollouts page's rollback button after its confirm step, the
        # same POST the browser sends (permission check, audit row, the one-button
        # rollback, the redirect back to the page).
        clicked = client.post(
            f"/rollouts/{ro.pk}/rollback/", {"reason": "bench", "next": "/rollouts/"}
        )
        t1 = time.perf_counter()
        assert clicked.status_code == 302, clicked.status_code
        ro.refresh_from_db()
        assert ro.state in {"rolling_back", "rolled_back"}, ro.state
        n = 1
        while served() != before:
            n += 1
        t2 = time.perf_counter()
        passes.append(n)
        calls.append(t1 - t0)
        totals.append(t2 - t0)
        drain_all()
        for _ in range(3):
            drains.reconcile_drains()
        assert AnalyzerVersion.objects.get(pk=ro.version_id).state == "drained"
    call_ms = statistics.median(calls) * 1000
    total_ms = statistics.median(totals) * 1000
    print(f"repositories: {args.repos} x {args.commits} commits; rounds: {args.rounds}")
    print(f"anchor (recompute every repository under the previous version): {anchor:.2f} s")
    print(f"rollback click (POST: lock, route back, cancel, release): median {call_ms:.0f} ms")
    rounds = ", ".join(f"{t * 1000:.0f}" for t in totals)
    print(
        "rollback click -> every repository's API serving the previous numbers: "
        f"median {total_ms:.0f} ms (rounds: {rounds})"
    )
    read_ms = statistics.median(reads) * 1000
    print(
        f"one pass of {args.repos} API reads alone: median {read_ms:.0f} ms;"
        f" read passes until served: {passes}"
    )
    print(f"ratio anchor / rollback-to-served: {anchor / (total_ms / 1000):.0f}x")
    print(f"(base {base.fingerprint[:12]})")


if __name__ == "__main__":
    main()
