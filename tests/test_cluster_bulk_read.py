"""A large view read whose slot starts moving between its two round trips.

A view longer than ``BULK_MESSAGES`` comes in two steps: the view script, then plain
``LRANGE`` reads in one ``MULTI``/``EXEC`` (:func:`shared.store.commands.view_steps`). If
a Redis Cluster starts moving the session's slot in between, the transaction meets keys
on two nodes: redis-py lets the redirection out of a transaction as a raw ``MovedError``
(not a store error). The read now falls back to the script, which the cluster clients
hold through the migration (``migration_wait``), and returns the whole view.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from shared.core.config import StoreConfig
from shared.core.errors import SlotMoved, StoreUnavailable
from shared.store import commands
from shared.store.aio import AsyncSessionStore
from shared.store.cluster_aio import connect_cluster_async
from shared.store.keys import SessionKeys
from shared.store.sessions import SessionStore, connect_cluster, typed_failure
from tests.cluster_support import started_cluster
from workers.harness.stack.redis_server import LocalCluster

pytestmark = [pytest.mark.slow, pytest.mark.redis]

TURNS = 10  # 20 messages: deferred when BULK_MESSAGES is 4


@pytest.fixture(scope="module")
def moving() -> Iterator[LocalCluster]:
    yield from started_cluster()


def _turn(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"u{i}"}, {"role": "assistant", "content": f"a{i}"}]


class _MoveAfterScript:
    """Starts a migration of the session's slot right after the view script answered:
    the log moved to the target, the other keys still on the source. A thread ends the
    migration ``after`` seconds later."""

    def __init__(self, cluster: LocalCluster, keys: SessionKeys, after: float) -> None:
        self.cluster, self.keys, self.after = cluster, keys, after
        self.slot = cluster.key_slot(keys.log)
        self.source = cluster.master_of_slot(self.slot)
        self.target = next(p for p in cluster.masters() if p != self.source)
        self.steps: list[str] = []
        self.thread: threading.Thread | None = None

    def seen(self, step: Any) -> None:
        self.steps.append(type(step).__name__)
        if self.thread is None and isinstance(step, commands.Command):
            self.cluster.begin_migration(self.slot, self.target)
            with redis.Redis(host="127.0.0.1", port=self.source, socket_timeout=5) as c:
                c.execute_command("MIGRATE", "127.0.0.1", self.target, "", 0, 5000,
                                  "KEYS", self.keys.log)
            self.thread = threading.Thread(target=self._finish)
            self.thread.start()

    def _finish(self) -> None:
        time.sleep(self.after)
        self.cluster.move_slot_keys(self.slot, self.source, self.target)
        self.cluster.end_migration(self.slot, self.target)

    def join(self) -> None:
        if self.thread is not None:
            self.thread.join()


@pytest.fixture(params=[4, 512], ids=["chunked", "one-batch"])
def small_bulk(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(commands, "BULK_MESSAGES", 4)
    monkeypatch.setattr(commands, "BULK_CHUNK", request.param)


def _config(key_prefix: str) -> StoreConfig:
    return StoreConfig(key_prefix=key_prefix, socket_timeout=0.5, connect_timeout=0.5)


def test_sync_bulk_read_survives_a_migration_starting_after_its_script(
        moving: LocalCluster, key_prefix: str, small_bulk: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    config = _config(key_prefix)
    client = connect_cluster(moving.url, config, migration_wait=5.0)
    store = SessionStore(client, config)
    try:
        for i in range(TURNS):
            store.append("big", _turn(i))
        mover = _MoveAfterScript(moving, store.keys("big"), after=0.4)
        send = store._send

        def watched(step: Any) -> Any:
            reply = send(step)
            mover.seen(step)
            return reply

        monkeypatch.setattr(store, "_send", watched)
        try:
            raw = store.read_view("big")
        finally:
            mover.join()
        assert [m.content for m in raw.decode_messages()] == [
            text for i in range(TURNS) for text in (f"u{i}", f"a{i}")]
        assert mover.steps[0] == "Command" and mover.steps[-1] == "Command"  # fell back
    finally:
        client.close()


def test_async_bulk_read_survives_a_migration_starting_after_its_script(
        moving: LocalCluster, key_prefix: str, small_bulk: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    config = _config(key_prefix)

    async def scenario() -> tuple[list[Any], list[str]]:
        client = connect_cluster_async(moving.url, config, migration_wait=5.0)
        store = AsyncSessionStore(client, config)
        try:
            for i in range(TURNS):
                await store.append("big", _turn(i))
            mover = _MoveAfterScript(moving, store.keys("big"), after=0.4)
            send = store._send

            async def watched(step: Any) -> Any:
                reply = await send(step)
                mover.seen(step)
                return reply

            monkeypatch.setattr(store, "_send", watched)
            try:
                raw = await store.read_view("big")
            finally:
                await asyncio.to_thread(mover.join)
            return [m.content for m in raw.decode_messages()], mover.steps
        finally:
            await client.aclose()

    contents, steps = asyncio.run(scenario())
    assert contents == [text for i in range(TURNS) for text in (f"u{i}", f"a{i}")]
    assert steps[0] == "Command" and steps[-1] == "Command"


@pytest.mark.parametrize("error", [
    redis.exceptions.MovedError("16206 127.0.0.1:7001"),
    redis.exceptions.AskError("16206 127.0.0.1:7001"),
    redis.exceptions.TryAgainError("Multiple keys request during rehashing of slot"),
], ids=["moved", "ask", "tryagain"])
def test_a_redirection_let_out_of_a_transaction_is_a_store_error(error: Exception) -> None:
    typed = typed_failure("view", error)
    assert isinstance(typed, SlotMoved) and isinstance(typed, StoreUnavailable)
    assert "slot is moving" in str(typed)
