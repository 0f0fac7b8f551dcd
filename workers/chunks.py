"""Deterministic chunk planning.

Boundaries are content-defined: a chunk ends after a commit whose sha falls on a cut
point (``int(sha[:8], 16) % target == 0``) or when it reaches ``2 * target`` commits,
and always at the end of the list. A boundary therefore depends only on the commits
themselves and on where the previous chunk ended, so re-planning the same pending list
(after a crash, a redelivery or a duplicate submission) yields the same chunks, the
same keys and the same job ids; and removing whole finished chunks from the list does
not move the boundaries of the others.

The target itself grows with the history (``chunk_target``): per-chunk costs (an RQ job
and its forked work horse with fresh connections, a lease, a git process, the bookkeeping
rows) are fixed, so a long history is cut into fewer, larger chunks — while it still
spans ``spread`` targets (so at least ``spread / 2`` chunks: the workers share it, progress
moves, a lease is held for a bounded time) — between a floor and a ceiling. It is a
function of the length of the listed history only, and takes only the values
``floor × 2^k``: re-planning the same history finds the same target, and so the same
chunks; a history must double before its target changes.
"""

from __future__ import annotations

from collections.abc import Sequence


def chunk_target(total: int, *, floor: int, ceiling: int, spread: int) -> int:
    """The chunk target for a history of ``total`` commits: ``floor × 2^k`` for the
    largest ``k`` that keeps the target at most ``ceiling`` (never below ``floor``) and
    ``total`` at least ``spread`` targets long. ``floor`` for anything shorter than
    ``2 × spread × floor`` commits."""
    if floor < 1 or spread < 1:
        raise ValueError("floor and spread must be >= 1")
    target = floor
    while target * 2 <= ceiling and total >= target * 2 * spread:
        target *= 2
    return target


def plan_chunks(pending: Sequence[str], *, target: int) -> list[list[str]]:
    """Split ``pending`` shas (oldest first) into chunks of about ``target`` commits."""
    if target < 1:
        raise ValueError("target must be >= 1")
    chunks: list[list[str]] = []
    current: list[str] = []
    limit = 2 * target
    for sha in pending:
        current.append(sha)
        if len(current) >= limit or int(sha[:8], 16) % target == 0:
            chunks.append(current)
            current = []
    if current:
        chunks.append(current)
    return chunks


def chunk_key(shas: Sequence[str]) -> str:
    """``first..last`` (DESIGN §4 key scheme), or the sha of a one-commit chunk."""
    if not shas:
        raise ValueError("empty chunk")
    return shas[0] if len(shas) == 1 else f"{shas[0]}..{shas[-1]}"
