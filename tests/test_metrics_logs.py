"""The worker's metrics lines are in its log format (audit-ops 7).

The metrics server used to start at ``worker_init``, before Celery set up
logging: a taken port's error went through Python's last-resort handler (a bare
line, no level or timestamp, not JSON under ``COMPACTION_LOG_FORMAT=json``) and
the healthy worker's INFO "serving" line was dropped. It starts at
``celeryd_after_setup`` now; a real ``celery worker`` shows both lines as JSON.
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from shared.telemetry.metrics import set_metrics
from workers.harness.stack.redis_server import free_port
from workers.harness.stack.worker_process import WorkerProcess, purge_queue, worker_env
from workers.urls import with_db


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    yield
    set_metrics(None)  # start_metrics_server installs the process's metrics


def json_lines(text: str, needle: str) -> list[dict[str, Any]]:
    found = []
    for line in text.splitlines():
        if needle in line:
            assert line.startswith("{"), f"not a JSON line: {line!r}"
            found.append(json.loads(line))
    return found


@pytest.mark.celery
@pytest.mark.slow
def test_the_metrics_lines_of_a_worker_are_json(own_redis_url: str, key_prefix: str) -> None:
    broker = with_db(own_redis_url, 12)
    purge_queue(broker)
    port = free_port()
    env = worker_env(broker_url=broker, redis_url=with_db(own_redis_url, 11),
                     key_prefix=key_prefix, metrics_port=str(port), log_format="json")
    healthy = WorkerProcess("metrics-json", env, concurrency=1).start()
    try:
        # a second worker on the same host and port: no /metrics, and it says so as JSON
        clash = WorkerProcess("metrics-clash", env, concurrency=1).start()
        clash.stop()
    finally:
        healthy.stop()
    [serving] = json_lines(healthy.log(), "serving /metrics")
    assert serving["level"] == "INFO" and serving["logger"] == "compaction.metrics"
    assert f"port {port}" in serving["message"] and serving["ts"]
    [refused] = json_lines(clash.log(), "cannot serve on port")
    assert refused["level"] == "ERROR" and refused["logger"] == "compaction.metrics"
    assert f"port {port}" in refused["message"] and refused["ts"]


def test_a_broker_without_a_queue_depth_is_warned_about(
        caplog: pytest.LogCaptureFixture) -> None:
    """An amqp:// broker (or a failover list) has no queue depth: one warning at start,
    naming the scheme only (no host, no password)."""
    from workers import metrics as worker_metrics

    with socket.socket() as taken:  # no server is started: the port is in use
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for url, kind in (("amqp://user:s3cret@rabbit:5672//", "amqp://"),
                          ("redis://a:6379/1;redis://b:6379/1", "failover list")):
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="compaction.metrics"):
                assert worker_metrics.start_metrics_server(port, broker_url=url) is None
            [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
            assert "compaction_queue_depth" in warning.getMessage()
            assert kind in warning.getMessage() and "s3cret" not in warning.getMessage()
            assert "rabbit" not in warning.getMessage()
    caplog.clear()
    with socket.socket() as taken, caplog.at_level(logging.WARNING, "compaction.metrics"):
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        worker_metrics.start_metrics_server(taken.getsockname()[1],
                                            broker_url="redis://127.0.0.1:1/1")
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]
