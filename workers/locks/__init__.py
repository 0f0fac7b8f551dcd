"""Redlock over N independent Redis masters, with heartbeat extension and fencing tokens.

Contract (see docs/locks.md):

* A lock is held only while a majority (``N // 2 + 1``) of masters store our value and the
  client-side validity ``ttl - elapsed - drift`` (monotonic clock) is positive; ``acquire``
  hands out a lock only with at least ``min_validity`` (a fraction of the TTL) left.
* Every call goes to all masters at once, each bounded by ``node_timeout`` (far below any
  TTL), and returns as soon as its outcome is decided.
* The stored value is JSON naming the holder (nonce, worker, host, pid, job, version, token,
  acquired_at); release, extend and retag are compare-and-set Lua scripts that match the
  value's ``{"nonce":"…",`` prefix, so only the holder that wrote it can touch it.
* Fencing tokens come from ``token_source`` (the database counter) and are confirmed on a
  quorum inside the counter's transaction, so only a lock Redis agrees on advances the
  counter. Redis alone cannot make them safe; every guarded write must check the token in
  the database. Correctness rests on that check.
* Multi-key locks are all or nothing on each master (one script). ``Lock.token`` is the
  token of the first key; ``Lock.tokens`` maps every key to its own token.

Layers, each its own module: ``errors`` (what callers catch), ``scripts`` (stored value and
Lua), ``transport`` (fan-out to the masters), ``algorithm`` (``Redlock``: quorum acquire,
extend, release, ``hold``), ``lock`` (a held lease), ``heartbeat`` (the extending thread and
its callback thread), ``inspection`` (inspect, list, force release).

Fork-safe: a forked child (an RQ work horse) gets fresh threads on fork.
"""

from __future__ import annotations

from workers.locks.algorithm import Redlock, TokenSource
from workers.locks.errors import LockError, LockLost, LockNotAcquired, LockNotOwned
from workers.locks.keys import PREFIX, chunk, deploy, mirror, parse, repo_prefix, warm
from workers.locks.lock import Lock
from workers.locks.stats import COUNTERS

__all__ = [
    "COUNTERS",
    "PREFIX",
    "Lock",
    "LockError",
    "LockLost",
    "LockNotAcquired",
    "LockNotOwned",
    "Redlock",
    "TokenSource",
    "chunk",
    "deploy",
    "mirror",
    "parse",
    "repo_prefix",
    "warm",
]
