"""JSON logs: every line an object, with session, tenant, job and trace ids where bound."""

from __future__ import annotations

import io
import json
import logging

import pytest
import redis
from opentelemetry.sdk.trace import TracerProvider

from shared.core.config import StoreConfig
from shared.enqueue import TASK_COMPACT, publisher_app
from shared.store.sessions import SessionStore
from shared.telemetry import tracing
from shared.telemetry.logs import ContextFilter, JsonFormatter, configure_json, log_context
from workers.harness.demo_session import demo_turns
from workers.harness.stack.worker_process import WorkerProcess, purge_queue, worker_env
from workers.harness.timing import wait_for
from workers.urls import with_db


def capture() -> tuple[logging.Logger, io.StringIO]:
    stream = io.StringIO()
    logger = logging.getLogger("test.logs.json")
    logger.handlers = [configure_json(logging.StreamHandler(stream))]
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger, stream


def lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_ids_bound_in_context_are_on_every_line_and_only_there() -> None:
    logger, stream = capture()
    logger.info("before")
    with log_context(session_id="s1", tenant="acme"):
        logger.info("outer %d", 1)
        with log_context(job_id="j-9"):
            logger.warning("inner", extra={"tokens": 12})
    logger.info("after")
    before, outer, inner, after = lines(stream)
    assert before["session_id"] is None and before["message"] == "before"
    assert (outer["session_id"], outer["tenant"], outer["job_id"]) == ("s1", "acme", None)
    assert outer["message"] == "outer 1" and outer["level"] == "INFO"
    assert (inner["session_id"], inner["job_id"], inner["tokens"]) == ("s1", "j-9", 12)
    assert after["session_id"] is None
    assert str(before["ts"]).endswith("Z") and before["logger"] == "test.logs.json"


def test_trace_ids_of_the_current_span() -> None:
    logger, stream = capture()
    provider = TracerProvider()
    tracing.use_tracer_provider(provider)
    try:
        with tracing.span("work") as current:
            logger.info("in a span")
    finally:
        tracing.use_tracer_provider(None)
    [line] = lines(stream)
    context = current.get_span_context()
    assert line["trace_id"] == f"{context.trace_id:032x}"
    assert line["span_id"] == f"{context.span_id:016x}"


def test_exceptions_and_odd_extras_stay_one_json_line() -> None:
    logger, stream = capture()
    try:
        raise ValueError("bad\nvalue")
    except ValueError:
        logger.exception("failed", extra={"obj": object()})
    assert len(stream.getvalue().splitlines()) == 1
    [line] = lines(stream)
    assert "ValueError: bad" in str(line["exc_info"]) and str(line["obj"]).startswith("<object")


def test_configure_json_is_idempotent() -> None:
    handler = logging.StreamHandler(io.StringIO())
    configure_json(configure_json(handler))
    assert isinstance(handler.formatter, JsonFormatter)
    assert sum(isinstance(f, ContextFilter) for f in handler.filters) == 1


@pytest.mark.celery
@pytest.mark.slow
def test_a_real_worker_logs_json_with_the_job_ids(own_redis_url: str, key_prefix: str) -> None:
    broker, store_url = with_db(own_redis_url, 12), with_db(own_redis_url, 11)
    purge_queue(broker)
    client = redis.Redis.from_url(store_url)
    store = SessionStore(client, StoreConfig(key_prefix=key_prefix))
    for turn in demo_turns(12):
        store.append("j1", turn)
    worker = WorkerProcess("jsonlogs", worker_env(broker_url=broker, redis_url=store_url,
                                                  key_prefix=key_prefix, log_format="json"))
    worker.start()
    try:
        result = publisher_app(broker).send_task(
            TASK_COMPACT, args=["j1"], kwargs={"tenant": "default", "force": True,
                                               "keep_recent": 500}, queue="compaction")
        assert wait_for(lambda: "compaction.end" in worker.log(), 30), worker.log()[-3000:]
    finally:
        worker.stop()
        for key in client.scan_iter(match=f"{key_prefix}:*", count=1000):
            client.delete(key)
        client.close()
    records = [json.loads(line) for line in worker.log().splitlines()
               if line.startswith("{")]
    assert records and all("level" in r and "message" in r for r in records)
    [end] = [r for r in records if str(r["message"]).startswith("compaction.end")]
    assert (end["session_id"], end["tenant"], end["job_id"], end["task"]) == (
        "j1", "default", result.id, "compact")
    assert any("ready" in str(r["message"]) for r in records)  # Celery's own lines too
