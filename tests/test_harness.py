"""The test harness's own checks (tests/conftest.py, tests/sysproc.py): the leftover-
process check finds what a test started even once its parent is gone."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from tests.sysproc import proc_state, processes_of


def test_processes_of_finds_an_orphan_by_the_marker_it_inherited() -> None:
    # sh starts a sleep in the background and exits: the sleep is re-parented (to init
    # or a subreaper), so only the inherited environment marker still says it is ours.
    out = subprocess.run(
        ["sh", "-c", "sleep 120 >/dev/null 2>&1 & echo $!"],
        capture_output=True,
        text=True,
        check=True,
    )
    orphan = int(out.stdout)
    try:
        assert os.getppid() != orphan
        found = processes_of(str(os.getpid()), os.getpid())
        assert orphan in found and found[orphan] == "sleep 120"
        assert os.getpid() not in found
        assert processes_of("someone-else", 1 << 22).get(orphan) is None
    finally:
        os.kill(orphan, signal.SIGKILL)  # ours: its pid was printed by the sh we started


def test_processes_of_skips_zombies() -> None:
    proc = subprocess.Popen(["true"])
    try:
        while proc_state(proc.pid) not in ("Z", "gone"):
            time.sleep(0.01)  # until it exited (it is not reaped before the wait)
        assert proc.pid not in processes_of(str(os.getpid()), os.getpid())
    finally:
        proc.wait()
