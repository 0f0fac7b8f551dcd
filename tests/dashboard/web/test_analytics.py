"""dashboard.web.analytics: each analysis page shows the planted tables, linked from the
repository page; a bad parameter is the form's error with a 400, never a 500."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client

from tests.support.analytics_history import analysed, build, git_log
from tests.support.gitrepo import GitRepo

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def browser(client: Client) -> Client:
    client.force_login(User.objects.create_user("reader", password="pw-reader-123"))
    return client


def test_the_pages_show_the_planted_patterns(browser: Client, tmp_path: Path) -> None:
    origin = build(tmp_path / "origin")
    repo = analysed(origin)
    last_day = max(c.committed_at[:10] for c in git_log(origin))
    page = browser.get(f"/repos/{repo.pk}/").content.decode()
    assert f'href="/repos/{repo.pk}/analytics/coupling/"' in page

    html = browser.get(f"/repos/{repo.pk}/analytics/coupling/").content.decode()
    row = html[html.index('id="coupling-files"') :]
    assert "core/a.py" in row and "core/b.py" in row and "<td>80 %</td>" in row
    assert f"git log --no-merges --no-renames --numstat {repo.head}</code>" in html
    assert f"head {repo.head[:10]}" in html
    link = f'href="/api/repos/{repo.pk}/coupling?&amp;format=csv&amp;table=directories"'
    assert link in html  # each table as CSV, through the API (the session authenticates)
    assert (
        browser.get(f"/api/repos/{repo.pk}/coupling?&format=csv&table=directories").status_code
        == 200
    )

    res = browser.get(
        f"/repos/{repo.pk}/analytics/coupling/?path=core/a.py&min_revs=1&min_shared_revs=1"
    )
    html = res.content.decode()
    assert res.status_code == 200 and 'id="coupled-with"' in html
    assert html.index("core/b.py") < html.index("core/c.py")  # 80 % before 33 %

    html = browser.get(
        f"/repos/{repo.pk}/analytics/ownership/?until={last_day}&inactive_days=90"
    ).content.decode()
    risk = html[html.index('id="knowledge-at-risk"') : html.index('id="ownership-directories"')]
    assert "Cy" in risk and "legacy/old.py, legacy/util.py" in risk
    dirs = html[html.index('id="ownership-directories"') :]
    assert "handbook" in dirs and "<td>90 %</td>" in dirs
    legacy = dirs[dirs.index(">legacy<") : dirs.index("</tr>", dirs.index(">legacy<"))]
    assert '<span class="pill bad">inactive</span>' in legacy

    html = browser.get(f"/repos/{repo.pk}/analytics/age/?until={last_day}").content.decode()
    assert "legacy" in html and "<td>7</td>" in html

    html = browser.get(
        f"/repos/{repo.pk}/analytics/hotspots/?last=365&until={last_day}"
    ).content.decode()
    files = html[html.index('id="hotspot-files"') :]
    assert files.index("core/a.py") < files.index("legacy/old.py")
    assert 'value="365" selected' in html


@pytest.mark.parametrize(
    ("query", "field", "message"),
    [
        ("since=2024-02-30", "since", "since must be an ISO date"),
        ("depth=9", "depth", "depth must be between 1 and 6"),
        ("min_coupling=x", "min_coupling", "min_coupling must be an integer"),
    ],
)
def test_a_bad_parameter_is_a_form_error(
    browser: Client, query: str, field: str, message: str
) -> None:
    from dashboard.models import Repository

    repo = Repository.objects.create(url="https://example.com/x.git", status="ready")
    res = browser.get(f"/repos/{repo.pk}/analytics/coupling/?{query}")
    html = res.content.decode()
    assert res.status_code == 400
    assert 'id="analytics-error" role="alert">' + message in html
    tag = html[html.index(f'name="{field}"') :]
    assert 'aria-invalid="true"' in tag[: tag.index(">")]


def test_unknown_analysis_or_repository_is_404_and_login_is_required(
    browser: Client, client: Client
) -> None:
    assert browser.get("/repos/1/analytics/churn/").status_code == 404
    assert browser.get("/repos/424242/analytics/age/").status_code == 404
    browser.logout()
    assert client.get("/repos/1/analytics/age/").status_code == 302


def test_author_and_file_pages(browser: Client, tmp_path: Path) -> None:
    origin = build(tmp_path / "origin")
    repo = analysed(origin)
    base = f"/repos/{repo.pk}/analytics"
    html = browser.get(f"{base}/authors/").content.decode()
    assert 'href="?author=cy%40example.com' in html
    html = browser.get(f"{base}/authors/?author=cy@example.com").content.decode()
    files = html[html.index('id="author-files"') :]
    assert "legacy/old.py" in files and "<td>3</td>" in files
    chart = html[html.index('id="author-chart"') : html.index('id="author-weekly"')]
    assert "<svg" in chart and "4 commits" in chart  # Cy's four commits, one bar
    res = browser.get(f"{base}/files/?path=core/a.py")
    html = res.content.decode()
    assert res.status_code == 200
    commits = html[html.index('id="file-commits"') :]
    assert commits.count(f'href="/repos/{repo.pk}/commits/') == 11
    coupled = html[html.index('id="file-coupled"') : html.index('id="file-commits"')]
    assert "core/b.py" in coupled and "80 %" in coupled
    assert browser.get(f"{base}/files/").status_code == 200  # the form asks for a path
    res = browser.get(f"{base}/files/?path=nowhere.txt")
    assert res.status_code == 404 and "no commit changed nowhere.txt" in res.content.decode()


def test_the_lens_toggles_keep_the_other_parameters_and_equal_git(
    browser: Client, tmp_path: Path
) -> None:
    import html as htmllib
    import re
    from urllib.parse import parse_qs

    from tests.support.analytics_history import (
        LENS_CASES,
        build_lenses,
        lens_totals,
        queue_state,
    )

    origin = build_lenses(tmp_path / "origin")
    repo = analysed(origin)
    before = queue_state()
    page = f"/repos/{repo.pk}/analytics/hotspots/"
    row = re.compile(
        r'<td class="path"><a href="[^"]*" title="its history[^"]*">([^<]+)</a></td>'
        r"<td>(\d+)</td><td>(\d+)</td>"
    )
    for case in LENS_CASES:
        res = browser.get(f"{page}?limit=1000&depth=2&exclude={','.join(case)}")
        assert res.status_code == 200
        html = res.content.decode()
        table = html[html.index('id="hotspot-files"') : html.index('id="hotspot-directories"')]
        got = {htmllib.unescape(p): (int(r), int(c)) for p, r, c in row.findall(table)}
        assert got == lens_totals(origin, case).files, case
    html = browser.get(f"{page}?limit=1000&depth=2&exclude=lock").content.decode()
    toggles = dict(re.findall(r'<a href="\?([^"]*)" class="lens[^"]*" data-lens="(\w+)"', html))
    toggles = {lens: parse_qs(htmllib.unescape(q)) for q, lens in toggles.items()}
    assert toggles["bots"] == {"limit": ["1000"], "depth": ["2"], "exclude": ["lock,bots"]}
    assert toggles["lock"] == {"limit": ["1000"], "depth": ["2"]}  # turned off again
    assert 'data-lens="lock" aria-pressed="true"' in html
    assert '<input type="hidden" name="exclude" value="lock">' in html
    assert "leaving out lock" in html
    assert queue_state() == before  # toggling a lens enqueues nothing
    res = browser.get(f"{page}?exclude=tests&limit=7")
    html = res.content.decode()
    assert res.status_code == 400 and "exclude: unknown lens &#x27;tests&#x27;" in html
    assert 'id="analytics-lenses" aria-label="Lenses" aria-invalid="true"' in html


@pytest.mark.parametrize("analysis", ["hotspots", "coupling", "ownership", "age", "authors",
                                      "files"])  # fmt: skip
def test_every_analysis_page_is_live_with_the_sockets_marks(
    browser: Client, git_repo: GitRepo, analysis: str
) -> None:
    """Every analysis page joins its repository's socket and carries the marks of the
    results it shows (``#analytics-results[data-marks]``), which equal the socket's
    snapshot (``repository_live(marks=True)``, what ``RepositoryConsumer`` sends) until a
    push is analysed; the page rendered then carries the new ones, so gitward.js swaps
    its results in without a reload (docs/live-view.md)."""
    import html as html_lib
    import re

    from dashboard.live.snapshots import repository_live
    from dashboard.repositories.lifecycle import submit_repository
    from tests.conftest import run_workers

    git_repo.commit("one", {"src/a.py": "1\n"})
    repo, _ = submit_repository(url=str(git_repo.path))
    run_workers()
    url = f"/repos/{repo.pk}/analytics/{analysis}/?path=src/a.py&author=x@example.com"

    def marks(page: str) -> str:
        found = re.search(r'id="analytics-results" data-marks="([^"]*)"', page)
        assert found, page[:500]
        return html_lib.unescape(found.group(1))

    page = browser.get(url).content.decode()
    assert f'data-live-socket="/ws/repos/{repo.pk}/?results=1"' in page
    assert 'id="analytics-status"' in page
    before = marks(page)
    assert before == repository_live(repo.pk, marks=True)["results_marks"]
    git_repo.commit("two", {"src/b.py": "2\n"})
    submit_repository(url=str(git_repo.path))
    run_workers()
    now = repository_live(repo.pk, marks=True)["results_marks"]
    assert now != before
    page = browser.get(url).content.decode()
    assert marks(page) == now
    if analysis == "hotspots":
        assert "src/b.py" in page  # the new results, which the swap brings in
