"""The lost-job sweep's Prometheus metrics (workers.sweep, shared.telemetry.metrics): each
try of the period's lock counts by outcome, and a sweep counts the flags it read, the
stale ones, the jobs it published again and the publishes that failed.

A real Redis (the machine's or the run's, a key prefix of the test's own; a server of the
test's own where it is stopped or given an ACL) and a real prometheus_client registry.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from shared.core.config import StoreConfig
from shared.core.errors import StoreUnavailable
from shared.store.sessions import SessionStore, connect
from shared.telemetry.metrics import METRIC_NAMES, METRIC_ROLES, PrometheusMetrics, set_metrics
from workers.harness.stack.redis_server import RedisServer, free_port
from workers.harness.stack.worker_process import WorkerProcess, purge_queue, worker_env
from workers.harness.timing import wait_for
from workers.metrics import MULTIPROC_ENV
from workers.sweep import PendingSweep
from workers.urls import with_db

TTL, STALE = 60, 20
SWEEP_COUNTERS = ("compaction_sweep_pending_flags_total", "compaction_sweep_stale_flags_total",
                  "compaction_sweep_republished_total",
                  "compaction_sweep_publish_failures_total")


@pytest.fixture
def metrics() -> Iterator[PrometheusMetrics]:
    installed = PrometheusMetrics(role="worker")
    set_metrics(installed)
    yield installed
    set_metrics(None)


def config_of(prefix: str) -> StoreConfig:
    return StoreConfig(key_prefix=prefix, pending_ttl_seconds=TTL, pending_stale_seconds=STALE)


def flag(client: redis.Redis, prefix: str, session_id: str, age: float,
         tenant: str = "default") -> None:
    """A session's pending flag as if set ``age`` seconds ago with the config's TTL."""
    key = SessionStore(client, config_of(prefix), tenant=tenant).keys(session_id).pending
    client.set(key, "1", px=int((TTL - age) * 1000))


class Published:
    def __init__(self) -> None:
        self.jobs: list[tuple[str, str]] = []

    def __call__(self, tenant: str, session_id: str) -> None:
        self.jobs.append((tenant, session_id))


def broken(tenant: str, session_id: str) -> None:
    raise ConnectionError("broker away")


def value(m: PrometheusMetrics, name: str, **labels: str) -> float:
    return m.registry.get_sample_value(name, labels) or 0.0


def counts(m: PrometheusMetrics) -> tuple[float, ...]:
    return tuple(value(m, name) for name in SWEEP_COUNTERS)


def sweeps(m: PrometheusMetrics) -> dict[str, float]:
    outcomes = ("done", "locked", "store_unavailable", "failed")
    return {o: value(m, "compaction_sweeps_total", outcome=o) for o in outcomes
            if value(m, "compaction_sweeps_total", outcome=o)}


def test_stale_flags_count_as_seen_stale_and_published_again(
        real_redis: redis.Redis, key_prefix: str, metrics: PrometheusMetrics) -> None:
    for sid in ("a", "b"):
        flag(real_redis, key_prefix, sid, STALE + 3)
    flag(real_redis, key_prefix, "c", STALE + 3, tenant="acme")
    flag(real_redis, key_prefix, "young", 1)
    published = Published()
    store = SessionStore(real_redis, config_of(key_prefix))
    report = PendingSweep(store, published, 60, scan_count=2).run_once()
    assert report is not None and len(published.jobs) == 3
    assert sweeps(metrics) == {"done": 1}
    assert counts(metrics) == (4, 3, 3, 0)
    assert value(metrics, "compaction_sweep_duration_seconds_count") == 1
    assert 0 < value(metrics, "compaction_sweep_duration_seconds_sum") < 10


def test_young_flags_are_seen_and_nothing_else(
        real_redis: redis.Redis, key_prefix: str, metrics: PrometheusMetrics) -> None:
    for sid in ("a", "b"):
        flag(real_redis, key_prefix, sid, STALE - 5)
    store = SessionStore(real_redis, config_of(key_prefix))
    published = Published()
    assert PendingSweep(store, published, 60).run_once() is not None
    assert published.jobs == []
    assert sweeps(metrics) == {"done": 1}
    assert counts(metrics) == (2, 0, 0, 0)


def test_a_failed_publish_counts_as_a_publish_failure_not_a_failed_sweep(
        real_redis: redis.Redis, key_prefix: str, metrics: PrometheusMetrics) -> None:
    flag(real_redis, key_prefix, "a", STALE + 3)
    store = SessionStore(real_redis, config_of(key_prefix))
    assert PendingSweep(store, broken, 60).run_once() is not None
    assert sweeps(metrics) == {"done": 1}
    assert counts(metrics) == (1, 1, 0, 1)


def test_a_lock_held_by_another_worker_counts_as_locked_and_reads_nothing(
        real_redis: redis.Redis, key_prefix: str, metrics: PrometheusMetrics) -> None:
    flag(real_redis, key_prefix, "a", STALE + 3)
    store = SessionStore(real_redis, config_of(key_prefix))
    first, second = Published(), Published()
    assert PendingSweep(store, first, 60).run_once() is not None
    flag(real_redis, key_prefix, "b", STALE + 3)
    assert PendingSweep(store, second, 60).run_once() is None  # the other worker's lock
    assert (first.jobs, second.jobs) == ([("default", "a")], [])
    assert sweeps(metrics) == {"done": 1, "locked": 1}
    assert counts(metrics) == (1, 1, 1, 0)
    # a try that found the lock taken ran no sweep: no duration observed for it
    assert value(metrics, "compaction_sweep_duration_seconds_count") == 1


def test_a_stopped_store_counts_as_store_unavailable(
        own_redis: RedisServer, metrics: PrometheusMetrics) -> None:
    client = connect(own_redis.url, config_of("sm"))
    store = SessionStore(client, config_of("sm"))
    own_redis.stop()
    with pytest.raises(StoreUnavailable):
        PendingSweep(store, Published(), 60).run_once()
    assert sweeps(metrics) == {"store_unavailable": 1}
    assert counts(metrics) == (0, 0, 0, 0)
    # the lock's own command failed: no sweep ran, so no duration
    assert value(metrics, "compaction_sweep_duration_seconds_count") == 0
    client.close()


def test_a_store_lost_mid_sweep_counts_what_the_sweep_did_before(
        own_redis: RedisServer, metrics: PrometheusMetrics) -> None:
    admin = redis.Redis.from_url(own_redis.url)
    for sid in ("a", "b"):
        flag(admin, "sm", sid, STALE + 3)
    admin.close()
    client = connect(own_redis.url, config_of("sm"))
    published: list[str] = []

    def publish_then_lose_the_store(tenant: str, session_id: str) -> None:
        published.append(session_id)
        own_redis.stop()  # the next flag's re-arm finds no Redis

    store = SessionStore(client, config_of("sm"))
    with pytest.raises(StoreUnavailable):
        PendingSweep(store, publish_then_lose_the_store, 60).run_once()
    assert len(published) == 1
    assert sweeps(metrics) == {"store_unavailable": 1}
    assert counts(metrics) == (2, 2, 1, 0)  # the batch read, both stale, one re-published
    assert value(metrics, "compaction_sweep_duration_seconds_count") == 1
    client.close()


def test_a_sweep_cut_short_by_an_error_counts_failed_and_what_it_did(
        own_redis: RedisServer, metrics: PrometheusMetrics) -> None:
    """A user that may not run scripts (an ACL mistake): the re-arm is refused with
    NOPERM, a reply no retry mends; the flags read before it are counted."""
    admin = redis.Redis.from_url(own_redis.url)
    admin.execute_command("ACL", "SETUSER", "sweeper", "on", ">pw", "~*", "+@all",
                          "-evalsha", "-eval")
    flag(admin, "sm", "a", STALE + 3)
    url = own_redis.url.replace("redis://", "redis://sweeper:pw@")
    client = connect(url, config_of("sm"))
    store = SessionStore(client, config_of("sm"))
    with pytest.raises(redis.exceptions.ResponseError, match="no permissions"):
        PendingSweep(store, Published(), 60).run_once()
    assert sweeps(metrics) == {"failed": 1}
    assert counts(metrics) == (1, 1, 0, 0)
    assert value(metrics, "compaction_sweep_duration_seconds_count") == 1
    client.close()
    admin.close()


def test_two_sweepers_racing_count_each_job_once(
        real_redis: redis.Redis, key_prefix: str, metrics: PrometheusMetrics) -> None:
    for i in range(50):
        flag(real_redis, key_prefix, f"s{i}", STALE + 3)
    published = Published()
    store = SessionStore(real_redis, config_of(key_prefix))
    racers = [PendingSweep(store, published, 60, scan_count=5) for _ in range(3)]
    start = threading.Barrier(len(racers))

    def run(sweep: PendingSweep) -> None:
        start.wait()
        sweep.sweep()  # no lock: every racer reads every flag

    threads = [threading.Thread(target=run, args=(s,)) for s in racers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(published.jobs) == 50
    assert value(metrics, "compaction_sweep_republished_total") == 50


def test_the_sweep_series_are_the_workers() -> None:
    names = ("compaction_sweeps_total", "compaction_sweep_duration_seconds", *SWEEP_COUNTERS)
    for name in names:
        assert METRIC_ROLES[name] == {"worker"}, name
        assert name in METRIC_NAMES
    worker = PrometheusMetrics(role="worker")
    # there from the start, at 0, so a first job published again is seen by rate()
    assert value(worker, "compaction_sweep_republished_total") == 0
    assert worker.registry.get_sample_value("compaction_sweep_republished_total") == 0
    guard = PrometheusMetrics()
    assert guard.registry.get_sample_value("compaction_sweep_republished_total") is None
    guard.sweep_flags(seen=1, stale=0, republished=0, failed=0)  # created when recorded
    assert value(guard, "compaction_sweep_pending_flags_total") == 1


@pytest.mark.celery
@pytest.mark.slow
@pytest.mark.parametrize("pool", ["threads", "prefork"])
def test_a_real_worker_serves_its_sweeps_metrics(own_redis_url: str, key_prefix: str,
                                                 pool: str, tmp_path: Path) -> None:
    """The sweep runs in the worker's main process: under prefork too (jobs in children,
    served through the multiprocess directory) its counts reach /metrics."""
    from tests.test_metrics_worker import scrape, total

    broker, store_url = with_db(own_redis_url, 12), with_db(own_redis_url, 11)
    purge_queue(broker)
    client = redis.Redis.from_url(store_url)
    for sid in ("a", "b"):
        flag(client, key_prefix, sid, STALE + 3)
    port = free_port()
    env = worker_env(broker_url=broker, redis_url=store_url, key_prefix=key_prefix,
                     metrics_port=str(port), sweep_seconds="1",
                     pending_ttl_seconds=str(TTL), pending_stale_seconds=str(STALE))
    if pool == "prefork":
        env[MULTIPROC_ENV] = str(tmp_path)
    worker = WorkerProcess(f"sweep-{pool}", env, pool=pool, concurrency=1).start()
    try:
        assert wait_for(lambda: total(scrape(port), "compaction_sweep_republished_total") == 2,
                        30), worker.log()[-3000:]
        samples = scrape(port)
        assert total(samples, "compaction_sweeps_total", outcome="done") >= 1
        assert total(samples, "compaction_sweep_stale_flags_total") >= 2
        assert total(samples, "compaction_sweep_duration_seconds_count") >= 1
    finally:
        worker.stop()
        for key in client.scan_iter(match=f"{key_prefix}:*", count=1000):
            client.delete(key)
        purge_queue(broker)
        client.close()
