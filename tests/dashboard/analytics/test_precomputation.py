"""dashboard.analytics.precomputation (docs/analytics.md#precomputation): after an analysis a real
RQ worker runs the precompute job, and the whole-history views read afterwards compute nothing;
a burst of completed analyses leaves one precompute job pending; a job for a fingerprint that
is not served computes nothing; ``manage.py precompute``, its metric and the status the API
shows."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from rq import SimpleWorker

from dashboard import infra
from dashboard.analytics.precomputation import (
    enqueue_precompute,
    families,
    precompute,
    precompute_status,
    run_precompute,
)
from dashboard.analytics.reports import Params, report
from dashboard.analytics.rows import Scope
from dashboard.analytics.window import Window
from dashboard.management.commands.worker import worker_queues
from dashboard.models import (
    AnalyzerVersion,
    AuthorMonth,
    AuthorWeek,
    CouplingAggregate,
    CouplingBlockStamp,
    CouplingStamp,
    DirAggregate,
    MonthAggregate,
    MonthStamp,
    Repository,
)
from dashboard.observability import flush, parse_field, read_all
from dashboard.repositories import current_fingerprint
from dashboard.repositories.lifecycle import submit_repository
from tests.conftest import run_workers
from tests.support.analytics_history import ADA, BOB, DAY, analysed
from tests.support.gitrepo import GitRepo
from tests.support.row_locks import rows_locked

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def operator(client: Client) -> Client:
    client.force_login(User.objects.create_superuser("ops", password="pw-ops-12345"))
    return client


def build(path: Path) -> GitRepo:
    """Commits every 15 days from January 2019 to June 2024 by two authors, in two
    directories with a pair of files changed together: whole years (2019 to 2023, the
    hotspots' whole-history midpoint inside one of them) and months of 2024."""
    repo = GitRepo.create(path)
    repo.clock = int(datetime(2019, 1, 3, tzinfo=UTC).timestamp())
    end = datetime(2024, 6, 20, tzinfo=UTC).timestamp()
    i = 0
    while repo.clock < end:
        files: dict[str, str | bytes | None] = {"src/a.py": f"{i}\n", "src/b.py": f"{i}\n"}
        if i % 3 == 0:
            files = {"manual/guide.md": f"{i}\n", "src/a.py": f"{i}x\n"}
        repo.commit(f"change {i}", files, author=(ADA, BOB)[i % 2])
        repo.clock += 15 * DAY
        i += 1
    return repo


def snapshot(repo: Repository) -> dict[str, Any]:
    """Every stamp row of the repository and the count of each aggregate table."""
    stamps = sorted(
        MonthStamp.objects.filter(repository=repo).values_list(
            "fingerprint",
            "month",
            "version",
            "aggregated",
            "year_aggregated",
            "dir_aggregated",
            "dir_year_aggregated",
            "authors_aggregated",
            "authors_year_aggregated",
        )
    )
    coupling = sorted(
        CouplingStamp.objects.filter(repository=repo).values_list(
            "month", "depth", "aggregated", "year_aggregated"
        )
    )
    blocks = sorted(
        CouplingBlockStamp.objects.filter(repository=repo).values_list(
            "month", "depth", "span", "aggregated"
        )
    )
    tables = (MonthAggregate, DirAggregate, AuthorMonth, AuthorWeek, CouplingAggregate)
    counts = {t.__name__: t.objects.filter(repository=repo).count() for t in tables}
    return {"stamps": stamps, "coupling": coupling, "blocks": blocks, "counts": counts}


def read_every_whole_history_view(repo: Repository) -> None:
    """What the pages show over the whole history (no window), at the default depth."""
    for kind in ("hotspots", "coupling", "ownership", "age", "authors"):
        report(kind, repo, Params())
    report("authors", repo, Params(author="ada@example.com"))
    report("files", repo, Params(path="src/a.py"))
    report("coupling", repo, Params(path="src/a.py"))


def metric_series() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The metrics in Redis, by series name and sorted labels."""
    series = {}
    for name, value in read_all().items():
        metric, labels = parse_field(name)
        series[(metric, tuple(sorted(labels.items())))] = value
    return series


def drain_analysis_only() -> None:
    """Drain the sync and analysis queues, leaving the maintenance queue's jobs queued."""
    names = [n for n in worker_queues() if n != infra.MAINTENANCE_QUEUE]
    conn = infra.worker_connection()
    SimpleWorker([infra.queue(n) for n in names], connection=conn).work(
        burst=True, logging_level="WARNING"
    )


def precompute_jobs() -> list[str]:
    return [j for j in infra.queue(infra.MAINTENANCE_QUEUE).job_ids if j.startswith("precompute-")]


def test_after_an_analysis_the_precompute_job_leaves_nothing_for_the_views_to_compute(
    tmp_path: Path, settings: Any
) -> None:
    settings.PRECOMPUTE_AGGREGATES = True
    flush()  # what an earlier test left in this process's buffer goes to the baseline
    baseline = metric_series()
    repo = analysed(build(tmp_path / "origin"))  # a real worker: analysis, then precompute job
    status = precompute_status(repo)
    assert status is not None and status["state"] == "current", status
    fp = current_fingerprint()
    scope = Scope.of(repo, Window(), fp)
    found = families(scope)
    assert {f.name for f in found} == {
        "files", "authors", "directories", "coupling-0", "coupling-1"
    }  # fmt: skip
    files = next(f for f in found if f.name == "files")
    # five whole years, a year read as months at the hotspots' midpoint, 2024's months
    assert len(files.years) == 5 and len(files.months) == 12 + 6
    before = snapshot(repo)
    stamps = {s[1]: s for s in before["stamps"]}
    assert all(stamps[m][3] == stamps[m][2] for m in files.months)  # month aggregates current
    assert all(stamps[y][4] is not None for y in files.years)  # and the years'
    assert before["coupling"] and all(before["counts"].values())
    read_every_whole_history_view(repo)
    assert snapshot(repo) == before  # no view computed anything
    for family in found:  # and every span the views read is current
        for january in family.years:
            assert family.year_fn(scope, january, []) == 0, (family.name, january)
        for month in family.months:
            assert family.month_fn(scope, month, []) == 0, (family.name, month)
        for block in family.blocks:
            assert family.block_fn is not None and family.block_fn(scope, block, []) == 0
    # 2019 to 2023: 2019 alone, then 2020-2023 as one block of four years, at each depth
    assert [f.blocks for f in found if f.name.startswith("coupling")] == [
        ((date(2020, 1, 1), 4),)
    ] * 2
    assert before["blocks"] and all(b[3] is not None for b in before["blocks"])
    # the metric: one precompute job, its spans counted per kind
    flush()
    series = metric_series()
    precomputed = ("gitward_precompute_seconds_count", (("outcome", "current"),))
    assert series[precomputed] - baseline.get(precomputed, 0) == 1
    computed = ("gitward_precompute_spans", (("family", "files"), ("result", "computed")))
    assert series[computed] - baseline.get(computed, 0) == len(files.years) + len(files.months)


def test_a_burst_of_analyses_leaves_one_precompute_job_pending(
    tmp_path: Path, settings: Any
) -> None:
    settings.PRECOMPUTE_AGGREGATES = True
    origin = build(tmp_path / "origin")
    repo, _ = submit_repository(url=str(origin.path))
    drain_analysis_only()
    assert len(precompute_jobs()) == 1
    for i in range(3):  # quick pushes: each analysed before the precompute job starts
        origin.commit(f"push {i}", {"src/a.py": f"push {i}\n"}, author=ADA)
        submit_repository(url=str(origin.path))
        drain_analysis_only()
        repo.refresh_from_db()
        assert repo.status == Repository.Status.READY
    assert len(precompute_jobs()) == 1
    status = precompute_status(repo)
    assert status is not None and status["state"] == "queued"
    run_workers()
    assert precompute_jobs() == []
    status = precompute_status(repo)
    assert status is not None and status["state"] == "current", status
    before = snapshot(repo)
    read_every_whole_history_view(repo)
    assert snapshot(repo) == before
    # the next completion after that job started enqueues a new one
    origin.commit("later", {"src/b.py": "later\n"}, author=BOB)
    submit_repository(url=str(origin.path))
    drain_analysis_only()
    assert len(precompute_jobs()) == 1


def test_a_precompute_job_for_a_fingerprint_no_longer_served_computes_nothing(
    tmp_path: Path,
) -> None:
    repo = analysed(build(tmp_path / "origin"))  # precomputation off: nothing computed yet
    assert precompute_status(repo) == {
        "state": "cold", "since": None, "at": None, "spans": None,
        "text": "aggregates: precomputation off (the first view computes them)",
    }  # fmt: skip
    old = current_fingerprint()
    before = snapshot(repo)
    assert not before["counts"]["MonthAggregate"]
    assert enqueue_precompute(repo.pk, old, force=True)
    assert not enqueue_precompute(repo.pk, old, force=True)  # one pending per fingerprint
    assert len(precompute_jobs()) == 1
    # a promote while the job waits: another version is served from now on
    AnalyzerVersion.objects.create(
        fingerprint="e" * 64, code_version="c", state="current", queue="analysis"
    )
    assert current_fingerprint() != old
    run_workers()
    assert precompute_jobs() == []
    assert snapshot(repo) == before  # the stored rows of ``old`` were not aggregated
    assert "superseded, nothing computed" in run_precompute(repo.pk, old)
    assert snapshot(repo) == before


def test_the_precompute_command_and_the_api(tmp_path: Path, operator: Client) -> None:
    repo = analysed(build(tmp_path / "origin"))
    with pytest.raises(CommandError, match=r"^no repository '999999'$"):
        call_command("precompute", "999999")
    out = StringIO()
    call_command("precompute", str(repo.pk), stdout=out)
    line = out.getvalue().strip()
    assert line.startswith(f"repository {repo.pk}: ") and "computed files" in line, line
    out = StringIO()
    call_command("precompute", str(repo.pk), stdout=out)
    assert "computed nothing" in out.getvalue()
    body = json.loads(operator.get(f"/api/repos/{repo.pk}").content)
    assert body["aggregates"]["state"] == "current"
    page = operator.get(f"/repos/{repo.pk}/").content.decode()
    assert 'id="repo-aggregates" data-state="current"' in page
    # a new commit stored under the served fingerprint: the record no longer holds
    origin = GitRepo(tmp_path / "origin")
    origin.clock = int(datetime(2024, 6, 25, tzinfo=UTC).timestamp())
    origin.commit("one more", {"src/a.py": "more\n"}, author=ADA)
    submit_repository(url=str(origin.path))
    run_workers()
    assert json.loads(operator.get(f"/api/repos/{repo.pk}").content)["aggregates"]["state"] == (
        "stale"
    )


def test_a_precompute_job_skips_every_span_a_writer_holds_and_waits_for_none(
    tmp_path: Path,
) -> None:
    """A writer holding the lock every span's computation needs (SQLite: the database's
    write lock; PostgreSQL: the stamp rows, as a fenced write holds them): the precompute job
    ends while the writer still holds it, every span counted busy, nothing written; the
    next one computes them all."""

    repo = analysed(build(tmp_path / "origin"))
    fp = current_fingerprint()
    families(Scope.of(repo, Window(), fp))  # the stamps' months exist from the analysis
    stamps = MonthStamp.objects.filter(repository=repo, fingerprint=fp)
    before = snapshot(repo)
    with rows_locked(stamps, "month") as still_locked:
        result = precompute(repo.pk, fp)
        held_throughout = still_locked()
    assert held_throughout
    assert result.outcome == "current" and result.total_computed == 0
    assert result.total_busy == result.spans > 0
    assert snapshot(repo) == before
    again = precompute(repo.pk, fp)
    assert again.total_busy == 0 and again.total_computed == again.spans
