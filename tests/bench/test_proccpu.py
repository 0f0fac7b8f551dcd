"""bench/proccpu.py: a process tree's CPU by role, its reaped children included."""

from __future__ import annotations

import subprocess
import sys

from bench.proccpu import by_role, role_of, snapshot

#: A parent that starts a child burning CPU, reaps it, then waits to be ended.
PARENT = """
import subprocess, sys, time
subprocess.run([sys.executable, "-c", "import time\\nt = time.process_time()\\n"
                "while time.process_time() - t < 0.6: pass"], check=True)
print("reaped", flush=True)
time.sleep(60)
"""


def test_a_reaped_childs_cpu_counts_for_its_parents_role() -> None:
    before = snapshot(0)  # nothing: pid 0 is no process of ours
    proc = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    try:
        first = snapshot(proc.pid)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "reaped"
        after = snapshot(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    used = by_role(first, after)
    assert used.get("other", 0.0) >= 0.5  # the child's 0.6 s, through the parent's cutime
    only = {k: v for k, v in by_role(before, after).items() if k != "postgres"}
    assert only.get("other", 0.0) >= 0.5  # born in the window: all of it counts
    assert sum(by_role(after, after).values()) == 0.0


def test_roles_come_from_the_command_line() -> None:
    assert role_of(["/usr/bin/redis-server", "127.0.0.1:6400"]) == "redis"
    assert role_of(["python", "manage.py", "worker", "--workers", "1"]).startswith("workers")
    assert role_of(["python", "-c", "from multiprocessing.spawn import spawn_main"]) == (
        "web processes"
    )
    assert role_of(["python", "manage.py", "up", "--workers", "4"]).startswith("up")
    assert role_of(["postgres: postgres test 127.0.0.1 idle"]) == "postgres"
    assert role_of([]) == "other"
