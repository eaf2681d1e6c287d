"""Many agents in one process on a real Redis: more calls in flight than the pool holds.

A thread beyond the sync pool's connections, or a task queued behind a burst on one
event loop, waits its turn, first come first served, while Redis answers; it fails
(StoreUnavailable) only once Redis has stopped answering (``shared.store.pools``).
``scripts/bench_guard_concurrency.py`` measures the same at scale."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from shared import AsyncContextGuard, ContextGuard
from shared.core.config import StoreConfig
from shared.core.errors import InvalidInput, StoreUnavailable
from shared.enqueue import redis_server
from shared.store.aio import AsyncSessionStore, connect_async
from shared.store.cluster_aio import connect_cluster_async
from shared.store.pools import LoopTurns, ThreadTurns
from shared.store.sessions import SessionStore, connect
from workers.harness.stack.redis_server import LocalCluster, RedisServer
from workers.harness.stack.sentinel_pair import start_sentinel_deployment

pytestmark = pytest.mark.redis

PATIENT = StoreConfig(key_prefix="conc", socket_timeout=5.0, connect_timeout=5.0)


@pytest.fixture
def server(pausable_redis: RedisServer) -> RedisServer:
    return pausable_redis  # stopped (SIGSTOP) and resumed by the tests


@pytest.fixture
def paused(server: RedisServer) -> Iterator[Any]:
    """Stops Redis (SIGSTOP) when called; resumed at the end whatever happened."""
    assert server.process is not None
    pid = server.process.pid
    yield lambda stop: os.kill(pid, signal.SIGSTOP if stop else signal.SIGCONT)
    os.kill(pid, signal.SIGCONT)


def turn(i: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"u{i}"}, {"role": "assistant", "content": f"a{i}"}]


def pool_of(client: Any) -> Any:
    return client.connection_pool


def in_threads(count: int, call: Any) -> list[Any]:
    results: list[Any] = [None] * count

    def run(i: int) -> None:
        try:
            results[i] = call(i)
        except Exception as exc:  # collected: the test asserts on them
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not any(thread.is_alive() for thread in threads)
    return results


# -- threads on one sync guard ---------------------------------------------------------
def test_more_threads_than_the_pool_holds_wait_their_turn(server: RedisServer,
                                                          paused: Any) -> None:
    """150 threads' calls in flight at once on the default pool (100 connections): the
    101st thread's call failed at once with 'Too many connections' from a healthy Redis."""
    client = connect(server.url, PATIENT)
    guard = ContextGuard(SessionStore(client, PATIENT), watch_changes=False)
    guard.warm_up()
    paused(True)  # every call waits for Redis, holding its connection
    released = threading.Timer(0.5, paused, args=(False,))
    released.start()
    got = in_threads(150, lambda i: guard.record_turn(f"t{i}", turn(i)))
    released.join()
    assert [g for g in got if isinstance(g, BaseException)] == []
    assert got == [2] * 150
    assert len(pool_of(client)._connections) <= 100
    views = in_threads(150, lambda i: guard.prepare(f"t{i}", "sys", model="gpt-4o"))
    assert [len(v.messages) for v in views] == [3] * 150  # the system prompt and the turn
    guard.close()
    client.close()


def test_the_sync_pool_size_is_a_setting(server: RedisServer) -> None:
    client = connect(server.url, PATIENT, max_connections=3)
    store = SessionStore(client, PATIENT)
    got = in_threads(40, lambda i: store.append(f"s{i}", turn(i)))
    assert got == [2] * 40
    assert len(pool_of(client)._connections) <= 3
    client.close()
    with pytest.raises(InvalidInput, match="max_connections"):
        connect(server.url, max_connections=0)


def test_a_forked_child_starts_with_every_turn_free(server: RedisServer) -> None:
    """A prefork worker forks while a parent's thread holds a connection: the child's
    pool must not count that thread's turn as taken (it is not there to give it back)."""
    client = connect(server.url, PATIENT, max_connections=1)
    store = SessionStore(client, PATIENT)
    store.append("s", turn(0))
    held = pool_of(client).get_connection()  # a parent's call in flight at the fork
    pid = os.fork()
    if pid == 0:  # the child: one call, its exit status the answer
        try:
            os._exit(0 if store.length("s") == 2 else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    pool_of(client).release(held)
    assert os.waitstatus_to_exitcode(status) == 0
    assert store.length("s") == 2
    client.close()


def test_threads_waiting_on_a_stopped_redis_fail_typed_and_soon(server: RedisServer,
                                                                  paused: Any) -> None:
    config = StoreConfig(key_prefix="conc", socket_timeout=0.3, connect_timeout=0.3)
    store = SessionStore(connect(server.url, config, max_connections=2), config)
    store.append("s", turn(0))
    paused(True)
    began = time.monotonic()
    got = in_threads(20, lambda i: store.length("s"))
    took = time.monotonic() - began
    paused(False)
    assert all(isinstance(g, StoreUnavailable) for g in got), got
    assert took < 3.0
    assert store.length("s") == 2


# -- tasks on one event loop -----------------------------------------------------------
async def hog(stop: asyncio.Event) -> None:
    """Synchronous work on the loop between awaits (an app's own, or many guards' calls):
    each loop turn takes 30 ms longer."""
    while not stop.is_set():
        time.sleep(0.03)
        await asyncio.sleep(0)


def test_a_burst_on_a_busy_loop_waits_while_redis_answers(server: RedisServer) -> None:
    """400 calls on a pool of 10 with a busy loop: the last waits 1+ s for its turn, past
    the pool's 0.6 s. redis-py's pool failed those with 'No connection available' though
    Redis answered every call at once."""
    async def main() -> list[Any]:
        config = StoreConfig(key_prefix="conc", socket_timeout=5.0, connect_timeout=5.0)
        client = connect_async(server.url, config, max_connections=10, pool_timeout=0.6)
        store = AsyncSessionStore(client, config)
        guard = AsyncContextGuard(store, watch_changes=False)
        await guard.warm_up()
        stop = asyncio.Event()
        busy = asyncio.create_task(hog(stop))
        got = await asyncio.gather(*(guard.record_turn(f"b{i}", turn(i)) for i in range(400)),
                                   return_exceptions=True)
        stop.set()
        await busy
        await guard.aclose()
        await store.aclose()
        return list(got)

    got = asyncio.run(main())
    assert [g for g in got if isinstance(g, BaseException)] == []


@pytest.fixture(params=["standalone", "sentinel"])
def any_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A Redis URL: a server of the test's own, or a Sentinel deployment's."""
    if request.param == "standalone":
        yield request.getfixturevalue("server").url
        return
    with start_sentinel_deployment() as deployment:
        yield deployment.url()


def test_a_burst_on_a_busy_loop_waits_on_a_cluster_too(cluster: LocalCluster) -> None:
    """connect_cluster_async's turns: the same burst; its wait was each call's own too."""
    async def main() -> list[Any]:
        config = StoreConfig(key_prefix="concc", socket_timeout=5.0, connect_timeout=5.0)
        client = connect_cluster_async(cluster.url, config, max_connections=10,
                                       pool_timeout=0.6)
        store = AsyncSessionStore(client, config)
        await store.warm_up()  # the slot map learnt before the burst
        stop = asyncio.Event()
        busy = asyncio.create_task(hog(stop))
        got = await asyncio.gather(*(store.append(f"c{i}", turn(i)) for i in range(400)),
                                   return_exceptions=True)
        stop.set()
        await busy
        for i in range(400):
            await store.delete_session(f"c{i}")
        await client.aclose()
        return list(got)

    got = asyncio.run(main())
    assert [g for g in got if isinstance(g, BaseException)] == []


def test_a_task_calling_again_and_again_does_not_starve_a_waiting_one(any_url: str) -> None:
    """One connection: a task that calls in a loop got it back each time before the task
    that had been waiting (redis-py's pool hands a released connection to whoever asks
    first), which waited for the whole loop or failed."""
    async def main() -> tuple[int, Any]:
        client = connect_async(any_url, PATIENT, max_connections=1, pool_timeout=30)
        store = AsyncSessionStore(client, PATIENT)
        await store.append("s", turn(0))
        done = 0

        async def busy() -> None:
            nonlocal done
            for _ in range(200):
                await store.length("s")
                done += 1

        task = asyncio.create_task(busy())
        await asyncio.sleep(0)  # busy holds the connection now
        await store.length("s")
        seen = done
        await task
        await store.aclose()
        return seen, done

    seen, done = asyncio.run(main())
    assert done == 200
    assert seen <= 3


def test_a_cancelled_waiter_gives_no_turn_away(server: RedisServer) -> None:
    async def main() -> None:
        client = connect_async(server.url, PATIENT, max_connections=1, pool_timeout=30)
        store = AsyncSessionStore(client, PATIENT)
        await store.append("s", turn(0))
        calls = [asyncio.create_task(store.length("s")) for _ in range(20)]
        await asyncio.sleep(0)
        for call in calls[1::2]:
            call.cancel()
        got = await asyncio.gather(*calls, return_exceptions=True)
        assert [g for g in got[::2]] == [2] * 10
        assert all(isinstance(g, asyncio.CancelledError) for g in got[1::2])
        assert await asyncio.wait_for(store.length("s"), 5) == 2
        turns = pool_of(client).turns
        assert (turns.free, len(turns._queue)) == (1, 0)
        await store.aclose()

    asyncio.run(main())


def test_the_guard_still_knows_which_server_its_store_is_on(server: RedisServer) -> None:
    """The inline job (one LPUSH when the broker is the store's Redis) needs the store's
    server; it is named for the pools connect and connect_async build."""
    assert redis_server(connect(server.url)) == ("127.0.0.1", server.port, None, 0)
    assert redis_server(connect_async(server.url)) == ("127.0.0.1", server.port, None, 0)


def test_a_store_on_redis_pys_own_pool_says_so_once(server: RedisServer,
                                                    caplog: pytest.LogCaptureFixture,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """redis.asyncio.Redis.from_url(url) fails a call beyond its 100 connections at once:
    the store says which connector waits instead, once a process."""
    import redis.asyncio

    from shared.store import aio

    monkeypatch.setattr(aio, "_WARNED_POOL", False)

    async def main() -> None:
        for client in (connect_async(server.url), redis.asyncio.Redis.from_url(server.url),
                       redis.asyncio.Redis.from_url(server.url)):
            await AsyncSessionStore(client, PATIENT).aclose()

    with caplog.at_level("WARNING", logger="shared.store"):
        asyncio.run(main())
    said = [r.getMessage() for r in caplog.records if "redis-py's own pool" in r.getMessage()]
    assert len(said) == 1
    assert "100 connections" in said[0] and "connect_async" in said[0]


# -- the turns themselves ----------------------------------------------------------------
def test_loop_turns_go_first_in_first_out_and_survive_cancellation() -> None:
    async def main() -> list[str]:
        turns = LoopTurns(1, None)
        order: list[str] = []
        await turns.take()

        async def wait(name: str) -> None:
            await turns.take()
            order.append(name)
            turns.give(True)

        first = asyncio.create_task(wait("first"))
        gone = asyncio.create_task(wait("gone"))
        await asyncio.sleep(0)
        gone.cancel()
        second = asyncio.create_task(wait("second"))
        await asyncio.sleep(0)
        turns.give(True)  # first's turn, then second's; not a newcomer's
        late = asyncio.create_task(wait("late"))
        await asyncio.gather(first, second, late, return_exceptions=True)
        assert (turns.free, len(turns._queue)) == (1, 0)
        return order

    assert asyncio.run(main()) == ["first", "second", "late"]


def test_thread_turns_fail_after_the_timeout_without_an_answer_only() -> None:
    turns = ThreadTurns(1, 0.2)
    turns.take()
    threading.Timer(0.1, turns.give, args=(True,)).start()
    turns.take()  # given within the wait
    answering = threading.Event()

    def answer() -> None:  # a call answered every 0.1 s on another connection
        while not answering.wait(0.1):
            turns.answered = time.monotonic()

    feeder = threading.Thread(target=answer)
    feeder.start()
    threading.Timer(0.6, turns.give, args=(False,)).start()
    began = time.monotonic()
    turns.take()  # waited 0.6 s, past the timeout: Redis was answering meanwhile
    assert time.monotonic() - began >= 0.5
    answering.set()
    feeder.join()
    began = time.monotonic()
    with pytest.raises(Exception, match="no connection of the pool's 1"):
        turns.take()
    assert 0.1 <= time.monotonic() - began < 1.0
    assert (turns.free, len(turns._queue)) == (0, 0)
