"""Inspection and operator calls: who holds a key on how many masters, every held lock,
and forced release (compare-and-delete on a holder's nonce). ``Redlock`` exposes these as
``inspect``, ``list_locks`` and ``force_release``."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from workers.locks.masters import Node, Vote
from workers.locks.scripts import decode, glob_escape, nonce_prefix
from workers.locks.transport import Transport


def inspect_many(transport: Transport, keys: Sequence[str]) -> dict[str, dict[str, Any]]:
    """For each key held on any master: holder, remaining TTL (ms, minimum over the agreeing
    masters) and how many masters agree on the holder (same nonce)."""
    if not keys:
        return {}

    def read(node: Node) -> list[Any]:
        pipe = node.client.pipeline(transaction=False)
        for key in keys:
            pipe.get(key)
            pipe.pttl(key)
        return list(pipe.execute(raise_on_error=False))

    n = len(transport.nodes)
    rnd = transport.broadcast(
        read,
        lambda replies: Vote(True, "ok", replies),
        deadline=time.monotonic() + transport.call_budget,
        need=n,
        wait_all=True,
    )
    out: dict[str, dict[str, Any]] = {}
    for k_index, key in enumerate(keys):
        groups: dict[str, list[tuple[dict[str, Any], int]]] = {}
        for vote in rnd.votes.values():
            replies = vote.result
            if not vote.ok or not isinstance(replies, list):
                continue
            raw, pttl = replies[2 * k_index], replies[2 * k_index + 1]
            if not isinstance(raw, bytes) or not isinstance(pttl, int) or pttl == -2:
                continue
            nonce, holder = decode(raw)
            group = nonce if nonce is not None else "raw:" + raw.hex()
            groups.setdefault(group, []).append((holder, pttl))
        if not groups:
            continue
        best = max(groups.values(), key=lambda g: (len(g), min(p for _, p in g)))
        # Prefer a copy that already carries the token (a retag may reach only a quorum).
        holder = max((h for h, _ in best), key=lambda h: h.get("token") is not None)
        nonce = next(iter(nonce for nonce, g in groups.items() if g is best), None)
        out[key] = {
            "key": key,
            "nonce": nonce if nonce and not nonce.startswith("raw:") else None,
            "holder": holder,
            "ttl_ms": min(p for _, p in best),
            "agreeing": len(best),
            "masters": n,
        }
    return out


def list_locks(transport: Transport, prefix: str) -> list[dict[str, Any]]:
    """``inspect`` of every key under ``prefix`` found by SCAN on any master, sorted by key."""

    def scan(node: Node) -> set[bytes]:
        return set(node.client.scan_iter(match=glob_escape(prefix) + "*", count=1000))

    rnd = transport.broadcast(
        scan,
        lambda found: Vote(True, "ok", found),
        deadline=time.monotonic() + transport.call_budget,
        need=len(transport.nodes),
        wait_all=True,
    )
    keys: set[str] = set()
    for vote in rnd.votes.values():
        if vote.ok and isinstance(vote.result, set):
            keys.update(k.decode("utf-8", errors="replace") for k in vote.result)
    found = inspect_many(transport, sorted(keys))
    return [found[k] for k in sorted(found)]


def force_release(transport: Transport, key: str, nonce: str) -> int:
    """Delete ``key`` on every master where ``nonce`` still holds it; return on how many.

    Compare-and-delete: a newer holder's lease is never touched. The caller must bump the
    fencing token so the old holder's late writes are rejected, and should bump it *before*
    calling this: a job that acquires in between then gets a token newer than the bump.
    """
    rnd = transport.broadcast_script(
        "release",
        (key,),
        [nonce_prefix(nonce)],
        lambda result: Vote(result == 1, "released" if result == 1 else "not held", result),
        deadline=time.monotonic() + transport.call_budget,
        need=len(transport.nodes),
        wait_all=True,
    )
    return rnd.yes
