"""Every lock key (docs/locks.md), built and parsed in one place (pure: no Django, no Redis).

Keys::

    locks:git:repo:{repo_id}:mirror                       any write to a repository's mirror
    locks:git:repo:{repo_id}:commit:{first}..{last}       one analysis chunk
    locks:git:repo:{repo_id}:commit:{sha}                 a single-commit chunk
    locks:queue:{queue}:deploy                            a rollout of a queue (docs/rollouts.md)
    locks:queue:{queue}:warm:{fingerprint}                warming one version's caches

``parse(key)`` is the inverse of every builder (``build(parse(k)) == k``); a key that is not
ours parses to a ``LockKey`` of kind ``"other"`` so callers can still show it verbatim.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PREFIX = "locks:"

_QUEUE = re.compile(r"^[A-Za-z0-9_.@-]{1,100}$")
_SHA = re.compile(r"^[0-9a-f]{4,64}$")
_FP = re.compile(r"^[0-9a-f]{6,64}$")


@dataclass(frozen=True)
class LockKey:
    """A parsed key. ``kind`` is mirror | chunk | deploy | warm | other."""

    kind: str
    key: str
    repo_id: int | None = None
    first: str | None = None
    last: str | None = None
    queue: str | None = None
    fingerprint: str | None = None

    def label(self) -> str:
        """What the lock guards, for people (``commits 1a2b3c4d..5e6f7a8b``)."""
        if self.kind == "mirror":
            return "mirror"
        if self.kind == "chunk" and self.first is not None:
            if self.last is None:
                return f"commit {self.first[:8]}"
            return f"commits {self.first[:8]}..{self.last[:8]}"
        if self.kind == "deploy":
            return f"deploy {self.queue}"
        if self.kind == "warm" and self.fingerprint is not None:
            return f"warming {self.queue}@{self.fingerprint[:8]}"
        return self.key


def _repo(repo_id: int) -> str:
    if not isinstance(repo_id, int) or isinstance(repo_id, bool) or repo_id < 0:
        raise ValueError(f"repository id must be a non-negative int, not {repo_id!r}")
    return f"{PREFIX}git:repo:{repo_id}"


def _queue(queue: str) -> str:
    if not _QUEUE.match(queue):
        raise ValueError(f"invalid queue name {queue!r}")
    return f"{PREFIX}queue:{queue}"


def mirror(repo_id: int) -> str:
    return f"{_repo(repo_id)}:mirror"


def chunk(repo_id: int, span: str) -> str:
    """``span`` is a chunk key: ``first..last`` or a single ``sha``."""
    first, sep, last = span.partition("..")
    if not _SHA.match(first) or (sep and not _SHA.match(last)):
        raise ValueError(f"invalid chunk span {span!r}")
    return f"{_repo(repo_id)}:commit:{span}"


def deploy(queue: str) -> str:
    return f"{_queue(queue)}:deploy"


def warm(queue: str, fingerprint: str) -> str:
    if not _FP.match(fingerprint):
        raise ValueError(f"invalid fingerprint {fingerprint!r}")
    return f"{_queue(queue)}:warm:{fingerprint}"


def repo_prefix(repo_id: int) -> str:
    """Prefix of every key guarding repository ``repo_id`` (for listing its locks)."""
    return f"{_repo(repo_id)}:"


def parse(key: str) -> LockKey:
    """Inverse of the builders; anything else is ``kind="other"``."""
    other = LockKey(kind="other", key=key)
    if not key.startswith(PREFIX):
        return other
    parts = key[len(PREFIX) :].split(":")
    if len(parts) >= 4 and parts[0] == "git" and parts[1] == "repo" and parts[2].isdigit():
        repo_id = int(parts[2])
        if str(repo_id) != parts[2]:
            return other
        if parts[3:] == ["mirror"]:
            return LockKey(kind="mirror", key=key, repo_id=repo_id)
        if len(parts) == 5 and parts[3] == "commit":
            first, sep, last = parts[4].partition("..")
            if _SHA.match(first) and (not sep or _SHA.match(last)):
                return LockKey(
                    kind="chunk", key=key, repo_id=repo_id, first=first, last=last or None
                )
        return other
    if len(parts) >= 3 and parts[0] == "queue" and _QUEUE.match(parts[1]):
        if parts[2:] == ["deploy"]:
            return LockKey(kind="deploy", key=key, queue=parts[1])
        if len(parts) == 4 and parts[2] == "warm" and _FP.match(parts[3]):
            return LockKey(kind="warm", key=key, queue=parts[1], fingerprint=parts[3])
    return other


def build(parsed: LockKey) -> str:
    """The key a parsed ``LockKey`` came from (``kind="other"`` returns it verbatim)."""
    if parsed.kind == "mirror" and parsed.repo_id is not None:
        return mirror(parsed.repo_id)
    if parsed.kind == "chunk" and parsed.repo_id is not None and parsed.first:
        span = f"{parsed.first}..{parsed.last}" if parsed.last else parsed.first
        return chunk(parsed.repo_id, span)
    if parsed.kind == "deploy" and parsed.queue:
        return deploy(parsed.queue)
    if parsed.kind == "warm" and parsed.queue and parsed.fingerprint:
        return warm(parsed.queue, parsed.fingerprint)
    return parsed.key
