"""The commit page and ``GET /api/repos/<id>/commits/<sha>``, and the repository
page's head, links, mirror line and re-analyse button.

A real repository (tests.support.gitrepo.hostile_commits) analysed by real RQ workers into the
real database; the page reads the real mirror through GitPython."""

from __future__ import annotations

import html
import shutil
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from dashboard.models import AuditEntry, Repository
from dashboard.repositories import one_commit
from dashboard.repositories.lifecycle import submit_repository
from tests.conftest import run_workers
from tests.support.gitrepo import AUTHOR, PAYLOADS, GitRepo, hostile_commits
from workers.git.commit_view import EMPTY_TREE, Limits
from workers.git.workspace import mirror_path

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def operator(client: Client) -> Client:
    client.force_login(User.objects.create_superuser("ops", password="pw-ops-12345"))
    return client


@pytest.fixture
def analysed(tmp_path: Path) -> tuple[Repository, dict[str, str]]:
    shas = hostile_commits(tmp_path / "hostile")
    repo, _ = submit_repository(url=str(tmp_path / "hostile"))
    run_workers()
    repo.refresh_from_db()
    assert repo.status == "ready", repo.error
    return repo, shas


def page(client: Client, repo: Repository, sha: str) -> str:
    res = client.get(f"/repos/{repo.pk}/commits/{sha}/")
    assert res.status_code == 200, res.status_code
    return res.content.decode()


def api(client: Client, repo: Repository, sha: str) -> dict:
    res = client.get(f"/api/repos/{repo.pk}/commits/{sha}")
    assert res.status_code == 200, res.content
    return res.json()


def test_the_root_commit_shows_message_people_stats_and_patch_as_text(
    operator: Client, analysed
) -> None:
    repo, shas = analysed
    body = page(operator, repo, shas["root"])
    for payload in PAYLOADS:
        assert payload not in body  # never markup
        assert html.escape(payload) in body  # always text
    assert "root commit: the patch is against the empty tree" in body
    assert "body " + html.escape(PAYLOADS[1]) in body  # the full message, not the subject
    assert "x@example.com" in body and html.escape(AUTHOR) in body  # the author
    data = api(operator, repo, shas["root"])
    assert data["sha"] == shas["root"] and data["parents"] == []
    assert data["patch"]["base"] == EMPTY_TREE
    assert data["author"]["name"] == AUTHOR
    assert data["message"] == f"root {PAYLOADS[0]}\n\nbody {PAYLOADS[1]}\n"
    files = {f["path"]: f for f in data["files"]}
    assert set(files) == {"README.md", f"{PAYLOADS[0]}.txt", f"{PAYLOADS[1]}.md"}
    quoted = files[f"{PAYLOADS[1]}.md"]  # git quotes this name in the patch header
    assert quoted["added"] == 1 and quoted["patch"]["status"] == "added"
    assert f"+{PAYLOADS[0]}" in quoted["patch"]["text"]


def test_a_merge_links_its_parents_and_is_diffed_against_the_first(
    operator: Client, analysed
) -> None:
    repo, shas = analysed
    data = api(operator, repo, shas["merge"])
    assert data["is_merge"] and data["parents"] == [shas["main2"], shas["side"]]
    assert data["patch"]["base"] == shas["main2"]
    assert [f["path"] for f in data["files"]] == ["side.txt"]  # not main's README change
    assert "+from the side" in data["files"][0]["patch"]["text"]
    body = page(operator, repo, shas["merge"])
    for parent in data["parents"]:
        assert f'href="/repos/{repo.pk}/commits/{parent}/"' in body
    assert "first parent: the patch is against it" in body
    # A parent link leads to that commit's page.
    assert "main change" in page(operator, repo, shas["main2"])


def test_a_binary_file_says_binary_and_has_no_patch_text(operator: Client, analysed) -> None:
    repo, shas = analysed
    (f,) = api(operator, repo, shas["binary"])["files"]
    assert f["binary"] and f["patch"]["binary"] and f["patch"]["text"] == ""
    assert "binary file: no patch shown" in page(operator, repo, shas["binary"])


def test_patches_are_bounded_per_file_and_in_all(operator: Client, analysed, monkeypatch) -> None:
    repo, shas = analysed
    (big,) = api(operator, repo, shas["big"])["files"]
    assert big["added"] == 4000 and big["patch"]["truncated"]
    assert big["patch"]["bytes"] > 280_000  # what git sent …
    assert len(big["patch"]["text"].encode()) <= Limits().file_bytes  # … and what is kept
    assert big["patch"]["text"].endswith("\n")  # whole lines only
    assert "patch truncated" in page(operator, repo, shas["big"])
    # A page bound of two files: the third of the root commit is not shown, and said so.
    monkeypatch.setattr(one_commit, "LIMITS", Limits(files=2))
    data = api(operator, repo, shas["root"])
    assert data["patch"]["more_files"] and data["patch"]["truncated"]
    assert sum(1 for f in data["files"] if f["patch"]) == 2
    assert "later files are not shown" in page(operator, repo, shas["root"])
    monkeypatch.setattr(one_commit, "LIMITS", Limits(total_bytes=300))
    data = api(operator, repo, shas["root"])
    kept = sum(len(f["patch"]["text"].encode()) for f in data["files"] if f["patch"])
    assert kept <= 300 and data["patch"]["more_files"]


def test_a_message_in_another_encoding_is_decoded_and_an_unknown_one_is_not_a_500(
    operator: Client, analysed
) -> None:
    repo, shas = analysed
    data = api(operator, repo, shas["latin1"])
    assert data["message"] == "café crème: naïve\n\nrésumé\n"
    assert data["message_encoding"] == "ISO-8859-1"
    assert "résumé" in page(operator, repo, shas["latin1"])
    data = api(operator, repo, shas["bogus"])
    assert data["message"].startswith("unknown ") and "\ufffd" in data["message"]
    assert "x-no-such-encoding" in page(operator, repo, shas["bogus"])


def test_prefixes_and_upper_case_name_the_commit(operator: Client, analysed) -> None:
    repo, shas = analysed
    assert api(operator, repo, shas["side"][:7])["sha"] == shas["side"]
    assert api(operator, repo, shas["side"].upper())["sha"] == shas["side"]


@pytest.mark.parametrize(
    "sha", ["xyz1", "abc", "a" * 65, "0" * 40, "ffff", "<script>", "%3Cb%3E", "12 4"]
)
def test_a_bad_or_unknown_sha_is_a_404_page_and_a_json_404(
    operator: Client, analysed, sha: str
) -> None:
    repo, _ = analysed
    res = operator.get(f"/repos/{repo.pk}/commits/{sha}/")
    assert res.status_code == 404
    assert "Commit not found" in res.content.decode() and "<script>" not in res.content.decode()
    res = operator.get(f"/api/repos/{repo.pk}/commits/{sha}")
    assert res.status_code == 404 and "error" in res.json()


def test_a_commit_of_another_repository_or_no_repository_is_a_404(
    operator: Client, analysed, tmp_path: Path
) -> None:
    repo, shas = analysed
    other = GitRepo.create(tmp_path / "other")
    other.commit("elsewhere", {"x": "1\n"})
    other_repo, _ = submit_repository(url=str(other.path))
    run_workers()
    assert operator.get(f"/repos/{other_repo.pk}/commits/{shas['root']}/").status_code == 404
    assert operator.get(f"/api/repos/{other_repo.pk}/commits/{shas['root']}").status_code == 404
    # In the mirror but not a stored commit: the root commit's tree.
    tree = GitRepo(tmp_path / "hostile").git("rev-parse", f"{shas['root']}^{{tree}}").strip()
    assert operator.get(f"/repos/{repo.pk}/commits/{tree}/").status_code == 404
    assert operator.get(f"/repos/4242/commits/{shas['root']}/").status_code == 404
    res = operator.get(f"/api/repos/4242/commits/{shas['root']}")
    assert res.status_code == 404 and res.json() == {"error": "repository not found"}


def test_a_missing_mirror_is_said_on_the_page_with_the_stats(operator: Client, analysed) -> None:
    repo, shas = analysed
    shutil.rmtree(mirror_path(Path(settings.WORKSPACE), repo.pk))
    body = page(operator, repo, shas["side"])
    assert 'id="mirror-missing"' in body and "no mirror of this repository" in body
    assert "side.txt" in body and "side change" in body  # stored stats and subject
    data = api(operator, repo, shas["side"])
    assert data["mirror"]["available"] is False and data["files"][0]["patch"] is None
    assert "no mirror" in operator.get(f"/repos/{repo.pk}/").content.decode()


def test_the_commit_page_makes_the_same_few_queries_for_any_commit(
    operator: Client, analysed, django_assert_num_queries
) -> None:
    repo, shas = analysed
    page(operator, repo, shas["side"])  # warm the session
    # session, user, repository, served fingerprint, commit, its file rows
    with CaptureQueriesContext(connection) as one_file:
        page(operator, repo, shas["side"])
    assert len(one_file.captured_queries) <= 6, [q["sql"] for q in one_file.captured_queries]
    for name in ("root", "merge", "latin1"):  # three files, two parents, …
        with django_assert_num_queries(len(one_file.captured_queries)):
            page(operator, repo, shas[name])


# ---------------------------------------------------------------------------- item 7


def test_the_repository_page_links_head_and_every_commit_and_shows_the_mirror(
    operator: Client, analysed
) -> None:
    repo, shas = analysed
    body = operator.get(f"/repos/{repo.pk}/").content.decode()
    head = f'<span id="repo-head"><span class="id" title="{shas["bogus"]}"><a class="id-link" '
    assert head + f'href="/repos/{repo.pk}/commits/{shas["bogus"]}/">' in body
    for sha in shas.values():
        assert f'href="/repos/{repo.pk}/commits/{sha}/"' in body
    assert 'id="repo-fetched"' in body and "branch (default)" in body
    assert "mirror on this host: head" in body and "not the analysed head" not in body
    assert 'id="recent-runs"' in body and 'class="run-link" href="/runs/' in body


def test_re_analyse_is_permission_checked_and_audited(operator: Client, analysed) -> None:
    repo, _ = analysed
    assert 'id="reanalyse"' in operator.get(f"/repos/{repo.pk}/").content.decode()
    res = operator.post(f"/api/repos/{repo.pk}/reanalyse", headers={"X-Audit-Reason": "new%20push"})
    assert res.status_code == 202, res.content
    repo.refresh_from_db()
    assert repo.status == "queued" and repo.generation == 2
    again = operator.post(f"/api/repos/{repo.pk}/reanalyse")
    assert again.status_code == 409 and "queued" in again.json()["error"]
    entries = list(AuditEntry.objects.filter(action="repo.reanalyse").order_by("id"))
    assert [e.outcome.split(":")[0] for e in entries] == ["queued", "nothing to do"]
    assert entries[0].detail.get("reason") == "new push" and entries[0].actor == "ops"
    run_workers()
    repo.refresh_from_db()
    assert repo.status == "ready"
    # A user without the permission sees no button, and the API refuses (audited).
    plain = Client()
    plain.force_login(User.objects.create_user("bob", password="pw-bob-12345"))
    assert 'id="reanalyse"' not in plain.get(f"/repos/{repo.pk}/").content.decode()
    res = plain.post(f"/api/repos/{repo.pk}/reanalyse")
    assert res.status_code == 403 and "permission" in res.json()["error"]
    assert AuditEntry.objects.filter(action="repo.reanalyse", actor="bob",
                                     outcome__startswith="refused").exists()  # fmt: skip
    assert operator.post("/api/repos/4242/reanalyse").status_code == 404


def _non_utf8_repository(path: Path) -> tuple[GitRepo, str]:
    """Two tree entries whose names are not UTF-8 and differ in one byte (a raw-bytes
    file and one added by ``update-index --cacheinfo``), a UTF-8 name shaped like a
    quoted one, and a plain one; returns the repository and the commit."""
    import subprocess

    repo = GitRepo.create(path)
    repo.commit("root", {"README.md": "hi\n"})
    (path / "caf\xe9".encode("latin-1").decode("utf-8", "surrogateescape")).write_bytes(b"1\n")
    blob = repo.git("hash-object", "-w", "--stdin", input=b"2\n2\n").strip()
    env = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "PATH": "/usr/bin:/bin"}
    subprocess.run([b"git", b"add", b"--", b"caf\xe9"], cwd=path, check=True, env=env)
    info = b"100644," + blob.encode() + b",caf\xe8"
    subprocess.run([b"git", b"update-index", b"--add", b"--cacheinfo", info], cwd=path,
                   check=True, env=env)  # fmt: skip
    repo.write('"quoted"', "3\n")
    repo.git("add", "--", '"quoted"')
    sha = repo.commit("names that are not UTF-8", {"plain.txt": "4\n"})
    return repo, sha


def test_paths_that_are_not_utf8_stay_distinct_everywhere_and_nothing_500s(
    operator: Client, tmp_path: Path
) -> None:
    """docs/analysis.md: a path that is not UTF-8 is stored and shown in git's own quoted
    form (what ``core.quotePath=on`` prints), so two such names stay two files (they
    merged into one U+FFFD name in hotspots), the commit page answers 200 and its API
    lists exactly the stored files, each with its patch (it listed phantom extra files
    holding lone surrogates)."""
    import subprocess

    from dashboard.models import FileChange
    from dashboard.repositories.lifecycle import current_fingerprint
    from dashboard.repositories.summaries import repository_summary

    origin, sha = _non_utf8_repository(tmp_path / "latin")
    repo, _ = submit_repository(url=str(origin.path))
    run_workers()
    repo.refresh_from_db()
    assert repo.status == "ready", repo.error
    # git's own quoted names for the two that are not UTF-8
    quoted = subprocess.run(
        ["git", "-C", str(origin.path), "-c", "core.quotepath=on", "show", "--format=",
         "--name-only", sha], capture_output=True, check=True, text=True,
    ).stdout.split("\n")  # fmt: skip
    assert '"caf\\350"' in quoted and '"caf\\351"' in quoted
    want = {'"caf\\350"', '"caf\\351"', '"\\"quoted\\""', "plain.txt"}
    stored = set(FileChange.objects.filter(commit__sha=sha).values_list("path", flat=True))
    assert stored == want
    hotspots = repository_summary(repo, current_fingerprint())["hotspots"]
    assert {'"caf\\350"', '"caf\\351"'} <= {h["path"] for h in hotspots}
    body = api(operator, repo, sha)
    assert {f["path"] for f in body["files"]} == want
    assert len(body["files"]) == body["files_changed"] == 4
    assert all(f["patch"] is not None and f["added"] is not None for f in body["files"])
    raw = operator.get(f"/api/repos/{repo.pk}/commits/{sha}").content
    assert b"\\ud" not in raw  # no lone surrogate escaped into the JSON
    shown = page(operator, repo, sha)
    assert html.escape('"caf\\350"') in shown and html.escape('"caf\\351"') in shown
