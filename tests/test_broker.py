"""workers.broker: one redis-py client per pool, kombu's behaviour otherwise.

Unit tests open kombu channels on the real Redis (a channel pings on
creation) under a key prefix of the test's own; the end-to-end test runs a
real threads-pool worker on a redis-server of its own and reads the task
events the way Flower does.
"""

from __future__ import annotations

import secrets
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from hypothesis import given, settings
from hypothesis import strategies as st
from kombu.connection import Connection
from kombu.entity import Exchange, Queue
from kombu.messaging import Producer
from kombu.transport.redis import PrefixedStrictRedis
from redis.credentials import CredentialProvider, StreamingCredentialProvider

from shared.core.config import StoreConfig
from shared.core.errors import ConfigError
from shared.enqueue import QUEUE, TASK_COMPACT, TASK_MAYBE_SUMMARIZE, publisher_app
from shared.store.sessions import SessionStore
from workers.app import _select_worker_transport, celery_config, create_app
from workers.broker import (
    TRANSPORT,
    Channel,
    Transport,
    worker_transport,
)
from workers.harness.demo_session import demo_turns
from workers.harness.fakes.openai_server import FakeOpenAIServer
from workers.harness.fakes.summaries import SummarizerResponder
from workers.harness.stack.redis_server import start_server
from workers.harness.stack.worker_process import WorkerProcess, purge_queue, worker_env
from workers.harness.timing import wait_for
from workers.settings import load_settings
from workers.urls import with_db


def connection(url: str, **kwargs: Any) -> Any:
    """A kombu Connection (kombu's constructor is untyped)."""
    return Connection(url, **kwargs)  # type: ignore[no-untyped-call]


def open_channel(url: str, **options: Any) -> tuple[Any, Channel]:
    conn = connection(url, transport=TRANSPORT, transport_options=options)
    channel = conn.channel()
    assert isinstance(channel, Channel)
    return conn, channel


def acquire(channel: Channel, client: Any = None) -> Any:
    with channel.conn_or_acquire(client) as acquired:
        return acquired


@pytest.fixture
def channel(redis_url: str, key_prefix: str,
            real_redis: redis.Redis) -> Iterator[Channel]:
    """A channel of this module's transport; its keys live under ``key_prefix:``."""
    conn, chan = open_channel(redis_url, global_keyprefix=f"{key_prefix}:")
    yield chan
    conn.release()


# ------------------------------------------------------------------ selection

@pytest.mark.parametrize(("url", "expected"), [
    ("redis://127.0.0.1:6379/1", TRANSPORT),
    ("redis://:secret@broker/0", TRANSPORT),
    ("REDIS://broker", TRANSPORT),
    ("rediss://broker:6380/1", None),  # TLS defaults stay kombu's (by scheme)
    ("sentinel://s1:26379;sentinel://s2:26379", None),
    ("sentinel://s1:26379", None),
    ("redis://a:6379/1;redis://b:6379/1", None),  # failover switches take the URL's scheme
    ("redis+socket:///run/redis.sock", None),  # the URL names its transport
    ("amqp://guest@rabbit//", None),
    ("memory://", None),
])
def test_only_single_redis_urls_get_this_transport(url: str, expected: str | None) -> None:
    assert worker_transport(url) == expected
    sentinel = {"broker_sentinel_master": "mymaster"} if url.startswith("sentinel") else {}
    assert "broker_transport" not in celery_config(load_settings(broker_url=url, **sentinel))
    conf = create_app(load_settings(broker_url=url, **sentinel)).conf
    _select_worker_transport(conf=conf)  # what a starting `celery worker` runs
    assert conf.broker_transport == expected


def test_a_url_kombu_has_no_transport_for_is_refused_at_start() -> None:
    assert worker_transport("unix:///run/redis.sock") is None  # not a kombu broker URL at all
    with pytest.raises(ConfigError, match=r"COMPACTION_BROKER_URL='unix:///run/redis\.sock'"):
        load_settings(broker_url="unix:///run/redis.sock")


def test_an_explicit_transport_is_left_alone() -> None:
    conf = create_app(load_settings(broker_url="redis://broker/0")).conf
    conf.broker_transport = "redis"
    _select_worker_transport(conf=conf)
    assert conf.broker_transport == "redis"


def test_the_worker_app_resolves_the_transport_and_still_prints_a_redis_url() -> None:
    app = create_app(load_settings(broker_url="redis://:pw@broker.internal:6390/4"))
    _select_worker_transport(conf=app.conf)
    conn = app.connection()
    try:
        assert type(conn.transport) is Transport
        assert conn.as_uri() == "redis://:**@broker.internal:6390/4"  # the worker banner
        assert conn.as_uri(include_password=True) == "redis://:pw@broker.internal:6390/4"
    finally:
        conn.release()


_host = st.from_regex(r"[a-z][a-z0-9-]{0,12}(\.[a-z]{2,5})?", fullmatch=True)
_secret = st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=10)


@settings(max_examples=150, deadline=None)
@given(scheme=st.just("redis"), host=_host,
       port=st.none() | st.integers(1, 65535), db=st.none() | st.integers(0, 15),
       user=st.none() | st.from_regex(r"[a-z]{1,8}", fullmatch=True),
       password=st.none() | _secret)
def test_as_uri_is_what_kombu_prints_for_the_scheme(scheme: str, host: str, port: int | None,
                                                   db: int | None, user: str | None,
                                                   password: str | None) -> None:
    """Banner and Flower (which picks its broker client by this URL's scheme) see no change."""
    from urllib.parse import quote

    auth = ""
    if user is not None or password is not None:
        auth = f"{user or ''}:{quote(password or '', safe='')}@"
    url = f"{scheme}://{auth}{host}{f':{port}' if port else ''}{f'/{db}' if db is not None else ''}"
    stock, ours = connection(url), connection(url, transport=worker_transport(url))
    for include_password in (False, True):
        assert ours.as_uri(include_password) == stock.as_uri(include_password), url
    assert ours.as_uri().startswith(f"{scheme}://")
    assert ours.ssl == stock.ssl


# ------------------------------------------------------------ client reuse

def test_the_stock_channel_builds_a_client_per_call(redis_url: str) -> None:
    """Why this module exists; if kombu starts reusing its client, it can go."""
    conn = connection(redis_url)
    try:
        stock = conn.channel()
        assert type(stock) is not Channel
        assert acquire(stock) is not acquire(stock)
    finally:
        conn.release()


def test_a_channel_closed_after_its_connection_was_released_raises_a_connection_error(
        redis_url: str) -> None:
    """What Celery does after a broker restart with a job in flight: the channel closes
    on a connection already released, and restoring its unacked job needs a new pool.
    kombu read that pool's parameters off ``connection.client`` (None): AttributeError,
    which Celery does not ignore, so the worker exited."""
    conn, chan = open_channel(redis_url)
    chan.qos._delivered["tag"] = None  # a job in flight
    chan._disconnect_pools()  # the reconnect dropped the pool
    chan.connection.client = None  # the connection released
    with pytest.raises(conn.connection_errors, match="released"):
        chan.close()


@pytest.mark.celery
@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_worker_survives_a_broker_restart_with_a_job_in_flight(key_prefix: str) -> None:
    server = start_server()
    broker_url, store_url = with_db(server.url, 1), server.url
    store = SessionStore(redis.Redis.from_url(store_url), StoreConfig(key_prefix=key_prefix))
    for turn in demo_turns(12):
        store.append("before", turn)
    with FakeOpenAIServer(responder=SummarizerResponder(), latency=3.0) as llm:
        env = worker_env(broker_url=broker_url, redis_url=store_url, key_prefix=key_prefix,
                         summarizer="openai", summarizer_base_url=llm.base_url,
                         summarizer_api_key="k", summarizer_timeout="20")
        worker = WorkerProcess("restart" + secrets.token_hex(3), env).start()
        app = publisher_app(broker_url)
        try:
            app.send_task(TASK_COMPACT, args=["before"], queue=QUEUE,
                          kwargs={"tenant": "default", "force": True, "keep_recent": 2000})
            assert wait_for(lambda: len(llm.requests) >= 1, 20), worker.log()[-3000:]
            server.restart()  # mid-job (its data is gone: the server keeps none)
            time.sleep(2)
            assert worker.process is not None and worker.process.poll() is None, (
                worker.log()[-3000:])
            for turn in demo_turns(12):
                store.append("after", turn)
            app.send_task(TASK_COMPACT, args=["after"], queue=QUEUE,
                          kwargs={"tenant": "default", "force": True, "keep_recent": 2000})
            assert wait_for(lambda: store.state("after").watermark > 0, 60), (
                worker.log()[-3000:])
            assert "Unrecoverable error" not in worker.log()
        finally:
            worker.stop()
            app.close()
            server.remove()


def test_one_client_per_pool_and_a_new_one_after_a_reconnect(channel: Channel) -> None:
    first = acquire(channel)
    assert acquire(channel) is first
    assert first.connection_pool is channel.pool
    assert first.ping()
    old_pool = channel.pool

    channel._disconnect_pools()  # what a reconnect, a close and a fork do
    second = acquire(channel)
    assert second is not first
    assert second.connection_pool is channel.pool is not old_pool
    assert second.ping()
    assert acquire(channel) is second

    channel._pool = None  # the pool replaced without going through _disconnect_pools
    third = acquire(channel)
    assert third is not second and third.connection_pool is channel.pool


def test_a_given_client_and_the_event_loop_clients_are_never_the_shared_one(
        channel: Channel, real_redis: redis.Redis) -> None:
    assert acquire(channel, real_redis) is real_redis
    shared = acquire(channel)
    assert channel.client is not shared  # BRPOP client, on the asynchronous pool
    assert channel.client.connection_pool is not shared.connection_pool
    assert channel.subclient.connection_pool is channel.async_pool


_ops = st.lists(st.sampled_from(["use", "disconnect", "drop_pool", "given"]), max_size=30)


@settings(max_examples=60, deadline=None)
@given(ops=_ops)
def test_the_shared_client_always_belongs_to_the_current_pool(redis_url: str,
                                                             ops: list[str]) -> None:
    """Any interleaving of uses and pool changes: same client until the pool changes,
    then a new one on the new pool; a client passed in is returned untouched."""
    conn, chan = open_channel(redis_url)
    try:
        previous: Any = None
        pool_changed = True
        for op in ops:
            if op == "disconnect":
                chan._disconnect_pools()
                pool_changed = True
            elif op == "drop_pool":
                chan._pool = None
                pool_changed = True
            elif op == "given":
                marker = object()
                assert acquire(chan, marker) is marker
            else:
                client = acquire(chan)
                assert client.connection_pool is chan.pool
                assert (client is previous) != pool_changed
                previous, pool_changed = client, False
    finally:
        conn.release()


def test_threads_share_one_client_and_every_command_lands(redis_url: str,
                                                         real_redis: redis.Redis,
                                                         key_prefix: str) -> None:
    # The connection limit is the pool's (kombu's default: 10), shared or not.
    conn, channel = open_channel(redis_url, global_keyprefix=f"{key_prefix}:",
                                 max_connections=16)
    seen: set[int] = set()
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            for i in range(200):
                with channel.conn_or_acquire() as client:
                    seen.add(id(client))
                    client.rpush("threads", f"{n}:{i}")
                    with client.pipeline() as pipe:  # kombu's QoS.append shape
                        pipe.zadd("index", {f"{n}:{i}": i}).hset("table", f"{n}:{i}", n)
                        pipe.execute()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    conn.release()
    assert not errors, errors
    assert len(seen) == 1
    assert real_redis.llen(f"{key_prefix}:threads") == 16 * 200
    assert real_redis.zcard(f"{key_prefix}:index") == 16 * 200
    assert real_redis.hlen(f"{key_prefix}:table") == 16 * 200


def test_threads_meeting_a_new_pool_build_exactly_one_client(channel: Channel) -> None:
    """The race behind the one-in-three failure above: every thread finds the slot
    empty (first use, or after a pool change) at once; one builds, the rest wait."""
    built: list[Any] = []
    create = channel._create_client

    def slow_create(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.02)  # widen the window in which a second thread could build
        client = create(*args, **kwargs)  # type: ignore[no-untyped-call]
        built.append(client)
        return client

    channel._create_client = slow_create  # type: ignore[method-assign]
    for _ in range(3):
        channel._disconnect_pools()  # what a reconnect, a close and a fork do
        built.clear()
        barrier = threading.Barrier(16)
        seen: list[Any] = []

        def work(barrier: threading.Barrier, seen: list[Any]) -> None:
            barrier.wait()
            seen.append(acquire(channel))

        threads = [threading.Thread(target=work, args=(barrier, seen)) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(built) == 1, f"{len(built)} clients built for one pool"
        assert {id(c) for c in seen} == {id(built[0])}
        assert built[0].connection_pool is channel.pool


def test_global_keyprefix_is_kept(channel: Channel, real_redis: redis.Redis,
                                  key_prefix: str) -> None:
    client = acquire(channel)
    assert isinstance(client, PrefixedStrictRedis)
    assert client.global_keyprefix == f"{key_prefix}:"
    exchange: Any = Exchange("jobs")  # type: ignore[no-untyped-call]
    queue: Any = Queue("jobs", exchange, routing_key="jobs")  # type: ignore[no-untyped-call]
    producer: Any = Producer(channel)  # type: ignore[no-untyped-call]
    producer.publish({"n": 1}, exchange=exchange, routing_key="jobs", declare=[queue],
                     serializer="json")
    assert real_redis.llen(f"{key_prefix}:jobs") == 1
    assert real_redis.llen("jobs") == 0


class CountingProvider(CredentialProvider):
    """No credentials (the test Redis has no password), but counts each handshake."""

    def __init__(self) -> None:
        self.calls = 0

    def get_credentials(self) -> tuple[str] | tuple[str, str]:
        self.calls += 1
        return ()  # type: ignore[return-value]  # redis-py skips AUTH on an empty tuple


def test_credential_provider_is_kept(redis_url: str) -> None:
    provider = CountingProvider()
    conn = connection(redis_url, transport=TRANSPORT, credential_provider=provider)
    try:
        chan = conn.channel()
        client = acquire(chan)
        assert client.connection_pool.connection_kwargs["credential_provider"] is provider
        before = provider.calls
        chan._disconnect_pools()
        assert acquire(chan).ping()  # a new pool, a new connection: a new handshake
        assert provider.calls > before
    finally:
        conn.release()


class StreamingProvider(StreamingCredentialProvider):
    """A token provider (no token: the test Redis has no password) counting re-auth hooks."""

    def __init__(self) -> None:
        self.hooks = 0

    def get_credentials(self) -> tuple[str] | tuple[str, str]:
        return ()  # type: ignore[return-value]

    def on_next(self, callback: Any) -> None:
        self.hooks += 1

    def on_error(self, callback: Any) -> None:
        pass

    def is_streaming(self) -> bool:
        return True


@pytest.mark.parametrize("transport", [None, TRANSPORT])
def test_a_streaming_provider_gets_one_reauth_hook_per_pool_not_per_command(
        redis_url: str, transport: str | None) -> None:
    provider = StreamingProvider()
    conn = connection(redis_url, transport=transport, credential_provider=provider)
    try:
        chan = conn.channel()  # its BRPOP client: one hook on the asynchronous pool
        before = provider.hooks
        for _ in range(5):
            assert acquire(chan).ping()
        added = provider.hooks - before
        assert added == (5 if transport is None else 1)  # kombu's: one per command
    finally:
        conn.release()


# ------------------------------------------------- a real worker on this transport

def _messages(turns: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(turns):
        out.append({"role": "user", "content": f"Turn {i}: why does reserve() double-count "
                    f"item {i}? " * 4})
        out.append({"role": "assistant", "content": f"Turn {i}: the retry fires twice; key "
                    f"it by order id to fix item {i}. " * 4})
    return out


class EventLog:
    """Task events as Flower receives them: an EventReceiver on the broker, in a thread."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self.events: list[dict[str, Any]] = []
        self.receiver: Any = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with self.app.connection() as conn:
            self.receiver = self.app.events.Receiver(conn, handlers={"*": self.events.append})
            self.receiver.capture(limit=None, timeout=None, wakeup=False)

    def close(self) -> None:
        if self.receiver is not None:
            self.receiver.should_stop = True
        self.thread.join(timeout=5)

    def of(self, task_id: str) -> set[str]:
        return {e["type"] for e in list(self.events) if e.get("uuid") == task_id}

    def wait_for(self, predicate: Any, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.1)
        return False


@pytest.mark.celery
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_worker_on_this_transport_runs_jobs_acks_them_and_sends_events(
        own_redis_url: str, key_prefix: str) -> None:
    broker_url, store_url = with_db(own_redis_url, 12), with_db(own_redis_url, 11)
    purge_queue(broker_url)
    store_client = redis.Redis.from_url(store_url, socket_timeout=5)
    broker_client = redis.Redis.from_url(broker_url, socket_timeout=5)
    store = SessionStore(store_client, StoreConfig(key_prefix=key_prefix))
    sessions = {"long": 30, "short": 2}
    for session_id, turns in sessions.items():
        store.append(session_id, _messages(turns))
    env = worker_env(broker_url=broker_url, redis_url=store_url, key_prefix=key_prefix,
                     summarizer="offline", message_threshold="20",
                     keep_recent_tokens="200")
    name = "broker" + secrets.token_hex(3)
    worker = WorkerProcess(name, env)
    # Flower's side: the stock transport (the message format is the same).
    observer = Celery("observer", broker=broker_url, set_as_current=False)
    assert worker_transport(broker_url) == TRANSPORT
    events = EventLog(observer)
    try:
        events.thread.start()
        worker.start()
        # The banner prints what the stock transport prints, not a class path.
        assert f"transport:   {connection(broker_url).as_uri()}" in worker.log()
        node = f"{name}@{socket.gethostname()}"
        # Events are pub/sub: a heartbeat received proves the receiver is subscribed.
        assert events.wait_for(lambda: any(
            e["type"] == "worker-heartbeat" and e["hostname"] == node
            for e in list(events.events)), 15), worker.log()[-3000:]
        conf = observer.control.inspect([node], timeout=5).conf() or {}
        assert conf[node]["broker_transport"] == TRANSPORT  # the worker really uses it

        ids = {observer.send_task(TASK_MAYBE_SUMMARIZE, args=[session_id],
                                  kwargs={"tenant": "default"}, queue=QUEUE).id: session_id
               for session_id in sessions}
        wanted = {"task-received", "task-started", "task-succeeded"}
        events.wait_for(lambda: all(wanted <= events.of(tid) for tid in ids), 30)
        for tid in ids:
            assert wanted <= events.of(tid), (events.of(tid), worker.log()[-3000:])
        assert store.state("long").watermark > 0  # the job really ran
        # Acked through the shared client: kombu's unacked bookkeeping is empty again.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and broker_client.hlen("unacked"):
            time.sleep(0.1)
        assert broker_client.hlen("unacked") == 0
        assert broker_client.zcard("unacked_index") == 0
    finally:
        worker.stop()
        events.close()
        observer.close()
        purge_queue(broker_url)
        for key in store_client.scan_iter(match=f"{key_prefix}:*", count=1000):
            store_client.delete(key)
        store_client.close()
        broker_client.close()
