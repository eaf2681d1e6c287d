"""Failed summarizer calls can be told apart in metrics and traces.

Through the summary engine and the real openai SDK against the fake server: the
``chat {model}`` span carries ``error.type`` as a bounded class and
``http.response.status_code`` when the provider answered, and
``compaction_summarizer_errors_total`` counts by the same class. A reply the
quality gate rejects is a failed call (``bad_summary``), not a success.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from shared.core.errors import BadSummary, SummarizerError
from shared.core.ledger import Ledger
from shared.core.messages import Message
from shared.telemetry.genai import ERROR_CLASSES, error_class, model_call
from shared.telemetry.metrics import PrometheusMetrics, set_metrics
from workers.harness.fakes.behaviour import Fault
from workers.harness.fakes.openai_server import FakeOpenAIServer
from workers.harness.fakes.summaries import SummarizerResponder
from workers.summarizer.engine import SummaryEngine
from workers.summarizer.providers import OpenAIClient

MESSAGES = [Message(role="user", content="please fix the failing test in src/app.py " * 20),
            Message(role="assistant", content="I changed the assertion and ran pytest " * 20)]




@pytest.fixture
def metrics() -> Iterator[PrometheusMetrics]:
    installed = set_metrics(PrometheusMetrics())
    assert isinstance(installed, PrometheusMetrics)
    yield installed
    set_metrics(None)


def _sample(metrics: PrometheusMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


@pytest.mark.parametrize(("fault", "kind", "status"), [
    (Fault.rate_limit(3), "rate_limited", 429),
    (Fault.server_error(), "server_error", 500),
    (Fault.unavailable(), "server_error", 503),
    (Fault.stall(3), "timeout", None),
    (Fault.reset(), "connection", None),
    (Fault.garbage(), "bad_response", None),
    (Fault.http_error(401, '{"error": {"message": "Incorrect API key provided"}}'), "auth", 401),
    (Fault.http_error(400, '{"error": {"message": "bad parameter foo"}}'), "bad_request", 400),
    (Fault.endless(), "truncated", None),
    (Fault.refusal(), "bad_summary", None),
    (Fault.empty(), "bad_summary", None),
], ids=lambda v: v if isinstance(v, str) else None)
def test_each_failure_has_its_class_on_the_span_and_the_counter(
        exporter: InMemorySpanExporter, metrics: PrometheusMetrics, fault: Fault, kind: str,
        status: int | None) -> None:
    with FakeOpenAIServer(responder=SummarizerResponder()) as server:
        server.faults.always(fault)
        engine = SummaryEngine(OpenAIClient("gpt-4o-mini", api_key="k",
                                            base_url=server.base_url, timeout=1))
        with pytest.raises(SummarizerError):
            engine.summarize(MESSAGES, None, Ledger())
    [span] = [s for s in exporter.get_finished_spans() if s.name == "chat gpt-4o-mini"]
    attributes = dict(span.attributes or {})
    assert span.status.status_code == StatusCode.ERROR
    assert attributes["error.type"] == kind
    assert attributes.get("http.response.status_code") == status
    assert ("compaction.retry_after_seconds" in attributes) == (kind == "rate_limited")
    assert _sample(metrics, "compaction_summarizer_errors_total", provider="openai",
                   error=kind) == 1.0
    assert _sample(metrics, "compaction_summarizer_calls_total", provider="openai",
                   model="gpt-4o-mini") == 1.0


def test_a_rejected_summary_is_counted_with_the_usage_it_was_billed(
        exporter: InMemorySpanExporter, metrics: PrometheusMetrics) -> None:
    """The quality gate runs inside the call's span: a refusal is no successful call."""
    with FakeOpenAIServer(responder=SummarizerResponder()) as server:
        server.faults.always(Fault.refusal())
        engine = SummaryEngine(OpenAIClient("gpt-4o-mini", api_key="k",
                                            base_url=server.base_url, timeout=5))
        with pytest.raises(BadSummary):
            engine.summarize(MESSAGES, None, Ledger())
    [span] = exporter.get_finished_spans()
    attributes = dict(span.attributes or {})
    assert attributes["error.type"] == "bad_summary"
    assert int(attributes["gen_ai.usage.input_tokens"]) > 0  # the reply came, and was billed
    assert _sample(metrics, "compaction_summarizer_errors_total", provider="openai",
                   error="bad_summary") == 1.0
    assert _sample(metrics, "compaction_summarizer_input_tokens_total", provider="openai",
                   model="gpt-4o-mini") == int(attributes["gen_ai.usage.input_tokens"])


def test_a_good_summary_is_a_successful_call(exporter: InMemorySpanExporter,
                                             metrics: PrometheusMetrics) -> None:
    with FakeOpenAIServer(responder=SummarizerResponder()) as server:
        engine = SummaryEngine(OpenAIClient("gpt-4o-mini", api_key="k",
                                            base_url=server.base_url, timeout=5))
        draft = engine.summarize(MESSAGES, None, Ledger())
    [span] = exporter.get_finished_spans()
    assert draft.kind == "llm" and "error.type" not in (span.attributes or {})
    assert span.status.status_code != StatusCode.ERROR
    assert _sample(metrics, "compaction_summarizer_input_tokens_total", provider="openai",
                   model="gpt-4o-mini") > 0


def test_labels_stay_bounded(metrics: PrometheusMetrics) -> None:
    class Tagged(Exception):
        error_class = "session-4711-was-here"  # a tag outside the set: "other"

    for exc in (Tagged(), BadSummary("empty"), TimeoutError("slow")):
        with pytest.raises(type(exc)), model_call("openai", "m"):
            raise exc
    assert error_class(Tagged()) == "other" and "other" in ERROR_CLASSES
    assert error_class(BadSummary("x")) == "bad_summary"
    assert error_class(TimeoutError()) == "TimeoutError"  # an untagged client's class name
    assert _sample(metrics, "compaction_summarizer_errors_total", provider="openai",
                   error="other") == 1.0
