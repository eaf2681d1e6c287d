"""The recall index in Redis: built by workers, incremental, edit-safe, tenant-bound."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shared.store.recall_index as recall_index_module
from shared.core.config import StoreConfig
from shared.core.errors import InvalidInput, SessionNotFound
from shared.core.records import SummaryRecord
from shared.store.recall_index import drop_index, forget_after, index_compacted, index_stats
from shared.store.recall_query import answer_recall_call, recall
from shared.store.sessions import SessionStore
from tests.guard_shells import SHELLS, store_shell
from workers.compactor import Compactor
from workers.summarizer.engine import SummaryEngine


def turn(i: int, extra: str = "") -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"step {i}: open src/mod{i}/handler_{i}.py {extra}"},
            {"role": "assistant", "content": f"saw ERR_STEP_{i}_FAILED, retrying with "
                                             f"timeout {i}.5 seconds"}]


def fill(store: SessionStore, sid: str, turns: range, extra: str = "") -> None:
    store.append(sid, [m for i in turns for m in turn(i, extra)])


def commit(store: SessionStore, sid: str, watermark: int) -> None:
    version = store.state(sid).version
    record = SummaryRecord(watermark=watermark, kind="offline", text="summary", tokens=5)
    assert store.commit_summary(sid, record, version).ok


def test_recall_finds_identifiers_paths_and_numbers(store: SessionStore) -> None:
    fill(store, "s", range(30))
    commit(store, "s", 40)
    report = index_compacted(store, "s")
    assert (report.start, report.end, report.messages) == (0, 40, 40)
    assert recall(store, "s", "src/mod7/handler_7.py", limit=1)[0].index == 14
    assert recall(store, "s", "ERR_STEP_12_FAILED", limit=1)[0].index == 25
    assert recall(store, "s", "handler_3", limit=1)[0].index == 6
    hit = recall(store, "s", "13.5", limit=1)[0]
    assert (hit.index, hit.role) == (27, "assistant") and "13.5 seconds" in hit.text
    # only what was summarized away (the watermark) and indexed is searched
    assert 51 not in [h.index for h in recall(store, "s", "ERR_STEP_25_FAILED", limit=50)]
    assert all(h.index < 40 for h in recall(store, "s", "step", limit=50))


def test_indexing_is_incremental(store: SessionStore) -> None:
    fill(store, "s", range(30))
    commit(store, "s", 20)
    assert index_compacted(store, "s").messages == 20
    assert index_compacted(store, "s").messages == 0  # idempotent
    commit(store, "s", 50)
    second = index_compacted(store, "s")
    assert (second.start, second.end, second.messages) == (20, 50, 30)
    assert index_stats(store, "s")["indexed_until"] == 50
    commit(store, "s", 60)
    assert index_compacted(store, "s", max_messages=4).end == 54  # bounded per call
    assert index_compacted(store, "s").end == 60  # the next call goes on
    assert recall(store, "s", "ERR_STEP_22_FAILED", limit=1)[0].index == 45


def test_what_the_index_has_not_reached_yet_is_searched_too(
        store: SessionStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A compaction whose index job still waits: the summary's notice already names its
    range, and recall finds it there, ranked as the index will rank it."""
    fill(store, "s", range(30))
    commit(store, "s", 20)
    index_compacted(store, "s")
    commit(store, "s", 50)  # not indexed yet: messages 20-49
    queries = ["ERR_STEP_22_FAILED", "src/mod3/handler_3.py", "handler_17", "ERR_STEP_4_FAILED",
               "timeout 24.5", "step 9"]
    before = [[h.index for h in recall(store, "s", q, limit=3)] for q in queries]
    assert recall(store, "s", "ERR_STEP_22_FAILED", limit=1)[0].index == 45
    assert recall(store, "s", "ERR_STEP_4_FAILED", limit=1)[0].index == 9  # the index's part
    assert all(h.index < 50 for h in recall(store, "s", "step", limit=50))  # the watermark
    hit = recall(store, "s", "timeout 24.5", limit=1)[0]
    assert (hit.index, hit.role) == (49, "assistant") and "24.5 seconds" in hit.text
    index_compacted(store, "s")
    assert [[h.index for h in recall(store, "s", q, limit=3)] for q in queries] == before
    commit(store, "s", 60)  # a backlog larger than a query scans: its newest part
    monkeypatch.setattr("shared.store.recall_query.TAIL_SCAN_MESSAGES", 5)
    assert recall(store, "s", "ERR_STEP_27_FAILED", limit=1)[0].index == 55  # in 55-59
    assert 51 not in {h.index for h in recall(store, "s", "ERR_STEP_25_FAILED", limit=50)}
    monkeypatch.undo()
    assert recall(store, "s", "ERR_STEP_25_FAILED", limit=1)[0].index == 51


def test_a_backlog_past_the_old_all_or_nothing_bound_is_searched(
        store: SessionStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A guard truncation (or an index job not run yet, or indexing off) leaves hundreds
    of unindexed messages below the watermark; the notice names them all, and recall
    used to scan none of them past 64. Now it reads them in chunks, newest first."""
    fill(store, "s", range(150))
    commit(store, "s", 300)  # nothing indexed
    assert recall(store, "s", "ERR_STEP_3_FAILED", limit=1)[0].index == 7
    assert recall(store, "s", "src/mod140/handler_140.py", limit=1)[0].index == 280
    index_compacted(store, "s", 100)
    commit(store, "s", 300)  # unchanged: hwm 100, 200 unindexed
    assert recall(store, "s", "ERR_STEP_3_FAILED", limit=1)[0].index == 7  # the index
    assert recall(store, "s", "ERR_STEP_120_FAILED", limit=1)[0].index == 241  # the scan
    # the ranking the scan gives is the one the index gives afterwards
    queries = ["ERR_STEP_120_FAILED", "handler_77", "timeout 99.5", "step 130"]
    before = [[h.index for h in recall(store, "s", q, limit=3)] for q in queries]
    index_compacted(store, "s")
    assert [[h.index for h in recall(store, "s", q, limit=3)] for q in queries] == before
    drop_index(store, "s")
    monkeypatch.setattr("shared.store.recall_query.TAIL_CHUNK", 7)
    monkeypatch.setattr("shared.store.recall_query.TAIL_SCAN_BYTES", 2000)
    hits = recall(store, "s", "step", limit=50)
    assert hits and min(h.index for h in hits) >= 300 - 7 * 30  # bytes: newest chunks only
    assert recall(store, "s", "ERR_STEP_149_FAILED", limit=1)[0].index == 299


@pytest.mark.parametrize("hook", [True, False])
def test_nothing_past_an_edit_is_returned(store: SessionStore, hook: bool,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """``truncate_after`` calls the hook; without it, checksums still hide edited hits."""
    fill(store, "s", range(30))
    commit(store, "s", 50)
    index_compacted(store, "s")
    if not hook:
        monkeypatch.setattr(recall_index_module, "forget_after", lambda *_, **__: 0)
    store.truncate_after("s", 20)
    monkeypatch.undo()
    if hook:
        assert forget_after(store, "s", 20) == 0  # the edit already forgot messages 20-49
    # the edited history differs from index 20 on (turns 12-31 where turns 10-29 were),
    # with the same words: the index still holds the old messages 20-49
    store.append("s", [m for i in range(12, 32) for m in turn(i, "EDITED")])
    for query in ("ERR_STEP_15_FAILED", "handler_22", "src", "EDITED"):
        for hit in recall(store, "s", query, end=60, limit=50):
            assert hit.index < 20
            assert "EDITED" not in hit.text
    commit(store, "s", 56)
    report = index_compacted(store, "s")
    assert report.rebuilt is not hook
    assert report.end == 56
    assert recall(store, "s", "ERR_STEP_12_FAILED", limit=1)[0].index == 21
    hit = recall(store, "s", "handler_12", limit=1)[0]
    assert hit.index == 20 and "EDITED" in hit.text


def test_rewind_narrows_the_default_range(store: SessionStore) -> None:
    fill(store, "s", range(30))
    commit(store, "s", 20)
    commit(store, "s", 50)
    index_compacted(store, "s")
    store.rewind("s", 20)
    assert all(h.index < 20 for h in recall(store, "s", "ERR_STEP_15_FAILED", limit=50))
    # an explicit end past the watermark is cut to it: messages 20-49 are in the view
    # again, although the index (and, before the fix, a query with end=50) still had them
    for end in (50, 60, None):
        hits = recall(store, "s", "ERR_STEP_15_FAILED step 24 handler_17", end=end, limit=50)
        assert hits and all(h.index < 20 for h in hits)
    assert recall(store, "s", "ERR_STEP_15_FAILED", end=50, limit=1)[0].index != 31
    assert answer_recall_call(store, "s", '{"query": "ERR_STEP_15_FAILED", "end": 40}') \
        == answer_recall_call(store, "s", '{"query": "ERR_STEP_15_FAILED"}')


def test_other_tenants_messages_are_never_returned(any_redis: Any, key_prefix: str) -> None:
    config = StoreConfig(key_prefix=key_prefix)
    alice = SessionStore(any_redis, config, tenant="alice")
    bob = SessionStore(any_redis, config, tenant="bob")
    fill(alice, "s", range(10), "ALICE_SECRET_TOKEN")
    commit(alice, "s", 20)
    index_compacted(alice, "s")
    with pytest.raises(SessionNotFound):
        recall(bob, "s", "ALICE_SECRET_TOKEN")
    fill(bob, "s", range(10))
    commit(bob, "s", 20)
    index_compacted(bob, "s")
    assert recall(bob, "s", "ALICE_SECRET_TOKEN") == []
    assert all("ALICE" not in h.text for h in recall(bob, "s", "handler_3 src", limit=50))
    assert recall(alice, "s", "ALICE_SECRET_TOKEN", limit=1)


def test_bad_input_and_unknown_session(store: SessionStore) -> None:
    with pytest.raises(SessionNotFound):
        recall(store, "nobody", "x1")
    fill(store, "s", range(3))
    with pytest.raises(InvalidInput) as info:
        recall(store, "s", "")
    assert info.value.field == "query"
    with pytest.raises(InvalidInput) as info:
        recall(store, "s", "x1", start=4, end=2)
    assert info.value.field == "end"
    with pytest.raises(InvalidInput) as info:
        recall(store, "bad id{", "x1")
    assert info.value.field == "session_id"
    assert recall(store, "s", "handler_1") == []  # nothing compacted yet


def test_drop_and_ttl(any_redis: Any, key_prefix: str,
                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Meta, docs and message map expire with ``ttl``; term keys (and the term list)
    with ``2 * ttl``, refreshed all at once at most every ``ttl / 2`` seconds, so no
    term of a live index expires before its meta."""
    store = SessionStore(any_redis, StoreConfig(key_prefix=key_prefix, ttl_seconds=500))
    fill(store, "s", range(10))
    commit(store, "s", 20)
    index_compacted(store, "s")
    index_keys = [k for k in any_redis.scan_iter(match=f"{key_prefix}:rx:*")]
    terms = [k for k in index_keys if b"}:t:" in k or k.endswith(b"}:terms")]
    assert len(terms) > 10 and all(500 < any_redis.ttl(k) <= 1000 for k in terms)
    assert all(0 < any_redis.ttl(k) <= 500 for k in set(index_keys) - set(terms))
    early = next(k for k in index_keys if k.endswith(b"}:t:handler_1.py"))
    any_redis.expire(early, 600)  # as if set a while ago
    store.append("s", turn(11))
    commit(store, "s", 22)
    index_compacted(store, "s")  # touches other terms only: no full refresh yet
    assert 500 < any_redis.ttl(early) <= 600
    meta = next(k for k in index_keys if k.endswith(b"}:meta"))
    assert any_redis.ttl(early) >= any_redis.ttl(meta)
    clock = time.time() + 251  # past ttl / 2 since the last full refresh
    monkeypatch.setattr(recall_index_module.time, "time", lambda: clock)
    store.append("s", turn(12))
    commit(store, "s", 24)
    index_compacted(store, "s")
    assert any_redis.ttl(early) > 900  # every term key refreshed
    monkeypatch.undo()
    drop_index(store, "s")
    assert not list(any_redis.scan_iter(match=f"{key_prefix}:*rx:*"))


def test_a_new_index_drops_the_term_keys_an_expired_one_left(store: SessionStore) -> None:
    """Term keys outlive the meta key by design; a new index starts without them."""
    fill(store, "s", range(10))
    commit(store, "s", 20)
    index_compacted(store, "s")
    k = recall_index_module.recall_keys(store, "s")
    first = {t: store.redis.strlen(k.term(t)) for t in ("handler_3", "step", "src")}
    store.redis.delete(k.meta, k.doc, k.mp)  # the meta expired, terms did not
    report = index_compacted(store, "s")
    assert (report.start, report.end) == (0, 20)
    assert index_stats(store, "s")["terms_total"] > 0
    assert {t: store.redis.strlen(k.term(t)) for t in first} == first  # no leftovers
    assert recall(store, "s", "handler_3", limit=1)[0].index == 6


def _legacy_index(store: SessionStore, sid: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An index as a version before 2026-11-28 wrote it: under the session's own keys."""
    with monkeypatch.context() as patch:
        patch.setattr(recall_index_module, "recall_keys", recall_index_module.legacy_recall_keys)
        index_compacted(store, sid)


def test_an_index_an_older_version_wrote_is_dropped_and_built_again(
        store: SessionStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """The index moved out of the session's keys (which a guard's change feed watches);
    the old one is dropped when the session's new index starts, and rebuilt from 0."""
    fill(store, "s", range(10))
    commit(store, "s", 20)
    _legacy_index(store, "s", monkeypatch)
    legacy = recall_index_module.legacy_recall_keys(store, "s")
    assert legacy.meta.startswith(store.keys("s").state.removesuffix("state"))
    assert store.redis.exists(legacy.meta, legacy.term("handler_3")) == 2
    report = index_compacted(store, "s")
    assert (report.start, report.end, report.rebuilt) == (0, 20, True)
    assert not list(store.redis.scan_iter(match=legacy.meta.removesuffix("meta") + "*"))
    assert recall(store, "s", "handler_3", limit=1)[0].index == 6
    assert not index_compacted(store, "s").rebuilt  # once


@pytest.mark.parametrize("shell", SHELLS)
def test_dropping_an_index_drops_an_older_version_s_too(
        store: SessionStore, monkeypatch: pytest.MonkeyPatch, shell: str) -> None:
    """A deleted session leaves no key: its log, state and summaries, its index (terms
    included) and an older version's index; on the sync and the asyncio store alike."""
    fill(store, "s", range(10))
    commit(store, "s", 20)
    index_compacted(store, "s")
    _legacy_index(store, "s", monkeypatch)
    legacy = recall_index_module.legacy_recall_keys(store, "s")
    current = recall_index_module.recall_keys(store, "s")
    assert store.redis.exists(legacy.meta, current.meta, current.term("handler_3")) == 3
    store_shell(shell, store).delete_session("s")
    assert not list(store.redis.scan_iter(match=legacy.meta.removesuffix("meta") + "*"))
    assert not list(store.redis.scan_iter(match=f"{store.config.key_prefix}:*"))


def test_the_worker_indexes_what_it_compacts(store: SessionStore) -> None:
    fill(store, "s", range(60), "padding " * 40)
    outcome = Compactor(store, SummaryEngine(None)).run("s", manual=True, keep_recent=500)
    assert outcome.status == "compacted"
    stats = index_stats(store, "s")
    assert stats["indexed_until"] == outcome.watermark_after > 0
    assert recall(store, "s", "ERR_STEP_3_FAILED", limit=1)[0].index == 7


@given(st.lists(st.sampled_from(["retry", "deploy", "src/app/util.py", "42", "ERR_TIMEOUT",
                                 "user_id", "ok", "config"]), min_size=1, max_size=12)
       .map(" ".join), st.integers(min_value=0, max_value=39),
       st.text(alphabet="abcdefghjk", min_size=6, max_size=6))
@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_property_distinctive_token_in_top_results_on_redis(
        real_store: SessionStore, filler: str, target: int, tag: str) -> None:
    sid = f"p{tag}{target}"
    token = f"ERR_{tag.upper()}_{target}"
    messages = [{"role": "user" if i % 2 == 0 else "assistant",
                 "content": f"{filler} {token}" if i == target else f"{filler} n{i}"}
                for i in range(40)]
    real_store.append(sid, messages)
    commit(real_store, sid, 40)
    index_compacted(real_store, sid)
    assert target in [h.index for h in recall(real_store, sid, token, limit=3)]
    real_store.truncate_after(sid, target)
    forget_after(real_store, sid, target)
    assert all(h.index < target for h in recall(real_store, sid, token, end=40))
    drop_index(real_store, sid)
    real_store.delete_session(sid)


@pytest.fixture
def real_store(real_redis: Any, key_prefix: str) -> SessionStore:
    return SessionStore(real_redis, StoreConfig(key_prefix=key_prefix))


def test_answering_a_models_tool_call(store: SessionStore) -> None:
    fill(store, "s", range(10))
    commit(store, "s", 20)
    index_compacted(store, "s")
    text = answer_recall_call(store, "s", '{"query": "handler_4.py", "limit": 1}')
    assert text.startswith("[message 8, user") and "src/mod4/handler_4.py" in text
    assert "invalid arguments" in answer_recall_call(store, "s", '{"query": ""}')


def test_a_query_reads_a_bounded_share_of_common_terms(real_store: SessionStore) -> None:
    """3,000 passages share "deploy"; the rare term still decides, and a query of the
    common term alone is answered from its newest postings."""
    n = 3000
    for a in range(0, n, 500):
        real_store.append("big", [{"role": "user", "content": f"deploy service step{i}"}
                                  for i in range(a, a + 500)])
    commit(real_store, "big", n)
    index_compacted(real_store, "big")
    assert recall(real_store, "big", "deploy step17", limit=1)[0].index == 17
    newest = recall(real_store, "big", "deploy", limit=3)
    assert len(newest) == 3 and all(h.index >= n - 2048 for h in newest)
    drop_index(real_store, "big")
    real_store.delete_session("big")


def test_many_forgotten_passages_trigger_a_rebuild(store: SessionStore,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import shared.store.recall_index as module

    monkeypatch.setattr(module, "STALE_REBUILD", 5)
    fill(store, "s", range(20))
    commit(store, "s", 40)
    index_compacted(store, "s")
    store.truncate_after("s", 4)
    assert forget_after(store, "s", 4) == 0  # truncate_after already forgot 4-39
    fill(store, "s", range(100, 110))
    commit(store, "s", 20)
    report = index_compacted(store, "s")
    assert report.rebuilt and (report.start, report.end) == (0, 20)
    assert recall(store, "s", "handler_105", limit=1)[0].index == 14


def test_an_indexing_failure_never_fails_the_compaction(
        store: SessionStore, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    import workers.compactor as module

    def broken(*_: Any, **__: Any) -> None:
        raise RuntimeError("index down")

    monkeypatch.setattr(module, "index_compacted", broken)
    # other tests run Celery workers in-process, and Celery rewires logging: capture here
    job_log = logging.getLogger("compaction.job")
    monkeypatch.setattr(job_log, "disabled", False)
    monkeypatch.setattr(job_log, "propagate", True)
    caplog.set_level(logging.WARNING, logger="compaction.job")
    fill(store, "s", range(30), "padding " * 40)
    outcome = Compactor(store, SummaryEngine(None)).run("s", manual=True, keep_recent=500)
    assert outcome.status == "compacted"
    assert "recall indexing failed" in caplog.text
    monkeypatch.undo()
    assert index_compacted(store, "s").end == outcome.watermark_after  # the next job catches up


def test_words_inside_cjk_text_are_found(store: SessionStore,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A CJK run is indexed as its whole and its bigrams: a word inside it is found.
    An index written before bigrams still answers the whole run; a re-index
    (drop_index, then index_compacted) makes the words inside it searchable."""
    import shared.core.recall as core

    store.append("s", [
        {"role": "assistant",
         "content": '{"error": "接続がリセットされました", "x": "こんにちは世界"}'},
        {"role": "user", "content": "数据库连接失败\uff0c请检查配置文件"},
        {"role": "user", "content": "연결이 끊어졌습니다"}])
    commit(store, "s", 3)
    assert recall(store, "s", "リセット")[0].index == 0  # the scan, before any index
    core._word_terms.cache_clear()
    monkeypatch.setattr(core, "_cjk_terms", lambda word, whole: (whole,))  # the old index
    index_compacted(store, "s")
    monkeypatch.undo()
    core._word_terms.cache_clear()
    assert [h.index for h in recall(store, "s", "接続がリセットされました")] == [0]
    assert recall(store, "s", "接続") == []
    drop_index(store, "s")
    index_compacted(store, "s")
    for query, index in [("接続", 0), ("リセット", 0), ("接続がリセットされました", 0),
                         ("数据库", 1), ("配置文件", 1), ("连接失败", 1), ("연결", 2)]:
        assert [h.index for h in recall(store, "s", query)][:1] == [index], query


def test_an_identifier_at_the_end_of_a_long_question_is_found(store: SessionStore) -> None:
    store.append("s", [
        {"role": "user", "content": "Run the unit tests for the payment module"},
        {"role": "assistant", "content": "FAILED tests/test_payments.py::test_refund_rounding"
                                         " - expected 10.00, got 10.01"},
        *[{"role": "user", "content": f"unrelated step {i}: looked into some tests output"}
          for i in range(20)]])
    commit(store, "s", 22)
    index_compacted(store, "s")
    question = ("earlier we looked into some failing unit tests, an assertion about amounts "
                "during checkout went wrong; what was the exact output of test_refund_rounding")
    assert recall(store, "s", question, limit=1)[0].index == 1


def test_an_absent_identifier_finds_nothing_through_its_one_digit_parts(
        store: SessionStore) -> None:
    """Audit F7: after the message holding ``cust_7Hq2LmP9`` was cut, recalling it (or
    ``ticket 9``, ``ABC-9``) returned ``ok 9`` and ``ok 7``, matched on one digit. One
    character makes no hit alone; a number asked for alone is still found."""
    store.append("s", [{"role": "assistant", "content": f"ok {i}"} for i in range(50)])
    store.append("s", [{"role": "user", "content": "listening on 8080, see issue 42"}])
    commit(store, "s", 51)
    scanned = {q: recall(store, "s", q) for q in ("cust_7Hq2LmP9", "ticket 9", "ABC-9")}
    index_compacted(store, "s")
    for query, hits in scanned.items():  # the unindexed scan, then the index
        assert hits == [] and recall(store, "s", query) == [], query
    assert [h.index for h in recall(store, "s", "9")] == [9]
    assert [h.index for h in recall(store, "s", "port 8080")] == [50]
    assert {h.index for h in recall(store, "s", "ticket 42")} == {42, 50}  # two digits: alone


@pytest.mark.parametrize("indexed", [True, False])
def test_commands_after_an_escaped_newline_in_tool_arguments_are_found(
        store: SessionStore, indexed: bool) -> None:
    """Audit F8: tool-call arguments were tokenized as JSON text, so ``cd`` after ``\\n``
    was part of ``tmp/directive.log\\ncd`` and ``nsed``. They are decoded first, by the
    indexer and by a query's scan of the unindexed range alike; the hit shows the raw
    call."""
    import json

    command = "cat tmp/directive.log\ncd build && sed -n 2p __init__.py\n echo 接続"
    store.append("s", [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "name": "bash", "arguments": json.dumps({"command": command})}]},
        {"role": "tool", "tool_call_id": "c1", "content": "done"},
        *[{"role": "user", "content": f"unrelated step {i}"} for i in range(10)]])
    commit(store, "s", 12)
    if indexed:
        index_compacted(store, "s")
    for query in ("cd", "sed", "tmp/directive.log", "接続", "cd build"):
        hits = recall(store, "s", query)
        assert [h.index for h in hits] == [0], query
        assert '\\ncd build' in hits[0].text and "\\u63a5" in hits[0].text  # raw, as stored


def test_an_index_from_an_older_analyzer_is_rebuilt(store: SessionStore) -> None:
    """Terms an older analyzer wrote (no ``analyzer`` field: version 1) are not appended to:
    the next indexing call writes the whole index again with today's terms."""
    from shared.store.recall_index import recall_keys

    fill(store, "s", range(10))
    commit(store, "s", 20)
    assert not index_compacted(store, "s").rebuilt
    k = recall_keys(store, "s")
    client = store.redis
    assert client.hget(k.meta, "analyzer") == b"2"
    assert not index_compacted(store, "s").rebuilt  # current: kept
    # as an older version left it: no field, and a term today's analyzer never makes
    client.hdel(k.meta, "analyzer")
    client.append(k.terms, b"nsed\n")
    client.set(k.term("nsed"), b"")
    fill(store, "s", range(10, 12))
    commit(store, "s", 24)
    report = index_compacted(store, "s")
    assert report.rebuilt and (report.start, report.end) == (0, 24)
    assert client.hget(k.meta, "analyzer") == b"2"
    assert not client.exists(k.term("nsed"))
    assert b"nsed" not in (client.get(k.terms) or b"")
    assert recall(store, "s", "handler_11", limit=1)[0].index == 22


def test_a_new_index_cut_short_is_continued_not_taken_for_an_old_one(
        store: SessionStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """QA: the analyzer version was written at the end of the call creating the index, so
    a call that died after its first batch (a time limit), or a second job meanwhile,
    took the new index for an old one and rebuilt it from 0."""
    for a in range(0, 600, 100):  # 1200 messages: three batches of 500
        fill(store, "s", range(a, a + 100))
    commit(store, "s", 1200)
    real = recall_index_module._add_batch
    calls = {"n": 0}

    def dies_after_one_batch(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("soft time limit")
        return real(*args, **kwargs)

    monkeypatch.setattr(recall_index_module, "_add_batch", dies_after_one_batch)
    with pytest.raises(RuntimeError):
        index_compacted(store, "s")
    monkeypatch.setattr(recall_index_module, "_add_batch", real)
    report = index_compacted(store, "s")
    assert not report.rebuilt and (report.start, report.end) == (500, 1200)


def test_a_second_job_continues_a_new_index_being_built(
        store: SessionStore, monkeypatch: pytest.MonkeyPatch) -> None:
    for a in range(0, 600, 100):
        fill(store, "s", range(a, a + 100))
    commit(store, "s", 1200)
    real = recall_index_module._add_batch
    seen: dict[str, Any] = {}

    def with_a_second_job(*args: Any, **kwargs: Any) -> Any:
        out = real(*args, **kwargs)
        if "second" not in seen:
            seen["second"] = None
            seen["second"] = index_compacted(store, "s", max_messages=500)
        return out

    monkeypatch.setattr(recall_index_module, "_add_batch", with_a_second_job)
    index_compacted(store, "s")
    assert not seen["second"].rebuilt and seen["second"].start == 500


# -- the bound on one index call (issue: a 500-message call held Redis 20-140 ms) --------
def _spy_add_keys(monkeypatch: pytest.MonkeyPatch,
                  between: Any = None) -> list[tuple[list[str], int]]:
    """Every recall_add call's term keys and the docs it wrote (``between``: run after
    each call, with the calls so far)."""
    seen: list[tuple[list[str], int]] = []
    real = recall_index_module._script

    def spied(store: SessionStore, name: str) -> Any:
        script = real(store, name)
        if name != "recall_add":
            return script

        def call(*, keys: list[str], args: list[Any]) -> Any:
            m = int(args[10])
            seen.append(([str(key) for key in keys[5:]], int(args[11 + m])))
            out = script(keys=keys, args=args)
            if between is not None:
                between(seen)
            return out
        return call

    monkeypatch.setattr(recall_index_module, "_script", spied)
    return seen


def _postings_of(store: SessionStore, sid: str, term: str) -> list[tuple[int, ...]]:
    raw = store.redis.get(recall_index_module.recall_keys(store, sid).term(term)) or b""
    size = recall_index_module.POSTING.size
    return [recall_index_module.POSTING.unpack(raw[i:i + size])
            for i in range(0, len(raw), size)]


def _docs(store: SessionStore, sid: str) -> dict[int, str]:
    raw = store.redis.hgetall(recall_index_module.recall_keys(store, sid).doc)
    return {int(a): b.decode() for a, b in raw.items()}


def test_an_index_call_never_holds_more_than_the_term_bound(
        store: SessionStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """40 messages of 30 words each, 25 of them their own: every call holds at most
    BATCH_TERMS term keys, and every message is indexed, each term once per passage."""
    monkeypatch.setattr(recall_index_module, "BATCH_TERMS", 64)
    common = " ".join(f"shared{j}" for j in range(5))
    store.append("s", [{"role": "user", "content": common + " " +
                        " ".join(f"u{i}x{j}" for j in range(25))} for i in range(40)])
    commit(store, "s", 40)
    seen = _spy_add_keys(monkeypatch)
    report = index_compacted(store, "s")
    calls = [len(keys) for keys, _ in seen]
    assert (report.end, report.messages, report.passages) == (40, 40, 40)
    assert calls and max(calls) <= 64 and len(calls) >= 40 * 25 // 64
    assert sum(calls) == report.terms
    docs = _docs(store, "s")
    assert len(docs) == 40 and index_stats(store, "s")["passages"] == 40
    for i in (0, 17, 39):
        assert [p[1] for p in _postings_of(store, "s", f"u{i}x24")] == [i]
    assert [p[1] for p in _postings_of(store, "s", "shared3")] == list(range(40))
    assert all(p[0] in docs for p in _postings_of(store, "s", "shared3"))
    assert recall(store, "s", "u17x3", limit=1)[0].index == 17


def test_a_batch_appends_each_term_once_then_writes_its_docs_in_bounded_runs(
        store: SessionStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A term every message holds goes in one call of the batch, not one a message (the
    calls were bounded by grouping messages: a common term was appended 40 times); the
    docs follow in runs of whole messages of at most BATCH_DOCS passages, and the
    passage ids stay dense (an edit's cut walks them)."""
    monkeypatch.setattr(recall_index_module, "BATCH_TERMS", 64)
    monkeypatch.setattr(recall_index_module, "BATCH_DOCS", 8)
    common = " ".join(f"shared{j}" for j in range(5))
    store.append("s", [{"role": "user", "content": common + " " +
                        " ".join(f"u{i}x{j}" for j in range(25))} for i in range(40)])
    commit(store, "s", 40)
    calls = _spy_add_keys(monkeypatch)
    report = index_compacted(store, "s")
    assert (report.end, report.messages, report.passages, report.conflict) == (40, 40, 40, "")
    postings_calls = [keys for keys, docs in calls if keys]
    assert all(docs == 0 for keys, docs in calls if keys)  # postings first, docs after
    assert [docs for keys, docs in calls if not keys] == [8] * 5
    assert len(postings_calls) == -(-(40 * 25 + 5) // 64)
    term = recall_index_module.recall_keys(store, "s").term("shared3")
    assert sum(keys.count(term) for keys in postings_calls) == 1
    docs = _docs(store, "s")
    assert max(docs) - min(docs) == 39  # dense: no id spent on a call
    assert [p[1] for p in _postings_of(store, "s", "shared3")] == list(range(40))
    assert recall(store, "s", "u17x3", limit=1)[0].index == 17


def test_a_query_between_a_batchs_postings_and_its_docs_answers_as_after(
        store: SessionStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A query that runs between a batch's postings and its docs finds the batch's
    messages once each: through the scan of what is summarized but not indexed yet, not
    also through postings whose passages have no doc."""
    fill(store, "s", range(4))
    commit(store, "s", 8)
    index_compacted(store, "s")
    fill(store, "s", range(4, 8), extra=" zebracorn")
    commit(store, "s", 16)
    found: list[list[int]] = []

    def query(seen: list[tuple[list[str], int]]) -> None:
        if seen[-1][1] == 0:  # a postings call
            found.append([h.index for h in recall(store, "s", "zebracorn", limit=10)])

    _spy_add_keys(monkeypatch, query)
    report = index_compacted(store, "s")
    after = [h.index for h in recall(store, "s", "zebracorn", limit=10)]
    assert report.end == 16 and sorted(after) == [8, 10, 12, 14]
    assert found and all(sorted(hits) == sorted(after) for hits in found)


def test_a_message_with_more_terms_than_the_bound_is_indexed_in_parts(
        store: SessionStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recall_index_module, "BATCH_TERMS", 16)
    big = " ".join(f"big{j}" for j in range(100))  # 100 terms, one passage: 7 parts
    store.append("s", [{"role": "user", "content": "before alpha"},
                       {"role": "user", "content": big},
                       {"role": "user", "content": "after omega"}])
    commit(store, "s", 3)
    seen = _spy_add_keys(monkeypatch)
    report = index_compacted(store, "s")
    calls = [len(keys) for keys, _ in seen]
    assert (report.end, report.passages, report.conflict) == (3, 3, "")
    assert max(calls) <= 16 and len(calls) >= 7
    docs = _docs(store, "s")
    assert len(docs) == 3
    for j in (0, 50, 99):
        (posting,) = _postings_of(store, "s", f"big{j}")
        assert posting[1] == 1 and posting[0] in docs
    assert recall(store, "s", "big77", limit=1)[0].index == 1
    assert recall(store, "s", "omega", limit=1)[0].index == 2


def test_a_second_indexer_between_parts_wins_and_nothing_is_counted_twice(
        store: SessionStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each part is a compare-and-swap: an indexer that runs between two parts of a
    message takes it whole under new ids; the first one stops at its next part. The
    postings the first left have no doc, so a query never counts them."""
    monkeypatch.setattr(recall_index_module, "BATCH_TERMS", 16)
    store.append("s", [{"role": "user", "content": " ".join(f"big{j}" for j in range(60))}])
    commit(store, "s", 1)
    second: list[Any] = []

    def run_second(seen: list[tuple[list[str], int]]) -> None:
        if len(seen) == 1:
            second.append(index_compacted(store, "s"))

    _spy_add_keys(monkeypatch, run_second)
    first = index_compacted(store, "s")
    assert first.conflict == "hwm" and first.messages == 0
    assert second[0].end == 1 and not second[0].conflict
    docs = _docs(store, "s")
    assert len(docs) == 1 and index_stats(store, "s")["passages"] == 1
    live = [p for p in _postings_of(store, "s", "big0") if p[0] in docs]
    assert len(live) == 1
    assert [h.index for h in recall(store, "s", "big0 big59", limit=5)] == [0]


def test_an_indexer_dying_between_parts_is_taken_over(
        store: SessionStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recall_index_module, "BATCH_TERMS", 16)
    store.append("s", [{"role": "user", "content": " ".join(f"big{j}" for j in range(60))},
                       {"role": "user", "content": "tail words"}])
    commit(store, "s", 2)

    def dies(seen: list[tuple[list[str], int]]) -> None:
        if len(seen) == 2:
            raise RuntimeError("soft time limit")

    _spy_add_keys(monkeypatch, dies)
    with pytest.raises(RuntimeError):
        index_compacted(store, "s")
    monkeypatch.undo()
    monkeypatch.setattr(recall_index_module, "BATCH_TERMS", 16)
    report = index_compacted(store, "s")
    assert (report.start, report.end, report.rebuilt) == (0, 2, False)
    docs = _docs(store, "s")
    assert len(docs) == 2
    assert len([p for p in _postings_of(store, "s", "big3") if p[0] in docs]) == 1
    assert [h.index for h in recall(store, "s", "big3", limit=5)] == [0]


# -- an edit's cut, in bounded calls (one call forgot ~5k passages: 57 ms) ---------------
def _meta(store: SessionStore, sid: str) -> dict[str, str]:
    raw = store.redis.hgetall(recall_index_module.recall_keys(store, sid).meta)
    return {a.decode(): b.decode() for a, b in raw.items()}


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("per_call", [1, 7, 512])
def test_an_edits_cut_in_bounded_calls_forgets_what_one_call_did(
        store: SessionStore, monkeypatch: pytest.MonkeyPatch, per_call: int, shell: str) -> None:
    """The sync and the asyncio store's edits forget the same passages, in the same calls."""
    fill(store, "s", range(30))
    commit(store, "s", 60)
    index_compacted(store, "s")
    before = _meta(store, "s")
    calls: list[list[Any]] = []
    real = recall_index_module.send_step

    def spied(client: Any, step: Any) -> Any:
        if isinstance(step, recall_index_module.ScriptCall) and step.script == "recall_cut":
            calls.append(step.args)
        return real(client, step)

    monkeypatch.setattr(recall_index_module, "CUT_PASSAGES", per_call)
    monkeypatch.setattr(recall_index_module, "send_step", spied)
    store_shell(shell, store).truncate_after("s", 25)
    assert len(calls) == -(-35 // per_call) and all(a[1] == per_call for a in calls)
    meta = _meta(store, "s")
    assert (meta["hwm"], meta["n_docs"], meta["stale"]) == ("25", "25", "35")
    assert int(meta["total_len"]) < int(before["total_len"])
    assert "cut_at" not in meta and "cut_hi" not in meta
    docs = _docs(store, "s")
    assert sorted(int(d.split(":")[0]) for d in docs.values()) == list(range(25))
    assert store.redis.llen(recall_index_module.recall_keys(store, "s").mp) == 25


def test_an_edit_before_a_cut_is_done_goes_on_from_it(store: SessionStore) -> None:
    """A cut left half done (its caller died) holds the index's old gen: the next cut,
    at a later index, still forgets from the earlier one."""
    fill(store, "s", range(30))
    commit(store, "s", 60)
    index_compacted(store, "s")
    k = recall_index_module.recall_keys(store, "s")
    cut = recall_index_module._script(store, "recall_cut")
    store.redis.hincrby(k.state, "gen", 1)  # the edit at 20 (its log cut left out here)
    removed, hwm, done = cut(keys=[k.meta, k.doc, k.mp, k.state], args=[20, 15])
    assert (removed, hwm, done) == (15, 60, 0) and _meta(store, "s")["cut_at"] == "20"
    assert forget_after(store, "s", 40) == 25  # the rest of messages 20-59
    meta = _meta(store, "s")
    assert (meta["hwm"], meta["n_docs"], meta["stale"]) == ("20", "20", "40")
    assert meta["gen"] == store.redis.hget(k.state, "gen").decode()
    report = index_compacted(store, "s")
    assert not report.rebuilt and (report.start, report.end) == (20, 60)


@pytest.mark.parametrize("second", ["dies_before_its_cut", "cuts_meanwhile"])
def test_a_cut_claims_its_own_edits_generation_not_a_later_ones(
        store: SessionStore, monkeypatch: pytest.MonkeyPatch, second: str) -> None:
    """QA: edit A's cut, done after edit B (at an earlier index) had bumped the log's
    generation, marked the index with B's: when B's caller died before its own cut, the
    index claimed a log it did not describe (hwm 40 over 10 messages), so the indexer
    never rebuilt it and messages appended at 10-39 were never found."""
    fill(store, "s", range(30))
    commit(store, "s", 60)
    index_compacted(store, "s")
    monkeypatch.setattr(recall_index_module, "CUT_PASSAGES", 4)
    real = recall_index_module.send_step
    calls = {"n": 0}

    def b_edits_after_as_first_cut_call(client: Any, step: Any) -> Any:
        out = real(client, step)
        if not (isinstance(step, recall_index_module.ScriptCall) and step.script == "recall_cut"):
            return out
        calls["n"] += 1
        if calls["n"] == 1:
            if second == "cuts_meanwhile":
                store.truncate_after("s", 10)
                return out
            with monkeypatch.context() as m:
                m.setattr(recall_index_module, "forget_after", _dies)
                with pytest.raises(RuntimeError):
                    store.truncate_after("s", 10)
        return out

    monkeypatch.setattr(recall_index_module, "send_step", b_edits_after_as_first_cut_call)
    store.truncate_after("s", 40)  # A
    monkeypatch.setattr(recall_index_module, "send_step", real)
    assert store.length("s") == 10
    store.append("s", [{"role": "user", "content": f"fresh NEWTOKEN_{i}"} for i in range(30)])
    commit(store, "s", 40)
    index_compacted(store, "s")
    assert [h.index for h in recall(store, "s", "NEWTOKEN_5", limit=1)] == [15]
    assert index_stats(store, "s")["indexed_until"] == 40
    docs = _docs(store, "s")
    assert sorted(int(d.split(":")[0]) for d in docs.values()) == list(range(40))


def _dies(*_: Any, **__: Any) -> int:
    raise RuntimeError("the worker died after its edit, before its cut")


def test_a_cut_after_the_index_was_built_again_forgets_nothing(
        store: SessionStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """An edit's cut that comes after the index was rebuilt for the edited log (its
    caller was slow, the indexer was not): the index already describes it."""
    fill(store, "s", range(30))
    commit(store, "s", 60)
    index_compacted(store, "s")
    k = recall_index_module.recall_keys(store, "s")
    with monkeypatch.context() as m:
        m.setattr(recall_index_module, "forget_after", lambda *_, **__: 0)
        store.truncate_after("s", 10)
    fill(store, "s", range(100, 115))  # messages 10-39
    commit(store, "s", 40)
    assert index_compacted(store, "s").rebuilt
    before = _docs(store, "s")
    assert forget_after(store, "s", 10) == 0  # it forgot messages 10-39 of the new log
    assert forget_after(store, "s", 10, gen=int(store.redis.hget(k.state, "gen"))) == 0
    assert _docs(store, "s") == before and _meta(store, "s")["hwm"] == "40"


@pytest.mark.parametrize("last", [{"role": "user", "content": "?"},
                                  {"role": "tool", "tool_call_id": "c1", "content": ""}],
                         ids=["a-passage-of-no-terms", "no-passage"])
def test_an_edit_removing_nothing_a_query_counts_succeeds_on_redis(
        real_store: SessionStore, last: dict[str, Any]) -> None:
    """QA: recall_cut.lua sent HINCRBY ... -0 when a call forgot no passage or only
    passages of no terms ("?", an empty tool result), which the real server refuses
    ("value is not an integer"; fakeredis takes it): the edit raised a raw ResponseError
    after its log cut."""
    store = real_store
    store.append("s", [{"role": "user", "content": "look it up"},
                       {"role": "assistant", "content": "",
                        "tool_calls": [{"id": "c1", "name": "lookup", "arguments": "{}"}]},
                       last])
    commit(store, "s", 3)
    index_compacted(store, "s")
    before = index_stats(store, "s")
    assert store.truncate_after("s", 2).length == 2
    meta = _meta(store, "s")
    assert (meta["hwm"], meta["gen"]) == ("2", "1")
    assert index_stats(store, "s")["terms_total"] == before["terms_total"]


@pytest.mark.parametrize("ttl", [None, 500])
@pytest.mark.parametrize("when", ["before a batch", "after the batches"])
def test_a_session_deleted_while_it_is_indexed_leaves_no_key(
        any_redis: Any, key_prefix: str, monkeypatch: pytest.MonkeyPatch, when: str,
        ttl: int | None) -> None:
    """Soak (scripts/soak.py): an index job that read the session before the agent
    deleted it wrote its batches after the delete, so the deleted conversation's terms
    came back as keys (without a TTL when sessions have none: kept for ever)."""
    store = SessionStore(any_redis, StoreConfig(key_prefix=key_prefix, ttl_seconds=ttl))
    fill(store, "s", range(10))
    commit(store, "s", 20)
    real = recall_index_module._add_batch

    def deleted_around(*args: Any, **kwargs: Any) -> Any:
        if when == "before a batch":
            store.delete_session("s")
            return real(*args, **kwargs)
        out = real(*args, **kwargs)
        store.delete_session("s")
        return out

    monkeypatch.setattr(recall_index_module, "_add_batch", deleted_around)
    index_compacted(store, "s")
    assert [k for k in any_redis.scan_iter(match=f"{key_prefix}:*")] == []


def test_a_new_index_mark_takes_the_sessions_ttl(any_redis: Any, key_prefix: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A new index is marked (``analyzer``) before its first batch, which sets the TTL: a
    first batch that lost its swap (or a job killed before it) left the mark with none, a
    hash that outlived the session's every other key where sessions expire."""
    store = SessionStore(any_redis, StoreConfig(key_prefix=key_prefix, ttl_seconds=500))
    fill(store, "s", range(10))
    commit(store, "s", 20)

    def lost(*args: Any, **kwargs: Any) -> Any:
        added = recall_index_module._Added(args[3], args[5], args[6])
        added.conflict = "hwm"
        return added

    monkeypatch.setattr(recall_index_module, "_add_batch", lost)
    assert index_compacted(store, "s").conflict == "hwm"
    meta = recall_index_module.recall_keys(store, "s").meta
    assert any_redis.hget(meta, "analyzer") is not None
    assert 0 < any_redis.ttl(meta) <= 500
