"""The pending sweep: jobs lost between the broker and a worker are published again with no
new turn (workers.sweep, rearm_lost.lua, shared.store.commands.flag_stale)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest
import redis

from shared.core.config import StoreConfig
from shared.guard import ContextGuard
from shared.store.commands import flag_stale
from shared.store.keys import pending_pattern, session_of_pending
from shared.store.sessions import SessionStore, connect_cluster
from workers.harness.demo_session import SYSTEM_PROMPT, TOOLS, demo_turns
from workers.harness.stack.redis_server import LocalCluster
from workers.harness.stack.worker_process import WorkerProcess, purge_queue, worker_env
from workers.harness.timing import wait_for
from workers.settings import Settings
from workers.sweep import PendingSweep, SweepThread, build_sweep
from workers.urls import with_db

TTL, STALE = 60, 20
CONFIG = StoreConfig(key_prefix="sw", pending_ttl_seconds=TTL, pending_stale_seconds=STALE)


class Published:
    """A publisher that records (tenant, session id), thread-safe."""

    def __init__(self) -> None:
        self.jobs: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def __call__(self, tenant: str, session_id: str) -> None:
        with self._lock:
            self.jobs.append((tenant, session_id))


@pytest.fixture
def client() -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis()


def store_of(client: Any, tenant: str = "default") -> SessionStore:
    return SessionStore(client, CONFIG, tenant=tenant)


def flag(client: Any, tenant: str, session_id: str, age: float) -> str:
    """Set a session's pending flag as if set ``age`` seconds ago with the config's TTL."""
    key = store_of(client, tenant).keys(session_id).pending
    client.set(key, "1", px=int((TTL - age) * 1000))
    return key


def test_flag_stale_is_the_appends_rule() -> None:
    assert flag_stale((TTL - STALE) * 1000, CONFIG)  # exactly the stale age
    assert flag_stale(1, CONFIG)
    assert not flag_stale((TTL - STALE) * 1000 + 1, CONFIG)  # a millisecond younger
    assert not flag_stale(-1, CONFIG)  # no expiry: its age cannot be told
    assert not flag_stale(-2, CONFIG)  # no flag
    never = StoreConfig(pending_ttl_seconds=TTL, pending_stale_seconds=0)
    assert not flag_stale(1, never)


def test_pending_keys_of_every_tenant_are_parsed_and_nothing_else() -> None:
    assert pending_pattern("sw") == "sw:{*}:pending"
    assert session_of_pending("sw", b"sw:{acme:s:1}:pending") == ("acme", "s:1")
    for key in ("sw:{acme:s1}:lease", "sw:rx:{acme:s1}:pending", "other:{acme:s1}:pending",
                "sw:{acme}:pending", "sw:{ac me:s1}:pending", "sw:{acme:*x}:pending"):
        assert session_of_pending("sw", key) is None, key


def test_a_stale_unleased_flag_is_rearmed_once(client: fakeredis.FakeRedis) -> None:
    store = store_of(client)
    key = flag(client, "default", "s1", STALE + 1)
    assert store.rearm_lost("s1")
    assert client.pttl(key) > (TTL - 1) * 1000  # young again: a fresh TTL
    assert not store.rearm_lost("s1")  # the second caller publishes nothing


def test_a_young_flag_is_left_alone(client: fakeredis.FakeRedis) -> None:
    key = flag(client, "default", "s1", STALE - 2)
    before = client.pttl(key)
    assert not store_of(client).rearm_lost("s1")
    assert client.pttl(key) <= before
    assert not store_of(client).rearm_lost("gone")  # no flag: claimed by a worker


def test_a_leased_session_is_left_alone(client: fakeredis.FakeRedis) -> None:
    store = store_of(client)
    flag(client, "default", "s1", STALE + 5)
    assert store.acquire_lease("s1", 30) is not None
    assert not store.rearm_lost("s1")
    published = Published()
    report = PendingSweep(store, published, 60).sweep()
    assert (report.flags, report.stale, report.republished, published.jobs) == (1, 1, 0, [])


def test_a_flag_rearmed_by_an_append_meanwhile_is_left_alone(
        client: fakeredis.FakeRedis) -> None:
    store = store_of(client)
    store.append("s1", [{"role": "user", "content": "hello"}])
    flag(client, "default", "s1", STALE + 5)
    # the session's next turn re-arms the stale flag itself (its caller publishes)
    result = store.append_encoded("s1", store.encode("s1", [{"role": "user", "content": "x"}]),
                                  mark_pending=True)
    assert result.republished
    assert not store.rearm_lost("s1")
    assert store.mark_pending("s1") == 0  # and the sweep's re-arm leaves appends alone too
    flag(client, "default", "s2", STALE + 5)
    assert store.rearm_lost("s2")
    assert store.mark_pending("s2") == 0


def test_the_sweep_publishes_stale_flags_of_every_tenant_once(
        client: fakeredis.FakeRedis) -> None:
    stale = {("default", "a"), ("acme", "b"), ("acme", "c:1")}
    for tenant, sid in stale:
        flag(client, tenant, sid, STALE + 3)
    flag(client, "acme", "young", 1)
    client.set("sw:rx:{acme:b}:pending", "1", px=1000)  # not a session's flag
    client.set("sw:{acme:nottl}:pending", "1")  # no expiry: never taken for stale
    published = Published()
    report = PendingSweep(store_of(client), published, 60, scan_count=2).sweep()
    assert sorted(published.jobs) == sorted(stale)
    assert (report.flags, report.stale, report.republished, report.failed) == (5, 3, 3, 0)
    again = Published()
    PendingSweep(store_of(client), again, 60).sweep()
    assert again.jobs == []  # re-armed: young for another stale period


def test_two_sweepers_racing_publish_once(client: fakeredis.FakeRedis) -> None:
    sessions = [("default", f"s{i}") for i in range(200)]
    for tenant, sid in sessions:
        flag(client, tenant, sid, STALE + 3)
    published = Published()
    sweeps = [PendingSweep(store_of(client), published, 60, scan_count=10) for _ in range(4)]
    start = threading.Barrier(len(sweeps))

    def run(sweep: PendingSweep) -> None:
        start.wait()
        sweep.sweep()

    threads = [threading.Thread(target=run, args=(s,)) for s in sweeps]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(published.jobs) == sorted(sessions)  # each once, whoever re-armed it


def test_one_sweeper_per_period_by_the_lock(client: fakeredis.FakeRedis) -> None:
    flag(client, "default", "s1", STALE + 3)
    published = Published()
    first = PendingSweep(store_of(client), published, 0.3)
    second = PendingSweep(store_of(client), published, 0.3)
    assert first.run_once() is not None
    assert second.run_once() is None  # the period's lock is held
    time.sleep(0.35)
    assert second.run_once() is not None
    assert published.jobs == [("default", "s1")]


def test_a_failed_publish_is_counted_and_tried_again_a_stale_period_later(
        client: fakeredis.FakeRedis) -> None:
    key = flag(client, "default", "s1", STALE + 3)

    def broken(tenant: str, session_id: str) -> None:
        raise ConnectionError("broker away")

    report = PendingSweep(store_of(client), broken, 60).sweep()
    assert (report.stale, report.republished, report.failed) == (1, 0, 1)
    client.pexpire(key, (TTL - STALE - 1) * 1000)  # a stale period later
    published = Published()
    PendingSweep(store_of(client), published, 60).sweep()
    assert published.jobs == [("default", "s1")]


@pytest.mark.redis
def test_the_sweep_walks_every_primary_of_a_cluster(cluster: LocalCluster,
                                                    key_prefix: str) -> None:
    config = StoreConfig(key_prefix=key_prefix, pending_ttl_seconds=TTL,
                         pending_stale_seconds=STALE)
    client = connect_cluster(cluster.url, config)
    store = SessionStore(client, config)
    sessions = {("default", f"s{i}") for i in range(40)} | {("acme", f"s{i}") for i in range(5)}
    slots = set()
    try:
        for tenant, sid in sessions:
            key = SessionStore(client, config, tenant=tenant).keys(sid).pending
            client.set(key, "1", px=(TTL - STALE - 1) * 1000)
            slots.add(client.keyslot(key) * 3 // 16384)  # which third of the slots
        assert len(slots) == 3  # flags on every primary
        SessionStore(client, config).acquire_lease("s0", 30)
        published = Published()
        report = PendingSweep(store, published, 1, scan_count=7).run_once()
        assert report is not None and report.flags == len(sessions)
        assert sorted(published.jobs) == sorted(sessions - {("default", "s0")})
    finally:
        for key in client.scan_iter(match=f"{key_prefix}:*", count=1000):
            client.delete(key)
        client.close()


def test_the_thread_sweeps_each_period_and_stops_at_shutdown(
        client: fakeredis.FakeRedis) -> None:
    flag(client, "default", "s1", STALE + 3)
    published = Published()
    thread = SweepThread(PendingSweep(store_of(client), published, 0.2)).start()
    try:
        assert wait_for(lambda: published.jobs == [("default", "s1")], 5)
    finally:
        began = time.monotonic()
        thread.stop()
        assert time.monotonic() - began < 1
    stopped = threading.Event()
    stopped.set()
    flag(client, "default", "s2", STALE + 3)
    report = PendingSweep(store_of(client), published, 60).sweep(stopped)
    assert report.republished == 0  # a sweep told to stop reads no further


def test_the_setting_turns_the_sweep_off() -> None:
    assert Settings().sweep_seconds == 60
    assert build_sweep(Settings(sweep_seconds=0), app=None) is None
    assert build_sweep(Settings(pending_stale_seconds=0), app=None) is None


class Dropped:
    """An enqueuer whose jobs never reach a worker (lost between broker and worker)."""

    def __init__(self) -> None:
        self.jobs: list[tuple[str, str]] = []

    def enqueue(self, tenant: str, session_id: str) -> None:
        self.jobs.append((tenant, session_id))


@pytest.fixture
def urls(own_redis_url: str, key_prefix: str) -> Iterator[tuple[str, str]]:
    broker, store = with_db(own_redis_url, 12), with_db(own_redis_url, 11)
    purge_queue(broker)
    yield broker, store
    purge_queue(broker)
    client = redis.Redis.from_url(store)
    for key in client.scan_iter(match=f"{key_prefix}:*", count=1000):
        client.delete(key)
    client.close()


@pytest.mark.celery
@pytest.mark.slow
def test_a_session_whose_job_was_lost_is_compacted_with_no_new_turn(
        urls: tuple[str, str], key_prefix: str) -> None:
    broker, store_url = urls
    config = StoreConfig(key_prefix=key_prefix, pending_ttl_seconds=60, pending_stale_seconds=2)
    store = SessionStore(redis.Redis.from_url(store_url), config)
    lost = Dropped()
    guard = ContextGuard(store, lost, overrides={"gpt-4o": 24_000})
    for turn in demo_turns(45):  # the worker's trigger passed too (it has no overrides)
        guard.prepare("s1", SYSTEM_PROMPT, TOOLS, 2000, "gpt-4o", pending=turn[:1])
        guard.record_turn("s1", turn)
    assert lost.jobs  # the session became due; its jobs never reached the broker
    assert store.state("s1").watermark == 0 and store.is_pending("s1")
    env = worker_env(broker_url=broker, redis_url=store_url, key_prefix=key_prefix,
                     sweep_seconds="1", pending_ttl_seconds="60", pending_stale_seconds="2")
    worker = WorkerProcess("sweeper", env).start()
    try:  # no turn from here on: only the sweep can publish the job again
        assert wait_for(lambda: store.state("s1").watermark > 0, 20), worker.log()[-3000:]
        assert "published again by the sweep" in worker.log()
    finally:
        worker.stop()
        store.redis.close()
