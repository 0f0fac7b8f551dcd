"""Bare mirrors of analysed repositories, one per repository under the workspace.

Two locks guard every write to a mirror:

* the repository's Redis lock (``locks:git:repo:{id}:mirror``), taken by the job layer:
  one holder across hosts, and a lease whose loss must stop the writer;
* the mirror's **host lock**, an exclusive ``flock(2)`` on
  ``workspace/mirrors/{id}.flock`` (beside the mirror, never inside it), taken by every
  function that writes (:func:`workers.git.host_lock.hold_mirror`): it makes two Redis holders
  of one lease, should there be two, never two writers.

Functions that delete or replace anything also take ``check`` (``Lock.check``): it is
called before every destructive step, so a writer that has lost its lease stops before
it removes or renames anything.

What dead writers leave behind is removed by :mod:`workers.git.sanitation`, before each sync
(:func:`sanitize_mirror`).  Where each file lives: :mod:`workers.git.workspace`.

Reads of a mirror need no lock, even during a fetch: git adds objects in new packs
(visible only once their ``.idx`` is renamed in, after the ``.pack``) or as loose objects
renamed into place, and moves a ref by writing ``<ref>.lock`` and renaming it over the
ref, so a reader sees the old or the new head, each complete.  Readers take no lock files
(``GIT_OPTIONAL_LOCKS=0``).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING

from workers.git.fetch_errors import (
    RateLimited,
    RepositoryTooLarge,
    RepositoryUnavailable,
    is_permanent,
    rate_limited,
    readable,
)
from workers.git.host_lock import Check, MirrorBusy, hold_mirror, unchecked
from workers.git.mirror_limits import (
    DEFAULT_MAX_OBJECT_BYTES,
    DEFAULT_MAX_REPO_BYTES,
    check_limits,
    human,
)
from workers.git.runner import GitError, Runner
from workers.git.sanitation import STALE_AFTER, remove_stale_files, remove_stale_temporaries
from workers.git.workspace import host_lock_path, mirror_path, new_temporary
from workers.remotes import InvalidRemote, normalise_branch

if TYPE_CHECKING:
    from workers.remotes import Remote

# Other modules import these from here (workers.jobs, tests): the names stay public.
__all__ = [
    "DEFAULT_MAX_OBJECT_BYTES",
    "DEFAULT_MAX_REPO_BYTES",
    "HEAD_REF",
    "STALE_AFTER",
    "Check",
    "MirrorBusy",
    "RepositoryTooLarge",
    "RepositoryUnavailable",
    "check_limits",
    "hold_mirror",
    "host_lock_path",
    "is_valid",
    "mirror_head",
    "mirror_path",
    "packs_intact",
    "pins_for",
    "remove_stale_files",
    "remove_stale_temporaries",
    "sanitize_mirror",
    "sync_mirror",
    "update_mirror",
]

#: The ref every sync writes: the analysed branch head, whatever its remote name.
HEAD_REF = "refs/gitward/head"

_DEFAULT_PORTS = {"http": 80, "https": 443}
_SHA = re.compile(rb"[0-9a-f]{40}|[0-9a-f]{64}")


def pins_for(remote: Remote) -> dict[str, list[str]]:
    """``{"host:port": [addresses]}`` for ``sync_mirror(pinned=…)``, from the addresses
    the URL policy validated (``Remote.pinned_addresses``).  Empty for non-http(s)
    remotes (curl's resolve pinning only applies to http/https) and for IP literals."""
    if remote.scheme not in _DEFAULT_PORTS or not remote.host or not remote.pinned_addresses:
        return {}
    host = remote.host.strip("[]")
    try:
        ipaddress.ip_address(host)
        return {}  # a literal: nothing to resolve, nothing to rebind
    except ValueError:
        pass
    port = remote.port or _DEFAULT_PORTS[remote.scheme]
    return {f"{host}:{port}": list(remote.pinned_addresses)}


def _resolve_config(pinned: Mapping[str, Sequence[str]] | None) -> list[str]:
    """``-c http.curloptResolve=host:port:addr[,addr]`` arguments (git >= 2.37): curl
    connects to the validated addresses only, so DNS rebinding between validation and
    connect cannot reach another address (docs/security.md#g7)."""
    args: list[str] = []
    for host_port, addresses in (pinned or {}).items():
        host, sep, port = host_port.rpartition(":")
        if not sep or not host or not port.isdigit() or not addresses:
            raise ValueError(f"invalid pin {host_port!r}: expected 'host:port' and addresses")
        if any(c in host for c in ":,[] \t\r\n\0"):
            raise ValueError(f"invalid pinned host {host!r}")
        shown = []
        for addr in addresses:
            ip = ipaddress.ip_address(addr)  # ValueError for anything but an address
            shown.append(f"[{ip}]" if ip.version == 6 else str(ip))
        args += ["-c", f"http.curloptResolve={host}:{port}:{','.join(shown)}"]
    return args


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


def mirror_head(path: Path) -> str | None:
    """The sha ``HEAD_REF`` names in the mirror at ``path``, read from the ref files
    themselves (no git process); None if the mirror or the ref is missing.

    Safe without a lock (module docstring): git moves a loose ref by renaming
    ``<ref>.lock`` over it, and ``pack-refs`` writes ``packed-refs`` (same rename)
    *before* it deletes the loose file, so reading the loose ref first and then
    ``packed-refs`` sees the old or the new value, each complete.  A sync writes the ref
    only after every object of the fetch is in and connectivity was checked, so every
    commit reachable from the returned sha is in the mirror (``gc.auto=0``: nothing is
    pruned later)."""
    if not (path / "HEAD").is_file():
        return None
    try:
        loose = (path / HEAD_REF).read_bytes().strip()
    except OSError:
        loose = b""
    if loose:
        return loose.decode("ascii", "replace") if _SHA.fullmatch(loose) else None
    try:
        packed = (path / "packed-refs").read_bytes()
    except OSError:
        return None
    suffix = b" " + HEAD_REF.encode()
    for line in packed.splitlines():
        if line.endswith(suffix):
            sha = line[: -len(suffix)]
            return sha.decode("ascii") if _SHA.fullmatch(sha) else None
    return None


#: ``<sha> <max object bytes>``: every object reachable from that commit passed the
#: per-object size check under that limit (``check_limits``).  Inside the mirror, so a
#: discarded or re-cloned mirror loses it with its objects.
CHECKED_FILE = "gitward-checked"


def _checked_head(git_dir: Path, max_object_bytes: int | None) -> str | None:
    """The commit from which every reachable object is known to be within
    ``max_object_bytes`` (None: scan everything).  A marker written under a larger
    limit (the limit was lowered since) proves nothing and is ignored."""
    if max_object_bytes is None:
        return None
    try:
        sha, limit = (git_dir / CHECKED_FILE).read_text("ascii").split()
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    if not _SHA.fullmatch(sha.encode()) or not limit.isdigit() or int(limit) > max_object_bytes:
        return None
    return sha


def _record_checked(git_dir: Path, max_object_bytes: int | None) -> None:
    """After a passed check: the head it covered becomes the next check's starting point.

    Safe against crashes: written aside and renamed in (a reader sees the old or the new
    marker), and only after the check passed, so a sync that dies between its fetch and
    its check leaves the older marker and the next check covers the unchecked objects
    (``rev-list tip ^older`` lists them, however they got into the mirror: a later fetch
    that finds them present transfers nothing).  Only writers of the mirror, under its
    host lock, read or write the marker.  No limit, nothing checked: the marker stays."""
    head = mirror_head(git_dir)
    if max_object_bytes is None or head is None:
        return
    tmp = git_dir / f"{CHECKED_FILE}.tmp"
    tmp.write_text(f"{head} {max_object_bytes}\n", "ascii")
    os.replace(tmp, git_dir / CHECKED_FILE)


def _check_branch(branch: str) -> None:
    """Defence in depth behind ``normalise_branch`` (docs/security.md#g3): the branch
    only ever appears inside a refspec after ``--end-of-options``, and must be exactly
    what the submission check returns for it. The same rules, not stricter ones: a
    branch accepted at submission (``ｍａｉｎ``, ``fix#1``: git's own rules allow them)
    must not fail here for good."""
    if not branch:
        return
    try:
        same = normalise_branch(branch) == branch
    except InvalidRemote:
        same = False
    if not same:
        raise RepositoryUnavailable(f"invalid branch name {branch[:80]!r}")


def _refspec(branch: str) -> str:
    _check_branch(branch)
    source = f"refs/heads/{branch}" if branch else "HEAD"
    return f"+{source}:{HEAD_REF}"


def _fetch(
    runner: Runner,
    git_dir: Path,
    git_url: str,
    branch: str,
    timeout: float,
    pin_args: Sequence[str] = (),
) -> None:
    args = [
        *pin_args,
        "--git-dir",
        str(git_dir),
        "fetch",
        "--quiet",
        "--no-tags",
        "--no-write-fetch-head",
        "--no-recurse-submodules",
        # A shallow remote (a --depth clone) can only be fetched if its shallow roots
        # are accepted; without this git rejects the ref and still exits 0.  The mirror
        # is then shallow too, and analysed as git log shows it there (README).
        "--update-shallow",
        "--end-of-options",
        git_url,
        _refspec(branch),
    ]
    try:
        runner.run(args, timeout=timeout)
    except GitError as exc:
        limited, retry_after = rate_limited(exc.stderr)
        if exc.returncode is not None and exc.returncode != 0 and limited:
            raise RateLimited(
                "the repository host refused with a rate limit (HTTP 429)",
                retry_after=retry_after,
                returncode=exc.returncode,
                stderr=exc.stderr,
            ) from None
        if exc.returncode is not None and exc.returncode != 0 and is_permanent(exc.stderr):
            raise RepositoryUnavailable(
                readable(exc.stderr, branch), returncode=exc.returncode, stderr=exc.stderr
            ) from None
        raise


def sync_mirror(
    *,
    workspace: Path,
    repo_id: int,
    git_url: str,
    branch: str,
    runner: Runner,
    timeout: float,
    pinned: Mapping[str, Sequence[str]] | None = None,
    max_repo_bytes: int | None = DEFAULT_MAX_REPO_BYTES,
    max_object_bytes: int | None = DEFAULT_MAX_OBJECT_BYTES,
    check: Check | None = None,
    wait: float | None = None,
    sanitized: bool = False,
    fetch_slot: Callable[[], AbstractContextManager[object]] | None = None,
) -> str:
    """Bring the mirror up to date and return the analysed head sha.

    ``sanitized``: the caller ran :func:`sanitize_mirror` under the host lock it still
    holds, so a mirror at the path is known to open (one ``rev-parse`` fewer).

    ``pinned`` (``{"host:port": [addresses]}``, see :func:`pins_for`) makes curl connect
    only to those addresses.  ``max_repo_bytes`` bounds every file git writes while
    fetching (RLIMIT_FSIZE) and the mirror's size afterwards; ``max_object_bytes`` bounds
    any one object.  Over a limit: :class:`RepositoryTooLarge`, and nothing is kept.
    ``branch`` must be a plain branch name ("" = the remote's HEAD): anything else, in
    particular a leading ``-``, raises :class:`RepositoryUnavailable` before git runs.

    ``fetch_slot``: entered around the ``git fetch`` itself (not the limit scans), to
    hold the remote host's fetch slot (``workers.git.fetch_limits.FetchGate.slot``,
    docs/scheduling.md#per-host-fetch-limits); taken under the host lock, so no slot is
    held while waiting for another writer of this mirror.

    Holds the host lock throughout (:func:`hold_mirror`, waiting at most ``wait``);
    ``check`` runs before the fetch and before every delete or rename, so a lost lease
    raises there and leaves the mirror as it was.

    1. If a valid mirror exists, ``git fetch`` into it (objects first, then the ref
       update, which git does atomically: readers never see a half-updated ref).
    2. Otherwise build a fresh bare repository in ``workspace/tmp``, fetch into it, and
       ``rename`` it into place only when complete, so a crash leaves at most a stray
       temporary directory (removed by ``remove_stale_temporaries``), never a
       half-written mirror at the real path.
    """
    _check_branch(branch)
    if not git_url or git_url.startswith("-") or any(c in git_url for c in "\r\n\0"):
        raise RepositoryUnavailable(f"invalid repository URL {git_url[:80]!r}")
    pin_args = _resolve_config(pinned)
    fetcher = runner.limited(max_repo_bytes)
    check = check or unchecked

    def fetch_checked(git_dir: Path) -> None:
        try:
            with fetch_slot() if fetch_slot is not None else contextlib.nullcontext():
                check()  # the lease may have lapsed while waiting for the slot
                _fetch(fetcher, git_dir, git_url, branch, timeout, pin_args)
        except GitError as exc:
            if "exceeded the limit" in str(exc) and not isinstance(exc, RepositoryUnavailable):
                raise RepositoryTooLarge(
                    f"repository is larger than the limit of {human(max_repo_bytes or 0)} "
                    "(fetch stopped)",
                    returncode=exc.returncode,
                    stderr=exc.stderr,
                ) from None
            raise

        def limits(checked: str | None) -> None:
            check_limits(
                runner,
                git_dir,
                max_repo_bytes=max_repo_bytes,
                max_object_bytes=max_object_bytes,
                timeout=timeout,
                tip=HEAD_REF,
                checked=checked,
            )

        checked = _checked_head(git_dir, max_object_bytes)
        try:
            # only what this fetch (or an unchecked earlier one) added, if a marker says
            # where the last passed check ended
            limits(checked)
        except RepositoryTooLarge:  # a GitError too, but a verdict, not a failed scan
            raise
        except GitError:
            if checked is None:
                raise
            check()  # a lost lease killed the scan: stop here, not in a second scan
            limits(None)  # the marker names a commit git cannot walk from: scan all
        _record_checked(git_dir, max_object_bytes)

    path = mirror_path(workspace, repo_id)
    with hold_mirror(workspace, repo_id, check=check, wait=wait):
        check()
        if path.exists() and (sanitized or is_valid(path, runner)):
            # Analyses may be reading this mirror right now: a fetch is safe for them
            # (module docstring: new objects become visible complete, the ref moves by
            # an atomic rename).
            try:
                fetch_checked(path)
            except RepositoryTooLarge:
                # The objects are in; a too-large mirror is not kept, by its lease holder.
                check()
                _discard(workspace, repo_id, path)
                raise
        else:
            tmp = new_temporary(workspace, repo_id)
            try:
                runner.run(["init", "--quiet", "--bare", "--template=", str(tmp)], timeout=60)
                # HEAD names the analysed ref: git reads .mailmap from HEAD in a bare repo.
                runner.run(["--git-dir", str(tmp), "symbolic-ref", "HEAD", HEAD_REF], timeout=60)
                fetch_checked(tmp)
                path.parent.mkdir(parents=True, exist_ok=True)
                # Check, then replace: the lease may lapse just after the check, but the
                # host lock still excludes every other writer of this mirror (they all run
                # on this host), and a stale holder's database write is fenced off.
                check()
                _replace(workspace, repo_id, tmp, path)
            finally:
                # Our own temporary (a fresh uuid, unknown to anyone else): removing it
                # needs no lease.
                if tmp.exists():
                    shutil.rmtree(tmp, ignore_errors=True)
        out = runner.run(
            ["--git-dir", str(path), "rev-parse", "--verify", f"{HEAD_REF}^{{commit}}"],
            timeout=60,
        )
    return out.strip()


def update_mirror(
    *,
    workspace: Path,
    repo_id: int,
    git_url: str,
    branch: str,
    runner: Runner,
    timeout: float,
    pinned: Mapping[str, Sequence[str]] | None = None,
    check: Check | None = None,
    wait: float | None = None,
    fetch_slot: Callable[[], AbstractContextManager[object]] | None = None,
) -> str:
    """:func:`sanitize_mirror` then :func:`sync_mirror` under one hold of the host lock
    (nobody on this host gets in between); return the analysed head sha.  Call under the
    repository's Redis mirror lock, with its ``check``."""
    with hold_mirror(workspace, repo_id, check=check, wait=wait):
        sanitize_mirror(workspace=workspace, repo_id=repo_id, runner=runner, check=check)
        return sync_mirror(
            workspace=workspace,
            repo_id=repo_id,
            git_url=git_url,
            branch=branch,
            runner=runner,
            timeout=timeout,
            pinned=pinned,
            check=check,
            # sanitize_mirror removed the mirror unless it opens, under this same hold
            # of the host lock, so no other writer on this host got in between
            sanitized=True,
            fetch_slot=fetch_slot,
        )


def _discard(workspace: Path, repo_id: int, path: Path) -> None:
    """Remove a mirror: first move it aside (one rename), then delete it.  A reader that
    has files open keeps reading them; a new reader finds no mirror, never half of one."""
    old = new_temporary(workspace, repo_id)
    try:
        os.rename(path, old)
    except OSError:
        old = path
    shutil.rmtree(old, ignore_errors=True)


def _replace(workspace: Path, repo_id: int, new: Path, path: Path) -> None:
    """Put the complete clone ``new`` at ``path``, moving a (corrupt or foreign) leftover
    aside first: the real path is empty only between two renames."""
    old = new_temporary(workspace, repo_id) if path.exists() else None
    if old is not None:
        os.rename(path, old)
    os.rename(new, path)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def packs_intact(path: Path) -> bool:
    """Cheap integrity check of every packfile: its trailing SHA-1 must equal the pack
    checksum recorded in its ``.idx`` (O(1) per pack; a truncated or overwritten pack
    fails it). Loose objects and refs are verified by ``is_valid``.

    A ``.pack`` without its ``.idx`` is skipped, not failed: git does not use it (the
    index is renamed in after the pack), so it is a fetch in progress or a dead writer's
    leftover for :func:`remove_stale_files`, never a sign of a corrupt mirror."""
    pack_dir = path / "objects" / "pack"
    if not pack_dir.is_dir():
        return True
    for pack in pack_dir.glob("*.pack"):
        idx = pack.with_suffix(".idx")
        try:
            with pack.open("rb") as p, idx.open("rb") as i:
                p.seek(-20, os.SEEK_END)
                i.seek(-40, os.SEEK_END)
                if p.read(20) != i.read(20):
                    return False
        except FileNotFoundError:
            continue  # no index (yet): not part of the repository
        except OSError:
            return False
    return True


def sanitize_mirror(
    *,
    workspace: Path,
    repo_id: int,
    runner: Runner,
    check: Check | None = None,
    wait: float | None = None,
    stale_after: float = STALE_AFTER,
    clock: Callable[[], float] = time.time,
) -> dict[str, object]:
    """Repair a repository's workspace before writing to it (docs/lifecycle.md). Call under the
    Redis mirror lock, with its ``check``; takes the host lock itself (waiting at most
    ``wait``, then :class:`MirrorBusy`) and holds it throughout.

    1. Delete half-finished clones left in ``workspace/tmp`` by a dead holder.
    2. Delete what dead git processes left in the mirror
       (:func:`~workers.git.sanitation.remove_stale_files`): lock files however young,
       object leftovers once ``stale_after`` old.
    3. Verify the mirror opens and its packs are intact; a corrupt mirror is removed
       so that the sync re-clones it (the clone is built aside and renamed in).
    ``check`` runs before every deletion: a lost lease raises there, and what is left
    is as it was.  Mirrors are bare, so there is no work tree to clean or reset.
    """
    check = check or unchecked
    path = mirror_path(workspace, repo_id)
    with hold_mirror(workspace, repo_id, check=check, wait=wait):
        report: dict[str, object] = {
            "temporaries": remove_stale_temporaries(workspace, repo_id, check=check),
            "stale": remove_stale_files(
                workspace, repo_id, check=check, stale_after=stale_after, clock=clock
            ),
            "recloned": False,
        }
        if path.exists() and not (packs_intact(path) and is_valid(path, runner)):
            # is_valid also fails when a lost lease got its git killed: check first.
            check()
            _discard(workspace, repo_id, path)
            report["recloned"] = True
    return report
