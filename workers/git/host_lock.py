"""A mirror's host lock: an exclusive ``flock(2)`` on ``workspace/mirrors/{id}.flock``.

Every gitward function that writes a mirror holds it (:func:`hold_mirror`), on top of the
repository's Redis lock.  Each host has its own workspace, so the processes that can touch
one mirror all run on one host, and the host lock excludes them from each other whatever
Redis says: a master restarted empty, a force release of a live holder or a paused
process can make two Redis holders, never two writers.

The lock belongs to the holding process's open file description (``O_CLOEXEC``: no git
child inherits it) and ends when the body ends or the process dies.  Every git gitward
starts dies with the process that started it (``setpriv --pdeathsig KILL``,
``workers.git.runner``), so once the lock is ours no git of an earlier holder is writing;
only git's own helpers (``index-pack``), which do not inherit that signal, may still be
finishing a pack (what that means for leftovers: ``workers.git.sanitation``).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from workers.git.workspace import host_lock_path
from workers.locks import LockNotAcquired

#: How long a writer waits for another process on this host to let go of a mirror's host
#: lock before giving up with :class:`MirrorBusy` (the job defers and retries).  Outside
#: faults the Redis lock already serialises writers and the host lock is free; it is held
#: by someone else only while two processes believe they hold the lease, until the stale
#: one notices (its heartbeat fails, its git is killed, it lets go) or finishes.
HOST_LOCK_WAIT = 30.0

#: A lease check: returns while the caller's lease is valid, raises (``LockLost``) after.
Check = Callable[[], None]

log = logging.getLogger(__name__)


class MirrorBusy(LockNotAcquired):
    """Another process on this host held the mirror's host lock for the whole wait.

    A :class:`~workers.locks.LockNotAcquired`: the job layer defers the attempt and retries
    it later, as for a contended Redis lock (no attempt is spent, nothing was touched)."""

    def __init__(self, lock_path: Path, holder: str, waited: float) -> None:
        super().__init__([str(lock_path)], {"host": f"busy, held by {holder}"}, attempts=1)
        self.lock_path = lock_path
        self.holder = holder
        self.args = (
            f"mirror host lock {lock_path} still held by {holder} after waiting {waited:.1f}s",
        )


def unchecked() -> None:
    """The check of a caller without a lease (tools, tests): never raises."""


#: Host-lock files this thread holds (``hold_mirror`` is re-entrant per thread).
_held = threading.local()


@contextlib.contextmanager
def hold_mirror(
    workspace: Path, repo_id: int, *, check: Check | None = None, wait: float | None = None
) -> Iterator[Path]:
    """Hold the mirror's host lock (an exclusive ``flock``) for the ``with`` body.

    Waits at most ``wait`` seconds (default :data:`HOST_LOCK_WAIT`), polling, and calls
    ``check`` before every try and once more after acquiring, so a lease lost while
    waiting raises ``LockLost`` instead of going on; after the wait: :class:`MirrorBusy`.
    Re-entrant within one thread (an inner ``hold_mirror`` of the same mirror is free);
    other threads and processes wait.  The lock belongs to this process's open file
    description (``O_CLOEXEC``: git children do not inherit it) and ends when the body
    ends or the process dies; git dies with its worker (``setpriv --pdeathsig``), so no
    git of a dead holder can still be writing when the next holder gets in (its helpers
    aside: module docstring).
    """
    lock_path = host_lock_path(workspace, repo_id)
    name = os.path.abspath(lock_path)
    held: set[str] = _held.__dict__.setdefault("paths", set())
    if name in held:
        yield lock_path
        return
    fd = _acquire(lock_path, check or unchecked, HOST_LOCK_WAIT if wait is None else wait)
    held.add(name)
    try:
        yield lock_path
    finally:
        held.discard(name)
        os.close(fd)  # releases the flock


def _acquire(lock_path: Path, check: Check, wait: float) -> int:
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        start = time.monotonic()
        pause = 0.005
        announced = False
        while True:
            check()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                pass
            waited = time.monotonic() - start
            if waited >= wait:
                raise MirrorBusy(lock_path, _read_holder(fd), waited)
            if not announced:
                log.info(
                    "mirror host lock %s held by %s: waiting up to %.1fs",
                    lock_path,
                    _read_holder(fd),
                    wait,
                )
                announced = True
            time.sleep(min(pause, wait - waited))
            pause = min(pause * 2, 0.1)
        # The lease may have run out while we waited: nothing may be written without it.
        check()
        # Who holds it, for the next waiter's message (diagnostics only: a waiter may
        # read it half-written, which costs nothing but a less helpful message).
        os.ftruncate(fd, 0)
        since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since {since}\n".encode(), 0)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _read_holder(fd: int) -> str:
    try:
        text = os.pread(fd, 256, 0).decode("utf-8", "replace").strip()
    except OSError:
        text = ""
    return text or "another process"
