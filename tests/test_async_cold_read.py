"""The async guard's cold read of a large session does not hold its event loop.

Decoding a read of several MB of stored JSON takes tens of milliseconds; done on the
loop thread, every other request of an async server waited that long. The flow yields
a large read's decode as a step of its own (:data:`shared.guard._flow.DECODE_OFF_LOOP_BYTES`),
which the async shell runs on a worker thread.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import fakeredis
import pytest
import redis
from hypothesis import HealthCheck, given, settings

from shared import AsyncContextGuard, ContextGuard
from shared.core.config import StoreConfig
from shared.core.messages import Message
from shared.core.viewcache import decode_view
from shared.core.wireview import carry
from shared.guard import _flow
from shared.store.aio import AsyncSessionStore, connect_async
from shared.store.sessions import SessionStore
from tests.guard_shells import SHELLS
from tests.test_guard import SYSTEM, coding_turn
from tests.test_guard_view import OPS, check_cached_views
from workers.harness.transcripts import load_transcripts

MODEL = "cold-read-window"
OVERRIDES = {MODEL: 100_000_000}  # the whole log fits: nothing is planned but the read
MESSAGES = 6_000  # at least: whole copies of the kit's transcripts (~8,600, ~10 MB)


def big_session(data_dir: Path) -> list[Message]:
    """At least :data:`MESSAGES` messages: the real transcripts, concatenated."""
    sessions = [[m for m in messages if m.role != "system"]
                for _, messages in load_transcripts(data_dir)]
    out: list[Message] = []
    while len(out) < MESSAGES:
        for messages in sessions:
            out.extend(messages)
    return out


@pytest.fixture
def seeded(real_redis: redis.Redis, key_prefix: str, data_dir: Path,
           ) -> tuple[StoreConfig, int]:
    """The store's settings, and how many messages the large session holds."""
    config = StoreConfig(key_prefix=key_prefix, max_messages_per_session=100_000,
                         socket_timeout=30.0)
    store = SessionStore(real_redis, config)
    messages = big_session(data_dir)
    for i in range(0, len(messages), 500):
        store.append("big", messages[i:i + 500])
    store.append("small", [{"role": "user", "content": "hi"}])
    return config, len(messages)


@pytest.mark.redis
def test_a_cold_prepare_of_a_large_session_leaves_the_loop_running(
        redis_url: str, seeded: tuple[StoreConfig, int], monkeypatch: pytest.MonkeyPatch,
) -> None:
    config, count = seeded
    threads: list[int] = []

    def decode_where(*args: Any) -> Any:
        threads.append(threading.get_ident())
        return decode_view(*args)

    monkeypatch.setattr(_flow, "decode_view", decode_where)

    async def main() -> tuple[float, float, int]:
        store = AsyncSessionStore(connect_async(redis_url, config), config)
        raw = await store.read_view("big", with_counts=True)
        size = sum(map(len, raw.messages))
        # The heap as it is now left out of the collector's full passes: one that falls in
        # the decode stops every thread alike (~150 ms over a large heap), measuring the
        # host's heap, not where the decode runs.
        gc.collect()
        gc.freeze()
        began = time.perf_counter()
        decode_view(raw, None, carry)  # what the prepare decodes, timed alone
        decode = time.perf_counter() - began
        del raw

        guard = AsyncContextGuard(store, overrides=OVERRIDES)
        await guard.warm_up()
        await guard.prepare("small", "sys", model=MODEL)  # anything loaded once, loaded
        gaps: list[float] = []
        stop = asyncio.Event()

        async def ticker() -> None:
            while not stop.is_set():
                began = time.perf_counter()
                await asyncio.sleep(0.001)
                gaps.append(time.perf_counter() - began)

        task = asyncio.create_task(ticker())
        await asyncio.sleep(0.02)
        threads.clear()
        view = await guard.prepare("big", "sys", model=MODEL)
        assert threads and threading.get_ident() not in threads  # decoded on another thread
        await asyncio.sleep(0.02)
        stop.set()
        await task
        assert len(view.messages) == count + 1  # the system prompt, then every message
        await guard.aclose()
        await store.aclose()
        return max(gaps), decode, size

    try:
        stall, decode, size = asyncio.run(main())
    finally:
        gc.unfreeze()
    assert size > _flow.DECODE_OFF_LOOP_BYTES
    # the loop kept ticking (a worker thread's decode hands the GIL back every 5 ms); on
    # the loop thread, the longest gap was the whole decode. Loose: the rest of a cold
    # prepare (the read's parse, the plan) runs on the loop, and CI shares two cores
    assert stall < decode, \
        f"the loop stalled {stall * 1e3:.1f} ms (decode alone: {decode * 1e3:.1f} ms)"


@pytest.mark.redis
def test_the_sync_guard_decodes_a_large_read_in_line(
        seeded: tuple[StoreConfig, int], real_redis: redis.Redis) -> None:
    """The same read through the blocking shell: the decode step is a plain call, and the
    view is cached (the next prepare reads nothing new)."""
    config, count = seeded
    guard = ContextGuard(SessionStore(real_redis, config), overrides=OVERRIDES,
                         watch_changes=False)
    first = guard.prepare("big", "sys", model=MODEL)
    assert len(first.messages) == count + 1
    cached = guard.views.get("big")
    assert cached is not None and cached.end == count
    again = guard.prepare("big", "sys", model=MODEL)
    assert again.messages == first.messages


@pytest.mark.parametrize("shell_name", SHELLS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS)
def test_views_decoded_as_a_step_equal_fresh_reads(shell_name: str,
                                                   ops: list[tuple[str, int]]) -> None:
    """Every read that brings a message decoded as a step of its own (the async shell's
    worker thread): the cached views still agree with the store, whatever happened."""
    with mock.patch.object(_flow, "DECODE_OFF_LOOP_BYTES", 0):
        check_cached_views(SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="c")),
                           shell_name, ops)


def test_small_reads_are_decoded_in_line(store: SessionStore,
                                         make_guard: Callable[..., Any]) -> None:
    """A turn's few messages read (no change feed: every prepare reads) take no step of
    their own: a warm prepare never hops to a thread."""
    guard = make_guard(store, watch_changes=False)

    def refused(*_: Any) -> Any:
        raise AssertionError("a small read was decoded as a step")

    with mock.patch.object(_flow.GuardFlow, "decoded", staticmethod(refused)):
        for step in range(3):
            guard.record_turn("s", coding_turn(step, 200))
            view = guard.prepare("s", SYSTEM, model="gpt-4o")
            assert len(view.messages) == 1 + 5 * (step + 1)
