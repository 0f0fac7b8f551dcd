"""Per-git-host fetch limits shared by every worker host (docs/scheduling.md#per-host-fetch-limits).

Each remote host (``github.com``) has a **concurrency cap** (slots) and a **token bucket**
(``rate`` tokens a second, at most ``burst`` saved up) over every clone and fetch gitward
runs against it, from any worker host.  The state lives in the *queue* Redis (not the lock
masters) under ``gitward:fetch:{host}:…`` and every change is one Lua script, so two
workers never both take the last slot or the last token:

* ``…:slots`` — a sorted set ``holder → lease expiry`` (milliseconds, Redis ``TIME``).  A
  slot is a **lease**: its holder renews it while the fetch runs (:class:`FetchSlot`'s
  renewer thread); a worker that dies (SIGKILL, OOM, a lost host) stops renewing and its
  slot is dropped by the next script that looks at the host once the expiry has passed.
  Safe because every script first removes expired members, and all expiries are read
  against one clock, the Redis server's ``TIME`` (no skew between worker hosts).  A live
  holder whose renewals are delayed past its lease (a paused process) loses the slot and
  one more fetch may start: the cap is a politeness bound, never a correctness one.
* ``…:bucket`` — a hash ``tokens``/``at``: refilled lazily at ``rate`` per second up to
  ``burst``; a fetch takes one token when it takes its slot.
* ``…:waiting`` — a sorted set ``waiter → expiry`` of fetches waiting for this host (for
  "2 waiting" on the Workers page); a waiter that dies expires the same way.
* ``…:backoff`` — "do not contact this host before T" (milliseconds), set when the host
  refused us with HTTP 429 / a rate-limit message (:func:`back_off`); the longest asked
  backoff wins, and the key expires with it.

A fetch that cannot get a slot within its wait raises :class:`HostBusy` (a
``LockNotAcquired``: the job layer defers the attempt, no attempt is spent) with the
reason and how long to wait.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from workers.git.fetch_errors import RateLimited
from workers.locks import LockNotAcquired

__all__ = [
    "DEFAULT_LIMIT",
    "FetchGate",
    "FetchSlot",
    "HostBusy",
    "HostLimit",
    "HostStatus",
    "back_off",
    "host_status",
    "known_hosts",
    "parse_limits",
    "wait_reason",
]

PREFIX = "gitward:fetch:"
#: Every host a slot or a backoff was ever asked for (for the Workers page and metrics).
HOSTS_KEY = "gitward:fetch-hosts"


@dataclass(frozen=True)
class HostLimit:
    """``concurrency`` fetches at once; ``rate`` new fetches a second on average with at
    most ``burst`` at once after a quiet spell.  ``rate`` 0: no token bucket."""

    concurrency: int = 4
    rate: float = 0.0
    burst: int = 1

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if self.rate < 0:
            raise ValueError("rate must not be negative")
        if self.burst < 1:
            raise ValueError("burst must be at least 1")


DEFAULT_LIMIT = HostLimit()


def parse_limits(text: str) -> dict[str, HostLimit]:
    """``GITWARD_FETCH_LIMITS``: a JSON object ``{"github.com": {"concurrency": 4,
    "rate": 2, "burst": 10}, "*": {...}}``; ``"*"`` is the default for other hosts.
    Host names are compared lower-case.  Raises ``ValueError`` with the reason."""
    if not text.strip():
        return {}
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc.msg}") from None
    if not isinstance(raw, dict):
        raise ValueError("expected a JSON object of host → limits")
    out: dict[str, HostLimit] = {}
    for host, spec in raw.items():
        if not isinstance(spec, dict) or set(spec) - {"concurrency", "rate", "burst"}:
            raise ValueError(f"{host}: expected an object of concurrency, rate, burst")
        values = {k: v for k, v in spec.items()}
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values.values()):
            raise ValueError(f"{host}: limits must be numbers")
        try:
            out[host.lower()] = HostLimit(
                concurrency=int(values.get("concurrency", DEFAULT_LIMIT.concurrency)),
                rate=float(values.get("rate", DEFAULT_LIMIT.rate)),
                burst=int(values.get("burst", DEFAULT_LIMIT.burst)),
            )
        except ValueError as exc:
            raise ValueError(f"{host}: {exc}") from None
    return out


class Redis(Protocol):
    """What this module needs of a redis-py client."""

    def register_script(self, script: str) -> Any: ...
    def get(self, name: str) -> Any: ...
    def zcard(self, name: str) -> Any: ...
    def smembers(self, name: str) -> Any: ...
    def sadd(self, name: str, *values: str) -> Any: ...


class HostBusy(LockNotAcquired):
    """No slot (or no token, or the host asked us to back off) for the whole wait: the
    job defers its attempt by ``retry_after`` seconds, spending none."""

    def __init__(self, host: str, reason: str, retry_after: float, why: str = "limit") -> None:
        super().__init__([f"{PREFIX}{host}"], {"host": reason}, attempts=1)
        #: ``limit`` (every slot taken), ``rate`` (no token) or ``backoff`` (refused)
        self.why = why
        self.host = host
        self.reason = reason
        self.retry_after = retry_after
        self.args = (reason,)


# KEYS: slots, bucket, waiting, backoff.  ARGV: holder, lease ms, cap, rate/s, burst,
# waiter (or "").  Returns {1, 0} when the slot was taken, else {0, wait ms, why}:
# why = "backoff" | "full" | "rate".
_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
local lease = tonumber(ARGV[2])
local function wait(ms, why)
  if ARGV[6] ~= '' then
    redis.call('ZADD', KEYS[3], now + lease, ARGV[6])
    redis.call('PEXPIRE', KEYS[3], lease)
  end
  return {0, math.max(1, math.floor(ms)), why}
end
local until_ms = tonumber(redis.call('GET', KEYS[4]) or '0')
if until_ms > now then return wait(until_ms - now, 'backoff') end
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
  return {1, 0}
end
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return wait(math.min(1000, tonumber(first[2]) - now), 'full')
end
local rate = tonumber(ARGV[4])
if rate > 0 then
  local burst = tonumber(ARGV[5])
  local b = redis.call('HMGET', KEYS[2], 'tokens', 'at')
  local tokens = tonumber(b[1] or burst)
  local at = tonumber(b[2] or now)
  tokens = math.min(burst, tokens + (now - at) * rate / 1000)
  if tokens < 1 then
    redis.call('HSET', KEYS[2], 'tokens', tostring(tokens), 'at', now)
    return wait((1 - tokens) * 1000 / rate, 'rate')
  end
  redis.call('HSET', KEYS[2], 'tokens', tostring(tokens - 1), 'at', now)
  redis.call('PEXPIRE', KEYS[2], math.ceil(burst * 1000 / rate) + 60000)
end
if ARGV[6] ~= '' then redis.call('ZREM', KEYS[3], ARGV[6]) end
redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
redis.call('PEXPIRE', KEYS[1], lease * 2)
return {1, 0}
"""

# KEYS: slots.  ARGV: holder, lease ms.  Renews a lease still held: 1, else 0 (expired
# and dropped: the holder learns it lost the slot, and the fetch goes on — the cap is a
# politeness bound).
_RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local exp = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not exp or tonumber(exp) <= now then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]) * 2)
return 1
"""

# KEYS: slots, waiting.  ARGV: holder, waiter.
_RELEASE = """
redis.call('ZREM', KEYS[1], ARGV[1])
if ARGV[2] ~= '' then redis.call('ZREM', KEYS[2], ARGV[2]) end
return 1
"""

# KEYS: backoff.  ARGV: seconds.  The later of the current and the asked end wins.
_BACK_OFF = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local asked = now + math.floor(tonumber(ARGV[1]) * 1000)
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
if asked > cur then
  redis.call('SET', KEYS[1], asked, 'PX', asked - now)
  return asked
end
return cur
"""

# KEYS: slots, waiting, backoff, bucket.  Returns {in use, waiting, backoff until ms,
# now ms, tokens (a string: Lua numbers come back truncated) or false, at ms or false}.
_STATUS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local used = redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
local waiting = redis.call('ZCOUNT', KEYS[2], '(' .. now, '+inf')
local until_ms = tonumber(redis.call('GET', KEYS[3]) or '0')
local b = redis.call('HMGET', KEYS[4], 'tokens', 'at')
return {used, waiting, until_ms, now, b[1], b[2]}
"""


def _keys(host: str) -> tuple[str, str, str, str]:
    base = f"{PREFIX}{host}:"
    return base + "slots", base + "bucket", base + "waiting", base + "backoff"


def back_off(conn: Redis, host: str, seconds: float) -> float:
    """Record "do not fetch from ``host`` for ``seconds``" for every worker host; returns
    the backoff's end (epoch seconds; a longer one already recorded wins)."""
    conn.sadd(HOSTS_KEY, host)
    until = conn.register_script(_BACK_OFF)(keys=[_keys(host)[3]], args=[max(0.0, seconds)])
    return int(until) / 1000


@dataclass(frozen=True)
class HostStatus:
    """One host's fetch limit and what is using it now."""

    host: str
    limit: HostLimit
    in_use: int
    waiting: int
    backoff_until: float | None  # epoch seconds, None when not backing off
    #: Tokens in the bucket now (refilled to this moment, as the next fetch would find
    #: it), None when the host has no token bucket (``rate`` 0).
    tokens: float | None = None

    def text(self) -> str:
        """``github.com 4/4, 2 waiting, backoff until 14:05:10`` (UTC)."""
        out = f"{self.host} {self.in_use}/{self.limit.concurrency}"
        if self.waiting:
            out += f", {self.waiting} waiting"
        if self.backoff_until is not None:
            out += f", backoff until {time.strftime('%H:%M:%S', time.gmtime(self.backoff_until))}"
        return out


def limit_for(limits: Mapping[str, HostLimit], host: str) -> HostLimit:
    return limits.get(host.lower()) or limits.get("*") or DEFAULT_LIMIT


def host_status(conn: Redis, host: str, limits: Mapping[str, HostLimit]) -> HostStatus:
    slots, bucket, waiting, backoff = _keys(host)
    used, waiters, until, now, saved, at = conn.register_script(_STATUS)(
        keys=[slots, waiting, backoff, bucket]
    )
    limit = limit_for(limits, host)
    tokens: float | None = None
    if limit.rate > 0:
        # The bucket's refill as ``_ACQUIRE`` computes it; a missing bucket is full.
        tokens = float(limit.burst)
        if saved is not None and at is not None:
            elapsed = max(0, int(now) - int(float(at)))
            tokens = min(float(limit.burst), float(saved) + elapsed * limit.rate / 1000)
    return HostStatus(
        host=host,
        limit=limit,
        in_use=int(used),
        waiting=int(waiters),
        backoff_until=int(until) / 1000 if int(until) > int(now) else None,
        tokens=tokens,
    )


def known_hosts(conn: Redis) -> list[str]:
    """Every host a fetch was limited for, sorted."""
    return sorted(h.decode() if isinstance(h, bytes) else str(h) for h in conn.smembers(HOSTS_KEY))


def wait_reason(conn: Redis, host: str, limits: Mapping[str, HostLimit]) -> str | None:
    """Why a fetch from ``host`` would wait now (``host limit github.com 4/4``, ``host
    github.com backing off until 14:05:10``), or None if it would not."""
    status = host_status(conn, host, limits)
    if status.backoff_until is not None:
        until = time.strftime("%H:%M:%S", time.gmtime(status.backoff_until))
        return f"host {host} backing off until {until} UTC"
    if status.in_use >= status.limit.concurrency:
        return f"host limit {host} {status.in_use}/{status.limit.concurrency}"
    return None


class FetchSlot:
    """A held slot: its lease is renewed by a daemon thread every third of the lease
    until :meth:`release`."""

    def __init__(self, gate: FetchGate, host: str, holder: str) -> None:
        self.gate = gate
        self.host = host
        self.holder = holder
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, daemon=True, name="fetch-slot")
        self._thread.start()

    def _renew(self) -> None:
        slots = _keys(self.host)[0]
        renew = self.gate.conn.register_script(_RENEW)
        while not self._stop.wait(self.gate.lease / 3):
            with contextlib.suppress(Exception):  # Redis away: the lease may lapse (fine)
                renew(keys=[slots], args=[self.holder, int(self.gate.lease * 1000)])

    def release(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        slots, _, waiting, _ = _keys(self.host)
        with contextlib.suppress(Exception):  # Redis away: the lease expires instead
            self.gate.conn.register_script(_RELEASE)(keys=[slots, waiting], args=[self.holder, ""])


class FetchGate:
    """Takes a fetch slot of a remote host for the ``with`` body of :meth:`slot`.

    ``wait``: how long a fetch waits for a slot before :class:`HostBusy`; ``lease``: how
    long a slot outlives a holder that stopped renewing it (a dead worker); ``backoff``:
    how long a host that refused us with a rate limit naming no wait is left alone.
    ``on_change``: called with the host after this gate changed what its status shows
    (a slot taken or let go, a wait begun, a backoff recorded), e.g. to tell the live
    Workers page (docs/live-view.md); what it raises is ignored, a fetch never fails on it."""

    def __init__(
        self,
        conn: Any,
        limits: Mapping[str, HostLimit],
        *,
        wait: float = 10.0,
        lease: float = 60.0,
        backoff: float = 60.0,
        holder: str = "",
        on_change: Callable[[str], None] | None = None,
    ) -> None:
        self.on_change = on_change
        self.backoff = backoff
        self.conn = conn
        self.limits = dict(limits)
        self.wait = wait
        self.lease = lease
        self.holder = holder

    def changed(self, host: str) -> None:
        """Tell ``on_change`` (if any) that ``host``'s status changed."""
        if self.on_change is not None:
            with contextlib.suppress(Exception):  # a live view is never worth a fetch
                self.on_change(host)

    def try_acquire(self, host: str, holder: str, waiter: str = "") -> tuple[bool, float, str]:
        """One try: ``(taken, seconds to wait, why)`` with why ``backoff``/``full``/``rate``."""
        limit = limit_for(self.limits, host)
        res = self.conn.register_script(_ACQUIRE)(
            keys=list(_keys(host)),
            args=[
                holder,
                int(self.lease * 1000),
                limit.concurrency,
                limit.rate,
                limit.burst,
                waiter,
            ],
        )
        if int(res[0]) == 1:
            return True, 0.0, ""
        why = res[2].decode() if isinstance(res[2], bytes) else str(res[2])
        return False, int(res[1]) / 1000, why

    @contextlib.contextmanager
    def slot(self, host: str) -> Iterator[FetchSlot]:
        """Hold a slot of ``host`` for the body; wait at most ``self.wait`` seconds for it,
        polling (the wait is visible as a waiter), then raise :class:`HostBusy`."""
        host = host.lower()
        self.conn.sadd(HOSTS_KEY, host)
        holder = f"{self.holder or 'fetch'}:{uuid.uuid4().hex[:12]}"
        waiter = f"wait:{holder}"
        start = time.monotonic()
        waited_before = False
        while True:
            taken, pause, why = self.try_acquire(host, holder, waiter)
            if taken:
                break
            if not waited_before:  # one change per wait: "1 waiting" (not per poll)
                waited_before = True
                self.changed(host)
            waited = time.monotonic() - start
            if waited + min(pause, 0.05) >= self.wait:
                with contextlib.suppress(Exception):
                    self.conn.register_script(_RELEASE)(
                        keys=[_keys(host)[0], _keys(host)[2]], args=["", waiter]
                    )
                reason = wait_reason(self.conn, host, self.limits) or (
                    f"host {host} token bucket empty" if why == "rate" else f"host limit {host}"
                )
                kind = {"full": "limit", "rate": "rate"}.get(why, "backoff")
                self.changed(host)  # the waiter is gone
                raise HostBusy(host, reason, max(pause, 0.5), kind)
            time.sleep(max(0.01, min(pause, 0.25, self.wait - waited)))
        held = FetchSlot(self, host, holder)
        self.changed(host)
        try:
            yield held
        except RateLimited as exc:
            # Every worker host backs off this host from now on (the shared key), not
            # only this fetch: the refusal is about our address, not this repository.
            asked = exc.retry_after if exc.retry_after is not None else self.backoff
            until = back_off(self.conn, host, asked)
            self.changed(host)
            shown = time.strftime("%H:%M:%S", time.gmtime(until))
            raise HostBusy(
                host,
                f"host {host} refused with a rate limit; backing off until {shown} UTC",
                max(0.5, until - time.time()),
                "backoff",
            ) from exc
        finally:
            held.release()
            self.changed(host)
