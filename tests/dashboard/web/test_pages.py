"""The dashboard's pages as operators read them: titles, plurals, times,
short ids, destructive buttons behind a confirm dialog with a reason for the audit
log, charts with axes, pagination, query counts and the favicon.

Real database and Redis (locks are taken on the real Redlock masters)."""

from __future__ import annotations

import html
import re
from datetime import date, timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from dashboard.locks import leases
from dashboard.models import AuditEntry, Chunk, CommitCount, JobAttempt, JobRun, Repository
from dashboard.operations.queue_stats import day_series
from dashboard.repositories.lifecycle import (
    current_fingerprint,
    repository_status,
    repository_with_status,
    submit_repository,
)
from dashboard.runs.dead_letters import run_bulk
from dashboard.templatetags.gitward import shorten
from dashboard.web.charts import history_bars
from dashboard.web.humanize import relative
from tests.conftest import run_workers
from tests.support.gitrepo import GitRepo
from workers.locks import keys

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def operator(client: Client) -> Client:
    client.force_login(User.objects.create_superuser("ops", password="pw-ops-12345"))
    return client


def title(page: str) -> str:
    m = re.search(r"<title>(.*?)</title>", page, re.S)
    assert m, "no <title>"
    return html.unescape(m.group(1))


def text_of(page: str) -> str:
    """The visible text (tags dropped), to check what a person reads."""
    body = re.sub(r"<(script|style)\b.*?</\1>", "", page, flags=re.S)
    return html.unescape(re.sub(r"<[^>]+>", " ", body))


def dead(repo: Repository, n: int, *, cause: str, job: str = "job") -> list[JobRun]:
    runs = []
    for i in range(n):
        chunk = Chunk.objects.create(
            repository=repo, fingerprint="f" * 16, key=f"{cause}{i:04x}", shas="x", size=1,
            state=Chunk.State.FAILED, error="boom",
        )  # fmt: skip
        runs.append(
            JobRun.objects.create(
                job_id=f"{job}-{cause}-{repo.pk}-{i}",
                kind=JobRun.Kind.ANALYZE,
                queue="analysis",
                repository=repo,
                chunk=chunk,
                state=JobRun.State.DEAD,
                attempts=3,
                cause_key=cause,
                cause=f"Error {cause}",
                error=f"boom {cause}",
                finished_at=timezone.now(),
            )
        )
    return runs


# ---------------------------------------------------------------------------- defects


def test_every_page_title_is_plain_text(operator: Client) -> None:
    repo = Repository.objects.create(url="https://example.com/a/slow.git")
    for path in ["/", "/repos/", f"/repos/{repo.pk}/", "/locks/", "/workers/",
                 "/dead-letters/", "/audit/", "/runs/"]:  # fmt: skip
        page = operator.get(path).content.decode()
        t = title(page)
        assert "<" not in t and ">" not in t, (path, t)
        assert t.endswith(" · gitward"), (path, t)
    assert title(operator.get(f"/repos/{repo.pk}/").content.decode()) == "slow · gitward"


def test_a_ready_repository_says_its_leftover_lock_is_being_released(operator: Client) -> None:
    repo = Repository.objects.create(
        url="https://example.com/a/done.git", status=Repository.Status.READY
    )
    leases.redlock().acquire(
        [keys.chunk(repo.pk, "a" * 7 + ".." + "b" * 7)], ttl=30.0,
        holder={"worker": "w1", "job": "analyze-1-abc"},
    )  # fmt: skip
    page = operator.get(f"/repos/{repo.pk}/").content.decode()
    assert 'data-status="ready"' in page
    holders = page.split('id="repo-holders"')[1].split("</ul>")[0]
    assert "releasing" in holders and "held by" in holders
    # While analysing, the same lock is simply held (no "releasing").
    Repository.objects.filter(pk=repo.pk).update(status=Repository.Status.ANALYZING)
    page = operator.get(f"/repos/{repo.pk}/").content.decode()
    assert "releasing" not in page.split('id="repo-holders"')[1].split("</ul>")[0]


def test_discard_is_red_apart_and_confirmed_in_a_dialog(operator: Client) -> None:
    repo = Repository.objects.create(url="https://example.com/a/poison.git")
    dead(repo, 2, cause="c0ffee")
    page = operator.get("/dead-letters/").content.decode()
    retry = re.search(r"<button[^>]*>retry group</button>", page).group(0)
    discard = re.search(r"<button[^>]*>discard group</button>", page).group(0)
    assert "danger" not in retry and 'class="small danger"' in discard
    assert '<span class="danger-zone"><button' in page  # set apart from retry
    assert 'data-confirm-what="Discard 2 runs in 1 repository' in page
    assert '<dialog id="confirm-dialog"' in page and 'id="confirm-reason"' in page
    js = (ROOT / "dashboard/static/gitward.js").read_text()
    assert not re.search(r"\bconfirm\(", js), "the native confirm() is gone"


def test_counts_have_units_and_plurals_and_times_are_relative(operator: Client) -> None:
    one = Repository.objects.create(url="https://example.com/a/one.git")
    dead(one, 1, cause="0a0a")
    page = operator.get("/dead-letters/").content.decode()
    words = " ".join(text_of(page).split())
    assert "1 repository · 1 version" in words and not re.search(r"\b1 repos\b", words)
    assert "1 versions" not in words and "1 run ·" in words
    assert re.search(r"first \d+ s ago", words)
    assert not re.search(r"\d{2}:\d{2}:\d{2}\.\d{3,}", words), "raw ISO time with microseconds"
    stamp = r'<time class="ago" datetime="[^"]+" title="\d{4}-\d\d-\d\d [\d:]+ UTC">'
    assert re.search(stamp, page)
    assert relative(3) == "3 s ago" and relative(300) == "5 min ago"
    assert relative(7200) == "2 h ago" and relative(-30) == "in 30 s"
    assert relative(10 * 86400) == "10 d ago" and relative(150 * 86400) == "5 mo ago"
    assert relative(1111 * 86400) == "3 y ago" and relative(600 * 86400) == "1.6 y ago"


def test_long_job_ids_are_short_with_a_copy_button(operator: Client) -> None:
    repo = Repository.objects.create(url="https://example.com/a/long.git")
    job = "analyze-" + "0123456789" * 10
    leases.redlock().acquire([keys.mirror(repo.pk)], ttl=30.0, holder={"worker": "w9", "job": job})
    page = operator.get("/locks/").content.decode()
    assert f'data-copy="{job}"' in page and f"<code>{shorten(job)}</code>" in page
    assert f">{job}<" not in page  # never the 100-character id as cell text
    assert len(shorten(job)) <= 22


def test_the_favicon_is_served_and_linked(operator: Client) -> None:
    res = operator.get("/favicon.ico")
    assert res.status_code == 200 and res["Content-Type"] == "image/svg+xml"
    assert res.content.startswith(b"<svg")
    assert 'rel="icon"' in operator.get("/repos/").content.decode()


# ---------------------------------------------------------------------------- charts


def weeks(first: date, n: int, step: int = 7) -> list[dict[str, object]]:
    return [
        {"week": (first + timedelta(days=i * step)).isoformat(), "commits": i % 5 + 1}
        for i in range(n)
    ]


def test_one_week_of_history_is_one_labelled_bar_with_an_axis() -> None:
    chart = history_bars([{"week": "2023-11-13", "commits": 4}])
    assert chart["bucket"] == "week" and len(chart["bars"]) == 1
    (bar,) = chart["bars"]
    assert bar["label"] == "week of 2023-11-13" and bar["value"] == 4 and bar["w"] <= 48
    assert chart["unit"] == "commit"  # a noun for |count: "4 commits", "1 commit"
    assert [t["label"] for t in chart["y_ticks"]] == ["0", "2.0", "4"]
    assert [x["text"] for x in chart["x_labels"]] == ["13 Nov"]


def test_history_buckets_by_month_then_year_as_the_range_grows() -> None:
    two_years = history_bars(weeks(date(2021, 1, 4), 104))
    assert two_years["bucket"] == "month" and len(two_years["bars"]) == 24
    assert sum(b["value"] for b in two_years["bars"]) == sum(i % 5 + 1 for i in range(104))
    twenty = history_bars(weeks(date(2004, 1, 5), 20 * 52))
    assert twenty["bucket"] == "year" and 20 <= len(twenty["bars"]) <= 21
    assert twenty["bars"][0]["label"] == "2004" and len(twenty["x_labels"]) <= 7
    gap = history_bars([{"week": "2020-01-06", "commits": 1}, {"week": "2020-03-02", "commits": 2}])
    assert [b["value"] for b in gap["bars"]] == [1, 0, 0, 0, 0, 0, 0, 0, 2]  # empty weeks shown


def test_the_last_24_hours_are_charted_per_hour_with_the_failure_rate_coloured(
    operator: Client,
) -> None:
    repo = Repository.objects.create(url="https://example.com/a/busy.git")
    run = JobRun.objects.create(
        job_id="j-busy", kind=JobRun.Kind.SYNC, queue="sync", repository=repo
    )
    now = timezone.now()
    two_hours_ago = now - timedelta(hours=2)
    outcomes = ["succeeded"] * 3 + ["failed"]
    JobAttempt.objects.bulk_create(
        JobAttempt(run=run, number=i + 1, outcome=o, finished_at=two_hours_ago)
        for i, o in enumerate(outcomes)
    )
    JobAttempt.objects.create(
        run=run, number=9, outcome="succeeded", finished_at=now - timedelta(days=2)
    )
    day = day_series(now=now)
    assert len(day["hours"]) == 24 and sum(day["throughput"]) == 3  # the 2-day-old one is out
    hour = day["hours"].index(two_hours_ago.replace(minute=0, second=0, microsecond=0).isoformat())
    assert day["throughput"][hour] == 3 and day["failures"][hour] == 1
    assert day["failure_pct"][hour] == 25.0
    page = operator.get("/").content.decode()
    charts = page.split('id="day-charts"')[1].split("</section>")[0]
    assert charts.count("<svg") == 3 and '<rect class="bar bad"' in charts  # 25 % is over 20 %
    assert "25 % failed</title>" in charts and "3 jobs</title>" in charts
    assert "1 jobs" not in charts and "jobss" not in charts and "0 queued</title>" in charts


def test_sparklines_have_a_scale_and_a_value_per_minute_on_hover(operator: Client) -> None:
    repo = Repository.objects.create(url="https://example.com/a/spark.git")
    run = JobRun.objects.create(
        job_id="j-spark", kind=JobRun.Kind.SYNC, queue="sync", repository=repo
    )
    JobAttempt.objects.create(run=run, number=1, outcome="succeeded", finished_at=timezone.now())
    page = operator.get("/").content.decode()
    spark = page.split('id="spark-throughput"')[1].split("</svg>")[0]
    assert len(re.findall(r"<title>\d\d:\d\d UTC · \d+ jobs/min</title>", spark)) == 61
    assert "· 1 jobs/min</title>" in spark  # this minute's one finished job
    assert '<span id="spark-throughput-peak">1</span>' in page
    assert "−60 min" in page and ">now<" in page


# ---------------------------------------------------------------------------- pagination


def test_the_audit_log_pages_without_gaps_or_repeats(operator: Client) -> None:
    AuditEntry.objects.bulk_create(
        AuditEntry(actor="ops", action="dlq.retry", target=f"t{i}", outcome="ok")
        for i in range(130)
    )
    first = operator.get("/audit/").content.decode()
    rows1 = re.findall(r'<tr data-entry="(\d+)"', first)
    assert len(rows1) == 100
    nxt = re.search(r'href="\?before=(\d+)" rel="next"', first).group(1)
    second = operator.get(f"/audit/?before={nxt}").content.decode()
    rows2 = re.findall(r'<tr data-entry="(\d+)"', second)
    assert len(rows2) == 30 and not set(rows1) & set(rows2)
    assert {int(r) for r in rows1 + rows2} == set(AuditEntry.objects.values_list("pk", flat=True))
    # A filter is kept in the pager's links; a broken cursor shows the first page.
    AuditEntry.objects.bulk_create(
        AuditEntry(actor="ops", action="lock.force_release", target=f"k{i}", outcome="ok")
        for i in range(101)
    )
    page = operator.get("/audit/?action=lock.force_release").content.decode()
    assert 'href="?action=lock.force_release&amp;before=' in page
    assert operator.get("/audit/?before=nope").status_code == 200


def test_repositories_page_search_and_filter(operator: Client) -> None:
    for i in range(55):
        Repository.objects.create(
            url=f"https://example.com/{'alpha' if i % 2 else 'beta'}/r{i}.git",
            status=Repository.Status.READY if i % 3 == 0 else Repository.Status.QUEUED,
        )
    first = operator.get("/repos/").content.decode()
    assert first.count("<tr data-repo-id=") == 50 and 'rel="next"' in first
    nxt = re.search(r'href="\?before=(\d+)" rel="next"', first).group(1)
    assert operator.get(f"/repos/?before={nxt}").content.decode().count("<tr data-repo-id=") == 5
    alpha = operator.get("/repos/?q=alpha").content.decode()
    assert alpha.count("<tr data-repo-id=") == 27 and "/beta/" not in alpha
    ready = operator.get("/repos/?status=ready&q=beta").content.decode()
    expected = sum(1 for i in range(55) if i % 3 == 0 and i % 2 == 0)
    assert ready.count('data-status="ready"') == expected and 'data-status="queued"' not in ready


def test_dead_letter_groups_page_and_filter_on_the_server(operator: Client) -> None:
    repo = Repository.objects.create(url="https://example.com/a/many.git")
    other = Repository.objects.create(url="https://example.com/z/needle.git")
    for g in range(30):
        dead(repo, 1 + (g == 0), cause=f"{g:04x}")
    dead(other, 3, cause="beef")
    page = operator.get("/dead-letters/").content.decode()
    assert page.count('<details class="group"') == 25 and "page 1 of 2" in page
    assert page.index('data-group="beef"') < page.index('data-group="0000"')  # largest first
    page2 = operator.get("/dead-letters/?page=2").content.decode()
    assert page2.count('<details class="group"') == 6
    found = operator.get("/dead-letters/?q=needle").content.decode()
    assert found.count('<details class="group"') == 1 and 'data-group="beef"' in found
    assert "3 dead runs" in text_of(found) and "1 repository" in text_of(found)
    assert operator.get("/dead-letters/?page=999").status_code == 200


def test_the_runs_screen_searches_like_the_api(operator: Client) -> None:
    repo = Repository.objects.create(url="https://example.com/a/runs.git")
    dead(repo, 2, cause="dd01", job="needle")
    JobRun.objects.create(job_id="sync-x", kind=JobRun.Kind.SYNC, queue="sync", repository=repo)
    page = operator.get("/runs/").content.decode()
    assert page.count("<tr data-run=") == 3
    only_dead = operator.get("/runs/?state=dead").content.decode()
    assert only_dead.count("<tr data-run=") == 2 and 'href="/runs/' in only_dead
    assert operator.get("/runs/?q=sync-x&kind=sync").content.decode().count("<tr data-run=") == 1
    assert operator.get("/runs/?state=bogus&repo=x").status_code == 200  # ignored, not a 500


# ---------------------------------------------------------------------------- queries


def test_the_repositories_page_makes_no_query_per_row(
    operator: Client, django_assert_num_queries
) -> None:
    Repository.objects.create(url="https://example.com/q/r0.git")
    operator.get("/repos/")  # warm the session and the caches
    with CaptureQueriesContext(connection) as one_row:
        operator.get("/repos/")
    for i in range(1, 20):
        Repository.objects.create(url=f"https://example.com/q/r{i}.git")
    with django_assert_num_queries(len(one_row.captured_queries)):
        page = operator.get("/repos/").content.decode()
    assert page.count("<tr data-repo-id=") == 20


# ---------------------------------------------------------------------------- reasons


def test_the_reason_typed_in_the_dialog_is_in_the_audit_log(operator: Client) -> None:
    repo = Repository.objects.create(url="https://example.com/a/why.git")
    (run,) = dead(repo, 1, cause="abcd")
    res = operator.post(
        "/api/dlq/discard", {"runs": [run.pk]}, content_type="application/json",
        headers={"X-Audit-Reason": "known%20bad%20mirror%20%E2%9C%93"},
    )  # fmt: skip
    assert res.status_code == 200 and res.json() == {"moved": 1}
    entry = AuditEntry.objects.get(action="dlq.discard")
    assert entry.detail["reason"] == "known bad mirror ✓"
    page = operator.get("/audit/?q=mirror").content.decode()
    assert '<td class="reason">known bad mirror ✓</td>' in page
    # A bulk action records its audit entry in a worker: the reason goes along.
    dead(repo, 2, cause="ef01")
    res = operator.post(
        "/api/dlq/retry", {"group": "ef01"}, content_type="application/json",
        headers={"X-Audit-Reason": "fixed%20upstream"},
    )  # fmt: skip
    assert res.status_code == 202
    run_bulk(res.json()["id"])
    assert AuditEntry.objects.get(action="dlq.retry").detail["reason"] == "fixed upstream"


# ---------------------------------------------------------------------------- load


EIGHT_SCREENS = ["/", "/repos/", "/repos/{repo}/", "/locks/", "/workers/", "/dead-letters/",
                 "/audit/", "/api/status"]  # fmt: skip


def _grow(repo: Repository, n: int) -> None:
    """More of everything the load test's screens list: repositories, dead letters in
    several groups, audit entries, runs and attempts of the repository, a held lock."""
    for i in range(n):
        other = Repository.objects.create(url=f"https://example.com/grow/{repo.pk}-{n}-{i}.git")
        dead(other, 2, cause=f"c{n}x{i}", job=f"grow{n}")
        AuditEntry.objects.create(actor="ops", action=f"queue.pause{i % 3}", target=f"q{i}",
                                  outcome="paused")  # fmt: skip
        run = JobRun.objects.create(job_id=f"r{n}-{i}", kind=JobRun.Kind.SYNC, queue="sync",
                                    repository=repo, state=JobRun.State.SUCCEEDED)  # fmt: skip
        JobAttempt.objects.create(run=run, number=1, outcome="succeeded",
                                  finished_at=timezone.now())  # fmt: skip
    key = keys.mirror(other.pk)  # a lock of its own per round
    leases.redlock().acquire([key], ttl=30.0, holder={"job": "j"})


def test_the_load_tests_screens_make_as_many_queries_with_more_data(
    operator: Client,
) -> None:
    """Every page a browser of the load test opens costs the same number of queries
    whatever the data size (nothing per row, group, entry or lock)."""
    repo = Repository.objects.create(url="https://example.com/grow/main.git")
    _grow(repo, 1)

    def counts() -> list[int]:
        out = []
        for path in EIGHT_SCREENS:
            url = path.format(repo=repo.pk)
            assert operator.get(url).status_code == 200  # warm the session and caches
            with CaptureQueriesContext(connection) as ctx:
                assert operator.get(url).status_code == 200
            out.append(len(ctx.captured_queries))
        return out

    small = counts()
    _grow(repo, 12)
    assert counts() == small


def test_the_repository_page_never_counts_its_stored_commits(operator: Client) -> None:
    """The page's status, its live part and the summary's freshness check read the kept
    count (``dashboard.repositories.commit_counts``) once; none of them counts the stored commits, a
    scan that grows with the history."""
    repo = Repository.objects.create(url="https://example.com/grow/count.git")
    operator.get(f"/repos/{repo.pk}/")
    with CaptureQueriesContext(connection) as ctx:
        assert operator.get(f"/repos/{repo.pk}/").status_code == 200
    counts = [
        q["sql"] for q in ctx.captured_queries
        if "COUNT(*)" in q["sql"] and '"dashboard_commit"' in q["sql"].split("FROM", 1)[-1][:40]
    ]  # fmt: skip
    assert counts == []


def test_audit_targets_link_to_the_page_they_are_on(operator: Client) -> None:
    for action, target in [("dlq.retry", "group a"), ("lock.force_release", "locks:x"),
                           ("queue.pause", "sync"), ("repo.submit", "https://e.com/a b.git"),
                           ("rollout.start", "v2")]:  # fmt: skip
        AuditEntry.objects.create(actor="ops", action=action, target=target, outcome="ok")
    page = operator.get("/audit/").content.decode()
    assert '<a href="/dead-letters/">group a</a>' in page
    assert '<a href="/locks/">locks:x</a>' in page
    assert '<a href="/workers/">sync</a>' in page
    assert '<a href="/repos/?q=https%3A%2F%2Fe.com%2Fa+b.git">https://e.com/a b.git</a>' in page
    assert '<td class="path">v2</td>' in page  # no page of its own: plain text


def _table(sql: str) -> str:
    """``SELECT table`` / ``UPDATE table``: the statement and its own first table (what
    parentheses hold — subqueries, ``COUNT(*)`` — dropped first)."""
    outer = sql
    while (shorter := re.sub(r"\([^()]*\)", "", outer)) != outer:
        outer = shorter
    found = re.search(r'(FROM|UPDATE|INTO) "(\w+)"', outer)
    return f"{sql.split(' ', 1)[0]} {found.group(2) if found else '?'}"


def test_the_repository_page_reads_its_row_count_and_chunks_in_one_query(
    operator: Client, git_repo: GitRepo
) -> None:
    """The warm repository page makes 8 queries — session, user, the served
    fingerprint, the row with its stored-commit count and chunk counts, its verification
    (docs/analytics.md#verification), the summary, the commits, the recent runs — was 12
    (the fingerprint read twice, the count and the chunks' GROUP BY apart from the row),
    then 8 with the view count's write (now counted in memory and written in batches:
    ``dashboard.repositories.view_counts``). The status it shows is ``repository_status``'s,
    exactly."""
    for i in range(3):
        git_repo.commit(f"c{i}", {"f.py": f"{i}\n"})
    repo, _ = submit_repository(url=str(git_repo.path))
    run_workers()
    url = f"/repos/{repo.pk}/"
    assert operator.get(url).status_code == 200  # warm: the session
    with CaptureQueriesContext(connection) as ctx:
        page = operator.get(url)
    assert page.status_code == 200
    assert [_table(q["sql"]) for q in ctx.captured_queries] == [
        "SELECT django_session", "SELECT auth_user", "SELECT dashboard_analyzerversion",
        "SELECT dashboard_repository", "SELECT dashboard_verification",
        "SELECT dashboard_summary", "SELECT dashboard_commit", "SELECT dashboard_jobrun",
    ]  # fmt: skip
    # The recent runs: only the columns their table shows, no join to the row it has.
    runs_sql = ctx.captured_queries[-1]["sql"]
    assert "JOIN" not in runs_sql and '"error"' not in runs_sql and '"cause"' not in runs_sql
    assert page.content.decode().count('class="run-link"') == len(page.context["recent_runs"]) > 0
    repo.refresh_from_db()
    assert page.context["state"] == repository_status(repo)
    n = len(git_repo.shas())
    assert page.context["state"]["commits_analyzed"] == n == 6
    assert f"{n} / {n} commits" in page.content.decode()


def test_the_combined_status_equals_repository_status(git_repo: GitRepo) -> None:
    """Chunks in every state under the served fingerprint and others under another one,
    kept counts under both: the one-query reader and ``repository_status`` agree."""
    fp = current_fingerprint()
    repo = Repository.objects.create(url="https://example.com/s/combined.git", commits_total=9,
                                     status="analyzing", head="ab" * 20)  # fmt: skip
    bare = Repository.objects.create(url="https://example.com/s/bare.git")
    states = [*Chunk.State.values, Chunk.State.DONE, Chunk.State.DONE]
    for i, state in enumerate(states):
        for f in (fp, "other"):
            Chunk.objects.create(repository=repo, fingerprint=f, key=f"{f}{i}", shas="x", size=1,
                                 state=state)  # fmt: skip
    CommitCount.objects.create(repository=repo, fingerprint=fp, commits=4)
    CommitCount.objects.create(repository=repo, fingerprint="other", commits=7)
    for r in (repo, bare):
        found = repository_with_status(r.pk)
        assert found is not None and found[0].pk == r.pk
        assert found[1] == repository_status(r)
    assert repository_with_status(repo.pk)[1]["chunks"] == {  # type: ignore[index]
        "queued": 1, "running": 1, "done": 3, "failed": 1, "dropped": 1}  # fmt: skip
    assert repository_with_status(repo.pk, fingerprint="other")[1]["commits_analyzed"] == 7  # type: ignore[index]
    assert repository_with_status(10**9) is None


def test_the_workers_page_shows_each_git_hosts_fetch_slots_waiters_and_backoff(
    operator: Client, settings: object
) -> None:
    """docs/scheduling.md#per-host-fetch-limits: "github.com 1/1" while a fetch holds the
    only slot, and a backoff's end."""
    from dashboard.infra import queues
    from dashboard.runs.fetch_limits import fetch_gate
    from workers.git import HostLimit, back_off

    settings.FETCH_LIMITS = {"github.com": HostLimit(concurrency=1)}  # type: ignore[attr-defined]
    settings.SNAPSHOT_TTL = 0  # type: ignore[attr-defined]
    back_off(queues.connection(), "gitlab.com", 60)
    with fetch_gate().slot("github.com"):
        page = operator.get("/workers/").content.decode()
    rows = {
        host: " ".join(text_of(row).split())
        for host, row in re.findall(r'<tr data-host="([^"]+)"[^>]*>(.*?)</tr>', page, re.S)
    }
    assert set(rows) == {"github.com", "gitlab.com"}
    assert rows["github.com"] == "github.com 1/1 0 — — —"
    assert rows["gitlab.com"].startswith("gitlab.com 0/4 0 — — until ")
