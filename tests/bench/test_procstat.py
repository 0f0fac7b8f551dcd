"""bench/procstat.py: one process's /proc stat line, read for real."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from bench.procstat import read_stat

#: A child that renames itself (its comm: spaces and parentheses, as any program may
#: call itself), burns a little CPU, reports and waits to be ended.
RENAMED = """
import time
with open("/proc/self/comm", "w") as f:
    f.write("a) b (c) d")
t = time.process_time()
while time.process_time() - t < 0.3:
    pass
print("burnt", flush=True)
time.sleep(60)
"""


def test_it_reads_a_process_whose_name_holds_parentheses_and_spaces() -> None:
    proc = subprocess.Popen([sys.executable, "-c", RENAMED], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "burnt"
        st = read_stat(proc.pid)
        assert st is not None
        assert st.ppid == os.getpid() and st.state in {"S", "R"}
        assert st.own_cpu >= 0.25 and st.children_cpu == 0.0
        os.kill(proc.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while (stopped := read_stat(proc.pid)) is not None and stopped.state != "T":
            assert time.monotonic() < deadline, "the child never showed as stopped"
            time.sleep(0.01)
        assert stopped is not None and stopped.start == st.start  # the same process
    finally:
        proc.kill()
        proc.wait()
    assert read_stat(proc.pid) is None  # reaped: no such process


def test_a_parent_counts_the_cpu_of_the_children_it_reaped() -> None:
    before = read_stat(os.getpid())
    subprocess.run(
        [sys.executable, "-c", "import time\nt = time.process_time()\n"
         "while time.process_time() - t < 0.3: pass"],
        check=True,
    )  # fmt: skip
    after = read_stat(os.getpid())
    assert before is not None and after is not None
    assert after.children_cpu - before.children_cpu >= 0.25
    assert after.start == before.start
