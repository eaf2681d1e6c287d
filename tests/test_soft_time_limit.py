"""Prefork's soft time limit lands inside a summarizer call: a deadline, not a crash.

Under ``--pool prefork`` Celery raises ``SoftTimeLimitExceeded`` into the job at
``COMPACTION_TASK_SOFT_TIME_LIMIT``, wherever it is: nearly always inside an LLM
call the job's own deadline allowed to start. It used to escape as an unknown
error: no retry, no offline fallback, the chunks folded so far thrown away, and
the busy requests handed on until they were recorded failed. The worker's
engine takes it like a call that timed out (``SummarizerUnavailable``).
"""

from __future__ import annotations

import os
import re
import signal
import threading
from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest
import redis
from celery.exceptions import SoftTimeLimitExceeded

from shared.core.config import StoreConfig
from shared.enqueue import TASK_COMPACT, publisher_app
from shared.store.sessions import SessionStore
from workers.harness.demo_session import demo_turns
from workers.harness.fakes.openai_server import FakeOpenAIServer
from workers.harness.fakes.summaries import SummarizerResponder
from workers.harness.stack.worker_process import WorkerProcess, purge_queue, worker_env
from workers.harness.timing import wait_for
from workers.runtime import Runtime, build_runtime, set_runtime
from workers.settings import load_settings
from workers.urls import with_db


class SoftLimitAt:
    """Summarizer replies; the ``at``-th call gets prefork's soft time limit while in flight.

    As billiard does (a signal whose handler raises in the job's thread), the server
    signals this process and holds the reply until the handler has run, so the exception
    lands inside the client's blocking read, deterministically.
    """

    def __init__(self, at: int) -> None:
        self.at, self.calls = at, 0
        self.inner = SummarizerResponder()
        self.raised = threading.Event()

    def handler(self, *_: Any) -> None:
        self.raised.set()
        raise SoftTimeLimitExceeded()

    def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        if self.calls == self.at:
            os.kill(os.getpid(), signal.SIGUSR1)
            assert self.raised.wait(10)
        reply: dict[str, Any] = self.inner(request)
        return reply


@pytest.fixture
def soft_limit() -> Iterator[SoftLimitAt]:
    responder = SoftLimitAt(at=3)
    previous = signal.signal(signal.SIGUSR1, responder.handler)
    yield responder
    signal.signal(signal.SIGUSR1, previous)
    set_runtime(None)


def test_a_soft_limit_inside_a_call_keeps_the_folded_chunks_and_retries(
        soft_limit: SoftLimitAt) -> None:
    """The third chunk's call is interrupted: the first two are committed, Celery retries,
    and the retry goes on from there (no message sent to the summarizer twice)."""
    from workers.tasks import _settings, compact

    store = SessionStore(fakeredis.FakeRedis(), StoreConfig())
    for turn in demo_turns(12):
        store.append("s", turn)
    with FakeOpenAIServer(responder=soft_limit) as server:
        settings = load_settings(summarizer="openai", summarizer_base_url=server.base_url,
                                 summarizer_api_key="k", summarizer_timeout=10,
                                 summarizer_max_input_tokens=6000, max_summary_tokens=800)
        engine = build_runtime(settings, store=store).engine  # wired as in a worker
        set_runtime(Runtime(settings=_settings(), store=store, engine=engine))
        result = compact.apply(args=["s"], kwargs={"keep_recent": 2000}).get()
        sent = [r for r in server.requests if r.path.endswith("/chat/completions")]
    assert soft_limit.raised.is_set()
    assert result["status"] == "compacted" and result["summary_kind"] == "llm", result
    assert result["attempt"] == 2, result
    shown = [set(map(int, re.findall(r'<message index="(\d+)"',
                                     r.body["messages"][1]["content"]))) for r in sent]
    first_two, after = shown[0] | shown[1], set().union(*shown[3:])
    assert after and not first_two & after, "the retry sent folded messages again"
    summaries = store.summaries("s")
    assert summaries[0].watermark == max(first_two) + 1
    assert summaries[-1].covers_from == summaries[0].watermark


@pytest.mark.celery
@pytest.mark.slow
def test_a_prefork_job_cut_by_its_soft_limit_still_summarizes(own_redis_url: str,
                                                               key_prefix: str) -> None:
    """A real prefork worker, a 2 s soft limit and a summarizer answering after 6 s, no
    retries left: the last attempt falls back to the offline summarizer (it used to fail
    with SoftTimeLimitExceeded and leave the session unsummarized)."""
    broker, store_url = with_db(own_redis_url, 12), with_db(own_redis_url, 11)
    purge_queue(broker)
    client = redis.Redis.from_url(store_url)
    store = SessionStore(client, StoreConfig(key_prefix=key_prefix))
    for turn in demo_turns(12):
        store.append("p", turn)
    with FakeOpenAIServer(responder=SummarizerResponder(), latency=6.0) as llm:
        env = worker_env(broker_url=broker, redis_url=store_url, key_prefix=key_prefix,
                         summarizer="openai", summarizer_base_url=llm.base_url,
                         summarizer_api_key="k", summarizer_timeout="10", max_retries="0",
                         task_soft_time_limit="2", task_time_limit="30")
        worker = WorkerProcess("soft", env, concurrency=1, pool="prefork").start()
        try:
            publisher_app(broker).send_task(TASK_COMPACT, args=["p"],
                                            kwargs={"keep_recent": 2000}, queue="compaction")
            done = wait_for(lambda: store.state("p").version >= 1, 10)
            kinds = [summary.kind for summary in store.summaries("p")]
            log = worker.log()
        finally:
            worker.stop()
            purge_queue(broker)
            for key in client.scan_iter(match=f"{key_prefix}:*"):
                client.delete(key)
    assert done, log[-3000:]
    assert "Soft time limit (2s) exceeded" in log
    assert "falling back to the offline summarizer (last attempt)" in log, log[-3000:]
    assert kinds == ["offline"] and "JobFailed" not in log
