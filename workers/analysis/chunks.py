"""Deterministic chunk planning, and a compact list of shas to plan from.

Boundaries are content-defined: a chunk ends after a commit whose sha falls on a cut
point (``int(sha[:8], 16) % target == 0``) or when it reaches ``2 * target`` commits,
and always at the end of the list. A boundary therefore depends only on the commits
themselves and on where the previous chunk ended, so re-planning the same pending list
(after a crash, a redelivery or a duplicate submission) yields the same chunks, the
same keys and the same job ids; and removing whole finished chunks from the list does
not move the boundaries of the others.

Memory (flat as histories grow): a sync lists a repository's whole history. :class:`ShaList` holds
it as raw bytes (20 a sha, 32 for SHA-256) in one ``bytearray`` instead of one Python
``str`` per commit (~90 bytes each plus the list's pointer), and :func:`iter_chunks`
yields one chunk at a time, so planning holds the compact list plus one chunk of text.

Chunks are cut by an estimate of git's cost, not by commit count alone
(docs/analysis.md#chunking): a merge is diffed against its first parent, so it carries the
whole merged branch's changes, and on real histories its diff costs several times an
ordinary commit's (measured: 2–12× the changed lines). So a merge weighs ``MERGE_WEIGHT`` +
1 and every other commit 1; a commit is a cut point with probability ``weight / target``
(``int(sha[:8], 16) % target < weight``) and a chunk ends at ``2 * target`` weight at the
latest. Whether a commit is a merge is a fact of the commit, so the cuts stay
content-defined. ``git rev-list --parents`` tells merges apart at no extra cost
(``ShaList.extend_parent_lines``).

The target itself grows with the history (``chunk_target``): per-chunk costs (an RQ job
and its forked work horse with fresh connections, a lease, a git process, the bookkeeping
rows) are fixed, so a long history is cut into fewer, larger chunks — while it still
spans ``spread`` targets (so at least ``spread / 2`` chunks: the workers share it, progress
moves, a lease is held for a bounded time) — between a floor and a ceiling. It is a
function of the listed history's weight only, and takes only the values
``floor × 2^k``: re-planning the same history finds the same target, and so the same
chunks; a history must double before its target changes.
"""

from __future__ import annotations

import binascii
import re
from collections.abc import Iterable, Iterator, Sequence
from typing import overload

#: Raw sizes of the object names git prints: SHA-1 and SHA-256.
_WIDTHS = {40: 20, 64: 32}
_HEX = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_LINES = {20: re.compile(rb"(?:[0-9a-f]{40}\n)*"), 32: re.compile(rb"(?:[0-9a-f]{64}\n)*")}
#: ``git rev-list --parents`` lines: the commit, then its parents (none for a root).
_PARENT_LINES = {
    20: re.compile(rb"(?:[0-9a-f]{40}(?: [0-9a-f]{40})*\n)*"),
    32: re.compile(rb"(?:[0-9a-f]{64}(?: [0-9a-f]{64})*\n)*"),
}
#: What a merge weighs beyond an ordinary commit's 1 when chunks are cut (module
#: docstring): measured on real histories (BENCHMARKS.md, "cut by cost").
MERGE_WEIGHT = 4


class ShaList(Sequence[str]):
    """Full lowercase hex shas, oldest first, stored as raw bytes in one buffer.

    A ``Sequence[str]``: indexing and iterating give the hex strings back (made on
    demand), a slice is a plain ``list[str]``, and it compares equal to any sequence of
    the same strings in the same order. All shas share one width (the first decides);
    anything but a full lowercase hex sha of that width raises ``ValueError``.
    """

    __slots__ = ("_buf", "_merges", "_width")

    def __init__(self, shas: Iterable[str] = ()) -> None:
        self._buf = bytearray()
        self._width = 0
        #: One byte a sha, 1 for a merge, once any line came with its parents
        #: (``extend_parent_lines``); None: nothing known of merges (every weight 1).
        self._merges: bytearray | None = None
        for sha in shas:
            self.append(sha)

    def _width_of(self, hex_length: int) -> int:
        width = _WIDTHS.get(hex_length, 0)
        if not width or (self._width and width != self._width):
            raise ValueError(f"not a sha of this list's width: {hex_length} hex digits")
        return width

    def append(self, sha: str) -> None:
        if not _HEX.fullmatch(sha):
            raise ValueError(f"not a full lowercase hex sha: {sha!r}")
        self._width = self._width_of(len(sha))
        self._buf += bytes.fromhex(sha)

    def extend_lines(self, lines: bytes) -> None:
        """Append ``sha\\n`` lines (``git rev-list`` output, whole lines only), checked
        and converted at C speed: no Python object per sha."""
        if not lines:
            return
        end = lines.find(b"\n")
        width = self._width_of(len(lines) if end < 0 else end)
        if not _LINES[width].fullmatch(lines):
            raise ValueError("not sha lines of this list's width")
        if self._merges is not None:
            self._merges += bytes(lines.count(b"\n"))
        self._buf += binascii.unhexlify(lines.replace(b"\n", b""))
        self._width = width

    def extend_parent_lines(self, lines: bytes) -> None:
        """Append ``git rev-list --parents`` lines (whole lines only): each line's first
        sha, marked a merge when it has two parents or more. Checked at C speed like
        ``extend_lines``; then one split of the block and two list comprehensions
        (about 7 ms for 22,000 commits; a regular expression marking the merges took
        0.9 s, backtracking at every position)."""
        if not lines:
            return
        end = lines.find(b" ")
        newline = lines.find(b"\n")
        end = newline if end < 0 or (0 <= newline < end) else end
        width = self._width_of(len(lines) if end < 0 else end)
        if not _PARENT_LINES[width].fullmatch(lines):
            raise ValueError("not rev-list --parents lines of this list's width")
        if self._merges is None:
            self._merges = bytearray(len(self))
        rows = lines.split(b"\n")
        rows.pop()  # after the last newline: empty
        digits = 2 * width
        self._merges += bytes([row.count(b" ") >= 2 for row in rows])
        self._buf += binascii.unhexlify(b"".join([row[:digits] for row in rows]))
        self._width = width

    def weights(self) -> Iterator[tuple[str, int]]:
        """Each sha with its weight for cutting chunks: ``1 + MERGE_WEIGHT`` for a merge,
        1 otherwise (and 1 for every sha when the list knows nothing of merges)."""
        merges = self._merges
        if merges is None:
            for sha in self:
                yield sha, 1
            return
        heavy = 1 + MERGE_WEIGHT
        for sha, merge in zip(self, merges, strict=True):
            yield sha, heavy if merge else 1

    def weight(self) -> int:
        """The sum of ``weights()``: the listed history's weight (``chunk_target``)."""
        merges = self._merges.count(1) if self._merges is not None else 0
        return len(self) + MERGE_WEIGHT * merges

    def __len__(self) -> int:
        return len(self._buf) // self._width if self._width else 0

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> list[str]: ...
    def __getitem__(self, index: int | slice) -> str | list[str]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError("ShaList index out of range")
        w = self._width
        return self._buf[index * w : (index + 1) * w].hex()

    def __iter__(self) -> Iterator[str]:
        buf, w = self._buf, self._width
        for start in range(0, len(buf), w or 1):
            yield buf[start : start + w].hex()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ShaList):
            return self._buf == other._buf and (not self._buf or self._width == other._width)
        if isinstance(other, Sequence) and not isinstance(other, str | bytes):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, like list

    def __repr__(self) -> str:
        return f"ShaList(<{len(self)} shas>)"

    @property
    def nbytes(self) -> int:
        """Bytes the shas occupy (the buffer's content, not its allocation)."""
        return len(self._buf)


def chunk_target(total: int, *, floor: int, ceiling: int, spread: int) -> int:
    """The chunk target for a history of ``total`` weight (commits, a merge weighing
    ``1 + MERGE_WEIGHT``): ``floor × 2^k`` for the largest ``k`` that keeps the target at
    most ``ceiling`` (never below ``floor``) and ``total`` at least ``spread`` targets
    long. ``floor`` for anything lighter than ``2 × spread × floor``."""
    if floor < 1 or spread < 1:
        raise ValueError("floor and spread must be >= 1")
    target = floor
    while target * 2 <= ceiling and total >= target * 2 * spread:
        target *= 2
    return target


def iter_chunks(pending: Iterable[str], *, target: int) -> Iterator[list[str]]:
    """Split ``pending`` shas (oldest first, each weighing 1) into chunks of about
    ``target`` commits, yielded one at a time (``pending`` is read as the chunks are
    taken)."""
    return iter_weighted_chunks(((sha, 1) for sha in pending), target=target)


def iter_weighted_chunks(pending: Iterable[tuple[str, int]], *, target: int) -> Iterator[list[str]]:
    """Split ``pending`` ``(sha, weight)`` pairs (oldest first; ``ShaList.weights``) into
    chunks of about ``target`` weight, yielded one at a time. A sha is a cut point when
    ``int(sha[:8], 16) % target < weight``; a chunk also ends once it weighs
    ``2 * target``."""
    if target < 1:
        raise ValueError("target must be >= 1")
    return _chunks(pending, target)


def _chunks(pending: Iterable[tuple[str, int]], target: int) -> Iterator[list[str]]:
    current: list[str] = []
    weight = 0
    limit = 2 * target
    for sha, w in pending:
        current.append(sha)
        weight += w
        if weight >= limit or int(sha[:8], 16) % target < w:
            yield current
            current = []
            weight = 0
    if current:
        yield current


def plan_chunks(pending: Iterable[str], *, target: int) -> list[list[str]]:
    """Every chunk of :func:`iter_chunks` at once."""
    return list(iter_chunks(pending, target=target))


def chunk_key(shas: Sequence[str]) -> str:
    """``first..last`` (the chunk lock's key, docs/locks.md), or the sha of a one-commit chunk."""
    if not shas:
        raise ValueError("empty chunk")
    return shas[0] if len(shas) == 1 else f"{shas[0]}..{shas[-1]}"
