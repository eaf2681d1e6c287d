"""Observability of the I/O edges: metrics, traces and structured logs.

- :mod:`shared.telemetry.metrics` — the :class:`Metrics` protocol, the
  default :class:`NullMetrics`, :class:`PrometheusMetrics` (``metrics``
  extra, imported when built), :func:`metrics_app` / :class:`MetricsEndpoint` for an
  ASGI server (the sum of all processes in prometheus_client's multiprocess mode);
- :mod:`shared.telemetry.tracing` — :func:`span`, trace-context headers for
  the task message; a no-op without the ``otel`` extra;
- :mod:`shared.telemetry.genai` — a summarizer call's GenAI span and metrics;
- :mod:`shared.telemetry.logs` — JSON log lines with session, tenant, job
  and trace ids.

Nothing here imports an optional package at import time, and the pure core
(``shared.core``) never imports this package: the guard shells and the
workers call it.
"""

from __future__ import annotations

from shared.telemetry.logs import ContextFilter, JsonFormatter, configure_json, log_context
from shared.telemetry.metrics import (
    METRIC_NAMES,
    Metrics,
    MetricsEndpoint,
    NullMetrics,
    PrometheusMetrics,
    get_metrics,
    install_prometheus,
    metrics_app,
    set_metrics,
)
from shared.telemetry.tracing import context_from, span, trace_headers

__all__ = ["METRIC_NAMES", "ContextFilter", "JsonFormatter", "Metrics", "MetricsEndpoint",
           "NullMetrics",
           "PrometheusMetrics", "configure_json", "context_from", "get_metrics",
           "install_prometheus", "log_context", "metrics_app", "set_metrics", "span",
           "trace_headers"]
