"""The analysis code's version, derived from the installed code (docs/analysis.md#code-version).

A version of the analyzer is code + configuration. The code part is not a constant
someone has to remember to bump: it is ``<package version>+<hash>``, where the hash is
the first 12 hex digits of a SHA-256 over the source of every module that decides what
numbers are stored (:data:`SOURCES`, relative to the ``workers`` package):

* ``analysis/*.py``: the configuration and its fingerprint, the git arguments and the
  parser of ``git log --numstat`` (``history``, ``numstat``), languages, chunks;
* ``git/paths.py``: the stored text of a path that is not UTF-8;
* ``git/runner.py``: the hardened environment and ``-c`` options every git command runs
  with (they change what git prints).

Not included: ``git/commit_view.py`` (one commit's page: shown, never stored), the
mirror and fetch code (which commits exist, not what they count), anything in
``dashboard/`` (it stores the rows the analysis returns, unchanged).

Deterministic across installs of the same commit: the hash reads the files' bytes in the
order of their sorted relative paths (each path and its length go into the hash too, so
moving code between files changes it), never a timestamp, ``hash()`` or the install
location. :func:`derive` is computed once per process, at import (``CODE_VERSION`` in
``workers.analysis.analyzer``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

__all__ = ["HASH_DIGITS", "SOURCES", "derive", "package_version", "source_files", "source_hash"]

#: Glob patterns, relative to the ``workers`` package directory, of the code that decides
#: the stored numbers (see the module docstring for what is left out and why).
SOURCES = ("analysis/*.py", "git/paths.py", "git/runner.py")
#: Hex digits of the source hash kept in the code version.
HASH_DIGITS = 12
#: The ``workers`` package directory of this install.
WORKERS_DIR = Path(__file__).resolve().parents[1]


def package_version() -> str:
    """The installed distribution's version (``pyproject.toml``), or ``0`` when gitward
    runs from a source tree that was never installed."""
    try:
        return metadata.version("gitward")
    except metadata.PackageNotFoundError:
        return "0"


def source_files(root: Path = WORKERS_DIR, patterns: Iterable[str] = SOURCES) -> list[Path]:
    """The files hashed, sorted by their path relative to ``root`` (POSIX form)."""
    found = {p for pattern in patterns for p in root.glob(pattern) if p.is_file()}
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def source_hash(root: Path = WORKERS_DIR, patterns: Iterable[str] = SOURCES) -> str:
    """SHA-256 over (relative path, size, bytes) of each source file, in path order."""
    digest = hashlib.sha256()
    for path in source_files(root, patterns):
        data = path.read_bytes()
        name = path.relative_to(root).as_posix().encode()
        digest.update(b"%d:%s\0%d\0" % (len(name), name, len(data)))
        digest.update(data)
    return digest.hexdigest()[:HASH_DIGITS]


def derive(root: Path = WORKERS_DIR) -> str:
    """``<package version>+<source hash>``, e.g. ``0.1.0+3f2a9c1e0b12``."""
    return f"{package_version()}+{source_hash(root)}"
