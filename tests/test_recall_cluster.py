"""The recall index on a real three-master Redis Cluster (and Redis 6.2 when available):
every script declares the keys it touches, all under the session's hash tag."""

from __future__ import annotations

import pytest

import shared.store.recall_index as recall_index_module
from shared.store import commands
from shared.store.recall_index import drop_index, forget_after, index_compacted, index_stats
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


def bounded_calls(store: SessionStore) -> None:
    """The bounded calls (recall_index.BATCH_TERMS, CUT_PASSAGES and commands.BULK_CHUNK
    lowered by the caller): a message indexed in parts, a cut in many calls, a chunked
    view read, an edit to 0 (UNLINK in truncate.lua and recall_cut.lua): one slot each."""
    for n in range(3):
        sid = f"b{n}"
        store.append(sid, [{"role": "user", "content": " ".join(f"w{j}" for j in range(40))}])
        fill(store, sid, range(20), f"SESSION_{n}_MARK")
        assert len(store.read_view(sid).messages) == 41  # 6 chunks of 8
        commit(store, sid, 41)
        assert index_compacted(store, sid).end == 41
        assert recall(store, sid, "w33", limit=1)[0].index == 0
        store.truncate_after(sid, 20)
        assert index_stats(store, sid)["indexed_until"] == 20
        store.truncate_after(sid, 0)
        assert index_stats(store, sid)["indexed_until"] == 0 and store.length(sid) == 0
        store.delete_session(sid)


@pytest.fixture
def bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recall_index_module, "BATCH_TERMS", 8)
    monkeypatch.setattr(recall_index_module, "CUT_PASSAGES", 3)
    monkeypatch.setattr(commands, "BULK_MESSAGES", 2)
    monkeypatch.setattr(commands, "BULK_CHUNK", 8)


def test_recall_on_a_three_master_cluster(cluster: LocalCluster,
                                          key_prefix: str, bounds: None) -> None:
    exercise(cluster_store(cluster, key_prefix))
    bounded_calls(cluster_store(cluster, key_prefix))


def test_recall_on_a_redis_62_cluster(cluster62: LocalCluster, key_prefix: str,
                                      bounds: None) -> None:
    exercise(cluster_store(cluster62, key_prefix))
    bounded_calls(cluster_store(cluster62, key_prefix))
