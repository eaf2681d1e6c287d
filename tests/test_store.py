"""The session store on fakeredis and on a real redis-server."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import redis

from shared.core.config import StoreConfig
from shared.core.errors import InvalidInput, LimitExceeded, StoreUnavailable
from shared.core.records import CheapDecision, HistoryEdit, SummaryRecord, ViewCursor
from shared.store.keys import SessionKeys
from shared.store.sessions import SessionStore, connect
from tests.guard_shells import SHELLS, store_shell
from workers.harness.stack.redis_server import ReplyDroppingProxy


def turn(i: int) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": f"question {i}"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": f"c{i}", "name": "read_file", "arguments": '{"path": "a.py"}'}]},
        {"role": "tool", "tool_call_id": f"c{i}", "content": "x" * 40},
        {"role": "assistant", "content": f"answer {i}"},
    ]


def summary(w: int, kind: str = "llm", text: str = "sum") -> SummaryRecord:
    return SummaryRecord(watermark=w, kind=kind, text=text, tokens=5)


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


@pytest.mark.parametrize("shell", SHELLS)
def test_truncate_after_falls_back_to_newest_covering_summary(store: SessionStore,
                                                              shell: str) -> None:
    edits = store_shell(shell, store)
    for i in range(4):
        store.append("s", turn(i))
    assert store.commit_summary("s", summary(4, text="a"), 0).ok
    assert store.commit_summary("s", summary(12, text="b"), 1).ok
    state = edits.truncate_after("s", 9)
    assert state.version == 3 and state.watermark == 4
    assert store.length("s") == 9
    assert [r.watermark for r in store.summaries("s")] == [4]
    # A worker that read version 2 can no longer write.
    assert not store.commit_summary("s", summary(8), 2).ok
    with pytest.raises(InvalidInput, match="index") as past:
        edits.truncate_after("s", 99)
    assert past.value.field == "index" and "9 messages" in str(past.value)
    for bad in (-1, True, "3"):
        with pytest.raises(InvalidInput) as refused:
            edits.truncate_after("s", bad)
        assert refused.value.field == "index"
    assert store.length("s") == 9


@pytest.mark.parametrize("shell", SHELLS)
def test_rewind(store: SessionStore, shell: str) -> None:
    edits = store_shell(shell, store)
    for i in range(3):
        store.append("s", turn(i))
    store.commit_summary("s", summary(4, text="first"), 0)
    store.commit_summary("s", summary(8, text="second"), 1)
    state = edits.rewind("s", 4)
    assert state.watermark == 4 and state.version == 3
    assert store.length("s") == 12  # the log is untouched
    assert edits.rewind("s", 0).watermark == 0
    with pytest.raises(InvalidInput, match="no kept summary") as missing:
        edits.rewind("s", 5)
    assert missing.value.field == "watermark"
    with pytest.raises(InvalidInput):
        edits.rewind("s", -4)
    assert store.state("s").watermark == 0


def test_a_truncation_does_not_replace_a_real_summary_kept_at_its_watermark(
        store: SessionStore) -> None:
    """After a rewind, the guard's next truncation may land exactly where a kept summary
    is: that summary (of the same, unchanged log) is made current again, not overwritten
    by a lossier truncation note."""
    for i in range(3):
        store.append("s", turn(i))
    store.commit_summary("s", summary(4, text="first"), 0)
    store.commit_summary("s", summary(8, text="second, by the LLM"), 1)
    state = store.rewind("s", 4)
    result = store.commit_summary("s", summary(8, kind="truncation", text="first + dropped"),
                                  state.version)
    assert result.ok
    after = store.state("s")
    assert (after.watermark, after.summary_kind) == (8, "llm")
    assert [(r.watermark, r.kind, r.text) for r in store.summaries("s")] == [
        (4, "llm", "first"), (8, "llm", "second, by the LLM")]
    assert store.load_view("s").summary.text == "second, by the LLM"
    # where nothing was kept, the truncation is recorded as usual
    assert store.commit_summary("s", summary(10, kind="truncation"), after.version).ok
    assert store.state("s").summary_kind == "truncation"


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
             k.lease, k.dirty, k.taken)}
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


def test_claim_clears_pending_and_takes_the_lease_once(store: SessionStore) -> None:
    assert store.mark_pending("s")
    token = store.claim("s", 5)
    assert token is not None and not store.is_pending("s")
    assert store.mark_pending("s")
    assert store.claim("s", 5) is None  # busy: the pending flag is cleared all the same
    assert not store.is_pending("s")
    assert store.release_lease("s", token) and store.claim("s", 5) is not None


def test_finish_lease_releases_only_after_a_look_that_finds_no_request(
        store: SessionStore) -> None:
    token = store.acquire_lease("s", 5)
    assert token is not None
    store.mark_dirty("s", '{"force": true}')
    store.mark_dirty("s", '{"manual": true}')
    assert store.finish_lease("s", token, 5) == ("dirty", ['{"force": true}',
                                                           '{"manual": true}'])
    assert store.acquire_lease("s", 5) is None  # still held: the requests are to be run
    store.mark_dirty("s")  # a plain rerun carries no line, but it is a request
    assert store.finish_lease("s", token, 5) == ("dirty", [])
    assert store.finish_lease("s", token, 5) == ("released", [])
    assert store.take_dirty_requests("s") is None
    other = store.acquire_lease("s", 5)
    assert other is not None
    store.mark_dirty("s", "x")
    assert store.finish_lease("s", token, 5) == ("lost", [])  # not the owner: untouched
    assert store.take_dirty_requests("s") == ["x"]
    assert not store.release_lease("s", token) and store.release_lease("s", other)


def test_requests_a_dead_owner_took_go_to_the_next_owner(any_redis: Any,
                                                        key_prefix: str) -> None:
    s = SessionStore(any_redis, StoreConfig(key_prefix=key_prefix))
    token = s.acquire_lease("s", 5)
    assert token is not None
    s.mark_dirty("s", "first")
    assert s.finish_lease("s", token, 5) == ("dirty", ["first"])
    s.mark_dirty("s", "second")  # left while the owner runs "first"
    any_redis.delete(s.keys("s").lease)  # the owner is killed; its lease expires
    assert s.claim("s", 5) is not None
    assert s.take_dirty_requests("s") == ["first", "second"]  # the taken one first
    assert not any_redis.exists(s.keys("s").taken)


def test_requests_an_owner_ran_are_not_run_again(store: SessionStore) -> None:
    token = store.acquire_lease("s", 5)
    assert token is not None
    store.mark_dirty("s", "a")
    assert store.finish_lease("s", token, 5) == ("dirty", ["a"])
    assert store.finish_lease("s", token, 5) == ("released", [])  # "a" is done
    second = store.acquire_lease("s", 5)
    assert second is not None and store.take_dirty_requests("s") is None
    store.mark_dirty("s", "b")
    assert store.finish_lease("s", second, 5) == ("dirty", ["b"])
    store.mark_dirty("s", "c")  # "b" failed: the owner put it back and released
    store.mark_dirty("s", "b")
    assert store.release_lease("s", second)
    assert store.acquire_lease("s", 5) is not None
    assert store.take_dirty_requests("s") == ["c", "b"]  # "b" once, not twice


def test_finish_lease_extends_the_lease_it_keeps(any_redis: Any, key_prefix: str) -> None:
    s = SessionStore(any_redis, StoreConfig(key_prefix=key_prefix))
    token = s.acquire_lease("s", 1)
    assert token is not None
    s.mark_dirty("s", "r")
    assert s.finish_lease("s", token, 60)[0] == "dirty"
    assert any_redis.pttl(s.keys("s").lease) > 30_000


def test_view_counts_are_the_stores_per_message_counts(store: SessionStore) -> None:
    for i in range(3):
        store.append("s", turn(i))
    per_message = [store.counter.message(m) for m in store.messages("s")]
    assert store.load_view("s").history_counts is None  # only when asked for
    view = store.load_view("s", with_counts=True)
    assert view.history_counts == per_message
    assert store.commit_summary("s", summary(4), 0).ok
    view = store.load_view("s", with_counts=True)
    assert view.history_counts == per_message[4:] and len(view.history) == 8
    raw = store.read_view("s", with_counts=True)
    assert raw.message_counts() == per_message[4:]
    assert store.read_view("s").totals == []
    empty = store.load_view("nobody", with_counts=True)
    assert empty.history == [] and empty.history_counts == []


def test_for_tenant_shares_the_scripts_but_not_the_client(store: SessionStore) -> None:
    other = store.for_tenant("globex")
    assert other.tenant == "globex" and not hasattr(other, "redis")  # tests/test_tenancy.py
    assert other._TenantStore__store._scripts is store._scripts
    other.append("s", turn(0))
    assert store.length("s") == 0 and other.length("s") == 4


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


# -- idempotent appends ---------------------------------------------------------------------
def test_append_with_a_request_id_happens_once(store: SessionStore) -> None:
    assert store.append("s", turn(0), request_id="turn-0") == 4
    assert store.append("s", turn(0), request_id="turn-0") == 4  # the retry writes nothing
    assert store.length("s") == 4
    assert store.append("s", turn(1), request_id="turn-1") == 8
    again = store.append_encoded("s", store.encode("s", turn(1)), request_id="turn-1")
    assert again.duplicate and again.length == 8 and store.length("s") == 8
    assert store.append("s", turn(2)) == 12  # no id: every call appends
    assert store.append("s", turn(2)) == 16
    tokens = sum(store.counter.message(m) for m in store.messages("s"))
    assert store.range_tokens("s", 0, 16) == tokens  # running totals not double counted


def test_a_request_id_whose_turn_an_edit_removed_appends_again(store: SessionStore,
                                                                any_redis: Any) -> None:
    """A client numbering its requests regenerates a turn after an edit under the same id:
    that is a new turn, not a retry (before, it was answered as a duplicate and lost)."""
    for i in range(3):
        store.append("s", turn(i), request_id=f"turn-{i}")
    store.truncate_after("s", 4)
    assert store.append("s", turn(7), request_id="turn-1") == 8
    assert [m.text() for m in store.messages("s")][4] == turn(7)[0]["content"]
    assert store.append("s", turn(0), request_id="turn-0") == 4  # before the edit: a retry
    assert store.length("s") == 8
    k = store.keys("s")
    assert any_redis.hlen(k.requests) == any_redis.llen(k.request_order) == 2
    assert 0 < any_redis.ttl(k.requests) <= 3600 or any_redis.ttl(k.requests) == -1


def test_request_ids_are_bounded_and_validated(any_redis: Any, key_prefix: str) -> None:
    s = SessionStore(any_redis, StoreConfig(key_prefix=key_prefix), idempotency_keep=2,
                     idempotency_ttl=60)
    for i in range(3):
        s.append("s", turn(i)[:1], request_id=f"r{i}")
    k = s.keys("s")
    assert any_redis.hlen(k.requests) == 2 and any_redis.llen(k.request_order) == 2
    assert 0 < any_redis.ttl(k.requests) <= 60
    assert s.append("s", turn(2)[:1], request_id="r2") == 3  # remembered
    assert s.append("s", turn(0)[:1], request_id="r0") == 4  # forgotten: appended again
    for bad in ("", "a b", "x" * 200, "{tag}", 7):
        with pytest.raises(InvalidInput, match="request_id"):
            s.append("s", turn(0), request_id=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="idempotency_keep"):
        SessionStore(any_redis, idempotency_keep=0)
    s.delete_session("s")
    assert not any_redis.exists(k.requests, k.request_order)


def test_a_duplicate_reports_the_first_appends_figures(store: SessionStore) -> None:
    first = store.append_encoded("s", store.encode("s", turn(0)), request_id="a",
                                 mark_pending=True, with_state=True)
    assert first.marked and not first.duplicate and first.state is not None
    assert first.state.version == 0 and first.tokens_before == 0
    store.append("s", turn(1))
    retry = store.append_encoded("s", store.encode("s", turn(0)), request_id="a",
                                 mark_pending=True)
    # The first attempt's caller never saw "marked": the retry must publish for it.
    assert retry.duplicate and retry.marked and retry.length == 4 and retry.tokens_before == 0
    other = store.append_encoded("s", store.encode("s", turn(2)), mark_pending=True)
    assert not other.marked  # the flag is already set: coalesced


def test_an_append_whose_reply_was_lost_is_not_duplicated(redis_url: str,
                                                          key_prefix: str) -> None:
    """Real Redis applies the append, the reply never arrives; the retry is recognised."""
    upstream = redis.Redis.from_url(redis_url)
    port = upstream.connection_pool.connection_kwargs["port"]
    db = upstream.connection_pool.connection_kwargs.get("db", 0)
    cfg = StoreConfig(key_prefix=key_prefix, socket_timeout=0.3, connect_timeout=0.3)
    with ReplyDroppingProxy(port) as proxy:
        s = SessionStore(connect(proxy.url(db), cfg), cfg)
        s.append("s", turn(0))
        proxy.dropping.set()
        with pytest.raises(StoreUnavailable):
            s.append("s", turn(1), request_id="lost-1")
        proxy.dropping.clear()
        assert proxy.dropped_bytes > 0
        assert s.length("s") == 8  # it was applied
        assert s.append("s", turn(1), request_id="lost-1") == 8
        assert s.length("s") == 8
        contents = [m.text() for m in s.messages("s") if m.role == "user"]
        assert contents == ["question 0", "question 1"]
    SessionStore(upstream, cfg).delete_session("s")


# -- history edits and incremental reads --------------------------------------------------------
@pytest.mark.parametrize("shell", SHELLS)
def test_truncate_after_returns_the_version_it_created(store: SessionStore, shell: str) -> None:
    edits = store_shell(shell, store)
    for i in range(3):
        store.append("s", turn(i))
    store.commit_summary("s", summary(4), 0)
    edit = edits.truncate_after("s", 6)
    assert edit == HistoryEdit(version=2, watermark=4, length=6)
    assert edits.truncate_after("s", 6).version == 3  # an edit always bumps
    assert edits.truncate_after("s", 0) == HistoryEdit(version=4, watermark=0, length=0)


def test_incremental_reads_only_bring_what_is_new(store: SessionStore) -> None:
    store.append("s", turn(0) + turn(1))
    store.commit_summary("s", summary(4), 0)
    full = store.read_view("s")
    assert not full.incremental and full.start == 4 and full.summary_included
    assert full.epoch and full.gen == 0 and full.length == 8 and len(full.messages) == 4
    cursor = ViewCursor(full.epoch, full.gen, 1, 4, full.length, full.tokens_total)
    nothing = store.read_view("s", cursor)
    assert nothing.incremental and nothing.start == 8 and not nothing.summary_included
    assert nothing.messages == [] and nothing.decode_messages() == []
    store.append("s", turn(2))
    delta = store.read_view("s", cursor)
    assert delta.incremental and [m.text() for m in delta.decode_messages()][::4] == [
        "question 2"]
    # A summary commit moves the watermark inside what the cursor holds: still
    # incremental, and the new summary comes along.
    store.commit_summary("s", summary(8, text="later"), 1)
    moved = store.read_view("s", cursor)
    assert moved.incremental and moved.summary_included and moved.start == 8
    assert moved.summary_json is not None and b"later" in moved.summary_json
    # Anything that may have changed log[start:end] falls back to a full read.
    assert not store.read_view("s", ViewCursor("other", 0, 2, 4, 8, full.tokens_total)
                               ).incremental
    assert not store.read_view("s", ViewCursor(full.epoch, 0, 2, 4, 8,
                                               full.tokens_total + 1)).incremental
    assert not store.read_view("s", ViewCursor(full.epoch, 0, 2, 4, 99, 0)).incremental
    assert not store.read_view("s", ViewCursor(full.epoch, 0, 2, 9, 12, 0)).incremental
    store.rewind("s", 4)  # the watermark went back before what the cursor holds
    assert not store.read_view("s", ViewCursor(full.epoch, 0, 3, 8, 8,
                                               full.tokens_total)).incremental
    store.truncate_after("s", 12)  # nothing removed, but an edit: a new log generation
    edited = store.read_view("s", cursor)
    assert not edited.incremental and edited.gen == 1
    store.delete_session("s")
    store.append("s", turn(0) + turn(1))  # the same length, a new session
    reborn = store.read_view("s", ViewCursor(full.epoch, 0, 0, 0, 8, full.tokens_total))
    assert not reborn.incremental and reborn.epoch != full.epoch


def test_record_cheap_first_writer_wins(store: SessionStore) -> None:
    store.append("s", turn(0) + turn(1))
    first = CheapDecision(index=2, stage="clear_tool_output", placeholder="[a]", saved_tokens=5)
    second = CheapDecision(index=2, stage="clear_tool_output", placeholder="[b]", saved_tokens=6)
    other = CheapDecision(index=6, stage="dedupe_read", placeholder="[c]", saved_tokens=1)
    assert store.record_cheap("s", [first]) == 1
    assert store.record_cheap("s", [second, other]) == 1
    assert store.record_cheap("s", []) == 0
    assert store.load_view("s").cheap == {2: first, 6: other}


def test_cheap_decisions_planned_before_an_edit_are_refused(store: SessionStore) -> None:
    """A guard that read the session before ``truncate_after`` must not record
    decisions onto indexes that now hold other messages (its next prepare would
    subtract 3000 saved tokens from a short message)."""
    store.append("s", [{"role": "user", "content": "read it"},
                       {"role": "assistant", "content": "x " * 6000}])
    planned_at = store.state("s").version
    store.truncate_after("s", 1)
    store.append("s", [{"role": "assistant", "content": "short"}])
    stale = CheapDecision(index=1, stage="clear_tool_output", placeholder="[cleared]",
                          saved_tokens=3000)
    assert store.record_cheap("s", [stale], expected_version=planned_at) == -1
    assert store.load_view("s").cheap == {}
    current = store.state("s").version
    assert store.record_cheap("s", [stale.model_copy(update={"saved_tokens": 1})],
                              expected_version=current) == 1


def test_state_fields_ride_on_the_append_only_for_their_version(store: SessionStore) -> None:
    store.append("s", turn(0))
    store.append_encoded("s", store.encode("s", turn(1)), state_fields={"calibration_ratio": 1.2},
                         fields_version=0)
    assert store.state("s").calibration_ratio == 1.2
    store.commit_summary("s", summary(4), 0)  # version 1: figures about version 0 are stale
    store.append_encoded("s", store.encode("s", turn(2)), state_fields={"calibration_ratio": 2.0},
                         fields_version=0)
    assert store.state("s").calibration_ratio == 1.2 and store.length("s") == 12
    with pytest.raises(InvalidInput, match="fields_version"):
        store.append_encoded("s", [], state_fields={"calibration_ratio": 3.0})


def test_repeated_call_ids_are_made_unique_at_append(store: SessionStore) -> None:
    """A call id the session has seen gets a stored id of its own; a result appended
    later (in another append) pairs with the newest call of its id."""
    def call(i: int) -> dict[str, Any]:
        return {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_0", "name": "bash", "arguments": f'{{"n": {i}}}'}]}

    result = {"role": "tool", "tool_call_id": "call_0", "content": "ok"}
    store.append("s", [{"role": "user", "content": "go"}, call(0), result])
    store.append("s", [call(1)])
    store.append("s", [result, {"role": "assistant", "content": "done"}])  # ID_CONFLICT, renamed
    log = store.messages("s")
    first, second = log[1].tool_calls[0].id, log[3].tool_calls[0].id
    assert first == "call_0" and second != first and second.startswith("call_0-r")
    assert log[2].tool_call_id == first and log[4].tool_call_id == second
    assert log[4].metadata["wire_ids"] == {second: "call_0"}


def test_an_edit_gives_removed_call_ids_back(store: SessionStore) -> None:
    """A call re-sent after the edit that removed it keeps its own id: the session's id
    map must not outlive the messages it points at."""
    def call_turn(text: str) -> list[dict[str, Any]]:
        return [{"role": "user", "content": text},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "c1", "name": "ls", "arguments": "{}"}]},
                {"role": "tool", "tool_call_id": "c1", "content": "a.py"}]

    store.append("s", call_turn("first"))
    store.append("s", call_turn("second"))  # a real repeat: renamed
    assert store.messages("s")[4].tool_calls[0].id != "c1"
    store.truncate_after("s", 3)  # the repeat is gone: c1 maps to the first call again
    store.append("s", [{"role": "tool", "tool_call_id": "c1", "content": "late result"}])
    assert store.messages("s")[3].tool_call_id == "c1"
    store.truncate_after("s", 0)  # nothing left: c1 is free
    store.append("s", call_turn("again"))
    assert store.messages("s")[1].tool_calls[0].id == "c1"


def test_ids_renamed_for_a_log_position_land_only_there(store: SessionStore) -> None:
    """A batch renamed with a position's nonce claims that position: at it the ids are
    stored as made; elsewhere the script refuses them (ID_CONFLICT) and the batch is
    renamed afresh, so no two calls of the session share a stored id."""
    import dataclasses

    from shared.core.callids import Renaming, position_nonce
    from shared.core.messages import validate_messages
    from shared.store import commands

    turn = validate_messages([{"role": "user", "content": "go"},
                              {"role": "assistant", "content": "", "tool_calls": [
                                  {"id": "c", "name": "ls", "arguments": "{}"}]},
                              {"role": "tool", "tool_call_id": "c", "content": "a.py"}])
    store.append("s", turn)

    def at(length: int) -> commands.EncodedBatch:
        renaming = Renaming(position_nonce(length), {"c": "c"})
        unique = renaming.feed(turn)
        claims = dataclasses.replace(renaming.claims(), at_length=length)
        return commands.encode((), store.config, store.counter, validated=turn,
                               renamed=(unique, claims))

    made = at(3)
    assert made.unique[1].tool_calls[0].id == "c-rp3_0"
    store.append_encoded("s", made)
    store.append_encoded("s", at(3))  # made for position 3, appended at 6
    ids = [c.id for m in store.messages("s") for c in m.tool_calls]
    assert ids[:2] == ["c", "c-rp3_0"] and len(set(ids)) == 3
    assert [m.tool_call_id for m in store.messages("s") if m.role == "tool"] == ids


def test_a_renamed_batch_encodes_only_the_renamed_messages_again(store: SessionStore) -> None:
    """The retry after ID_CONFLICT re-uses the first attempt's JSON and counts for every
    message the renaming left alone (a 50-message tool chain repeats one old id), and
    the first attempt's counts for the renamed ones (their ids alone changed)."""
    from shared.store import commands

    def call(cid: str, n: int) -> list[dict[str, Any]]:
        return [{"role": "assistant", "content": "", "tool_calls": [
            {"id": cid, "name": "bash", "arguments": f'{{"n": {n}}}'}]},
            {"role": "tool", "tool_call_id": cid, "content": f"out {n}"}]

    store.append("s", [{"role": "user", "content": "go"}, *call("old", 0)])
    batch = [{"role": "user", "content": "again"}]
    for n in range(24):
        batch += call(f"c{n}", n)
    batch += call("old", 99)  # new to this batch, known to the session
    first = store.encode("s", batch)
    counted: list[Any] = []

    class Counting:
        def __getattr__(self, name: str) -> Any:
            return getattr(store.counter, name)

        def message(self, message: Any) -> int:
            counted.append(message)
            return store.counter.message(message)

    conflict = Exception('ID_CONFLICT {"old": "old"}')
    renamed = commands.renamed_after(conflict, first, store.config, Counting())  # type: ignore[arg-type]
    assert renamed is not None
    assert counted == []  # the call and its result, renamed, were counted twice
    fresh = commands.encode((), store.config, store.counter, known={"old": "old"},
                            validated=first.messages, nonce="x")
    assert [t for _, t in renamed] == [t for _, t in fresh]
    assert renamed[:-2] == list(first)[:-2] and renamed[-1] != first[-1]
    store.append_encoded("s", renamed)
    assert [m.tool_calls[0].id for m in store.messages("s") if m.tool_calls][-1] != "old"


def test_a_renamed_message_keeps_the_count_of_the_message_given(store: SessionStore) -> None:
    """Renaming changes ids alone, and the provider is sent the given ids: the count the
    guard made of the given message (its pending turn's) is the stored one, not redone."""
    from shared.core.messages import validate_messages
    from shared.core.viewcache import KnownCounts
    from shared.store import commands

    given = validate_messages([
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "old", "name": "bash", "arguments": '{"n": 1}'}]},
        {"role": "tool", "tool_call_id": "old", "content": "out"}])
    known = KnownCounts(store.counter, {id(m): 1000 + i for i, m in enumerate(given)})
    batch = commands.encode((), store.config, known, known={"old": "old"}, validated=given)
    assert all(u is not m for u, m in zip(batch.unique, given, strict=True))  # renamed
    assert [t for _, t in batch] == [1000, 1001]


# -- a request id reused for another turn ----------------------------------------------------------
def test_a_request_id_reused_for_a_different_turn_is_refused(store: SessionStore) -> None:
    """A retry is the same turn: one with other messages under the same id is a client
    bug (a deterministic id reused), refused naming the field, not silently dropped."""
    assert store.append("s", turn(0), request_id="req-1") == 4
    with pytest.raises(InvalidInput, match=r"request_id.*different turn") as caught:
        store.append("s", turn(1), request_id="req-1")
    assert caught.value.field == "request_id"
    assert store.length("s") == 4
    assert store.append("s", turn(0), request_id="req-1") == 4  # the same turn: a retry


def test_a_retry_of_a_turn_whose_call_ids_were_renamed_is_still_a_duplicate(
        store: SessionStore) -> None:
    """The digest is of the turn as given: a retry renames its ids differently (they are
    in the session now), and is still the same turn."""
    store.append("s", turn(0))
    assert store.append("s", turn(0), request_id="again") == 8  # c0 renamed
    assert store.append("s", turn(0), request_id="again") == 8
    assert store.length("s") == 8


def test_a_request_record_without_a_digest_still_counts_as_a_duplicate(
        store: SessionStore) -> None:
    """Records written before digests were kept ("length:before:marked") stay retries."""
    assert store.append("s", turn(0), request_id="old") == 4
    k = store.keys("s")
    seen = store.redis.hget(k.requests, "old")
    store.redis.hset(k.requests, "old", b":".join(seen.split(b":")[:3]))
    assert store.append("s", turn(1), request_id="old") == 4
    assert store.length("s") == 4


def test_the_guard_refuses_a_request_id_reused_for_another_turn(guard: Any) -> None:
    """Through the guard's own append (both shells, its own-writes connection or not): the
    turn is refused, and the guard's next view holds the first turn alone."""
    assert guard.record_turn("g", turn(0), request_id="req-1") == 4
    with pytest.raises(InvalidInput, match="different turn"):
        guard.record_turn("g", turn(1), request_id="req-1")
    assert guard.record_turn("g", turn(0), request_id="req-1") == 4
    view = guard.prepare("g", model="gpt-4o")
    assert [m.content for m in view.messages][-1] == "answer 0"
    assert guard.store.length("g") == 4


def test_deleting_a_session_frees_its_keys_off_the_main_thread(
        store: SessionStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """UNLINK, never DEL: a DEL of a long log frees every message before Redis answers
    anyone else (~4 ms at 10k messages); the keys are gone at once all the same."""
    from shared.store.recall_index import index_compacted, recall_keys

    store.append("s", [{"role": "user", "content": f"step {i} of the plan"} for i in range(30)])
    record = SummaryRecord(watermark=20, kind="offline", text="summary", tokens=5)
    assert store.commit_summary("s", record, 0).ok
    assert index_compacted(store, "s").end == 20

    def no_del(*_: Any, **__: Any) -> Any:
        raise AssertionError("DEL of a session key")

    monkeypatch.setattr(store.redis, "delete", no_del)
    real_pipeline = store.redis.pipeline

    def pipeline(*args: Any, **kwargs: Any) -> Any:
        pipe = real_pipeline(*args, **kwargs)
        pipe.delete = no_del
        return pipe

    monkeypatch.setattr(store.redis, "pipeline", pipeline)
    store.delete_session("s")
    assert store.length("s") == 0 and store.redis.exists(recall_keys(store, "s").doc) == 0
    assert not list(store.redis.scan_iter(match=f"{store.config.key_prefix}:*"))


def test_a_database_the_server_lacks_names_the_setting_to_fix(redis_url: str) -> None:
    """A Redis URL naming a database above the server's count (``/99`` on a default
    16-database server) raised redis-py's bare ``ResponseError``, naming neither the URL nor
    the store's errors: it is a :class:`StoreError` saying what to fix, and not
    :class:`StoreUnavailable`, which the guard would ride out as an outage, on both
    shells."""
    import asyncio

    from shared.core.errors import StoreError
    from shared.guard import AsyncContextGuard, ContextGuard
    from shared.store.aio import AsyncSessionStore, connect_async

    base = redis_url.rsplit("/", 1)[0] if redis_url.count("/") > 2 else redis_url
    url = f"{base}/99"
    config = StoreConfig(key_prefix="nodb")
    store = SessionStore(connect(url, config), config)
    with pytest.raises(StoreError, match="COMPACTION_REDIS_URL") as caught:
        store.append("s", [{"role": "user", "content": "hi"}])
    assert not isinstance(caught.value, StoreUnavailable)
    with pytest.raises(StoreError, match="no such database") as caught:
        ContextGuard(store).prepare("s", "sys", model="gpt-4o")
    assert not isinstance(caught.value, StoreUnavailable)

    async def run() -> None:
        astore = AsyncSessionStore(connect_async(url, config), config)
        try:
            with pytest.raises(StoreError, match="no such database") as caught:
                await AsyncContextGuard(astore).prepare("s", "sys", model="gpt-4o")
            assert not isinstance(caught.value, StoreUnavailable)
        finally:
            await astore.redis.aclose()

    asyncio.run(run())
