"""One summarizer model call: a GenAI client span and the summarizer metrics.

Span attributes follow OpenTelemetry's GenAI semantic conventions: the span
is named ``"{gen_ai.operation.name} {gen_ai.request.model}"`` (``chat
gpt-4o-mini``), of kind CLIENT, with ``gen_ai.operation.name``,
``gen_ai.provider.name`` (and the older ``gen_ai.system``),
``gen_ai.request.model``, ``gen_ai.request.max_tokens``,
``gen_ai.response.model``, ``gen_ai.usage.input_tokens`` and
``gen_ai.usage.output_tokens``. A failure sets ``error.type`` to a bounded
error class (:data:`ERROR_CLASSES`; the GenAI conventions ask for "a
low-cardinality error identifier" documented by the instrumentation) and,
when the provider answered, ``http.response.status_code`` (HTTP conventions);
a wait the provider asked for is ``compaction.retry_after_seconds``.
``compaction_summarizer_errors_total`` counts failures by the same class.

The class comes from the exception's ``error_class`` attribute, set by the
provider clients (``workers.summarizer.failures``); a rejected summary without
one is ``bad_summary``, any other exception is named by its class.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from shared.core.errors import BadSummary
from shared.telemetry.metrics import get_metrics
from shared.telemetry.tracing import span

# Our provider names -> the semantic conventions' well-known gen_ai.provider.name values.
PROVIDER_NAMES = {"openai": "openai", "gemini": "gcp.gemini", "vertex": "gcp.vertex_ai"}

ERROR_CLASSES = frozenset({
    "rate_limited",      # HTTP 429 (RESOURCE_EXHAUSTED)
    "server_error",      # HTTP 5xx
    "timeout",           # the call's timeout (ours), HTTP 408
    "connection",        # cannot connect, connection reset
    "bad_response",      # a body that is no completion (cut JSON, a proxy's page with 200)
    "bad_request",       # other HTTP 4xx
    "auth",              # HTTP 401, 403
    "not_found",         # HTTP 404 (model or URL)
    "context_overflow",  # the request overflowed the summarizer's own window
    "content_filter",    # the reply was stopped by a safety or content filter
    "truncated",         # the reply was cut off at its token cap
    "bad_summary",       # the reply failed the quality check (empty, refusal, error text...)
    "cooldown",          # not called: the provider told another call to wait (no HTTP request)
    "other",             # a tag outside this set
})
"""The values of ``error.type`` on a summarizer span and of the errors counter's label for
the provider clients' errors (another exception: its class name)."""


def error_class(exc: BaseException) -> str:
    """The bounded class of a failed call (see :data:`ERROR_CLASSES`)."""
    tagged = getattr(exc, "error_class", None)
    if isinstance(tagged, str):
        return tagged if tagged in ERROR_CLASSES else "other"
    if isinstance(exc, BadSummary):
        return "bad_summary"
    # A client that does not tag its errors (an LLMClient of the caller's): the
    # exception's class name, as the conventions allow (bounded by the code's classes).
    return type(exc).__name__


@dataclass(slots=True)
class CallRecord:
    """Filled in by the caller when the reply is there."""

    span: Any
    input_tokens: int = 0
    output_tokens: int = 0
    response_model: str | None = None

    def done(self, input_tokens: int, output_tokens: int, model: str | None = None) -> None:
        self.input_tokens, self.output_tokens, self.response_model = (
            input_tokens, output_tokens, model)
        self.span.set_attributes({"gen_ai.usage.input_tokens": input_tokens,
                                  "gen_ai.usage.output_tokens": output_tokens,
                                  **({"gen_ai.response.model": model} if model else {})})


@contextlib.contextmanager
def model_call(provider: str, model: str, max_tokens: int | None = None,
               operation: str = "chat") -> Iterator[CallRecord]:
    """Span + metrics around one model call; call ``record.done(...)`` with the usage."""
    system = PROVIDER_NAMES.get(provider, provider)
    attributes = {"gen_ai.operation.name": operation, "gen_ai.provider.name": system,
                  "gen_ai.system": system, "gen_ai.request.model": model,
                  "gen_ai.request.max_tokens": max_tokens}
    started = time.perf_counter()
    with span(f"{operation} {model}", attributes, kind="client") as current:
        record = CallRecord(current)
        try:
            yield record
        except BaseException as exc:
            kind = error_class(exc)
            current.set_attribute("error.type", kind)
            status = getattr(exc, "http_status", None)
            if isinstance(status, int):
                current.set_attribute("http.response.status_code", status)
            wait = getattr(exc, "retry_after", None)
            if isinstance(wait, (int, float)):
                current.set_attribute("compaction.retry_after_seconds", float(wait))
            # A reply rejected after it came (bad_summary) was billed: its usage goes
            # with the error (a Metrics implementation may count both).
            get_metrics().summarizer_call(provider, model, time.perf_counter() - started,
                                          input_tokens=record.input_tokens,
                                          output_tokens=record.output_tokens, error=kind)
            raise
    get_metrics().summarizer_call(provider, model, time.perf_counter() - started,
                                  input_tokens=record.input_tokens,
                                  output_tokens=record.output_tokens)


__all__ = ["ERROR_CLASSES", "PROVIDER_NAMES", "CallRecord", "error_class", "model_call"]
