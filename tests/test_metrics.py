"""The metrics facade: NullMetrics by default, PrometheusMetrics values, optional imports."""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import shutil
import subprocess
from pathlib import Path

import httpx
import prometheus_client
import pytest
import yaml

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
    m.worker_lag(messages=1)  # a worker's unlabelled series: created on first use here
    m.sweep_done("done", 0.1)  # the sweep's series (a worker's) likewise
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


ROOT = Path(__file__).resolve().parents[1]


def test_the_dashboard_queries_only_metrics_that_exist() -> None:
    dashboard = json.loads((ROOT / "docker/grafana/dashboards/compaction.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\bcompaction_[a-z_]+", e)}
    known = {n for name in METRIC_NAMES
             for n in (name, f"{name}_bucket", f"{name}_count", f"{name}_sum")}
    assert used and used <= known, used - known
    # every metric has a panel
    assert {n for n in METRIC_NAMES if not any(n in e for e in exprs)} == set()
    datasource = yaml.safe_load(
        (ROOT / "docker/grafana/provisioning/datasources/prometheus.yml").read_text())
    uid = datasource["datasources"][0]["uid"]
    assert {p["datasource"]["uid"] for p in dashboard["panels"]} == {uid}


def test_prometheus_discovers_every_worker_replica_on_the_compose_port() -> None:
    config = yaml.safe_load((ROOT / "docker/prometheus.yml").read_text())
    [worker] = [j for j in config["scrape_configs"] if j["job_name"] == "compaction-worker"]
    assert worker["dns_sd_configs"] == [
        {"names": ["worker"], "type": "A", "port": 9808, "refresh_interval": "15s"}]
    compose = (ROOT / "docker/docker-compose.yml").read_text()
    assert "COMPACTION_METRICS_PORT: ${COMPACTION_METRICS_PORT:-9808}" in compose


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="no docker-compose")
def test_the_metrics_overlay_validates(tmp_path: Path) -> None:
    secrets_dir = tmp_path / "secrets"
    secrets_dir.mkdir()
    for name in ("redis_password", "flower_basic_auth", "summarizer_api_key"):
        (secrets_dir / name).write_text("x")
    (tmp_path / "empty.env").write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTION_")}
    done = subprocess.run(
        ["docker-compose", "--env-file", str(tmp_path / "empty.env"),
         "-f", str(ROOT / "docker/docker-compose.yml"),
         "-f", str(ROOT / "docker/docker-compose.metrics.yml"), "--profile", "metrics",
         "config"], capture_output=True, text=True, timeout=60, check=False,
        env={**env, "HOME": str(tmp_path), "COMPACTION_SECRETS_DIR": str(secrets_dir)})
    assert done.returncode == 0, done.stderr
    services = yaml.safe_load(done.stdout)["services"]
    for name in ("prometheus", "grafana"):
        service = services[name]
        assert service["cap_drop"] == ["ALL"] and service["restart"] == "unless-stopped"
        assert str(service["user"]).split(":")[0] not in ("", "0", "root")
        for port in service["ports"]:  # compose 1.x: "ip:host:container"; 2.x: a mapping
            host_ip = port["host_ip"] if isinstance(port, dict) else str(port).split(":")[0]
            assert host_ip == "127.0.0.1", port
