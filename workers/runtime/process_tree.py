"""A process and everything it started: found, killed, and tied to its parent's life.

A worker process forks a work horse per job (RQ puts the horse in a process group of
its own) and the horse starts git in sessions of their own, so no process group or
session holds a worker's whole tree. The tree is found by parent pid instead
(``/proc``, Linux), and the horse is made to die with its worker
(``PR_SET_PDEATHSIG``) so that killing a worker from outside — the pool's grace ran
out, an orchestrator's SIGKILL, a whole host killed — cannot leave a horse writing.
On a system without ``/proc`` or ``prctl`` both degrade to the process itself.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
from pathlib import Path

_PR_SET_PDEATHSIG = 1
_LIBC_NAME = ctypes.util.find_library("c")
#: Loaded at import (in the worker), never in a freshly forked child.
_LIBC = ctypes.CDLL(_LIBC_NAME, use_errno=True) if _LIBC_NAME else None


def _parents() -> dict[int, int]:
    """``{pid: ppid}`` of every process now (empty without ``/proc``)."""
    out: dict[int, int] = {}
    try:
        entries = list(Path("/proc").iterdir())
    except OSError:
        return out
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            # The command name (in parentheses) may hold spaces: split after its end.
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        out[int(entry.name)] = int(fields[1])
    return out


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (children first, then theirs)."""
    kids: dict[int, list[int]] = {}
    for child, parent in _parents().items():
        kids.setdefault(parent, []).append(child)
    found: list[int] = []
    todo = list(kids.get(pid, []))
    while todo:
        p = todo.pop(0)
        found.append(p)
        todo += kids.get(p, [])
    return found


def kill_tree(pid: int, sig: int = signal.SIGKILL) -> list[int]:
    """Send ``sig`` to ``pid`` and every process below it; the pids signalled.

    Race: a process may fork between the scan and the kill. The root is stopped
    (SIGSTOP) before the scan so it cannot start another child, and the horse dies
    with its worker anyway (``die_with_parent``); git dies with its horse the same way
    (``workers.git.runner.death_prefix``)."""
    try:
        os.kill(pid, signal.SIGSTOP)
    except ProcessLookupError:
        return []
    tree = [pid, *descendants(pid)]
    for p in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, sig)
    if sig != signal.SIGKILL:  # a stopped root would never act on a catchable signal
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    return tree


def die_with_parent(parent: int, sig: int = signal.SIGKILL) -> None:
    """Have the kernel send ``sig`` to this process when its parent dies; exit at once
    if the parent (pid ``parent``, taken before the fork) is already gone.

    Called in a freshly forked child: one system call, no allocation. The signal follows
    the parent *thread* that forked: the worker forks horses from its main thread, which
    lives as long as the worker."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
    # Race: the parent may have died between the fork and the prctl; then we were
    # re-parented already and no signal will come, so go now.
    if os.getppid() != parent:
        os._exit(1)
