"""Recall indexing off the compaction job: its own low-priority job, coalesced per session.

Real Celery worker processes on a real Redis broker where the behaviour depends on
them (kombu's priority lists, one job per session while one is queued); the
settings, the routing and the failure paths in-process.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import pytest
import redis

from shared.core.config import StoreConfig
from shared.enqueue import TASK_COMPACT, publisher_app
from shared.store.recall_index import claim_index_job, index_stats, recall_keys
from shared.store.recall_query import recall
from shared.store.sessions import SessionStore
from tests.test_recall_index import fill
from workers.app import celery_config
from workers.harness.stack.worker_process import (
    WorkerProcess,
    parse_job_lines,
    purge_queue,
    worker_env,
)
from workers.harness.timing import wait_for
from workers.settings import RECALL_INDEX_PRIORITY, RECALL_INDEX_TASK, Settings
from workers.urls import with_db


def _received(log: str) -> list[str]:
    """Task names in the order the worker received them."""
    return re.findall(r"Task (compaction\.\w+)\[[0-9a-f-]+\] received", log)


@pytest.mark.celery
@pytest.mark.slow
def test_index_jobs_wait_behind_compactions_and_coalesce_per_session(
        own_redis_url: str, key_prefix: str) -> None:
    """Queued before a one-slot worker starts: an index job of session b (as an
    earlier commit of b would have asked), then four compactions: three of a (each
    cuts further), one of b. Every compaction runs before any index job, the older
    one included (priority 9 after 0), and each session gets one index job, which
    indexes up to its last watermark."""
    broker, store_url = with_db(own_redis_url, 12), with_db(own_redis_url, 11)
    purge_queue(broker)
    client = redis.Redis.from_url(store_url)
    store = SessionStore(client, StoreConfig(key_prefix=key_prefix))
    fill(store, "a", range(120), "padding " * 40)
    fill(store, "b", range(30), "padding " * 40)
    app = publisher_app(broker)
    assert claim_index_job(store, "b", 600)
    app.send_task(RECALL_INDEX_TASK, args=["b"], kwargs={"tenant": "default"},
                  queue="compaction", priority=RECALL_INDEX_PRIORITY)
    for sid, keep in (("a", 6000), ("b", 500), ("a", 3000), ("a", 500)):  # ~10k tokens
        app.send_task(TASK_COMPACT, args=[sid], queue="compaction",
                      kwargs={"tenant": "default", "keep_recent": keep, "force": True})
    worker = WorkerProcess("rx", worker_env(broker_url=broker, redis_url=store_url,
                                            key_prefix=key_prefix), concurrency=1)
    worker.start()
    try:
        done = {sid: lambda sid=sid: (store.state(sid).watermark > 0 and index_stats(
            store, sid)["indexed_until"] == store.state(sid).watermark) for sid in "ab"}
        assert wait_for(lambda: all(check() for check in done.values()), 60), \
            worker.log()[-3000:]
        assert wait_for(lambda: len(_received(worker.log())) >= 6, 10)
        order = _received(worker.log())
        assert order == [TASK_COMPACT] * 4 + [RECALL_INDEX_TASK] * 2, order
        assert len(store.summaries("a")) == 3  # three compactions, one index job
        assert [r["status"] for r in parse_job_lines(worker.log().splitlines())] == [
            "compacted"] * 4
        watermark = store.state("a").watermark
        assert recall(store, "a", f"ERR_STEP_{(watermark - 1) // 2}_FAILED", limit=1)
        assert not client.exists(recall_keys(store, "a").queued)
    finally:
        worker.stop()
        purge_queue(broker)
        for key in client.scan_iter(match=f"{key_prefix}:*", count=1000):
            client.delete(key)
        client.close()


def test_settings_name_who_indexes() -> None:
    assert Settings().recall_index == "task"
    for value, mode in (("off", "off"), ("false", "off"), ("0", "off"), ("job", "job"),
                        ("true", "task"), (" TASK ", "task")):
        assert Settings(recall_index=value).recall_index == mode
    with pytest.raises(ValueError, match="recall_index"):
        Settings(recall_index="sometimes")


def test_the_index_job_is_routed_at_the_lowest_priority() -> None:
    routes = celery_config(Settings())["task_routes"]
    assert routes[RECALL_INDEX_TASK] == {"queue": "compaction",
                                         "priority": RECALL_INDEX_PRIORITY}
    assert RECALL_INDEX_PRIORITY == 9  # kombu's Redis transport reads 0, 3, 6, then 9
    from workers.tasks import index_recall

    assert index_recall.max_retries == Settings().max_retries
    assert index_recall.autoretry_for and index_recall.retry_backoff


def _compact_inline(settings: Settings, session_id: str) -> dict[str, Any]:
    from workers.harness.stack.in_process import worker_app_with
    from workers.runtime import set_runtime
    from workers.tasks import compact

    set_runtime(None)
    try:
        with worker_app_with(settings):
            result = compact.apply(args=[session_id], kwargs={"keep_recent": 500,
                                                              "force": True})
        outcome: dict[str, Any] = result.result
        return outcome
    finally:
        set_runtime(None)


@pytest.mark.parametrize("mode", ["task", "job", "off"])
def test_each_mode_on_a_compaction(real_redis: Any, redis_url: str, key_prefix: str,
                                   mode: str) -> None:
    """task: an eager apply (``compact --wait``) indexes at once, as Celery runs an
    eager task's follow-ups; job: the compaction job indexes; off: nobody does."""
    store = SessionStore(real_redis, StoreConfig(key_prefix=key_prefix))
    fill(store, "s", range(30), "padding " * 40)
    settings = Settings(redis_url=redis_url, key_prefix=key_prefix, recall_index=mode)
    outcome = _compact_inline(settings, "s")
    assert outcome["status"] == "compacted"
    indexed = index_stats(store, "s")["indexed_until"]
    assert indexed == (0 if mode == "off" else outcome["watermark_after"])


def test_a_failed_publish_never_fails_the_compaction(
        real_redis: Any, key_prefix: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """The broker refuses the index job: logged, the flag released (the next commit asks
    again), the compaction's result unchanged."""
    import workers.tasks as tasks

    def refused(*_: Any, **__: Any) -> None:
        raise ConnectionError("broker down")

    monkeypatch.setattr(tasks.index_recall, "apply_async", refused)
    task_log = logging.getLogger("compaction.tasks")
    monkeypatch.setattr(task_log, "disabled", False)
    monkeypatch.setattr(task_log, "propagate", True)
    caplog.set_level(logging.WARNING, logger="compaction.tasks")
    store = SessionStore(real_redis, StoreConfig(key_prefix=key_prefix))
    tasks.request_index(store, "s", "default")  # no exception
    assert "could not be requested" in caplog.text
    assert claim_index_job(store, "s", 60)  # released: the next commit can ask
    assert not claim_index_job(store, "s", 60)  # and then coalesces
