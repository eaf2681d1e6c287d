"""Headers the publisher adds to a task message, read back by the worker's job.

- ``traceparent`` / ``tracestate``: the trace context of the current span
  (the agent's ``record_turn``), so the job's span joins its trace;
- ``compaction_sent_at``: the publish time (Unix seconds), for the worker
  lag metric, only when this process records metrics (``set_metrics``).

Empty when neither applies: the message is then byte for byte the one
Celery's ``send_task`` writes.
"""

from __future__ import annotations

import time

from shared.telemetry.metrics import metrics_enabled
from shared.telemetry.tracing import trace_headers

SENT_AT_HEADER = "compaction_sent_at"


def publish_headers() -> dict[str, str | float]:
    """Headers for the next task message ({} when tracing and metrics are off)."""
    headers: dict[str, str | float] = dict(trace_headers())
    if metrics_enabled():
        headers[SENT_AT_HEADER] = round(time.time(), 6)
    return headers


__all__ = ["SENT_AT_HEADER", "publish_headers"]
