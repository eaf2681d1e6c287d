"""Every metric a dashboard panel queries is exported by a service Prometheus scrapes.

docker/prometheus.yml names its targets (compose service and port); each compose
service's command says what it is (a Celery worker, or the guard over HTTP), and
``METRIC_ROLES`` which of them records each metric. The roles are checked against
what the processes really export: here a fresh registry of each role and the HTTP
service's own /metrics; tests/test_metrics_guard.py and tests/test_metrics_worker.py
after a real guard's and a real worker's work.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from shared.core.config import StoreConfig
from shared.store.sessions import SessionStore
from shared.telemetry.metrics import (
    METRIC_NAMES,
    METRIC_ROLES,
    ROLES,
    PrometheusMetrics,
    set_metrics,
)

ROOT = Path(__file__).resolve().parents[1]
SUFFIXES = ("_bucket", "_count", "_sum", "_created")


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    set_metrics(None)
    yield
    set_metrics(None)


def metric_of(series: str) -> str:
    """The METRIC_NAMES entry a series or sample name belongs to."""
    if series in METRIC_NAMES:
        return series
    for suffix in SUFFIXES:
        base = series.removesuffix(suffix)
        if base != series and base in METRIC_NAMES:
            return base
        if base != series and f"{base}_total" in METRIC_NAMES:
            return f"{base}_total"
    raise AssertionError(f"{series} is not in METRIC_NAMES")


def dashboard_metrics() -> set[str]:
    dashboard = json.loads((ROOT / "docker/grafana/dashboards/compaction.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    return {metric_of(m) for e in exprs for m in re.findall(r"\bcompaction_[a-z_]+", e)}


def _default(value: str) -> str:
    """``${NAME:-default}`` as compose renders it with NAME unset."""
    found = re.fullmatch(r"\$\{[A-Z_]+:-([^}]*)\}", value)
    return found.group(1) if found else value


def compose_metrics_endpoints() -> dict[tuple[str, int], str]:
    """(service, port) -> the role whose metrics that service serves on that port."""
    compose = yaml.safe_load((ROOT / "docker/docker-compose.yml").read_text())
    endpoints: dict[tuple[str, int], str] = {}
    for name, service in compose["services"].items():
        command = service.get("command") or []
        words = command if isinstance(command, list) else str(command).split()
        env: dict[str, Any] = service.get("environment") or {}
        if "workers.app" in words and "worker" in words:
            port = _default(str(env["COMPACTION_METRICS_PORT"]))
            endpoints[(name, int(port))] = "worker"
        elif any(str(w).startswith("workers.server") for w in words):
            port = words[words.index("--port") + 1]
            endpoints[(name, int(port))] = "guard"
    return endpoints


def scraped_targets() -> set[tuple[str, int]]:
    config = yaml.safe_load((ROOT / "docker/prometheus.yml").read_text())
    targets: set[tuple[str, int]] = set()
    for job in config["scrape_configs"]:
        assert job.get("metrics_path", "/metrics") == "/metrics", job
        for sd in job.get("dns_sd_configs", []):
            targets |= {(name, int(sd["port"])) for name in sd["names"]}
        for static in job.get("static_configs", []):
            for target in static["targets"]:
                host, port = target.rsplit(":", 1)
                targets.add((host, int(port)))
    return targets


def test_every_dashboard_metric_is_exported_by_a_scraped_service() -> None:
    endpoints = compose_metrics_endpoints()
    assert set(endpoints.values()) == set(ROLES), endpoints  # a worker and the server
    scraped_roles = {role for target, role in endpoints.items() if target in scraped_targets()}
    unscraped = {m: sorted(METRIC_ROLES[m]) for m in dashboard_metrics()
                 if not METRIC_ROLES[m] & scraped_roles}
    assert not unscraped, f"dashboard metrics no scraped service exports: {unscraped}"


def test_the_server_is_scraped_on_its_port() -> None:
    [server] = [target for target, role in compose_metrics_endpoints().items()
                if role == "guard"]
    assert server == ("server", 8080)
    assert server in scraped_targets()


def test_every_metric_has_its_roles_and_the_docs_say_where() -> None:
    assert set(METRIC_ROLES) == set(METRIC_NAMES)
    where = {"agent": {"guard"}, "worker": {"worker"}, "both": {"guard", "worker"}}
    docs = (ROOT / "docs/observability.md").read_text()
    documented: dict[str, str] = {}
    for line in docs.splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) < 6 or not cells[1].startswith("`compaction_"):
            continue
        names = re.findall(r"`([a-z_]+)`", cells[1])
        first = names[0]
        for name in names:  # `a_input_tokens_total` / `_output_tokens_total`
            if name.startswith("_"):
                keep = first.split("_")[:-name.count("_")]
                name = "_".join(keep) + name
            documented[name] = cells[4]
    for name in METRIC_NAMES:
        assert where[documented[name]] == set(METRIC_ROLES[name]), (name, documented[name])


@pytest.mark.parametrize("role", ROLES)
def test_a_fresh_registry_exports_no_series_of_the_other_role(role: str) -> None:
    m = PrometheusMetrics(role=role)
    if role == "worker":  # a worker's /metrics reads the broker's queue (workers/metrics.py)
        m.queue_depth_source(lambda: 0.0)
    exported = {metric_of(s.name) for f in text_string_to_metric_families(
        m.exposition().decode()) for s in f.samples}
    assert {n for n in exported if role not in METRIC_ROLES[n]} == set()
    # the role's own unlabelled series are there from the start (a first increment is
    # seen by rate()), e.g. the guard's silent truncations at 0
    own = {"guard": "compaction_silent_truncation_suspected_total",
           "worker": "compaction_worker_lag_seconds"}[role]
    assert own in exported


def test_a_series_of_the_other_role_appears_when_it_is_recorded() -> None:
    worker = PrometheusMetrics(role="worker")
    worker.silent_truncation()
    assert worker.registry.get_sample_value(
        "compaction_silent_truncation_suspected_total") == 1
    guard = PrometheusMetrics()
    guard.worker_lag(messages=3)
    assert guard.registry.get_sample_value("compaction_worker_lag_messages_count") == 1
    with pytest.raises(ValueError):
        PrometheusMetrics(role="agent")


def test_the_http_service_serves_guard_series_without_a_token(key_prefix: str) -> None:
    from fastapi.testclient import TestClient

    from workers.server.app import create_app
    from workers.server.config import ServerConfig

    store = SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix=key_prefix))
    with TestClient(create_app(ServerConfig(), store, tokens={"tok": "acme"})) as client:
        reply = client.get("/metrics")
    assert reply.status_code == 200
    exported = {metric_of(s.name) for f in text_string_to_metric_families(reply.text)
                for s in f.samples}
    assert "compaction_silent_truncation_suspected_total" in exported
    assert {n for n in exported if "guard" not in METRIC_ROLES[n]} == set(), exported
