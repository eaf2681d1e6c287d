"""The recall index on a real three-master Redis Cluster (and Redis 6.2 when available):
every script declares the keys it touches, all under the session's hash tag."""

from __future__ import annotations

import pytest

from shared.store.recall_index import drop_index, forget_after, index_compacted
from shared.store.recall_query import recall
from shared.store.sessions import SessionStore
from tests.test_recall_index import commit, fill
from tests.test_store_cluster import cluster_store
from workers.harness.stack.redis_server import LocalCluster

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def exercise(store: SessionStore) -> None:
    for n in range(4):  # several sessions: several slots, so several nodes
        sid = f"r{n}"
        fill(store, sid, range(20), f"SESSION_{n}_MARK")
        commit(store, sid, 30)
        report = index_compacted(store, sid)
        assert (report.end, report.conflict) == (30, "")
        hit = recall(store, sid, f"ERR_STEP_{3 + n}_FAILED", limit=1)[0]
        assert hit.index == 2 * (3 + n) + 1
        assert all(f"SESSION_{n}_MARK" in h.text or h.role == "assistant"
                   for h in recall(store, sid, "handler", limit=10))
        store.truncate_after(sid, 10)
        forget_after(store, sid, 10)
        assert all(h.index < 10 for h in recall(store, sid, "ERR_STEP_8_FAILED", end=30))
        drop_index(store, sid)
        store.delete_session(sid)


def test_recall_on_a_three_master_cluster(cluster: LocalCluster,
                                          key_prefix: str) -> None:
    exercise(cluster_store(cluster, key_prefix))


def test_recall_on_a_redis_62_cluster(cluster62: LocalCluster, key_prefix: str) -> None:
    exercise(cluster_store(cluster62, key_prefix))
