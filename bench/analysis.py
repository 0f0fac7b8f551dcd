"""Benchmark: whole-history analysis, git log vs PyDriller vs gitward end to end.

Builds (or takes) one repository and measures, in one run and side by side:

  (a) git log    ``git log HEAD --numstat --no-renames --diff-merges=first-parent --root``
                 with gitward's own ``--format`` over the whole history, to /dev/null
                 (median of 3 runs after one warm-up run);
  (b) PyDriller  ``for c in Repository(path, order="reverse").traverse_commits():
                 for m in c.modified_files: m.added_lines, m.deleted_lines`` over the newest
                 ``--pydriller-commits`` commits only (PyDriller runs at ~250 commits/s), so
                 its figure is a rate measured on a window, not a whole-history time;
  (c) gitward    end to end from an existing mirror: a fresh temporary var dir, SQLite
                 database (migrated) and 3 local redis-server nodes; the mirror of
                 repository 1 is built beforehand with ``workers.git.mirror.sync_mirror`` (the
                 code the sync job runs), so the sync job only does an up-to-date fetch;
                 ``manage.py worker --workers N`` is started and waited for (all workers
                 registered) before the clock starts; then submit → ``status == ready`` and
                 every commit stored. Each gitward run is a separate child process of this
                 script (fresh Django settings), which also polls /proc of the worker tree
                 (pool, workers, forked work horses, git) for peak memory.

Worker peak memory is also measured at the ``--rss-sizes`` history sizes (a smaller one is a
``--shared`` bare clone of the repository whose branch points at an older commit), to show
it stays flat as the history grows. ``--chunk-sizes`` repeats (c) with other fixed chunk
targets (``GITWARD_CHUNK_SIZE`` and ``GITWARD_CHUNK_MAX`` both that value); the main run uses
the settings' defaults, so its target grows with the history
(``workers.analysis.chunks.chunk_target``). Not a test: nothing is asserted.

``--clone`` measures a fresh submission instead: no mirror beforehand, so the clock runs
from ``submit_repository()`` through the sync job's clone (with all of gitward's git
hardening: ``transfer.fsckObjects`` and the rest) to every commit stored; the anchor is
``git clone --bare`` of the same repository plus one ``git log --numstat --no-renames
--diff-merges=first-parent`` of the clone (also printed with ``--no-local``, a pack transfer
like a remote clone; plain local clones hard-link). Anchor and gitward alternate, twice.
``--baseline DIR`` repeats each gitward run with another source tree (before/after in one
run); ``--database-url`` runs gitward on PostgreSQL. ``--metrics-ab N`` measures only what
recording metrics costs: N pairs of (c) runs, alternated, with ``GITWARD_METRICS_RECORDING``
false and true. Every run prints the load average.

    .venv/bin/python bench/analysis.py [--commits 20000] [--repo PATH] [--workers 2]
        [--skip-pydriller] [--pydriller-commits 3000] [--rss-sizes 5000,20000]
        [--chunk-sizes 500,2000] [--seed 1] [--merge-share 0.25] [--clone] [--database-url postgres://…/gw_x_bench]
        [--metrics-ab 3] [--env GITWARD_CHUNK_MAX=1000 …]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

#: The gitward source tree the (c) runs use: this checkout, or ``--baseline``'s tree for
#: the child processes of a side-by-side comparison.
ROOT = Path(os.environ.get("GITWARD_BENCH_ROOT") or Path(__file__).resolve().parent.parent)
sys.path.insert(0, str(ROOT))

# ------------------------------------------------------------------ synthetic repository

_DIRS = {
    "src/core": ".py",
    "src/api": ".py",
    "src/util": ".py",
    "web/js": ".js",
    "web/css": ".css",
    "lib/native": ".c",
    "lib/native/include": ".h",
    "cmd/tool": ".go",
    "docs": ".md",
    "tests": ".py",
    "config": ".yml",
}
_WORDS = [
    "alpha", "beta", "gamma", "delta", "value", "index", "count", "total", "buffer",
    "result", "error", "token", "node", "item", "parse", "render", "update", "config",
    "handler", "request", "response", "cache", "store", "queue", "worker", "limit",
]  # fmt: skip


class _Synth:
    """Deterministic ``git fast-import`` stream of a repository with a realistic shape.

    By default a topic branch of 2-6 commits is merged after every 15-60 commits on main
    (about 3.4 % merges). ``merge_share`` (0 < share ≤ 0.28) shapes a pull-request-style
    history instead: topics of 1-3 commits, 0-1 commits on main beside each, and between
    merges enough plain commits on main that about that share of all commits are merges
    (a well-known project's public history with a quarter of its commits merges)."""

    def __init__(self, seed: int, merge_share: float | None = None) -> None:
        self.rng = random.Random(seed)
        if merge_share is not None and not 0 < merge_share <= 0.28:
            raise ValueError("merge_share must be above 0 and at most 0.28")
        #: Plain commits on main between two merges (mean; the draw is uniform from 0
        #: to twice it), for ``merge_share``: one merge per (topic 2 + main 0.5 + merge 1
        #: + this) commits.
        self.gap = None if merge_share is None else 1 / merge_share - 3.5
        self.lines = [
            f"{w}_{i} = {self.rng.choice(_WORDS)}({self.rng.randrange(10**6)})\n"
            for i, w in enumerate(self.rng.choice(_WORDS) for _ in range(4000))
        ]
        self.authors = [
            (f"Dev {self.rng.choice(_WORDS).title()} {i}", f"dev{i}@example.org") for i in range(40)
        ]
        self.files: dict[str, list[str] | bytes] = {}
        self.mark = 0
        self.when = 1_420_070_400  # 2015-01-01
        self.count = 0
        self.new_files = 0

    def _text(self, n: int) -> list[str]:
        return [self.rng.choice(self.lines) for _ in range(n)]

    def _initial_files(self) -> None:
        n = 0
        for d, ext in _DIRS.items():
            for _ in range(24):
                self.files[f"{d}/file_{n}{ext}"] = self._text(self.rng.randint(10, 80))
                n += 1
        for i in range(14):
            self.files[f"assets/img_{i}.png"] = self.rng.randbytes(self.rng.randint(500, 3000))

    def _edit(self, content: list[str]) -> list[str]:
        out = list(content)
        for _ in range(self.rng.randint(1, 3)):
            pos = self.rng.randrange(len(out) + 1)
            kind = self.rng.random()
            if kind < 0.5 and pos < len(out):
                out[pos] = self.rng.choice(self.lines)
            elif kind < 0.8 or len(out) < 5:
                out[pos:pos] = self._text(self.rng.randint(1, 4))
            else:
                del out[pos : pos + self.rng.randint(1, 3)]
        return out

    @staticmethod
    def _data(payload: bytes) -> bytes:
        return b"data %d\n%s\n" % (len(payload), payload)

    def _commit(self, ref: str, parents: list[int], changes: dict[str, Any], msg: str) -> int:
        self.mark += 1
        self.count += 1
        self.when += self.rng.randint(60, 9000)
        name, email = self.authors[min(int(self.rng.expovariate(0.15)), len(self.authors) - 1)]
        tz = self.rng.choice(["+0000", "+0100", "-0500", "+0530", "-0800"])
        out = [b"commit %s\nmark :%d\n" % (ref.encode(), self.mark)]
        ident = f"{name} <{email}> {self.when} {tz}".encode()
        out.append(b"author %s\ncommitter %s\n" % (ident, ident))
        out.append(self._data(msg.encode()))
        if parents:
            out.append(b"from :%d\n" % parents[0])
        for p in parents[1:]:
            out.append(b"merge :%d\n" % p)
        for path, content in changes.items():
            if content is None:
                out.append(b"D %s\n" % path.encode())
                continue
            payload = content if isinstance(content, bytes) else "".join(content).encode()
            out.append(b"M 100644 inline %s\n" % path.encode())
            out.append(self._data(payload))
        self.sink.write(b"".join(out))
        return self.mark

    def _changes(self, files: dict[str, Any], avoid: set[str]) -> dict[str, Any]:
        rng = self.rng
        k = rng.choices([1, 2, 3, 4, 5, 8], weights=[25, 25, 20, 12, 8, 10])[0]
        paths = [p for p in rng.sample(sorted(files), min(k + 3, len(files))) if p not in avoid]
        changes: dict[str, Any] = {}
        for p in paths[:k]:
            old = files[p]
            if isinstance(old, bytes):
                if rng.random() < 0.3:
                    changes[p] = rng.randbytes(rng.randint(500, 3000))
            else:
                changes[p] = self._edit(old)
        roll = rng.random()
        if roll < 0.015:
            self.new_files += 1
            d, ext = rng.choice(list(_DIRS.items()))
            changes[f"{d}/new_{self.new_files}{ext}"] = self._text(rng.randint(5, 40))
        elif roll < 0.03 and len(files) > 250:
            victim = rng.choice(sorted(files))
            if victim not in avoid:
                changes[victim] = None
        elif roll < 0.035:
            self.new_files += 1
            changes[f"assets/gen_{self.new_files}.bin"] = rng.randbytes(rng.randint(200, 2000))
        return changes

    @staticmethod
    def _apply(files: dict[str, Any], changes: dict[str, Any]) -> None:
        for p, c in changes.items():
            if c is None:
                files.pop(p, None)
            else:
                files[p] = c

    def write(self, sink: Any, commits: int) -> int:
        """Write the stream for ``commits`` commits (side branches and merges included)."""
        self.sink = sink
        rng = self.rng
        self._initial_files()
        tip = self._commit("refs/heads/main", [], dict(self.files), "initial import")
        since_merge = 0
        while self.count < commits:
            remaining = commits - self.count
            if self.gap is None:
                due = since_merge > rng.randint(15, 60)
            else:
                due = since_merge >= round(rng.uniform(0, 2 * self.gap))
            if due and remaining > 12:
                since_merge = 0
                # a topic branch of 2-6 commits on a few reserved files; main moves on
                # beside it without touching them, then merges it (first-parent diff =
                # the topic's net change)
                reserved = set(
                    rng.sample([p for p, c in self.files.items() if isinstance(c, list)], 4)
                )
                side = {p: self.files[p] for p in reserved}
                side_tip = tip
                for i in range(rng.randint(2, 6) if self.gap is None else rng.randint(1, 3)):
                    ch = {p: self._edit(side[p]) for p in rng.sample(sorted(reserved), 2)}
                    self._apply(side, ch)
                    side_tip = self._commit("refs/heads/topic", [side_tip], ch, f"topic work {i}")
                for _ in range(rng.randint(0, 3) if self.gap is None else rng.randint(0, 1)):
                    ch = self._changes(self.files, reserved)
                    self._apply(self.files, ch)
                    tip = self._commit("refs/heads/main", [tip], ch, "work on main")
                merged = dict(side)
                self._apply(self.files, merged)
                tip = self._commit("refs/heads/main", [tip, side_tip], merged, "Merge topic")
                continue
            ch = self._changes(self.files, set())
            self._apply(self.files, ch)
            tip = self._commit("refs/heads/main", [tip], ch, f"change {self.count}")
            since_merge += 1
        return self.count


def build_repository(
    path: Path, commits: int, seed: int, *, repack: bool = True, merge_share: float | None = None
) -> None:
    """The synthetic history, written by ``git fast-import`` and then, unless ``repack``
    is false, repacked (``git repack -adf``): fast-import writes one pack in creation
    order whose deltas only chain each blob and tree on its previous version, where a
    real mirror receives the deltas and order of its server's ``pack-objects`` (a
    hosted repository is repacked by its host), so the mirror built from it is too."""
    subprocess.run(["git", "init", "-q", "-b", "main", str(path)], check=True)
    proc = subprocess.Popen(
        ["git", "-C", str(path), "fast-import", "--quiet", "--done"], stdin=subprocess.PIPE
    )
    assert proc.stdin is not None
    try:
        with proc.stdin as sink:
            _Synth(seed, merge_share).write(sink, commits)
            sink.write(b"done\n")
    finally:
        if proc.wait(timeout=600) != 0:
            raise RuntimeError("git fast-import failed")
    subprocess.run(["git", "-C", str(path), "update-ref", "-d", "refs/heads/topic"], check=True)
    if repack:
        repack_repository(path)


def repack_repository(path: Path) -> None:
    subprocess.run(["git", "-C", str(path), "repack", "-adfq"], check=True)


def git_out(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout


def truncated_clone(repo: Path, dest: Path, size: int) -> int:
    """A ``--shared`` bare clone whose default branch holds about ``size`` commits."""
    shas = git_out(repo, "rev-list", "--topo-order", "HEAD").split()
    target = shas[max(0, len(shas) - size)]
    subprocess.run(["git", "clone", "-q", "--bare", "--shared", str(repo), str(dest)], check=True)
    git_out(dest, "update-ref", "refs/heads/bench", target)
    git_out(dest, "symbolic-ref", "HEAD", "refs/heads/bench")
    return int(git_out(dest, "rev-list", "--count", "HEAD"))


# ------------------------------------------------------------------------- (a) and (b)


def bench_git_log(repo: Path, runs: int = 3) -> float:
    from workers.analysis.numstat import _FORMAT

    cmd = [
        "git",
        "-C",
        str(repo),
        "log",
        "HEAD",
        "--numstat",
        "--no-renames",
        "--diff-merges=first-parent",
        "--root",
        "--date=raw",
        f"--format={_FORMAT}",
    ]
    times = []
    cpu = []
    for i in range(runs + 1):
        before = _children_cpu()
        start = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, check=True)
        if i:  # the first run only warms the page cache
            times.append(time.perf_counter() - start)
            cpu.append(_children_cpu() - before)
    LAST_CPU["git_log"] = statistics.median(cpu)
    return statistics.median(times)


#: CPU seconds of the last anchor measured (median), by anchor.
LAST_CPU: dict[str, float] = {}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def bench_clone_and_log(origin: Path, tmp: Path, *, local: bool, runs: int = 2) -> float:
    """``git clone --bare`` of ``origin`` into a fresh directory, then one ``git log``
    (:func:`bench_git_log`'s command, one run) of the clone; median of ``runs`` after a
    warm-up. ``local=False`` adds ``--no-local``: a pack transfer, as from a remote
    (plain ``git clone`` of a local path hard-links the objects instead)."""
    from workers.analysis.numstat import _FORMAT

    times = []
    cpu = []
    for i in range(runs + 1):
        dest = tmp / f"anchor-clone-{i}.git"
        before = _children_cpu()
        start = time.perf_counter()
        cmd = ["git", "clone", "-q", "--bare", *([] if local else ["--no-local"])]
        subprocess.run([*cmd, str(origin), str(dest)], check=True)
        subprocess.run(
            [
                "git", "-C", str(dest), "log", "HEAD", "--numstat", "--no-renames",
                "--diff-merges=first-parent", "--root", "--date=raw", f"--format={_FORMAT}",
            ],
            stdout=subprocess.DEVNULL,
            check=True,
        )  # fmt: skip
        if i:
            times.append(time.perf_counter() - start)
            cpu.append(_children_cpu() - before)
        shutil.rmtree(dest, ignore_errors=True)
    LAST_CPU["clone_local" if local else "clone_remote"] = statistics.median(cpu)
    return statistics.median(times)


def bench_pydriller(repo: Path, limit: int) -> tuple[int, float]:
    from pydriller import Repository

    n = 0
    start = time.perf_counter()
    for c in Repository(str(repo), order="reverse").traverse_commits():
        for m in c.modified_files:
            _ = (m.added_lines, m.deleted_lines)
        n += 1
        if n >= limit:
            break
    return n, time.perf_counter() - start


# ------------------------------------------------------------------- (c) gitward child


def _children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def descendants(pid: int) -> list[int]:
    kids = _children_map()
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def descendants_by_depth(pid: int) -> list[tuple[int, int]]:
    """``(pid, depth)`` of ``pid`` (depth 0) and every process under it."""
    kids = _children_map()
    out, todo = [], [(pid, 0)]
    while todo:
        p, depth = todo.pop()
        out.append((p, depth))
        todo.extend((k, depth + 1) for k in kids.get(p, []))
    return out


def _status(pid: int) -> tuple[str, int, int, int] | None:
    """(name, VmRSS kB, VmHWM kB, RssAnon kB) of a live process."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    name, rss, hwm, anon = "", 0, 0, 0
    for line in text.splitlines():
        if line.startswith("Name:"):
            name = line.split()[1]
        elif line.startswith("VmRSS:"):
            rss = int(line.split()[1])
        elif line.startswith("VmHWM:"):
            hwm = int(line.split()[1])
        elif line.startswith("RssAnon:"):
            anon = int(line.split()[1])
    return name, rss, hwm, anon


#: Process kinds of the worker tree, by depth under ``manage.py worker`` (the pool):
#: its workers, their forked work horses (the first horse seen runs the sync job: the
#: analyze jobs are only enqueued when its plan commits), and git under a horse.
KINDS = ("pool", "worker", "sync horse", "analyze horse", "sync git", "analyze git")


class MemoryPoller(threading.Thread):
    """Polls the process tree under ``root`` every ``interval`` s: peak VmHWM (which
    counts file-backed pages, e.g. git's mapped pack, and SQLite's page reads do not
    show) and peak polled RssAnon (the heap, sampled) per process and per kind."""

    def __init__(self, root: int, interval: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.interval = interval
        self.stop_event = threading.Event()
        self.hwm: dict[int, tuple[str, int]] = {}
        self.anon: dict[int, int] = {}
        self.kind: dict[int, str] = {}
        self.sync_horse = 0
        self.peak_py_sum = 0
        self.pids_seen: set[int] = set()

    def _kind_of(self, pid: int, depth: int, name: str, parent_kind: str) -> str:
        if pid in self.kind:
            return self.kind[pid]
        if depth == 0:
            kind = "pool"
        elif depth == 1:
            kind = "worker"
        elif depth == 2 and name.startswith("python"):
            if not self.sync_horse:
                self.sync_horse = pid
            kind = "sync horse" if pid == self.sync_horse else "analyze horse"
        else:
            kind = "sync git" if parent_kind.startswith("sync") else "analyze git"
        self.kind[pid] = kind
        return kind

    def run(self) -> None:
        while not self.stop_event.is_set():
            py_sum = 0
            kinds: dict[int, str] = {}
            kids = _children_map()
            todo = [(self.root, 0, "")]
            while todo:
                pid, depth, parent_kind = todo.pop()
                st = _status(pid)
                if st is None:
                    continue
                name, rss, hwm, anon = st
                kind = kinds[pid] = self._kind_of(pid, depth, name, parent_kind)
                todo.extend((k, depth + 1, kind) for k in kids.get(pid, []))
                self.pids_seen.add(pid)
                if hwm > self.hwm.get(pid, ("", 0))[1]:
                    self.hwm[pid] = (name, hwm)
                self.anon[pid] = max(self.anon.get(pid, 0), anon)
                if name.startswith("python"):
                    py_sum += rss
            self.peak_py_sum = max(self.peak_py_sum, py_sum)
            self.stop_event.wait(self.interval)

    def summary(self) -> dict[str, Any]:
        py = [h for n, h in self.hwm.values() if n.startswith("python")]
        git = [h for n, h in self.hwm.values() if n.startswith("git")]
        by_kind: dict[str, dict[str, float]] = {}
        for pid, kind in self.kind.items():
            got = by_kind.setdefault(kind, {"hwm_mb": 0.0, "anon_mb": 0.0, "n": 0})
            got["hwm_mb"] = max(got["hwm_mb"], self.hwm.get(pid, ("", 0))[1] / 1024)
            got["anon_mb"] = max(got["anon_mb"], self.anon.get(pid, 0) / 1024)
            got["n"] += 1
        return {
            "max_python_hwm_mb": max(py, default=0) / 1024,
            "max_git_hwm_mb": max(git, default=0) / 1024,
            "peak_python_rss_sum_mb": self.peak_py_sum / 1024,
            "processes_seen": len(self.pids_seen),
            "by_kind": by_kind,
        }


def format_kinds(by_kind: dict[str, dict[str, float]]) -> str:
    """``kind VmHWM/RssAnon MB`` for each process kind seen."""
    return ", ".join(
        f"{k} {by_kind[k]['hwm_mb']:.0f}/{by_kind[k]['anon_mb']:.0f}" for k in KINDS if k in by_kind
    )


_TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds (user + system) used so far by the process tree under ``root``: each
    live process's own time plus its reaped children's (``cutime``/``cstime``), so a
    forked work horse and its git processes count once they have been waited for. Far
    less sensitive to other load on the machine than wall time."""
    total = 0
    for pid in descendants(root):
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return total / _TICK


def _stop_tree(proc: subprocess.Popen[bytes], grace: float = 30.0) -> None:
    """SIGTERM the pool (it stops its workers), then SIGKILL whatever is left, by pid."""
    tree = descendants(proc.pid)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    for pid in tree:
        if pid != proc.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def gitward_child(cfg: dict[str, Any]) -> dict[str, Any]:
    """One gitward run in this (fresh) process; returns the measured figures."""
    from workers.runtime.redis_server import RedisNode

    base = Path(cfg["dir"])
    var = base / "var"
    var.mkdir(parents=True)
    origin = Path(cfg["origin"])
    nodes = [RedisNode(base / f"redis{i}", persistent=False).start() for i in range(3)]
    worker_proc: subprocess.Popen[bytes] | None = None
    try:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("REDIS_URL", "GITWARD_", "DATABASE_URL"))
        }
        database_url = cfg.get("database_url") or f"sqlite:///{var / 'db.sqlite3'}"
        if database_url.startswith("postgres"):
            _recreate_postgres(database_url)
        env.update(
            GITWARD_VAR_DIR=str(var),
            DATABASE_URL=database_url,
            GITWARD_WORKSPACE=str(var / "workspace"),
            GITWARD_LOCAL_ROOTS=str(origin.parent),
            REDIS_URLS=",".join(n.url for n in nodes),
            GITWARD_CHUNK_SIZE=str(cfg["chunk_size"]),
            DJANGO_SETTINGS_MODULE="dashboard.settings",
            PYTHONUNBUFFERED="1",
        )
        env.update(cfg.get("extra_env") or {})  # --metrics-ab: GITWARD_METRICS_RECORDING
        os.environ.update(env)
        import django

        django.setup()
        from django.conf import settings
        from django.core.management import call_command
        from django.db.models import Sum
        from rq import Worker

        from dashboard.infra import queues
        from dashboard.models import Chunk, Commit, FileChange, JobRun, Repository
        from dashboard.repositories.lifecycle import submit_repository, validate_remote
        from workers.git.mirror import sync_mirror
        from workers.git.runner import Runner

        call_command("migrate", verbosity=0)
        # The mirror already present: built with the sync job's own code for the id the
        # first repository of a fresh database gets (checked after the submission).
        remote = validate_remote(str(origin))
        start = time.perf_counter()
        if not cfg.get("clone"):  # --clone: the sync job clones it, inside the timed run
            sync_mirror(
                workspace=Path(settings.WORKSPACE),
                repo_id=1,
                git_url=remote.git_url(),
                branch="",
                runner=Runner(),
                timeout=900,
            )
        mirror_s = time.perf_counter() - start

        log = (var / "worker.log").open("wb")
        worker_proc = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "worker", "--workers", str(cfg["workers"])],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        poller = MemoryPoller(worker_proc.pid)
        poller.start()
        conn = queues.connection()
        deadline = time.monotonic() + 180  # a saturated shared machine took over 60 s
        while len(Worker.all(connection=conn)) < cfg["workers"]:
            if worker_proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("workers did not start: " + (var / "worker.log").read_text())
            time.sleep(0.05)
        idle = poller.summary()["max_python_hwm_mb"]
        time.sleep(0.2)
        idle = max(idle, poller.summary()["max_python_hwm_mb"])

        cpu_before = tree_cpu_seconds(worker_proc.pid)
        start = time.perf_counter()
        repo, _ = submit_repository(url=str(origin))
        if repo.pk != 1:
            raise RuntimeError(f"expected repository id 1, got {repo.pk}")
        deadline = time.monotonic() + cfg["timeout"]
        while True:
            status = Repository.objects.filter(pk=repo.pk).values_list("status", flat=True)[0]
            if status == Repository.Status.READY:
                repo.refresh_from_db()
                stored = Commit.objects.filter(repository=repo).count()
                if stored >= repo.commits_total:
                    break
            if status == Repository.Status.FAILED:
                raise RuntimeError(f"analysis failed: {Repository.objects.get(pk=1).error}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out in status {status}")
            time.sleep(0.05)
        wall = time.perf_counter() - start
        # the last horses are reaped just after their job; a moment for the CPU to land
        time.sleep(0.5)
        cpu = tree_cpu_seconds(worker_proc.pid) - cpu_before
        poller.stop_event.set()
        poller.join()

        def secs(a: Any, b: Any) -> float:
            return (b - a).total_seconds() if a and b else 0.0

        sync = JobRun.objects.get(kind=JobRun.Kind.SYNC)
        runs = list(JobRun.objects.filter(kind=JobRun.Kind.ANALYZE))
        t_submit = repo.created_at
        first_analyze = min((r.started_at for r in runs), default=None)
        n_runs = max(len(runs), 1)
        chunk_sizes = dict(Chunk.objects.values_list("key", "size"))
        result = {
            # (worker, kind, commits, started, lock acquired, analysed, written, finished),
            # seconds from the submission: where each worker was busy (--timeline)
            "timeline": sorted(
                (
                    (
                        r.worker,
                        r.kind,
                        chunk_sizes.get(r.lock_key.rsplit(":", 1)[-1], 0),
                        *(
                            secs(t_submit, t)
                            for t in (
                                r.started_at,
                                r.lock_acquired_at,
                                r.analysed_at,
                                r.written_at,
                                r.finished_at,
                            )
                        ),
                    )
                    for r in [sync, *runs]
                ),
                key=lambda row: (row[0], row[3]),
            ),
            "cpu_s": cpu,
            "database": connection_vendor(),
            "queue_wait_s_per_chunk": sum(secs(r.enqueued_at, r.started_at) for r in runs) / n_runs,
            "before_lock_s_per_chunk": sum(secs(r.started_at, r.lock_acquired_at) for r in runs)
            / n_runs,
            "after_write_s_per_chunk": sum(secs(r.written_at, r.finished_at) for r in runs)
            / n_runs,
            "git_parse_s_per_chunk": sum(secs(r.lock_acquired_at, r.analysed_at) for r in runs)
            / n_runs,
            "write_s_per_chunk": sum(secs(r.analysed_at, r.written_at) for r in runs) / n_runs,
            "commits": repo.commits_total,
            "stored": stored,
            "file_rows": FileChange.objects.count(),
            "chunks": Chunk.objects.count(),
            "planned_commits": Chunk.objects.aggregate(s=Sum("size"))["s"],
            "wall_s": wall,
            "mirror_build_s": mirror_s,
            "submit_to_sync_start_s": secs(t_submit, sync.started_at),
            "sync_s": secs(sync.started_at, sync.finished_at),
            "sync_to_first_analyze_s": secs(sync.finished_at, first_analyze),
            "analyze_git_parse_s": sum(secs(r.lock_acquired_at, r.analysed_at) for r in runs),
            "analyze_db_write_s": sum(secs(r.analysed_at, r.written_at) for r in runs),
            "analyze_job_s": sum(secs(r.started_at, r.finished_at) for r in runs),
            "analyze_attempts": sum(r.attempts for r in runs),
            "idle_worker_hwm_mb": idle,
            "load_after": os.getloadavg()[0],
            **poller.summary(),
        }
        if cfg.get("push"):  # after the figures above: it adds runs of its own
            rounds = [
                _push_to_results(origin, repo, cfg["push"], cfg["timeout"], worker_proc.pid)
                for _ in range(PUSH_ROUNDS)
            ]
            result.update(sorted(rounds, key=lambda r: r["push_to_results_s"])[len(rounds) // 2])
            result["push_rounds_s"] = [r["push_to_results_s"] for r in rounds]
        return result
    finally:
        if worker_proc is not None:
            _stop_tree(worker_proc)
        for n in nodes:
            n.kill()


def _self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def stages_child(cfg: dict[str, Any]) -> dict[str, Any]:
    """``--stages``: the pipeline's steps one after another in this (fresh) process, with
    git's CPU (``RUSAGE_CHILDREN``: every git is reaped before its step ends) apart from
    Python's own (``RUSAGE_SELF``, SQLite included): the sync's ``list_commits`` and
    plan, then per chunk, as an analyze job does, ``stream_commits`` and ``write_chunk``
    on a fresh SQLite connection (a work horse opens its own). No Redis, no queue: the
    chunk rows are inserted directly, the fencing token issued per chunk."""
    base = Path(cfg["dir"])
    var = base / "var"
    var.mkdir(parents=True)
    os.environ.update(
        GITWARD_VAR_DIR=str(var),
        DATABASE_URL=f"sqlite:///{var / 'db.sqlite3'}",
        GITWARD_WORKSPACE=str(var / "workspace"),
        DJANGO_SETTINGS_MODULE="dashboard.settings",
    )
    if cfg["chunk_size"] is not None:  # None: the production target (settings' defaults)
        os.environ["GITWARD_CHUNK_SIZE"] = str(cfg["chunk_size"])
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connection

    from dashboard.locks.fencing import next_token
    from dashboard.models import Chunk, Repository
    from dashboard.repositories.commits import write_chunk
    from workers.analysis.analyzer import DEFAULT
    from workers.analysis.chunks import chunk_key, chunk_target, iter_weighted_chunks
    from workers.analysis.history import list_commits, stream_commits

    call_command("migrate", verbosity=0)
    if cfg.get("engine"):
        connection.close()  # checkpoints the WAL: the copy is the whole empty schema
        shutil.copy(var / "db.sqlite3", var / "empty.sqlite3")
    path = Path(cfg["origin"])
    c0, s0 = _children_cpu(), _self_cpu()
    shas = list_commits(path, "HEAD")
    c1, s1 = _children_cpu(), _self_cpu()
    target = cfg["chunk_size"]
    if target is None:  # what chunk_plans._plan_chunks cuts this history with
        target = chunk_target(
            shas.weight(),  # a merge weighs more (docs/analysis.md#chunking)
            floor=settings.CHUNK_SIZE,
            ceiling=settings.CHUNK_MAX,
            spread=settings.CHUNK_SPREAD,
        )
    planned = list(iter_weighted_chunks(shas.weights(), target=target))
    s2 = _self_cpu()
    fp = DEFAULT.fingerprint()
    repo = Repository.objects.create(
        url=str(path), status=Repository.Status.ANALYZING, fingerprint=fp, commits_total=len(shas)
    )
    Chunk.objects.bulk_create(
        Chunk(
            repository=repo,
            fingerprint=fp,
            key=chunk_key(part),
            shas="\n".join(part),
            size=len(part),
            position=i,
        )
        for i, part in enumerate(planned, start=1)
    )
    ids = list(
        Chunk.objects.filter(repository=repo).order_by("position").values_list("pk", flat=True)
    )
    per: list[tuple[int, float, float, float]] = []
    for pk in ids:
        connection.close()
        chunk = Chunk.objects.select_related("repository").get(pk=pk)
        chunk_shas = chunk.sha_list()
        c, s = _children_cpu(), _self_cpu()
        records = list(stream_commits(path, chunk_shas))
        git_s, parse_s = _children_cpu() - c, _self_cpu() - s
        s = _self_cpu()
        write_chunk(chunk=chunk, records=records, token=next_token(chunk.lock_key()))
        per.append((len(chunk_shas), git_s, parse_s, _self_cpu() - s))
    engine = _engine_write(var, [p[0] for p in per]) if cfg.get("engine") else None
    from dashboard.models import Commit, FileChange

    return {
        "engine": engine,
        "stored": {"commits": Commit.objects.count(), "files": FileChange.objects.count()},
        "commits": len(shas),
        "target": target,
        "chunks": len(per),
        "list_git_s": c1 - c0,
        "list_py_s": s1 - s0,
        "plan_py_s": s2 - s1,
        "per_chunk": per,
        "db_mb": (var / "db.sqlite3").stat().st_size / 2**20,
    }


def _engine_write(var: Path, sizes: list[int]) -> dict[str, Any]:
    """SQLite's own share of the writes: every commit and file row just stored, read
    back as ready tuples, inserted again into an empty copy of the same schema (every
    index the pages read from), one ``executemany`` pair and one transaction per chunk,
    as ``write_chunk`` does. No parsing, no row building: CPU seconds of this process
    (SQLite runs in it) for the inserts and commits alone."""
    import sqlite3

    from dashboard.models import Commit, FileChange
    from dashboard.repositories.commits import COMMIT_COLUMNS, FILE_COLUMNS

    def cols(model: Any, names: tuple[str, ...]) -> list[str]:
        return [model._meta.get_field(n).column for n in names]

    commit_cols = ["id", *cols(Commit, COMMIT_COLUMNS)]
    file_cols = cols(FileChange, FILE_COLUMNS)
    src = sqlite3.connect(var / "db.sqlite3")
    commits = src.execute(
        f"SELECT {', '.join(commit_cols)} FROM {Commit._meta.db_table} ORDER BY id"
    ).fetchall()
    files = src.execute(
        f"SELECT {', '.join(file_cols)} FROM {FileChange._meta.db_table} ORDER BY id"
    ).fetchall()
    src.close()
    by_commit: dict[int, list[tuple[Any, ...]]] = {}
    for row in files:
        by_commit.setdefault(row[0], []).append(row)
    batches = []
    start = 0
    for size in sizes:
        part = commits[start : start + size]
        start += size
        batches.append((part, [f for c in part for f in by_commit.get(c[0], [])]))
    dst = sqlite3.connect(var / "empty.sqlite3", isolation_level=None)
    dst.execute("PRAGMA journal_mode=WAL")
    dst.execute("PRAGMA synchronous=NORMAL")
    commit_sql = (
        f"INSERT INTO {Commit._meta.db_table} ({', '.join(commit_cols)}) "
        f"VALUES ({', '.join('?' * len(commit_cols))})"
    )
    file_sql = (
        f"INSERT INTO {FileChange._meta.db_table} ({', '.join(file_cols)}) "
        f"VALUES ({', '.join('?' * len(file_cols))})"
    )
    before = _self_cpu()
    for part, part_files in batches:
        dst.execute("BEGIN IMMEDIATE")
        dst.executemany(commit_sql, part)
        dst.executemany(file_sql, part_files)
        dst.execute("COMMIT")
    spent = _self_cpu() - before
    copied = [
        dst.execute(f"SELECT count(*) FROM {model._meta.db_table}").fetchone()[0]
        for model in (Commit, FileChange)
    ]
    dst.close()
    return {"cpu_s": spent, "commits": copied[0], "files": copied[1]}


def _child_env(root: Path | None) -> dict[str, str]:
    """The environment of a measuring child: ours without gitward's settings (the child
    sets its own), plus the tree to measure when it is not this one."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("REDIS_URL", "GITWARD_", "DATABASE_URL", "DJANGO_"))
    }
    if root is not None:
        env["GITWARD_BENCH_ROOT"] = str(root)
    return env


def run_stages(
    origin: Path,
    work: Path,
    *,
    chunk_size: int | None,
    root: Path | None = None,
    engine: bool = False,
) -> dict[str, Any]:
    """:func:`stages_child` in a fresh process; ``chunk_size`` None cuts the chunks with
    the production target (``workers.analysis.chunks.chunk_target`` at the settings' defaults)."""
    cfg = {
        "origin": str(origin),
        "dir": str(work),
        "chunk_size": chunk_size,
        "stages": True,
        "engine": engine,
    }
    env = _child_env(root)
    out = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(cfg)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"stage profile failed:\n{out.stdout}\n{out.stderr}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    shutil.rmtree(work, ignore_errors=True)
    return result


def print_stages(label: str, r: dict[str, Any]) -> None:
    """CPU-s per 1,000 commits by step, and git/write by quarter of the history."""
    per = r["per_chunk"]
    k = r["commits"] / 1000
    git, parse, write = (sum(p[i] for p in per) for i in (1, 2, 3))
    print(
        f"  {label}: {r['commits']} commits, {r['chunks']} chunks, db {r['db_mb']:.0f} MB; "
        f"CPU-s per 1,000 commits: sync rev-list (git) {r['list_git_s'] / k:.4f} + list "
        f"(python) {r['list_py_s'] / k:.4f} + plan {r['plan_py_s'] / k:.4f}; chunk git log "
        f"{git / k:.3f}, parse {parse / k:.3f}, write {write / k:.3f}; total "
        f"{(git + parse + write + r['list_git_s'] + r['list_py_s'] + r['plan_py_s']) / k:.3f}"
    )
    quarters = []
    for q in range(4):
        part = per[q * len(per) // 4 : (q + 1) * len(per) // 4]
        n = sum(p[0] for p in part) / 1000 or 1
        quarters.append(
            f"Q{q + 1} git {sum(p[1] for p in part) / n:.3f} parse "
            f"{sum(p[2] for p in part) / n:.3f} write {sum(p[3] for p in part) / n:.3f}"
        )
    print(f"    by quarter of the history (oldest first), per 1,000: {'; '.join(quarters)}")


def push_commits(origin: Path, n: int) -> str:
    """``n`` new commits on ``origin``'s main branch (one small file each), as a push
    would bring them; returns the new head."""
    head = git_out(origin, "rev-parse", "refs/heads/main").strip()
    stream = bytearray()
    for i in range(n):
        msg = f"pushed commit {i}".encode()
        data = f"pushed {i} at {time.time()}\n".encode()
        stream += b"commit refs/heads/main\n"
        stream += b"committer Bench <bench@example.com> %d +0000\n" % (1_900_000_000 + i)
        stream += b"data %d\n%s\n" % (len(msg), msg)
        if i == 0:
            stream += b"from %s\n" % head.encode()
        stream += b"M 100644 inline pushed/f%d.txt\ndata %d\n%s\n" % (i % 10, len(data), data)
    stream += b"done\n"
    subprocess.run(
        ["git", "-C", str(origin), "fast-import", "--quiet", "--done"],
        input=bytes(stream),
        check=True,
    )
    return git_out(origin, "rev-parse", "refs/heads/main").strip()


#: Push-to-results is measured this many times in a row (the median round is printed).
PUSH_ROUNDS = 3


def _push_to_results(
    origin: Path, repo: Any, n: int, timeout: float, worker_pid: int
) -> dict[str, Any]:
    """Push-to-results (an incremental sync), on the warm system of the run just measured: ``n``
    commits pushed, the repository re-submitted, then the time until every new commit is
    stored (the rows ``GET /api/repos/<id>/commits`` reads), polled every 10 ms."""
    from dashboard.models import Commit
    from dashboard.repositories.lifecycle import submit_repository

    before = Commit.objects.filter(repository=repo).count()
    push_commits(origin, n)
    cpu_before = tree_cpu_seconds(worker_pid)
    start = time.perf_counter()
    submit_repository(url=str(origin))
    deadline = time.monotonic() + timeout
    while Commit.objects.filter(repository=repo).count() < before + n:
        if time.monotonic() > deadline:
            raise RuntimeError("pushed commits not stored in time")
        time.sleep(0.01)
    total = time.perf_counter() - start
    # the breakdown needs the runs' end records, written just after the rows are stored
    from dashboard.models import JobRun

    while JobRun.objects.filter(repository=repo, finished_at__isnull=True).exists():
        if time.monotonic() > deadline:
            raise RuntimeError("runs did not finish in time")
        time.sleep(0.01)
    cpu = tree_cpu_seconds(worker_pid) - cpu_before
    return {
        "push_commits": n,
        "push_to_results_s": total,
        "push_cpu_s": cpu,
        "push_load": os.getloadavg()[0],
        **_push_breakdown(repo),
    }


def _push_breakdown(repo: Any) -> dict[str, Any]:
    """Where the push-to-results time went: the re-submission's sync run and the
    analyze runs it planned (their phase timestamps, ``runs.mark_phase``)."""
    from dashboard.models import JobRun

    def secs(a: Any, b: Any) -> float:
        return (b - a).total_seconds() if a and b else 0.0

    sync = JobRun.objects.filter(repository=repo, kind=JobRun.Kind.SYNC).order_by("-pk")[0]
    runs = list(JobRun.objects.filter(repository=repo, kind=JobRun.Kind.ANALYZE, pk__gt=sync.pk))
    last = max(runs, key=lambda r: r.finished_at) if runs else None
    return {
        "push_sync_queue_s": secs(sync.enqueued_at, sync.started_at),
        "push_sync_fetch_s": secs(sync.started_at, sync.fetched_at),
        "push_sync_plan_s": secs(sync.fetched_at, sync.written_at),
        "push_sync_finish_s": secs(sync.written_at, sync.finished_at),
        "push_chunks": len(runs),
        "push_analyze_queue_s": secs(sync.written_at, last.started_at) if last else 0.0,
        "push_analyze_job_s": secs(last.started_at, last.finished_at) if last else 0.0,
        "push_analyze_lock_s": secs(last.started_at, last.lock_acquired_at) if last else 0.0,
        "push_analyze_parse_s": secs(last.lock_acquired_at, last.analysed_at) if last else 0.0,
        "push_analyze_write_s": secs(last.analysed_at, last.written_at) if last else 0.0,
    }


def connection_vendor() -> str:
    from django.db import connection

    return str(connection.vendor)


def _recreate_postgres(url: str) -> None:
    """A fresh, empty database for one run (only a database whose name starts with
    ``gw_`` and ends with ``bench``, so a mistyped URL cannot drop a real one)."""
    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    if not (name.startswith("gw_") and name.endswith("bench")):
        raise SystemExit(f"refusing to recreate database {name!r}: use gw_<name>_bench")
    admin = urlunsplit(parts._replace(scheme="postgresql", path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


#: ``--env NAME=VALUE``: set for every gitward run (the baseline's too), e.g.
#: ``GITWARD_CHUNK_MAX=1000`` for fixed-size chunk targets.
EXTRA_ENV: dict[str, str] = {}


def run_gitward(
    origin: Path,
    work: Path,
    *,
    workers: int,
    chunk_size: int,
    timeout: float = 900,
    clone: bool = False,
    database_url: str = "",
    root: Path | None = None,
    extra_env: dict[str, str] | None = None,
    push: int = 0,
) -> dict[str, Any]:
    cfg = {
        "extra_env": {**EXTRA_ENV, **(extra_env or {})},
        "push": push,
        "origin": str(origin),
        "dir": str(work),
        "workers": workers,
        "chunk_size": chunk_size,
        "timeout": timeout,
        "clone": clone,
        "database_url": database_url,
    }
    env = _child_env(root)
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", json.dumps(cfg)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout + 120)
    except BaseException:
        # SIGTERM lets the child stop its workers and Redis nodes (its finally block)
        proc.terminate()
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        raise
    if proc.returncode != 0:
        raise RuntimeError(f"gitward run failed:\n{out}\n{err}")
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    shutil.rmtree(work, ignore_errors=True)
    return result


def metrics_ab(args: argparse.Namespace, origin: Path, tmp: Path, chunk: int) -> None:
    """``--metrics-ab N``: what recording metrics adds to the end-to-end analysis. The same
    (c) run with recording off and on (``GITWARD_METRICS_RECORDING``), alternated so that
    the machine's load drifts over both alike; medians of wall and CPU time."""
    got: dict[str, list[dict[str, Any]]] = {"false": [], "true": []}
    for i in range(args.metrics_ab):
        for flag in ("false", "true") if i % 2 == 0 else ("true", "false"):
            r = run_gitward(
                origin,
                tmp / f"run-ab-{i}-{flag}",
                workers=args.workers,
                chunk_size=chunk,
                database_url=args.database_url,
                extra_env={"GITWARD_METRICS_RECORDING": flag},
            )
            got[flag].append(r)
            print(
                f"  recording={flag}: {r['wall_s']:.2f} s wall, {r['cpu_s']:.2f} s CPU  "
                f"(load {' '.join(f'{x:.2f}' for x in os.getloadavg())})"
            )
    med = {
        flag: (
            statistics.median(r["wall_s"] for r in rs),
            statistics.median(r["cpu_s"] for r in rs),
        )
        for flag, rs in got.items()
    }
    (off_w, off_c), (on_w, on_c) = med["false"], med["true"]
    print(
        f"(c) metrics recording off: {off_w:.2f} s wall, {off_c:.2f} s CPU; on: {on_w:.2f} s "
        f"wall, {on_c:.2f} s CPU  → overhead {(on_w / off_w - 1) * 100:+.1f}% wall, "
        f"{(on_c / off_c - 1) * 100:+.1f}% CPU (medians of {args.metrics_ab})"
    )


# ---------------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--commits", type=int, default=20000, help="synthetic history size")
    parser.add_argument("--repo", type=Path, default=None, help="use this repository instead")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--skip-pydriller", action="store_true")
    parser.add_argument("--pydriller-commits", type=int, default=3000)
    parser.add_argument("--rss-sizes", default="5000,20000", help="history sizes for peak RSS")
    parser.add_argument("--chunk-sizes", default="500,2000", help="extra GITWARD_CHUNK_SIZE values")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--merge-share",
        type=float,
        default=None,
        help="a pull-request-style synthetic history with about this share of merge "
        "commits (e.g. 0.25 with --commits 17700: a well-known project's shape)",
    )
    parser.add_argument(
        "--push",
        type=int,
        default=0,
        help="after (c): push this many commits, re-submit, time until all are stored",
    )
    parser.add_argument(
        "--clone",
        action="store_true",
        help="only the fresh-submission figure: submit → all commits stored, the clone "
        "included, against git clone --bare + one git log",
    )
    parser.add_argument(
        "--database-url",
        default="",
        help="run gitward on this database (postgres://…/gw_<name>_bench, recreated for "
        "each run) instead of a fresh SQLite file",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="another gitward source tree (e.g. `git archive <rev>` unpacked): each (c) run "
        "is repeated with it, alternated, for before/after figures from one run",
    )
    parser.add_argument(
        "--metrics-ab",
        type=int,
        default=0,
        metavar="N",
        help="only the metrics-recording overhead: N pairs of (c) runs, alternated, with "
        "GITWARD_METRICS_RECORDING=false and true; prints both medians and the overhead",
    )
    parser.add_argument(
        "--fast-import-pack",
        action="store_true",
        help="keep the synthetic repository's pack as git fast-import wrote it (as the runs "
        "before the benchmark repacked: not repacked)",
    )
    parser.add_argument(
        "--timeline",
        action="store_true",
        help="print each job of the main (c) run by worker with its phases, and how long "
        "each worker sat idle before the last job ended",
    )
    parser.add_argument(
        "--stages",
        action="store_true",
        help="only the per-step CPU profile (git vs Python: rev-list, plan, per chunk git "
        "log, parse, write) at each --rss-sizes size and the whole history, on a pack-"
        "transfer clone of each (as the mirror is); with --baseline for both trees",
    )
    parser.add_argument(
        "--stage-packs",
        default="fetched",
        help="with --stages: 'fetched' (the clone as transferred) and/or 'repacked' (the "
        "clone after git repack -adf), comma-separated",
    )
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an environment variable for every gitward run, baseline included (repeatable; "
        "e.g. GITWARD_CHUNK_MAX=1000 for fixed chunk targets)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    for item in args.env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            parser.error(f"--env wants NAME=VALUE, got {item!r}")
        EXTRA_ENV[name] = value
    if args.child:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
        cfg = json.loads(args.child)
        print(json.dumps(stages_child(cfg) if cfg.get("stages") else gitward_child(cfg)))
        return

    os.environ.pop("DJANGO_SETTINGS_MODULE", None)
    default_chunk = int(os.environ.get("GITWARD_CHUNK_SIZE") or 1000)
    with tempfile.TemporaryDirectory(prefix="gitward-bench-") as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "origins").mkdir()
        if args.repo:
            src = args.repo.resolve()
            # a local clone (hard links or a copy, no alternates: an alternates file
            # pointing outside the local root is refused as a remote, docs/security.md)
            origin = tmp / "origins" / "repo.git"
            subprocess.run(["git", "clone", "-q", "--bare", str(src), str(origin)], check=True)
            build_s = 0.0
        else:
            origin = tmp / "origins" / "synthetic"
            start = time.perf_counter()
            build_repository(
                origin,
                args.commits,
                args.seed,
                repack=not args.fast_import_pack,
                merge_share=args.merge_share,
            )
            build_s = time.perf_counter() - start
        total = int(git_out(origin, "rev-list", "--count", "HEAD"))
        merges = int(git_out(origin, "rev-list", "--count", "--merges", "HEAD"))
        files = len(git_out(origin, "ls-tree", "-r", "--name-only", "HEAD").split())
        print(
            f"# gitward analysis benchmark  {time.strftime('%Y-%m-%d %H:%M:%S')}  "
            f"{platform.platform()}  cpus={os.cpu_count()}  python {platform.python_version()}"
        )
        pack = "fast-import's pack" if args.fast_import_pack else "repacked"
        what = (
            str(args.repo)
            if args.repo
            else f"synthetic seed={args.seed} ({pack}, built in {build_s:.1f} s)"
        )
        print(f"repository: {what}: {total} commits ({merges} merges), {files} files at HEAD")

        print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        if args.clone:
            clone_mode(args, origin, tmp, default_chunk)
            return
        if args.stages:
            stages_mode(args, origin, tmp, total, default_chunk)
            return
        if args.metrics_ab:
            metrics_ab(args, origin, tmp, default_chunk)
            return

        a_s = bench_git_log(origin)
        a_rate = total / a_s
        print(
            f"(a) git log --numstat --no-renames --diff-merges=first-parent: "
            f"{a_s:.2f} s  {a_rate:,.0f} commits/s (median of 3, warm cache)"
        )

        b_rate = None
        if not args.skip_pydriller:
            n, b_s = bench_pydriller(origin, args.pydriller_commits)
            b_rate = n / b_s
            print(
                f"(b) PyDriller modified_files added/deleted_lines: {n} newest commits in "
                f"{b_s:.2f} s  {b_rate:,.0f} commits/s (window of {n}, not whole history; "
                f"whole history extrapolated {total / b_rate:.0f} s)"
            )

        if args.baseline:
            base = run_gitward(
                origin,
                tmp / "run-baseline",
                workers=args.workers,
                chunk_size=default_chunk,
                database_url=args.database_url,
                root=args.baseline.resolve(),
                push=args.push,
            )
            print(
                f"(c0) baseline {args.baseline}: {base['wall_s']:.2f} s  c0/a "
                f"{base['wall_s'] / a_s:.2f}x; CPU {base['cpu_s']:.2f} s = "
                f"{base['cpu_s'] / LAST_CPU['git_log']:.2f}x git log's; "
                f"git+parse {base['analyze_git_parse_s']:.2f} s, "
                f"db write {base['analyze_db_write_s']:.2f} s (worker time, all chunks)"
            )
            print_overhead(base)
            print_push(base)
        c = run_gitward(
            origin,
            tmp / "run-main",
            workers=args.workers,
            chunk_size=default_chunk,
            database_url=args.database_url,
            push=args.push,
        )
        c_rate = c["stored"] / c["wall_s"]
        print(
            f"(c) gitward end to end, {args.workers} workers, GITWARD_CHUNK_SIZE {default_chunk}: "
            f"{c['wall_s']:.2f} s  {c_rate:,.0f} commits/s  "
            f"({c['stored']} commits, {c['file_rows']} file rows, {c['chunks']} chunks)"
        )
        print(
            f"    breakdown: submit→sync start {c['submit_to_sync_start_s']:.2f} s, "
            f"sync (fetch+rev-list+plan) {c['sync_s']:.2f} s, "
            f"sync end→first analyze {c['sync_to_first_analyze_s']:.2f} s; "
            f"analyze jobs total {c['analyze_job_s']:.2f} s = git+parse "
            f"{c['analyze_git_parse_s']:.2f} s + db write {c['analyze_db_write_s']:.2f} s "
            f"+ other; attempts {c['analyze_attempts']}"
        )
        print_overhead(c)
        if args.timeline:
            print_timeline(c)
        print_push(c)
        print(f"c/a wall time: {c['wall_s'] / a_s:.2f}x (goal <= 0.75x)")
        print(
            f"CPU: git log {LAST_CPU['git_log']:.2f} s, gitward {c['cpu_s']:.2f} s (workers, "
            f"horses, git) = {c['cpu_s'] / LAST_CPU['git_log']:.2f}x; on 2 idle cores the "
            f"wall-time floor is about half of that"
        )
        print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        if b_rate:
            print(f"c/b throughput: {c_rate / b_rate:.1f}x PyDriller (goal >= 25x)")

        rows = []
        # the anchor's own CPU per 1,000 commits at each size: git's cost per commit
        # grows with a history whose files grow, so gitward's is compared with it
        anchor_cpu = {total: LAST_CPU["git_log"]}
        for size in [int(s) for s in args.rss_sizes.split(",") if s.strip()]:
            if size >= total:
                if args.baseline:
                    rows.append(("before", total, base))
                rows.append(("after" if args.baseline else "", total, c))
                continue
            small = tmp / "origins" / f"size-{size}.git"
            truncated_clone(origin, small, size)
            bench_git_log(small, runs=1)
            anchor_cpu[size] = LAST_CPU["git_log"]
            if args.baseline:
                rows.append(
                    (
                        "before",
                        size,
                        run_gitward(
                            small,
                            tmp / f"run-{size}-baseline",
                            workers=args.workers,
                            chunk_size=default_chunk,
                            root=args.baseline.resolve(),
                        ),
                    )
                )
            rows.append(
                (
                    "after" if args.baseline else "",
                    size,
                    run_gitward(
                        small, tmp / f"run-{size}", workers=args.workers, chunk_size=default_chunk
                    ),
                )
            )
        LAST_CPU["git_log"] = anchor_cpu[total]  # the whole history's, for what follows
        print(
            f"worker memory ({args.workers} workers, chunk {default_chunk}; VmHWM/VmRSS polled "
            f"every 50 ms over the pool, workers, forked work horses and git):"
        )
        for label, _size, r in sorted(rows, key=lambda x: (x[2]["commits"], x[0])):
            print(
                f"  {label + ' ' if label else ''}{r['commits']:>6} commits: max python "
                f"process {r['max_python_hwm_mb']:.0f} MB (idle worker "
                f"{r['idle_worker_hwm_mb']:.0f} MB), max git {r['max_git_hwm_mb']:.0f} MB, "
                f"peak sum python RSS {r['peak_python_rss_sum_mb']:.0f} MB; "
                f"{r['stored'] / r['wall_s']:,.0f} commits/s, CPU {r['cpu_s']:.2f} s = "
                f"{r['cpu_s'] / r['stored'] * 1000:.3f} CPU-s per 1,000 commits (git log "
                f"{anchor_cpu.get(_size, 0) / r['stored'] * 1000:.3f}), sync "
                f"{r['sync_s']:.2f} s, load {r['load_after']:.2f}"
            )
            print(f"      per kind, peak VmHWM/RssAnon MB: {format_kinds(r['by_kind'])}")

        extra = [int(s) for s in args.chunk_sizes.split(",") if s.strip()]
        for size in extra:
            r = run_gitward(  # a fixed target: the floor and the ceiling both ``size``
                origin,
                tmp / f"run-chunk-{size}",
                workers=args.workers,
                chunk_size=size,
                database_url=args.database_url,
                extra_env={"GITWARD_CHUNK_MAX": str(size)},
            )
            print(
                f"chunk size {size}: {r['wall_s']:.2f} s  {r['stored'] / r['wall_s']:,.0f} "
                f"commits/s  c/a {r['wall_s'] / a_s:.2f}x  CPU {r['cpu_s']:.2f} s = "
                f"{r['cpu_s'] / LAST_CPU['git_log']:.2f}x git log's  ({r['chunks']} chunks; "
                f"git+parse {r['analyze_git_parse_s']:.1f} s, db write "
                f"{r['analyze_db_write_s']:.1f} s, max python {r['max_python_hwm_mb']:.0f} MB; "
                f"load {os.getloadavg()[0]:.2f})"
            )


def stages_mode(args: argparse.Namespace, origin: Path, tmp: Path, total: int, chunk: int) -> None:
    """``--stages``: :func:`stages_child` at each size, before (``--baseline``) and after."""
    sizes = sorted({min(int(x), total) for x in args.rss_sizes.split(",") if x.strip()} | {total})
    packs = [p.strip() for p in args.stage_packs.split(",") if p.strip()]
    for size in sizes:
        src = origin
        if size < total:
            src = tmp / "origins" / f"size-{size}.git"
            truncated_clone(origin, src, size)
        for pack in packs:
            # a pack transfer, like the mirror's fetch (a local clone would hard-link)
            mirror = tmp / "origins" / f"stage-{size}-{pack}.git"
            subprocess.run(
                [
                    "git",
                    "clone",
                    "-q",
                    "--bare",
                    "--no-local",
                    "--single-branch",
                    str(src),
                    str(mirror),
                ],
                check=True,
            )
            if pack == "repacked":
                repack_repository(mirror)
            pack_mb = sum(f.stat().st_size for f in (mirror / "objects" / "pack").glob("*.pack"))
            print(f"{size} commits, {pack} mirror ({pack_mb / 2**20:.0f} MB of packs):")
            trees = [("before", args.baseline.resolve())] if args.baseline else []
            trees.append(("after" if args.baseline else "this tree", None))
            for label, root in trees:
                r = run_stages(
                    mirror, tmp / f"stages-{size}-{pack}-{label}", chunk_size=chunk, root=root
                )
                print_stages(label, r)
                print(f"    load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
            shutil.rmtree(mirror, ignore_errors=True)


def print_push(c: dict[str, Any]) -> None:
    if c.get("push_commits"):
        print(
            f"push to results: {c['push_commits']} commits pushed, re-submitted → all "
            f"stored in {c['push_to_results_s'] * 1000:.0f} ms (goal <= 1 s, warm; median of "
            f"{', '.join(f'{x * 1000:.0f}' for x in c['push_rounds_s'])} ms), worker tree CPU "
            f"{c['push_cpu_s']:.2f} s, load {c['push_load']:.1f}"
        )
        print(
            "  sync: queue {push_sync_queue_s:.3f} s, start→fetched {push_sync_fetch_s:.3f}"
            " s, fetched→planned {push_sync_plan_s:.3f} s, planned→finished "
            "{push_sync_finish_s:.3f} s; {push_chunks} chunk(s), last: planned→started "
            "{push_analyze_queue_s:.3f} s, job {push_analyze_job_s:.3f} s (→lock "
            "{push_analyze_lock_s:.3f}, git+parse {push_analyze_parse_s:.3f}, write "
            "{push_analyze_write_s:.3f})".format(**c)
        )


def print_timeline(c: dict[str, Any]) -> None:
    """``--timeline``: each job's phases by worker, and the time each worker sat idle
    between the submission and the last job's end (a core with nothing to do)."""
    rows = c["timeline"]
    end = max(row[7] for row in rows)
    print(
        "    timeline (s from submit): worker  kind  commits  start  lock  analysed  written  end"
    )
    idle: dict[str, float] = {}
    for row in rows:
        worker, kind, size, *marks = row
        print(f"      {worker:>10} {kind:>7} {size:6d}  " + "  ".join(f"{m:6.3f}" for m in marks))
    for worker in sorted({row[0] for row in rows}):
        own = sorted((row[3], row[7]) for row in rows if row[0] == worker)
        busy = sum(b - a for a, b in own)
        idle[worker] = end - busy
    print(
        "    idle per worker before the last job ended: "
        + ", ".join(f"{w} {s:.3f} s" for w, s in idle.items())
        + f" (of {end:.3f} s)"
    )


def print_overhead(c: dict[str, Any]) -> None:
    print(
        f"    per chunk ({c['database']}): queue wait {c['queue_wait_s_per_chunk'] * 1000:.0f} ms, "
        f"start→lock acquired (claim, plan check, mirror check, Redlock + token) "
        f"{c['before_lock_s_per_chunk'] * 1000:.1f} ms, git+parse "
        f"{c['git_parse_s_per_chunk'] * 1000:.0f} ms, "
        f"write {c['write_s_per_chunk'] * 1000:.0f} ms, "
        f"written→finished (finish chunk, release, record) "
        f"{c['after_write_s_per_chunk'] * 1000:.1f} ms"
    )


def clone_mode(args: argparse.Namespace, origin: Path, tmp: Path, chunk: int) -> None:
    """Fresh submission, the clone included, side by side with its anchors; alternated
    (anchor, gitward, anchor, gitward) so a change of load hits both."""
    walls: list[float] = []
    local: list[float] = []
    remote: list[float] = []
    c: dict[str, Any] = {}
    base_walls: list[float] = []
    for i in range(2):
        local.append(bench_clone_and_log(origin, tmp, local=True, runs=1))
        remote.append(bench_clone_and_log(origin, tmp, local=False, runs=1))
        if args.baseline:
            b = run_gitward(
                origin,
                tmp / f"run-clone-base-{i}",
                workers=args.workers,
                chunk_size=chunk,
                clone=True,
                database_url=args.database_url,
                root=args.baseline.resolve(),
            )
            base_walls.append(b["wall_s"])
        c = run_gitward(
            origin,
            tmp / f"run-clone-{i}",
            workers=args.workers,
            chunk_size=chunk,
            clone=True,
            database_url=args.database_url,
        )
        walls.append(c["wall_s"])
    a_local, a_remote, wall = (statistics.median(x) for x in (local, remote, walls))
    print(
        f"(a) git clone --bare + git log --numstat --no-renames --diff-merges=first-parent: "
        f"{a_local:.2f} s (local clone, hard links); with --no-local (pack transfer) "
        f"{a_remote:.2f} s"
    )
    print(
        f"(c) gitward fresh submission, clone included ({c['database']}, {args.workers} "
        f"workers, chunk {chunk}): {wall:.2f} s  ({c['stored']} commits, {c['chunks']} chunks; "
        f"runs {', '.join(f'{w:.2f}' for w in walls)} s)"
    )
    print(
        f"    breakdown: submit→sync start {c['submit_to_sync_start_s']:.2f} s, sync "
        f"(clone+rev-list+plan) {c['sync_s']:.2f} s, sync end→first analyze "
        f"{c['sync_to_first_analyze_s']:.2f} s; analyze jobs total {c['analyze_job_s']:.2f} s"
    )
    print_overhead(c)
    if base_walls:
        bw = statistics.median(base_walls)
        print(
            f"(c0) baseline {args.baseline}: {bw:.2f} s, c0/a {bw / a_local:.2f}x "
            f"({bw / a_remote:.2f}x with --no-local); runs "
            f"{', '.join(f'{w:.2f}' for w in base_walls)} s"
        )
    print(
        f"CPU: anchor {LAST_CPU['clone_local']:.2f} s (--no-local {LAST_CPU['clone_remote']:.2f}"
        f" s), gitward {c['cpu_s']:.2f} s = {c['cpu_s'] / LAST_CPU['clone_local']:.2f}x"
    )
    print(
        f"c/a: {wall / a_local:.2f}x git clone --bare + git log (goal <= 1.0x); "
        f"{wall / a_remote:.2f}x with --no-local"
    )
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
