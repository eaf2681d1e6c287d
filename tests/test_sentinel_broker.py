"""A worker consuming a Sentinel broker (kombu's ``sentinel://``) through a failover.

Each test starts its own deployment (a primary, a replica, three Sentinels on free ports:
:mod:`workers.harness.stack.sentinel_pair`) for the broker, a standalone redis-server for
the store, and a real ``celery worker`` (threads pool). The measurement behind these is
``scripts/failover_broker.py``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import kombu.transport
import pytest
import redis
from kombu import Connection

from shared.core.config import StoreConfig
from shared.enqueue import QUEUE, TASK_COMPACT, publisher_app
from shared.store.sessions import SessionStore
from workers.app import _select_sentinel_transport, create_app
from workers.broker import SentinelTransport, is_sentinel_url
from workers.harness.demo_session import demo_turns
from workers.harness.fakes.openai_server import FakeOpenAIServer
from workers.harness.fakes.summaries import SummarizerResponder
from workers.harness.stack.redis_server import RedisServer, start_server
from workers.harness.stack.sentinel_pair import SentinelDeployment, start_sentinel_deployment
from workers.harness.stack.worker_process import WorkerProcess, worker_env
from workers.harness.timing import wait_for
from workers.settings import load_settings

PREFIX = "tsb"


@pytest.fixture
def deployment() -> Iterator[SentinelDeployment]:
    with start_sentinel_deployment() as running:
        yield running


@pytest.fixture
def store_server() -> Iterator[RedisServer]:
    server = start_server()
    yield server
    server.remove()


@pytest.fixture
def kombu_aliases(monkeypatch: pytest.MonkeyPatch) -> None:
    """kombu's transport aliases and their cache, restored after the test."""
    aliases = kombu.transport.TRANSPORT_ALIASES
    monkeypatch.setitem(aliases, "sentinel", aliases["sentinel"])
    monkeypatch.setattr(kombu.transport, "_transport_cache", {})


@pytest.mark.usefixtures("kombu_aliases")
def test_a_starting_worker_keeps_this_transport_when_kombu_switches_sentinels() -> None:
    """A failed reconnect switches kombu's connection to the next URL of the list and
    takes the transport from its scheme again: the fix must hold after the switch."""
    url = "sentinel://127.0.0.1:26379/1;sentinel://127.0.0.1:26380/1"
    conf = create_app(load_settings(broker_url=url, broker_sentinel_master="m")).conf
    _select_sentinel_transport(conf=conf)  # what a starting `celery worker` runs
    assert not conf.get("broker_transport")  # the URL still chooses, by its scheme
    conn = Connection(conf.broker_url,  # type: ignore[no-untyped-call]
                      transport_options={"master_name": "m"})
    assert conn.get_transport_cls() is SentinelTransport  # type: ignore[no-untyped-call]
    conn.switch(conn.alt[1])  # type: ignore[no-untyped-call]
    assert conn.get_transport_cls() is SentinelTransport  # type: ignore[no-untyped-call]
    assert conn.as_uri().startswith("sentinel://")  # type: ignore[no-untyped-call]


@pytest.mark.usefixtures("kombu_aliases")
def test_other_brokers_and_an_explicit_transport_are_left_alone() -> None:
    stock = kombu.transport.TRANSPORT_ALIASES["sentinel"]
    for url in ("redis://127.0.0.1:6379/1", "redis://a/1;redis://b/1"):
        _select_sentinel_transport(conf=create_app(load_settings(broker_url=url)).conf)
    conf = create_app(load_settings(broker_url="sentinel://h:26379/1",
                                    broker_sentinel_master="m")).conf
    conf.broker_transport = "sentinel"
    _select_sentinel_transport(conf=conf)
    assert kombu.transport.TRANSPORT_ALIASES["sentinel"] == stock
    assert is_sentinel_url("SENTINEL://h:26379/1;sentinel://g:26379/1")
    assert not is_sentinel_url("redis://h:6379/1;sentinel://g:26379/1")


def _compact(app: Any, sid: str) -> None:
    app.send_task(TASK_COMPACT, args=[sid], queue=QUEUE,
                  kwargs={"tenant": "default", "force": True, "keep_recent": 2000})


@pytest.mark.celery
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_worker_survives_the_primary_killed_with_a_job_in_flight(
        deployment: SentinelDeployment, store_server: RedisServer) -> None:
    """The primary dies while the worker holds an unacknowledged job. The worker's
    channel then closes on a connection already released and restores that job through a
    new pool, whose parameters kombu's Sentinel channel read off ``connection.client``
    (None): AttributeError, "Unrecoverable error", and the worker exited. It must stay up,
    reconnect to the promoted replica and run the next job."""
    store = SessionStore(redis.Redis.from_url(store_server.url), StoreConfig(key_prefix=PREFIX))
    for sid in ("before", "after"):
        for turn in demo_turns(12):
            store.append(sid, turn)
    broker, master = deployment.broker_url(1), deployment.service
    app = publisher_app(broker, sentinel_master=master)
    with FakeOpenAIServer(responder=SummarizerResponder(), latency=2.0) as llm:
        env = worker_env(broker_url=broker, redis_url=store_server.url, key_prefix=PREFIX,
                         broker_sentinel_master=master, summarizer="openai",
                         summarizer_base_url=llm.base_url, summarizer_api_key="k",
                         summarizer_timeout="20")
        worker = WorkerProcess("sentinel-kill", env, concurrency=2).start()
        try:
            _compact(app, "before")
            assert wait_for(lambda: len(llm.requests) >= 1, 20), worker.log()[-3000:]
            killed = deployment.kill_primary()  # mid-job: its ack cannot reach the broker
            deployment.wait_primary_not(killed)
            time.sleep(3)  # the job ends, its ack fails, the consumer reconnects
            assert worker.process is not None and worker.process.poll() is None, (
                worker.log()[-3000:])
            app.close()  # the publisher's pool still points at the dead primary
            app = publisher_app(broker, sentinel_master=master)
            _compact(app, "after")
            assert wait_for(lambda: store.state("after").watermark > 0, 30), (
                worker.log()[-3000:])
            assert "Unrecoverable error" not in worker.log()
        finally:
            worker.stop()
            app.close()
            store.redis.close()
