"""workers.git.commit_view: GitPython runs git with workers.git.runner's hardening (fixed
environment, ``-c`` overrides), whatever the web server's environment and the mirror's
config say; patches are split per file with git's quoted names."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support.gitrepo import GitRepo
from workers.git.commit_view import (
    CommitMissing,
    MirrorMissing,
    MirrorState,
    _header_paths,
    mirror_state,
    open_mirror,
    read_message,
    read_patch,
)
from workers.git.mirror import HEAD_REF
from workers.git.runner import hardened_env


def mirror_of(tmp_path: Path) -> tuple[Path, GitRepo]:
    origin = GitRepo.create(tmp_path / "origin")
    origin.commit("one", {"a.txt": "1\n"})
    origin.commit("two", {"a.txt": "1\n2\n"})
    mirror = tmp_path / "m.git"
    subprocess.run(["git", "clone", "--quiet", "--bare", str(origin.path), str(mirror)],
                   check=True, env={**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null"})  # fmt: skip
    subprocess.run(["git", "--git-dir", str(mirror), "update-ref", HEAD_REF, "HEAD"], check=True)
    return mirror, origin


def test_git_runs_with_the_hardened_environment_and_options_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mirror, origin = mirror_of(tmp_path)
    head, first = origin.head(), origin.shas()[1]
    marker = tmp_path / "ran"
    evil = tmp_path / "evil.sh"
    evil.write_text(f"#!/bin/sh\ntouch {marker}\necho EVIL\n")
    evil.chmod(0o755)
    # What a web server's environment or a mirror's config could carry.
    monkeypatch.setenv("GIT_EXTERNAL_DIFF", str(evil))
    monkeypatch.setenv("GIT_CONFIG_PARAMETERS", f"'diff.external={evil}'")
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("GITWARD_LEAK_CHECK", "leaked")
    for key, value in (("diff.external", str(evil)), ("core.fsmonitor", str(evil)),
                       ("core.pager", str(evil)), ("diff.noprefix", "true")):  # fmt: skip
        subprocess.run(["git", "--git-dir", str(mirror), "config", key, value], check=True)
    with open_mirror(mirror) as repo:
        text = read_message(repo, head)
        patch = read_patch(repo, head, text.parents)
        # The persistent cat-file GitPython keeps: its environment and command line.
        pid = repo.git.cat_file_all.proc.pid
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    env = dict(e.decode().split("=", 1) for e in environ if e)
    assert env == hardened_env({"GIT_DIR": str(mirror)})
    assert b"core.hooksPath=/dev/null" in cmdline and b"protocol.allow=never" in cmdline
    assert b"protocol.ext.allow=never" in cmdline
    assert text.message == "two\n" and text.parents == (first,)
    (f,) = patch.files
    assert f.path == "a.txt" and "+2\n" in f.text and "diff --git a/a.txt b/a.txt" in f.text
    assert "EVIL" not in f.text and not marker.exists()


def test_the_mirror_head_is_resolved_without_git_and_absence_is_said(tmp_path: Path) -> None:
    mirror, origin = mirror_of(tmp_path)
    state = mirror_state(mirror)
    assert state.present and state.head == origin.head() and state.head_moved_at is not None
    assert mirror_state(tmp_path / "none.git").present is False
    with pytest.raises(MirrorMissing), open_mirror(tmp_path / "none.git"):
        pass
    with open_mirror(mirror) as repo, pytest.raises(CommitMissing):
        read_message(repo, "0" * 40)
    tree = origin.git("rev-parse", "HEAD^{tree}").strip()
    with open_mirror(mirror) as repo, pytest.raises(CommitMissing, match="not a commit"):
        read_message(repo, tree)


@pytest.mark.parametrize(
    ("line", "paths"),
    [
        ("diff --git a/x y b/x y\n", ("x y", "x y")),
        ("diff --git a/ b/c b/ b/c\n", (" b/c", " b/c")),
        ('diff --git "a/\\"q\\tz" "b/\\"q\\tz"\n', ('"q\tz', '"q\tz')),
        ('diff --git "a/caf\\303\\251" "b/caf\\303\\251"\n', ("café", "café")),
    ],
)
def test_patch_headers_give_back_the_paths(line: str, paths: tuple[str, str]) -> None:
    assert _header_paths(line) == paths


def test_the_mirror_head_is_read_from_the_ref_files_even_when_git_python_cannot_open_it(
    tmp_path: Path,
) -> None:
    """The repository page's mirror state needs no GitPython repository (it was opened
    on every view): a mirror whose ``config`` GitPython cannot parse still shows its head
    (it failed the page), here from ``packed-refs``; no ``objects`` directory is no
    readable mirror, as ``open_mirror`` says."""
    mirror, origin = mirror_of(tmp_path)
    subprocess.run(["git", "--git-dir", str(mirror), "pack-refs", "--all"], check=True)
    assert not (mirror / HEAD_REF).exists()  # the head is in packed-refs only now
    (mirror / "config").write_text("[core\nnot a config\n")
    state = mirror_state(mirror)
    assert state.present and state.head == origin.head() and state.head_moved_at is not None
    (mirror / "objects").rename(tmp_path / "objects-aside")
    assert mirror_state(mirror) == MirrorState(present=True)


def test_a_mirror_whose_config_git_python_cannot_parse_is_said_to_be_unreadable(
    tmp_path: Path,
) -> None:
    """The commit page opens the mirror with GitPython, which parses its ``config``: a
    broken one is a readable reason (``MirrorMissing``), not a ``configparser`` error
    that failed the page with a 500."""
    mirror, _origin = mirror_of(tmp_path)
    (mirror / "config").write_text("[core\nnot a config\n")
    with pytest.raises(MirrorMissing, match="git config is unreadable"), open_mirror(mirror):
        pass
