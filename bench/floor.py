"""Benchmark: the two-core floor under the wall-time goals, measured in one run.

The goals (BENCHMARKS.md) are (1) whole-history analysis from an existing mirror in <= 0.75x the
wall time of one ``git log --numstat --no-renames --diff-merges=first-parent``, and
(2) a fresh submission in <= 1.0x ``git clone --bare`` + that ``git log``. This script
does not run gitward end to end (``bench/analysis.py`` does); it measures, side by side
on the same repository, the parts no implementation of the contract can skip, and the
best wall time they allow on this machine's cores:

  (a) anchor: one ``git log`` (``bench/analysis.bench_git_log``: gitward's own format,
      median of 3 after a warm-up), wall and CPU;
  (b) git alone, split as well as the cores allow: the history's shas cut into one
      contiguous part per core, one ``git log --no-walk=unsorted --stdin`` per part (the
      command a chunk runs), all at once; wall and CPU. No chunking can need less git;
      gitward's own chunks (smaller, more processes) need a little more;
  (c) the Python steps at today's cost, per step (``bench/analysis.stages_child``: list
      and plan, then per chunk parse and write with the production chunk target, in a
      fresh process, SQLite);
  (d) the floor: ``max(b_wall, (b_cpu + c_cpu) / cores)`` -- the wall time with zero
      per-job cost (no RQ job, lock, token, event or bookkeeping row) and perfect overlap
      of every step on every core. Printed as a ratio to (a), beside the goal, and the
      Python CPU the goal leaves once git has had its share;
  (e) fresh: the anchor ``git clone --bare`` (local: it hard-links the objects; and
      ``--no-local``: a real pack transfer, what a clone from a URL does) + one
      ``git log``, against gitward's hardened transfer alone
      (``workers.git.mirror.sync_mirror``, the sync job's own code: a pack transfer
      with ``transfer.fsckObjects`` and the rest of the hardening, then the mirror's
      size checks), no analysis at all.

Nothing is asserted; the figures go to BENCHMARKS.md.

    .venv/bin/python bench/floor.py [--commits 20000] [--seed 1] [--merge-share F]
        [--repo PATH] [--cores 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import analysis  # bench/analysis.py, the sibling script

_children_cpu = analysis._children_cpu


def split_history(shas: list[str], parts: int) -> list[list[str]]:
    """``shas`` (oldest first) cut into ``parts`` contiguous runs whose lengths differ by
    at most one (``parts`` at most ``len(shas)``)."""
    base, extra = divmod(len(shas), parts)
    cut, start = [], 0
    for i in range(parts):
        end = start + base + (i < extra)
        cut.append(shas[start:end])
        start = end
    return cut


def git_split(mirror: Path, parts: int, runs: int = 3) -> tuple[float, float]:
    """(b): ``parts`` chunk-shaped ``git log --stdin`` processes over contiguous parts of
    the history, started together; median wall and CPU of ``runs`` after a warm-up."""
    from workers.analysis.numstat import _FORMAT

    shas = analysis.git_out(mirror, "rev-list", "--reverse", "HEAD").split()
    inputs = ["\n".join(part).encode() + b"\n" for part in split_history(shas, parts)]
    cmd = [
        "git", "-C", str(mirror), "log", "--no-walk=unsorted", "--stdin", "--numstat",
        "--no-renames", "--diff-merges=first-parent", "--root", "--date=raw", "-z",
        f"--format={_FORMAT}",
    ]  # fmt: skip
    walls, cpus = [], []
    for i in range(runs + 1):
        before = _children_cpu()
        start = time.perf_counter()
        procs = [
            subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL) for _ in inputs
        ]
        for proc, data in zip(procs, inputs, strict=True):
            assert proc.stdin is not None
            proc.stdin.write(data)
            proc.stdin.close()
        for proc in procs:
            if proc.wait() != 0:
                raise RuntimeError("git log --stdin failed")
        if i:
            walls.append(time.perf_counter() - start)
            cpus.append(_children_cpu() - before)
    return statistics.median(walls), statistics.median(cpus)


def hardened_transfer(origin: Path, tmp: Path, runs: int = 2) -> tuple[float, float]:
    """(e): the sync job's fresh clone (``sync_mirror`` into an empty workspace), no
    analysis; median wall and CPU of ``runs`` after a warm-up."""
    from workers.git.mirror import sync_mirror
    from workers.git.runner import Runner

    walls, cpus = [], []
    for i in range(runs + 1):
        workspace = tmp / f"workspace-{i}"
        workspace.mkdir()
        before = _children_cpu()
        start = time.perf_counter()
        sync_mirror(
            workspace=workspace,
            repo_id=1,
            git_url=str(origin),
            branch="",
            runner=Runner(),
            timeout=600,
        )
        if i:
            walls.append(time.perf_counter() - start)
            cpus.append(_children_cpu() - before)
        shutil.rmtree(workspace, ignore_errors=True)
    return statistics.median(walls), statistics.median(cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commits", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--merge-share", type=float, default=None)
    parser.add_argument("--repo", type=Path, help="use this repository instead")
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 2)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="gw-floor-") as tmp_name:
        tmp = Path(tmp_name)
        if args.repo:
            origin = args.repo.resolve()
            label = str(origin)
        else:
            origin = tmp / "origin.git"
            analysis.build_repository(origin, args.commits, args.seed, merge_share=args.merge_share)
            label = f"synthetic seed={args.seed} merge-share={args.merge_share}"
        mirror = tmp / "mirror.git"  # a pack transfer, as the mirror's fetch
        subprocess.run(
            ["git", "clone", "-q", "--bare", "--no-local", "--single-branch",
             str(origin), str(mirror)],
            check=True,
        )  # fmt: skip
        total = int(analysis.git_out(mirror, "rev-list", "--count", "HEAD"))
        print(f"# gitward two-core floor  {time.strftime('%Y-%m-%d %H:%M:%S')}  cores={args.cores}")
        print(f"repository: {label}: {total} commits")
        print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")

        a_wall = analysis.bench_git_log(mirror)
        a_cpu = analysis.LAST_CPU["git_log"]
        print(f"(a) one git log: {a_wall:.3f} s wall, {a_cpu:.3f} CPU-s")
        b_wall, b_cpu = git_split(mirror, args.cores)
        print(
            f"(b) git alone in {args.cores} parts at once: {b_wall:.3f} s wall "
            f"({b_wall / a_wall:.2f}x a), {b_cpu:.3f} CPU-s ({b_cpu / a_cpu:.2f}x a's)"
        )
        st = analysis.run_stages(mirror, tmp / "stages", chunk_size=None, engine=True)
        per = st["per_chunk"]
        chunk_git = sum(p[1] for p in per)
        parse = sum(p[2] for p in per)
        write = sum(p[3] for p in per)
        sync_py = st["list_py_s"] + st["plan_py_s"]
        sync_git = st["list_git_s"]
        python = parse + write + sync_py
        print(
            f"(c) today's steps, {st['chunks']} chunks (production target {st['target']}): "
            f"git of the chunks {chunk_git:.3f} CPU-s "
            f"({chunk_git / a_cpu:.2f}x a's), rev-list {sync_git:.3f}; Python: parse "
            f"{parse:.3f} + write {write:.3f} + list and plan {sync_py:.3f} = {python:.3f} CPU-s"
        )
        engine = st["engine"]["cpu_s"]
        copied = (st["engine"]["commits"], st["engine"]["files"])
        stored = (st["stored"]["commits"], st["stored"]["files"])
        if copied != stored:
            raise RuntimeError(f"SQLite-alone copy holds {copied} rows, the write {stored}")
        print(
            f"    of the write, SQLite's own inserts and commits (the same {stored[0]} commit "
            f"and {stored[1]} file rows as ready tuples, same indexes, one transaction per "
            f"chunk): {engine:.3f} CPU-s"
        )
        floor = max(b_wall, (b_cpu + sync_git + python) / args.cores)
        budget = 0.75 * a_wall * args.cores - b_cpu - sync_git
        print(
            f"(d) floor with zero per-job cost and perfect overlap: {floor:.3f} s = "
            f"{floor / a_wall:.2f}x a (goal <= 0.75x); the goal leaves "
            f"{budget:.3f} CPU-s for all Python work, today's steps take {python:.3f} "
            f"({python / budget if budget > 0 else float('inf'):.1f}x that)"
        )
        print(
            f"    even with no Python at all, SQLite's inserts alone take "
            f"{engine / budget if budget > 0 else float('inf'):.1f}x what the goal leaves"
        )
        local = analysis.bench_clone_and_log(origin, tmp, local=True)
        remote = analysis.bench_clone_and_log(origin, tmp, local=False)
        print(
            f"(e) anchor git clone --bare + git log: {local:.3f} s local (hard links), "
            f"{remote:.3f} s with --no-local (a real pack transfer, as a clone from a URL)"
        )
        h_wall, h_cpu = hardened_transfer(origin, tmp)
        print(
            f"    gitward's hardened transfer alone (sync_mirror, no analysis): {h_wall:.3f} s "
            f"= {h_wall / local:.2f}x the local anchor, {h_wall / remote:.2f}x the --no-local "
            f"one (goal for the whole submission <= 1.0x the latter), {h_cpu:.3f} CPU-s of git"
        )
        # the whole submission can meet its goal only if what is left after the transfer
        # fits: the analysis from the mirror within (remote - transfer)
        print(
            f"    left for the analysis after the transfer: {remote - h_wall:.3f} s = "
            f"{(remote - h_wall) / a_wall:.2f}x one git log (the floor above: "
            f"{floor / a_wall:.2f}x)"
        )
        print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
