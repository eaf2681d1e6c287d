"""The async guard when its own Redis stalls for a moment (SIGSTOP, then SIGCONT).

A stall shorter than the store's socket timeout but longer than the own-writes
connection's PING wait (:data:`shared.store.changes.IO_TIMEOUT`) must not leave that
connection with an unread ``PONG``: the next script would read it as its reply.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from typing import Any

import pytest

from shared import AsyncContextGuard
from shared.core.config import StoreConfig
from shared.core.errors import StoreUnavailable
from shared.store.aio import AsyncSessionStore, connect_async
from shared.store.own_writes_aio import AsyncOwnWrites
from workers.harness.stack.redis_server import RedisServer

pytestmark = pytest.mark.redis


@pytest.fixture
def server(pausable_redis: RedisServer) -> RedisServer:
    return pausable_redis  # stopped (SIGSTOP) and resumed by the tests


def turn(i: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"u{i}"}, {"role": "assistant", "content": f"a{i}"}]


async def warm(server: RedisServer) -> tuple[AsyncContextGuard, AsyncSessionStore]:
    store = AsyncSessionStore(connect_async(server.url), StoreConfig(key_prefix="stall"))
    guard = AsyncContextGuard(store)
    await guard.warm_up()
    assert isinstance(guard.own, AsyncOwnWrites)
    await guard.prepare("s", "sys", model="gpt-4o")
    await guard.record_turn("s", turn(0))
    await guard.prepare("s", "sys", model="gpt-4o")
    return guard, store


async def stalled(server: RedisServer, guard: AsyncContextGuard, call: Any) -> Any:
    """``call()`` while Redis is stopped for 0.4 s, after the own-writes connection's last
    answer has aged past the point where it must PING first; its result or exception."""
    assert server.process is not None
    pid = server.process.pid
    await asyncio.sleep(1.2)
    guard.mark()  # the change feed verified now: only the own-writes connection PINGs
    os.kill(pid, signal.SIGSTOP)
    asyncio.get_running_loop().call_later(0.4, os.kill, pid, signal.SIGCONT)
    try:
        return await call()
    except Exception as exc:
        return exc
    finally:
        os.kill(pid, signal.SIGCONT)


def test_a_stall_at_the_ping_leaves_no_reply_read_out_of_line(server: RedisServer) -> None:
    async def main() -> None:
        guard, store = await warm(server)
        got = await stalled(server, guard,
                            lambda: guard.record_turn("s", turn(1), request_id="x"))
        assert isinstance(got, (int, StoreUnavailable)), repr(got)
        assert await store.length("s") == 4
        assert await guard.record_turn("s", turn(1), request_id="x") == 4  # the retry
        assert await guard.record_turn("s", turn(2)) == 6
        view = await guard.prepare("s", "sys", model="gpt-4o")
        assert [m.content for m in view.messages[1:]] == ["u0", "a0", "u1", "a1", "u2", "a2"]
        await guard.aclose()
        await store.aclose()

    asyncio.run(main())


def test_a_stall_at_the_ping_before_a_prepare_write(server: RedisServer) -> None:
    async def main() -> None:
        guard, store = await warm(server)
        for i in (1, 2):
            await guard.record_turn("s", turn(i))
            await guard.prepare("s", "sys", model="gpt-4o")
        got = await stalled(server, guard, lambda: guard.prepare(
            "s", "sys", model="claude-sonnet-4-5", max_tokens=1000))
        assert not isinstance(got, Exception) or isinstance(got, StoreUnavailable), repr(got)
        for i in (3, 4):
            await guard.record_turn("s", turn(i))
            view = await guard.prepare("s", "sys", model="gpt-4o")
            assert view.messages[-1].content == f"a{i}"
        await guard.aclose()
        await store.aclose()

    asyncio.run(main())


def test_a_call_cancelled_mid_reply_leaves_the_connection_unused(server: RedisServer) -> None:
    """A guard call cut off by ``wait_for`` while Redis is stopped: its reply arrives later;
    the own-writes connection it was read on is not read again (nor silently reconnected
    without tracking), and a write by another client is seen by the next prepare."""
    async def main() -> None:
        guard, store = await warm(server)
        assert isinstance(guard.own, AsyncOwnWrites)
        got = await stalled(server, guard, lambda: asyncio.wait_for(
            guard.record_turn("s", turn(1), request_id="c"), 0.1))
        assert isinstance(got, (TimeoutError, StoreUnavailable)), repr(got)
        await asyncio.sleep(0.2)  # the append's reply is back by now
        for i in (2, 3):
            await guard.record_turn("s", turn(i))
            await guard.prepare("s", "sys", model="gpt-4o")
        other = AsyncSessionStore(connect_async(server.url), StoreConfig(key_prefix="stall"))
        await other.append("s", turn(9))
        await asyncio.sleep(0.05)
        view = await guard.prepare("s", "sys", model="gpt-4o")
        assert view.messages[-1].content == "a9"
        assert [m.content for m in view.messages[1:]] == \
            [m.content for m in await store.messages("s")]
        await other.aclose()
        await guard.aclose()
        await store.aclose()

    asyncio.run(main())


def test_the_change_feed_never_blocks_the_event_loop(server: RedisServer) -> None:
    """Redis stopped for 1.5 s while 10 tasks keep calling: the change feed's PING and its
    reconnection attempts happen off the event loop, which keeps running (they blocked it
    up to 250 ms an attempt)."""
    assert server.process is not None
    pid = server.process.pid

    async def main() -> None:
        config = StoreConfig(key_prefix="stall", socket_timeout=0.3, connect_timeout=0.3)
        store = AsyncSessionStore(connect_async(server.url, config), config)
        guard = AsyncContextGuard(store)
        await guard.warm_up()
        for i in range(10):
            await guard.record_turn(f"s{i}", turn(i))
            await guard.prepare(f"s{i}", "sys", model="gpt-4o")
        assert guard.feed is not None
        stop = asyncio.Event()
        lags: list[float] = []

        async def ticker() -> None:
            loop = asyncio.get_running_loop()
            while not stop.is_set():
                began = loop.time()
                await asyncio.sleep(0.005)
                lags.append(loop.time() - began - 0.005)

        async def caller(i: int) -> None:
            while not stop.is_set():
                with contextlib.suppress(StoreUnavailable):
                    await guard.prepare(f"s{i}", "sys", model="gpt-4o")
                await asyncio.sleep(0.01)

        tasks = [asyncio.create_task(ticker()), *(asyncio.create_task(caller(i))
                                                  for i in range(10))]
        await asyncio.sleep(0.1)
        guard.feed._verified = 0.0  # the feed's next check must PING
        os.kill(pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(1.5)
        finally:
            os.kill(pid, signal.SIGCONT)
        await asyncio.sleep(0.3)
        stop.set()
        await asyncio.gather(*tasks)
        # Blocking, each reconnection attempt held the loop ~250 ms (two to three in the
        # stall); one long lag alone is the host's scheduling on a loaded 2-core machine.
        assert sum(lag > 0.1 for lag in lags) <= 1, sorted(lags)[-5:]
        for _ in range(100):  # the feed reconnects (off the loop, after its backoff)
            await guard.prepare("s0", "sys", model="gpt-4o")
            if guard.feed.mark() is not None:
                break
            await asyncio.sleep(0.1)
        assert guard.feed.mark() is not None
        await guard.aclose()
        await store.aclose()

    asyncio.run(main())


def test_wait_for_cuts_a_prepare_off_while_redis_is_stopped(server: RedisServer) -> None:
    """``asyncio.wait_for(guard.prepare(...), 0.1)`` with Redis stopped and the change feed
    due for a PING: nothing blocks the loop past the deadline (the feed's PING blocked it
    250 ms)."""
    assert server.process is not None
    pid = server.process.pid

    async def main() -> None:
        guard, store = await warm(server)
        assert guard.feed is not None
        guard.feed._verified = 0.0
        os.kill(pid, signal.SIGSTOP)
        loop = asyncio.get_running_loop()
        try:
            began = loop.time()
            with contextlib.suppress(TimeoutError, StoreUnavailable):
                await asyncio.wait_for(guard.prepare("s", "sys", model="gpt-4o",
                                                     pending=turn(5)), 0.1)
            blocked_until = loop.time() - began
        finally:
            os.kill(pid, signal.SIGCONT)
        assert blocked_until < 0.3, blocked_until
        await guard.aclose()
        await store.aclose()

    asyncio.run(main())
