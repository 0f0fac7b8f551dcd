"""Size limits of a mirror (docs/security.md#g20): its bytes on disk and the size of any
one object."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

from workers.git.fetch_errors import RepositoryTooLarge
from workers.git.runner import GitError, Runner, _killpg

#: Default bound on a mirror's size on disk (packed + loose objects), and on any one
#: file git writes while fetching (RLIMIT_FSIZE), G20.
DEFAULT_MAX_REPO_BYTES = 2 * 1024**3
#: Default bound on the (uncompressed) size of any one object: a 100 MB blob of zeros
#: packs to ~100 KB, so the pack size alone does not bound what analysis reads, G20.
DEFAULT_MAX_OBJECT_BYTES = 256 * 1024**2


def _size_kib(line: str) -> int:
    return int(line.split(":", 1)[1].strip() or 0)


def check_limits(
    runner: Runner,
    git_dir: Path,
    *,
    max_repo_bytes: int | None,
    max_object_bytes: int | None,
    timeout: float = 600.0,
    tip: str | None = None,
    checked: str | None = None,
) -> None:
    """Raise :class:`RepositoryTooLarge` if the repository on disk (packed + loose) is
    larger than ``max_repo_bytes`` or holds an object larger than ``max_object_bytes``.

    The object scan streams ``git cat-file --batch-check`` (memory bounded) and stops at
    the first offender.  Without ``checked`` it scans every object of the repository
    (``--batch-all-objects``).  With ``tip`` and ``checked`` (a commit every object
    reachable from which passed this check before, under a limit at most
    ``max_object_bytes``) it scans only what ``git rev-list --objects tip ^checked``
    lists: the objects analysis can reach from ``tip`` that were not checked yet, so an
    incremental fetch costs what it brought, not the whole history.  Objects reachable
    from neither are never read by analysis."""
    if max_repo_bytes is not None:
        out = runner.run(["--git-dir", str(git_dir), "count-objects", "-v"], timeout=timeout)
        fields = dict((ln.split(":", 1)[0], ln) for ln in out.splitlines() if ":" in ln)
        size = 1024 * sum(_size_kib(fields[k]) for k in ("size", "size-pack") if k in fields)
        if size > max_repo_bytes:
            raise RepositoryTooLarge(
                f"repository is larger than the limit of {human(max_repo_bytes)} "
                f"({human(size)} on disk)"
            )
    if max_object_bytes is None:
        return
    check_format = "--batch-check=%(objectsize) %(objecttype) %(objectname)"
    lister: subprocess.Popen[bytes] | None = None
    if tip is not None and checked is not None:
        # rev-list → cat-file through a pipe: both stream, neither holds the list.
        lister = runner(
            [
                "--git-dir",
                str(git_dir),
                "rev-list",
                "--objects",
                "--no-object-names",
                "--end-of-options",
                tip,
                f"^{checked}",
            ]
        )
        assert lister.stdout is not None
        proc = runner(
            ["--git-dir", str(git_dir), "cat-file", check_format], stdin=lister.stdout.fileno()
        )
        lister.stdout.close()  # cat-file holds the read end now
    else:
        proc = runner(
            [
                "--git-dir",
                str(git_dir),
                "cat-file",
                "--batch-all-objects",
                "--unordered",
                check_format,
            ]
        )
    offender = _first_offender(proc, max_object_bytes)
    for started in (proc, lister):
        if started is not None:
            _finish(runner, started, stop=offender is not None)
    if offender is not None:
        size, kind, name = offender
        raise RepositoryTooLarge(
            f"repository contains a {kind} of {human(size)} ({name[:12]}), more than "
            f"the limit of {human(max_object_bytes)} per object"
        )
    for done in (proc, lister):
        # Either may have failed (a lister whose ``checked`` is gone ends cat-file's
        # input early): the scan is complete only if both exited by themselves with 0.
        if done is not None and done.returncode != 0:
            name = "rev-list" if done is lister else "cat-file"
            raise GitError(f"git {name} exited with {done.returncode}", returncode=done.returncode)


def _first_offender(proc: subprocess.Popen[bytes], limit: int) -> tuple[int, str, str] | None:
    """Read ``cat-file --batch-check`` lines until one names an object over ``limit``."""
    assert proc.stdout is not None
    for raw in proc.stdout:
        size_b, kind, name = raw.decode("ascii", "replace").split()[:3]
        if int(size_b) > limit:
            return int(size_b), kind, name
    return None


def _finish(runner: Runner, proc: subprocess.Popen[bytes], *, stop: bool) -> None:
    """End ``proc`` and reap it. ``stop``: kill it now (an offender was found, the rest
    of the scan is moot). Otherwise let it exit by itself first (its output is at an end,
    so it is exiting) and only then kill what may be left of its group: killing it at
    EOF could turn a failure exit into SIGKILL, indistinguishable from our own stop.
    ``waitid(WNOWAIT)`` leaves it a zombie until then, so its group id is not reused."""
    runner.groups.discard(proc.pid)
    if not stop:
        with contextlib.suppress(ChildProcessError):
            os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
    _killpg(proc.pid)
    proc.communicate()


def human(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} bytes"  # pragma: no cover
