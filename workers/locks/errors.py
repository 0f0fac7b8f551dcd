"""The lock failures every caller may catch, and how a master's error is described."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import redis


class LockError(Exception):
    """Base class of every lock failure."""


class LockNotAcquired(LockError):
    """No quorum (or not enough validity left) after every attempt.

    ``reasons`` maps each master to what it answered on the last attempt
    (``"acquired"``, ``"refused: held"``, ``"timeout"``, ``"connection refused"``, …), plus
    ``"validity"`` / ``"token_source"`` entries when the attempt failed after the quorum.
    """

    def __init__(self, keys: Sequence[str], reasons: Mapping[str, str], attempts: int) -> None:
        self.keys = list(keys)
        self.reasons = dict(reasons)
        self.attempts = attempts
        detail = "; ".join(f"{node}: {why}" for node, why in self.reasons.items())
        super().__init__(
            f"could not lock {self.keys} after {attempts} attempt(s); last attempt: {detail}"
        )


class LockLost(LockError):
    """The lease is gone (or may be): stop writing, abort the job."""


class LockNotOwned(LockLost):
    """Release/extend found a majority of masters not holding our value."""


def describe(exc: BaseException) -> str:
    """A short reason for one master's failure (``"timeout"``, ``"connection refused"``, …)."""
    if isinstance(exc, redis.TimeoutError):
        return "timeout"
    if isinstance(exc, redis.ConnectionError):
        text = str(exc)
        if "refused" in text.lower() or "111" in text:
            return "connection refused"
        return f"connection error: {text}"
    return f"error: {type(exc).__name__}: {exc}"
