"""Real Celery workers on a real Redis broker: compaction, kill -9, races."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery.utils.time import get_exponential_backoff_interval
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.core.config import StoreConfig
from shared.core.errors import SummarizerUnavailable
from shared.core.repair import validate_view
from shared.enqueue import TASK_COMPACT, CeleryEnqueuer, publisher_app
from shared.guard import ContextGuard
from shared.store.sessions import SessionStore
from workers.app import celery_config
from workers.harness.demo_session import SYSTEM_PROMPT, TOOLS, demo_turns
from workers.harness.fakes.openai_server import FakeOpenAIServer
from workers.harness.fakes.summaries import SummarizerResponder
from workers.harness.stack.worker_process import WorkerProcess, purge_queue, worker_env
from workers.harness.timing import wait_for
from workers.settings import RETRY_BACKOFF_FACTOR, load_settings
from workers.urls import with_db

pytestmark = [pytest.mark.celery, pytest.mark.slow]


@pytest.fixture
def urls(own_redis_url: str) -> Iterator[tuple[str, str]]:
    broker, store = with_db(own_redis_url, 12), with_db(own_redis_url, 11)
    purge_queue(broker)
    yield broker, store
    purge_queue(broker)


@pytest.fixture
def store_client(urls: tuple[str, str], key_prefix: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(urls[1])
    yield client
    for key in client.scan_iter(match=f"{key_prefix}:*", count=1000):
        client.delete(key)


def test_worker_compacts_in_the_background(urls: tuple[str, str], key_prefix: str,
                                           store_client: redis.Redis) -> None:
    broker, store_url = urls
    worker = WorkerProcess("w1", worker_env(broker_url=broker, redis_url=store_url,
                                            key_prefix=key_prefix)).start()
    try:
        store = SessionStore(store_client, StoreConfig(key_prefix=key_prefix))
        guard = ContextGuard(store, CeleryEnqueuer(publisher_app(broker)),
                             overrides={"gpt-4o": 24_000})
        for turn in demo_turns(30):
            view = guard.prepare("s1", SYSTEM_PROMPT, TOOLS, 2000, "gpt-4o", pending=turn[:1])
            assert view.report.budget.within_budget
            assert validate_view(view.messages, "openai") == []
            guard.record_turn("s1", turn)
            time.sleep(0.05)
        assert wait_for(lambda: store.state("s1").watermark > 0, 20), worker.log()[-3000:]
        assert wait_for(lambda: not store.is_pending("s1"), 20)
        summaries = store.summaries("s1")
        assert summaries and all(s.kind in ("offline", "truncation") for s in summaries)
        assert "compaction.maybe_summarize" in worker.log()
    finally:
        worker.stop()


def test_kill9_mid_summarization_is_redelivered_and_completes(
        urls: tuple[str, str], key_prefix: str, store_client: redis.Redis) -> None:
    broker, store_url = urls
    store = SessionStore(store_client, StoreConfig(key_prefix=key_prefix))
    for turn in demo_turns(12):
        store.append("s2", turn)
    with FakeOpenAIServer(responder=SummarizerResponder(), latency=3.0) as llm:
        env = worker_env(broker_url=broker, redis_url=store_url, key_prefix=key_prefix,
                         summarizer="openai", summarizer_base_url=llm.base_url,
                         summarizer_api_key="k", summarizer_timeout="20",
                         broker_visibility_timeout="6", broker_restore_sweep_seconds="1",
                         task_time_limit="20", task_soft_time_limit="15")
        first = WorkerProcess("victim", env).start()
        second = WorkerProcess("heir", env)
        try:
            _kill_mid_job_then_recover(first, second, broker, llm, store)
        finally:
            first.kill9()
            second.stop()


def _kill_mid_job_then_recover(first: WorkerProcess, second: WorkerProcess, broker: str,
                               llm: FakeOpenAIServer, store: SessionStore) -> None:
    app = publisher_app(broker)
    app.send_task(TASK_COMPACT, args=["s2"],
                  kwargs={"tenant": "default", "force": True, "keep_recent": 2000},
                  queue="compaction")
    assert wait_for(lambda: len(llm.requests) >= 1, 20), first.log()[-3000:]
    first.kill9()  # mid-summarization: the LLM call is in flight
    assert store.state("s2").watermark == 0
    second.start()
    assert wait_for(lambda: store.state("s2").watermark > 0, 40), second.log()[-3000:]
    state = store.state("s2")
    assert state.version == 1, "exactly one summary write"
    assert [s.kind for s in store.summaries("s2")] == ["llm"]
    assert len(llm.requests) >= 2  # the killed attempt and the redelivered one


def test_four_workers_appends_edit_and_manual_compactions(
        urls: tuple[str, str], key_prefix: str, store_client: redis.Redis) -> None:
    """Every view valid; the watermark only goes back through an edit; no stale summary."""
    broker, store_url = urls
    env = worker_env(broker_url=broker, redis_url=store_url, key_prefix=key_prefix)
    workers = [WorkerProcess(f"race{i}", env, concurrency=2) for i in range(4)]
    store = SessionStore(store_client, StoreConfig(key_prefix=key_prefix))
    publisher = publisher_app(broker)
    guard = ContextGuard(store, CeleryEnqueuer(publisher), overrides={"gpt-4o": 16_000})
    turns = demo_turns(80)
    observed: list[tuple[int, int]] = []
    edits: list[tuple[int, int]] = []  # (version after the edit, index)
    errors: list[BaseException] = []
    stop = threading.Event()

    def appender(part: list[list[Any]]) -> None:
        try:
            for turn in part:
                guard.record_turn("race", turn)
                time.sleep(0.02)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def viewer() -> None:
        try:
            while not stop.is_set():
                view = guard.prepare("race", SYSTEM_PROMPT, TOOLS, 1500, "gpt-4o")
                for provider in ("openai", "anthropic", "gemini"):
                    problems = validate_view(view.messages, provider)
                    assert problems == [], (provider, problems)
                observed.append((view.report.version, view.report.watermark))
                if len(observed) % 25 == 0:
                    publisher.send_task(TASK_COMPACT, args=["race"],
                                        kwargs={"tenant": "default"}, queue="compaction")
        except BaseException as exc:  # pragma: no cover
            errors.append(exc)

    try:
        for w in workers:  # launched together, then each waited for: the same four workers
            w.launch()
        for w in workers:
            w.wait_ready()
        threads = [threading.Thread(target=appender, args=(turns[i::2],)) for i in range(2)]
        threads.append(threading.Thread(target=viewer))
        for t in threads:
            t.start()
        time.sleep(3)
        index = store.length("race") // 2
        edits.append((store.truncate_after("race", index).version, index))
        for t in threads[:2]:
            t.join()
        time.sleep(3)
        stop.set()
        threads[2].join()
        assert not errors, errors
        assert store.state("race").watermark > 0
    finally:
        stop.set()
        for w in workers:
            w.stop()
    for (v1, w1), (v2, w2) in itertools.pairwise(observed):
        if w2 < w1:
            assert any(v1 < ev <= v2 for ev, _ in edits), (v1, w1, v2, w2)
    edit_version, edit_index = edits[0]
    for record in store.summaries("race"):
        if record.watermark > edit_index:
            assert record.source_version >= edit_version, "a stale summary was stored"


# ------------------------------------------------------------------ timing settings

def test_default_timing_redelivers_a_killed_job_within_about_four_minutes() -> None:
    """The defaults: 180 s job, 210 s lease, 8 s longest countdown, 258 s visibility."""
    settings = load_settings()
    assert settings.longest_job_seconds == 180
    assert settings.lease_seconds == 210
    assert settings.longest_retry_countdown == 8
    assert settings.visibility_timeout == 258  # was 480 s before the review
    options = celery_config(settings)["broker_transport_options"]
    assert options["visibility_timeout"] == settings.visibility_timeout
    assert settings.store_config().lease_ttl_seconds == settings.lease_seconds


@settings(max_examples=300, deadline=None)
@given(soft=st.integers(1, 3600), extra=st.integers(1, 600), retries=st.integers(0, 12),
       backoff_max=st.integers(1, 3600), call=st.floats(0.1, 600), sweep=st.integers(1, 60))
def test_derived_timing_keeps_redelivery_after_the_lease(soft: int, extra: int, retries: int,
                                                         backoff_max: int, call: float,
                                                         sweep: int) -> None:
    """Lease > longest job; visibility > longest Celery countdown + lease + one sweep."""
    s = load_settings(task_soft_time_limit=soft, task_time_limit=soft + extra,
                      max_retries=retries, retry_backoff_max=backoff_max,
                      summarizer_timeout=call, broker_restore_sweep_seconds=sweep)
    countdowns = [get_exponential_backoff_interval(RETRY_BACKOFF_FACTOR, r, backoff_max,
                                                   full_jitter=False) for r in range(retries)]
    assert s.longest_retry_countdown == max(countdowns, default=0)
    assert s.longest_job_seconds >= s.task_time_limit
    assert s.longest_job_seconds >= s.task_soft_time_limit + call  # threads: one late call
    assert s.lease_seconds > s.longest_job_seconds
    assert s.visibility_timeout > s.longest_retry_countdown + s.lease_seconds + sweep


def test_only_summarizer_unavailable_is_retried_by_celery() -> None:
    from workers.tasks import compact, maybe_summarize

    for task in (compact, maybe_summarize):
        assert task.autoretry_for == (SummarizerUnavailable,)
        assert task.retry_backoff == RETRY_BACKOFF_FACTOR
        assert task.retry_backoff_max == load_settings().retry_backoff_max


def test_a_summarizer_slower_than_the_lease_keeps_one_job_per_session(
        urls: tuple[str, str], key_prefix: str, store_client: redis.Redis) -> None:
    """Real workers, a 5 s lease (visibility 6 s), a summarizer answering after 8 s: the
    holder renews its lease, so a second /compact (and the broker's redelivery of the
    slow job) finds it busy instead of summarizing the same session alongside."""
    from tests.test_lease import Tracking

    broker, store_url = urls
    store = SessionStore(store_client, StoreConfig(key_prefix=key_prefix))
    for turn in demo_turns(12):
        store.append("s3", turn)
    tracking = Tracking(delay=8.0)
    with FakeOpenAIServer(responder=tracking) as llm:
        env = worker_env(broker_url=broker, redis_url=store_url, key_prefix=key_prefix,
                         summarizer="openai", summarizer_base_url=llm.base_url,
                         summarizer_api_key="k", summarizer_timeout="30",
                         broker_visibility_timeout="6", broker_restore_sweep_seconds="1",
                         task_time_limit="40", task_soft_time_limit="35")
        assert load_settings(**{k.removeprefix("COMPACTION_").lower(): v for k, v in env.items()
                                if k.startswith("COMPACTION_") and k not in (
                                    "COMPACTION_BROKER_URL", "COMPACTION_REDIS_URL",
                                    "COMPACTION_KEY_PREFIX")}).lease_seconds == 5
        workers = [WorkerProcess(f"slow{i}", env, concurrency=2).launch() for i in range(2)]
        try:
            for w in workers:
                w.wait_ready()
            app = publisher_app(broker)
            app.send_task(TASK_COMPACT, args=["s3"], kwargs={"keep_recent": 2000},
                          queue="compaction")
            assert wait_for(lambda: tracking.calls >= 1, 20), workers[0].log()[-3000:]
            time.sleep(6.5)  # past the lease's TTL, inside the first summarizer call
            app.send_task(TASK_COMPACT, args=["s3"], kwargs={"keep_recent": 1500},
                          queue="compaction")
            assert wait_for(lambda: store.state("s3").watermark > 0, 40)
            assert wait_for(lambda: not store_client.exists(store.keys("s3").lease)
                            and tracking.in_flight == 0, 60)
            logs = "".join(w.log() for w in workers)
        finally:
            for w in workers:
                w.stop()
    assert tracking.max_in_flight == 1, "two jobs summarized one session at the same time"
    assert "'status': 'busy'" in logs, logs[-3000:]
    assert "lease_lost" not in logs
    kinds = [s.kind for s in store.summaries("s3")]
    assert kinds and set(kinds) == {"llm"} and store.state("s3").version == len(kinds)


def test_a_slow_summarizer_past_the_deadline_makes_progress_across_retries(
        urls: tuple[str, str], key_prefix: str, store_client: redis.Redis) -> None:
    """A real worker with a 4 s soft limit and a summarizer taking 1.2 s a chunk, on a
    backlog of many chunks: each attempt commits the chunks it folded before its deadline,
    the retry goes on from there, and no message is summarized twice by the LLM (every
    attempt used to start over at message 0 and end offline)."""
    import re

    from tests.test_lease import Tracking

    broker, store_url = urls
    store = SessionStore(store_client, StoreConfig(key_prefix=key_prefix))
    for turn in demo_turns(30):
        store.append("s5", turn)
    tracking = Tracking(delay=1.2)
    with FakeOpenAIServer(responder=tracking) as llm:
        env = worker_env(broker_url=broker, redis_url=store_url, key_prefix=key_prefix,
                         summarizer="openai", summarizer_base_url=llm.base_url,
                         summarizer_api_key="k", summarizer_timeout="10",
                         summarizer_max_input_tokens="6000", max_summary_tokens="800",
                         max_retries="5", retry_backoff_max="1",
                         task_time_limit="30", task_soft_time_limit="4")
        worker = WorkerProcess("slow-fold", env).start()
        try:
            publisher_app(broker).send_task(TASK_COMPACT, args=["s5"],
                                            kwargs={"keep_recent": 2000}, queue="compaction")
            assert wait_for(lambda: any(s.kind == "llm" and s.covers_from > 0
                                        for s in store.summaries("s5")), 60), \
                worker.log()[-3000:]
            assert wait_for(lambda: not store.is_pending("s5") and not store_client.exists(
                store.keys("s5").lease), 60)
            log = worker.log()
        finally:
            worker.stop()
        done = [r for r in llm.requests if r.path.endswith("/chat/completions")
                and r.status == 200]
    assert "past its deadline" in log
    shown = [set(map(int, re.findall(r'<message index="(\d+)"',
                                     r.body["messages"][1]["content"]))) for r in done]
    assert len(shown) >= 4
    assert all(not a & b for i, a in enumerate(shown) for b in shown[i + 1:]), \
        "a message was sent to the summarizer twice"
    llm_summaries = [s for s in store.summaries("s5") if s.kind == "llm"]
    assert all(b.covers_from == a.watermark for a, b in itertools.pairwise(llm_summaries))
