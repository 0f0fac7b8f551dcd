"""Size limits of a mirror (G20): its bytes on disk and the size of any one object."""

from __future__ import annotations

import signal
from pathlib import Path

from workers.fetcherrors import RepositoryTooLarge
from workers.gitproc import GitError, Runner, _killpg

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
) -> None:
    """Raise :class:`RepositoryTooLarge` if the repository on disk (packed + loose) is
    larger than ``max_repo_bytes`` or holds an object larger than ``max_object_bytes``.

    The object scan streams ``git cat-file --batch-all-objects --batch-check`` (memory
    bounded) and stops at the first offender."""
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
    proc = runner(
        [
            "--git-dir",
            str(git_dir),
            "cat-file",
            "--batch-all-objects",
            "--unordered",
            "--batch-check=%(objectsize) %(objecttype) %(objectname)",
        ]
    )
    assert proc.stdout is not None
    offender: tuple[int, str, str] | None = None
    try:
        for raw in proc.stdout:
            size_b, kind, name = raw.decode("ascii", "replace").split()
            if int(size_b) > max_object_bytes:
                offender = (int(size_b), kind, name)
                break
    finally:
        runner.groups.discard(proc.pid)
        _killpg(proc.pid)  # stop early at an offender; reap any child of the group
        proc.communicate()
    if offender is not None:
        size, kind, name = offender
        raise RepositoryTooLarge(
            f"repository contains a {kind} of {human(size)} ({name[:12]}), more than "
            f"the limit of {human(max_object_bytes)} per object"
        )
    if proc.returncode not in (0, -signal.SIGKILL):
        raise GitError(f"git cat-file exited with {proc.returncode}", returncode=proc.returncode)


def human(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} bytes"  # pragma: no cover
