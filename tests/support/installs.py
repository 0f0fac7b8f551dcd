"""Installs of gitward at two "commits" for code-rollout tests: copies of this source tree
(manage.py, the packages, the templates), the green one with its analysis changed so that
its code version and its numbers differ (docs/rollouts.md#code-rollouts-bluegreen).

A copy runs with the project's interpreter, the copy as its working directory and on
``PYTHONPATH`` (ahead of the editable install's finder), so it imports its own code."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: The green install's change: every added line counts ten times.
ORIGINAL = "                    added = int(a)\n"
PATCHED = "                    added = int(a) * 10  # green: counts differently\n"
#: ... and declares it, as the change that makes the analysis store other numbers must
#: (docs/rollouts.md#result-contract): without it the contract stops the rollout.
UNDECLARED = "DECLARED_EFFECT: frozenset[str] = frozenset()\n"
DECLARED = 'DECLARED_EFFECT: frozenset[str] = frozenset({"insertions"})\n'


def install(dest: Path, *, patch: bool) -> Path:
    """A copy of this source tree at ``dest``; with ``patch``, counting added lines ×10
    (and declaring that it changes insertions)."""
    dest.mkdir(parents=True)
    shutil.copy2(ROOT / "manage.py", dest / "manage.py")
    for name in ("dashboard", "workers", "templates"):
        shutil.copytree(ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
    if patch:
        numstat = dest / "workers" / "analysis" / "numstat.py"
        text = numstat.read_text()
        assert text.count(ORIGINAL) == 1, "the patched line moved: update tests/support/installs.py"
        numstat.write_text(text.replace(ORIGINAL, PATCHED))
        analyzer = dest / "workers" / "analysis" / "analyzer.py"
        text = analyzer.read_text()
        assert text.count(UNDECLARED) == 1, (
            "the declaration moved: update tests/support/installs.py"
        )
        analyzer.write_text(text.replace(UNDECLARED, DECLARED))
    return dest


def code_version_of(copy: Path) -> str:
    """The code version the copy derives (a fresh process of it)."""
    return subprocess.run(
        [sys.executable, "-c", "from workers.analysis import CODE_VERSION; print(CODE_VERSION)"],
        cwd=copy,
        env={**os.environ, "PYTHONPATH": str(copy)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def pool_of(
    copy: Path, env: dict[str, str], *, workers: int = 2, log: Path | None = None
) -> subprocess.Popen[bytes]:
    """The copy's ``manage.py worker --workers N`` pool, in a session of its own (its
    output to ``log`` if given)."""
    out = open(log, "ab") if log is not None else None  # noqa: SIM115 (the child's)
    try:
        return subprocess.Popen(
            [sys.executable, str(copy / "manage.py"), "worker", "--workers", str(workers)],
            cwd=copy,
            env={**env, "PYTHONPATH": str(copy)},
            start_new_session=True,
            stdout=out,
            stderr=subprocess.STDOUT if out is not None else None,
        )
    finally:
        if out is not None:
            out.close()
