"""workers.git.workspace: the per-host layout (clean-up of left-over temporaries by real
processes is covered in tests/workers/git/test_sanitation.py, host locks in
tests/workers/git/test_host_lock.py)."""

from __future__ import annotations

from pathlib import Path

from workers.git.workspace import host_lock_path, mirror_path, new_temporary, temporaries, tmp_dir


def test_layout(tmp_path: Path) -> None:
    assert mirror_path(tmp_path, 7) == tmp_path / "mirrors" / "7.git"
    lock = host_lock_path(tmp_path, 7)
    assert lock.parent == mirror_path(tmp_path, 7).parent  # beside the mirror, not inside
    assert not lock.is_relative_to(mirror_path(tmp_path, 7))
    assert tmp_dir(tmp_path) == tmp_path / "tmp"


def test_new_temporaries_are_fresh_names_found_per_repository(tmp_path: Path) -> None:
    assert temporaries(tmp_path, 1) == []  # no tmp/ yet
    a = new_temporary(tmp_path, 1)
    b = new_temporary(tmp_path, 1)
    assert a != b and a.parent == b.parent == tmp_dir(tmp_path)
    assert tmp_dir(tmp_path).is_dir() and not a.exists()
    assert temporaries(tmp_path, 1) == []  # names only: nothing was created yet
    a.mkdir()
    b.mkdir()
    other = new_temporary(tmp_path, 11)  # "11-" must not match repository 1's "1-*"
    other.mkdir()
    (tmp_dir(tmp_path) / "1-notes.txt").write_text("")
    assert temporaries(tmp_path, 1) == sorted([a, b])
    assert temporaries(tmp_path, 11) == [other]
