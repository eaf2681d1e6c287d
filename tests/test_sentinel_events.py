"""The Sentinel pools hear Sentinel's failover events as they happen
(:mod:`shared.store.sentinel_events`): the parsing and the state (no servers), then both
pools on a real deployment (a primary, a replica, three Sentinels: the harness's)."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from typing import Any

import pytest
import redis

from shared.core.config import StoreConfig
from shared.core.errors import InvalidInput
from shared.store import sentinel_events
from shared.store.sentinel import (
    _Follow,
    connect_sentinel,
    connect_sentinel_async,
    parse_sentinel_url,
)
from shared.store.sentinel_events import Event, SentinelEvents, parse_event
from workers.harness.stack.sentinel_pair import SentinelDeployment, start_sentinel_deployment
from workers.harness.timing import wait_for

SERVICE = "svc"


# -- parsing and state (no servers) ---------------------------------------------------------
@pytest.mark.parametrize("channel, data, expected", [
    ("+try-failover", "master svc 10.0.0.1 6379", Event("start")),
    (b"+elected-leader", b"master svc 10.0.0.1 6379", Event("start")),
    ("+failover-state-send-slaveof-noone", "slave 10.0.0.2:6380 10.0.0.2 6380 @ svc "
     "10.0.0.1 6379", Event("start")),
    ("+promoted-slave", "slave 10.0.0.2:6380 10.0.0.2 6380 @ svc 10.0.0.1 6379",
     Event("start")),
    ("+switch-master", "svc 10.0.0.1 6379 10.0.0.2 6380", Event("switch", ("10.0.0.2", 6380))),
    ("-failover-abort-no-good-slave", "master svc 10.0.0.1 6379 7", Event("abort")),
    ("-failover-abort-not-elected", "master svc 10.0.0.1 6379", Event("abort")),
    ("+odown", "master svc 10.0.0.1 6379 #quorum 2/2", Event("stale")),
    ("+sdown", "master svc 10.0.0.1 6379", Event("stale")),
    ("+config-update-from", "sentinel 3f2a 10.0.0.9 26379 @ svc 10.0.0.1 6379",
     Event("stale")),
    # another service's events, and events that are no sign of a failover of ours
    ("+try-failover", "master svc2 10.0.0.1 6379", None),
    ("+switch-master", "other 10.0.0.1 6379 10.0.0.2 6380", None),
    ("+promoted-slave", "slave 10.0.0.2:6380 10.0.0.2 6380 @ svc-b 10.0.0.1 6379", None),
    ("+sdown", "slave 10.0.0.2:6380 10.0.0.2 6380 @ svc 10.0.0.1 6379", None),
    ("+sdown", "sentinel 3f2a 10.0.0.9 26379 @ svc 10.0.0.1 6379", None),
    ("+slave-reconf-done", "slave 10.0.0.3:6381 10.0.0.3 6381 @ svc 10.0.0.1 6379", None),
    ("+new-epoch", "5", None),
    ("+tilt", "#tilt mode entered", None),
    # garbage
    ("+switch-master", "svc 10.0.0.1 6379 10.0.0.2 port", None),
    ("+switch-master", "svc 10.0.0.1 6379", None),
    ("+try-failover", "", None),
    ("+try-failover", "master svc", None),
    ("+try-failover", "slave a b c @", None),
    ("+try-failover", b"\xff\xfe\x00", None),
    ("+try-failover", None, None),
    (None, "master svc 10.0.0.1 6379", None),
    (42, 42, None),
])
def test_events_are_read_for_our_service_only(channel: Any, data: Any,
                                              expected: Event | None) -> None:
    assert parse_event(channel, data, SERVICE) == expected


def _message(channel: str, data: str) -> dict[str, Any]:
    return {"type": "message", "pattern": None, "channel": channel.encode(),
            "data": data.encode()}


def test_the_state_is_live_while_every_sentinel_is_heard() -> None:
    events = SentinelEvents(SERVICE, 3, fresh_seconds=10.0, live_seconds=0.2)
    assert not events.live()
    for i in range(2):
        events.heard(i, {"type": "subscribe", "channel": b"+switch-master", "data": 1})
    assert not events.live()  # one not heard could be the failover's leader
    events.heard(2, {"type": "pong", "channel": None, "data": b""})
    assert events.live()
    events.lost(1)
    assert not events.live()
    events.heard(1, {"type": "pong", "channel": None, "data": b""})
    assert events.live()
    time.sleep(0.25)
    assert not events.live()  # not heard lately: maybe a subscription silently gone
    assert not SentinelEvents(SERVICE, 0, fresh_seconds=10.0, live_seconds=1.0).live()
    events = SentinelEvents(SERVICE, 1, fresh_seconds=10.0, live_seconds=1.0)
    events.heard(0, {"type": "pong"})
    events.pid = -1  # a forked child inherits the state, not the listener
    assert not events.live()


def test_a_failover_holds_until_the_switch_an_abort_or_the_bound(
        monkeypatch: pytest.MonkeyPatch) -> None:
    events = SentinelEvents(SERVICE, 3, fresh_seconds=10.0, live_seconds=1.0)
    assert events.heard(0, _message("+try-failover", "master other 1.1.1.1 1")) is None
    assert not events.holding() and events.changed < 0
    events.heard(0, _message("+try-failover", "master svc 1.1.1.1 1"))
    events.heard(1, _message("+try-failover", "master svc 1.1.1.1 1"))
    assert events.holding() and events.changed > 0
    events.heard(1, _message("-failover-abort-not-elected", "master svc 1.1.1.1 1"))
    assert events.holding()  # Sentinel 0's failover goes on
    assert events.heard(2, _message("+switch-master", "svc 1.1.1.1 1 2.2.2.2 2")) == Event(
        "switch", ("2.2.2.2", 2))
    assert not events.holding()
    monkeypatch.setattr(sentinel_events, "FAILOVER_HOLD_SECONDS", 0.05)
    events.heard(0, _message("+elected-leader", "master svc 2.2.2.2 2"))
    assert events.holding()
    time.sleep(0.06)
    assert not events.holding()  # one that never completes holds writes for a bound only


def test_the_pool_answer_lasts_longer_while_live_and_ends_at_an_event() -> None:
    follow = _Follow(0.1, 0.05)
    events = SentinelEvents(SERVICE, 1, fresh_seconds=5.0, live_seconds=0.5)
    follow.events = events
    address = ("127.0.0.1", 1)
    follow.asking()
    events.heard(0, {"type": "pong"})
    time.sleep(0.15)
    assert follow.fresh(address) == address and not follow.due(True)  # beyond follow_seconds
    events.lost(0)
    assert follow.fresh(address) is None and follow.due(True)  # not live: as before
    follow.asking()
    events.heard(0, {"type": "pong"})
    events.heard(0, _message("+sdown", "master svc 127.0.0.1 1"))
    assert follow.due(True) and follow.fresh(address) is None  # an event: ask again now
    follow.asking()
    assert follow.fresh(address) == address
    events.heard(0, _message("+try-failover", "master svc 127.0.0.1 1"))
    follow.asking()
    assert follow.holding() and follow.fresh(address) is None
    time.sleep(0.06)
    assert follow.due(True)  # while holding, asked again every error_gap


@pytest.mark.parametrize("value", ["-1", "x", "4000"])
def test_a_bad_events_option_is_refused(value: str) -> None:
    with pytest.raises(InvalidInput, match="sentinel_events_seconds"):
        parse_sentinel_url(f"redis+sentinel://h/svc?sentinel_events_seconds={value}")
    assert parse_sentinel_url("redis+sentinel://h/svc?sentinel_events_seconds=0"
                              ).events_seconds == 0.0
    assert parse_sentinel_url("redis+sentinel://h/svc").events_seconds == 15.0


# -- a real deployment -----------------------------------------------------------------------
CONFIG = StoreConfig(key_prefix="te", socket_timeout=0.5, connect_timeout=0.5)


@pytest.fixture
def deployment() -> Iterator[SentinelDeployment]:
    with start_sentinel_deployment() as running:
        yield running


class Client:
    """A sync or asyncio Sentinel client driven by blocking calls."""

    def __init__(self, kind: str, url: str, **kwargs: Any) -> None:
        self.kind, self.loop = kind, asyncio.new_event_loop()
        if kind == "sync":
            self.redis: Any = connect_sentinel(url, CONFIG, **kwargs)
        else:
            self.redis = connect_sentinel_async(url, CONFIG, **kwargs)
        self.pool = self.redis.connection_pool

    def run(self, value: Any) -> Any:
        return self.loop.run_until_complete(value) if self.kind == "async" else value

    def call(self, *args: Any) -> Any:
        return self.run(self.redis.execute_command(*args))

    def wait(self, seconds: float) -> None:
        """Time passing with the loop running (the async listener is a task on it)."""
        self.run(asyncio.sleep(seconds)) if self.kind == "async" else time.sleep(seconds)

    def until(self, check: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                return False
            self.wait(0.01)
        return True

    def close(self) -> None:
        if self.kind == "async":
            self.loop.run_until_complete(self.redis.aclose())
        else:
            self.redis.close()
        self.loop.close()


@pytest.fixture(params=("sync", "async"))
def client_on(request: pytest.FixtureRequest) -> Iterator[Callable[..., Client]]:
    made: list[Client] = []

    def make(url: str, **kwargs: Any) -> Client:
        made.append(Client(request.param, url, **kwargs))
        return made[-1]

    yield make
    for client in made:
        client.close()


def _live(client: Client) -> bool:
    events = getattr(client.pool.follow, "events", None)
    return events is not None and bool(events.live())


def _length(port: int) -> int:
    with closing(redis.Redis(port=port, socket_timeout=2)) as direct:
        return int(direct.llen("l"))


def test_a_planned_failover_is_heard_as_it_starts(
        deployment: SentinelDeployment, client_on: Callable[..., Client]) -> None:
    """A pool that would ask the Sentinels only once a minute holds its writes as the
    failover starts (the leader publishes it before the replica is promoted) and writes
    to the new primary as soon as it is named: no acknowledged write is lost. Without the
    events it wrote to the old primary until its next check, and those writes were
    lost when the old primary was demoted."""
    client = client_on(deployment.url(), follow_seconds=60.0)
    client.call("RPUSH", "l", -1)
    client.until(lambda: _live(client), 5.0)  # the subscriptions up (what follows tells)
    assert wait_for(lambda: all(_length(node.port) == 1 for node in deployment.nodes), 10.0)
    old = deployment.primary_port()
    deployment.failover()
    started, acked, i = time.monotonic(), [], 0
    while time.monotonic() - started < 6.0:
        try:
            client.call("RPUSH", "l", i)
            acked.append(i)
        except redis.exceptions.ConnectionError:
            pass  # held while the failover is in progress
        i += 1
        client.wait(0.01)
        address = client.pool.primary_now()
        if address is not None and address[1] != old and acked and acked[-1] == i - 1:
            break
    switched = time.monotonic() - started
    new = deployment.wait_primary_not(old)
    assert client.pool.primary_now() == ("127.0.0.1", new)
    assert switched < 5.0, f"the pool named the new primary after {switched:.2f} s"
    with closing(redis.Redis(port=new, socket_timeout=2)) as direct:
        kept = {int(x) for x in direct.lrange("l", 0, -1)}
    assert [n for n in acked if n not in kept] == [], "acknowledged writes were lost"


def test_a_dead_subscription_falls_back_to_the_checks(
        deployment: SentinelDeployment, client_on: Callable[..., Client]) -> None:
    """While every Sentinel is heard the pool's answer outlives ``follow_seconds``;
    with one Sentinel hung (SIGSTOP) it lasts ``follow_seconds`` again, as before."""
    client = client_on(deployment.url() + "?sentinel_events_seconds=30", follow_seconds=0.3)
    client.call("SET", "k", "1")
    assert client.until(lambda: _live(client), 5.0), "the subscriptions never came up"
    client.call("SET", "k", "2")
    client.wait(0.6)
    assert client.pool.primary_now() == ("127.0.0.1", deployment.primary_port())
    hung = deployment.sentinels[1].process
    assert hung is not None
    os.kill(hung.pid, signal.SIGSTOP)
    try:
        client.call("SET", "k", "3")
        assert client.until(lambda: not _live(client), 2.0)
        client.wait(0.35)
        assert client.pool.primary_now() is None  # stale after follow_seconds, as before
        assert client.call("SET", "k", "4")  # the next call asks the Sentinels (the hung
        assert client.call("SET", "k", "5")  # one for a socket timeout, once)
        assert client.pool.primary_now() is not None
    finally:
        os.kill(hung.pid, signal.SIGCONT)
    assert client.until(lambda: _live(client), 3.0), "the hung Sentinel was never heard again"


def test_events_off_and_close_leave_no_listener(
        deployment: SentinelDeployment, client_on: Callable[..., Client]) -> None:
    before = threading.active_count()
    off = client_on(deployment.url() + "?sentinel_events_seconds=0")
    off.call("SET", "k", "1")
    assert off.pool.listener is None and off.pool.follow.events is None
    on = client_on(deployment.url())
    on.call("SET", "k", "1")
    listener = on.pool.listener
    assert listener is not None and listener.alive()
    on.run(on.redis.aclose() if on.kind == "async" else on.redis.close())
    assert on.pool.listener is None and on.pool.follow.events is None
    if on.kind == "sync":
        assert not listener.thread.is_alive()
        assert threading.active_count() == before
    else:
        assert listener.task is None
        assert not [t for t in asyncio.all_tasks(on.loop) if not t.done()]
    on.call("SET", "k", "2")  # used again: listens again
    assert on.pool.listener is not None and on.until(lambda: _live(on), 5.0)


def _view_reads(port: int) -> int:
    with closing(redis.Redis(port=port, socket_timeout=2)) as direct:
        return int(direct.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


def test_a_slow_agent_warm_guard_skips_its_reads(deployment: SentinelDeployment) -> None:
    """Model calls slower than the follow interval: the pool's answer stays fresh
    between prepares while the Sentinels are heard, so the warm guard does not read.
    Before, every prepare more than a second after the last read again."""
    from shared.guard import ContextGuard
    from shared.store.sessions import SessionStore, connect

    store = SessionStore(connect(deployment.url(), CONFIG), CONFIG)
    guard = ContextGuard(store, None)
    try:
        turn = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
        guard.prepare("s", "system", None, 256, "gpt-4o", pending=turn[:1])
        guard.record_turn("s", turn)
        guard.prepare("s", "system", None, 256, "gpt-4o")
        follow = store.redis.connection_pool.follow
        wait_for(lambda: getattr(follow, "events", None) is not None and follow.events.live(),
                 5.0)  # the subscriptions up (the reads tell)
        port = deployment.primary_port()
        before = _view_reads(port)
        for _ in range(3):
            time.sleep(1.3)
            view = guard.prepare("s", "system", None, 256, "gpt-4o")
            assert view.messages[-1].text() == "a"
        assert _view_reads(port) - before == 0
    finally:
        guard.close()
        store.redis.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_listens_for_itself(deployment: SentinelDeployment) -> None:
    """A child forked from a process whose pool listens (Celery prefork) inherits the
    state but not the thread: it is not live until its own listener hears every
    Sentinel, which its first call starts."""
    client = connect_sentinel(deployment.url(), CONFIG)
    try:
        client.set("k", "1")
        pool: Any = client.connection_pool
        assert wait_for(lambda: pool.follow.events.live(), 5.0)
        parent = pool.listener
        pid = os.fork()
        if pid == 0:  # the child: report through the exit status, never return to pytest
            code = 1
            try:
                inherited = pool.follow.events.live()
                client.set("k", "2")
                ok = wait_for(lambda: pool.follow.events.live(), 5.0)
                mine = pool.listener is not parent and pool.listener.thread.is_alive()
                code = 0 if (not inherited and ok and mine) else 2 + inherited
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert parent is not None and parent.alive()
    finally:
        client.close()


class _SwallowingPubSub:
    """A subscription whose wait swallows a cancellation, as redis-py's can on Python 3.11
    (its ``wait_for`` returns when the cancellation lands as a read completes)."""

    async def subscribe(self, *channels: str) -> None:
        return None

    async def ping(self) -> None:
        return None

    async def get_message(self, timeout: float = 0.0) -> None:
        try:
            await asyncio.sleep(timeout)
        except asyncio.CancelledError:
            return None  # swallowed
        return None

    async def aclose(self) -> None:
        return None


class _Sentinel:
    def pubsub(self) -> _SwallowingPubSub:
        return _SwallowingPubSub()


def test_an_async_listener_stops_though_its_library_swallowed_the_cancellation() -> None:
    """The listener's stop awaited its task for good: a client's ``aclose()`` hung (300 s,
    once in the full suite, on a TLS Sentinel deployment) when redis-py swallowed the
    cancellation inside ``get_message``."""
    async def scenario() -> float:
        events = SentinelEvents(SERVICE, 2, fresh_seconds=10.0, live_seconds=1.0)
        listener = sentinel_events.EventTask(events, [_Sentinel(), _Sentinel()]).start()
        await asyncio.sleep(0.05)
        started = time.monotonic()
        await listener.stop()
        assert not listener.alive()
        return time.monotonic() - started

    assert asyncio.run(asyncio.wait_for(scenario(), 10)) < sentinel_events.STOP_SECONDS
