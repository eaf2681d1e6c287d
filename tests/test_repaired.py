"""The kept repair of a stored view (shared.core.repaired, repair_continued).

Property: whatever the damage (lost, moved, duplicated, orphaned results, reused
ids, empty messages, a leading non-user message), a repair kept over a log fed
in random slices, continued by a random pending tail, equals the repair of the
whole; where the tail reaches back into the kept part the continuation says so
(None) instead of guessing. A guard over a log with an interrupted call repairs
only what follows its kept repair, and sends what a guard repairing the whole
sends.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import fakeredis
from hypothesis import given, settings
from hypothesis import strategies as st

import shared.core.repair as repair_module
from shared.core.chunks import concat
from shared.core.config import StoreConfig
from shared.core.messages import Message
from shared.core.repair import call_ids, open_unit_start, repair_continued, repair_tool_pairs
from shared.core.repaired import repaired_view
from shared.store.sessions import SessionStore
from tests.strategies import damaged_conversations
from tests.test_guard import SYSTEM, coding_turn


@settings(max_examples=300, deadline=None)
@given(damaged_conversations(max_turns=8), st.integers(0, 80))
def test_a_continued_repair_is_the_repair_of_the_whole(messages: list[Message],
                                                       cut: int) -> None:
    k = open_unit_start(messages[:min(cut, len(messages))])
    prefix, tail = messages[:k], messages[k:]
    fixed = repair_tool_pairs(prefix)
    if not any(m.role != "system" for m in fixed):
        return  # nothing began yet: the start rule may still apply to the tail
    rest = repair_continued(tail, call_ids(prefix) | call_ids(fixed))
    if rest is not None:
        assert fixed + rest == repair_tool_pairs(messages)


@settings(max_examples=200, deadline=None)
@given(damaged_conversations(max_turns=8), st.lists(st.integers(0, 80), max_size=5),
       st.integers(0, 6))
def test_a_kept_repair_fed_in_slices_is_the_repair_of_the_whole(
        messages: list[Message], cuts: list[int], pending: int) -> None:
    kept = None
    for end in [*sorted(c for c in cuts if c <= len(messages)), len(messages)]:
        stored, extra = messages[:max(0, end - pending)], messages[max(0, end - pending):end]
        kept = repaired_view(kept, stored)
        tail = kept.continued(stored, extra)
        if tail is not None:
            assert list(concat(kept.messages, tail)) == repair_tool_pairs(stored + extra)


def _counting(monkeypatch: Any) -> list[int]:
    sizes: list[int] = []
    real = repair_module.repair_tool_pairs_with_report

    def counted(messages: Any, **kw: Any) -> Any:
        sizes.append(len(messages))
        return real(messages, **kw)

    monkeypatch.setattr(repair_module, "repair_tool_pairs_with_report", counted)
    return sizes


def test_a_guard_repairs_only_what_follows_its_kept_repair(
        monkeypatch: Any, make_guard: Callable[..., Any]) -> None:
    store = SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="r"))
    for i in range(40):
        store.append("s", coding_turn(i, 300))
    store.append("s", [  # a turn interrupted before its tool result
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "lost", "name": "bash", "arguments": '{"command": "make"}'}]},
        {"role": "user", "content": "That got cut off; go on."}])
    guard = make_guard(store, overrides={"m": 1_000_000})
    sizes = _counting(monkeypatch)
    pending = [{"role": "user", "content": "Next step."}]
    first = guard.prepare("s", SYSTEM, model="m", pending=pending)
    assert sizes and max(sizes) >= 200  # the stored view, repaired once
    assert "[tool result missing" in str(first.wire("openai")[-3]["content"])
    for i in range(40, 46):
        sizes.clear()
        turn = coding_turn(i, 300)
        guard.prepare("s", SYSTEM, model="m", pending=turn[:1])
        guard.record_turn("s", turn)
        view = guard.prepare("s", SYSTEM, model="m", pending=pending)
        assert sizes and max(sizes) <= len(turn) + 2, sizes  # the new turn and the pending
        fresh = make_guard(store, overrides={"m": 1_000_000})
        assert list(view.wire("openai")) == list(
            fresh.prepare("s", SYSTEM, model="m", pending=pending).wire("openai"))
        again = fresh.prepare("s", SYSTEM, model="m", pending=pending)
        assert list(view.messages) == list(again.messages)
        assert view.anthropic() == again.anthropic() and view.gemini() == again.gemini()
        assert list(view.anthropic(shared=True)[1]) == again.anthropic()[1]


def test_a_rename_in_the_tail_that_would_meet_an_id_of_the_prefix_is_turned_down() -> None:
    from shared.core.messages import ToolCall

    def call(i: str) -> Message:
        return Message(role="assistant", tool_calls=[ToolCall(id=i, name="bash")])

    def result(i: str) -> Message:
        return Message(role="tool", tool_call_id=i, content="ok")

    prefix = [Message(role="user", content="go"), call("c_r2"), result("c_r2"),
              Message(role="user", content="again")]
    tail = [call("c"), result("c"), call("c"), result("c")]
    whole = repair_tool_pairs(prefix + tail)
    assert [c.id for m in whole for c in m.tool_calls] == ["c_r2", "c", "c_r3"]
    fixed = repair_tool_pairs(prefix)
    assert repair_continued(tail, call_ids(prefix) | call_ids(fixed)) is None
