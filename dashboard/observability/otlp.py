"""OpenTelemetry export of job traces: with ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) set, every job attempt's spans — the same spans
``dashboard.observability.traces`` stores on ``JobAttempt.spans`` — are sent over OTLP/HTTP
(protobuf) when the attempt ends. Off by default; needs the ``otel`` extra (``pip install
'gitward[otel]'``: opentelemetry-sdk, opentelemetry-exporter-otlp-proto-http).

One attempt becomes one tree in the run's trace (trace id ``traces.trace_id_of(job_id)``,
shared by every attempt, log line and event of the run)::

    <kind> (the attempt: job, run, attempt, repository, queue, lock key, token, worker,
     │      version, outcome)
     ├── queued
     ├── dequeued
     └── finished | error            (status ERROR with the redacted error)
          ├── lock wait
          └── lock held
               └── mirror fetch / git stream / rows write

A span's parent is the narrowest ``lock held`` or attempt span that contains it in time
(a phase outside the lock hangs off the attempt span). Attributes are the stored span's
(``gitward.<name>``; ``key`` is ``gitward.lock_key``); every string is passed through
``workers.remotes.parse.redact`` once more, so no credential reaches the collector even from a
row written before URLs were checked.

Why export synchronously at the end of the attempt, not through a ``BatchSpanProcessor``:
RQ runs each job in a forked work horse that leaves with ``os._exit`` — a batch
processor's worker thread does not exist in the fork (threads are not copied), and its
``atexit`` flush never runs, so spans queued there would be lost silently. Instead the
attempt's spans are built only when it ends (they are timed already) and sent in one
request from the process that ran it, with a bounded deadline (``OTEL_EXPORTER_OTLP_TIMEOUT``,
2 s unless set: the SDK's own default of 10 s would hold a worker that long per attempt
while a collector is down); the exporter (its HTTP session) is created in the process
that uses it, never inherited across a fork. A failed export logs one warning and never
fails the job.
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Sequence
from typing import Any

from django.conf import settings

from dashboard.models import JobRun
from workers.remotes import redact

log = logging.getLogger(__name__)

#: Stored span attribute → exported attribute name (the rest become ``gitward.<name>``).
RENAMED = {"key": "lock_key"}
#: Spans that may parent others (besides the attempt's root): the lease held.
CONTAINERS = ("lock held",)

#: ``((pid, endpoint, timeout), exporter)``: the exporter built in this process (a fork
#: builds its own; a changed configuration, as in tests, a new one).
_exporter: tuple[tuple[Any, ...], Any] | None = None


def enabled() -> bool:
    return bool(settings.OTLP_EXPORT)


def export(*, run_id: int, number: int, trace_id: str, spans: Sequence[dict[str, Any]]) -> bool:
    """Send one attempt's spans (stored order: the attempt's own span last); True when
    the collector accepted them. A no-op (False) unless configured."""
    if not enabled() or not spans:
        return False
    try:
        return _export(run_id=run_id, number=number, trace_id=trace_id, spans=spans)
    except Exception as exc:  # telemetry never fails a job
        log.warning("OTLP export of run %d attempt %d failed: %s", run_id, number, exc)
        return False


def _export(*, run_id: int, number: int, trace_id: str, spans: Sequence[dict[str, Any]]) -> bool:
    # Imported here: an optional, heavy dependency (the `otel` extra), loaded only by a
    # process configured to export.
    from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
    from opentelemetry.sdk.trace.export import SpanExportResult
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
    from opentelemetry.trace import Status, StatusCode, set_span_in_context

    fields = ("job_id", "kind", "queue", "repository_id", "repository__url", "version",
              "worker", "lock_key", "token")  # fmt: skip
    run = JobRun.objects.filter(pk=run_id).values(*fields).first()
    if run is None:
        return False
    by_name = {s["name"]: s for s in spans}
    last = spans[-1]
    wait = by_name.get("lock wait", {}).get("attrs", {})
    root_attrs = {
        "gitward.job_id": run["job_id"],
        "gitward.run_id": run_id,
        "gitward.attempt": number,
        "gitward.kind": run["kind"],
        "gitward.queue": run["queue"],
        "gitward.repository.id": run["repository_id"],
        "gitward.repository.url": run["repository__url"],
        "gitward.worker": by_name.get("dequeued", {}).get("attrs", {}).get("worker")
        or run["worker"],
        "gitward.version": (run["version"] or "")[:12],
        "gitward.lock_key": wait.get("key") or run["lock_key"],
        "gitward.token": wait.get("token") or run["token"],
        "gitward.outcome": last["name"],
    }

    class FixedTrace(RandomIdGenerator):
        """The run's trace id for the attempt's root span (children inherit it)."""

        def generate_trace_id(self) -> int:
            return int(trace_id, 16)

    class Collect(SpanProcessor):
        def __init__(self) -> None:
            self.ended: list[ReadableSpan] = []

        def on_end(self, span: ReadableSpan) -> None:
            self.ended.append(span)

    collect = Collect()
    # A provider per attempt: cheap, carries this attempt's trace id, and leaves no
    # global state (nor an atexit hook) behind in a long-lived worker.
    provider = TracerProvider(
        resource=_resource(), id_generator=FixedTrace(), shutdown_on_exit=False
    )
    provider.add_span_processor(collect)
    tracer = provider.get_tracer("gitward.traces")

    t0 = min(s["start"] for s in spans)
    t1 = max(s["end"] for s in spans)
    root = tracer.start_span(run["kind"] or "attempt", attributes=_clean(root_attrs),
                             start_time=_ns(t0))  # fmt: skip
    if last["name"] == "error":
        root.set_status(Status(StatusCode.ERROR, redact(str(last["attrs"].get("error", "")))))
    made: list[tuple[dict[str, Any], Any]] = []
    # Parents before children: the attempt's span, the leases held, then the rest.
    rest = [s for s in spans if s is not last]
    for s in [last, *(s for s in rest if s["name"] in CONTAINERS),
              *(s for s in rest if s["name"] not in CONTAINERS)]:  # fmt: skip
        parent = _parent(s, spans, last)
        ctx = root if parent is None else next(sp for st, sp in made if st is parent)
        attrs = {f"gitward.{RENAMED.get(k, k)}": v for k, v in s["attrs"].items()}
        span = tracer.start_span(s["name"], context=set_span_in_context(ctx),
                                 attributes=_clean(attrs), start_time=_ns(s["start"]))  # fmt: skip
        if s["name"] == "error":
            span.set_status(Status(StatusCode.ERROR, redact(str(s["attrs"].get("error", "")))))
        made.append((s, span))
    for s, span in made:
        span.end(end_time=_ns(s["end"]))
    root.end(end_time=_ns(t1))
    # Sent in the stored order, the root first: the order a reader of the export expects.
    rank: dict[tuple[str, int | None], int] = {
        (st["name"], _ns(st["start"])): i for i, st in enumerate(spans)
    }
    ended = sorted(
        collect.ended,
        key=lambda sp: -1 if sp.parent is None else rank.get((sp.name, sp.start_time), 0),
    )
    result = _the_exporter().export(ended)
    if result is not SpanExportResult.SUCCESS:
        log.warning("OTLP export of run %d attempt %d was not accepted", run_id, number)
        return False
    return True


def _parent(
    span: dict[str, Any], spans: Sequence[dict[str, Any]], last: dict[str, Any]
) -> dict[str, Any] | None:
    """``span``'s parent: None for the root (the attempt's own span, ``queued`` and
    ``dequeued``, which precede it, hang off the root); the attempt's span for the lock
    spans; else the narrowest ``lock held`` that contains it in time, or the attempt's."""
    if span is last or span["name"] in ("queued", "dequeued"):
        return None
    if span["name"] in ("lock wait", *CONTAINERS):
        return last
    # Exact comparison: stored times are rounded to the microsecond, and rounding keeps
    # order, so a span inside the lease in time stays inside after rounding (and one
    # marked after the release, like ``rows write``, stays outside).
    holders = [
        c
        for c in spans
        if c["name"] in CONTAINERS and c["start"] <= span["start"] and span["end"] <= c["end"]
    ]
    return min(holders, key=lambda c: c["end"] - c["start"]) if holders else last


def _clean(attrs: dict[str, Any]) -> dict[str, Any]:
    """OTLP attribute values: scalars only, strings redacted, None dropped."""
    out: dict[str, Any] = {}
    for k, v in attrs.items():
        if v is None:
            continue
        if isinstance(v, str):
            out[k] = redact(v)
        elif isinstance(v, bool | int | float):
            out[k] = v
        else:
            out[k] = redact(str(v))
    return out


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


def _resource() -> Any:
    """``Resource.create`` reads ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES``;
    ``gitward`` is the service name unless either names one."""
    from opentelemetry.sdk.resources import Resource  # the optional dependency, as above

    attrs: dict[str, Any] = {"service.instance.id": _instance()}
    if not os.environ.get("OTEL_SERVICE_NAME") and "service.name=" not in os.environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    ):
        attrs["service.name"] = "gitward"
    return Resource.create(attrs)


_instance_id = secrets.token_hex(8)


def _instance() -> str:
    return f"{os.uname().nodename}-{_instance_id}"


def _the_exporter() -> Any:
    """This process's exporter. Built lazily and rebuilt after a fork: its HTTP session's
    pooled connections must not be shared with the parent (both would write to one
    socket)."""
    global _exporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    # OTEL_EXPORTER_OTLP_TRACES_TIMEOUT, when set, wins (the SDK reads it); else ours.
    own = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT")
    timeout = None if own else float(settings.OTEL_EXPORTER_OTLP_TIMEOUT)
    key = (
        os.getpid(),
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"),
        own,
        timeout,
    )
    if _exporter is None or _exporter[0] != key:
        _exporter = (key, OTLPSpanExporter(timeout=timeout))
    return _exporter[1]
