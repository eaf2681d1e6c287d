"""The guard's metrics and spans, on both shells (sync and async).

docs/observability.md ("Guard instrumentation") lists the calls; the shells
share them (shared/guard/_shell.py). The module is skipped when no guard
module exposes ``get_metrics`` (an uninstrumented guard).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

import shared.guard
from shared.core.config import StoreConfig
from shared.enqueue import CallbackEnqueuer, NullEnqueuer
from shared.store.sessions import SessionStore, connect
from shared.telemetry.metrics import METRIC_ROLES, PrometheusMetrics, set_metrics
from shared.telemetry.propagation import publish_headers
from tests.guard_shells import SHELLS, make
from workers.harness.demo_session import SYSTEM_PROMPT, TOOLS, demo_turns

INSTRUMENTED = any(hasattr(module, "get_metrics") for name, module in list(sys.modules.items())
                   if name == "shared.guard" or name.startswith("shared.guard."))
pytestmark = pytest.mark.skipif(not INSTRUMENTED, reason="the guard shells do not call the "
                                "telemetry facade yet (docs/observability.md)")
OVERFLOW = ("This model's maximum context length is 12000 tokens. However, your messages "
            "resulted in 13500 tokens. Please reduce the length of the messages.")
assert shared.guard  # imported for the check above


@pytest.fixture
def metrics() -> Iterator[PrometheusMetrics]:
    m = PrometheusMetrics()
    set_metrics(m)
    yield m
    set_metrics(None)




@pytest.fixture(params=SHELLS)
def shell(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def value(m: PrometheusMetrics, name: str, **labels: str) -> float:
    return m.registry.get_sample_value(name, labels) or 0.0


def test_every_guard_decision_is_counted_and_spanned(
        fake_redis: object, key_prefix: str, metrics: PrometheusMetrics,
        exporter: InMemorySpanExporter, shell: str) -> None:
    store = SessionStore(fake_redis, StoreConfig(key_prefix=key_prefix))
    guard = make(shell, store, NullEnqueuer(), overrides={"gpt-4o": 16_000})  # no worker
    turns = demo_turns(40)
    prepared = 0
    for i, turn in enumerate(turns):
        view = guard.prepare("g1", SYSTEM_PROMPT, TOOLS, 2000, "gpt-4o", pending=turn[:1])
        prepared += 1
        if i == 30:
            assert guard.recover("g1", ValueError("rate limited"), SYSTEM_PROMPT, TOOLS, 2000,
                                 "gpt-4o", pending=turn[:1]) is None
            view = guard.recover("g1", OVERFLOW, SYSTEM_PROMPT, TOOLS, 2000, "gpt-4o",
                                 pending=turn[:1])
        usage = {"prompt_tokens": 10, "completion_tokens": 5} if i == 35 else None
        guard.record_turn("g1", turn, usage=usage)
    assert view is not None
    # path="recover": recover() itself, and the prepare after the silent truncation (it
    # compacts to the recovery ratio, like a recovery)
    assert value(metrics, "compaction_guard_prepare_duration_seconds_count",
                 path="prepare") == prepared - 1
    assert value(metrics, "compaction_guard_prepare_duration_seconds_count",
                 path="recover") == 2
    saved = value(metrics, "compaction_guard_saved_tokens_total", path="prepare")
    logged = value(metrics, "compaction_guard_log_tokens_total", path="prepare")
    sent = value(metrics, "compaction_guard_view_tokens_total", path="prepare")
    assert saved > 0 and sent < logged
    assert value(metrics, "compaction_compactions_total", kind="cheap", outcome="recorded") >= 1
    assert value(metrics, "compaction_compactions_total", kind="truncation",
                 outcome="compacted") >= 1
    assert value(metrics, "compaction_compactions_total", kind="recovery",
                 outcome="compacted") == 2
    assert value(metrics, "compaction_overflow_recoveries_total", outcome="recovered") == 1
    assert value(metrics, "compaction_overflow_recoveries_total", outcome="not_overflow") == 1
    assert value(metrics, "compaction_silent_truncation_suspected_total") == 1
    # what a guard exports is what METRIC_ROLES says a guard records (the check that the
    # dashboard's metrics are scraped relies on it: tests/test_observability_targets.py)
    exported = {f.name for f in metrics.registry.collect() if f.samples}
    assert exported and all(
        "guard" in METRIC_ROLES[n if n in METRIC_ROLES else n + "_total"] for n in exported), \
        exported

    names = [s.name for s in exporter.get_finished_spans()]
    assert names.count("compaction.prepare") == prepared
    assert names.count("compaction.record_turn") == len(turns)
    assert names.count("compaction.recover") == 1
    [recover] = [s for s in exporter.get_finished_spans() if s.name == "compaction.recover"]
    attrs = dict(recover.attributes or {})
    assert attrs["compaction.stated_limit"] == 12_000 and attrs["compaction.recovery"] is True
    assert attrs["compaction.truncated"] is True


def test_a_stated_window_the_guard_knew_is_on_the_recover_span(
        fake_redis: object, key_prefix: str, exporter: InMemorySpanExporter, shell: str) -> None:
    """An overflow that states the window the guard already uses: nothing is learned (the
    count was short), and the span still says what the provider stated."""
    store = SessionStore(fake_redis, StoreConfig(key_prefix=key_prefix))
    guard = make(shell, store, NullEnqueuer(), overrides={"gpt-4o": 16_000})
    *earlier, turn = demo_turns(4)
    for done in earlier:  # something to drop: a view no smaller is not retried
        guard.record_turn("g2", done)
    guard.prepare("g2", SYSTEM_PROMPT, TOOLS, 2000, "gpt-4o", pending=turn[:1])
    error = RuntimeError("This model's maximum context length is 16000 tokens. However, your "
                         "messages resulted in 16500 tokens.")
    assert guard.recover("g2", error, SYSTEM_PROMPT, TOOLS, 2000, "gpt-4o",
                         pending=turn[:1]) is not None
    [recover] = [s for s in exporter.get_finished_spans() if s.name == "compaction.recover"]
    attrs = dict(recover.attributes or {})
    assert attrs["compaction.stated_limit"] == 16_000
    assert "compaction.inferred_limit" not in attrs and guard.limits.get("gpt-4o") is None


def test_a_recovery_with_nothing_smaller_is_counted_and_spanned(
        fake_redis: object, key_prefix: str, metrics: PrometheusMetrics,
        exporter: InMemorySpanExporter, shell: str) -> None:
    store = SessionStore(fake_redis, StoreConfig(key_prefix=key_prefix))
    guard = make(shell, store, NullEnqueuer(), overrides={"gpt-4o": 16_000})
    turn = demo_turns(1)[0]
    guard.prepare("g3", SYSTEM_PROMPT, TOOLS, 2000, "gpt-4o", pending=turn[:1])
    error = RuntimeError("This model's maximum context length is 16000 tokens.")
    assert guard.recover("g3", error, SYSTEM_PROMPT, TOOLS, 2000, "gpt-4o",
                         pending=turn[:1]) is None
    assert value(metrics, "compaction_overflow_recoveries_total",
                 outcome="no_smaller_view") == 1
    assert value(metrics, "compaction_overflow_recoveries_total", outcome="recovered") == 0
    [recover] = [s for s in exporter.get_finished_spans() if s.name == "compaction.recover"]
    assert dict(recover.attributes or {})["compaction.no_smaller_view"] is True


def test_degraded_view_is_counted(metrics: PrometheusMetrics, exporter: InMemorySpanExporter,
                                  shell: str) -> None:
    cfg = StoreConfig(socket_timeout=0.2, connect_timeout=0.2)  # Redis is down
    guard = make(shell, SessionStore(connect("redis://127.0.0.1:1/0", cfg), cfg),
                 overrides={"gpt-4o": 16_000})
    view = guard.prepare("d1", SYSTEM_PROMPT, TOOLS, 2000, "gpt-4o",
                         fallback_messages=[m for turn in demo_turns(3) for m in turn])
    assert view.report.degraded
    assert value(metrics, "compaction_guard_prepare_duration_seconds_count",
                 path="degraded") == 1
    assert value(metrics, "compaction_guard_view_tokens_total", path="degraded") > 0
    [prepare] = [s for s in exporter.get_finished_spans() if s.name == "compaction.prepare"]
    assert dict(prepare.attributes or {})["compaction.degraded"] is True


def test_the_published_job_carries_the_record_turn_trace(
        fake_redis: object, key_prefix: str, exporter: InMemorySpanExporter, shell: str) -> None:
    """The publish runs inside record_turn's producer span: its headers name that span."""
    published: list[dict[str, Any]] = []
    store = SessionStore(fake_redis, StoreConfig(key_prefix=key_prefix))
    guard = make(shell, store, CallbackEnqueuer(lambda *_: published.append(publish_headers())),
                 overrides={"gpt-4o": 16_000})
    turn = demo_turns(1)[0]
    guard.prepare("p1", SYSTEM_PROMPT, TOOLS, 2000, "gpt-4o", pending=turn[:1])
    assert guard.record_turn("p1", turn) == len(turn)
    [headers] = published  # the append marked the session pending: one job
    [producer] = [s for s in exporter.get_finished_spans() if s.name == "compaction.record_turn"]
    _, trace_id, span_id, _ = headers["traceparent"].split("-")
    assert (int(trace_id, 16), int(span_id, 16)) == (producer.context.trace_id,
                                                     producer.context.span_id)
    assert producer.kind == SpanKind.PRODUCER
    assert dict(producer.attributes or {})["compaction.log_length"] == len(turn)


def test_jobs_asked_for_are_counted_published_or_failed(
        fake_redis: object, key_prefix: str, metrics: PrometheusMetrics, shell: str) -> None:
    """A broker the guard cannot reach showed nowhere but in a log line: compaction
    stopped, the queue read empty, and only truncations were counted."""
    store = SessionStore(fake_redis, StoreConfig(key_prefix=key_prefix))
    turn = demo_turns(1)[0]
    published: list[str] = []
    ok = make(shell, store, CallbackEnqueuer(lambda _tenant, sid: published.append(sid)),
              overrides={"gpt-4o": 16_000})
    ok.prepare("e1", SYSTEM_PROMPT, TOOLS, 2000, "gpt-4o", pending=turn[:1])
    ok.record_turn("e1", turn)
    assert published == ["e1"]
    assert value(metrics, "compaction_enqueue_total", outcome="published") == 1

    def unreachable(_tenant: str, _sid: str) -> None:
        raise ConnectionError("broker unreachable")

    down = make(shell, store, CallbackEnqueuer(unreachable), overrides={"gpt-4o": 16_000})
    down.prepare("e2", SYSTEM_PROMPT, TOOLS, 2000, "gpt-4o", pending=turn[:1])
    down.record_turn("e2", turn)
    assert value(metrics, "compaction_enqueue_total", outcome="failed") == 1
    assert not store.is_pending("e2")  # cleared: the next turn asks again
