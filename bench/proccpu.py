"""CPU seconds of a process tree, by role, over a window (Linux ``/proc``).

``snapshot(root)`` reads, for ``root`` and every descendant, its own CPU (utime + stime)
and what its reaped children used (cutime + cstime: a worker's reaped work horses and,
through them, their git), with a role from its command line. ``by_role(before, after)``
sums per role what each process used between the two: a process seen in both counts the
difference, one born in the window counts everything, one that ended in the window is
lost (its parent's cutime gets it only if the parent is in both snapshots and reaped it).
Processes named ``postgres`` anywhere on the machine are one more role, so a PostgreSQL
run shows the database server's share too (other clients of that server count as well).
"""

from __future__ import annotations

import os
from pathlib import Path

from bench.procstat import ProcStat, read_stat

#: (pid, start time) → (role, own CPU s, reaped children's CPU s)
Snapshot = dict[tuple[int, int], tuple[str, float, float]]


def role_of(argv: list[str]) -> str:
    """What a process is, from its command line."""
    text = " ".join(argv)
    if not argv:
        return "other"
    if "redis-server" in argv[0]:
        return "redis"
    if os.path.basename(argv[0]).startswith("postgres"):
        return "postgres"
    if "manage.py" in text and " worker" in text:
        return "workers (with their horses and git)"
    if "multiprocessing" in text or "spawn_main" in text:
        return "web processes"
    if "manage.py" in text and " up" in text:
        return "up (supervisor, reconciler)"
    return "other"


def _argv(pid: int) -> list[str]:
    try:
        return [a for a in Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0") if a]
    except OSError:
        return []


def snapshot(root: int) -> Snapshot:
    table: dict[int, ProcStat] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (st := read_stat(int(entry.name))) is not None:
            table[int(entry.name)] = st
    children: dict[int, list[int]] = {}
    for pid, st in table.items():
        children.setdefault(st.ppid, []).append(pid)
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        if pid in table:
            tree.append(pid)
            todo.extend(children.get(pid, []))
    out: Snapshot = {}
    for pid in tree:
        st = table[pid]
        out[(pid, st.start)] = (role_of(_argv(pid)), st.own_cpu, st.children_cpu)
    for pid, st in table.items():
        if (pid, st.start) not in out and role_of(_argv(pid)) == "postgres":
            out[(pid, st.start)] = ("postgres", st.own_cpu, st.children_cpu)
    return out


def by_role(before: Snapshot, after: Snapshot) -> dict[str, float]:
    """CPU seconds per role used between the snapshots (see the module docstring)."""
    used: dict[str, float] = {}
    for key, (role, own, reaped) in after.items():
        was = before.get(key)
        delta = own + reaped - ((was[1] + was[2]) if was else 0.0)
        used[role] = used.get(role, 0.0) + max(0.0, delta)
    return used
