"""One AsyncContextGuard, more than one event loop: refused with a typed error that says
so, before anything is written (redis.asyncio's connections belong to one loop)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from shared import AsyncContextGuard
from shared.core.config import StoreConfig
from shared.core.errors import InvalidInput
from shared.store.aio import AsyncSessionStore, connect_async
from workers.harness.stack.redis_server import RedisServer, start_server

pytestmark = pytest.mark.redis


@pytest.fixture
def server() -> Iterator[RedisServer]:
    own = start_server()
    yield own
    own.remove()


def turn(i: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"u{i}"}, {"role": "assistant", "content": f"a{i}"}]


def stored(server: RedisServer) -> int:
    client = redis.Redis.from_url(server.url)
    try:
        return sum(int(client.llen(k)) for k in client.scan_iter(match="loops:*:log"))
    finally:
        client.close()


def test_sequential_asyncio_runs_sharing_a_guard(server: RedisServer) -> None:
    guard = AsyncContextGuard(AsyncSessionStore(connect_async(server.url),
                                                StoreConfig(key_prefix="loops")))

    async def one(i: int) -> int:
        await guard.prepare("s", "sys", model="gpt-4o", pending=turn(i)[:1])
        return await guard.record_turn("s", turn(i))

    assert asyncio.run(one(0)) == 2
    for i in (1, 2):
        with pytest.raises(InvalidInput, match="one event loop"):
            asyncio.run(one(i))
        with pytest.raises(InvalidInput, match="one event loop"):
            asyncio.run(guard.recall("s", "u0"))
    assert stored(server) == 2


def test_two_threads_each_with_its_loop(server: RedisServer) -> None:
    guard = AsyncContextGuard(AsyncSessionStore(connect_async(server.url),
                                                StoreConfig(key_prefix="loops")))
    first = asyncio.new_event_loop()
    ok = first.run_until_complete(guard.record_turn("a", turn(0)))
    assert ok == 2
    errors: list[BaseException] = []
    recorded: list[int] = []

    async def many(name: str) -> None:
        for i in range(50):
            try:
                recorded.append(await guard.record_turn(name, turn(i)))
                await guard.prepare(name, "sys", model="gpt-4o")
            except Exception as exc:
                errors.append(exc)

    other = threading.Thread(target=lambda: asyncio.run(many("b")))
    other.start()
    first.run_until_complete(many("a"))
    other.join()
    first.run_until_complete(guard.store.aclose())
    first.close()
    assert len(recorded) == 50 and len(errors) == 50
    assert all(isinstance(e, InvalidInput) and "one event loop" in str(e) for e in errors), \
        {type(e).__name__ for e in errors}
    assert stored(server) == 102
