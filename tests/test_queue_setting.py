"""COMPACTION_QUEUE: every publisher the CLI, the server and doctor build uses it.

Workers on another queue than ``compaction`` must get the jobs of ``compaction
compact``, of ``compaction serve`` and doctor's check of them; a real worker
process, started as the Procfile starts it (no ``-Q``), consumes the custom
queue here.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
import redis

from shared.core.config import StoreConfig
from shared.enqueue import QUEUE
from shared.store.sessions import SessionStore
from workers.cli.demo import split_turns
from workers.cli.doctor import check_workers
from workers.cli.main import main
from workers.harness.stack.worker_process import WorkerProcess, worker_env
from workers.settings import load_settings
from workers.urls import with_db

CUSTOM = "tq_custom"
SESSION = "q-1"


@pytest.fixture
def urls(own_redis_url: str, key_prefix: str,
         monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str]]:
    store_url, broker_url = with_db(own_redis_url, 5), with_db(own_redis_url, 6)
    for name, value in {"COMPACTION_REDIS_URL": store_url, "COMPACTION_BROKER_URL": broker_url,
                        "COMPACTION_KEY_PREFIX": key_prefix, "COMPACTION_QUEUE": CUSTOM}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("COMPACTION_SUMMARIZER", raising=False)
    yield store_url, broker_url
    for url in (store_url, broker_url):
        client = redis.Redis.from_url(url)
        client.flushdb()  # this module's own redis-server
        client.close()


def _session(store_url: str, key_prefix: str) -> SessionStore:
    store = SessionStore(redis.Redis.from_url(store_url), StoreConfig(key_prefix=key_prefix))
    for turn in split_turns(20, seed=3):
        store.append(SESSION, turn)
    return store


def test_the_queue_setting_defaults_to_the_compaction_queue(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COMPACTION_QUEUE", raising=False)
    assert load_settings().queue == QUEUE == "compaction"
    monkeypatch.setenv("COMPACTION_QUEUE", "")
    with pytest.raises(Exception, match="COMPACTION_QUEUE"):
        load_settings()


def test_compact_and_doctor_use_the_configured_queue(
        urls: tuple[str, str], key_prefix: str, capsys: pytest.CaptureFixture[str]) -> None:
    store_url, broker_url = urls
    store = _session(store_url, key_prefix)
    broker = redis.Redis.from_url(broker_url)
    try:
        assert main(["compact", SESSION, "--force", "--json"]) == 0
        capsys.readouterr()
        assert broker.llen(CUSTOM) == 1 and broker.llen(QUEUE) == 0
        env = worker_env(broker_url=broker_url, redis_url=store_url, key_prefix=key_prefix)
        # the documented command: no -Q, the queue is COMPACTION_QUEUE from the environment
        worker = WorkerProcess("custom", {**env, "COMPACTION_QUEUE": CUSTOM}, concurrency=2,
                               queue=None).start()
        try:
            deadline = time.monotonic() + 60
            while not store.summaries(SESSION) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert store.summaries(SESSION), worker.log()[-3000:]
            assert "COMPACTION_QUEUE is" not in worker.log()
            assert main(["doctor", "--timeout", "2", "--json"]) in (0, 1)
            checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)}
        finally:
            worker.stop()
    finally:
        broker.close()
    assert checks["workers"]["verdict"] == "OK", checks["workers"]
    assert repr(CUSTOM) in checks["queue"]["detail"]


def test_the_servers_publishers_use_the_configured_queue(urls: tuple[str, str],
                                                         key_prefix: str) -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from workers.server.config import ServerConfig
    from workers.server.main import build_app

    store_url, broker_url = urls
    _session(store_url, key_prefix)
    app = build_app(load_settings(), ServerConfig(tokens='{"tok-0123456789abcdef": "default"}'))
    assert app.state.server.enqueuer.queue == CUSTOM
    broker = redis.Redis.from_url(broker_url)
    try:
        with TestClient(app) as client:
            response = client.post(f"/v1/sessions/{SESSION}/compact", json={"force": True},
                                   headers={"Authorization": "Bearer tok-0123456789abcdef"})
        assert response.status_code < 300, response.text
        assert broker.llen(CUSTOM) == 1 and broker.llen(QUEUE) == 0
    finally:
        broker.close()


def test_a_worker_that_leaves_out_the_configured_queue_says_so(urls: tuple[str, str],
                                                               key_prefix: str) -> None:
    """COMPACTION_QUEUE changed, the worker started with -Q compaction (the Procfile's and
    the image's command): one warning line at start, naming both."""
    store_url, broker_url = urls
    env = {**worker_env(broker_url=broker_url, redis_url=store_url, key_prefix=key_prefix),
           "COMPACTION_QUEUE": CUSTOM}
    worker = WorkerProcess("leftout", env, concurrency=1).start()
    try:
        log = worker.log()
        # doctor: no worker consuming the queue the jobs go to is a failure, not a warning
        found = check_workers(broker_url, 3.0, CUSTOM)
    finally:
        worker.stop()
    assert found.verdict == "FAIL" and f"not consuming {CUSTOM!r}" in found.detail
    assert f"warning: COMPACTION_QUEUE is {CUSTOM!r} but this worker consumes compaction" in log
    matching = WorkerProcess("matching", env, concurrency=1, queue=CUSTOM).start()
    try:
        assert "COMPACTION_QUEUE is" not in matching.log()
    finally:
        matching.stop()


def test_the_demo_publishes_to_the_configured_queue(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """The demo's guard published to ``compaction`` whatever COMPACTION_QUEUE said: its
    own worker (and deployed ones) consume the configured queue, and compacted nothing."""
    monkeypatch.setenv("COMPACTION_QUEUE", CUSTOM)
    for name in ("COMPACTION_REDIS_URL", "COMPACTION_BROKER_URL", "COMPACTION_SUMMARIZER"):
        monkeypatch.delenv(name, raising=False)
    assert main(["demo", "--turns", "40", "--pace", "0", "--json",
                 "--worker", "embedded"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["compactions"] > 0, report
