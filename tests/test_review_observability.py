"""Observability reviewed as an operator wiring it into production: the metrics table of
docs/observability.md against what a registry exports, label cardinality over a scripted
session, error spans and unended spans when a call raises, and the JSON log lines of jobs
run one after the other on one thread."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from shared.core.config import StoreConfig
from shared.core.errors import StoreUnavailable, SummarizerUnavailable
from shared.enqueue import CallbackEnqueuer, NullEnqueuer
from shared.store.sessions import SessionStore, connect
from shared.telemetry import tracing
from shared.telemetry.genai import model_call
from shared.telemetry.logs import configure_json
from shared.telemetry.metrics import METRIC_NAMES, PrometheusMetrics, set_metrics
from tests.guard_shells import SHELLS, make
from workers.harness.demo_session import SYSTEM_PROMPT, TOOLS, demo_turns
from workers.metrics import observed

DOC = Path(__file__).resolve().parents[1] / "docs" / "observability.md"
TYPES = {"counter": "counter", "histogram": "histogram", "gauge": "gauge"}


class Open(SpanProcessor):
    """Spans started and not (yet) ended: a span a raising call leaves open leaks."""

    def __init__(self) -> None:
        self.open: dict[int, str] = {}

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        self.open[span.context.span_id] = span.name

    def on_end(self, span: ReadableSpan) -> None:
        assert span.context is not None
        self.open.pop(span.context.span_id, None)


@pytest.fixture
def traced() -> Iterator[tuple[InMemorySpanExporter, Open]]:
    exported, still_open = InMemorySpanExporter(), Open()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    provider.add_span_processor(still_open)
    tracing.use_tracer_provider(provider)
    yield exported, still_open
    tracing.use_tracer_provider(None)
    provider.shutdown()


@pytest.fixture
def metrics() -> Iterator[PrometheusMetrics]:
    m = PrometheusMetrics(role="worker")
    set_metrics(m)
    yield m
    set_metrics(None)


# ------------------------------------------------------------------ metrics vs the docs

def _documented() -> dict[str, tuple[str, set[str]]]:
    """``{name: (type, labels)}`` from the metrics table of docs/observability.md."""
    found: dict[str, tuple[str, set[str]]] = {}
    for line in DOC.read_text().splitlines():
        if not line.startswith("| `compaction_"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        names, kind, labels = cells[0], cells[1], cells[2]
        depth, flat = 0, ""
        for ch in labels:  # the label names, without the values in parentheses
            depth += ch == "("
            flat += ch if depth == 0 else ""
            depth -= ch == ")"
        label_set = set(re.findall(r"`([a-z_]+)`", flat))
        first, *more = re.findall(r"`([a-z_]+)`", names)
        found[first] = (kind, label_set)
        for suffix in more:  # "`..._input_tokens_total` / `_output_tokens_total`"
            base = first.rsplit("_", 3)[0] if suffix.startswith("_") else ""
            found[base + suffix if base else suffix] = (kind, label_set)
    return found


def _exported(m: PrometheusMetrics) -> dict[str, tuple[str, set[str]]]:
    m.prepare_done(0.001, view_tokens=10, log_tokens=20)
    m.compaction("cheap", "recorded")
    m.recovery("recovered")
    m.enqueue("published")
    m.silent_truncation()
    m.job_done("maybe_summarize", "compacted", 0.5)
    m.worker_lag(messages=3, seconds=0.2)
    m.summarizer_call("openai", "gpt-4o-mini", 0.3, input_tokens=5, output_tokens=2,
                      error="timeout")
    m.lease_contention("busy")
    m.queue_depth_source(lambda: 2.0)
    m.sweep_done("done", 0.01)
    m.sweep_flags(seen=1, stale=1, republished=1, failed=1)
    out: dict[str, tuple[str, set[str]]] = {}
    for family in m.registry.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        labels = {k for s in family.samples for k in s.labels if k != "le"}
        out[name] = (family.type, labels)
    return out


def test_every_documented_metric_is_exported_with_its_type_and_labels() -> None:
    documented, exported = _documented(), _exported(PrometheusMetrics(role="worker"))
    assert set(documented) == set(exported) == set(METRIC_NAMES)
    for name, (kind, labels) in documented.items():
        assert exported[name] == (TYPES[kind], labels), name


def test_no_label_carries_a_session_id_or_a_tenant(fake_redis: object, key_prefix: str,
                                                   shell: str) -> None:
    m = PrometheusMetrics()
    set_metrics(m)
    try:
        store = SessionStore(fake_redis, StoreConfig(key_prefix=key_prefix))
        sessions = [f"sess-{i}" for i in range(6)]
        for i, sid in enumerate(sessions):
            tenant = f"tenant-{i % 3}"
            guard = make(shell, SessionStore(fake_redis, store.config, tenant=tenant),
                         CallbackEnqueuer(lambda *_: None), overrides={"gpt-4o": 16_000})
            for turn in demo_turns(8):
                guard.prepare(sid, SYSTEM_PROMPT, TOOLS, 2000, "gpt-4o", pending=turn[:1])
                guard.record_turn(sid, turn)
            guard.recover(sid, "maximum context length is 16000 tokens", SYSTEM_PROMPT, TOOLS,
                          2000, "gpt-4o", pending=[])
        values = {v for f in m.registry.collect() for s in f.samples for v in s.labels.values()}
        series = sum(len(f.samples) for f in m.registry.collect())
    finally:
        set_metrics(None)
    assert not values & {*sessions, "tenant-0", "tenant-1", "tenant-2"}, values
    assert series < 200  # bounded: six sessions of three tenants add no series of their own


@pytest.fixture(params=SHELLS)
def shell(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# ------------------------------------------------------------------ spans when a call raises

def test_a_guard_call_that_raises_ends_its_span_as_an_error(
        traced: tuple[InMemorySpanExporter, Open], shell: str) -> None:
    exported, still_open = traced
    cfg = StoreConfig(socket_timeout=0.2, connect_timeout=0.2)  # Redis is down
    guard = make(shell, SessionStore(connect("redis://127.0.0.1:1/0", cfg), cfg),
                 NullEnqueuer(), overrides={"gpt-4o": 16_000})
    turn = demo_turns(1)[0]
    with pytest.raises(StoreUnavailable):
        guard.prepare("down", SYSTEM_PROMPT, TOOLS, 2000, "gpt-4o", pending=turn[:1])
    with pytest.raises(StoreUnavailable):
        guard.record_turn("down", turn)
    assert still_open.open == {}
    spans = {s.name: s for s in exported.get_finished_spans()}
    for name in ("compaction.prepare", "compaction.record_turn"):
        failed = spans[name]
        assert failed.status.status_code == StatusCode.ERROR, name
        assert dict(failed.attributes or {}).get("error.type") == "StoreUnavailable", name
        assert [e.name for e in failed.events] == ["exception"], name


def test_guard_spans_name_the_tenant_as_well_as_the_session(
        traced: tuple[InMemorySpanExporter, Open], shell: str, fake_redis: object,
        key_prefix: str) -> None:
    """Session ids are per tenant: two tenants' session "s" were one in traces."""
    exported, _ = traced
    turn = demo_turns(1)[0]
    for tenant in ("acme", "globex"):
        store = SessionStore(fake_redis, StoreConfig(key_prefix=key_prefix), tenant=tenant)
        guard = make(shell, store, NullEnqueuer(), overrides={"gpt-4o": 16_000})
        guard.prepare("s", SYSTEM_PROMPT, TOOLS, 2000, "gpt-4o", pending=turn[:1])
        guard.record_turn("s", turn)
        error = {"error": {"code": "context_length_exceeded",
                           "message": "maximum context length is 16000 tokens"}}
        guard.recover("s", error, SYSTEM_PROMPT, TOOLS, 2000, "gpt-4o", pending=turn[:1])
    named = sorted((s.name, dict(s.attributes or {}).get("compaction.tenant"))
                   for s in exported.get_finished_spans())
    assert named == sorted((name, tenant) for tenant in ("acme", "globex") for name in (
        "compaction.prepare", "compaction.record_turn", "compaction.recover"))


def _task(job_id: str) -> Any:
    request = SimpleNamespace(id=job_id, retries=0, headers={}, delivery_info={
        "routing_key": "compaction"})
    return SimpleNamespace(name="workers.tasks.maybe_summarize", request=request)


def test_a_job_that_raises_ends_its_consumer_span_as_an_error(
        traced: tuple[InMemorySpanExporter, Open], metrics: PrometheusMetrics) -> None:
    exported, still_open = traced

    def down() -> dict[str, Any]:
        raise StoreUnavailable("Redis did not answer")

    def busy_provider() -> dict[str, Any]:
        error = SummarizerUnavailable("429 Too Many Requests")
        error.error_class = "rate_limited"  # type: ignore[attr-defined]
        with model_call("openai", "gpt-4o-mini", 500):
            raise error

    with pytest.raises(StoreUnavailable):
        observed(_task("job-1"), "s1", "acme", down)
    with pytest.raises(SummarizerUnavailable):
        observed(_task("job-2"), "s2", "acme", busy_provider)
    assert still_open.open == {}
    jobs = [s for s in exported.get_finished_spans() if s.name == "compaction.maybe_summarize"]
    assert [dict(s.attributes or {})["messaging.message.id"] for s in jobs] == ["job-1", "job-2"]
    for job, kind in zip(jobs, ("StoreUnavailable", "SummarizerUnavailable"), strict=True):
        assert job.kind == SpanKind.CONSUMER
        assert job.status.status_code == StatusCode.ERROR
        attrs = dict(job.attributes or {})
        assert attrs["error.type"] == kind and attrs["compaction.tenant"] == "acme"
    [chat] = [s for s in exported.get_finished_spans() if s.name == "chat gpt-4o-mini"]
    assert chat.status.status_code == StatusCode.ERROR and chat.kind == SpanKind.CLIENT
    assert dict(chat.attributes or {})["error.type"] == "rate_limited"  # the bounded class
    assert chat.parent is not None and chat.parent.span_id == jobs[1].context.span_id
    assert metrics.registry.get_sample_value(
        "compaction_jobs_total", {"task": "maybe_summarize", "outcome": "error"}) == 1
    assert metrics.registry.get_sample_value(
        "compaction_jobs_total", {"task": "maybe_summarize", "outcome": "retry"}) == 1
    assert metrics.registry.get_sample_value(
        "compaction_summarizer_errors_total", {"provider": "openai", "error": "rate_limited"}) == 1


# ------------------------------------------------------------------ JSON logs

@pytest.fixture
def json_lines() -> Iterator[io.StringIO]:
    out = io.StringIO()
    handler = configure_json(logging.StreamHandler(out))
    logger = logging.getLogger("compaction.review")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield out
    logger.removeHandler(handler)


def _lines(out: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_jobs_on_one_thread_log_their_own_ids_and_nothing_after(
        json_lines: io.StringIO, traced: tuple[InMemorySpanExporter, Open]) -> None:
    log = logging.getLogger("compaction.review")

    def first() -> dict[str, Any]:
        log.info("first job")
        try:
            raise ValueError("line one\nline two")
        except ValueError:
            log.exception("it failed")
        raise StoreUnavailable("down")

    def second() -> dict[str, Any]:
        log.info("second job", extra={"watermark": 4})
        return {"status": "skipped"}

    with pytest.raises(StoreUnavailable):
        observed(_task("job-a"), "sess-a", "tenant-a", first)
    log.info("between jobs")
    observed(_task("job-b"), "sess-b", "tenant-b", second)
    log.warning("after the jobs", stack_info=True)
    lines = _lines(json_lines)
    assert [line["message"] for line in lines] == [
        "first job", "it failed", "between jobs", "second job", "after the jobs"]
    a, failed, between, b, after = lines
    assert (a["session_id"], a["tenant"], a["job_id"], a["task"]) == (
        "sess-a", "tenant-a", "job-a", "maybe_summarize")
    assert failed["job_id"] == "job-a" and "ValueError: line one\nline two" in failed["exc_info"]
    assert "Traceback" in failed["exc_info"]
    assert (b["session_id"], b["tenant"], b["job_id"], b["watermark"]) == (
        "sess-b", "tenant-b", "job-b", 4)
    assert a["trace_id"] and b["trace_id"] and a["trace_id"] != b["trace_id"]
    for line in (between, after):
        assert all(line[k] is None for k in ("session_id", "tenant", "job_id", "task",
                                             "trace_id", "span_id")), line
    assert "test_jobs_on_one_thread_log_their_own_ids" in after["stack_info"]
    assert set(a) >= {"ts", "level", "logger", "message"}


@pytest.mark.celery
@pytest.mark.slow
def test_a_real_worker_writes_each_jobs_lines_with_its_own_ids(own_redis_url: str,
                                                                key_prefix: str) -> None:
    """Three jobs in turn on one worker thread (two tenants, one failing): every log line
    is one JSON object, and Celery's own line about each job's end (success, or failure
    with its traceback) carries that job's ids, and no other job's."""
    import redis

    from shared.enqueue import TASK_COMPACT, TASK_MAYBE_SUMMARIZE, publisher_app
    from workers.harness.stack.worker_process import WorkerProcess, purge_queue, worker_env
    from workers.harness.timing import wait_for
    from workers.urls import with_db

    broker, store_url = with_db(own_redis_url, 12), with_db(own_redis_url, 11)
    purge_queue(broker)
    client = redis.Redis.from_url(store_url)
    operator = SessionStore(client, StoreConfig(key_prefix=key_prefix))
    for turn in demo_turns(12):
        operator.for_tenant("alpha").append("s1", turn)
        operator.for_tenant("beta").append("s2", turn)
    worker = WorkerProcess("reviewlogs", worker_env(
        broker_url=broker, redis_url=store_url, key_prefix=key_prefix, log_format="json"),
        concurrency=1)
    worker.start()
    try:
        app = publisher_app(broker)
        force = {"force": True, "keep_recent": 500}
        first = app.send_task(TASK_COMPACT, args=["s1"], kwargs={"tenant": "alpha", **force},
                              queue="compaction")
        failing = app.send_task(TASK_MAYBE_SUMMARIZE, args=["bad id!"],
                                kwargs={"tenant": "beta"}, queue="compaction")
        last = app.send_task(TASK_COMPACT, args=["s2"], kwargs={"tenant": "beta", **force},
                             queue="compaction")
        assert wait_for(lambda: worker.log().count(" succeeded in ") >= 2
                        and f"{failing.id}] raised" in worker.log(), 40), worker.log()[-3000:]
    finally:
        worker.stop()
        for key in client.scan_iter(match=f"{key_prefix}:*", count=1000):
            client.delete(key)
        client.close()
    text = worker.log()
    body = text[text.index('{"ts"'):]  # after Celery's banner (printed, not logged)
    records = []
    for line in body.splitlines():
        if line.strip() and not line.startswith("worker: Warm shutdown"):  # printed too
            records.append(json.loads(line))  # one object a line: no traceback lines
    ends = {r["job_id"]: r for r in records if r["logger"] == "celery.app.trace"}
    assert (ends[first.id]["session_id"], ends[first.id]["tenant"]) == ("s1", "alpha")
    assert (ends[last.id]["session_id"], ends[last.id]["tenant"]) == ("s2", "beta")
    failed = ends[failing.id]
    assert (failed["level"], failed["session_id"], failed["tenant"], failed["task"]) == (
        "ERROR", "bad id!", "beta", "maybe_summarize")
    assert "Traceback" in failed["exc_info"] and "InvalidInput" in failed["exc_info"]
    for record in records:
        if record["logger"] == "celery.app.trace":  # a job's end: that job's ids
            assert f"[{record['job_id']}]" in record["message"], record
        if record["logger"] == "celery.worker.strategy":  # "received": the consumer's
            assert record["job_id"] is None, record


@pytest.mark.parametrize("path", ["inline", "lean", "send_task"])
def test_every_publish_path_carries_the_guards_trace(
        redis_url: str, key_prefix: str, traced: tuple[InMemorySpanExporter, Open],
        shell: str, path: str) -> None:
    """The job a turn asks for, as the broker holds it, names the span of the guard call
    that asked (the append script's inline push, the lean publisher, ``send_task``), on
    both shells; so does the one a truncation in ``prepare`` asks for."""
    import base64
    import secrets

    import redis

    from shared.enqueue import CeleryEnqueuer, publisher_app

    exported, still_open = traced
    queue = "tq" + secrets.token_hex(5)
    client = redis.Redis.from_url(redis_url)
    store = SessionStore(client, StoreConfig(key_prefix=key_prefix))
    enqueuer = CeleryEnqueuer(publisher_app(redis_url), queue=queue, lean=path != "send_task")
    guard = make(shell, store, enqueuer, overrides={"gpt-4o": 8_000})
    if path == "lean":  # as for a broker on another server: the guard publishes itself
        getattr(guard, "inner", guard).server = None
    published: list[str] = []  # jobs the guard published itself (not the append script)
    publish = enqueuer.enqueue
    enqueuer.enqueue = lambda tenant, sid: (published.append(sid), publish(tenant, sid))[1]
    try:
        turns = demo_turns(30)
        asked: list[str] = []
        for i, turn in enumerate(turns):
            guard.prepare("c1", SYSTEM_PROMPT, TOOLS, 2000, "gpt-4o", pending=turn[:1])
            guard.record_turn("c1", turn)
            if client.llen(queue) > len(asked):  # a job was asked for in this turn
                asked.append(json.loads(client.lindex(queue, 0))["headers"]["traceparent"])
                store.clear_pending("c1")  # so that the next one is asked for again
            if len(asked) >= 2 and i > 20:
                break
        assert asked, "no job was published"
        assert len(published) == (0 if path == "inline" else len(asked)), published
        finished = {s.context.span_id: s for s in exported.get_finished_spans()}
        for parent in asked:
            _, trace_id, span_id, _ = parent.split("-")
            span = finished[int(span_id, 16)]
            assert span.context.trace_id == int(trace_id, 16)
            assert span.name in ("compaction.record_turn", "compaction.prepare"), span.name
        message = json.loads(client.lindex(queue, 0))
        body = json.loads(base64.b64decode(message["body"]))
        assert body[0] == ["c1"] and body[1]["tenant"] == "default"
        assert still_open.open == {}
    finally:
        client.delete(queue)
        client.close()


RECORDER = """
import sys
from shared.telemetry.metrics import PrometheusMetrics
role, jobs, tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
m = PrometheusMetrics(role=role)
for _ in range(jobs):
    if role == "worker":
        m.job_done("maybe_summarize", "compacted", 0.5)
        m.compaction("llm", "compacted")
        m.summarizer_call("openai", "gpt-4o-mini", 1.0, input_tokens=tokens, output_tokens=7)
        m.worker_lag(messages=30, seconds=2.0)
        m.sweep_flags(seen=2, stale=1, republished=1, failed=0)
    else:
        m.prepare_done(0.001, view_tokens=tokens, log_tokens=3 * tokens)
        m.compaction("truncation", "compacted")
        m.silent_truncation()
"""


def test_multiprocess_mode_sums_every_process(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Three processes (two workers, one guard) record into one directory; what a
    /metrics endpoint serves is the sum of all of them, series by series."""
    import os
    import subprocess
    import sys

    from shared.telemetry.metrics import served_registry

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
           "PYTHONPATH": str(root)}
    for role, jobs, tokens in (("worker", 3, 100), ("worker", 5, 40), ("guard", 4, 250)):
        subprocess.run([sys.executable, "-c", RECORDER, role, str(jobs), str(tokens)],
                       env=env, cwd=root, check=True, timeout=60)
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    registry = served_registry()

    def value(name: str, **labels: str) -> float | None:
        found: float | None = registry.get_sample_value(name, labels)
        return found

    assert value("compaction_jobs_total", task="maybe_summarize", outcome="compacted") == 8
    assert value("compaction_job_duration_seconds_count", task="maybe_summarize") == 8
    assert value("compaction_job_duration_seconds_sum", task="maybe_summarize") == 4.0
    assert value("compaction_compactions_total", kind="llm", outcome="compacted") == 8
    assert value("compaction_compactions_total", kind="truncation", outcome="compacted") == 4
    assert value("compaction_summarizer_calls_total", provider="openai",
                 model="gpt-4o-mini") == 8
    assert value("compaction_summarizer_input_tokens_total", provider="openai",
                 model="gpt-4o-mini") == 3 * 100 + 5 * 40
    assert value("compaction_summarizer_output_tokens_total", provider="openai",
                 model="gpt-4o-mini") == 8 * 7
    assert value("compaction_worker_lag_messages_count") == 8
    assert value("compaction_worker_lag_seconds_bucket", le="5.0") == 8
    assert value("compaction_sweep_pending_flags_total") == 16
    assert value("compaction_sweep_republished_total") == 8
    assert value("compaction_sweep_publish_failures_total") == 0
    assert value("compaction_guard_prepare_duration_seconds_count", path="prepare") == 4
    assert value("compaction_guard_view_tokens_total", path="prepare") == 1000
    assert value("compaction_guard_saved_tokens_total", path="prepare") == 2000
    assert value("compaction_silent_truncation_suspected_total") == 4


def test_a_cancelled_async_guard_call_ends_its_span(
        pausable_redis: Any, traced: tuple[InMemorySpanExporter, Open]) -> None:
    """A caller's timeout cancels ``prepare`` while Redis hangs: the span ends anyway (a
    cancellation is no error: status unset), and nothing stays attached to the loop."""
    import asyncio
    import os
    import signal

    import redis.asyncio

    from shared.guard import AsyncContextGuard
    from shared.store.aio import AsyncSessionStore
    from shared.telemetry.tracing import current_ids

    exported, still_open = traced
    cfg = StoreConfig(socket_timeout=30, connect_timeout=30)
    client = redis.asyncio.Redis.from_url(pausable_redis.url, socket_timeout=30)
    guard = AsyncContextGuard(AsyncSessionStore(client, cfg), NullEnqueuer(),
                              overrides={"gpt-4o": 16_000})
    turn = demo_turns(1)[0]

    async def run() -> None:
        await guard.record_turn("c1", turn)  # connected, scripts loaded
        os.kill(pausable_redis.process.pid, signal.SIGSTOP)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(guard.prepare(
                "c1", SYSTEM_PROMPT, TOOLS, 2000, "gpt-4o", pending=turn[:1]), 0.5)
        assert current_ids() is None  # no span of the cancelled call is current

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(run())
    finally:
        os.kill(pausable_redis.process.pid, signal.SIGCONT)
        loop.run_until_complete(guard.aclose())
        loop.run_until_complete(client.aclose())
        loop.close()
    assert still_open.open == {}
    [prepare] = [s for s in exported.get_finished_spans() if s.name == "compaction.prepare"]
    assert prepare.status.status_code == StatusCode.UNSET


def test_the_lease_renewal_threads_lines_carry_the_jobs_ids(json_lines: io.StringIO) -> None:
    """A job's lease renewal runs on a thread of its own; its "lease lost" / "renewal
    failed" lines are the job's (the session id alone does not say whose tenant)."""
    import time

    from shared.store import lease
    from shared.telemetry.logs import log_context

    class Down:
        def extend_lease(self, session_id: str, token: str, ttl: float) -> bool:
            raise StoreUnavailable("Redis did not answer")

    handler = logging.getLogger("compaction.review").handlers[-1]
    lease.log.addHandler(handler)
    try:
        with log_context(session_id="s", tenant="acme", job_id="job-r", task="compact"), \
                lease.Renewal(Down(), "s", "token", 0.06, time.monotonic() + 5):  # type: ignore[arg-type]
            deadline = time.monotonic() + 5  # the thread's first try, however loaded the host
            while time.monotonic() < deadline and "renewal of s failed" not in \
                    json_lines.getvalue():
                time.sleep(0.01)
    finally:
        lease.log.removeHandler(handler)
    [first, *_] = [r for r in _lines(json_lines) if "lease renewal of s failed" in r["message"]]
    assert (first["tenant"], first["job_id"]) == ("acme", "job-r"), first
