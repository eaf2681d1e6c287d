"""The enqueue client: the lean Redis publish is the message ``send_task`` writes.

Unit level (the machine's Redis, a queue name of the test's own): the lean
message equals ``send_task``'s byte for byte once the random ids are set
aside (hypothesis over session ids and tenants); the apps it must leave to
``send_task``; threads sharing one enqueuer lose no job; a broker that
refuses or never answers raises kombu's ``OperationalError`` within the
retry policy's bound, and ``record_turn`` keeps the turn and clears the
pending flag. When the broker is the store's Redis server, the append script
pushes that same message itself (once, even when retried; never into a key
of the wrong type). End to end: a real Celery worker (threads pool) and
Flower, as subprocesses on a redis-server of this module's own, run and list
a job the append pushed the lean way.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import fakeredis
import httpx
import pytest
import redis
from celery import Celery, signals
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kombu.entity import Exchange, Queue
from kombu.exceptions import OperationalError

from shared.core.config import CompactionPolicy, StoreConfig
from shared.core.records import InlineJob
from shared.enqueue import (
    QUEUE,
    TASK_MAYBE_SUMMARIZE,
    CeleryEnqueuer,
    RedisTaskPublisher,
    publisher_app,
    redis_server,
)
from shared.guard import ContextGuard
from shared.store import commands
from shared.store.sessions import SessionStore
from tests.guard_shells import SHELLS, make
from workers.flower_entry import ENV_VAR
from workers.harness.stack.redis_server import free_port, start_server
from workers.harness.stack.worker_process import WorkerProcess, worker_env

ROOT = Path(__file__).resolve().parents[1]


# -- helpers -----------------------------------------------------------------------------
@pytest.fixture
def queue(redis_url: str, key_prefix: str) -> Iterator[str]:
    """A queue name of this test's own on the machine's Redis, deleted afterwards."""
    name = f"{key_prefix}:queue"
    yield name
    client = redis.Redis.from_url(redis_url)
    client.delete(name)
    for key in client.scan_iter(match=f"_kombu.binding.{name}*"):
        client.delete(key)
    client.close()


def pop_all(url: str, queue: str) -> list[bytes]:
    """Every message in ``queue``, oldest first (consumers BRPOP: the right end is oldest)."""
    client = redis.Redis.from_url(url)
    out: list[bytes] = []
    while (raw := client.rpop(queue)) is not None:
        assert isinstance(raw, bytes)
        out.append(raw)
    client.close()
    return out


def ids_set_aside(raw: bytes) -> tuple[bytes, dict[str, Any]]:
    """The message with its task id and delivery tag replaced, and the decoded message."""
    message = json.loads(raw)
    task_id, tag = message["headers"]["id"], message["properties"]["delivery_tag"]
    normal = raw.replace(task_id.encode(), b"TASK-ID").replace(tag.encode(), b"TAG")
    return normal, message


def body_of(message: dict[str, Any]) -> list[Any]:
    decoded: list[Any] = json.loads(base64.b64decode(message["body"]))
    return decoded


def send_both(url: str, queue: str, tenant: str, session_id: str) -> tuple[bytes, bytes]:
    """(send_task's message, the lean one) for the same job."""
    app = publisher_app(url)
    CeleryEnqueuer(app, queue=queue, lean=False).enqueue(tenant, session_id)
    lean = CeleryEnqueuer(app, queue=queue)
    assert lean.publisher is not None
    lean.enqueue(tenant, session_id)
    lean.close()
    reference, ours = pop_all(url, queue)
    return reference, ours


# -- the message -------------------------------------------------------------------------
def test_lean_message_is_send_tasks_message(redis_url: str, queue: str) -> None:
    reference, ours = send_both(redis_url, queue, "acme", "session-1")
    (ref_bytes, ref), (our_bytes, mine) = ids_set_aside(reference), ids_set_aside(ours)
    assert our_bytes == ref_bytes
    assert mine["headers"]["task"] == TASK_MAYBE_SUMMARIZE
    assert mine["headers"]["id"] == mine["headers"]["root_id"] \
        == mine["properties"]["correlation_id"]
    assert mine["headers"]["id"] != ref["headers"]["id"]
    assert mine["properties"]["delivery_tag"] != mine["headers"]["id"]
    assert mine["properties"]["delivery_info"] == {"exchange": "", "routing_key": queue}
    assert mine["headers"]["argsrepr"] == "['session-1']"
    assert mine["headers"]["kwargsrepr"] == "{'tenant': 'acme'}"
    assert body_of(mine)[:2] == [["session-1"], {"tenant": "acme"}]


_ids = st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=40)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tenant=_ids, session_id=_ids)
def test_lean_message_matches_send_task_for_any_ids(redis_url: str, queue: str, tenant: str,
                                                    session_id: str) -> None:
    reference, ours = send_both(redis_url, queue, tenant, session_id)
    ref_bytes, _ = ids_set_aside(reference)
    our_bytes, mine = ids_set_aside(ours)
    assert our_bytes == ref_bytes
    assert body_of(mine)[:2] == [[session_id], {"tenant": tenant}]


def test_global_keyprefix_is_applied_like_kombu(redis_url: str, queue: str) -> None:
    app = publisher_app(redis_url)
    app.conf.broker_transport_options = {**app.conf.broker_transport_options,
                                         "global_keyprefix": "pfx:"}
    publisher = RedisTaskPublisher.for_app(app, queue)
    assert publisher is not None and publisher.key == f"pfx:{queue}"
    publisher.publish(TASK_MAYBE_SUMMARIZE, ["s"], {"tenant": "t"})
    try:
        assert len(pop_all(redis_url, f"pfx:{queue}")) == 1
    finally:
        publisher.close()


@pytest.mark.parametrize(("url", "conf"), [
    ("amqp://guest@localhost//", {}),
    ("memory://", {}),
    ("redis://a:6379/0;redis://b:6379/0", {}),
    ("sentinel://localhost:26379", {}),
    ("redis://localhost:6379/0", {"task_send_sent_event": True}),
    ("redis://localhost:6379/0", {"task_compression": "gzip"}),
    ("redis://localhost:6379/0", {"task_serializer": "pickle"}),
    ("redis://localhost:6379/0", {"task_protocol": 1}),
    ("redis://localhost:6379/0", {"broker_use_ssl": {"ssl_cert_reqs": "required"}}),
    ("redis://localhost:6379/0", {"broker_transport_options": {"priority_steps": [1, 5]}}),
    ("redis://localhost:6379/0", {"task_create_missing_queues": False}),
    ("redis://localhost:6379/0", {"task_routes": {"compaction.*": {"priority": 5}}}),
    ("redis://localhost:6379/0",
     {"task_queues": [Queue(QUEUE, Exchange(QUEUE, "topic"))]}),  # type: ignore[no-untyped-call]
])
def test_apps_that_need_send_task_get_it(url: str, conf: dict[str, Any]) -> None:
    app = Celery("t", broker=url, set_as_current=False)
    app.conf.update(conf)
    assert RedisTaskPublisher.for_app(app, QUEUE) is None
    assert CeleryEnqueuer(app).publisher is None


# Our worker's own task, imported by an earlier test of this process, is shared into every
# app finalized after it: the two registrations of one name are this test's point.
@pytest.mark.filterwarnings("ignore:Task name 'compaction.maybe_summarize' is already registered")
def test_an_app_that_registers_our_task_uses_send_task(redis_url: str, queue: str) -> None:
    """Its task options would apply in send_task, so send_task it is (checked per job)."""
    app = publisher_app(redis_url)
    enqueuer = CeleryEnqueuer(app, queue=queue)
    sent: list[tuple[Any, ...]] = []
    app.send_task = lambda *args, **kwargs: sent.append((args, kwargs))
    enqueuer.enqueue("t", "lean")

    def maybe_summarize(session_id: str, tenant: str) -> None:
        return None

    # not shared: apps that later tests make must not get this stand-in
    app.task(name=TASK_MAYBE_SUMMARIZE, shared=False)(maybe_summarize)
    app.finalize()
    enqueuer.enqueue("t", "registered")
    enqueuer.close()
    assert [body_of(json.loads(m))[0] for m in pop_all(redis_url, queue)] == [["lean"]]
    assert [kwargs["args"] for _, kwargs in sent] == [["registered"]]


def test_lean_false_and_empty_queue() -> None:
    app = publisher_app("redis://localhost:6379/0")
    assert CeleryEnqueuer(app, lean=False).publisher is None
    assert CeleryEnqueuer(app).publisher is not None
    with pytest.raises(ValueError, match="queue"):
        RedisTaskPublisher(app, "", "redis://localhost:6379/0")


def test_publish_signal_listeners_get_send_task(redis_url: str, queue: str) -> None:
    """Tracing hooks add headers in before_task_publish: only send_task fires it."""
    seen: list[str] = []

    def listener(sender: str | None = None, **_: Any) -> None:
        seen.append(str(sender))

    enqueuer = CeleryEnqueuer(publisher_app(redis_url), queue=queue)
    signals.before_task_publish.connect(listener, weak=False)
    try:
        enqueuer.enqueue("t", "s")
    finally:
        signals.before_task_publish.disconnect(listener)
    enqueuer.enqueue("t", "s2")
    enqueuer.close()
    assert seen == [TASK_MAYBE_SUMMARIZE]
    assert [body_of(json.loads(m))[0] for m in pop_all(redis_url, queue)] == [["s"], ["s2"]]


# -- threads -----------------------------------------------------------------------------
def test_threads_sharing_one_enqueuer_lose_no_job(redis_url: str, queue: str) -> None:
    enqueuer = CeleryEnqueuer(publisher_app(redis_url), queue=queue)
    threads_n, per_thread = 16, 40
    errors: list[BaseException] = []
    start = threading.Barrier(threads_n)

    def agent(n: int) -> None:
        try:
            start.wait()
            for i in range(per_thread):
                enqueuer.enqueue(f"tenant-{n}", f"s-{n}-{i}")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    workers = [threading.Thread(target=agent, args=(n,)) for n in range(threads_n)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    enqueuer.close()
    assert not errors, errors
    messages = [json.loads(raw) for raw in pop_all(redis_url, queue)]
    jobs = {(body_of(m)[1]["tenant"], body_of(m)[0][0]) for m in messages}
    assert jobs == {(f"tenant-{n}", f"s-{n}-{i}")
                    for n in range(threads_n) for i in range(per_thread)}
    assert len(messages) == threads_n * per_thread
    assert len({m["headers"]["id"] for m in messages}) == len(messages)
    assert len({m["properties"]["delivery_tag"] for m in messages}) == len(messages)


# -- broker down -------------------------------------------------------------------------
class SilentServer:
    """Accepts TCP connections and never answers: a hung broker."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"redis://127.0.0.1:{self.sock.getsockname()[1]}/0"

    def close(self) -> None:
        self.sock.close()


def timed_failure(enqueuer: CeleryEnqueuer) -> tuple[float, BaseException]:
    started = time.monotonic()
    with pytest.raises(OperationalError) as info:
        enqueuer.enqueue("t", "s")
    return time.monotonic() - started, info.value


def test_refused_broker_raises_operational_error_at_once() -> None:
    with closing(socket.socket()) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    enqueuer = CeleryEnqueuer(publisher_app(f"redis://127.0.0.1:{port}/0", timeout=2.0))
    elapsed, error = timed_failure(enqueuer)
    # One retry after 0.1 s (publisher_app's policy); refusals are immediate.
    assert 0.1 <= elapsed < 1.0, elapsed
    assert "unreachable" in str(error)


def test_hung_broker_raises_within_the_policy_bound() -> None:
    server = SilentServer()
    timeout = 0.3
    try:
        enqueuer = CeleryEnqueuer(publisher_app(server.url, timeout=timeout))
        elapsed, error = timed_failure(enqueuer)
    finally:
        server.close()
    bound = 2 * timeout + 0.1  # two attempts, one pause
    assert bound - 0.05 <= elapsed < bound + 0.5, elapsed
    assert isinstance(error.__cause__, redis.TimeoutError)


def test_record_turn_keeps_the_turn_when_the_broker_is_down(real_redis: redis.Redis,
                                                            key_prefix: str) -> None:
    store = SessionStore(real_redis, StoreConfig(key_prefix=key_prefix))
    guard = ContextGuard(store, CeleryEnqueuer(
        publisher_app(f"redis://127.0.0.1:{free_port()}/0", timeout=0.5)))
    turn = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    started = time.monotonic()
    assert guard.record_turn("s", turn) == 2
    assert time.monotonic() - started < 1.0
    assert store.length("s") == 2
    assert not store.is_pending("s"), "a failed publish clears the flag for the next turn"


# -- the job inside the append (broker on the store's Redis server) ----------------------
def _broker_url(redis_url: str) -> str:
    """Another database of the same server: the default layout (store 0, broker 1)."""
    base, _, db = redis_url.rpartition("/")
    return f"{base}/{(int(db or 0) + 1) % 16}"


@pytest.fixture
def broker_queue(redis_url: str, key_prefix: str) -> Iterator[tuple[str, str]]:
    url = _broker_url(redis_url)
    name = f"{key_prefix}:queue"
    yield url, name
    client = redis.Redis.from_url(url)
    client.delete(name)
    client.close()


def _unused(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("the job should have gone inside the append")


@pytest.mark.parametrize("shell", SHELLS)
def test_record_turn_pushes_the_job_inside_the_append(real_redis: redis.Redis, key_prefix: str,
                                                      broker_queue: tuple[str, str],
                                                      shell: str) -> None:
    url, name = broker_queue
    store = SessionStore(real_redis, StoreConfig(key_prefix=key_prefix))
    enqueuer = CeleryEnqueuer(publisher_app(url), queue=name)
    assert enqueuer.publisher is not None
    enqueuer.publisher.client.lpush = _unused  # type: ignore[method-assign]
    guard = make(shell, store, enqueuer)
    turn = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert guard.record_turn("s", turn) == 2
    assert guard.record_turn("s", turn) == 4  # the flag is set: no second job
    (raw,) = pop_all(url, name)
    ours, message = ids_set_aside(raw)
    reference, _ = ids_set_aside(enqueuer.publisher.message(
        TASK_MAYBE_SUMMARIZE, ["s"], {"tenant": store.tenant})[1])
    assert ours == reference, "the very message the lean publisher writes"
    assert body_of(message)[:2] == [["s"], {"tenant": store.tenant}]
    assert store.is_pending("s")
    store.clear_pending("s")  # a worker took the job
    guard.prepare("s")  # the guard sees the flag cleared, as before its next append
    guard.record_turn("s", turn)
    assert len(pop_all(url, name)) == 1
    assert real_redis.ttl(name) == -2 and redis.Redis.from_url(url).ttl(name) == -2, \
        "the queue gets no TTL from the session's"
    enqueuer.close()


@pytest.mark.parametrize("shell", SHELLS)
def test_a_prepare_that_wants_a_job_pushes_it_with_the_flag(
        real_redis: redis.Redis, key_prefix: str, broker_queue: tuple[str, str],
        shell: str) -> None:
    """Over the trigger, the prepare's own round trip sets the flag and pushes the job
    (pending.lua), as record_turn's append does."""
    from tests.test_guard import SYSTEM, coding_turn

    url, name = broker_queue
    store = SessionStore(real_redis, StoreConfig(key_prefix=key_prefix))
    for i in range(12):
        store.append("s", coding_turn(i, 2000))
    enqueuer = CeleryEnqueuer(publisher_app(url), queue=name)
    assert enqueuer.publisher is not None
    enqueuer.publisher.client.lpush = _unused  # type: ignore[method-assign]
    tokens = store.range_tokens("s", 0, store.length("s"))
    no_cheap = CompactionPolicy(clear_keep_recent_turns=100, clear_tool_outputs_over_tokens=10**9)
    guard = make(shell, store, enqueuer, overrides={"m": int(tokens / 0.9) + 500},
                 policy=no_cheap)
    guard.prepare("s", SYSTEM, max_tokens=500, model="m")  # warm: the own connection is up
    store.clear_pending("s")
    pop_all(url, name)
    view = guard.prepare("s", SYSTEM, max_tokens=500, model="m")
    assert view.report.budget.should_compact and view.report.enqueued
    (raw,) = pop_all(url, name)
    ours, _ = ids_set_aside(raw)
    reference, _ = ids_set_aside(enqueuer.publisher.message(
        TASK_MAYBE_SUMMARIZE, ["s"], {"tenant": store.tenant})[1])
    assert ours == reference and store.is_pending("s")
    assert not guard.prepare("s", SYSTEM, max_tokens=500, model="m").report.enqueued
    assert pop_all(url, name) == [], "the flag coalesces: no second job"
    enqueuer.close()


def _job_append(store: SessionStore, job: InlineJob, request_id: str) -> Any:
    encoded = commands.encode([{"role": "user", "content": "hi"}], store.config, store.counter)
    return store.append_encoded("s", encoded, request_id=request_id, mark_pending=True, job=job)


def test_a_retried_append_pushes_its_job_once(real_redis: redis.Redis, key_prefix: str,
                                              broker_queue: tuple[str, str]) -> None:
    url, name = broker_queue
    store = SessionStore(real_redis, StoreConfig(key_prefix=key_prefix))
    db = int(url.rpartition("/")[2])
    job = InlineJob(name, b"job", db, int(real_redis.connection_pool.connection_kwargs["db"]))
    first = _job_append(store, job, "req-1")
    again = _job_append(store, job, "req-1")
    assert first.published and first.marked and not first.duplicate
    assert again.duplicate and again.published, "its caller must not publish again"
    assert pop_all(url, name) == [b"job"]
    assert store.length("s") == 1


def test_a_queue_of_the_wrong_type_leaves_the_job_to_the_caller(
        real_redis: redis.Redis, key_prefix: str, broker_queue: tuple[str, str]) -> None:
    url, name = broker_queue
    broker = redis.Redis.from_url(url)
    broker.set(name, "not a list")
    store = SessionStore(real_redis, StoreConfig(key_prefix=key_prefix))
    job = InlineJob(name, b"job", int(url.rpartition("/")[2]),
                    int(real_redis.connection_pool.connection_kwargs["db"]))
    result = _job_append(store, job, "req-2")
    assert result.marked and not result.published
    assert store.length("s") == 1, "the turn is stored all the same"
    assert broker.get(name) == b"not a list"
    broker.close()


def test_no_inline_job_for_another_server_or_a_fake(real_redis: redis.Redis,
                                                    broker_queue: tuple[str, str]) -> None:
    url, name = broker_queue
    enqueuer = CeleryEnqueuer(publisher_app(url), queue=name)
    here = redis_server(real_redis)
    assert here is not None
    assert enqueuer.inline_job("t", "s", here) is not None
    assert enqueuer.inline_job("t", "s", ("elsewhere", 6379, None, 0)) is None
    assert enqueuer.inline_job("t", "s", None) is None
    assert redis_server(fakeredis.FakeRedis()) is None
    assert CeleryEnqueuer(publisher_app(url), queue=name, lean=False).inline_job(
        "t", "s", here) is None
    enqueuer.close()


# -- a real worker and Flower ------------------------------------------------------------
def _wait(what: str, probe: Callable[[], Any], timeout: float, logs: Callable[[], str]) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = probe()
        except (httpx.HTTPError, ValueError, KeyError):
            value = None
        if value:
            return value
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}\n{logs()}")


@pytest.mark.celery
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_real_worker_runs_the_lean_job_and_flower_lists_it(tmp_path: Path) -> None:
    server = start_server()
    base = server.url.rsplit("/", 1)[0]
    broker_url, store_url = f"{base}/1", f"{base}/2"
    prefix = "te" + secrets.token_hex(4)
    user, password = "ops", secrets.token_urlsafe(12)
    port = free_port()
    node = f"lean@{socket.gethostname()}"
    env = worker_env(broker_url=broker_url, redis_url=store_url, key_prefix=prefix,
                     summarizer="offline", message_threshold="20",
                     keep_recent_tokens="200")
    worker = WorkerProcess("lean", env)
    flower_log = tmp_path / "flower.log"
    flower: subprocess.Popen[bytes] | None = None

    def logs() -> str:
        flower_text = flower_log.read_text(errors="replace") if flower_log.exists() else ""
        return f"--- worker\n{worker.log()[-4000:]}\n--- flower\n{flower_text[-3000:]}"

    store_client = redis.Redis.from_url(store_url, socket_timeout=5)
    store = SessionStore(store_client, StoreConfig(key_prefix=prefix))
    enqueuer = CeleryEnqueuer(publisher_app(broker_url))
    assert enqueuer.publisher is not None, "this test is about the lean path"
    # broker and store share the server: the append script pushes the job itself
    enqueuer.publisher.client.lpush = _unused  # type: ignore[method-assign]
    try:
        worker.start()
        flower_env = {k: v for k, v in os.environ.items()
                      if not k.startswith(("COMPACTION_", "FLOWER_"))}
        flower_env.update(env)
        flower_env[ENV_VAR] = f"{user}:{password}"
        with flower_log.open("wb") as out:
            flower = subprocess.Popen(
                [sys.executable, "-m", "workers.flower_entry", f"--port={port}",
                 "--address=127.0.0.1"], cwd=ROOT, env=flower_env, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True)
        http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5,
                            auth=httpx.BasicAuth(user, password))
        # Events are pub/sub: wait until Flower hears the worker, or it misses the job.
        _wait("the worker online in Flower", lambda: http.get(
            "/api/workers", params={"status": 1}).json().get(node), 60, logs)

        guard = ContextGuard(store, enqueuer)
        turns = [[{"role": "user", "content": f"Turn {i}: why does reserve() double-count "
                   f"item {i}? " * 4},
                  {"role": "assistant", "content": f"Turn {i}: the retry fires twice; guard "
                   f"it with the order id for item {i}. " * 4}] for i in range(30)]
        for turn in turns[:-1]:
            store.append("long", turn)
        guard.record_turn("long", turns[-1])  # marks pending and publishes the lean way

        def finished() -> dict[str, Any] | None:
            tasks: dict[str, Any] = http.get("/api/tasks").json()
            mine = [t for t in tasks.values() if t.get("name") == TASK_MAYBE_SUMMARIZE]
            return mine[0] if mine and mine[0]["state"] in {"SUCCESS", "FAILURE"} else None

        task = _wait("the lean job to finish in Flower", finished, 60, logs)
        assert task["state"] == "SUCCESS", (task, logs())
        assert task["worker"] == node
        assert task["args"] == "['long']" and task["kwargs"] == "{'tenant': 'default'}"
        assert "'status': 'compacted'" in task["result"], task
        assert store.state("long").watermark > 0, "the job really ran"
        assert not store.is_pending("long")
        assert f"{TASK_MAYBE_SUMMARIZE}[{task['uuid']}] succeeded" in worker.log()
        http.close()
    finally:
        enqueuer.close()
        if flower is not None and flower.poll() is None:
            os.killpg(flower.pid, 15)
            try:
                flower.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(flower.pid, 9)
                flower.wait(timeout=10)
        worker.stop()
        store_client.close()
        server.stop()
