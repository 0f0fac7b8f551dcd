"""The analysis benchmark's synthetic histories (``bench/analysis.py``): the default shape
and the pull-request-style one that ``--merge-share`` asks for, built by real
``git fast-import`` into a temporary folder and counted by git."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bench.analysis import _Synth, build_repository


def _count(repo: Path, *extra: str) -> int:
    out = subprocess.run(
        ["git", "-C", str(repo), "rev-list", "--count", *extra, "HEAD"],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(out.stdout)


def test_merge_share_gives_about_that_share_of_merges(tmp_path: Path) -> None:
    build_repository(tmp_path / "pr", 800, 2, repack=False, merge_share=0.25)
    total, merges = _count(tmp_path / "pr"), _count(tmp_path / "pr", "--merges")
    assert total == 800
    assert 0.2 <= merges / total <= 0.3, merges


def test_the_default_shape_keeps_few_merges(tmp_path: Path) -> None:
    build_repository(tmp_path / "plain", 800, 2, repack=False)
    total, merges = _count(tmp_path / "plain"), _count(tmp_path / "plain", "--merges")
    assert total == 800
    assert 0 < merges / total < 0.06, merges


@pytest.mark.parametrize("share", [0.0, -0.1, 0.3, 1.0])
def test_a_share_the_shape_cannot_give_is_refused(share: float) -> None:
    with pytest.raises(ValueError, match="merge_share"):
        _Synth(1, share)
