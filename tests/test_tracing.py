"""OpenTelemetry: one trace from the agent's record_turn to the worker's job and its model call.

Spans go to the SDK's ``InMemorySpanExporter``. The message is the one the
lean publisher really wrote to Redis; the job runs in-process with exactly
that message's headers (``Task.apply(headers=...)``) against a real Redis
store and an OpenAI-compatible fake summarizer behind the real SDK.
"""

from __future__ import annotations

import base64
import json
import secrets
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from shared.core.config import StoreConfig
from shared.enqueue import TASK_MAYBE_SUMMARIZE, CeleryEnqueuer, NullEnqueuer, publisher_app
from shared.guard import ContextGuard
from shared.store.sessions import SessionStore
from shared.telemetry import tracing
from shared.telemetry.genai import model_call
from shared.telemetry.metrics import PrometheusMetrics, set_metrics
from workers.app import app
from workers.harness.demo_session import SYSTEM_PROMPT, TOOLS, demo_turns
from workers.harness.fakes.openai_server import FakeOpenAIServer
from workers.harness.fakes.summaries import SummarizerResponder
from workers.settings import load_settings
from workers.tasks import maybe_summarize


@pytest.fixture
def queue(redis_url: str) -> Iterator[str]:
    name = "tq" + secrets.token_hex(5)
    yield name
    client = redis.Redis.from_url(redis_url)
    client.delete(name)
    client.close()


def queued(redis_url: str, queue: str) -> list[dict[str, Any]]:
    client = redis.Redis.from_url(redis_url)
    raw = client.lrange(queue, 0, -1)
    client.close()
    return [json.loads(r) for r in raw]


def test_without_opentelemetry_spans_are_no_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracing, "_api", False)
    with tracing.span("x", {"a": 1}) as current:
        current.set_attribute("b", 2)
    assert current is tracing.NO_SPAN
    assert tracing.trace_headers() == {} and tracing.current_ids() is None
    assert tracing.context_from({"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}) \
        is None


def test_no_span_no_header_the_message_stays_send_tasks(redis_url: str, queue: str,
                                                        exporter: InMemorySpanExporter,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # metrics off, whatever an earlier test installed (they add compaction_sent_at)
    from shared.telemetry import metrics as metrics_module

    monkeypatch.setattr(metrics_module, "_current", metrics_module.NullMetrics())
    enqueuer = CeleryEnqueuer(publisher_app(redis_url), queue=queue)
    enqueuer.enqueue("default", "s1")
    with tracing.span("agent turn"):
        enqueuer.enqueue("default", "s2")
    enqueuer.close()
    plain, traced = queued(redis_url, queue)[::-1]
    assert not {"traceparent", "compaction_sent_at"} & set(plain["headers"])
    assert traced["headers"]["traceparent"].split("-")[1] == \
        f"{exporter.get_finished_spans()[0].context.trace_id:032x}"


def test_the_send_task_path_carries_the_headers_too(redis_url: str, queue: str,
                                                    exporter: InMemorySpanExporter) -> None:
    enqueuer = CeleryEnqueuer(publisher_app(redis_url), queue=queue, lean=False)
    set_metrics(PrometheusMetrics())
    try:
        with tracing.span("agent turn") as current:
            enqueuer.enqueue("default", "s3")
    finally:
        set_metrics(None)
    [message] = queued(redis_url, queue)
    headers = message["headers"]
    assert headers["traceparent"].split("-")[1] == \
        f"{current.get_span_context().trace_id:032x}"
    assert isinstance(headers["compaction_sent_at"], float)


def test_record_turn_to_job_to_summarizer_call_is_one_trace(
        redis_url: str, queue: str, key_prefix: str, real_redis: redis.Redis,
        exporter: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch) -> None:
    store = SessionStore(real_redis, StoreConfig(key_prefix=key_prefix))
    guard = ContextGuard(store, NullEnqueuer(), overrides={"gpt-4o": 16_000})
    turns = demo_turns(25)
    for turn in turns[:-1]:
        guard.prepare("t1", SYSTEM_PROMPT, TOOLS, 2000, "gpt-4o", pending=turn[:1])
        guard.record_turn("t1", turn)
    store.clear_pending("t1")  # the null enqueuer published nothing
    guard.enqueuer = CeleryEnqueuer(publisher_app(redis_url), queue=queue)
    # The agent's turn span; the guard's own record_turn span (once the shells are
    # instrumented, docs/observability.md) is its child and the publish's context.
    with tracing.span("agent turn") as turn_span:
        guard.record_turn("t1", turns[-1])
    [message] = queued(redis_url, queue)
    headers = message["headers"]
    assert headers["task"] == TASK_MAYBE_SUMMARIZE and "traceparent" in headers
    body = json.loads(base64.b64decode(message["body"]))
    args, kwargs = body[0], body[1]

    with FakeOpenAIServer(responder=SummarizerResponder()) as llm:
        settings = load_settings(redis_url=redis_url, key_prefix=key_prefix,
                                 summarizer="openai", summarizer_base_url=llm.base_url,
                                 summarizer_api_key="k", summarizer_model="gpt-4o-mini")
        monkeypatch.setitem(app.conf, "compaction_settings", settings)
        result = maybe_summarize.apply(args=args, kwargs=kwargs, headers=headers).get()
    assert result["status"] == "compacted" and result["summary_kind"] == "llm"

    spans = {s.name: s for s in exporter.get_finished_spans()}
    agent = spans.get("compaction.record_turn", spans["agent turn"])
    job = spans["compaction.maybe_summarize"]
    calls = [s for s in exporter.get_finished_spans() if s.name == "chat gpt-4o-mini"]
    assert len(calls) == len(llm.requests) >= 1  # a summary, and a split turn's prefix
    trace_id = turn_span.get_span_context().trace_id
    assert {agent.context.trace_id, job.context.trace_id} == {trace_id}
    assert job.parent is not None and job.parent.span_id == agent.context.span_id
    assert job.kind == SpanKind.CONSUMER
    assert job.attributes is not None and job.attributes["compaction.session_id"] == "t1"
    assert job.attributes["compaction.status"] == "compacted"
    for call in calls:
        assert call.context.trace_id == trace_id
        assert call.parent is not None and call.parent.span_id == job.context.span_id
        assert call.kind == SpanKind.CLIENT
        attrs = dict(call.attributes or {})
        assert attrs["gen_ai.operation.name"] == "chat"
        assert attrs["gen_ai.request.model"] == "gpt-4o-mini"
        assert attrs["gen_ai.provider.name"] == attrs["gen_ai.system"] == "openai"
        assert attrs["gen_ai.request.max_tokens"] > 0
    # The usage the spans report is what the stored summary says it cost.
    summary = store.summaries("t1")[-1]
    assert sum(int((c.attributes or {})["gen_ai.usage.input_tokens"])
               for c in calls) == summary.input_tokens > 0
    assert sum(int((c.attributes or {})["gen_ai.usage.output_tokens"])
               for c in calls) == summary.output_tokens > 0


def test_a_failed_model_call_is_an_error_span_and_counted(
        exporter: InMemorySpanExporter) -> None:
    metrics = set_metrics(PrometheusMetrics())
    assert isinstance(metrics, PrometheusMetrics)
    try:
        with pytest.raises(TimeoutError), model_call("gemini", "gemini-2.5-flash-lite", 500):
            raise TimeoutError("slow")
    finally:
        set_metrics(None)
    [span] = exporter.get_finished_spans()
    assert span.status.status_code == StatusCode.ERROR
    assert (span.attributes or {})["error.type"] == "TimeoutError"
    assert (span.attributes or {})["gen_ai.provider.name"] == "gcp.gemini"
    assert metrics.registry.get_sample_value(
        "compaction_summarizer_errors_total",
        {"provider": "gemini", "error": "TimeoutError"}) == 1.0
