"""One summarizer model call: a GenAI client span and the summarizer metrics.

Span attributes follow OpenTelemetry's GenAI semantic conventions: the span
is named ``"{gen_ai.operation.name} {gen_ai.request.model}"`` (``chat
gpt-4o-mini``), of kind CLIENT, with ``gen_ai.operation.name``,
``gen_ai.provider.name`` (and the older ``gen_ai.system``),
``gen_ai.request.model``, ``gen_ai.request.max_tokens``,
``gen_ai.response.model``, ``gen_ai.usage.input_tokens`` and
``gen_ai.usage.output_tokens``; a failure sets ``error.type``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from shared.telemetry.metrics import get_metrics
from shared.telemetry.tracing import span

# Our provider names -> the semantic conventions' well-known gen_ai.provider.name values.
PROVIDER_NAMES = {"openai": "openai", "gemini": "gcp.gemini", "vertex": "gcp.vertex_ai"}


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
            current.set_attribute("error.type", type(exc).__name__)
            get_metrics().summarizer_call(provider, model, time.perf_counter() - started,
                                          error=type(exc).__name__)
            raise
    get_metrics().summarizer_call(provider, model, time.perf_counter() - started,
                                  input_tokens=record.input_tokens,
                                  output_tokens=record.output_tokens)


__all__ = ["PROVIDER_NAMES", "CallRecord", "model_call"]
