"""``bench/analytics.py`` on a small synthetic history: it runs end to end with gitward's
own pipeline and prints every view for every window beside its git anchor. Nothing about
speed is asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VIEWS = {
    "anchor: git log --numstat", "coupling (files)", "coupling (directories, depth 2)",
    "coupled with the top hotspot", "ownership (files)", "ownership (directories)",
    "knowledge at risk", "age (files)", "age (directories)", "hotspots (files)",
    "hotspots (directories)",
}  # fmt: skip


def test_the_script_times_every_view_in_every_window() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "analytics.py"), "--commits", "300", "--rounds", "1"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert out["stored_commits"] == 300 and out["vendor"] == "sqlite3"
    for window in ("whole history", "last 365 days", "last 90 days"):
        assert set(out[window]) == VIEWS | {"commits"}, window
        assert all(out[window][v]["median_ms"] > 0 for v in VIEWS)
    assert out["whole history"]["commits"] >= out["last 90 days"]["commits"] > 0
