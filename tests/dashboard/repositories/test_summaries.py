"""dashboard.repositories.summaries: aggregates against git's own numbers on a real repository (the
pages and API that show them are covered in tests/dashboard/web/test_repositories.py and
tests/dashboard/api/test_api.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dashboard.models import Commit, Repository, Summary
from dashboard.repositories.lifecycle import current_fingerprint, submit_repository
from dashboard.repositories.summaries import compute_summary, repository_summary
from tests.conftest import run_workers
from tests.support.gitrepo import GitRepo, reference_commits

pytestmark = pytest.mark.django_db(transaction=True)

BOB = ("Bob", "bob@example.com")
BOB_OLD = ("bobby", "bob@old.example.org")


def _history(path: Path) -> GitRepo:
    repo = GitRepo.create(path)
    repo.commit(
        "init", {"README.md": "a\n", ".mailmap": "Bob <bob@example.com> <bob@old.example.org>\n"}
    )
    repo.commit("code", {"src/app.py": "x = 1\ny = 2\n"}, author=BOB_OLD)
    repo.commit("more", {"src/app.py": "x = 1\n", "lib.js": "let a;\n"}, author=BOB)
    repo.git("checkout", "-q", "-b", "side")
    repo.commit("side", {"side.py": "s = 1\n"}, author=("Cy", "cy@example.com"))
    repo.git("checkout", "-q", "main")
    repo.commit("main again", {"README.md": "a\nb\n"})
    repo.clock += 3600
    date = f"{repo.clock} +0000"
    repo.git("merge", "-q", "--no-ff", "-m", "merge side", "side",
             GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date)  # fmt: skip
    repo.commit("late", {"src/app.py": "x = 2\n"}, author=BOB)
    return repo


def _analysed(origin: GitRepo) -> Repository:
    repo, _ = submit_repository(url=str(origin.path))
    run_workers()
    repo.refresh_from_db()
    assert repo.status == Repository.Status.READY, repo.error
    return repo


def test_totals_equal_gits_numbers_and_authors_follow_the_mailmap(tmp_path: Path) -> None:
    origin = _history(tmp_path / "origin")
    repo = _analysed(origin)
    ref = reference_commits(origin.path)
    data = compute_summary(repo, current_fingerprint())
    totals = data["totals"]
    assert totals["commits"] == len(ref) == 7
    assert totals["merges"] == sum(c["is_merge"] for c in ref.values()) == 1
    assert totals["insertions"] == sum(c["insertions"] for c in ref.values())
    assert totals["deletions"] == sum(c["deletions"] for c in ref.values())
    # git shortlog applies .mailmap: bob@old... is Bob <bob@example.com>.
    shortlog = origin.git("shortlog", "-sne", "HEAD").splitlines()
    expected = sorted(
        (line.split("\t")[1].rsplit(" <", 1)[1].rstrip(">"), int(line.split("\t")[0]))
        for line in shortlog
    )
    got = sorted((a["email"], a["commits"]) for a in data["authors"])
    assert (
        got == expected == [("ada@example.com", 3), ("bob@example.com", 3), ("cy@example.com", 1)]
    )
    assert totals["authors"] == 3
    bob = next(a for a in data["authors"] if a["email"] == "bob@example.com")
    assert bob["name"] == "Bob"
    assert data["authors"][0]["commits"] >= data["authors"][-1]["commits"]
    by_lang = {x["language"]: x for x in data["languages"]}
    assert set(by_lang) >= {"Python", "JavaScript", "Markdown"}
    assert by_lang["JavaScript"] == {"language": "JavaScript", "lines": 1, "files": 1}
    hot = data["hotspots"][0]
    assert (hot["path"], hot["changes"]) == ("src/app.py", 3)
    assert sum(w["commits"] for w in data["weekly"]) == 7
    assert totals["first_commit_at"] < totals["last_commit_at"]


def test_weeks_start_on_monday(tmp_path: Path) -> None:
    origin = GitRepo.create(tmp_path / "origin")
    origin.clock = 1_704_412_800 - 3600  # the first commit: Fri 2024-01-05 00:00 UTC
    origin.commit("fri", {"a.txt": "1\n"})
    origin.clock += 3 * 86400  # Mon 2024-01-08 01:00
    origin.commit("mon", {"a.txt": "2\n"})
    origin.clock += 86400
    origin.commit("tue", {"a.txt": "3\n"})
    data = compute_summary(_analysed(origin), current_fingerprint())
    # lines per week as git --numstat counts them: +1 on Friday; +1/-1 on Monday and Tuesday
    assert data["weekly"] == [
        {"week": "2024-01-01", "commits": 1, "insertions": 1, "deletions": 0},
        {"week": "2024-01-08", "commits": 2, "insertions": 2, "deletions": 2},
    ]


def test_the_cached_summary_is_recomputed_when_the_commit_count_changes(tmp_path: Path) -> None:
    origin = GitRepo.create(tmp_path / "origin")
    origin.commit("one", {"a.py": "1\n"})
    repo = _analysed(origin)
    fp = current_fingerprint()
    first = repository_summary(repo, fp)
    assert Summary.objects.get(repository=repo, fingerprint=fp).commits == 1
    assert repository_summary(repo, fp) == first
    origin.commit("two", {"a.py": "2\n"})
    submit_repository(url=str(origin.path))
    run_workers()
    repo.refresh_from_db()
    assert Commit.objects.filter(repository=repo).count() == 2
    assert repository_summary(repo, fp)["totals"]["commits"] == 2
    assert Summary.objects.get(repository=repo, fingerprint=fp).commits == 2


def test_an_empty_fingerprint_has_zero_totals(tmp_path: Path) -> None:
    origin = GitRepo.create(tmp_path / "origin")
    origin.commit("one", {"a.py": "1\n"})
    repo = _analysed(origin)
    data = compute_summary(repo, "no-such-fingerprint")
    assert data["totals"] == {
        "commits": 0, "merges": 0, "authors": 0, "insertions": 0, "deletions": 0,
        "first_commit_at": None, "last_commit_at": None,
    }  # fmt: skip
    assert data["authors"] == data["languages"] == data["hotspots"] == data["weekly"] == []


def test_a_summary_computed_across_a_prune_is_not_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plan that deletes dropped commits commits while a reader computes: what the
    reader computed may count them, so it is not cached (the next read recomputes), even
    though the count may be the same again by then."""
    from dashboard.repositories import summaries
    from dashboard.repositories.commit_counts import remove_stored

    repo = _analysed(_history(tmp_path / "o"))
    fp = current_fingerprint()
    Summary.objects.all().delete()
    real = summaries.compute_summary

    def computed_then_pruned(r: Repository, f: str) -> dict[str, object]:
        data = real(r, f)
        remove_stored(r.pk, f, 1)  # a prune commits meanwhile (and a write adds one back)
        from dashboard.repositories.commit_counts import add_stored

        add_stored(r.pk, f, 1)
        return data

    monkeypatch.setattr(summaries, "compute_summary", computed_then_pruned)
    repository_summary(repo, fp)
    assert not Summary.objects.filter(repository=repo, fingerprint=fp).exists()
    monkeypatch.setattr(summaries, "compute_summary", real)
    repository_summary(repo, fp)
    assert Summary.objects.filter(repository=repo, fingerprint=fp).exists()
