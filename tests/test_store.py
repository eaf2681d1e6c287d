"""The session store on fakeredis and on a real redis-server."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import redis

from shared.config import StoreConfig
from shared.errors import InvalidInput, LimitExceeded, StoreUnavailable
from shared.keys import SessionKeys
from shared.records import SummaryRecord
from shared.store import SessionStore, connect


def turn(i: int) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": f"question {i}"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": f"c{i}", "name": "read_file", "arguments": '{"path": "a.py"}'}]},
        {"role": "tool", "tool_call_id": f"c{i}", "content": "x" * 40},
        {"role": "assistant", "content": f"answer {i}"},
    ]


def summary(w: int, kind: str = "llm", text: str = "sum") -> SummaryRecord:
    return SummaryRecord(watermark=w, kind=kind, text=text, tokens=5)  # type: ignore[arg-type]


def test_append_returns_length_and_running_totals(store: SessionStore) -> None:
    assert store.append("s", turn(0)) == 4
    assert store.append("s", turn(1)) == 8
    per_message = [store.counter.message(m) for m in store.messages("s")]
    assert store.range_tokens("s", 0, 8) == sum(per_message)
    assert store.range_tokens("s", 2, 5) == sum(per_message[2:5])
    assert store.range_tokens("s", 3, 3) == 0
    view = store.load_view("s")
    assert view.length == 8 and view.history_tokens == sum(per_message)


def test_append_is_all_or_nothing(store: SessionStore) -> None:
    store.append("s", turn(0))
    bad = [*turn(1), {"role": "tool", "content": "no id"}]
    with pytest.raises(InvalidInput, match=r"messages\[4\]\.tool_call_id"):
        store.append("s", bad)
    assert store.length("s") == 4


def test_limits(any_redis: Any, key_prefix: str) -> None:
    cfg = StoreConfig(key_prefix=key_prefix, max_message_bytes=200, max_messages_per_call=3,
                      max_messages_per_session=5)
    s = SessionStore(any_redis, cfg)
    with pytest.raises(LimitExceeded, match="bytes per message"):
        s.append("s", [{"role": "user", "content": "y" * 500}])
    with pytest.raises(LimitExceeded, match="4 messages in one call"):
        s.append("s", turn(0))
    s.append("s", turn(0)[:3])
    with pytest.raises(LimitExceeded, match="exceed 5 messages"):
        s.append("s", turn(1)[:3])
    assert s.length("s") == 3


def test_commit_summary_compare_and_swap(store: SessionStore) -> None:
    store.append("s", turn(0) + turn(1))
    first = store.commit_summary("s", summary(4), expected_version=0)
    assert first.ok and first.version == 1 and first.watermark == 4
    stale = store.commit_summary("s", summary(8), expected_version=0)
    assert not stale.ok and stale.reason == "version"
    backwards = store.commit_summary("s", summary(2), expected_version=1)
    assert not backwards.ok and backwards.reason == "backwards"
    beyond = store.commit_summary("s", summary(9), expected_version=1)
    assert not beyond.ok and beyond.reason == "beyond_log"
    state = store.state("s")
    assert (state.version, state.watermark, state.summary_kind) == (1, 4, "llm")
    view = store.load_view("s")
    assert view.summary is not None and view.summary.watermark == 4
    assert len(view.history) == 4


def test_truncate_after_falls_back_to_newest_covering_summary(store: SessionStore) -> None:
    for i in range(4):
        store.append("s", turn(i))
    assert store.commit_summary("s", summary(4, text="a"), 0).ok
    assert store.commit_summary("s", summary(12, text="b"), 1).ok
    state = store.truncate_after("s", 9)
    assert state.version == 3 and state.watermark == 4
    assert store.length("s") == 9
    assert [r.watermark for r in store.summaries("s")] == [4]
    # A worker that read version 2 can no longer write.
    assert not store.commit_summary("s", summary(8), 2).ok
    with pytest.raises(InvalidInput, match="index"):
        store.truncate_after("s", 99)


def test_rewind(store: SessionStore) -> None:
    for i in range(3):
        store.append("s", turn(i))
    store.commit_summary("s", summary(4, text="first"), 0)
    store.commit_summary("s", summary(8, text="second"), 1)
    state = store.rewind("s", 4)
    assert state.watermark == 4 and state.version == 3
    assert store.length("s") == 12  # the log is untouched
    assert store.rewind("s", 0).watermark == 0
    with pytest.raises(InvalidInput, match="no kept summary"):
        store.rewind("s", 5)


def test_retention_keeps_newest(any_redis: Any, key_prefix: str) -> None:
    s = SessionStore(any_redis, StoreConfig(key_prefix=key_prefix, summary_retention=2))
    for i in range(4):
        s.append("s", turn(i))
    for v, w in enumerate((4, 8, 12)):
        assert s.commit_summary("s", summary(w), v).ok
    assert [r.watermark for r in s.summaries("s")] == [8, 12]


def test_keys_share_a_hash_tag_and_ids_are_validated() -> None:
    k = SessionKeys.for_session("cmp", "acme", "user:42")
    tags = {key[key.index("{"): key.index("}") + 1] for key in
            (k.log, k.cum, k.state, k.summaries, k.summary_index, k.cheap, k.pending,
             k.lease, k.dirty)}
    assert tags == {"{acme:user:42}"}
    for bad in ("", "a b", "x}*", "../etc", "{evil}", "a" * 200, "é"):
        with pytest.raises(InvalidInput, match="session_id"):
            SessionKeys.for_session("cmp", "acme", bad)
    for bad in ("", "a:b", "t{", "*"):
        with pytest.raises(InvalidInput, match="tenant"):
            SessionKeys.for_session("cmp", bad, "s")


def test_tenants_are_isolated(any_redis: Any, key_prefix: str) -> None:
    cfg = StoreConfig(key_prefix=key_prefix)
    a = SessionStore(any_redis, cfg, tenant="a")
    b = SessionStore(any_redis, cfg, tenant="b")
    a.append("s", turn(0))
    assert b.length("s") == 0 and b.load_view("s").length == 0
    b.append("s", turn(1)[:1])
    assert a.length("s") == 4


def test_lease_and_flags(store: SessionStore) -> None:
    token = store.acquire_lease("s", 5)
    assert token is not None and store.acquire_lease("s", 5) is None
    assert not store.release_lease("s", "not-the-owner")
    assert store.extend_lease("s", token, 5)
    assert store.release_lease("s", token)
    assert store.acquire_lease("s", 5) is not None
    assert store.mark_pending("s") and not store.mark_pending("s")
    store.clear_pending("s")
    assert store.mark_pending("s")
    assert not store.take_dirty("s")
    store.mark_dirty("s")
    assert store.take_dirty("s") and not store.take_dirty("s")


def test_ttl_refreshed_on_writes(any_redis: Any, key_prefix: str) -> None:
    s = SessionStore(any_redis, StoreConfig(key_prefix=key_prefix, ttl_seconds=100))
    s.append("s", turn(0))
    assert 0 < any_redis.ttl(s.keys("s").log) <= 100
    s.commit_summary("s", summary(4), 0)
    assert 0 < any_redis.ttl(s.keys("s").summaries) <= 100


def test_unreachable_redis_raises_typed_error_quickly() -> None:
    cfg = StoreConfig(socket_timeout=0.2, connect_timeout=0.2)
    s = SessionStore(connect("redis://127.0.0.1:1/0", cfg), cfg)
    with pytest.raises(StoreUnavailable):
        s.load_view("s")
    with pytest.raises(StoreUnavailable):
        s.append("s", turn(0))


def test_concurrent_appends_and_summaries_on_real_redis(real_redis: redis.Redis,
                                                        key_prefix: str) -> None:
    """Threads appending and committing at once: nothing lost, watermark never backwards."""
    s = SessionStore(real_redis, StoreConfig(key_prefix=key_prefix))
    s.append("s", turn(0))
    errors: list[BaseException] = []
    seen: dict[int, list[int]] = {}

    def appender(worker: int) -> None:
        try:
            for i in range(50):
                s.append("s", turn((worker + 1) * 1000 + i))
        except BaseException as exc:  # pragma: no cover - surfaced below
            errors.append(exc)

    def summarizer(me: int) -> None:
        watermarks = seen.setdefault(me, [])
        try:
            for _ in range(200):
                state = s.state("s")
                length = s.length("s")
                target = (length // 4) * 4  # a turn boundary
                if target > state.watermark:
                    s.commit_summary("s", summary(target), state.version)
                watermarks.append(s.state("s").watermark)
        except BaseException as exc:  # pragma: no cover
            errors.append(exc)

    threads = [threading.Thread(target=appender, args=(w,)) for w in range(4)]
    threads += [threading.Thread(target=summarizer, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert s.length("s") == 4 + 4 * 50 * 4
    for watermarks in seen.values():  # what each observer saw never went back
        assert watermarks == sorted(watermarks) and watermarks[-1] > 0
    final = s.state("s")
    history = [r.watermark for r in s.summaries("s")]
    assert history == sorted(history) and final.watermark == history[-1]
    contents = [m.text() for m in s.messages("s") if m.role == "user"]
    assert len(contents) == len(set(contents)) == 1 + 4 * 50
