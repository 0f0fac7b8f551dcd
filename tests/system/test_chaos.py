"""The chaos script in its short mode: ``manage.py up`` with 2 workers over 3 Redis
masters, workers and work horses SIGKILLed, masters restarted empty and flushed, for
~20 s; afterwards every repository is ready, every commit git reports is stored exactly
once and nothing is left behind. The script does its own set-up (repositories, Redis
nodes, database) in a temporary directory, so this test needs no fixture."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_short_chaos_run_loses_nothing_duplicates_nothing_leaves_nothing() -> None:
    result = subprocess.run(
        [sys.executable, "bench/chaos.py", "--short", "--seed", "7"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = result.stdout + result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("chaos: ")]
    assert lines, output[-5000:]
    summary = dict(re.findall(r"(\w+)=(-?\d+)", lines[-1]))
    assert result.returncode == 0, output[-5000:]
    assert summary["lost_work"] == "0", lines[-1]
    assert summary["duplicate_rows"] == "0", lines[-1]
    assert summary["leftovers"] == "0", lines[-1]
    assert int(summary["kills"]) > 0, lines[-1]
    assert int(summary["restarts"]) > 0, lines[-1]
    # The queue node (REDIS_URL, lock master 1 here) killed and stalled: never a 5xx.
    assert int(summary["queue_kills"]) > 0 and int(summary["queue_stalls"]) > 0, lines[-1]
    assert summary["server_errors"] == "0", lines[-1]
    assert int(summary["runs"]) > 0 and int(summary["attempts"]) >= int(summary["runs"])
