"""workers.chunks: content-defined chunk boundaries (the end-to-end re-plan after a crash
is covered in tests/test_crashes.py and tests/test_pipeline.py)."""

from __future__ import annotations

import hashlib

import pytest

from workers.chunks import chunk_key, plan_chunks


def _shas(n: int, salt: str = "") -> list[str]:
    return [hashlib.sha1(f"{salt}{i}".encode()).hexdigest() for i in range(n)]


def _cut(sha: str, target: int) -> bool:
    return int(sha[:8], 16) % target == 0


def test_chunks_cover_the_list_in_order_and_end_on_cut_points_or_the_size_cap() -> None:
    shas = _shas(500)
    chunks = plan_chunks(shas, target=7)
    assert [s for c in chunks for s in c] == shas
    for chunk in chunks[:-1]:
        assert len(chunk) == 14 or _cut(chunk[-1], 7)
        assert 1 <= len(chunk) <= 14
        # no earlier commit of the chunk was a cut point
        assert not any(_cut(s, 7) for s in chunk[:-1])
    assert len(chunks) > 1


def test_replanning_yields_the_same_chunks_and_keys() -> None:
    shas = _shas(300, "x")
    first = plan_chunks(shas, target=5)
    again = plan_chunks(list(shas), target=5)
    assert first == again
    assert [chunk_key(c) for c in first] == [chunk_key(c) for c in again]


def test_removing_finished_leading_chunks_keeps_the_others() -> None:
    shas = _shas(300, "y")
    chunks = plan_chunks(shas, target=5)
    done = sum(len(c) for c in chunks[:3])
    assert plan_chunks(shas[done:], target=5) == chunks[3:]


def test_target_one_cuts_after_every_commit() -> None:
    shas = _shas(10)
    assert plan_chunks(shas, target=1) == [[s] for s in shas]


def test_size_cap_is_twice_the_target_when_no_cut_point_falls() -> None:
    target = 1000
    no_cut = [s for s in _shas(5000, "z") if not _cut(s, target)][:4500]
    chunks = plan_chunks(no_cut, target=target)
    assert [len(c) for c in chunks] == [2000, 2000, 500]


def test_a_cut_point_sha_ends_a_chunk_early() -> None:
    cut = "00000000" + "a" * 32  # int(0) % target == 0 for any target
    other = [s for s in _shas(50) if not _cut(s, 10)][:3]
    chunks = plan_chunks([other[0], cut, other[1], other[2]], target=10)
    assert chunks == [[other[0], cut], [other[1], other[2]]]


def test_empty_list_and_bad_target() -> None:
    assert plan_chunks([], target=3) == []
    with pytest.raises(ValueError):
        plan_chunks(_shas(3), target=0)


def test_chunk_key_scheme() -> None:
    a, b, c = _shas(3)
    assert chunk_key([a]) == a
    assert chunk_key([a, b, c]) == f"{a}..{c}"
    with pytest.raises(ValueError):
        chunk_key([])
