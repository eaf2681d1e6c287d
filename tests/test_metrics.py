"""The metrics facade: NullMetrics by default, PrometheusMetrics values, optional imports."""

from __future__ import annotations

import asyncio
import math

import httpx
import prometheus_client
import pytest

from shared.telemetry import metrics as metrics_module
from shared.telemetry.metrics import (
    METRIC_NAMES,
    NullMetrics,
    PrometheusMetrics,
    get_metrics,
    install_prometheus,
    metrics_app,
    set_metrics,
)
from shared.telemetry.propagation import SENT_AT_HEADER, publish_headers
from tests.test_layers import run_isolated


@pytest.fixture(autouse=True)
def _reset() -> None:
    set_metrics(None)


def value(m: PrometheusMetrics, name: str, **labels: str) -> float | None:
    found: float | None = m.registry.get_sample_value(name, labels)
    return found


def test_null_metrics_is_the_default_and_accepts_every_call() -> None:
    null = get_metrics()
    assert isinstance(null, NullMetrics)
    null.prepare_done(0.001, view_tokens=10, log_tokens=100)
    null.compaction("llm", "compacted")
    null.recovery("recovered")
    null.silent_truncation()
    null.job_done("maybe_summarize", "compacted", 1.0)
    null.worker_lag(messages=3, seconds=0.5)
    null.summarizer_call("openai", "m", 1.0, input_tokens=1, output_tokens=1)
    null.lease_contention("busy")
    null.queue_depth_source(lambda: 1.0)
    assert publish_headers() == {}


def test_prometheus_metrics_count_what_they_are_told() -> None:
    m = PrometheusMetrics()
    m.prepare_done(0.0004, view_tokens=3_000, log_tokens=10_000)
    m.prepare_done(0.002, view_tokens=2_000, log_tokens=1_500, path="recover")
    m.compaction("cheap", "recorded")
    m.compaction("truncation", "lost_swap")
    m.recovery("recovered")
    m.silent_truncation()
    m.job_done("compact", "compacted", 2.5)
    m.worker_lag(messages=40, seconds=0.25)
    m.summarizer_call("openai", "gpt-4o-mini", 1.2, input_tokens=900, output_tokens=120)
    m.summarizer_call("openai", "gpt-4o-mini", 0.1, error="SummarizerUnavailable")
    m.lease_contention("busy")
    assert value(m, "compaction_guard_prepare_duration_seconds_count", path="prepare") == 1
    assert value(m, "compaction_guard_prepare_duration_seconds_bucket", path="prepare",
                 le="0.0005") == 1
    assert value(m, "compaction_guard_view_tokens_total", path="prepare") == 3_000
    assert value(m, "compaction_guard_log_tokens_total", path="prepare") == 10_000
    assert value(m, "compaction_guard_saved_tokens_total", path="prepare") == 7_000
    # a view larger than the log (summary > what it replaced) saves nothing, never negative
    assert value(m, "compaction_guard_saved_tokens_total", path="recover") == 0
    assert value(m, "compaction_compactions_total", kind="cheap", outcome="recorded") == 1
    assert value(m, "compaction_compactions_total", kind="truncation",
                 outcome="lost_swap") == 1
    assert value(m, "compaction_overflow_recoveries_total", outcome="recovered") == 1
    assert value(m, "compaction_silent_truncation_suspected_total") == 1
    assert value(m, "compaction_jobs_total", task="compact", outcome="compacted") == 1
    assert value(m, "compaction_job_duration_seconds_sum", task="compact") == 2.5
    assert value(m, "compaction_worker_lag_messages_sum") == 40
    assert value(m, "compaction_worker_lag_seconds_sum") == 0.25
    assert value(m, "compaction_summarizer_calls_total", provider="openai",
                 model="gpt-4o-mini") == 2
    assert value(m, "compaction_summarizer_input_tokens_total", provider="openai",
                 model="gpt-4o-mini") == 900
    assert value(m, "compaction_summarizer_output_tokens_total", provider="openai",
                 model="gpt-4o-mini") == 120
    assert value(m, "compaction_summarizer_errors_total", provider="openai",
                 error="SummarizerUnavailable") == 1
    assert value(m, "compaction_lease_contention_total", result="busy") == 1


def test_every_name_is_exposed_with_prefix_and_units() -> None:
    m = PrometheusMetrics()
    m.queue_depth_source(lambda: 0.0)  # without a source (the agent process) it is absent
    text = m.exposition().decode()
    for name in METRIC_NAMES:
        assert name.startswith("compaction_")
        base = name if f"# TYPE {name} " in text else name.removesuffix("_total")
        assert f"# HELP {base} " in text, name
        kind = text.split(f"# TYPE {base} ", 1)[1].split("\n", 1)[0]
        assert name.endswith("_total") == (kind == "counter"), (name, kind)
        if kind == "histogram":
            assert name.endswith(("_seconds", "_messages")), name
    assert len(set(METRIC_NAMES)) == len(METRIC_NAMES)


def test_queue_depth_is_read_at_scrape_time_and_a_failing_source_is_nan() -> None:
    m = PrometheusMetrics()
    assert value(m, "compaction_queue_depth") is None  # no source: no sample
    depth = [3.0]
    m.queue_depth_source(lambda: depth[0])
    assert value(m, "compaction_queue_depth") == 3.0
    depth[0] = 7.0
    assert value(m, "compaction_queue_depth") == 7.0

    def broken() -> float:
        raise ConnectionError("broker down")

    m.queue_depth_source(broken)
    found = value(m, "compaction_queue_depth")
    assert found is not None and math.isnan(found)


def test_registries_are_separate_and_install_is_idempotent() -> None:
    registry = prometheus_client.CollectorRegistry()
    first = install_prometheus(registry)
    assert install_prometheus() is first and get_metrics() is first
    assert first.registry is registry
    other = PrometheusMetrics()  # its own registry: no duplicate-name error
    other.recovery("recovered")
    assert value(first, "compaction_overflow_recoveries_total", outcome="recovered") is None


def test_metrics_app_serves_the_process_metrics_over_asgi() -> None:
    registry = prometheus_client.CollectorRegistry()
    app = metrics_app(registry)
    get_metrics().prepare_done(0.001, view_tokens=5, log_tokens=50)

    async def fetch() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.get("/")

    reply = asyncio.run(fetch())
    assert reply.status_code == 200
    assert 'compaction_guard_saved_tokens_total{path="prepare"} 45.0' in reply.text


def test_publish_headers_carry_the_send_time_when_metrics_are_on() -> None:
    install_prometheus()
    headers = publish_headers()
    assert set(headers) == {SENT_AT_HEADER}
    assert isinstance(headers[SENT_AT_HEADER], float)


def test_the_core_cli_and_telemetry_load_without_prometheus_or_otel() -> None:
    result = run_isolated("""
        import importlib, json, sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("prometheus_client", "opentelemetry"):
                    raise ImportError(f"blocked: {name}")
                return None
        sys.meta_path.insert(0, Block())
        import shared, shared.telemetry, shared.enqueue, shared.guard
        import workers.cli.main, workers.app, workers.tasks, workers.cli.report
        from shared.telemetry import span, trace_headers, get_metrics
        with span("x") as s:
            s.set_attribute("a", 1)
        get_metrics().compaction("llm", "compacted")
        print(json.dumps({"headers": trace_headers()}))
    """)
    assert result == {"headers": {}}


def test_importing_the_facade_loads_no_prometheus_client() -> None:
    """(opentelemetry is not checked here: redis-py 8 imports it itself when installed.)"""
    result = run_isolated("""
        import json, sys
        import shared.telemetry, workers.app, workers.tasks, workers.cli.main
        print(json.dumps({"loaded": sorted(m for m in sys.modules
                                           if m.split(".")[0] == "prometheus_client")}))
    """)
    assert result == {"loaded": []}


def test_prometheus_is_imported_only_when_built() -> None:
    assert "prometheus_client" not in metrics_module.__dict__
