"""Deterministic chunk planning.

Boundaries are content-defined: a chunk ends after a commit whose sha falls on a cut
point (``int(sha[:8], 16) % target == 0``) or when it reaches ``2 * target`` commits,
and always at the end of the list. A boundary therefore depends only on the commits
themselves and on where the previous chunk ended, so re-planning the same pending list
(after a crash, a redelivery or a duplicate submission) yields the same chunks, the
same keys and the same job ids; and removing whole finished chunks from the list does
not move the boundaries of the others.
"""

from __future__ import annotations

from collections.abc import Sequence


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
