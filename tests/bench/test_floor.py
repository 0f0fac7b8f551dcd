"""``bench/floor.py`` (the two-core floor under the wall-time goals of BENCHMARKS.md) on a small
real history: it runs end to end, its git parts cover the whole history, and its
"SQLite alone" figure re-inserts exactly the rows the chunk writes stored (the script
refuses to print a figure for a copy that differs). Nothing about speed is asserted."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from bench.analysis import build_repository, git_out
from bench.floor import git_split, split_history

ROOT = Path(__file__).resolve().parents[2]


def test_the_history_is_cut_into_contiguous_parts_covering_it_once() -> None:
    shas = [f"{i:040x}" for i in range(10)]
    for parts in range(1, 11):
        cut = split_history(shas, parts)
        assert len(cut) == parts and [s for p in cut for s in p] == shas
        assert max(map(len, cut)) - min(map(len, cut)) <= 1
    assert split_history(shas, 3) == [shas[:4], shas[4:7], shas[7:]]


def test_git_runs_over_a_real_history_in_parts(tmp_path: Path) -> None:
    build_repository(tmp_path / "r", 120, 4, repack=False)
    assert len(git_out(tmp_path / "r", "rev-list", "HEAD").split()) == 120
    wall, cpu = git_split(tmp_path / "r", 3, runs=1)
    assert wall > 0 and cpu > 0


def test_the_script_prints_the_floor_and_the_transfer_for_a_small_history(
    tmp_path: Path,
) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "floor.py"), "--commits", "300", "--seed", "5"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout
    stored = re.search(r"the same (\d+) commit and (\d+) file rows", text)
    assert stored is not None, text
    assert int(stored.group(1)) == 300 and int(stored.group(2)) > 0
    assert re.search(r"\(d\) floor with zero per-job cost .* = [0-9.]+x a", text), text
    transfer = r"hardened transfer alone .* = [0-9.]+x the local anchor, [0-9.]+x the --no-local"
    assert re.search(transfer, text), text
