"""Bare mirrors of analysed repositories, one per repository under the workspace.

Callers hold the repository's mirror lock (``locks:git:repo:{id}:mirror``) around every
function here that writes; reads of a finished mirror need no lock (git updates refs
and objects atomically).
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

from workers.gitproc import GitError, Runner

#: The ref every sync writes: the analysed branch head, whatever its remote name.
HEAD_REF = "refs/gitward/head"


class RepositoryUnavailable(GitError):
    """The remote cannot be read (missing, unreachable, no such branch): not retried."""


def mirror_path(workspace: Path, repo_id: int) -> Path:
    return workspace / "mirrors" / f"{repo_id}.git"


def _tmp_dir(workspace: Path) -> Path:
    return workspace / "tmp"


def is_valid(path: Path, runner: Runner | None = None) -> bool:
    """True if ``path`` opens as a git repository with our head ref."""
    if not (path / "HEAD").exists():
        return False
    try:
        (runner or Runner()).run(
            ["--git-dir", str(path), "rev-parse", "--verify", "--quiet", f"{HEAD_REF}^{{commit}}"],
            timeout=60,
        )
    except GitError:
        return False
    return True


def _refspec(branch: str) -> str:
    source = f"refs/heads/{branch}" if branch else "HEAD"
    return f"+{source}:{HEAD_REF}"


def _fetch(runner: Runner, git_dir: Path, git_url: str, branch: str, timeout: float) -> None:
    args = [
        "--git-dir",
        str(git_dir),
        "fetch",
        "--quiet",
        "--no-tags",
        "--no-write-fetch-head",
        "--no-recurse-submodules",
        "--end-of-options",
        git_url,
        _refspec(branch),
    ]
    try:
        runner.run(args, timeout=timeout)
    except GitError as exc:
        if exc.returncode is not None and exc.returncode != 0 and _is_permanent(exc.stderr):
            raise RepositoryUnavailable(
                _readable(exc.stderr, branch), returncode=exc.returncode, stderr=exc.stderr
            ) from None
        raise


def _is_permanent(stderr: str) -> bool:
    text = stderr.lower()
    return any(
        marker in text
        for marker in (
            "does not appear to be a git repository",
            "repository not found",
            "couldn't find remote ref",
            "not found",
            "could not read from remote repository",
            "authentication failed",
            "could not resolve host",
            "unable to access",
            "connection refused",
            "transport '",
            "not allowed",
        )
    )


def _readable(stderr: str, branch: str) -> str:
    text = stderr.lower()
    if "couldn't find remote ref" in text:
        return f"branch {branch!r} does not exist in the repository"
    if "does not appear to be a git repository" in text or "not found" in text:
        return "repository not found or not a git repository"
    if "could not resolve host" in text:
        return "host name could not be resolved"
    if "connection refused" in text:
        return "connection refused by the repository host"
    if "authentication" in text or "could not read from remote" in text:
        return "repository requires authentication or is not readable"
    from workers.gitproc import first_error_line

    return first_error_line(stderr) or "git fetch failed"


def sync_mirror(
    *,
    workspace: Path,
    repo_id: int,
    git_url: str,
    branch: str,
    runner: Runner,
    timeout: float,
) -> str:
    """Bring the mirror up to date and return the analysed head sha.

    1. If a valid mirror exists, ``git fetch`` into it (objects first, then the ref
       update, which git does atomically: readers never see a half-updated ref).
    2. Otherwise build a fresh bare repository in ``workspace/tmp``, fetch into it, and
       ``rename`` it into place only when complete, so a crash leaves at most a stray
       temporary directory (removed by ``remove_stale_temporaries``), never a
       half-written mirror at the real path.
    """
    path = mirror_path(workspace, repo_id)
    if path.exists() and is_valid(path, runner):
        _fetch(runner, path, git_url, branch, timeout)
    else:
        tmp_root = _tmp_dir(workspace)
        tmp_root.mkdir(parents=True, exist_ok=True)
        tmp = tmp_root / f"{repo_id}-{uuid.uuid4().hex}.git"
        try:
            runner.run(["init", "--quiet", "--bare", str(tmp)], timeout=60)
            # HEAD names the analysed ref: git reads .mailmap from HEAD in a bare repo.
            runner.run(["--git-dir", str(tmp), "symbolic-ref", "HEAD", HEAD_REF], timeout=60)
            _fetch(runner, tmp, git_url, branch, timeout)
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.exists():  # a corrupt or foreign leftover: replace it
                shutil.rmtree(path)
            os.rename(tmp, path)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    out = runner.run(
        ["--git-dir", str(path), "rev-parse", "--verify", f"{HEAD_REF}^{{commit}}"], timeout=60
    )
    return out.strip()


def remove_stale_temporaries(workspace: Path, repo_id: int) -> int:
    """Delete half-finished clones of one repository (call under its mirror lock)."""
    removed = 0
    tmp_root = _tmp_dir(workspace)
    if not tmp_root.is_dir():
        return 0
    for entry in tmp_root.glob(f"{repo_id}-*.git"):
        shutil.rmtree(entry, ignore_errors=True)
        removed += 1
    return removed
