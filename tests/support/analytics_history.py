"""A real git history with planted patterns for the analytics (docs/analytics.md), and
what ``git log --numstat`` says about it, parsed here independently of gitward.

Planted: ``core/a.py`` and ``core/b.py`` change together in 8 of their 10 revisions each
(degree 80); a 35-file commit touching both (over code-maat's change-set limit of 30); Ada
makes 9 of the 10 changes of ``handbook/`` (90 %); Cy changes ``legacy/`` only, then is silent
for 200+ days; Bob commits under an old address that ``.mailmap`` maps to his current one;
a side branch merged with ``--no-ff`` (its merge commit is left out)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tests.support.gitrepo import GitRepo

ADA = ("Ada Lovelace", "ada@example.com")
BOB = ("Bob", "bob@example.com")
BOB_OLD = ("bobby", "bob@old.example.org")
CY = ("Cy", "cy@example.com")
DAY = 86_400


def build(path: Path) -> GitRepo:
    repo = GitRepo.create(path)
    repo.commit("init", {".mailmap": "Bob <bob@example.com> <bob@old.example.org>\n"}, author=ADA)
    for i in range(3):
        repo.commit(f"legacy {i}", {"legacy/old.py": f"v = {i}\n"}, author=CY)
    repo.commit("legacy util", {"legacy/util.py": "u = 1\n"}, author=CY)
    repo.clock += 210 * DAY  # Cy is never seen again
    n = 0
    for i in range(8):
        n += 1
        repo.commit(
            f"core pair {i}", {"core/a.py": f"a = {n}\n", "core/b.py": f"b = {n}\n"}, author=ADA
        )
        if i < 2:
            repo.commit(
                f"core c {i}", {"core/a.py": f"a = {n}c\n", "core/c.py": f"c = {i}\n"}, author=ADA
            )
    n += 1
    repo.commit("b alone", {"core/b.py": f"b = {n}\n"}, author=ADA)
    repo.commit("b alone again", {"core/b.py": f"b = {n}x\n"}, author=ADA)
    big = {f"gen/f{i:02}.txt": f"{i}\n" for i in range(33)}
    repo.commit(
        "big sweep", {**big, "core/a.py": "a = big\n", "core/b.py": "b = big\n"}, author=ADA
    )
    for i in range(10):
        repo.clock += 2 * DAY
        who = BOB_OLD if i == 4 else ADA
        repo.commit(f"guide {i}", {"handbook/guide.md": f"line {i}\n" * (i + 1)}, author=who)
    repo.git("checkout", "-q", "-b", "side")
    repo.commit("side work", {"side/x.py": "x = 1\n"}, author=BOB)
    repo.git("checkout", "-q", "main")
    repo.commit("main again", {"README.md": "hello\n"}, author=ADA)
    repo.clock += 3600
    date = f"{repo.clock} +0000"
    repo.git("merge", "-q", "--no-ff", "-m", "merge side", "side",
             GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date)  # fmt: skip
    repo.commit("late", {"README.md": "hello\nagain\n", "side/x.py": "x = 2\n"}, author=BOB)
    return repo


@dataclass(frozen=True)
class LoggedCommit:
    sha: str
    committed_at: str
    author: str
    files: dict[str, tuple[int, int]]


def git_log(repo: GitRepo, *args: str) -> list[LoggedCommit]:
    """``git log --no-merges --no-renames --numstat`` (plus ``args``, e.g. ``--since``),
    parsed: each commit's committer date, mailmap author email, and per-file lines."""
    out = repo.git(
        "log", "--no-merges", "--no-renames", "--numstat", "--format=@@%H %cI %aE", *args
    )
    commits: list[LoggedCommit] = []
    for line in out.splitlines():
        if line.startswith("@@"):
            sha, at, author = line[2:].split(" ")
            commits.append(LoggedCommit(sha, at, author, {}))
        elif line.strip():
            added, deleted, path = line.split("\t", 2)
            binary = added == "-"
            commits[-1].files[path] = (0 if binary else int(added), 0 if binary else int(deleted))
    return commits


def analysed(origin: GitRepo):  # -> Repository (imported late: Django must be set up)
    """Submit ``origin`` and drain the queues with a real RQ worker until it is ready."""
    from dashboard.models import Repository
    from dashboard.repositories.lifecycle import submit_repository
    from tests.conftest import run_workers

    repo, _ = submit_repository(url=str(origin.path))
    run_workers()
    repo.refresh_from_db()
    assert repo.status == Repository.Status.READY, repo.error
    return repo
