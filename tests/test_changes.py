"""The change feed (client tracking): a warm guard skips its read only while nothing of
the session was written, by anyone, and falls back to reading when it cannot vouch."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest
import redis

import shared.store.changes as changes_module
from shared.core.config import StoreConfig
from shared.core.errors import InvalidInput
from shared.core.records import SummaryRecord
from shared.core.view import ViewCache
from shared.enqueue import CallbackEnqueuer, CeleryEnqueuer, publisher_app
from shared.store.changes import ChangeFeed, feed_for, session_base
from shared.store.own_writes import OwnState
from shared.store.recall_index import index_compacted
from shared.store.sessions import SessionStore
from tests.guard_shells import SHELLS, make

SYSTEM = "be brief"


@pytest.fixture(params=SHELLS)
def shell(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def real_store(real_redis: redis.Redis, key_prefix: str) -> SessionStore:
    return SessionStore(real_redis, StoreConfig(key_prefix=key_prefix))


def reads(guard: Any) -> list[str]:
    """Session ids the guard's store is asked to read, from now on."""
    seen: list[str] = []
    store = guard.inner.store if hasattr(guard, "inner") else guard.store
    real = store.read_view

    def spy(session_id: str, *args: Any, **kwargs: Any) -> Any:
        seen.append(session_id)
        return real(session_id, *args, **kwargs)

    store.read_view = spy
    return seen


def test_an_unchanged_session_is_not_read_again(real_store: SessionStore, shell: str) -> None:
    real_store.append("s", [{"role": "user", "content": "hello"}])
    guard = make(shell, real_store, overrides={"m": 100_000})
    assert guard.feed is not None
    guard.prepare("s", SYSTEM, model="m")  # writes the request's figures: read once more
    first = guard.prepare("s", SYSTEM, model="m")
    seen = reads(guard)
    for k in range(5):  # a tool chain: the pending turn grows, the store does not
        view = guard.prepare("s", SYSTEM, model="m",
                             pending=[{"role": "user", "content": f"step {k}"}])
        assert [m.content for m in view.messages][:2] == [m.content for m in first.messages]
    assert seen == []


def test_writes_by_anyone_are_seen_by_the_next_call(real_store: SessionStore,
                                                     redis_url: str, key_prefix: str,
                                                     shell: str) -> None:
    """Another client's append, a worker's summary, an edit and a flush of the session's
    keys: each is in the very next prepare (Redis sends the push before the writer's reply)."""
    other = SessionStore(redis.Redis.from_url(redis_url), StoreConfig(key_prefix=key_prefix))
    real_store.append("s", [{"role": "user", "content": "one"},
                            {"role": "assistant", "content": "two"}])
    guard = make(shell, real_store, overrides={"m": 100_000})
    guard.prepare("s", SYSTEM, model="m")
    for k in range(20):
        other.append("s", [{"role": "user", "content": f"u{k}"},
                           {"role": "assistant", "content": f"a{k}"}])
        assert guard.prepare("s", SYSTEM, model="m").messages[-1].content == f"a{k}"
    version = other.state("s").version
    assert other.commit_summary("s", SummaryRecord(watermark=30, kind="offline",
                                                   text="SUMMARY-TEXT", tokens=5), version).ok
    view = guard.prepare("s", SYSTEM, model="m")
    assert "SUMMARY-TEXT" in str(view.messages[0].content) and view.report.watermark == 30
    other.truncate_after("s", 34)
    assert guard.prepare("s", SYSTEM, model="m").report.length == 34
    other.delete_session("s")
    other.append("s", [{"role": "user", "content": "fresh start"}])
    assert [m.content for m in guard.prepare("s", "", model="m").messages] == ["fresh start"]
    other.redis.close()


@pytest.fixture
def handed_over(real_store: SessionStore, redis_url: str, key_prefix: str, shell: str,
                monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, SessionStore]]:
    """A warm guard on a session of two messages, and another process's store; from then
    on every push is still in flight, on both of the guard's connections."""
    other = SessionStore(redis.Redis.from_url(redis_url), StoreConfig(key_prefix=key_prefix))
    real_store.append("s", [{"role": "user", "content": "one"},
                            {"role": "assistant", "content": "two"}])
    guard = make(shell, real_store, overrides={"m": 100_000})
    for _ in range(2):
        guard.prepare("s", SYSTEM, model="m")
    monkeypatch.setattr(changes_module._Seen, "since",
                        lambda self, base, epoch, seq: changes_module.NOTHING)
    yield guard, other
    other.redis.close()


def test_a_turn_handed_over_is_in_the_view_before_its_push_arrives(
        handed_over: tuple[Any, SessionStore]) -> None:
    """Redis queues the push before the writer's reply, but on another connection: the
    reply can arrive first. A process handed a turn that another one recorded passes the
    length that append returned, and the view holds the turn; then the shortcut holds."""
    guard, other = handed_over
    length = other.append("s", [{"role": "user", "content": "three"},
                                {"role": "assistant", "content": "four"}])
    assert guard.prepare("s", SYSTEM, model="m").messages[-1].content == "two"  # the hazard
    view = guard.prepare("s", SYSTEM, model="m", min_length=length)
    assert [m.content for m in view.messages[-2:]] == ["three", "four"]
    seen = reads(guard)
    again = guard.prepare("s", SYSTEM, model="m", min_length=length)
    assert seen == [] and again.messages[-1].content == "four"


def test_a_recovery_handed_over_reads_the_turn_too(
        handed_over: tuple[Any, SessionStore]) -> None:
    guard, other = handed_over
    length = other.append("s", [{"role": "user", "content": "three"}])
    # the window the guard knows (nothing learned, nothing written); the refused view was
    # prepared where the turn was recorded, and its size comes along
    error = {"message": "This model's maximum context length is 100000 tokens. However, "
                        "your messages resulted in 120000 tokens.", "status_code": 400}
    refused = {"prepared_tokens": 50_000}
    stale = guard.recover("s", error, SYSTEM, model="m", **refused)
    assert stale is not None and stale.messages[-1].content == "two"  # the hazard
    view = guard.recover("s", error, SYSTEM, model="m", min_length=length, **refused)
    assert view is not None and view.messages[-1].content == "three"
    with pytest.raises(InvalidInput):
        guard.recover("s", error, SYSTEM, model="m", min_length=-2)


@pytest.mark.parametrize("bad", [-1, "4", 2.0, True])
def test_min_length_must_be_a_log_length(real_store: SessionStore, shell: str,
                                         bad: object) -> None:
    guard = make(shell, real_store, overrides={"m": 100_000})
    with pytest.raises(InvalidInput) as caught:
        guard.prepare("s", SYSTEM, model="m", min_length=bad)
    assert caught.value.field == "min_length"


def test_a_quiet_check_is_one_poll_and_misses_no_write(real_store: SessionStore,
                                                        redis_url: str, key_prefix: str,
                                                        shell: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """While nothing arrives, a check polls the socket and does not run redis-py's drain;
    a push that arrives is read at once (one read, not redis-py's drain either) and seen
    by the very next call."""
    other = SessionStore(redis.Redis.from_url(redis_url), StoreConfig(key_prefix=key_prefix))
    real_store.append("s", [{"role": "user", "content": "one"}])
    guard = make(shell, real_store, overrides={"m": 100_000})
    guard.prepare("s", SYSTEM, model="m")
    guard.prepare("s", SYSTEM, model="m")
    feed: ChangeFeed = guard.feed
    assert feed._pushes is not None and feed._pushes._poll is not None
    drains: list[int] = []
    real = feed._conn.can_read
    monkeypatch.setattr(feed._conn, "can_read", lambda t=0: drains.append(1) or real(t))
    seen = reads(guard)
    for _ in range(3):
        guard.prepare("s", SYSTEM, model="m")
    assert drains == [] and seen == []
    for k in range(3):
        other.append("s", [{"role": "assistant", "content": f"a{k}"}])
        assert guard.prepare("s", SYSTEM, model="m").messages[-1].content == f"a{k}"
    assert drains == [] and seen == ["s"] * 3
    other.redis.close()


def test_only_writes_to_keys_the_view_is_read_from_count(real_store: SessionStore,
                                                         real_redis: redis.Redis,
                                                         shell: str) -> None:
    """A worker's lease, the request ids, the recall index: written beside the view, they
    leave it as it was, so the next prepare does not read. A write to any key the view
    is read from does make it read."""
    real_store.append("s", [{"role": "user", "content": "hello"}])
    guard = make(shell, real_store, overrides={"m": 100_000})
    guard.prepare("s", SYSTEM, model="m")
    guard.prepare("s", SYSTEM, model="m")
    keys = real_store.keys("s")
    base = keys.log.rsplit(":", 1)[0]
    seen = reads(guard)
    real_redis.set(keys.lease, "worker-1", px=5000)
    real_redis.hset(keys.requests, "r1", "1:0:0")
    real_redis.hset(keys.summary_index, "1", "x")
    real_redis.sadd(f"{base}:recall:term:flight", "1")  # a recall term, ':' in its name
    with real_redis.pipeline() as pipe:  # several in one push
        pipe.set(keys.dirty, "1").set(keys.taken, "1").lpush(keys.request_order, "r1").execute()
    guard.prepare("s", SYSTEM, model="m")
    assert seen == []
    for key in keys.view_keys():
        if real_redis.exists(key):  # writes that change no value: still counted
            real_redis.expire(key, 3600)
        else:
            with real_redis.pipeline() as pipe:
                pipe.set(key, "x").delete(key).execute()
        guard.prepare("s", SYSTEM, model="m")
        if key == keys.pending:  # the job flag alone: see the next test
            assert seen == []
            continue
        assert len(seen) == 1, key
        seen.clear()
        guard.prepare("s", SYSTEM, model="m")  # the read's own figures write: read again
        seen.clear()


def test_the_recall_index_is_not_pushed_to_the_feed(real_store: SessionStore,
                                                   real_redis: redis.Redis,
                                                   shell: str) -> None:
    """An index batch writes a key per term (hundreds): outside the prefix the feed
    watches, none of them is pushed to any guard of the tenant."""
    real_store.append("s", [{"role": "user", "content": f"word{i} " * 3}
                            for i in range(50)])
    assert real_store.commit_summary("s", SummaryRecord(watermark=50, kind="truncation",
                                                        text="t", tokens=1), 0).ok
    guard = make(shell, real_store, overrides={"m": 100_000})
    guard.prepare("s", SYSTEM, model="m")
    guard.prepare("s", SYSTEM, model="m")
    seen = reads(guard)
    feed = guard.feed
    before = feed._seen.seq
    pushed: list[bytes] = []

    def spy(push: list[Any]) -> None:
        pushed.extend(push[1] or [])
        feed._seen.invalidated(push)

    feed._conn._parser.set_invalidation_push_handler(spy)
    report = index_compacted(real_store, "s")
    assert report.messages == 50 and report.terms >= 50
    real_redis.set(real_store.keys("s").lease, "w", px=5000)  # a push after the batch's
    deadline = time.monotonic() + 2
    while not pushed and time.monotonic() < deadline:  # the push travels apart from replies
        guard.prepare("s", SYSTEM, model="m")
        time.sleep(0.01)
    assert seen == [] and feed._seen.seq == before
    assert pushed and not [k for k in pushed if b":rx:" in k]


def test_a_claimed_job_costs_no_read_and_the_next_one_is_requested(
        real_store: SessionStore, real_redis: redis.Redis, shell: str) -> None:
    """A worker claiming the job clears the session's job flag and nothing else: the
    cached view holds (no read), no job taken as queued any more, so a view over the
    trigger requests the next one. A flag set meanwhile by another process is not
    queued twice (the request sets it only if absent)."""
    jobs: list[str] = []
    guard = make(shell, real_store, CallbackEnqueuer(lambda _t, sid: jobs.append(sid)),
                 overrides={"m": 1000})
    kw: dict[str, Any] = {"model": "m", "max_tokens": 10}
    guard.record_turn("s", [{"role": "user", "content": "word " * 880},
                            {"role": "assistant", "content": "ok"}])
    assert jobs == ["s"]
    assert guard.prepare("s", SYSTEM, **kw).report.budget.should_compact
    guard.prepare("s", SYSTEM, **kw)
    assert jobs == ["s"]  # queued already: not requested again
    seen = reads(guard)
    real_store.clear_pending("s")  # a worker claims it
    guard.prepare("s", SYSTEM, **kw)
    assert seen == [] and jobs == ["s", "s"] and real_store.is_pending("s")
    guard.prepare("s", SYSTEM, **kw)  # its own request written: read back once
    seen.clear()
    real_store.clear_pending("s")
    real_redis.set(real_store.keys("s").pending, "1")  # another process queued one
    guard.prepare("s", SYSTEM, **kw)
    assert seen == [] and jobs == ["s", "s"]


def test_a_claimed_job_lets_the_next_turn_push_its_job_with_the_append(
        real_store: SessionStore, redis_url: str, key_prefix: str, shell: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The turn after a worker claimed the job carries the next job in its append (one
    round trip), though the cached view last showed one queued."""
    queue = f"{key_prefix}:queue"
    enqueuer = CeleryEnqueuer(publisher_app(redis_url), queue=queue)
    separate: list[str] = []
    monkeypatch.setattr(enqueuer, "enqueue", lambda _t, sid: separate.append(sid))
    guard = make(shell, real_store, enqueuer, overrides={"m": 100_000})
    client = redis.Redis.from_url(redis_url)
    try:
        for k in range(3):
            guard.record_turn("s", [{"role": "user", "content": f"u{k}"},
                                    {"role": "assistant", "content": f"a{k}"}])
            assert guard.prepare("s", SYSTEM, model="m").messages[-1].content == f"a{k}"
            assert real_store.is_pending("s")
            real_store.clear_pending("s")  # a worker claims it
        assert client.llen(queue) == 3 and separate == []
    finally:
        client.delete(queue)
        client.close()


def test_own_writes_are_read_back_at_once(real_store: SessionStore, shell: str) -> None:
    guard = make(shell, real_store, overrides={"m": 100_000})
    for k in range(10):
        guard.record_turn("s", [{"role": "user", "content": f"u{k}"},
                                {"role": "assistant", "content": f"a{k}"}])
        assert guard.prepare("s", SYSTEM, model="m").messages[-1].content == f"a{k}"


def test_a_lost_feed_falls_back_to_reading_and_reconnects(
        real_store: SessionStore, real_redis: redis.Redis, shell: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(changes_module, "RETRY_SECONDS", (0.0,))
    real_store.append("s", [{"role": "user", "content": "hello"}])
    guard = make(shell, real_store, overrides={"m": 100_000})
    feed: ChangeFeed = guard.feed
    guard.prepare("s", SYSTEM, model="m")
    name_before = feed._conn
    with feed._lock:
        feed._conn.send_command("CLIENT", "ID")
        feed_id = feed._conn.read_response()
    real_redis.client_kill_filter(_id=feed_id)
    feed._verified = 0.0  # the next check verifies: the dead connection is found
    real_store.append("s", [{"role": "assistant", "content": "written while the feed was down"}])
    seen = reads(guard)
    assert guard.prepare("s", SYSTEM, model="m").messages[-1].content.startswith("written")
    assert seen == ["s"]
    guard.prepare("s", SYSTEM, model="m")  # reconnected: the next unchanged call is skipped
    guard.prepare("s", SYSTEM, model="m")
    assert feed._conn is not None and feed._conn is not name_before
    assert seen.count("s") <= 2


def test_a_silent_feed_is_trusted_only_for_a_short_while(real_store: SessionStore,
                                                         shell: str,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """A connection that stops delivering without failing: after VERIFY_SECONDS the
    check pings it; a ping that fails turns the feed off."""
    monkeypatch.setattr(changes_module, "VERIFY_SECONDS", 0.0)
    real_store.append("s", [{"role": "user", "content": "hello"}])
    guard = make(shell, real_store, overrides={"m": 100_000})
    guard.prepare("s", SYSTEM, model="m")
    feed: ChangeFeed = guard.feed

    def broken(*_: Any, **__: Any) -> Any:
        raise redis.ConnectionError("gone")

    monkeypatch.setattr(feed._conn, "send_command", broken)
    seen = reads(guard)
    guard.prepare("s", SYSTEM, model="m")
    assert seen == ["s"]


def test_no_feed_where_tracking_cannot_work(key_prefix: str, shell: str) -> None:
    store = SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix=key_prefix))
    guard = make(shell, store)
    assert guard.feed is None
    store.append("s", [{"role": "user", "content": "hello"}])
    guard.prepare("s", SYSTEM)
    store.append("s", [{"role": "assistant", "content": "still read every call"}])
    assert guard.prepare("s", SYSTEM).messages[-1].content == "still read every call"
    assert feed_for(object(), "p") is None


def test_switched_off(real_store: SessionStore, shell: str) -> None:
    guard = make(shell, real_store, watch_changes=False)
    assert guard.feed is None


def test_session_base_of_every_key() -> None:
    assert session_base(b"p:{t:s1}:state") == "p:{t:s1}"
    assert session_base("p:{t:s1}:rx:t:foo}bar") == "p:{t:s1}"  # a term with a brace
    assert session_base("plain") == "plain"


def test_what_a_push_tells() -> None:
    """The job flag alone (with keys no view is read from) is told apart from a change."""
    seen = changes_module._Seen()
    epoch, seq = seen.epoch, seen.seq
    seen.invalidated([b"invalidate", [b"p:{t:a}:pending", b"p:{t:a}:lease"]])
    assert seen.since("p:{t:a}", epoch, seq) == changes_module.FLAG
    assert seen.since("p:{t:b}", epoch, seq) == changes_module.NOTHING
    flag = seen.seq
    seen.invalidated([b"invalidate", [b"p:{t:a}:pending", b"p:{t:b}:pending",
                                      b"p:{t:b}:state"]])
    assert seen.since("p:{t:a}", epoch, flag) == changes_module.FLAG
    assert seen.since("p:{t:b}", epoch, flag) == changes_module.CHANGED
    assert seen.since("p:{t:a}", epoch, seen.seq) == changes_module.NOTHING
    assert seen.pushes == {"p:{t:a}": 2, "p:{t:b}": 1}
    seen.invalidated([b"invalidate", [b"p:{t:a}:log"]])
    assert seen.since("p:{t:a}", epoch, seq) == changes_module.CHANGED
    assert seen.since("p:{t:a}", epoch + 1, seen.seq) == changes_module.CHANGED
    own = OwnState()
    before = own.seen.seq
    own.seen.invalidated([b"invalidate", [b"p:{t:a}:pending"]])
    assert own.mark_after("p:{t:a}", before) is None  # a racing flag write: no vouching


def test_flush_starts_a_new_epoch(real_store: SessionStore, real_redis: redis.Redis,
                                  shell: str) -> None:
    real_store.append("s", [{"role": "user", "content": "hello"}])
    guard = make(shell, real_store, overrides={"m": 100_000})
    guard.prepare("s", SYSTEM, model="m")
    feed: ChangeFeed = guard.feed
    mark = feed.mark()
    feed._seen.invalidated([b"invalidate", None])
    assert not feed.unchanged(session_base(real_store.keys("s").state), mark)
    time.sleep(0)


def test_a_forked_child_opens_its_own_feed(real_store: SessionStore, redis_url: str,
                                           key_prefix: str) -> None:
    """A guard used before a fork (a preloading server): the child must not read the
    parent's socket; it reconnects, and still sees every write."""
    import multiprocessing
    import os

    from shared.guard import ContextGuard

    real_store.append("s", [{"role": "user", "content": "hello"}])
    guard = ContextGuard(real_store, overrides={"m": 100_000})
    guard.prepare("s", SYSTEM, model="m")
    parent_conn = guard.feed._conn
    assert parent_conn is not None
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()

    def child() -> None:
        other = SessionStore(redis.Redis.from_url(redis_url), StoreConfig(key_prefix=key_prefix))
        other.append("s", [{"role": "assistant", "content": f"from {os.getpid()}"}])
        view = guard.prepare("s", SYSTEM, model="m")
        out.put((str(view.messages[-1].content), guard.feed._conn is not parent_conn))

    proc = ctx.Process(target=child)
    proc.start()
    proc.join(20)
    content, own = out.get(timeout=5)
    assert proc.exitcode == 0 and content.startswith("from ") and own
    assert guard.prepare("s", SYSTEM, model="m").messages[-1].content == content  # parent too


def test_a_frozen_redis_costs_the_feed_at_most_its_short_timeout(shell: str) -> None:
    """Redis stops answering (SIGSTOP): the feed's check gives up after IO_TIMEOUT and the
    call goes on as without it (here: the store's own timeout, then StoreUnavailable);
    the feed never blocks a call (or the async guard's event loop) for long."""
    import os
    import signal

    from shared.core.errors import StoreUnavailable
    from shared.store.sessions import connect
    from workers.harness.stack.redis_server import start_server

    server = start_server()
    try:
        config = StoreConfig(key_prefix="f", socket_timeout=0.5, connect_timeout=0.5)
        store = SessionStore(connect(server.url, config), config)
        store.append("s", [{"role": "user", "content": "hello"}])
        guard = make(shell, store, overrides={"m": 100_000})
        guard.prepare("s", SYSTEM, model="m")
        guard.prepare("s", SYSTEM, model="m")
        feed: ChangeFeed = guard.feed
        assert feed.mark() is not None
        feed._verified = 0.0  # the next check pings
        assert server.process is not None
        os.kill(server.process.pid, signal.SIGSTOP)
        try:
            started = time.perf_counter()
            with pytest.raises(StoreUnavailable):
                guard.prepare("s", SYSTEM, model="m")
            took = time.perf_counter() - started
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
        assert took < changes_module.IO_TIMEOUT + 0.5 + 0.4, took
        assert feed._conn is None  # given up, retried later
    finally:
        server.remove()


def test_guards_of_several_tenants_share_one_feed(real_redis: redis.Redis, redis_url: str,
                                                  key_prefix: str, shell: str) -> None:
    """One connection for every tenant (``compaction serve``'s guards): each guard still
    sees only its tenant's writes as changes to its sessions."""
    config = StoreConfig(key_prefix=key_prefix)
    feed = feed_for(real_redis, f"{key_prefix}:{{")
    assert feed is not None
    stores = {t: SessionStore(real_redis, config, tenant=t) for t in ("alice", "bob")}
    guards = {t: make(shell, s, overrides={"m": 100_000}, watch_changes=feed)
              for t, s in stores.items()}
    writer = {t: SessionStore(redis.Redis.from_url(redis_url), config, tenant=t)
              for t in stores}
    for t in stores:
        writer[t].append("s", [{"role": "user", "content": f"{t} 0"}])
        guards[t].prepare("s", SYSTEM, model="m")
    for k in range(1, 4):
        writer["bob"].append("s", [{"role": "user", "content": f"bob {k}"}])
        for t in stores:
            assert guards[t].feed is feed
            want = f"{t} 0" if t == "alice" else f"bob {k}"
            assert guards[t].prepare("s", SYSTEM, model="m").messages[-1].content == want
    seen = reads(guards["alice"])
    guards["alice"].prepare("s", SYSTEM, model="m")
    assert seen == []  # bob's writes are not alice's changes
    other = feed_for(real_redis, "elsewhere:{")
    with pytest.raises(InvalidInput, match="watch_changes"):
        make(shell, stores["alice"], watch_changes=other)


def test_the_http_service_shares_one_feed(real_redis: redis.Redis, key_prefix: str) -> None:
    from shared.telemetry.metrics import get_metrics, set_metrics
    from workers.server.app import create_app
    from workers.server.config import ServerConfig

    before = get_metrics()  # the app serves /metrics: it installs the process's registry
    try:
        app = create_app(ServerConfig(),
                         SessionStore(real_redis, StoreConfig(key_prefix=key_prefix)),
                         tokens={"ta": "alice", "tb": "bob"})
        state = app.state.server
        alice, bob = state.guard("alice"), state.guard("bob")
        assert alice.feed is not None and alice.feed is bob.feed
    finally:
        set_metrics(before)


def test_a_dropped_guard_closes_its_feed_at_once(real_store: SessionStore,
                                                 real_redis: redis.Redis) -> None:
    """No reference cycle holds a feed: an application (or a test suite) creating guards
    by the hundred does not pile up connections until the garbage collector runs."""
    import gc

    from shared.guard import ContextGuard

    real_store.append("s", [{"role": "user", "content": "hello"}])
    guard = ContextGuard(real_store, overrides={"m": 100_000})
    guard.prepare("s", SYSTEM, model="m")
    feed = guard.feed
    assert feed is not None
    with feed._lock:
        feed._conn.send_command("CLIENT", "ID")
        feed_id = feed._conn.read_response()
    del guard, feed
    gc.disable()
    try:
        deadline = time.monotonic() + 5
        while any(c["id"] == str(feed_id) or c["id"] == feed_id
                  for c in real_redis.client_list()):
            assert time.monotonic() < deadline, "the feed's connection outlived its guard"
            time.sleep(0.02)
    finally:
        gc.enable()
    assert ContextGuard(real_store, view_cache=ViewCache(0, 0)).feed is None  # nothing to skip
