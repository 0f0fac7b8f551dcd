"""Structured logs: one JSON object per line (``GITWARD_LOG_FORMAT=json``) or text, with
the context of the job being run, and credentials redacted from every line.

The context (job id, trace id, repository, lock key, fencing token, worker, version) is a
``contextvars`` mapping bound by ``bind(...)`` — ``dashboard.observability.traces`` binds it for
each job attempt — so every log call made while the job runs carries it, from any module, without
passing it around. Threads started inside a job (the lock heartbeat) do not inherit it; their lines
carry what the message itself says.

Redaction is the formatter's last step (``workers.remotes.parse.redact``: URL userinfo,
Authorization header values), applied to the whole formatted line — message, arguments,
exception and traceback — so no logger anywhere can leak a credential by formatting a URL.

Wired in ``dashboard/settings.py`` (``LOGGING``); this module imports no settings.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from workers.remotes import redact

#: The fields a job binds, in the order they are printed.
FIELDS = ("job", "trace", "run", "attempt", "repo", "lock", "token", "worker", "version")

_context: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "gitward_log_context", default=None
)


def current() -> dict[str, Any]:
    """The fields bound now (a copy)."""
    return dict(_context.get() or {})


@contextlib.contextmanager
def bind(**fields: Any) -> Iterator[None]:
    """Add ``fields`` (None values ignored) to every log line inside the block."""
    merged = {**(_context.get() or {}), **{k: v for k, v in fields.items() if v is not None}}
    token = _context.set(merged)
    try:
        yield
    finally:
        _context.reset(token)


def update(**fields: Any) -> None:
    """Add fields to the innermost ``bind`` (e.g. the lock key and token once acquired)."""
    ctx = _context.get()
    if ctx is not None:  # outside any bind: nothing to extend
        ctx.update({k: v for k, v in fields.items() if v is not None})


class ContextFilter(logging.Filter):
    """Copies the bound fields onto the record (``record.gitward``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.gitward = current()
        return True


class JsonFormatter(logging.Formatter):
    """``{"ts", "level", "logger", "msg", <context fields>, "exc"?}``, redacted."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        context = getattr(record, "gitward", None) or current()
        entry.update({k: context[k] for k in FIELDS if k in context})
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exc"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return redact(json.dumps(entry, default=str, ensure_ascii=False))


class TextFormatter(logging.Formatter):
    """``time LEVEL logger: message [job=… trace=…]``, redacted."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        context = getattr(record, "gitward", None) or current()
        if context:
            extra = " ".join(f"{k}={context[k]}" for k in FIELDS if k in context)
            first, sep, rest = line.partition("\n")
            line = f"{first} [{extra}]{sep}{rest}"
        return redact(line)
