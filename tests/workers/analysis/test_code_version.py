"""workers.analysis.code_version: the code version is derived from the analysis source —
the same bytes give the same version wherever they are installed, one changed byte of a
hashed file gives another, a file outside the hashed set changes nothing."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from workers.analysis import analyzer
from workers.analysis.code_version import (
    HASH_DIGITS,
    SOURCES,
    WORKERS_DIR,
    derive,
    package_version,
    source_files,
    source_hash,
)

ROOT = Path(__file__).resolve().parents[3]


def copy_workers(dest: Path) -> Path:
    """A copy of this install's ``workers`` package (its source only)."""
    shutil.copytree(WORKERS_DIR, dest, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def test_the_process_code_version_is_the_package_version_and_the_source_hash() -> None:
    assert analyzer.CODE_VERSION == derive() == f"{package_version()}+{source_hash()}"
    assert re.fullmatch(rf"[0-9A-Za-z.]+\+[0-9a-f]{{{HASH_DIGITS}}}", analyzer.CODE_VERSION)
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'version = "{package_version()}"' in pyproject


def test_the_hashed_files_are_the_analysis_modules_and_the_git_text_and_runner() -> None:
    names = [p.relative_to(WORKERS_DIR).as_posix() for p in source_files()]
    analysis = sorted(
        p.relative_to(WORKERS_DIR).as_posix() for p in (WORKERS_DIR / "analysis").glob("*.py")
    )
    assert names == sorted([*analysis, "git/paths.py", "git/runner.py"])
    assert "analysis/numstat.py" in names and "analysis/code_version.py" in names
    assert SOURCES == ("analysis/*.py", "git/paths.py", "git/runner.py")


def test_two_installs_of_the_same_source_have_one_code_version(tmp_path: Path) -> None:
    a = copy_workers(tmp_path / "a" / "workers")
    b = copy_workers(tmp_path / "elsewhere" / "b" / "workers")
    os.utime(b / "analysis" / "numstat.py", (0, 0))  # timestamps mean nothing
    assert source_hash(a) == source_hash(b) == source_hash()


def test_one_changed_byte_of_analysis_source_changes_the_code_version(tmp_path: Path) -> None:
    copy = copy_workers(tmp_path / "workers")
    before = source_hash(copy)
    numstat = copy / "analysis" / "numstat.py"
    data = bytearray(numstat.read_bytes())
    data[-2] ^= 0x01  # one bit of one byte
    numstat.write_bytes(bytes(data))
    changed = source_hash(copy)
    assert changed != before
    numstat.write_bytes(bytes(data[:-2]) + bytes([data[-2] ^ 0x01]) + bytes(data[-1:]))
    assert source_hash(copy) == before  # the same bytes again: the same version


def test_a_new_or_moved_module_changes_it_and_unhashed_code_does_not(tmp_path: Path) -> None:
    copy = copy_workers(tmp_path / "workers")
    before = source_hash(copy)
    (copy / "git" / "commit_view.py").write_text("# shown, never stored\n")
    (copy / "remotes" / "urls.py").write_text("# which commits exist, not what they count\n")
    assert source_hash(copy) == before
    (copy / "analysis" / "extra.py").write_text("")
    assert source_hash(copy) != before
    (copy / "analysis" / "extra.py").unlink()
    languages = copy / "analysis" / "languages.py"
    languages.rename(copy / "analysis" / "languages2.py")  # same bytes, another name
    assert source_hash(copy) != before


def test_a_fresh_process_derives_the_same_code_version(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", "from workers.analysis import CODE_VERSION; print(CODE_VERSION)"],
        cwd=ROOT,
        env={**os.environ, "PYTHONHASHSEED": "12345"},
        capture_output=True,
        check=True,
        text=True,
    ).stdout.strip()
    assert out == analyzer.CODE_VERSION


def test_the_fingerprint_follows_the_code_version() -> None:
    assert analyzer.DEFAULT.fingerprint() == analyzer.DEFAULT.fingerprint(analyzer.CODE_VERSION)
    assert analyzer.DEFAULT.fingerprint() != analyzer.DEFAULT.fingerprint("1")
