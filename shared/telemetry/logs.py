"""Structured logs: one JSON object per line, with session, tenant, job and trace ids.

:func:`log_context` binds ids for the current thread or task (contextvars),
:class:`ContextFilter` copies them onto every record that passes a handler,
and :class:`JsonFormatter` writes the record as JSON. ``configure_json(handler)``
does both for one handler; the workers call it for their handlers when
``COMPACTION_LOG_FORMAT=json`` (``workers.logging_setup``).

Standard library only: no optional package.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import time
from collections.abc import Iterator
from typing import Any

from shared.telemetry.tracing import current_ids

CONTEXT_FIELDS = ("session_id", "tenant", "job_id", "task")
_context: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "compaction_log_context", default=None)
# Attributes every LogRecord has: anything else was passed with ``extra=``.
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime",
                                                              "taskName"}


@contextlib.contextmanager
def log_context(**ids: str | None) -> Iterator[None]:
    """Ids added to every log line written inside the block (nested blocks add up)."""
    current = _context.get() or {}
    token = _context.set({**current, **{k: str(v) for k, v in ids.items() if v is not None}})
    try:
        yield
    finally:
        _context.reset(token)


def current_context() -> dict[str, str]:
    """The ids bound now, with the trace and span ids of the current span."""
    ids = dict(_context.get() or {})
    trace = current_ids()
    if trace is not None:
        ids["trace_id"], ids["span_id"] = trace
    return ids


class ContextFilter(logging.Filter):
    """Copies the bound ids (and the current trace ids) onto each record; never drops one."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in current_context().items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True


class JsonFormatter(logging.Formatter):
    """``{"ts", "level", "logger", "message", session_id, tenant, job_id, trace_id, ...}``.

    The ids are always present (null when not bound), so a log pipeline can
    index them; fields passed with ``extra=`` are added; an exception is one
    ``exc_info`` string, a stack asked for with ``stack_info=True`` one ``stack_info``
    string (Python's formatter writes both on lines of their own).
    """

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        bound = current_context()
        for key in (*CONTEXT_FIELDS, "trace_id", "span_id"):
            entry[key] = getattr(record, key, None) or bound.get(key)
        for key, value in record.__dict__.items():
            if key not in _STANDARD and key not in entry and not key.startswith("_"):
                entry[key] = value if isinstance(value, (str, int, float, bool)) or (
                    value is None) else repr(value)
        if record.exc_info:
            entry["exc_info"] = self.formatException(record.exc_info)
        if record.stack_info:  # ``stack_info=True``: the caller's stack, in the object too
            entry["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False)


def configure_json(handler: logging.Handler) -> logging.Handler:
    """Make ``handler`` write JSON lines carrying the context ids."""
    handler.setFormatter(JsonFormatter())
    if not any(isinstance(f, ContextFilter) for f in handler.filters):
        handler.addFilter(ContextFilter())
    return handler


__all__ = ["CONTEXT_FIELDS", "ContextFilter", "JsonFormatter", "configure_json",
           "current_context", "log_context"]
