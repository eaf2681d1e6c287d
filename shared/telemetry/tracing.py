"""OpenTelemetry spans, a no-op without the ``otel`` extra.

``opentelemetry-api`` is imported on first use, never at import time, so the
core, the CLI and the demo load without it. Without an SDK configured by the
application (the API's proxy provider), :func:`span` yields a no-op span
without entering OpenTelemetry at all; nothing is recorded or exported
unless the process sets up a ``TracerProvider`` (or passes one to
:func:`use_tracer_provider`).

Context crosses the queue in the task message's headers: the publisher adds
:func:`trace_headers` (W3C ``traceparent``/``tracestate``) and the job's
span takes :func:`context_from` of them as its parent, so the agent's
``record_turn`` and the worker's job share one trace.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

TRACER_NAME = "context-compaction"
_api: Any = None  # the opentelemetry.trace module, False when it is not installed
_provider: Any = None


class _NoSpan:
    """What :func:`span` yields without OpenTelemetry: accepts everything, records nothing."""

    def set_attribute(self, key: str, value: Any) -> None:
        return None

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        return None

    def record_exception(self, exception: BaseException) -> None:
        return None

    def is_recording(self) -> bool:
        return False


NO_SPAN = _NoSpan()


def _trace() -> Any:
    global _api
    if _api is None:
        try:
            from opentelemetry import trace
        except ImportError:
            _api = False
        else:
            _api = trace
    return _api or None


def available() -> bool:
    """True when opentelemetry-api is installed."""
    return _trace() is not None


def use_tracer_provider(provider: Any) -> None:
    """Spans go to ``provider`` instead of the global one (None: the global again)."""
    global _provider
    _provider = provider


_tracers: dict[int, tuple[Any, Any]] = {}  # id(provider) -> (provider, its tracer)
_unconfigured_seen = False  # the API's global provider was the proxy at the last look


def _tracer(trace: Any) -> Any:
    """The tracer of the provider in use, or None when no SDK is configured.

    Without an SDK the global provider is the API's proxy (or no-op) provider,
    whose spans record nothing: skipping them keeps the guard's hot path at
    what it costs without OpenTelemetry (a non-recording span still costs
    about 15 us of context bookkeeping).
    """
    global _unconfigured_seen
    if _provider is None and _unconfigured_seen and getattr(trace, "_TRACER_PROVIDER", 0) is None:
        # Still no global SDK provider since the API last said so: skip get_tracer_provider(),
        # which looks its environment variable up (a KeyError) on every call (~4 us).
        return None
    provider = _provider if _provider is not None else trace.get_tracer_provider()
    if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        _unconfigured_seen = _provider is None
        return None
    found = _tracers.get(id(provider))
    if found is None or found[0] is not provider:
        if len(_tracers) > 16:
            _tracers.clear()
        found = _tracers[id(provider)] = (provider, provider.get_tracer(TRACER_NAME))
    return found[1]


def configured() -> bool:
    """Whether spans would record now (an SDK provider is set): a caller on the hot path
    skips building the span's context manager when not."""
    trace = _trace()
    return trace is not None and _tracer(trace) is not None


@contextlib.contextmanager
def span(name: str, attributes: Mapping[str, Any] | None = None, *, kind: str = "internal",
         parent: Any = None) -> Iterator[Any]:
    """A span around the block (the current span inside it); a no-op without OpenTelemetry.

    ``kind``: ``internal``, ``client``, ``server``, ``producer`` or ``consumer``.
    ``parent``: a context from :func:`context_from` (default: the current one).
    An exception leaving the block is recorded, sets the status to error and, unless the
    block set one, ``error.type`` to the exception's class name.
    """
    trace = _trace()
    tracer = _tracer(trace) if trace is not None else None
    if tracer is None:
        yield NO_SPAN
        return
    span_kind = getattr(trace.SpanKind, kind.upper())
    clean = {k: v for k, v in (attributes or {}).items() if v is not None}
    with tracer.start_as_current_span(name, context=parent, kind=span_kind,
                                      attributes=clean) as current:
        try:
            yield current
        except Exception as exc:  # what OpenTelemetry records too (not GeneratorExit & co.)
            _failed(current, exc)
            raise


def _failed(current: Any, exc: Exception) -> None:
    """``error.type`` on a span an exception ends (the error conventions: its status alone
    says nothing an alert can group by), unless the block set a bounded class itself
    (a summarizer call's, :mod:`shared.telemetry.genai`)."""
    if current.is_recording() and "error.type" not in (getattr(current, "attributes", None)
                                                       or {}):
        current.set_attribute("error.type", type(exc).__name__)


def trace_headers() -> dict[str, str]:
    """W3C trace-context headers of the current span ({} without one, or without otel)."""
    trace = _trace()
    if trace is None or not trace.get_current_span().get_span_context().is_valid:
        return {}
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


def context_from(headers: Mapping[str, Any] | None) -> Any:
    """The context carried by ``headers`` (a task message's), or None."""
    if not headers or "traceparent" not in headers or _trace() is None:
        return None
    from opentelemetry import propagate

    return propagate.extract({k: str(v) for k, v in headers.items()
                              if k in ("traceparent", "tracestate")})


def current_ids() -> tuple[str, str] | None:
    """(trace id, span id) in hex of the current span, or None."""
    trace = _trace()
    if trace is None:
        return None
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"


__all__ = ["NO_SPAN", "TRACER_NAME", "available", "configured", "context_from", "current_ids",
           "span",
           "trace_headers", "use_tracer_provider"]
