"""workers.runtime.process_tree on real processes: a tree found by parent pid (across the process
groups and sessions RQ and git use), killed whole, and a child that dies with its parent."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from workers.runtime.process_tree import descendants, kill_tree

# A parent whose child starts its own session (as git does under a work horse) and a
# grandchild below that: no process group or session holds all three.
TREE = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import subprocess, sys, time\\n"
    "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\\n"
    "print(g.pid, flush=True)\\n"
    "time.sleep(300)"], stdout=subprocess.PIPE, text=True, start_new_session=True)
print(child.pid, child.stdout.readline().strip(), flush=True)
time.sleep(300)
"""

ORPHAN = """
import os, signal, sys, time
from workers.runtime.process_tree import die_with_parent
parent = os.getpid()
pid = os.fork()
if pid == 0:
    die_with_parent(parent)
    time.sleep(300)
    os._exit(0)
print(pid, flush=True)
time.sleep(300)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait_gone(pids: list[int], timeout: float = 20) -> list[int]:
    deadline = time.monotonic() + timeout
    while (alive := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


def test_the_whole_tree_is_found_and_killed_across_sessions() -> None:
    root = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True)
    try:
        assert root.stdout is not None
        child, grandchild = map(int, root.stdout.readline().split())
        assert os.getsid(child) != os.getsid(root.pid)  # not one session: found by ppid
        assert set(descendants(root.pid)) >= {child, grandchild}
        killed = kill_tree(root.pid)
        assert set(killed) >= {root.pid, child, grandchild}
        root.wait(timeout=20)
        assert _wait_gone([child, grandchild]) == []
    finally:
        if root.poll() is None:
            root.kill()
            root.wait()


def test_a_gone_process_has_no_tree() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert kill_tree(proc.pid) == [] and descendants(proc.pid) == []


def test_a_child_tied_to_its_parent_dies_when_the_parent_is_killed() -> None:
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    parent = subprocess.Popen(
        [sys.executable, "-c", ORPHAN], stdout=subprocess.PIPE, text=True, env=env
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    assert _alive(child)
    parent.kill()  # SIGKILL: the parent runs no clean-up of its own
    parent.wait()
    assert _wait_gone([child]) == [], "the child outlived its parent"
