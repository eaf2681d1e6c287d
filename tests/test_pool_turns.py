"""The fair pools' turns when a caller gives up, a pool is reset, or the process forks
(:mod:`shared.store.pools`): no turn lost, none handed out twice, no connection left open.

Each test runs on a redis-server of its own (real redis-py, real sockets)."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from shared.store.pools import AsyncFairConnectionPool, FairConnectionPool
from tests.pool_support import child_after_release
from workers.harness.stack.redis_server import RedisServer

pytestmark = pytest.mark.redis


class _Interrupted(Exception):
    """What a signal handler raises in the waiting thread (Celery's soft time limit,
    a KeyboardInterrupt)."""


@pytest.fixture
def alarm() -> Iterator[None]:
    def interrupt(signum: int, frame: Any) -> None:
        raise _Interrupted()

    before = signal.signal(signal.SIGALRM, interrupt)
    yield
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, before)


def clients_of(server: RedisServer) -> int:
    with redis.Redis(port=server.port, socket_timeout=2) as direct:
        return len(direct.client_list()) - 1  # not this one


def test_a_thread_interrupted_while_it_waits_leaves_no_turn_behind(
        own_redis: RedisServer, alarm: None) -> None:
    """The waiter stayed in the queue: the next connection released went to it, gone,
    and the pool was a turn short for good (here: no call could run at all)."""
    pool = FairConnectionPool.from_url(own_redis.url, max_connections=1, timeout=0.5)
    held = pool.get_connection()
    signal.setitimer(signal.ITIMER_REAL, 0.1)  # raised in this thread while it waits
    with pytest.raises(_Interrupted):
        pool.get_connection()
    pool.release(held)
    began = time.monotonic()
    assert redis.Redis(connection_pool=pool).ping()  # failed: no connection ... for 0.5 s
    assert time.monotonic() - began < 0.3
    assert (pool.turns.free, len(pool.turns._queue)) == (1, 0)
    pool.disconnect()


def test_a_forked_child_releasing_a_parents_connection_keeps_the_bound(
        own_redis: RedisServer) -> None:
    """The child's first call was the release of a connection it inherited, in use at
    the fork: it raised ``queue.Full`` (redis-py put a placeholder into a full queue),
    and gave the child a turn too many (two calls at once on a pool of one)."""
    pool = FairConnectionPool.from_url(own_redis.url, max_connections=1, timeout=0.2)
    held = pool.get_connection()
    assert child_after_release(pool, held) == 0
    pool.release(held)
    assert (pool.turns.free, len(pool.turns._queue)) == (1, 0)
    assert redis.Redis(connection_pool=pool).ping()
    pool.disconnect()


def test_a_connection_from_before_a_reset_is_closed_when_it_comes_back(
        own_redis: RedisServer) -> None:
    """``pool.reset()`` while a call holds a connection: it came back into the new queue,
    a connection the pool no longer knew, left open by ``disconnect()`` (client.close())."""
    pool = FairConnectionPool.from_url(own_redis.url, max_connections=2, timeout=0.5)
    client = redis.Redis(connection_pool=pool)
    held = pool.get_connection()
    pool.reset()
    assert client.ping()
    pool.release(held)
    assert not held.is_connected
    assert (pool.turns.free, len(pool.turns._queue)) == (2, 0)
    pool.disconnect()
    assert clients_of(own_redis) == 0


def test_an_async_pool_reset_while_a_call_waits(own_redis: RedisServer) -> None:
    """``pool.reset()`` while a call holds the only connection and another waits: the
    held one's release raised KeyError (redis.asyncio's pool no longer knew it) into the
    call that had succeeded, and left it open."""
    async def main() -> None:
        pool = AsyncFairConnectionPool.from_url(own_redis.url, max_connections=1,
                                                timeout=2.0)
        client = redis.asyncio.Redis(connection_pool=pool)
        held = await pool.get_connection()

        async def ping() -> Any:
            return await client.ping()

        waiting = asyncio.create_task(ping())
        await asyncio.sleep(0.05)
        pool.reset()
        await pool.release(held)  # raised KeyError
        assert await asyncio.wait_for(waiting, 1.0)
        assert not held.is_connected
        assert (pool.turns.free, len(pool.turns._queue)) == (1, 0)
        await pool.disconnect()
        assert clients_of(own_redis) == 0

    asyncio.run(main())


def test_an_async_waiter_cancelled_in_a_burst_keeps_the_queue_in_order(
        own_redis: RedisServer) -> None:
    """Cancelled and timed-out waiters leave the queue; every other call gets its
    connection, in the order it asked (the order they finish in is the two connections'
    race, not the pool's)."""
    async def main() -> tuple[list[int], list[int]]:
        pool = AsyncFairConnectionPool.from_url(own_redis.url, max_connections=2,
                                                timeout=5.0)
        client = redis.asyncio.Redis(connection_pool=pool)
        handed: list[int] = []
        done: list[int] = []
        get_connection = pool.get_connection

        async def recorded(*args: Any, **kwargs: Any) -> Any:
            connection = await get_connection(*args, **kwargs)
            task = asyncio.current_task()
            if task is not None and task.get_name().isdigit():  # a call's, not main()'s
                handed.append(int(task.get_name()))
            return connection

        pool.get_connection = recorded  # type: ignore[method-assign]

        async def call(i: int) -> None:
            await client.incr("n")
            done.append(i)

        tasks = [asyncio.create_task(call(i), name=str(i)) for i in range(40)]
        await asyncio.sleep(0)
        for task in tasks[5::3]:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert (pool.turns.free, len(pool.turns._queue)) == (2, 0)
        assert int(await client.get("n") or 0) == len(done)
        await pool.disconnect()
        return handed, done

    handed, done = asyncio.run(main())
    assert handed == sorted(handed)
    assert sorted(done) == handed
    assert len(done) == 40 - len(range(5, 40, 3))


def test_threads_waiting_while_the_pool_is_reset_all_run(own_redis: RedisServer) -> None:
    pool = FairConnectionPool.from_url(own_redis.url, max_connections=2, timeout=5.0)
    client = redis.Redis(connection_pool=pool)
    held = [pool.get_connection(), pool.get_connection()]
    done: list[Any] = []

    def call() -> None:
        try:
            done.append(client.incr("n"))
        except Exception as exc:  # collected: the test asserts on them
            done.append(exc)

    threads = [threading.Thread(target=call) for _ in range(8)]
    for thread in threads:
        thread.start()
    time.sleep(0.1)
    pool.reset()
    for connection in held:
        pool.release(connection)
    for thread in threads:
        thread.join(5)
    assert sorted(done) == list(range(1, 9))
    assert (pool.turns.free, len(pool.turns._queue)) == (2, 0)
    pool.disconnect()
    assert clients_of(own_redis) == 0


@pytest.mark.parametrize("when", ["granted", "queued"])
def test_a_waiter_of_a_closed_event_loop_eats_no_turn(own_redis: RedisServer,
                                                      when: str) -> None:
    """A test client runs each call on a loop of its own and closes it, its other tasks
    not cancelled: one waiting for a turn was left in the queue, or handed the turn just
    before its loop closed. Handed a turn it never ran to use, or the next one (raising
    'Event loop is closed' into the release), it took it for good: with ``size`` such
    waiters every later call failed, 'no connection ... came back', from an idle pool."""
    pool = AsyncFairConnectionPool.from_url(own_redis.url, max_connections=1, timeout=0.5)
    client = redis.asyncio.Redis(connection_pool=pool)
    first = asyncio.new_event_loop()

    async def hold() -> Any:
        connection = await pool.get_connection()
        await connection.disconnect()  # nothing of this loop left on it
        return connection

    held = first.run_until_complete(hold())
    waiter = first.create_task(client.incr("n"))
    first.run_until_complete(asyncio.sleep(0.05))
    assert len(pool.turns._queue) == 1
    if when == "granted":
        first.run_until_complete(pool.release(held))
    first.close()

    async def then(release: bool = False) -> list[Any]:
        if release:
            await pool.release(held)  # raised RuntimeError: Event loop is closed
        counts = [await client.incr("n") for _ in range(3)]
        await pool.disconnect()  # the next loop's calls connect anew
        return counts

    assert asyncio.run(then(when == "queued")) == [1, 2, 3]  # failed: no connection ... for 0.5 s
    assert (pool.turns.free, len(pool.turns._queue)) == (1, 0)
    waiter.get_coro().close()  # as when the task is collected: nothing given twice
    assert (pool.turns.free, len(pool.turns._queue)) == (1, 0)
    assert asyncio.run(then()) == [4, 5, 6]
    assert (pool.turns.free, len(pool.turns._queue)) == (1, 0)
    assert clients_of(own_redis) == 0
