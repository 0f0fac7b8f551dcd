"""workers.analysis.chunks: content-defined chunk boundaries (the end-to-end re-plan after a crash
is covered in tests/system/test_crashes.py and tests/system/test_pipeline.py)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import pytest

from workers.analysis.chunks import (
    MERGE_WEIGHT,
    ShaList,
    chunk_key,
    chunk_target,
    iter_chunks,
    iter_weighted_chunks,
    plan_chunks,
)


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


# --------------------------------------------------------------------------- ShaList


def test_a_sha_list_gives_back_the_hex_shas_and_holds_twenty_bytes_each() -> None:
    shas = _shas(1000)
    compact = ShaList(shas)
    assert len(compact) == 1000 and compact.nbytes == 20_000
    assert list(compact) == shas and compact == shas and compact == ShaList(shas)
    assert compact[0] == shas[0] and compact[-1] == shas[-1] and compact[500] == shas[500]
    assert compact[10:13] == shas[10:13] and compact[::-1] == shas[::-1]
    assert shas[7] in compact and "0" * 40 not in compact
    assert compact != shas[:-1] and compact != [*shas[:-1], "0" * 40]
    with pytest.raises(IndexError):
        compact[1000]
    with pytest.raises(IndexError):
        compact[-1001]


def test_a_sha_list_takes_sha256_names_but_never_two_widths() -> None:
    long = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(3)]
    compact = ShaList(long)
    assert compact == long and compact.nbytes == 96
    with pytest.raises(ValueError):
        compact.append(_shas(1)[0])
    with pytest.raises(ValueError):
        ShaList(_shas(1)).append(long[0])


@pytest.mark.parametrize(
    "bad",
    ["", "abc", "A" * 40, "g" * 40, " " + "a" * 39, "a" * 41, "a" * 39 + "\n", "aa " * 13 + "a"],
)
def test_a_sha_list_refuses_anything_but_a_full_lowercase_sha(bad: str) -> None:
    compact = ShaList()
    with pytest.raises(ValueError):
        compact.append(bad)
    with pytest.raises(ValueError):
        compact.extend_lines(bad.encode() + b"\n")
    assert len(compact) == 0 and list(compact) == [] and compact == []


def test_sha_lines_are_taken_whole_and_checked() -> None:
    shas = _shas(5)
    compact = ShaList()
    compact.extend_lines("".join(f"{s}\n" for s in shas[:2]).encode())
    compact.extend_lines(b"")
    compact.extend_lines("".join(f"{s}\n" for s in shas[2:]).encode())
    assert compact == shas
    for bad in (shas[0].encode(), f"{shas[0]}\n{shas[1]}".encode(), f"{shas[0]}\n\n".encode()):
        with pytest.raises(ValueError):
            ShaList().extend_lines(bad)
    refused = ShaList()
    with pytest.raises(ValueError):
        refused.extend_lines(("f" * 64 + "\n").encode() + b"x\n")
    refused.append(shas[0])  # a refused batch decided no width
    assert refused == shas[:1]


def test_parent_lines_mark_merges_and_keep_the_shas() -> None:
    """``git rev-list --parents`` lines: a root (no parent), ordinary commits, a merge and
    an octopus; taken in two blocks. The shas are the first of each line; merges weigh
    ``1 + MERGE_WEIGHT``, the rest 1."""
    shas = _shas(6, "p")
    lines = [
        shas[0],
        f"{shas[1]} {shas[0]}",
        f"{shas[2]} {shas[0]}",
        f"{shas[3]} {shas[1]} {shas[2]}",  # a merge
        f"{shas[4]} {shas[3]}",
        f"{shas[5]} {shas[4]} {shas[1]} {shas[2]}",  # an octopus
    ]
    compact = ShaList()
    compact.extend_parent_lines("".join(f"{x}\n" for x in lines[:3]).encode())
    compact.extend_parent_lines(b"")
    compact.extend_parent_lines("".join(f"{x}\n" for x in lines[3:]).encode())
    assert compact == shas
    heavy = 1 + MERGE_WEIGHT
    assert list(compact.weights()) == list(zip(shas, [1, 1, 1, heavy, 1, heavy], strict=True))
    assert compact.weight() == 4 + 2 * heavy
    # plain lines know nothing of merges: every weight 1
    plain = ShaList(shas)
    assert [w for _, w in plain.weights()] == [1] * 6 and plain.weight() == 6
    for bad in (
        f"{shas[0]} {shas[1]}".encode(),  # no newline
        f"{shas[0]}  {shas[1]}\n".encode(),
        f"{shas[0]} {shas[1][:39]}\n".encode(),
        f"{shas[0]} \n".encode(),
        f"{shas[0]}\n\n".encode(),
    ):
        with pytest.raises(ValueError):
            ShaList().extend_parent_lines(bad)


def test_a_heavy_commit_is_a_cut_point_in_proportion_to_its_weight() -> None:
    """Weighted cuts: a commit ends a chunk when ``int(sha[:8], 16) % target < weight``,
    and a chunk ends once it weighs ``2 * target``; with every weight 1 the chunks are
    exactly the unweighted ones."""
    shas = _shas(3000, "q")
    target = 40
    weights = [1 + MERGE_WEIGHT if i % 3 == 0 else 1 for i in range(len(shas))]
    chunks = list(iter_weighted_chunks(zip(shas, weights, strict=True), target=target))
    assert [s for c in chunks for s in c] == shas
    weight_of = dict(zip(shas, weights, strict=True))

    def cut(sha: str) -> bool:
        return int(sha[:8], 16) % target < weight_of[sha]

    for chunk in chunks[:-1]:
        total = sum(weight_of[s] for s in chunk)
        assert cut(chunk[-1]) or total >= 2 * target
        assert not any(cut(s) for s in chunk[:-1])
        assert sum(weight_of[s] for s in chunk[:-1]) < 2 * target
    # heavier commits, more cuts: more chunks than the same list weighing 1 each
    plain = plan_chunks(shas, target=target)
    assert len(chunks) > len(plain)
    assert list(iter_weighted_chunks(((s, 1) for s in shas), target=target)) == plain
    # content-defined: dropping whole finished chunks keeps the others
    done = sum(len(c) for c in chunks[:5])
    rest = zip(shas[done:], weights[done:], strict=True)
    assert list(iter_weighted_chunks(rest, target=target)) == chunks[5:]


def test_planning_a_sha_list_yields_exactly_the_chunks_of_the_plain_list() -> None:
    shas = _shas(3000, "w")
    for target in (1, 7, 100, 1000):
        assert plan_chunks(ShaList(shas), target=target) == plan_chunks(shas, target=target)


def test_chunks_are_cut_while_the_pending_shas_are_read() -> None:
    shas = _shas(400, "v")
    read: list[int] = []

    def pending() -> Iterator[str]:
        for i, sha in enumerate(shas):
            read.append(i)
            yield sha

    chunks = iter_chunks(pending(), target=5)
    first = next(chunks)
    assert len(read) == len(first)  # nothing beyond the first chunk was read yet
    assert [first, *chunks] == plan_chunks(shas, target=5)
    with pytest.raises(ValueError):
        iter_chunks(shas, target=0)  # checked at once, not on the first next()


# ---------------------------------------------------------------- targets that grow


def test_the_target_doubles_from_the_floor_while_the_history_spans_spread_targets() -> None:
    targets = {
        n: chunk_target(n, floor=1000, ceiling=4000, spread=4)
        for n in (0, 1, 999, 7_999, 8_000, 15_999, 16_000, 20_000, 10**6)
    }
    assert targets == {
        0: 1000,
        1: 1000,
        999: 1000,
        7_999: 1000,
        8_000: 2000,
        15_999: 2000,
        16_000: 4000,
        20_000: 4000,
        10**6: 4000,  # the ceiling
    }
    # never below the floor, whatever the ceiling; a ceiling between powers stops below it
    assert chunk_target(10**6, floor=1000, ceiling=500, spread=4) == 1000
    assert chunk_target(10**6, floor=1000, ceiling=7000, spread=4) == 4000
    assert chunk_target(10**6, floor=1000, ceiling=1000, spread=4) == 1000  # fixed
    assert chunk_target(10**6, floor=3, ceiling=10**9, spread=1) == 3 * 2**18
    with pytest.raises(ValueError):
        chunk_target(10, floor=0, ceiling=10, spread=1)
    with pytest.raises(ValueError):
        chunk_target(10, floor=1, ceiling=10, spread=0)


@pytest.mark.parametrize("n", [1, 7, 100, 2_500, 20_000, 70_000])
def test_a_grown_target_still_covers_every_commit_once_in_order_and_replans_the_same(
    n: int,
) -> None:
    shas = _shas(n, f"h{n}")
    target = chunk_target(n, floor=50, ceiling=3200, spread=4)
    assert target == chunk_target(n, floor=50, ceiling=3200, spread=4)
    chunks = plan_chunks(shas, target=target)
    assert [s for c in chunks for s in c] == shas  # each commit exactly once, in order
    assert all(1 <= len(c) <= 2 * target for c in chunks)
    assert plan_chunks(list(shas), target=target) == chunks
    if n >= 2 * 4 * 50:  # long enough to grow: fewer chunks than at the floor
        assert target > 50
        assert len(chunks) < len(plan_chunks(shas, target=50))
        # still split for the workers: at least spread targets, each chunk <= 2 targets
        assert n >= 4 * target and len(chunks) >= 2
