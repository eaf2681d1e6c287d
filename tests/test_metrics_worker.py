"""A real ``celery -A workers.app worker`` serves /metrics; after real jobs the values add up.

The worker runs with ``COMPACTION_METRICS_PORT`` on a free port and an
OpenAI-compatible fake summarizer (so the summarizer's token counters move);
the agent side is a real guard publishing through the lean publisher with
metrics on (so messages carry their publish time and the worker measures
its lag in seconds). The scrape is compared with what the store holds.
"""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from shared.core.config import StoreConfig
from shared.enqueue import TASK_COMPACT, CeleryEnqueuer, publisher_app
from shared.guard import ContextGuard
from shared.store.sessions import SessionStore
from shared.telemetry.metrics import METRIC_NAMES, METRIC_ROLES, PrometheusMetrics, set_metrics
from workers.harness.demo_session import SYSTEM_PROMPT, TOOLS, demo_turns
from workers.harness.fakes.openai_server import FakeOpenAIServer
from workers.harness.fakes.summaries import SummarizerResponder
from workers.harness.stack.redis_server import free_port
from workers.harness.stack.worker_process import WorkerProcess, purge_queue, worker_env
from workers.harness.timing import wait_for
from workers.metrics import MULTIPROC_ENV
from workers.urls import with_db

pytestmark = [pytest.mark.celery, pytest.mark.slow]


def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Samples by name: [(labels, value)] from the worker's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return samples


def total(samples: dict[str, list[tuple[dict[str, str], float]]], name: str,
          **labels: str) -> float:
    return sum(value for found, value in samples.get(name, [])
               if all(found.get(k) == v for k, v in labels.items()))


def test_a_real_worker_serves_metrics_that_match_the_store(own_redis_url: str,
                                                           key_prefix: str) -> None:
    broker, store_url = with_db(own_redis_url, 12), with_db(own_redis_url, 11)
    purge_queue(broker)
    port = free_port()
    client = redis.Redis.from_url(store_url)
    store = SessionStore(client, StoreConfig(key_prefix=key_prefix))
    set_metrics(PrometheusMetrics())  # the agent side: messages carry their publish time
    with FakeOpenAIServer(responder=SummarizerResponder()) as llm:
        env = worker_env(broker_url=broker, redis_url=store_url, key_prefix=key_prefix,
                         metrics_port=str(port), summarizer="openai",
                         summarizer_base_url=llm.base_url, summarizer_api_key="k",
                         summarizer_model="gpt-4o-mini")
        # One slot: no two jobs at once, so every job's outcome is its own.
        worker = WorkerProcess("metrics", env, concurrency=1).start()
        try:
            _run_session(store, broker)
            assert wait_for(lambda: not store.is_pending("m1"), 30), worker.log()[-3000:]
            assert wait_for(lambda: _settled(scrape(port)), 30), worker.log()[-3000:]
            samples = scrape(port)
            _check(samples, store, llm, port)
        finally:
            worker.stop()
            set_metrics(None)
            for key in client.scan_iter(match=f"{key_prefix}:*", count=1000):
                client.delete(key)
            purge_queue(broker)
            client.close()


def _run_session(store: SessionStore, broker: str) -> None:
    guard = ContextGuard(store, CeleryEnqueuer(publisher_app(broker)),
                         overrides={"gpt-4o": 24_000})
    for turn in demo_turns(30):
        guard.prepare("m1", SYSTEM_PROMPT, TOOLS, 2000, "gpt-4o", pending=turn[:1])
        guard.record_turn("m1", turn)
        time.sleep(0.05)


def _settled(samples: dict[str, list[tuple[dict[str, str], float]]]) -> bool:
    """Jobs ran, none is queued, and every job that started has ended."""
    return (total(samples, "compaction_jobs_total") >= 1
            and total(samples, "compaction_queue_depth") == 0
            and total(samples, "compaction_worker_lag_seconds_count")
            == total(samples, "compaction_jobs_total"))


def _check(samples: dict[str, list[tuple[dict[str, str], float]]], store: SessionStore,
           llm: FakeOpenAIServer, port: int) -> None:
    summaries = store.summaries("m1")
    by_worker = [s for s in summaries if s.kind in ("llm", "offline")]
    assert by_worker, "the session was compacted by the worker"
    jobs = total(samples, "compaction_jobs_total")
    assert jobs >= 1
    assert total(samples, "compaction_job_duration_seconds_count") == jobs
    # Every summary the worker wrote is one compaction counted as compacted, by kind.
    for kind in ("llm", "offline"):
        assert total(samples, "compaction_compactions_total", kind=kind,
                     outcome="compacted") == sum(1 for s in by_worker if s.kind == kind)
    assert total(samples, "compaction_jobs_total", task="maybe_summarize",
                 outcome="compacted") >= 1
    # The summarizer's reported usage, summed, is what the stored LLM summaries cost.
    llm_summaries = [s for s in by_worker if s.kind == "llm"]
    assert llm_summaries
    labels = {"provider": "openai"}
    assert total(samples, "compaction_summarizer_input_tokens_total", **labels) == sum(
        s.input_tokens for s in llm_summaries)
    assert total(samples, "compaction_summarizer_output_tokens_total", **labels) == sum(
        s.output_tokens for s in llm_summaries)
    assert total(samples, "compaction_summarizer_calls_total", **labels) == len(llm.requests)
    # Lag: every job saw its messages since the watermark and its publish time.
    assert total(samples, "compaction_worker_lag_messages_count") == jobs - total(
        samples, "compaction_jobs_total", outcome="busy")
    assert total(samples, "compaction_worker_lag_seconds_count") == jobs
    assert 0 <= total(samples, "compaction_worker_lag_seconds_sum") < 60 * jobs
    assert samples["compaction_queue_depth"] == [({}, 0.0)]
    # Every name a worker records is declared with its type and help, whether it has
    # samples yet or not; no series of a metric only the guard records (a flat 0 that
    # nobody measures: tests/test_observability_targets.py).
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    for name in METRIC_NAMES:
        if "worker" in METRIC_ROLES[name]:
            assert f"# HELP {name}" in text or f"# HELP {name.removesuffix('_total')}" in text, \
                name
    guard_only = [n for n in METRIC_NAMES if "worker" not in METRIC_ROLES[n]]
    assert [s for s in samples if any(s.startswith(n.removesuffix("_total"))
                                      for n in guard_only)] == []


def test_prefork_children_report_through_the_multiprocess_directory(
        own_redis_url: str, key_prefix: str, tmp_path: Path) -> None:
    """Jobs run in pool children; the main process serves what they all counted."""
    broker, store_url = with_db(own_redis_url, 12), with_db(own_redis_url, 11)
    purge_queue(broker)
    port = free_port()
    client = redis.Redis.from_url(store_url)
    store = SessionStore(client, StoreConfig(key_prefix=key_prefix))
    sessions = [f"p{i}" for i in range(4)]
    for sid in sessions:
        for turn in demo_turns(10):
            store.append(sid, turn)
    env = {**worker_env(broker_url=broker, redis_url=store_url, key_prefix=key_prefix,
                        metrics_port=str(port)), MULTIPROC_ENV: str(tmp_path)}
    worker = WorkerProcess("prefork", env, pool="prefork", concurrency=2).start()
    try:
        app = publisher_app(broker)
        for sid in sessions:
            app.send_task(TASK_COMPACT, args=[sid], kwargs={"tenant": "default",
                                                            "force": True, "keep_recent": 500},
                          queue="compaction")
        assert wait_for(lambda: total(scrape(port), "compaction_jobs_total") == 4, 40), \
            worker.log()[-3000:]
        samples = scrape(port)
        assert total(samples, "compaction_compactions_total", kind="offline",
                     outcome="compacted") == sum(
            1 for sid in sessions for s in store.summaries(sid) if s.kind == "offline") == 4
        assert total(samples, "compaction_job_duration_seconds_count", task="compact") == 4
        # the recall index jobs the compactions queued (lowest priority) drain after them
        assert wait_for(lambda: total(scrape(port), "compaction_queue_depth") == 0, 40), \
            worker.log()[-3000:]
        assert len(list(tmp_path.glob("*.db"))) >= 1  # the children's files
    finally:
        worker.stop()
        for key in client.scan_iter(match=f"{key_prefix}:*", count=1000):
            client.delete(key)
        purge_queue(broker)
        client.close()


def test_prefork_without_the_directory_serves_nothing_and_says_why(
        own_redis_url: str, key_prefix: str) -> None:
    port = free_port()
    env = worker_env(broker_url=with_db(own_redis_url, 12), redis_url=with_db(own_redis_url, 11),
                     key_prefix=key_prefix, metrics_port=str(port))
    env.pop(MULTIPROC_ENV, None)
    worker = WorkerProcess("prefork-nodir", env, pool="prefork", concurrency=1).start()
    try:
        assert MULTIPROC_ENV in worker.log()
        with pytest.raises(OSError):
            scrape(port)
    finally:
        worker.stop()


def test_queue_depth_counts_the_queues_the_worker_consumes(own_redis_url: str,
                                                          key_prefix: str) -> None:
    """A worker started with ``-Q <queue>`` reports that queue's waiting jobs, every
    priority's list included (the recall index job rides priority 9)."""
    from celery import Celery

    from workers.metrics import consumed_queues, queue_depth_reader, start_metrics_server
    from workers.settings import load_settings

    broker = with_db(own_redis_url, 12)
    queue = "q" + key_prefix
    app = Celery("depth", broker=broker, set_as_current=False)
    app.conf.compaction_settings = load_settings(broker_url=broker)  # no metrics port
    worker = app.WorkController(queues=[queue], pool_cls="solo", without_mingle=True,
                                without_gossip=True)  # what `celery worker -Q` selects
    assert consumed_queues(worker) == [queue]
    publisher = publisher_app(broker)
    for i in range(3):
        CeleryEnqueuer(publisher, queue=queue).enqueue("default", f"qd{i}")
    publisher.send_task(TASK_COMPACT, args=["qd9"], queue=queue, priority=9)
    client = redis.Redis.from_url(broker)
    try:
        read = queue_depth_reader(broker, consumed_queues(worker))
        assert read is not None and read() == 4.0
        port = free_port()
        start_metrics_server(port, multiprocess=False, broker_url=broker,
                             queues=consumed_queues(worker))
        assert scrape(port)["compaction_queue_depth"] == [({}, 4.0)]
    finally:
        from celery.result import _set_task_join_will_block

        from workers import metrics as worker_metrics

        _set_task_join_will_block(False)  # the pool's setting, as celery.contrib.testing does

        if worker_metrics._server is not None:
            worker_metrics._server[0].shutdown()
        set_metrics(None)
        client.delete(queue, *[f"{queue}\x06\x16{p}" for p in (3, 6, 9)])
        client.close()


def test_the_job_span_names_the_queue_the_job_came_from(redis_url: str, key_prefix: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from shared.telemetry import tracing
    from workers.app import app
    from workers.settings import load_settings
    from workers.tasks import maybe_summarize

    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    tracing.use_tracer_provider(provider)
    client = redis.Redis.from_url(redis_url)
    store = SessionStore(client, StoreConfig(key_prefix=key_prefix))
    store.append("d1", [{"role": "user", "content": "hi"}])
    monkeypatch.setitem(app.conf, "compaction_settings",
                        load_settings(redis_url=redis_url, key_prefix=key_prefix))
    try:
        maybe_summarize.apply(args=["d1"], routing_key="custom-q", exchange="").get()
        maybe_summarize.apply(args=["d1"]).get()  # eager, no delivery: the default queue
        names = [s.attributes.get("messaging.destination.name")
                 for s in exported.get_finished_spans()
                 if s.name == "compaction.maybe_summarize" and s.attributes is not None]
        assert names == ["custom-q", "compaction"]
    finally:
        tracing.use_tracer_provider(None)
        provider.shutdown()
        store.delete_session("d1")
        client.close()
