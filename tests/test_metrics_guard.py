"""The guard's metrics and spans, once its shells carry the instrumentation calls.

docs/observability.md ("Guard instrumentation") lists the calls; until the
guard has them this module is skipped (the guard is being rewritten into
sync and async shells by another change).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import shared.guard
from shared.core.config import StoreConfig
from shared.enqueue import NullEnqueuer
from shared.guard import ContextGuard
from shared.store.sessions import SessionStore
from shared.telemetry import tracing
from shared.telemetry.metrics import PrometheusMetrics, set_metrics
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


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    tracing.use_tracer_provider(provider)
    yield exported
    tracing.use_tracer_provider(None)


def value(m: PrometheusMetrics, name: str, **labels: str) -> float:
    return m.registry.get_sample_value(name, labels) or 0.0


def test_every_guard_decision_is_counted_and_spanned(
        fake_redis: object, key_prefix: str, metrics: PrometheusMetrics,
        spans: InMemorySpanExporter) -> None:
    store = SessionStore(fake_redis, StoreConfig(key_prefix=key_prefix))
    guard = ContextGuard(store, NullEnqueuer(), overrides={"gpt-4o": 16_000})  # no worker
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

    names = [s.name for s in spans.get_finished_spans()]
    assert names.count("compaction.prepare") == prepared
    assert names.count("compaction.record_turn") == len(turns)
    assert names.count("compaction.recover") == 1
    [recover] = [s for s in spans.get_finished_spans() if s.name == "compaction.recover"]
    attrs = dict(recover.attributes or {})
    assert attrs["compaction.stated_limit"] == 12_000 and attrs["compaction.recovery"] is True
    assert attrs["compaction.truncated"] is True
