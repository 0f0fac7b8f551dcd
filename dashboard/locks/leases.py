"""Locks as gitward runs and shows them: the process-wide Redlock (with database fencing
tokens), a job's lease reported to the live view, the Locks table, and forced release.

Keys are built and parsed only by ``workers.locks.keys``; the algorithm is
``workers.locks``. Events emitted: ``lock.acquired``, ``lock.extended``, ``lock.lost``,
``lock.released`` (after commit, through ``dashboard.infra.events``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Count
from django.utils import timezone

from dashboard import infra, observability
from dashboard.accounts import record_audit
from dashboard.infra import close_thread_connections, publish_event
from dashboard.locks.fencing import next_token
from dashboard.locks.worker_beats import live_worker_names
from dashboard.models import JobAttempt, Repository
from workers import locks
from workers.locks import Lock, Redlock
from workers.remotes import redact
from workers.runtime import failpoint

#: Extensions of each held lock, for the Locks table (a Redis hash: key → count).
EXTENSIONS_HASH = "gitward:lock-extensions"
HOUR = timedelta(hours=1)


@functools.cache
def _redlock(urls: tuple[str, ...], settings_key: tuple[float, ...]) -> Redlock:
    count, delay, jitter, drift, node_timeout = settings_key
    rl = Redlock(
        list(urls),
        retry_count=int(count),
        retry_delay=delay,
        retry_jitter=jitter,
        drift_factor=drift,
        node_timeout=node_timeout,
        token_source=next_token,
    )
    observability.watch_redlock(rl)  # its counters and latencies reach /metrics
    return rl


def redlock() -> Redlock:
    """The Redlock over the configured masters, with database fencing tokens (one
    instance per process and configuration)."""
    return _redlock(
        tuple(infra.redis_urls()),
        (
            settings.LOCK_RETRY_COUNT,
            settings.LOCK_RETRY_DELAY,
            settings.LOCK_RETRY_JITTER,
            settings.LOCK_DRIFT_FACTOR,
            settings.LOCK_NODE_TIMEOUT,
        ),
    )


def describe_resource(key: str) -> dict[str, Any]:
    """``locks:git:repo:7:commit:a..b`` → ``{key, repo: 7, what: "commits a..b"}``."""
    parsed = locks.parse(key)
    return {"key": key, "repo": parsed.repo_id, "what": parsed.label()}


def remaining_ttl(keys: list[str]) -> float | None:
    """Seconds until the longest of these leases ends; None if none is held."""
    remaining = [
        info["ttl_ms"] / 1000.0 for key in keys if (info := redlock().inspect(key)) is not None
    ]
    return max(remaining) if remaining else None


# ---------------------------------------------------------------------------- holding


class LeaseObserver:
    """What a job's lease tells the live view and the Locks table.

    ``callbacks()`` are handed to ``Redlock.hold`` and run on the heartbeat thread;
    ``on_lost`` (the job's own reaction, e.g. killing git) runs first, before anything
    that talks to Redis or the channel layer.
    """

    def __init__(
        self, key: str, *, job: str, on_lost: Callable[[], None], repo_name: str = ""
    ) -> None:
        self.key = key
        self.job = job
        self.repo_id = locks.parse(key).repo_id
        #: ``Repository.name`` of the locked repository ("" unknown): the feed's link text.
        self.repo_name = repo_name
        self._on_lost = on_lost

    def _resource(self) -> dict[str, Any]:
        """``{key, repo, what}`` (``describe_resource``) plus the repository's name."""
        res = describe_resource(self.key)
        if self.repo_id is not None and self.repo_name:
            res["repo_name"] = self.repo_name
        return res

    def callbacks(self) -> dict[str, Callable[[Lock], None]]:
        return {"on_lost": self.lost, "on_extended": self.extended}

    def extended(self, lock: Lock) -> None:
        """On the lock's callback thread (``workers.locks.heartbeat``), which hands back
        any database connection it opened before it waits for the next extension."""
        try:
            with contextlib.suppress(infra.QueueUnavailable):  # a display counter only
                infra.connection().hset(EXTENSIONS_HASH, self.key, str(lock.extensions))
            publish_event(
                "lock.extended",
                {
                    "key": self.key,
                    "extensions": lock.extensions,
                    "ttl_ms": int(lock.valid_for() * 1000),
                },
                repo_id=self.repo_id,
            )
        finally:
            close_thread_connections()

    def lost(self, lock: Lock) -> None:
        """On a one-shot thread of its own (``workers.locks.heartbeat``), which hands back
        any database connection it opened before it ends: a thread that ends holding a
        pooled connection loses the pool that slot for good (``dashboard.infra.dbpool``)."""
        try:
            self._on_lost()
            publish_event("lock.lost", {**self._resource(), "job": self.job}, repo_id=self.repo_id)
        finally:
            close_thread_connections()

    def acquired(self, lock: Lock, holder: dict[str, Any]) -> None:
        publish_event(
            "lock.acquired",
            {
                **self._resource(),
                "worker": holder.get("worker"),
                "job": self.job,
                "host": holder.get("host"),
                "pid": holder.get("pid"),
                "token": lock.token,
                "agreeing": lock.agreeing,
                "masters": len(settings.REDIS_URLS),
                "ttl_ms": int(lock.valid_for() * 1000),
                "extensions": 0,
                "stale": False,
            },
            repo_id=self.repo_id,
        )

    def released(self) -> None:
        with contextlib.suppress(infra.QueueUnavailable):  # a display counter only
            infra.connection().hdel(EXTENSIONS_HASH, self.key)
        publish_event("lock.released", self._resource(), repo_id=self.repo_id)


def job_holder(*, worker: str, job: str, attempt: int, version: str) -> dict[str, Any]:
    """The lock value of a job's lease: who holds it, for people and for crash clean-up
    (``host`` and ``pid`` let a worker release the locks of a work horse it reaped)."""
    return {
        "worker": worker,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "job": job,
        "attempt": attempt,
        "version": version,
    }


@contextlib.contextmanager
def hold_lease(
    key: str,
    *,
    holder: dict[str, Any],
    on_lost: Callable[[], None],
    on_acquired: Callable[[Lock], None] | None = None,
    repo_name: str = "",
) -> Iterator[Lock]:
    """Hold ``key`` heartbeat-extended for ``settings.LOCK_TTL`` and report it: acquired
    (after ``on_acquired``, e.g. recording the token on the run), extended, lost,
    released (events naming the repository as ``repo_name``, when given). A lost lease
    calls ``on_lost`` at once on the heartbeat thread.

    Raises ``LockNotAcquired`` if another holder has the key.
    """
    observer = LeaseObserver(
        key, job=str(holder.get("job", "")), on_lost=on_lost, repo_name=repo_name
    )
    with (
        observability.lock_span(key) as traced_acquired,  # "lock wait" and "lock held" spans
        redlock().hold([key], ttl=settings.LOCK_TTL, holder=holder, **observer.callbacks()) as lock,
    ):
        traced_acquired(lock)
        if on_acquired is not None:
            on_acquired(lock)
        observer.acquired(lock, holder)
        try:
            yield lock
        finally:
            observer.released()


def release_locks_of(*, host: str, pid: int) -> int:
    """Release the locks held by process ``pid`` on ``host``, which the caller knows is
    dead (it collected its exit status). Safe: each release is a compare-and-delete on
    that holder's nonce, so a lease another job took meanwhile is never touched, and
    fencing guards every write regardless."""
    released = 0
    rl = redlock()
    for info in rl.list_locks(locks.PREFIX):
        holder = info.get("holder") or {}
        ours = holder.get("pid") == pid and holder.get("host") == host and info.get("nonce")
        if ours and rl.force_release(info["key"], info["nonce"]):
            released += 1
    return released


# ---------------------------------------------------------------------------- reading


def lock_rows(*, repo_id: int | None = None) -> list[dict[str, Any]]:
    """Every held lock (or those of one repository), with holder, token, masters
    agreeing, TTL, extensions and staleness (holder's worker no longer beating)."""
    prefix = locks.repo_prefix(repo_id) if repo_id is not None else locks.PREFIX
    infos = redlock().list_locks(prefix)
    if not infos:
        return []
    live = live_worker_names()
    try:
        ext_raw: list[Any] = list(
            infra.connection().hmget(EXTENSIONS_HASH, [i["key"] for i in infos])  # type: ignore[arg-type]
        )
    except infra.QueueUnavailable:  # the locks come from the masters; only counts missing
        ext_raw = [None] * len(infos)
    described = [describe_resource(i["key"]) for i in infos]
    names = dict(
        Repository.objects.filter(pk__in={d["repo"] for d in described if d["repo"]}).values_list(
            "pk", "url"
        )
    )
    rows = []
    for info, res, ext in zip(infos, described, ext_raw, strict=True):
        holder = info.get("holder") or {}
        url = names.get(res["repo"], "")
        rows.append(
            {
                **res,
                "repo_name": Repository.name_of(url) if url else "",
                "worker": holder.get("worker"),
                "job": holder.get("job"),
                "host": holder.get("host"),
                "pid": holder.get("pid"),
                "token": holder.get("token"),
                "agreeing": info["agreeing"],
                "masters": info["masters"],
                "ttl_ms": info["ttl_ms"],
                "extensions": int(ext or 0),
                "stale": bool(holder.get("worker")) and holder.get("worker") not in live,
            }
        )
    return rows


def held_count() -> int:
    return len(redlock().list_locks(locks.PREFIX))


def contention(*, now: datetime | None = None) -> dict[str, Any]:
    """Lock contention over the last hour, from the attempt history."""
    now = now or timezone.now()
    recent = JobAttempt.objects.filter(started_at__gte=now - HOUR)
    top = (
        recent.filter(outcome=JobAttempt.Outcome.DEFERRED)
        .values("run__repository_id", "run__repository__url")
        .annotate(n=Count("id"))
        .order_by("-n")[:5]
    )
    return {
        "refusals": recent.filter(outcome=JobAttempt.Outcome.DEFERRED).count(),
        "lost": recent.filter(error__startswith="LockLost").count(),
        "stale_writes_rejected": recent.filter(error__startswith="StaleToken").count(),
        "most_contended": [
            {
                "repo": r["run__repository_id"],
                "url": redact(r["run__repository__url"]),
                "refusals": r["n"],
            }
            for r in top
        ],
    }


# ---------------------------------------------------------------------------- forcing


def force_release_lock(*, key: str, user: Any) -> dict[str, Any]:
    """Release a lock whatever its holder, fencing the holder out first. Audited.

    1. Read the holder's nonce (``inspect``); nothing held → audited "not held".
    2. Bump the resource's fencing token: from now on every write of the evicted holder
       is rejected, even if it is alive after all.
    3. Compare-and-delete the holder's nonce on every master.

    Race (why 2 comes before 3): a job acquiring the key right after the delete fetches
    its token after the bump, so its token is the newest and its writes are accepted.
    In the other order a job could acquire between the delete and the bump and have
    every legitimate write rejected. Between 2 and 3 the old lease still stands on a
    majority, so nobody else can acquire; if it expires there by itself, the next
    holder's token is still newer than ours, and step 3's compare-and-delete on the old
    nonce does not touch that holder's key.
    """
    rl = redlock()
    info = rl.inspect(key)
    if info is None or not info.get("nonce"):
        record_audit(user=user, action="lock.force_release", target=key, outcome="not held")
        return {"released": 0, "token": None}
    token = next_token(key)
    failpoint("lock.force_release.fenced")
    released = rl.force_release(key, info["nonce"])
    with contextlib.suppress(infra.QueueUnavailable):  # a display counter only
        infra.connection().hdel(EXTENSIONS_HASH, key)
    holder = info.get("holder") or {}
    record_audit(
        user=user,
        action="lock.force_release",
        target=key,
        outcome=f"released on {released} masters; fencing token now {token}",
        detail={"holder": holder},
    )
    resource = describe_resource(key)
    if resource["repo"] is not None:
        found = Repository.objects.filter(pk=resource["repo"]).values_list("url", flat=True)
        if url := found.first():
            resource["repo_name"] = Repository.name_of(url)
    publish_event(
        "lock.released",
        {**resource, "forced": True, "token": token},
        repo_id=resource["repo"],
    )
    return {"released": released, "token": token, "holder": holder}


def evict_job(*, job: str, repo_id: int, keys: tuple[str, ...] = ()) -> list[str]:
    """Fence out and release every lock of repository ``repo_id`` that job ``job`` (a
    ``JobRun.job_id``) holds, and fence ``keys`` (the locks it was last seen holding,
    held or not): a cancelled job (docs/lifecycle.md#cancelling). Returns the keys
    fenced. Not audited: the caller's action is.

    Race: the same as ``force_release_lock``'s, for the same reason the token is bumped
    before the compare-and-delete: a job that acquires one of these keys right after the
    delete gets a token newer than the bump. A late write of the evicted job, committed
    after the bump, presents an older token and is refused (``fencing.check_token``);
    one that committed before it was a whole, fenced write of a lease still held."""
    held = [
        info
        for info in redlock().list_locks(locks.repo_prefix(repo_id))
        if (info.get("holder") or {}).get("job") == job and info.get("nonce")
    ]
    fenced = sorted({*keys, *(info["key"] for info in held)} - {""})
    for key in fenced:
        next_token(key)
    rl = redlock()
    for info in held:
        rl.force_release(info["key"], info["nonce"])
        with contextlib.suppress(infra.QueueUnavailable):  # a display counter only
            infra.connection().hdel(EXTENSIONS_HASH, info["key"])
        publish_event("lock.released", {**describe_resource(info["key"]), "forced": True},
                      repo_id=repo_id)  # fmt: skip
    return fenced
