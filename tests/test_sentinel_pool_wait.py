"""Threads on one sync guard over a Sentinel URL: more calls in flight than the pool holds.

The sync Sentinel pool (:class:`shared.store.sentinel.FollowingSentinelPool`) waits its
turn like the store's other pools (``shared.store.pools``): redis-py's Sentinel pool
under it failed the 101st thread's call at once with ``Too many connections`` while
Redis answered every call. Each test starts its own deployment (a primary, a replica,
three Sentinels: :mod:`workers.harness.stack.sentinel_pair`)."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import closing
from typing import Any

import pytest
import redis

from shared import ContextGuard
from shared.core.config import StoreConfig
from shared.core.errors import StoreUnavailable
from shared.store.sentinel import (
    FollowingSentinelPool,
    connect_sentinel,
    connect_sentinel_async,
)
from shared.store.sessions import SessionStore, connect
from tests.pool_support import child_after_release
from workers.harness.stack.sentinel_pair import SentinelDeployment, start_sentinel_deployment

pytestmark = pytest.mark.redis

PATIENT = StoreConfig(key_prefix="spw", socket_timeout=5.0, connect_timeout=5.0)


@pytest.fixture
def deployment() -> Iterator[SentinelDeployment]:
    with start_sentinel_deployment() as running:
        yield running


def turn(i: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"u{i}"}, {"role": "assistant", "content": f"a{i}"}]


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


def primary_pid(deployment: SentinelDeployment) -> int:
    process = deployment.node(deployment.primary_port()).process
    assert process is not None
    return process.pid


def test_128_threads_on_one_sync_guard_over_sentinel_wait_their_turn(
        deployment: SentinelDeployment) -> None:
    """Every call held a connection while the primary was stopped (0.4 s, under the
    Sentinels' 1 s down-after): the 101st thread's failed at once with 'Too many
    connections' from a healthy deployment."""
    client = connect(deployment.url(), PATIENT)
    pool: Any = client.connection_pool
    assert isinstance(pool, FollowingSentinelPool)
    guard = ContextGuard(SessionStore(client, PATIENT), watch_changes=False)
    guard.warm_up()
    pid = primary_pid(deployment)
    os.kill(pid, signal.SIGSTOP)  # every call waits for Redis, holding its connection
    released = threading.Timer(0.4, os.kill, args=(pid, signal.SIGCONT))
    released.start()
    try:
        got = in_threads(128, lambda i: guard.record_turn(f"t{i}", turn(i)))
    finally:
        released.join()
        os.kill(pid, signal.SIGCONT)
    assert [g for g in got if isinstance(g, BaseException)] == []
    assert got == [2] * 128
    assert pool._created_connections <= 100
    assert (pool.turns.free, len(pool.turns._queue)) == (100, 0)
    views = in_threads(128, lambda i: guard.prepare(f"t{i}", "sys", model="gpt-4o"))
    assert [len(v.messages) for v in views] == [3] * 128
    guard.close()
    client.close()


def test_the_sentinel_pool_size_is_a_setting_of_connect(deployment: SentinelDeployment) -> None:
    """connect(sentinel_url, max_connections=...) built a pool of 100 whatever was asked."""
    client = connect(deployment.url(), PATIENT, max_connections=3)
    store = SessionStore(client, PATIENT)
    got = in_threads(40, lambda i: store.append(f"s{i}", turn(i)))
    assert got == [2] * 40
    assert client.connection_pool.max_connections == 3
    assert client.connection_pool._created_connections <= 3
    client.close()


def test_a_thread_waits_for_the_one_connection_held(deployment: SentinelDeployment) -> None:
    client = connect_sentinel(deployment.url(), PATIENT, max_connections=1)
    pool: Any = client.connection_pool
    client.set("k", "0")
    held = pool.get_connection()  # another thread's call in flight
    threading.Timer(0.3, pool.release, args=(held,)).start()
    began = time.monotonic()
    assert client.incr("k") == 1  # failed at once: Too many connections
    assert time.monotonic() - began >= 0.25
    assert (pool.turns.free, len(pool.turns._queue)) == (1, 0)
    client.close()


def test_threads_waiting_on_a_stopped_primary_fail_typed_and_soon(
        deployment: SentinelDeployment) -> None:
    config = StoreConfig(key_prefix="spw", socket_timeout=0.2, connect_timeout=0.2)
    client = connect(deployment.url(), config, max_connections=2)
    store = SessionStore(client, config)
    store.append("s", turn(0))
    pid = primary_pid(deployment)
    os.kill(pid, signal.SIGSTOP)  # resumed before the Sentinels' 1 s down-after
    try:
        began = time.monotonic()
        got = in_threads(12, lambda i: store.length("s"))
        took = time.monotonic() - began
    finally:
        os.kill(pid, signal.SIGCONT)
    assert all(isinstance(g, StoreUnavailable) for g in got), got
    assert took < 0.9, took
    pool: Any = client.connection_pool
    assert (pool.turns.free, len(pool.turns._queue)) == (2, 0)
    assert store.length("s") == 2
    client.close()


def settled(call: Any) -> Any:
    """``call``'s result once the switch has settled (a failover still reported in
    progress fails calls at once, typed)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return call()
        except redis.ConnectionError:
            assert time.monotonic() < deadline
            time.sleep(0.1)


def test_a_connection_busy_at_the_switch_goes_back_closed_and_gives_its_turn(
        deployment: SentinelDeployment) -> None:
    """Two connections, one held across a planned failover and the other taken after it
    (the pool asks the Sentinels, names the new primary): a third call waits; the held
    one comes back disconnected (it is on the old primary), its turn goes to the waiting
    call, whose write lands on the new primary on a connection of its own."""
    client = connect_sentinel(deployment.url(), PATIENT, max_connections=2)
    pool: Any = client.connection_pool
    client.set("k", "0")
    held = pool.get_connection()
    old = deployment.primary_port()
    assert held.port == old
    deployment.failover()
    new = deployment.wait_primary_not(old)
    time.sleep(1.2)  # the pool's answer is stale: the next call asks the Sentinels
    current = settled(pool.get_connection)
    assert (current.host, current.port) == tuple(pool.master_address)
    assert current.port == new
    threading.Timer(0.3, pool.release, args=(held,)).start()
    began = time.monotonic()
    settled(lambda: client.set("waited", "1"))
    assert time.monotonic() - began >= 0.25  # it waited for the held connection
    assert not held.is_connected  # busy at the switch: dropped when it came back
    with closing(redis.Redis(port=new, socket_timeout=2)) as direct:
        assert direct.get("waited") == b"1"
    pool.release(current)
    assert pool._created_connections <= 2
    assert (pool.turns.free, len(pool.turns._queue)) == (2, 0)
    client.close()


def test_a_forked_child_starts_with_every_turn_free(deployment: SentinelDeployment) -> None:
    """A prefork worker forks while a parent's thread holds the only connection: the
    child's pool must not count that turn as taken (no one there gives it back)."""
    client = connect(deployment.url(), PATIENT, max_connections=1, pool_timeout=1.0)
    store = SessionStore(client, PATIENT)
    store.append("s", turn(0))
    pool: Any = client.connection_pool
    held = pool.get_connection()  # a parent's call in flight at the fork
    pid = os.fork()
    if pid == 0:  # the child: one call, its exit status the answer
        try:
            os._exit(0 if store.length("s") == 2 else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    pool.release(held)
    assert os.waitstatus_to_exitcode(status) == 0
    assert store.length("s") == 2
    client.close()


def test_an_async_release_cancelled_while_it_closes_a_connection_to_the_old_primary(
        deployment: SentinelDeployment) -> None:
    """A connection busy across a failover is closed as it comes back, an await: a
    cancellation landing there (``asyncio.timeout`` expiring as the call ends) kept it
    in redis.asyncio's pool as in use and its turn taken, for good."""
    async def main() -> None:
        client = connect_sentinel_async(deployment.url(), PATIENT, max_connections=2)
        pool: Any = client.connection_pool
        await client.set("k", "0")
        held = await pool.get_connection()
        old = deployment.primary_port()
        deployment.failover()
        deployment.wait_primary_not(old)
        await asyncio.sleep(1.2)  # the pool's answer is stale: the next call asks
        deadline = time.monotonic() + 30
        while True:  # a failover still reported in progress fails calls at once
            try:
                await client.set("after", "1")
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.1)
        assert pool.master_address[1] != old
        releasing = asyncio.create_task(pool.release(held))
        await asyncio.sleep(0)  # in the release, closing the connection
        releasing.cancel()
        await asyncio.gather(releasing, return_exceptions=True)
        assert not held.is_connected
        assert (pool.turns.free, len(pool.turns._queue)) == (2, 0)
        assert len(pool._in_use_connections) == 0
        counts = await asyncio.gather(*(client.incr("n") for _ in range(10)))
        assert sorted(counts) == list(range(1, 11))
        await client.aclose()

    asyncio.run(main())


def test_a_forked_child_releasing_a_parents_connection_keeps_the_bound(
        deployment: SentinelDeployment) -> None:
    """The child's first call released a connection in use at the fork: the turn went
    back to the child's fresh turns, one too many, and its second call at once failed
    with redis-py's 'Too many connections' instead of waiting its turn."""
    client = connect_sentinel(deployment.url(), PATIENT, max_connections=1, pool_timeout=0.2)
    client.set("k", "0")
    pool: Any = client.connection_pool
    held = pool.get_connection()
    assert child_after_release(pool, held) == 0
    pool.release(held)
    assert client.incr("k") == 1
    assert (pool.turns.free, len(pool.turns._queue)) == (1, 0)
    client.close()


def _flagged(deployment: SentinelDeployment) -> bool:
    """Whether a Sentinel still reports a failover of the service in progress."""
    for port in deployment.sentinel_ports:
        with closing(deployment.client(port)) as client:
            if "failover_in_progress" in str(client.sentinel_master(deployment.service)):
                return True
    return False


async def _until(check: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(check):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)


def test_an_async_call_that_waited_while_the_primary_moved_asks_after_its_turn(
        deployment: SentinelDeployment) -> None:
    """A call queued for the only connection across a planned failover: the asyncio pool
    asked the Sentinels before its wait, not after, and took the pooled connection to
    the old primary (demoted: READONLY, the call failed; not yet: a write lost when it
    resynchronised). The sync pool asks once the turn came; so does this one."""
    async def main() -> None:
        client = connect_sentinel_async(deployment.url(), PATIENT, max_connections=1)
        pool: Any = client.connection_pool
        await client.set("k", "0")
        held = await pool.get_connection()
        old = deployment.primary_port()
        waiting = asyncio.create_task(client.set("waited", "1"))
        await asyncio.sleep(0.05)
        assert len(pool.turns._queue) == 1  # it waits for the held connection
        await asyncio.to_thread(deployment.failover)
        new = await asyncio.to_thread(deployment.wait_primary_not, old)
        await _until(lambda: not _flagged(deployment))  # no hold: the switch is done
        assert pool.master_address[1] == old  # no call asked since
        await pool.release(held)
        assert await asyncio.wait_for(waiting, 10) is True
        with closing(redis.Redis(port=new, socket_timeout=2)) as direct:
            assert direct.get("waited") == b"1"  # None: written to the old primary
        assert pool.master_address[1] == new
        assert (pool.turns.free, len(pool.turns._queue)) == (1, 0)
        await client.aclose()

    asyncio.run(main())


def test_an_async_call_whose_turn_comes_during_a_failover_is_held(
        deployment: SentinelDeployment) -> None:
    """A call queued before a failover started, its turn coming while the failover is
    in progress: it went to the primary about to be replaced instead of failing at once,
    typed, as every call does during the hold (and as the sync pool's did)."""
    async def main() -> None:
        client = connect_sentinel_async(deployment.url(), PATIENT, max_connections=1)
        pool: Any = client.connection_pool
        await client.set("k", "0")
        await _until(lambda: pool.follow.events is not None and pool.follow.events.live())
        held = await pool.get_connection()
        waiting = asyncio.create_task(client.set("held", "1"))
        await asyncio.sleep(0.05)
        assert len(pool.turns._queue) == 1
        await asyncio.to_thread(deployment.failover)
        await _until(pool.follow.holding, 10.0)  # heard as it started
        await pool.release(held)
        with pytest.raises(redis.ConnectionError, match=r"failover .* in progress"):
            await asyncio.wait_for(waiting, 10)
        assert (pool.turns.free, len(pool.turns._queue)) == (1, 0)
        await client.aclose()

    asyncio.run(main())
