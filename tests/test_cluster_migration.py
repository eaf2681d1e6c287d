"""Sessions keep working while their Redis Cluster slot is moved to another master.

During a migration Redis answers ``TRYAGAIN`` to a command naming several keys where it
does not hold them all (the store's scripts name keys that do not exist yet), and
``ASK`` for a key already moved. The cluster clients wait the migration out up to their
``migration_wait``, then fail with StoreUnavailable naming the slot (docs/cluster.md).
Each test moves a slot of a cluster of this module's own, slowly, under live guards.
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
from shared.core.errors import InvalidInput, StoreUnavailable
from shared.guard import AsyncContextGuard, ContextGuard
from shared.store.aio import AsyncSessionStore
from shared.store.cluster_aio import connect_cluster_async
from shared.store.cluster_wait import MAX_DELAY, MigrationWait, SlotMigrating
from shared.store.keys import DEFAULT_TENANT, SessionKeys
from shared.store.sessions import SessionStore, connect_cluster
from tests.cluster_support import started_cluster
from workers.harness.reliability.common import integrity
from workers.harness.stack.redis_server import LocalCluster

pytestmark = [pytest.mark.slow, pytest.mark.redis]

PATIENT = 20.0  # seconds of migration_wait: longer than any migration below


@pytest.fixture(scope="module")
def moving() -> Iterator[LocalCluster]:
    """A cluster of this module's own (3 masters): its slots get moved."""
    yield from started_cluster()


def config_for(key_prefix: str) -> StoreConfig:
    return StoreConfig(key_prefix=key_prefix, socket_timeout=0.5, connect_timeout=0.5)


def slot_of(cluster: LocalCluster, key_prefix: str, sid: str) -> int:
    return cluster.key_slot(SessionKeys.for_session(key_prefix, DEFAULT_TENANT, sid).log)


def same_slot(cluster: LocalCluster, key_prefix: str, count: int) -> list[str]:
    """``count`` session ids whose keys share one slot."""
    sids, n = ["m"], 0
    while len(sids) < count:
        n += 1
        if slot_of(cluster, key_prefix, f"m-{n}") == slot_of(cluster, key_prefix, "m"):
            sids.append(f"m-{n}")
    return sids


def turn(sid: str, i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"{sid} turn {i}"},
            {"role": "assistant", "content": f"{sid} done {i} " + "words " * 20}]


def elsewhere(cluster: LocalCluster, slot: int) -> int:
    source = cluster.master_of_slot(slot)
    return next(p for p in cluster.masters() if p != source)


def assert_stored_once(cluster: LocalCluster, config: StoreConfig,
                       acked: dict[str, list[int]]) -> None:
    """Every acknowledged turn stored exactly once, every session consistent."""
    client = connect_cluster(cluster.url, config)
    store = SessionStore(client, config)
    try:
        for sid, numbers in acked.items():
            stored = [int(str(m.content).rsplit(" ", 1)[1]) for m in store.messages(sid)
                      if m.role == "user"]
            assert stored == numbers, f"{sid}: stored {stored}, acknowledged {numbers}"
            assert integrity(store, sid, quiet=False) == []
    finally:
        client.close()


def test_sync_guards_keep_answering_while_their_slot_migrates(
        moving: LocalCluster, key_prefix: str) -> None:
    config = config_for(key_prefix)
    sids = same_slot(moving, key_prefix, 3)
    slot = slot_of(moving, key_prefix, sids[0])
    acked: dict[str, list[int]] = {sid: [] for sid in sids}
    errors: list[str] = []
    stop = threading.Event()

    def guard(sid: str) -> None:
        client = connect_cluster(moving.url, config, migration_wait=PATIENT)
        g = ContextGuard(SessionStore(client, config), None)
        i = 0
        try:
            while not stop.is_set():
                try:
                    g.prepare(sid, "system", None, 256, "gpt-4o", pending=turn(sid, i)[:1])
                    g.record_turn(sid, turn(sid, i))
                    acked[sid].append(i)
                    i += 1
                except Exception as exc:  # StoreUnavailable included: the defect
                    errors.append(f"{sid}: {type(exc).__name__}: {exc}")
                stop.wait(0.02)
        finally:
            client.close()

    threads = [threading.Thread(target=guard, args=(sid,)) for sid in sids]
    for t in threads:
        t.start()
    try:
        time.sleep(0.5)
        before = {sid: len(numbers) for sid, numbers in acked.items()}
        target = elsewhere(moving, slot)
        moved = moving.migrate_slot(slot, target, batch=1, pause=0.05, hold=0.5)
        time.sleep(0.3)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert moved >= 3 * 3, "each session's keys were moved one by one"
    assert moving.master_of_slot(slot) == target
    assert errors == []
    assert all(len(acked[sid]) > before[sid] for sid in sids)
    assert_stored_once(moving, config, acked)


def test_async_guards_keep_answering_while_their_slot_migrates(
        moving: LocalCluster, key_prefix: str) -> None:
    """Several tasks on one client: ``ASKING`` must go on the connection of the command
    it permits, whichever connections are free."""
    config = config_for(key_prefix)
    sids = same_slot(moving, key_prefix, 3)
    slot = slot_of(moving, key_prefix, sids[0])
    acked: dict[str, list[int]] = {sid: [] for sid in sids}
    errors: list[str] = []
    reads: list[int] = []

    async def scenario() -> int:
        client = connect_cluster_async(moving.url, config, migration_wait=PATIENT)
        store = AsyncSessionStore(client, config)
        guard = AsyncContextGuard(store)
        stop = asyncio.Event()

        async def agent(sid: str) -> None:
            i = 0
            while not stop.is_set():
                try:
                    await guard.prepare(sid, "system", max_tokens=256, model="gpt-4o",
                                        pending=turn(sid, i)[:1])
                    await guard.record_turn(sid, turn(sid, i))
                    acked[sid].append(i)
                    i += 1
                    reads.append(await store.length(sid))  # one key: follows ASK
                except Exception as exc:  # StoreUnavailable included: the defect
                    errors.append(f"{sid}: {type(exc).__name__}: {exc}")
                await asyncio.sleep(0.01)

        agents = [asyncio.create_task(agent(sid)) for sid in sids]
        try:
            await asyncio.sleep(0.5)
            target = elsewhere(moving, slot)
            moved = await asyncio.to_thread(moving.migrate_slot, slot, target, batch=1,
                                            pause=0.05, hold=0.5)
            await asyncio.sleep(0.3)
        finally:
            stop.set()
            await asyncio.gather(*agents)
            await guard.aclose()
            await client.aclose()
        return moved

    moved = asyncio.run(scenario())
    assert moved >= 3 * 3
    assert errors == []
    assert all(acked[sid] for sid in sids) and reads
    assert_stored_once(moving, config, acked)


def test_a_single_key_read_of_a_moved_key_follows_ask_on_the_async_client(
        moving: LocalCluster, key_prefix: str) -> None:
    """Every key moved, the slot not yet assigned: the source answers ``ASK``, and the
    target serves a read that comes with ``ASKING`` on its own connection."""
    config = config_for(key_prefix)
    sid = "ask"
    slot = slot_of(moving, key_prefix, sid)

    async def scenario() -> list[Any]:
        client = connect_cluster_async(moving.url, config, migration_wait=0.0)
        store = AsyncSessionStore(client, config)
        try:
            await store.append(sid, turn(sid, 0))
            target = elsewhere(moving, slot)
            ranges = next(v.slots for v in moving.topology() if v.port == target)
            on_target = [f"w{n}" for n in range(300)
                         if any(lo <= slot_of(moving, key_prefix, f"w{n}") <= hi
                                for lo, hi in ranges)][:30]
            # calls to the target at once: several free connections in its pool
            await asyncio.gather(*(store.length(other) for other in on_target))
            source = moving.begin_migration(slot, target)
            try:
                moving.move_slot_keys(slot, source, target)
                return list(await asyncio.gather(*(store.length(sid) for _ in range(8))))
            finally:
                moving.end_migration(slot, target)
        finally:
            await client.aclose()

    assert asyncio.run(scenario()) == [2] * 8


def _sync_call(cluster: LocalCluster, config: StoreConfig, sid: str, wait: float) -> float:
    client = connect_cluster(cluster.url, config, migration_wait=wait)
    store = SessionStore(client, config)
    try:
        began = time.monotonic()
        with pytest.raises(StoreUnavailable) as caught:
            store.append(sid, turn(sid, 1))
        took = time.monotonic() - began
        assert f"slot {slot_of(cluster, config.key_prefix, sid)} is being migrated" in str(
            caught.value)
        return took
    finally:
        client.close()


async def _async_call(cluster: LocalCluster, config: StoreConfig, sid: str,
                      wait: float) -> float:
    client = connect_cluster_async(cluster.url, config, migration_wait=wait)
    store = AsyncSessionStore(client, config)
    try:
        began = time.monotonic()
        with pytest.raises(StoreUnavailable) as caught:
            await store.append(sid, turn(sid, 1))
        took = time.monotonic() - began
        assert f"slot {slot_of(cluster, config.key_prefix, sid)} is being migrated" in str(
            caught.value)
        return took
    finally:
        await client.aclose()


@pytest.mark.parametrize("moved_keys", [False, True], ids=["keys-split", "keys-moved"])
def test_a_migration_longer_than_the_wait_is_store_unavailable_naming_the_slot(
        moving: LocalCluster, key_prefix: str, moved_keys: bool) -> None:
    """Keys split between the nodes (the source answers TRYAGAIN), or all moved (ASK,
    then TRYAGAIN from the target): the call fails once its wait is spent, not
    before, nothing written; the next call after the migration succeeds once."""
    config = config_for(key_prefix)
    sid = "long"
    slot = slot_of(moving, key_prefix, sid)
    wait = 0.8
    seed = SessionStore(connect_cluster(moving.url, config), config)
    seed.append(sid, turn(sid, 0))
    target = elsewhere(moving, slot)
    source = moving.begin_migration(slot, target)
    try:
        if moved_keys:
            moving.move_slot_keys(slot, source, target)
        else:  # one key of the session on each side
            log = SessionKeys.for_session(key_prefix, DEFAULT_TENANT, sid).log
            with redis.Redis(host="127.0.0.1", port=source, socket_timeout=5) as client:
                client.execute_command("MIGRATE", "127.0.0.1", target, "", 0, 5000,
                                       "KEYS", log)
        took_sync = _sync_call(moving, config, sid, wait)
        took_async = asyncio.run(_async_call(moving, config, sid, wait))
    finally:
        moving.move_slot_keys(slot, source, target)
        moving.end_migration(slot, target)
    for took in (took_sync, took_async):
        assert wait <= took < wait + 0.5
    seed.append(sid, turn(sid, 2))
    assert_stored_once(moving, config, {sid: [0, 2]})
    seed.redis.close()


def test_the_pauses_grow_to_a_tenth_of_a_second_and_stop_at_the_wait() -> None:
    wait = MigrationWait(0.5)
    pauses = [wait.pause(7, "n:1") for _ in range(5)]
    assert pauses == pytest.approx([0.01, 0.02, 0.04, 0.08, MAX_DELAY], abs=1e-9)
    wait.started -= 0.45  # as if 0.45 s had gone by: the last pause ends at the bound
    assert 0 < wait.pause(7, "n:1") <= 0.05 + 1e-3
    wait.started -= 0.1
    with pytest.raises(SlotMigrating, match=r"slot 7 is being migrated.*n:1.*0.5 s"):
        wait.pause(7, "n:1")


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), "1", True])
def test_migration_wait_must_be_finite_seconds(bad: Any) -> None:
    with pytest.raises(InvalidInput, match="migration_wait"):
        connect_cluster("redis://127.0.0.1:1", migration_wait=bad)
    with pytest.raises(InvalidInput, match="migration_wait"):
        connect_cluster_async("redis://127.0.0.1:1", migration_wait=bad)


def test_the_wait_is_a_setting_of_the_workers_and_a_field_of_the_store_config() -> None:
    from shared.core.config import StoreConfig
    from shared.core.errors import ConfigError
    from shared.store.cluster_wait import default_migration_wait
    from workers.settings import Settings, load_settings

    config = Settings(redis_cluster_migration_wait=2.5).store_config()
    assert config.cluster_migration_wait == 2.5 and default_migration_wait(config) == 2.5
    assert default_migration_wait(StoreConfig(socket_timeout=0.4, connect_timeout=0.3)) == 0.7
    with pytest.raises(ValueError, match="cluster_migration_wait"):
        StoreConfig(cluster_migration_wait=float("inf"))
    with pytest.raises(ConfigError, match="COMPACTION_REDIS_CLUSTER_MIGRATION_WAIT"):
        load_settings(redis_cluster_migration_wait=-1)
