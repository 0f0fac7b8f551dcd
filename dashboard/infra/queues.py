"""Redis connections and RQ queues: names, enqueueing, scheduled jobs, pauses.

The process-wide Redlock lives in ``dashboard.locks.leases``; this module knows no lock.

The queue server (``REDIS_URL``) may be down or stalled at any moment. Every client
built here has short timeouts (``GITWARD_QUEUE_TIMEOUT``), no redis-py retries, and
turns a refused, dropped or timed-out command into one exception, ``QueueUnavailable``
(``"queue server unreachable"``). After a failure every command fails at once for
``RETRY_AFTER_SECONDS`` (a per-process circuit), so a page that reads the queue server
ten times waits for one timeout, not ten. Adapters catch ``QueueUnavailable`` and
degrade; the database stays the truth and the reconciler enqueues what is missing.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import secrets
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import redis
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from redis.backoff import NoBackoff
from redis.client import Pipeline
from redis.retry import Retry
from redis.sentinel import Sentinel
from rq import Queue
from rq.exceptions import DuplicateJobError, NoSuchJobError
from rq.job import Job, JobStatus
from rq.registry import ScheduledJobRegistry

from dashboard.models import AnalyzerVersion
from workers.analysis import DEFAULT, queue_name
from workers.runtime import is_sentinel_url, parse_sentinel_url, safe_sentinel_url

log = logging.getLogger(__name__)

SYNC_QUEUE = "sync"
#: Bulk dead-letter actions (``dashboard.runs.dead_letters``) run here, never in a request.
MAINTENANCE_QUEUE = "maintenance"


def queue_names() -> list[str]:
    """The queues the operations view shows (and pause/resume accept): sync, the
    physical queue of every staffed analyzer version (the current one first; the
    deployed default's before any rollout), maintenance and, once a rollout exists, the
    ``rollouts`` driver queue."""
    rows = list(
        AnalyzerVersion.objects.filter(state__in=_STAFFED)
        .order_by("-state_changed_at")
        .values_list("fingerprint", "state")
    )
    current = [fp for fp, st in rows if st == AnalyzerVersion.State.CURRENT]
    fps = current or [DEFAULT.fingerprint()]
    fps += [fp for fp, _ in rows if fp not in fps]
    names = [SYNC_QUEUE, *(queue_name(fp) for fp in fps), MAINTENANCE_QUEUE]
    return names + (["rollouts"] if rows else [])


#: ``dashboard.versions.state_machine.STAFFED`` (that module imports this one).
_STAFFED = ("warming", "verified", "ramping", "current", "draining")


class RedisUnavailable(ImproperlyConfigured):
    pass


def redis_urls() -> list[str]:
    urls = list(settings.REDIS_URLS)
    if not urls:
        raise RedisUnavailable(
            "no Redis configured: start `make run` (embedded nodes) or set REDIS_URLS"
        )
    return urls


def redis_url() -> str:
    return str(settings.REDIS_URL or redis_urls()[0])


#: The one message pages, the API and logs show while the queue server is down.
QUEUE_DOWN = "queue server unreachable"
#: After a failed command, commands fail at once for this long (then one tries again).
RETRY_AFTER_SECONDS = 0.5


class QueueUnavailable(RedisUnavailable, redis.ConnectionError):
    """The queue server (``REDIS_URL``) refused, dropped or did not answer in time.

    A ``RedisUnavailable`` (adapters that already answer that with a 503 keep doing
    so) and a ``redis.ConnectionError`` (RQ's worker loop backs off and retries on it).
    """


class _Circuit:
    """Per process: the time until which commands fail without trying."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.open_until = 0.0
        self.last_error = ""

    def check(self) -> None:
        # Race: two threads read ``open_until`` while a third trips it; the worst case
        # is one extra attempt that times out on its own, never a wrong answer.
        if time.monotonic() < self.open_until:
            raise QueueUnavailable(f"{QUEUE_DOWN} ({self.last_error})")

    def trip(self, exc: BaseException) -> QueueUnavailable:
        if isinstance(exc, QueueUnavailable):
            return exc
        with self.lock:
            self.open_until = time.monotonic() + RETRY_AFTER_SECONDS
            self.last_error = f"{type(exc).__name__}: {exc}"[:200]
        log.warning("%s: %s", QUEUE_DOWN, self.last_error)
        return QueueUnavailable(f"{QUEUE_DOWN} ({self.last_error})")

    def reset(self) -> None:
        with self.lock:
            self.open_until = 0.0


CIRCUIT = _Circuit()
_FAILURES = (redis.ConnectionError, redis.TimeoutError)


class _QueuePipeline(Pipeline):
    def execute(self, raise_on_error: bool = True) -> list[Any]:
        CIRCUIT.check()
        try:
            return super().execute(raise_on_error)
        except _FAILURES as exc:
            raise CIRCUIT.trip(exc) from exc

    def immediate_execute_command(self, *args: Any, **options: Any) -> Any:
        """Commands a WATCHing pipeline sends at once (RQ's check-and-set enqueues)."""
        CIRCUIT.check()
        try:
            return super().immediate_execute_command(*args, **options)
        except _FAILURES as exc:
            raise CIRCUIT.trip(exc) from exc


class QueueRedis(redis.Redis):
    """A client whose connection failures are ``QueueUnavailable`` (see the module)."""

    def execute_command(self, *args: Any, **options: Any) -> Any:
        CIRCUIT.check()
        try:
            return super().execute_command(*args, **options)
        except _FAILURES as exc:
            raise CIRCUIT.trip(exc) from exc

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> _QueuePipeline:
        return _QueuePipeline(
            self.connection_pool, self.response_callbacks, transaction, shard_hint
        )


def connection_options() -> dict[str, Any]:
    """Timeouts of every queue-server client: a stalled server costs one timeout."""
    timeout = float(settings.QUEUE_TIMEOUT)
    return {
        "socket_connect_timeout": timeout,
        "socket_timeout": timeout,
        "retry": Retry(NoBackoff(), 0),  # no silent retries: the circuit decides
        "health_check_interval": 30,
    }


def build_client(url: str, **overrides: Any) -> QueueRedis:
    """A new client for ``url``: ``redis://``/``rediss://``/``unix://`` directly, or the
    master of a ``redis+sentinel://`` group, rediscovered through the Sentinels on every
    new connection (so after a failover the next connection goes to the new master)."""
    options = {**connection_options(), **overrides}
    if is_sentinel_url(url):
        target = parse_sentinel_url(url)
        sentinel = Sentinel(
            list(target.sentinels),
            sentinel_kwargs={
                "socket_connect_timeout": options["socket_connect_timeout"],
                "socket_timeout": options["socket_timeout"],
            },
        )
        client = sentinel.master_for(
            target.service,
            redis_class=QueueRedis,
            db=target.db,
            username=target.username,
            password=target.password,
            **options,
        )
        assert isinstance(client, QueueRedis)
        return client
    client = QueueRedis.from_url(url, **options)
    assert isinstance(client, QueueRedis)
    return client


@functools.cache
def _connection(url: str, timeout: float) -> QueueRedis:
    return build_client(url)


def connection() -> QueueRedis:
    """The process's shared client for the queue server (short timeouts). Cached per URL
    *and* timeout: a client built before ``QUEUE_TIMEOUT`` changed keeps its old socket
    timeouts, so a changed setting must get a new client, not the cached one."""
    return _connection(redis_url(), float(settings.QUEUE_TIMEOUT))


def worker_connection() -> QueueRedis:
    """A client of its own for an RQ worker: RQ raises the socket timeout of the
    connection it is given above its blocking dequeue time, which must not leak into
    the shared client that requests use."""
    return build_client(redis_url())


def safe_queue_url() -> str:
    """``REDIS_URL`` without its password."""
    url = redis_url()
    if is_sentinel_url(url):
        return safe_sentinel_url(parse_sentinel_url(url))
    if "@" in url:
        scheme, _, rest = url.partition("://")
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url


def queue_server() -> dict[str, Any]:
    """``{ok, url, latency_ms | error}``: one PING of the queue server (bounded by the
    client's timeouts, at once while the circuit is open)."""
    start = time.perf_counter()
    try:
        connection().ping()
    except QueueUnavailable as exc:
        return {"ok": False, "url": safe_queue_url(), "error": QUEUE_DOWN, "detail": str(exc)}
    latency = round((time.perf_counter() - start) * 1000, 2)
    return {"ok": True, "url": safe_queue_url(), "latency_ms": latency}


def queue(name: str) -> Queue:
    return Queue(name, connection=connection(), default_timeout=settings.JOB_TIMEOUT)


def analysis_queue(fingerprint: str) -> Queue:
    return queue(queue_name(fingerprint))


#: The job-hash field that holds a job's scheduling class (docs/scheduling.md#classes);
#: RQ saves a job with ``HSET`` of its own fields, so this one survives every save.
PRIORITY_FIELD = "gitward_priority"

#: Moves a job id, just pushed at the tail of a queue, behind the last job of its class or
#: a more urgent one (a lower number): each class stays FIFO, and a more urgent class is
#: taken first. KEYS[1] the queue's list; ARGV[1] the job id, ARGV[2] its class ("" read
#: it from the job's hash: a scheduled job promoted), ARGV[3] the job-hash key prefix.
#: A job id no longer in the list (a worker took it meanwhile) is left alone. Scans from
#: the tail in pages and stops at the first job of its class or a more urgent one, so a
#: push behind its own class costs one page. Jobs without the field (the rollout driver,
#: maintenance batches) count as class 0.
_PLACE = """
local key, id, prefix = KEYS[1], ARGV[1], ARGV[3]
local p = tonumber(ARGV[2])
if p == nil then
  p = tonumber(redis.call('HGET', prefix .. id, ARGV[4]) or '0') or 0
end
local tail = redis.call('LINDEX', key, -1)
if tail ~= id then
  -- not at the tail: already placed, or taken by a worker; leave it
  return -1
end
local n = redis.call('LLEN', key)
local stop = n - 1
while stop > 0 do
  local start = math.max(0, stop - 64)
  local page = redis.call('LRANGE', key, start, stop - 1)
  for i = #page, 1, -1 do
    local other = page[i]
    local q = tonumber(redis.call('HGET', prefix .. other, ARGV[4]) or '0') or 0
    if q <= p then
      if start + i == n - 1 then return n - 1 end
      redis.call('RPOP', key)
      redis.call('LINSERT', key, 'AFTER', other, id)
      return start + i
    end
  end
  stop = start
end
if n > 1 then
  redis.call('RPOP', key)
  redis.call('LPUSH', key, id)
end
return 0
"""


#: The job-hash field that marks a job the reserved interactive slot may take ("1"):
#: a small interactive job (docs/scheduling.md#the-reserved-interactive-slot).
EXPRESS_FIELD = "gitward_express"

#: Takes the first job marked express (``EXPRESS_FIELD``) among the queue's most urgent
#: class-0 jobs at its head: KEYS[1] the queue's list; ARGV[1] the job-hash key prefix,
#: ARGV[2] the class field, ARGV[3] the express field, ARGV[4] how many head entries to
#: look at. Stops at the first job of a less urgent class (classes are placed, so nothing
#: interactive is behind it). Returns the id, removed from the list, or false.
_TAKE_EXPRESS = """
local key, prefix = KEYS[1], ARGV[1]
local ids = redis.call('LRANGE', key, 0, tonumber(ARGV[4]) - 1)
for _, id in ipairs(ids) do
  local p = tonumber(redis.call('HGET', prefix .. id, ARGV[2]) or '0') or 0
  if p > 0 then return false end
  if redis.call('HGET', prefix .. id, ARGV[3]) == '1' then
    redis.call('LREM', key, 1, id)
    return id
  end
end
return false
"""

#: Head entries ``take_express`` looks at: interactive large-backfill chunks ahead of a
#: small job number at most the fleet's repositories × their weight.
EXPRESS_SCAN = 256


def take_express(q: Queue) -> str | None:
    """Pop the first express job of ``q`` out of its list (``_TAKE_EXPRESS``), for the
    reserved interactive slot's worker to run; None when there is none.

    Race: a regular worker pops the head (BLPOP) at the same moment. Both are single
    commands or one script on one Redis, so they run one after the other: the id is
    removed from the list by exactly one of them, and the other does not see it."""
    script = q.connection.register_script(_TAKE_EXPRESS)
    args: list[str | int] = [
        Job.redis_job_namespace_prefix, PRIORITY_FIELD, EXPRESS_FIELD, EXPRESS_SCAN,
    ]  # fmt: skip
    found = script(keys=[q.key], args=args)
    if not found:
        return None
    return found.decode() if isinstance(found, bytes) else str(found)


#: A list the reserved slot's idle workers block on between two looks at their queues
#: (``wait_for_express``): every express job enqueued pushes a token (``_put``), so an
#: idle slot takes it at once instead of at its next look (``GITWARD_EXPRESS_POLL`` later,
#: 0.1 s on average: BENCHMARKS.md, "On an idle machine").
EXPRESS_WAKE_KEY = "gitward:express:wake"

#: Tokens kept at most: enqueues while no slot waits leave at most this many early looks.
EXPRESS_WAKE_MAX = 8


def express_enqueued(conn: redis.Redis) -> None:
    """Wake one idle reserved-slot worker (``wait_for_express``): an express job is in a
    queue now."""
    pipe = conn.pipeline(transaction=False)
    pipe.rpush(EXPRESS_WAKE_KEY, 1)
    pipe.ltrim(EXPRESS_WAKE_KEY, -EXPRESS_WAKE_MAX, -1)
    pipe.expire(EXPRESS_WAKE_KEY, 3600)
    pipe.execute()


def wait_for_express(conn: redis.Redis, timeout: float) -> bool:
    """Block until an express job was enqueued (a token of ``express_enqueued``: True)
    or ``timeout`` seconds passed (False), whichever comes first.

    Race: a token says a job was enqueued, not that it is still there (a regular worker
    or another slot may take it first); the caller looks at its queues either way, and
    one token wakes one waiter. A job enqueued with no slot waiting leaves its token
    for the next wait, which returns at once."""
    return conn.blpop([EXPRESS_WAKE_KEY], timeout=timeout) is not None


#: Sorted set of the express jobs running now: member a job id, score the end of its
#: lease (ms, the queue server's clock) (docs/scheduling.md#bulk-writes-yield-to-express-work).
EXPRESS_RUNNING_KEY = "gitward:express:running"

#: Lease of an entry of ``EXPRESS_RUNNING_KEY``: a work horse killed before it takes its
#: entry out holds bulk writes back for at most this long.
EXPRESS_LEASE_MS = 120_000

#: Adds ARGV[1] with the lease end; KEYS[1] the set, ARGV[2] the lease (ms).
_EXPRESS_BEGIN = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
return 1
"""

#: Drops the entries whose lease has ended; returns how many are left.
_EXPRESS_COUNT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZCARD', KEYS[1])
"""


def express_begun(job_id: str) -> None:
    """Record that express job ``job_id`` runs now (``express_running``), for
    ``EXPRESS_LEASE_MS`` at most. One script, read against the server's clock, so the
    lease means the same to every worker host."""
    script = connection().register_script(_EXPRESS_BEGIN)
    script(keys=[EXPRESS_RUNNING_KEY], args=[job_id, EXPRESS_LEASE_MS])


def express_ended(job_id: str) -> None:
    """Take ``job_id`` out of the express jobs running now."""
    connection().zrem(EXPRESS_RUNNING_KEY, job_id)


@contextlib.contextmanager
def express_writing(name: str) -> Iterator[None]:
    """Around an interactive write that is not an RQ job (a submission from the form,
    the API or the CLI): counted as an express job running (``express_begun``, under
    ``name`` plus a random suffix), so a bulk chunk holds its write back meanwhile
    (on SQLite it begins no further write slice, and the write waits for one slice at
    most)
    (docs/scheduling.md#bulk-writes-in-slices-on-sqlite). Redis trouble: the write goes
    on unmarked (bulk writes then do not hold back for it; nothing else rests on the
    mark)."""
    key = f"{name}:{secrets.token_hex(6)}"
    began = False
    with contextlib.suppress(Exception):
        express_begun(key)
        began = True
    try:
        yield
    finally:
        if began:
            with contextlib.suppress(Exception):
                express_ended(key)


def express_running() -> int:
    """How many express jobs run now (entries whose lease has not ended)."""
    script = connection().register_script(_EXPRESS_COUNT)
    return int(script(keys=[EXPRESS_RUNNING_KEY]))


def is_express(job_id: str) -> bool:
    """Whether the job is marked express (``EXPRESS_FIELD``)."""
    raw = connection().hget(Job.key_for(job_id), EXPRESS_FIELD)
    return raw in (b"1", "1")


def _put(
    q: Queue,
    func: str,
    args: tuple[object, ...],
    job_id: str,
    delay: float,
    priority: int,
    express: bool = False,
) -> None:
    result_ttl, failure_ttl = 3600, 7 * 24 * 3600
    # Race: a worker may take the job between its enqueue and these fields. The class
    # and the express mark only choose a place in line; a job already taken needs none.
    marks = {PRIORITY_FIELD: str(priority)} if priority else {}
    if express:
        marks[EXPRESS_FIELD] = "1"
    if delay > 0:
        # RQ's enqueue_in ignores ``unique`` (a second call would overwrite a live job's
        # hash); schedule_job's unique form is one script (check, save, schedule).
        job = q.create_job(
            func,
            args=args,
            job_id=job_id,
            status=JobStatus.SCHEDULED,
            result_ttl=result_ttl,
            failure_ttl=failure_ttl,
        )
        q.schedule_job(job, datetime.now(UTC) + timedelta(seconds=delay), unique=True)
        if marks:
            q.connection.hset(Job.key_for(job_id), mapping=marks)
    else:
        q.enqueue(
            func, *args, job_id=job_id, unique=True, result_ttl=result_ttl, failure_ttl=failure_ttl
        )
        if marks:
            q.connection.hset(Job.key_for(job_id), mapping=marks)
        place(q, job_id)
        if express:
            # after the job is in its place and marked: a slot woken now finds it. The
            # job is enqueued whatever happens here: a lost wake costs one poll at most.
            with contextlib.suppress(redis.RedisError):
                express_enqueued(q.connection)


def place(q: Queue, job_id: str) -> int:
    """Move ``job_id``, just pushed at the tail of ``q``, to its class's place
    (``_PLACE``); returns its index, or -1 when it was no longer at the tail.

    Race: a worker pops the queue's head between the push and this script. The script
    is atomic, so it sees the list before or after the pop: the id is still at the tail
    (moved) or was the one popped (left alone). Two pushers placing at once run one
    after the other; the second's id is the tail, the first's is not, so the first is
    left where the second's script put it (behind its class: correct) or at the tail
    (one class too late for one job: never lost, only later). A job pushed between the
    enqueue and this script by someone else leaves this one unplaced (FIFO), which the
    same rule makes harmless."""
    script = q.connection.register_script(_PLACE)
    args = [job_id, "", Job.redis_job_namespace_prefix, PRIORITY_FIELD]
    return int(script(keys=[q.key], args=args))


def enqueue_unique(
    q: Queue,
    func: str,
    *args: object,
    job_id: str,
    delay: float = 0.0,
    priority: int = 0,
    express: bool = False,
) -> bool:
    """Enqueue under a deterministic id; False if that job already exists in Redis.
    ``priority`` is the job's scheduling class (0 the most urgent): the job is placed
    behind the last job of its class or a more urgent one (``place``). ``express``
    marks a small interactive job the reserved slot may take (``take_express``).

    Two processes enqueuing the same id concurrently: RQ's ``unique`` enqueue is one Lua
    script (check-and-save), so exactly one succeeds and the other gets
    DuplicateJobError. The job itself is idempotent too, so a redelivery is harmless.
    """
    try:
        _put(q, func, args, job_id, delay, priority, express)
    except DuplicateJobError:
        pass
    else:
        return True
    # The id exists. A live job (queued, started, scheduled) is the same work: done.
    # A finished or failed one is a leftover of an earlier round: replace it. Two
    # replacers racing both delete, then both enqueue with ``unique``: one wins.
    try:
        existing = Job.fetch(job_id, connection=q.connection)
        status = existing.get_status(refresh=True)
    except NoSuchJobError:
        status = None
    if status in {JobStatus.QUEUED, JobStatus.STARTED, JobStatus.SCHEDULED, JobStatus.DEFERRED}:
        return False
    if status is not None:
        existing.delete()
    try:
        _put(q, func, args, job_id, delay, priority, express)
    except DuplicateJobError:
        return False
    return True


def promote_due_jobs(queue_names: list[str]) -> int:
    """Move scheduled jobs (retry back-offs, lock waits) whose time has come onto their
    queues. Workers call this every second instead of running RQ's scheduler process,
    which outlives a SIGKILLed worker as an orphan and, once dead, holds its lock.

    Race: every worker promotes; the registry's ``remove`` (a ``ZREM``, its count
    returned: pinned by tests/dashboard/operations/test_rq_internals.py) removes a job id
    for exactly one caller, and only that caller enqueues it.
    """
    conn = connection()
    moved = 0
    for name in queue_names:
        q = queue(name)
        registry = ScheduledJobRegistry(queue=q)
        for job_id in registry.get_jobs_to_schedule(int(time.time())):
            if not registry.remove(job_id):
                continue
            try:
                job = Job.fetch(job_id, connection=conn)
            except NoSuchJobError:
                continue
            q.enqueue_job(job)
            place(q, job_id)  # its class's place, read from its hash
            moved += 1
    return moved


PAUSED_KEY = "gitward:paused-queues"
#: What a worker listens on while every one of its queues is paused (always empty).
IDLE_QUEUE = "gitward-idle"


def paused_queue_names() -> set[str]:
    return {m.decode() for m in connection().smembers(PAUSED_KEY)}  # type: ignore[union-attr]


def set_paused(name: str, paused: bool) -> bool:
    """Pause or resume a queue; returns whether anything changed. Workers stop taking
    jobs from a paused queue within a second; jobs already running finish."""
    conn = connection()
    changed = conn.sadd(PAUSED_KEY, name) if paused else conn.srem(PAUSED_KEY, name)
    return bool(changed)
