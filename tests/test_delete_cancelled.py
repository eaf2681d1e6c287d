"""A delete the caller cancels midway still removes the whole session, its recall
index included: a session's index keys live outside its hash-tagged keys, and without a
session TTL nothing else would ever remove them."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis

from shared.core.config import StoreConfig
from shared.core.messages import Message
from shared.core.records import SummaryRecord
from shared.store import recall_index
from shared.store.aio import AsyncSessionStore, connect_async
from shared.store.sessions import SessionStore


def _indexed_session(store: SessionStore, sid: str) -> None:
    turns = []
    for i in range(6):
        turns += [Message(role="user", content=f"please look at module_{i}.py and fix bug {i}"),
                  Message(role="assistant", content=f"fixed bug {i} in module_{i}.py")]
    store.append(sid, turns)
    record = SummaryRecord(watermark=8, kind="llm", text="Fixed bugs 0-3.", tokens=10)
    assert store.commit_summary(sid, record, store.state(sid).version).ok
    recall_index.index_compacted(store, sid)
    assert recall_index.index_stats(store, sid)["passages"] > 0


def _keys(client: redis.Redis, prefix: str) -> list[bytes]:
    return list(client.scan_iter(match=f"{prefix}:*", count=1000))


@pytest.mark.parametrize("stage", ["unlink", "index"])
def test_a_cancelled_async_delete_still_removes_the_index(
        redis_url: str, real_redis: redis.Redis, key_prefix: str,
        monkeypatch: pytest.MonkeyPatch, stage: str) -> None:
    config = StoreConfig(key_prefix=key_prefix)
    _indexed_session(SessionStore(real_redis, config), "s")
    assert _keys(real_redis, key_prefix)

    async def scenario() -> None:
        store = AsyncSessionStore(connect_async(redis_url, config), config)
        reached = asyncio.Event()
        if stage == "index":  # cancelled once the session's own keys are gone
            real_drive = recall_index.drive_async

            async def slow_drive(*args: Any) -> Any:
                reached.set()
                await asyncio.sleep(0.05)
                return await real_drive(*args)

            monkeypatch.setattr(recall_index, "drive_async", slow_drive)
        else:  # cancelled while the UNLINK is on its way
            real_unlink = store.redis.unlink

            async def slow_unlink(*keys: Any) -> Any:
                reached.set()
                await asyncio.sleep(0.05)
                return await real_unlink(*keys)

            monkeypatch.setattr(store.redis, "unlink", slow_unlink)
        try:
            task = asyncio.create_task(store.delete_session("s"))
            await reached.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            for _ in range(100):  # the delete finishes on its own, the caller gone
                await asyncio.sleep(0.02)
                if not _keys(real_redis, key_prefix):
                    break
        finally:
            await asyncio.sleep(0.2)
            await store.aclose()

    asyncio.run(scenario())
    assert _keys(real_redis, key_prefix) == []
