"""A trace for every job attempt: timed spans from enqueued to finished, stored on the
attempt (``JobAttempt.spans``), shown on the run page and by ``GET /api/runs/<id>``.

Spans of one attempt, in order (each ``{name, start, end, attrs}``, epoch seconds):

``queued``      put on the RQ queue → taken by a worker (``queue``); for the chunk a sync's
                work horse analyses itself, planned → the sync ended (``inline_after``: the
                sync's RQ job)
``dequeued``    taken → attempt claimed in the database (``worker``, ``host``, ``pid``, ``version``)
``lock wait``   lock requested → acquired (``key``, ``token``, ``agreeing`` masters, ``wait_ms``)
``mirror fetch`` / ``git stream`` / ``rows write``  the phases
``dashboard.runs.attempts.record_phase``
                records (``fetched_at``, ``analysed_at``, ``written_at``), each from the previous
                mark (the lock acquired, or the phase before)
``lock held``   acquired → released (``key``, ``token``, ``extensions``, ``lost``)
``finished`` or ``error``   claimed → the end (``result`` or the redacted ``error``)

How it is wired, without the job code knowing much: ``traced`` wraps the RQ entry point
(``workers.jobs._execute``) and keeps the attempt's ``Trace`` in a context variable;
``dashboard.runs.attempts`` calls ``claimed``/``phase`` and ``dashboard.locks.leases.hold_lease``
calls
``lock_span``, each a no-op outside a traced attempt. The same wrapper binds the log
context (``dashboard.observability.logs``: job, trace, run, repository, then worker, version, lock,
token). Spans are written to the attempt row when the lock is acquired and when the
attempt ends — one UPDATE each; a killed work horse keeps what was written before.
With ``OTEL_EXPORTER_OTLP_ENDPOINT`` set, the ended attempt's spans are also exported over
OTLP/HTTP (``dashboard.observability.otlp``).

The trace id is derived from the run's deterministic job id (32 hex digits, the width of
an OpenTelemetry trace id), so every attempt, log line and event of a run shares it.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rq import get_current_job

from dashboard.models import JobAttempt, JobRun
from dashboard.observability import logs, otlp
from workers.remotes import redact

T = TypeVar("T")
log = logging.getLogger(__name__)

#: ``record_phase`` field → span name.
PHASES = {"fetched_at": "mirror fetch", "analysed_at": "git stream", "written_at": "rows write"}
#: The span that covers the whole attempt, from the claim to its end.
END = ("finished", "error")


def trace_id_of(job_id: str) -> str:
    return hashlib.sha256(job_id.encode()).hexdigest()[:32]


@dataclass
class Trace:
    run_id: int
    number: int
    spans: list[dict[str, Any]] = field(default_factory=list)
    begun: float = field(default_factory=time.time)
    cursor: float = 0.0
    claimed_at: float | None = None

    def add(self, name: str, start: float, end: float, **attrs: Any) -> dict[str, Any]:
        span = {
            "name": name,
            "start": round(start, 6),
            "end": round(max(start, end), 6),
            "attrs": {k: v for k, v in attrs.items() if v is not None},
        }
        self.spans.append(span)
        return span

    def save(self) -> None:
        """Write the spans to the attempt row — only once this attempt was claimed (a
        redelivered job that lost the claim must not overwrite the real attempt's
        trace)."""
        if self.claimed_at is None:
            return
        JobAttempt.objects.filter(run_id=self.run_id, number=self.number).update(
            spans=self.ordered()
        )

    def ordered(self) -> list[dict[str, Any]]:
        """In the order they began; the attempt's own span (finished / error) last."""
        return sorted(self.spans, key=lambda s: (s["name"] in END, s["start"], -s["end"]))


_current: contextvars.ContextVar[Trace | None] = contextvars.ContextVar(
    "gitward_trace", default=None
)


def current() -> Trace | None:
    return _current.get()


def traced(execute: Callable[[int, int, T], str]) -> Callable[[int, int, T], str]:
    """Trace the attempt ``execute(run_id, number, body)`` runs (see the module doc)."""

    @functools.wraps(execute)
    def wrapper(run_id: int, number: int, body: T) -> str:
        trace = Trace(run_id=run_id, number=number)
        trace.cursor = trace.begun
        row = JobRun.objects.filter(pk=run_id).values("job_id", "repository_id").first() or {}
        job_id = str(row.get("job_id", ""))
        token = _current.set(trace)
        try:
            with logs.bind(
                job=job_id or None,
                trace=trace_id_of(job_id) if job_id else None,
                run=run_id,
                attempt=number,
                repo=row.get("repository_id"),
            ):
                try:
                    result = execute(run_id, number, body)
                except BaseException as exc:
                    text = redact(f"{type(exc).__name__}: {exc}")[:500]
                    ms = _end(trace, "error", error=text)
                    log.warning("attempt %d failed after %.0f ms: %s", number, ms, text)
                    raise
                text = redact(str(result))[:200]
                ms = _end(trace, "finished", result=text)
                log.info("attempt %d finished in %.0f ms: %s", number, ms, text)
                return result
        finally:
            _current.reset(token)
            trace.save()
            if (
                trace.claimed_at is not None and job_id
            ):  # with OTEL_*: dashboard/observability/otlp.py
                otlp.export(run_id=run_id, number=number, trace_id=trace_id_of(job_id),
                            spans=trace.ordered())  # fmt: skip

    return wrapper


def _end(trace: Trace, name: str, **attrs: Any) -> float:
    """Add the attempt's own span; its duration in ms."""
    start = trace.claimed_at if trace.claimed_at is not None else trace.begun
    span = trace.add(name, start, time.time(), **attrs)
    return (span["end"] - span["start"]) * 1000


def claimed(run: JobRun, *, worker: str) -> None:
    """The attempt was claimed (``dashboard.runs.attempts.begin_attempt``): the ``queued`` and
    ``dequeued`` spans."""
    trace = _current.get()
    if trace is None or trace.run_id != run.pk:
        return
    now = time.time()
    job = get_current_job()
    own = job is not None and job.id == run.rq_id(run.attempts)
    if job is not None and own and job.enqueued_at is not None:
        enqueued = job.enqueued_at.timestamp()
        taken = job.started_at.timestamp() if job.started_at is not None else trace.begun
        trace.add("queued", min(enqueued, taken), taken, queue=run.queue)
        trace.add("dequeued", taken, now, worker=worker, host=run.host, pid=run.pid,
                  version=run.version[:12])  # fmt: skip
    elif job is not None:
        # A chunk a sync's work horse analyses after the sync (workers.jobs.sync_repository):
        # the RQ job is the sync's, so its queue times are not this attempt's; the run
        # waited from its plan (the row's creation) to this horse's turn.
        planned = min(run.enqueued_at.timestamp(), trace.begun)
        trace.add("queued", planned, trace.begun, queue=run.queue, inline_after=job.id)
        trace.add("dequeued", trace.begun, now, worker=worker, host=run.host, pid=run.pid,
                  version=run.version[:12])  # fmt: skip
    else:
        trace.add("dequeued", trace.begun, now, worker=worker, version=run.version[:12])
    trace.claimed_at = trace.cursor = now
    logs.update(worker=worker, version=run.version[:12])


def phase(fields: dict[str, Any]) -> None:
    """``record_phase(fetched_at=…)``: a span from the previous mark to now per phase."""
    trace = _current.get()
    if trace is None:
        return
    for name, label in PHASES.items():
        if name in fields:
            now = time.time()
            trace.add(label, trace.cursor, now)
            trace.cursor = now


@contextlib.contextmanager
def lock_span(key: str) -> Iterator[Callable[[Any], None]]:
    """Around a lease (``dashboard.locks.leases.hold_lease``): ``lock wait`` until the returned
    callback is called with the acquired ``Lock``, ``lock held`` until the block ends."""
    trace = _current.get()
    requested = time.time()
    held: dict[str, Any] = {}

    def acquired(lock: Any) -> None:
        if trace is None:
            return
        now = time.time()
        trace.add("lock wait", requested, now, key=key, token=lock.token, agreeing=lock.agreeing,
                  wait_ms=round((now - requested) * 1000, 1))  # fmt: skip
        held.update(start=now, lock=lock)
        trace.cursor = now
        logs.update(lock=key, token=lock.token)
        trace.save()  # a run page opened now shows the holder's trace so far

    try:
        yield acquired
    finally:
        if trace is not None and "lock" not in held:  # refused (held elsewhere) or failed
            trace.add("lock wait", requested, time.time(), key=key, acquired=False)
        if trace is not None and "lock" in held:
            lock = held["lock"]
            now = time.time()
            trace.add("lock held", held["start"], now, key=key, token=lock.token,
                      extensions=lock.extensions, lost=lock.lost.is_set() or None)  # fmt: skip
            trace.cursor = max(trace.cursor, now)


# ---------------------------------------------------------------------------- reading


def timeline(spans: list[dict[str, Any]]) -> dict[str, Any]:
    """Spans laid out to scale for the run page: offsets and widths in percent of the
    attempt's total, durations in ms. ``{total_ms, start, spans: [{name, attrs, start,
    end, ms, left, width}]}``."""
    if not spans:
        return {"total_ms": 0.0, "start": None, "spans": []}
    t0 = min(s["start"] for s in spans)
    t1 = max(s["end"] for s in spans)
    total = max(t1 - t0, 1e-6)
    out = []
    for s in spans:
        left = (s["start"] - t0) / total * 100
        width = max((s["end"] - s["start"]) / total * 100, 0.3)  # a sliver stays visible
        out.append(
            {
                **s,
                "ms": round((s["end"] - s["start"]) * 1000, 1),
                "offset_ms": round((s["start"] - t0) * 1000, 1),
                "left": round(min(left, 99.7), 3),
                "width": round(min(width, 100 - min(left, 99.7)), 3),
            }
        )
    return {"total_ms": round((t1 - t0) * 1000, 1), "start": t0, "spans": out}


def run_trace(run: JobRun) -> dict[str, Any]:
    """A run with every attempt and its timeline: the run page and ``GET /api/runs/<id>``."""
    attempts = list(JobAttempt.objects.filter(run=run).order_by("number"))
    return {
        "id": run.pk,
        "job_id": run.job_id,
        "trace_id": trace_id_of(run.job_id),
        "kind": run.kind,
        "queue": run.queue,
        "state": run.state,
        "repository": {"id": run.repository_id, "url": run.repository.shown_url},
        "chunk": run.chunk_id,
        "fingerprint": run.fingerprint,
        "version": run.version,
        "worker": run.worker,
        "lock_key": run.lock_key,
        "token": run.token,
        "attempts": run.attempts,
        "error": run.error,
        "cause": run.cause,
        "group": run.cause_key,
        "enqueued_at": run.enqueued_at.isoformat() if run.enqueued_at else None,
        "started_at": run.started_at.isoformat() if run.started_at else None,
        "finished_at": run.finished_at.isoformat() if run.finished_at else None,
        "history": [
            {
                "number": a.number,
                "outcome": a.outcome,
                "worker": a.worker,
                "host": a.host,
                "pid": a.pid,
                "version": a.version,
                "error": a.error,
                "started_at": a.started_at.isoformat(),
                "finished_at": a.finished_at.isoformat() if a.finished_at else None,
                "timeline": timeline(a.spans or []),
            }
            for a in attempts
        ],
    }
