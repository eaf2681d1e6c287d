"""A real worker's compare-and-swap lost to the guard is counted, even when a retry wins.

While the worker's summarizer call is in flight (inside the fake provider's
reply) the guard truncates the session, so the job's first commit loses its
swap; its second attempt lays the summary over the truncation. The scrape of
the worker's /metrics must show both: one ``summary``/``covered`` (or
``conflict``) and one ``llm``/``compacted``.
"""

from __future__ import annotations

import urllib.request
from typing import Any

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from shared.core.config import StoreConfig
from shared.enqueue import TASK_COMPACT, NullEnqueuer, publisher_app
from shared.guard import ContextGuard
from shared.store.sessions import SessionStore
from workers.harness.demo_session import SYSTEM_PROMPT, TOOLS, demo_turns
from workers.harness.fakes.openai_server import FakeOpenAIServer
from workers.harness.fakes.summaries import SummarizerResponder
from workers.harness.stack.redis_server import free_port
from workers.harness.stack.worker_process import WorkerProcess, purge_queue, worker_env
from workers.harness.timing import wait_for
from workers.urls import with_db

pytestmark = [pytest.mark.celery, pytest.mark.slow]


def _counts(port: int) -> dict[tuple[str, ...], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    out: dict[tuple[str, ...], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in ("compaction_compactions_total", "compaction_jobs_total"):
                key = (sample.name, *(f"{k}={v}" for k, v in sorted(sample.labels.items())))
                out[key] = sample.value
    return out


def test_a_swap_lost_then_won_counts_both(own_redis_url: str, key_prefix: str) -> None:
    url = with_db(own_redis_url, 3)
    purge_queue(url)
    client = redis.Redis.from_url(url)
    store = SessionStore(client, StoreConfig(key_prefix=key_prefix))
    for turn in demo_turns(30):
        ContextGuard(store, NullEnqueuer()).record_turn("s1", turn)
    small = ContextGuard(store, NullEnqueuer(), overrides={"gpt-4o": 6_000})
    truncated: list[bool] = []
    summarize = SummarizerResponder()

    def responder(request: dict[str, Any]) -> dict[str, Any]:
        if not truncated:  # the guard commits a truncation while the job's call runs
            view = small.prepare("s1", SYSTEM_PROMPT, TOOLS, 500, "gpt-4o")
            truncated.append(view.report.truncated)
        return summarize(request)

    port = free_port()
    with FakeOpenAIServer(responder=responder) as llm:
        env = worker_env(broker_url=url, redis_url=url, key_prefix=key_prefix,
                         metrics_port=str(port), summarizer="openai",
                         summarizer_base_url=llm.base_url, summarizer_api_key="k",
                         summarizer_model="gpt-4o-mini", recall_index="off")
        worker = WorkerProcess("lostswap", env, concurrency=1).start()
        try:
            publisher_app(url).send_task(TASK_COMPACT, args=["s1"],
                                         kwargs={"tenant": "default", "keep_recent": 20},
                                         queue="compaction")
            assert wait_for(lambda: sum(v for k, v in _counts(port).items()
                                        if k[0] == "compaction_jobs_total") == 1, 30), \
                worker.log()[-3000:]
            counts = _counts(port)
            kinds = [s.kind for s in store.summaries("s1")]
        finally:
            worker.stop()
            for key in client.scan_iter(match=f"{key_prefix}:*", count=1000):
                client.delete(key)
            purge_queue(url)
            client.close()
    assert truncated == [True]
    assert kinds == ["truncation", "llm"]  # the truncation won first, the summary over it
    assert counts[("compaction_jobs_total", "outcome=compacted", "task=compact")] == 1
    assert counts[("compaction_compactions_total", "kind=llm", "outcome=compacted")] == 1
    lost = {k: v for k, v in counts.items() if "kind=summary" in k}
    assert sum(lost.values()) == 1, counts
