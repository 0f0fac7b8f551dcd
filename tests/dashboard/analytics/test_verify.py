"""dashboard.analytics.verify and ``manage.py verify``: a clean analysis agrees with git;
one altered file row is found and its commit named; altered totals are reported; no mirror
is said in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError

from dashboard.analytics.verify import CannotVerify, verify_repository
from dashboard.models import Commit, FileChange
from tests.support.analytics_history import analysed, build

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_clean_analysis_agrees_and_an_altered_row_is_named(tmp_path: Path, capsys) -> None:
    origin = build(tmp_path / "origin")
    repo = analysed(origin)
    result = verify_repository(repo, sample=500)
    assert result["sampled"] == Commit.objects.filter(repository=repo).count() == 32
    assert result["mismatches"] == [] and result["agrees"]
    assert result["totals"]["stored"] == result["totals"]["git"]
    assert result["totals"]["git"]["commits"] == 31  # the merge is left out
    # one stored file row altered: that commit, and only it, is named
    row = FileChange.objects.filter(repository=repo, path="handbook/guide.md").order_by("id")[3]
    FileChange.objects.filter(pk=row.pk).update(added=row.added + 1)
    result = verify_repository(repo, sample=500)
    assert [m["sha"] for m in result["mismatches"]] == [row.commit.sha]
    assert result["mismatches"][0]["stored"] == [
        ["handbook/guide.md", row.added + 1, row.deleted, False]
    ]
    assert not result["agrees"]
    with pytest.raises(SystemExit) as exited:
        call_command("verify", str(repo.pk))
    assert exited.value.code == 2
    out = capsys.readouterr().out
    assert "32 commits sampled, 1 mismatches" in out and row.commit.sha in out


def test_altered_totals_and_a_missing_mirror(tmp_path: Path, capsys) -> None:
    origin = build(tmp_path / "origin")
    repo = analysed(origin)
    call_command("verify", "--json")
    assert json.loads(capsys.readouterr().out)["agrees"] is True
    Commit.objects.filter(repository=repo, subject="late").update(insertions=99)
    result = verify_repository(repo, sample=1, seed=3)
    assert (
        result["totals"]["stored"]["insertions"] == result["totals"]["git"]["insertions"] + 99 - 2
    )
    assert not result["agrees"]
    shutil.rmtree(Path(settings.WORKSPACE) / "mirrors" / f"{repo.pk}.git")
    with pytest.raises(CannotVerify, match="no mirror"):
        verify_repository(repo)
    with pytest.raises(CommandError, match="no mirror of repository"):
        call_command("verify", str(repo.pk))
    with pytest.raises(CommandError, match="--sample must be between"):
        call_command("verify", str(repo.pk), "--sample", "0")


@pytest.mark.parametrize("renames", [False, True])
def test_one_diff_tree_process_derives_each_commit_as_diffing_it_alone(
    tmp_path: Path, renames: bool
) -> None:
    """``_rederive`` (one ``git diff-tree --stdin``) gives every commit the rows a
    ``git diff-tree`` of that commit alone prints: a root commit, an empty commit, a
    rename (with detection on: two paths after the entry, one of them 40 characters
    long, like a header) and a merge against its first parent."""
    from dashboard.analytics.verify import _diff_args, _git, _numstat, _rederive
    from dashboard.models import Commit
    from tests.support.gitrepo import EMPTY_TREE, GitRepo
    from workers.analysis import AnalyzerConfig

    repo = GitRepo.create(tmp_path / "r")
    forty = "d" * 36 + ".txt"
    repo.commit("root", {"a.txt": "1\n2\n", forty: "x\n" * 30})
    repo.commit("empty", allow_empty=True)
    repo.commit("rename", {forty: None, "moved.txt": "x\n" * 30 + "y\n"})
    repo.git("checkout", "-q", "-b", "side", "HEAD~1")
    repo.commit("side", {"b.txt": "b\n"})
    repo.git("checkout", "-q", "main")
    repo.git("merge", "-q", "--no-ff", "-m", "merge", "side")
    config = AnalyzerConfig(detect_renames=renames)
    mirror = repo.path / ".git"
    commits = [
        Commit(sha=line.split()[0], parents=" ".join(line.split()[1:]))
        for line in repo.git("rev-list", "--parents", "HEAD").splitlines()
    ]
    got = _rederive(mirror, config, commits)
    for c in commits:
        base = (c.parent_list() or [EMPTY_TREE])[0]
        alone = _git(mirror, ["diff-tree", "-r", "-z", "--numstat", *_diff_args(config),
                              base, c.sha])  # fmt: skip
        assert got[c.sha] == _numstat(alone), c.sha
    assert len(got) == len(commits) == 5
    renamed = repo.git("rev-parse", "HEAD^1").strip()
    assert got[renamed] == (
        [("moved.txt", 1, 0, False)]
        if renames
        else [(forty, 0, 30, False), ("moved.txt", 31, 0, False)]
    )
    assert got[repo.git("rev-parse", "HEAD~2").strip()] == []  # the empty commit
