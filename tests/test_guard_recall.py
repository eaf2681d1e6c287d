"""``recall`` on both guard shells: the sync one over redis-py, the async one over
redis.asyncio (the same sans-I/O query, shared.store.recall_query.recall_steps)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

import shared.store.recall_index as recall_index_module
from shared import AsyncContextGuard
from shared.core.config import StoreConfig
from shared.core.errors import InvalidInput, SessionNotFound, StoreUnavailable
from shared.core.records import SummaryRecord
from shared.store import recall_query
from shared.store.aio import AsyncSessionStore, connect_async
from shared.store.recall_index import index_compacted
from shared.store.sessions import SessionStore, connect
from tests.guard_shells import SHELLS, make


def turn(i: int, extra: str = "") -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"step {i}: open src/mod{i}/handler_{i}.py {extra}"},
            {"role": "assistant", "content": f"saw ERR_STEP_{i}_FAILED, retrying with "
                                             f"timeout {i}.5 seconds"}]


def fill(store: SessionStore, sid: str, turns: range, extra: str = "") -> None:
    store.append(sid, [m for i in turns for m in turn(i, extra)])


def compact(store: SessionStore, sid: str, watermark: int) -> None:
    """A worker's summary up to ``watermark``, and the index it builds after it."""
    version = store.state(sid).version
    record = SummaryRecord(watermark=watermark, kind="offline", text="summary", tokens=5)
    assert store.commit_summary(sid, record, version).ok
    index_compacted(store, sid)


@pytest.fixture(params=SHELLS)
def shell(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_recall_finds_a_message_of_the_compacted_range(store: SessionStore,
                                                       shell: str) -> None:
    fill(store, "s", range(30))
    compact(store, "s", 40)
    guard = make(shell, store)
    [hit] = guard.recall("s", "ERR_STEP_12_FAILED", limit=1)
    assert (hit.index, hit.role) == (25, "assistant") and "ERR_STEP_12_FAILED" in hit.text
    assert guard.recall("s", "src/mod7/handler_7.py", limit=1)[0].index == 14
    # only the compacted (and indexed) range, up to the watermark, is searched
    assert all(h.index < 40 for h in guard.recall("s", "step", limit=50))
    assert 51 not in [h.index for h in guard.recall("s", "ERR_STEP_25_FAILED", limit=50)]
    assert [h.index for h in guard.recall("s", "step", start=10, end=20, limit=50)] \
        and all(10 <= h.index < 20 for h in guard.recall("s", "step", start=10, end=20,
                                                         limit=50))
    assert len(guard.recall("s", "step")) == 5  # the default limit


@pytest.mark.parametrize("hook", [True, False], ids=["edit-hook", "checksums-only"])
def test_nothing_past_an_edit_is_recalled(store: SessionStore, shell: str, hook: bool,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    fill(store, "s", range(30))
    compact(store, "s", 50)
    guard = make(shell, store)
    assert guard.recall("s", "handler_22", limit=1)[0].index == 44
    if not hook:  # the index still holds the old messages 20-49: checksums hide them
        monkeypatch.setattr(recall_index_module, "forget_after", lambda *_, **__: 0)
    store.truncate_after("s", 20)
    monkeypatch.undo()
    store.append("s", [m for i in range(12, 32) for m in turn(i, "EDITED")])
    for query in ("ERR_STEP_15_FAILED", "handler_22", "src", "EDITED"):
        for hit in guard.recall("s", query, end=60, limit=50):
            assert hit.index < 20 and "EDITED" not in hit.text


def test_another_tenants_session_is_not_visible(any_redis: Any, key_prefix: str,
                                                shell: str) -> None:
    config = StoreConfig(key_prefix=key_prefix)
    alice = SessionStore(any_redis, config, tenant="alice")
    bob = SessionStore(any_redis, config, tenant="bob")
    fill(alice, "s", range(10), "ALICE_SECRET_TOKEN")
    compact(alice, "s", 20)
    as_bob = make(shell, bob)
    with pytest.raises(SessionNotFound):
        as_bob.recall("s", "ALICE_SECRET_TOKEN")
    fill(bob, "s", range(10))
    compact(bob, "s", 20)
    assert as_bob.recall("s", "ALICE_SECRET_TOKEN") == []
    assert all("ALICE" not in h.text for h in as_bob.recall("s", "handler_3 src", limit=50))
    assert make(shell, alice).recall("s", "ALICE_SECRET_TOKEN", limit=1)


def test_bad_query_is_invalid_input(store: SessionStore, shell: str) -> None:
    fill(store, "s", range(3))
    guard = make(shell, store)
    for kwargs, field in (({"query": ""}, "query"), ({"query": "the, and ..."}, "query"),
                          ({"query": 42}, "query"), ({"query": "x1", "limit": 0}, "limit"),
                          ({"query": "x1", "start": 4, "end": 2}, "end")):
        query = kwargs.pop("query")
        with pytest.raises(InvalidInput) as info:
            guard.recall("s", query, **kwargs)
        assert info.value.field == field, (query, kwargs)
    with pytest.raises(InvalidInput) as info:
        guard.recall("bad id{", "x1")
    assert info.value.field == "session_id"
    assert guard.recall("s", "handler_1") == []  # nothing compacted yet


def test_unknown_session_is_not_found(store: SessionStore, shell: str) -> None:
    with pytest.raises(SessionNotFound):
        make(shell, store).recall("nobody", "handler_1")


def test_redis_down_is_store_unavailable(shell: str) -> None:
    cfg = StoreConfig(socket_timeout=0.2, connect_timeout=0.2)
    guard = make(shell, SessionStore(connect("redis://127.0.0.1:1/0", cfg), cfg))
    with pytest.raises(StoreUnavailable):
        guard.recall("s", "handler_1")


def _system_text(view: Any) -> str:
    return "\n".join(str(m.content) for m in view.messages if m.role in ("system", "user")
                     and "conversation_summary" in str(m.content))


@pytest.mark.parametrize("provider", ["openai", "anthropic", "gemini"])
def test_summary_tells_the_model_about_recall_only_when_offered(store: SessionStore,
                                                                shell: str,
                                                                provider: str) -> None:
    from shared.core.recall_tool import NOTICE, recall_tool

    fill(store, "s", range(30))
    compact(store, "s", 40)
    guard = make(shell, store)
    other = {"type": "function", "function": {"name": "read_file", "parameters": {}}}
    plain = guard.prepare("s", "be brief", tools=[other])
    offered = guard.prepare("s", "be brief", tools=[other, recall_tool(provider)])  # type: ignore[arg-type]
    assert NOTICE not in _system_text(plain)
    text = _system_text(offered)
    assert NOTICE in text and "Messages 0-39 are searchable." in text
    # the notice is counted in the summary region, not hidden from the budget
    grew = offered.report.budget.summary - plain.report.budget.summary
    assert 20 < grew < 80
    assert offered.report.estimated_prompt_tokens > plain.report.estimated_prompt_tokens
    # nothing summarized away yet: no notice, whatever the tools
    fill(store, "fresh", range(3))
    assert NOTICE not in str(guard.prepare("fresh", "x", tools=[recall_tool("openai")]).messages)


def test_recall_notice_can_be_switched_off(store: SessionStore, shell: str) -> None:
    from shared.core.config import CompactionPolicy
    from shared.core.recall_tool import NOTICE, recall_tool

    fill(store, "s", range(30))
    compact(store, "s", 40)
    guard = make(shell, store, policy=CompactionPolicy(recall_notice=False))
    assert NOTICE not in _system_text(guard.prepare("s", "x", tools=[recall_tool("openai")]))


def test_gemini_tool_object_with_declarations_counts_as_offered() -> None:
    from shared.core.recall_tool import offers_recall, recall_tool

    assert offers_recall([{"function_declarations": [recall_tool("gemini")]}])
    assert offers_recall([{"type": "function", "name": "recall", "parameters": {}}])
    assert not offers_recall([{"name": "recall_notes"}, "recall", None])
    assert not offers_recall(None) and not offers_recall([])


def test_after_a_truncation_recall_finds_what_the_notice_names(store: SessionStore,
                                                               shell: str) -> None:
    """Workers down: the guard truncates far past 64 messages, nothing is indexed, and the
    notice says every message below the watermark is searchable; recall finds them (it
    used to scan none of an unindexed range over 64 messages)."""
    from shared.core.recall_tool import recall_tool

    guard = make(shell, store, overrides={"gpt-4o": 4000})
    tools = [recall_tool("openai")]
    for i in range(90):
        turn_ = [{"role": "user", "content": f"turn {i} MARKER_{i} " + "pad " * 60},
                 {"role": "assistant", "content": f"ack {i}"}]
        guard.prepare("s", "sys", tools, 500, "gpt-4o", pending=turn_[:1])
        guard.record_turn("s", turn_)
    view = guard.prepare("s", "sys", tools, 500, "gpt-4o",
                         pending=[{"role": "user", "content": "what was MARKER_3?"}])
    watermark = view.report.watermark
    assert watermark > 64 and view.report.summary_kind == "truncation"
    assert f"Messages 0-{watermark - 1} are searchable." in _system_text(view)
    assert guard.recall("s", "MARKER_3", limit=1)[0].index == 6
    newest = (watermark - 1) // 2
    assert guard.recall("s", f"MARKER_{newest}", limit=1)[0].index == 2 * newest


@pytest.mark.redis
def test_the_async_recall_scores_off_its_event_loop(real_redis: Any, redis_url: str,
                                                    key_prefix: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A query parses and scores what was compacted but not indexed yet itself (up to
    TAIL_SCAN_MESSAGES, 4 MB), and scores the index's postings: ~0.5 s for a full tail,
    which the async guard spent on its event loop, every other request of the server
    waiting (the sync guard blocks its own caller only). The async guard runs that work on
    a worker thread, with the same hits."""
    config = StoreConfig(key_prefix=key_prefix)
    store = SessionStore(real_redis, config)
    for first in range(0, 300, 100):
        fill(store, "s", range(first, first + 100), "retry " * 200)
    compact(store, "s", 200)  # indexed up to 200
    store.update_state("s", watermark=560)  # compacted past the index: the tail is scanned
    where: list[int] = []
    for name in ("_tail_passages", "bm25"):
        real = getattr(recall_query, name)

        def traced(*args: Any, _real: Any = real, **kwargs: Any) -> Any:
            where.append(threading.get_ident())
            return _real(*args, **kwargs)

        monkeypatch.setattr(recall_query, name, traced)
    expected = make("sync", store).recall("s", "ERR_STEP_250_FAILED handler_12", limit=10)
    assert {h.index for h in expected} >= {25, 501}  # one indexed, one from the tail

    async def main() -> tuple[list[Any], int]:
        astore = AsyncSessionStore(connect_async(redis_url, config), config)
        guard = AsyncContextGuard(astore)
        where.clear()
        hits = await guard.recall("s", "ERR_STEP_250_FAILED handler_12", limit=10)
        await guard.aclose()
        await astore.aclose()
        return hits, threading.get_ident()

    hits, loop_thread = asyncio.run(main())
    assert hits == expected
    assert where and loop_thread not in where, "scored on the event loop's thread"
