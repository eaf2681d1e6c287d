"""connect_async's pool: more concurrent guard calls than connections wait for one
(a bounded wait) instead of failing at once."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import pytest
import redis.asyncio

from shared import AsyncContextGuard
from shared.core.config import StoreConfig
from shared.core.errors import StoreUnavailable
from shared.store.aio import AsyncSessionStore, connect_async
from workers.harness.stack.redis_server import RedisServer

pytestmark = pytest.mark.redis


@pytest.fixture
def server(pausable_redis: RedisServer) -> RedisServer:
    return pausable_redis  # stopped (SIGSTOP) and resumed by the tests


def turn(i: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"u{i}"}, {"role": "assistant", "content": f"a{i}"}]


async def gathered(calls: list[Any]) -> list[Any]:
    return list(await asyncio.gather(*calls, return_exceptions=True))


def test_more_concurrent_calls_than_the_default_pool_all_succeed(server: RedisServer) -> None:
    async def main() -> None:
        # generous timeouts: the test is about the pool's size, and closing 250 calls'
        # connections on a loaded CI host took longer than the default 0.5 s
        config = StoreConfig(key_prefix="pool", socket_timeout=5.0, connect_timeout=5.0)
        store = AsyncSessionStore(connect_async(server.url, config), config)
        guard = AsyncContextGuard(store)
        await guard.warm_up()
        got = await gathered([guard.record_turn(f"s{i}", turn(i)) for i in range(250)])
        assert [g for g in got if isinstance(g, BaseException)] == []
        views = await gathered([guard.prepare(f"s{i}", "sys", model="gpt-4o")
                                for i in range(250)])
        assert [v for v in views if isinstance(v, BaseException)] == []
        await guard.aclose()
        await store.aclose()

    asyncio.run(main())


def test_the_pool_size_is_a_bound_calls_wait_for(server: RedisServer) -> None:
    async def main() -> None:
        client = connect_async(server.url, max_connections=3)
        assert isinstance(client.connection_pool, redis.asyncio.BlockingConnectionPool)
        store = AsyncSessionStore(client, StoreConfig(key_prefix="pool"))
        got = await gathered([store.append(f"s{i}", turn(i)) for i in range(40)])
        assert got == [2] * 40
        assert len(client.connection_pool._in_use_connections) == 0
        assert len(client.connection_pool._available_connections) <= 3
        await store.aclose()

    asyncio.run(main())


def test_the_wait_for_a_connection_is_bounded(server: RedisServer) -> None:
    """Redis stopped: the calls holding the connections time out, and those waiting for
    one fail too, with StoreUnavailable, within about the store's timeouts."""
    assert server.process is not None
    pid = server.process.pid

    async def main() -> None:
        config = StoreConfig(key_prefix="pool", socket_timeout=0.3, connect_timeout=0.3)
        store = AsyncSessionStore(connect_async(server.url, config, max_connections=2), config)
        await store.append("s", turn(0))
        os.kill(pid, signal.SIGSTOP)
        try:
            began = time.monotonic()
            got = await gathered([store.length("s") for _ in range(10)])
            took = time.monotonic() - began
        finally:
            os.kill(pid, signal.SIGCONT)
        assert all(isinstance(g, StoreUnavailable) for g in got), got
        assert took < 2.0
        assert await store.length("s") == 2
        await store.aclose()

    asyncio.run(main())
