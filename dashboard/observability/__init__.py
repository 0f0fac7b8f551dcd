"""What the system tells about itself: counters, structured logs, job traces and
their OTLP export. See docs/operations.md#observability."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dashboard.observability.counters import (
        COUNTER_DEFS,
        HISTOGRAM_DEFS,
        HTTP_REQUEST_SECONDS,
        count_fencing_rejection,
        count_fetch_host_deferral,
        count_precompute_spans,
        count_rollout_heartbeat_error,
        flush,
        observe,
        observe_precompute,
        parse_field,
        read_all,
        record_run_event,
        version_label,
        watch_redlock,
    )
    from dashboard.observability.traces import (
        claimed,
        lock_span,
        phase,
        run_trace,
        trace_id_of,
        traced,
    )

__all__ = [
    "COUNTER_DEFS",
    "HISTOGRAM_DEFS",
    "HTTP_REQUEST_SECONDS",
    "claimed",
    "count_fencing_rejection",
    "count_fetch_host_deferral",
    "count_precompute_spans",
    "count_rollout_heartbeat_error",
    "flush",
    "lock_span",
    "observe",
    "observe_precompute",
    "parse_field",
    "phase",
    "read_all",
    "record_run_event",
    "run_trace",
    "trace_id_of",
    "traced",
    "version_label",
    "watch_redlock",
]

#: Each public name and the module that defines it. A module loads when one of its names is
#: first read (PEP 562), so settings can import a package before Django's app registry is
#: ready, and a name is read from its module each time: a test that patches the module is
#: seen here too. See docs/architecture.md#package-surfaces.
_SURFACE: dict[str, str] = {
    "COUNTER_DEFS": "dashboard.observability.counters",
    "HISTOGRAM_DEFS": "dashboard.observability.counters",
    "HTTP_REQUEST_SECONDS": "dashboard.observability.counters",
    "count_fencing_rejection": "dashboard.observability.counters",
    "count_fetch_host_deferral": "dashboard.observability.counters",
    "count_rollout_heartbeat_error": "dashboard.observability.counters",
    "flush": "dashboard.observability.counters",
    "observe": "dashboard.observability.counters",
    "observe_precompute": "dashboard.observability.counters",
    "count_precompute_spans": "dashboard.observability.counters",
    "parse_field": "dashboard.observability.counters",
    "read_all": "dashboard.observability.counters",
    "record_run_event": "dashboard.observability.counters",
    "version_label": "dashboard.observability.counters",
    "watch_redlock": "dashboard.observability.counters",
    "claimed": "dashboard.observability.traces",
    "lock_span": "dashboard.observability.traces",
    "phase": "dashboard.observability.traces",
    "run_trace": "dashboard.observability.traces",
    "trace_id_of": "dashboard.observability.traces",
    "traced": "dashboard.observability.traces",
}


def __getattr__(name: str) -> object:
    try:
        module = _SURFACE[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    return getattr(importlib.import_module(module), name)
