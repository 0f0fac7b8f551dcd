"""workers.remotes.local_repos (docs/security.md#g22): a repository under the local roots
that makes git read another repository's objects through git's own redirections is
refused, with real repositories built each way; one whose redirections stay under the
roots is accepted and fetched."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.gitrepo import GitRepo
from workers.remotes.local_repos import check_local_repository
from workers.remotes.parse import parse_remote
from workers.remotes.policy import InvalidRemote, RemotePolicy


def git(*args: str, cwd: Path | None = None) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, check=True, text=True,
        env={"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "PATH": "/usr/bin:/bin",
             "GIT_AUTHOR_NAME": "A", "GIT_AUTHOR_EMAIL": "a@x", "GIT_COMMITTER_NAME": "A",
             "GIT_COMMITTER_EMAIL": "a@x"},
    ).stdout  # fmt: skip


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path]:
    """``roots`` (allowed) and ``secret``, a repository outside them with a commit whose
    file is the secret."""
    roots = tmp_path / "roots"
    roots.mkdir()
    secret = GitRepo.create(tmp_path / "secret")
    secret.commit("the secret", {"password.txt": "hunter2\n"})
    return roots, secret.path


def policy(roots: Path) -> RemotePolicy:
    return RemotePolicy(local_roots=(roots,))


def refused(path: Path, roots: Path) -> str:
    with pytest.raises(InvalidRemote) as exc:
        parse_remote(str(path), policy(roots))
    message = str(exc.value)
    assert "not under an allowed root" in message or "another server" in message
    return message


def borrowing(path: Path, secret: Path) -> Path:
    """A bare repository whose branch is the secret's commit and that holds none of its
    objects: git reads them through ``objects/info/alternates`` alone."""
    git("init", "--quiet", "--bare", str(path))
    head = git("-C", str(secret), "rev-parse", "HEAD").strip()
    (path / "objects" / "info" / "alternates").write_text(str(secret / ".git" / "objects") + "\n")
    git("-C", str(path), "update-ref", "refs/heads/main", head)
    git("-C", str(path), "symbolic-ref", "HEAD", "refs/heads/main")
    return path


def test_g22_before_the_check_git_reads_the_secret_through_alternates(
    layout: tuple[Path, Path], tmp_path: Path
) -> None:
    """What the check stops: a fetch of the borrowing repository copies the secret."""
    roots, secret = layout
    evil = borrowing(roots / "evil.git", secret)
    mirror = tmp_path / "mirror.git"
    git("init", "--quiet", "--bare", str(mirror))
    git("-C", str(mirror), "fetch", "--quiet", str(evil), "+refs/heads/main:refs/x")
    assert git("-C", str(mirror), "show", "refs/x:password.txt") == "hunter2\n"
    assert "alternates" in refused(evil, roots)


def test_g22_alternates_outside_the_roots_are_refused(layout: tuple[Path, Path]) -> None:
    roots, secret = layout
    assert "objects/info/alternates" in refused(borrowing(roots / "a.git", secret), roots)


def test_g22_relative_and_nested_alternates_are_followed(layout: tuple[Path, Path]) -> None:
    roots, secret = layout
    # relative to the objects directory that lists it
    rel = borrowing(roots / "rel.git", secret)
    (rel / "objects" / "info" / "alternates").write_text(
        "# a comment\n\n../../../secret/.git/objects\n"
    )
    refused(rel, roots)
    # a chain: first → middle (inside) → secret (outside)
    middle = borrowing(roots / "middle.git", secret)
    first = borrowing(roots / "first.git", secret)
    (first / "objects" / "info" / "alternates").write_text(str(middle / "objects") + "\n")
    refused(first, roots)
    # C-quoted, as git writes a path with special characters
    quoted = borrowing(roots / "quoted.git", secret)
    (quoted / "objects" / "info" / "alternates").write_text(
        '"' + str(secret / ".git" / "objects") + '"\n'
    )
    refused(quoted, roots)


def test_g22_http_alternates_naming_a_server_or_outside_are_refused(
    layout: tuple[Path, Path],
) -> None:
    roots, secret = layout
    repo = GitRepo.create(roots / "web")
    repo.commit("x", {"a": "1\n"})
    info = repo.path / ".git" / "objects" / "info"
    (info / "http-alternates").write_text("http://169.254.169.254/objects\n")
    assert "another server" in refused(repo.path, roots)
    (info / "http-alternates").write_text(str(secret / ".git" / "objects") + "\n")
    assert "http-alternates" in refused(repo.path, roots)


def test_g22_a_gitfile_pointing_outside_is_refused(layout: tuple[Path, Path]) -> None:
    roots, secret = layout
    worktree = roots / "wt"
    worktree.mkdir()
    (worktree / ".git").write_text(f"gitdir: {secret / '.git'}\n")
    assert ".git file" in refused(worktree, roots)
    # relative, as git writes it
    (worktree / ".git").write_text("gitdir: ../../secret/.git\n")
    refused(worktree, roots)


def test_g22_a_commondir_pointing_outside_is_refused(layout: tuple[Path, Path]) -> None:
    """A git directory whose ``commondir`` is the secret's: git takes its objects and
    refs from there (a linked worktree's layout)."""
    roots, secret = layout
    linked = roots / "linked"
    linked.mkdir()
    (linked / "HEAD").write_text("ref: refs/heads/main\n")
    (linked / "commondir").write_text(str(secret / ".git") + "\n")
    assert "commondir" in refused(linked, roots)


def test_g22_symlinks_inside_the_repository_pointing_outside_are_refused(
    layout: tuple[Path, Path],
) -> None:
    roots, secret = layout
    repo = GitRepo.create(roots / "linky")
    repo.commit("x", {"a": "1\n"})
    packs = repo.path / ".git" / "objects" / "pack"
    shutil.rmtree(packs)
    packs.symlink_to(secret / ".git" / "objects" / "pack")
    assert "symbolic link" in refused(repo.path, roots)
    # a .git that is itself a link out
    other = roots / "other"
    other.mkdir()
    (other / ".git").symlink_to(secret / ".git")
    refused(other, roots)


def test_g22_the_sibling_dot_git_of_a_root_is_checked_too(layout: tuple[Path, Path]) -> None:
    """``/root`` with no repository of its own: git would open ``/root.git``, outside."""
    roots, secret = layout
    sibling = roots.parent / "roots.git"
    git("clone", "--quiet", "--bare", str(secret), str(sibling))
    refused(roots, roots)


def test_g22_redirections_that_stay_under_the_roots_are_accepted(
    layout: tuple[Path, Path], tmp_path: Path
) -> None:
    """A shared clone (alternates to a repository under the roots, relative or not), a
    linked worktree (gitfile and commondir inside), a plain directory: all accepted, and
    the shared clone fetches."""
    roots, _ = layout
    base = GitRepo.create(roots / "base")
    base.commit("x", {"a": "1\n"})
    git("clone", "--quiet", "--shared", "--bare", str(base.path), str(roots / "shared.git"))
    git("-C", str(base.path), "worktree", "add", "--quiet", str(roots / "wt"), "-b", "side")
    (roots / "plain").mkdir()
    for path in (roots / "shared.git", roots / "wt", roots / "plain", base.path):
        check_local_repository(path, [roots])
        assert parse_remote(str(path), policy(roots)).url == str(path.resolve())
    mirror = tmp_path / "m.git"
    git("init", "--quiet", "--bare", str(mirror))
    git("-C", str(mirror), "fetch", "--quiet", str(roots / "shared.git"), "+HEAD:refs/x")
