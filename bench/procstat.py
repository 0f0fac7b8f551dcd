"""A process's line of ``/proc/<pid>/stat`` (Linux), read one way for every bench script
(``bench/proccpu.py``'s CPU by role, ``bench/chaos.py``'s process table and kills).

The command name (field 2) is in parentheses and may itself hold spaces and ``)``, so the
fields are counted from the *last* ``)``; ``proc(5)`` numbers them from 1 (pid), this
module from the state (field 3).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

_TICK = os.sysconf("SC_CLK_TCK")


class ProcStat(NamedTuple):
    """What the bench scripts read of one process."""

    ppid: int
    #: One letter: R running, S sleeping, T stopped, Z zombie, …
    state: str
    #: Clock ticks after boot at which it started: with the pid, which process this is
    #: (a pid is reused; the pair is not).
    start: int
    #: CPU seconds it used itself (utime + stime).
    own_cpu: float
    #: CPU seconds of its children it waited for (cutime + cstime).
    children_cpu: float


def read_stat(pid: int) -> ProcStat | None:
    """``pid``'s stat, or None if there is no such process (any more)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
        fields = raw[raw.rindex(")") + 2 :].split()  # after "pid (comm) "
        return ProcStat(
            ppid=int(fields[1]),
            state=fields[0],
            start=int(fields[19]),
            own_cpu=(int(fields[11]) + int(fields[12])) / _TICK,
            children_cpu=(int(fields[13]) + int(fields[14])) / _TICK,
        )
    except (OSError, ValueError, IndexError):  # gone, or gone while being read
        return None
