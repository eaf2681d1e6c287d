"""The Anthropic view sends what the API takes back: interleaved thinking in its order,
ids of its pattern, no blank pieces.

Shapes are checked by the documented rules (the SDK is not installed here): the latest
assistant turn's thinking blocks go back unmodified and in sequence; ``tool_use.id``
matches ``^[a-zA-Z0-9_-]+$``; text blocks and error results are never blank.
"""

from __future__ import annotations

import re
from typing import Any

import fakeredis
import pytest

from shared.core.config import StoreConfig
from shared.core.messages import Message
from shared.core.wire import from_anthropic, to_anthropic
from shared.store.sessions import SessionStore
from tests.guard_shells import SHELLS, make

MODEL = "claude-sonnet-4-5"
ID = re.compile(r"^[a-zA-Z0-9_-]+$")

INTERLEAVED = {"role": "assistant", "content": [
    {"type": "thinking", "thinking": "first I list", "signature": "SIG1"},
    {"type": "tool_use", "id": "toolu_a", "name": "ls", "input": {}},
    {"type": "thinking", "thinking": "then I read", "signature": "SIG2"},
    {"type": "tool_use", "id": "toolu_b", "name": "cat", "input": {"p": "x"}},
    {"type": "redacted_thinking", "data": "REDACTED"},
    {"type": "text", "text": "Working on it."}]}
RESULTS = {"role": "user", "content": [
    {"type": "tool_result", "tool_use_id": "toolu_a", "content": "a"},
    {"type": "tool_result", "tool_use_id": "toolu_b", "content": "b"}]}


def guard_view(shell_name: str, recorded: list[Message], system: str = "sys",
               pending: list[Message] | None = None) -> Any:
    store = SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="t"))
    guard = make(shell_name, store)
    if recorded:
        guard.record_turn("s", recorded)
    return guard.prepare("s", system, model=MODEL, max_tokens=100, pending=pending or [])


# -- block order -------------------------------------------------------------


def test_interleaved_thinking_goes_back_in_its_order() -> None:
    wire = [{"role": "user", "content": "go"}, INTERLEAVED, RESULTS]
    assert to_anthropic(from_anthropic(wire)) == (None, wire)


def test_text_before_a_call_keeps_its_place() -> None:
    wire = [{"role": "user", "content": "go"},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "toolu_a", "name": "ls", "input": {}},
                {"type": "text", "text": "listing"}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_a", "content": "a"}]}]
    assert to_anthropic(from_anthropic(wire)) == (None, wire)


def test_the_usual_order_records_nothing_more() -> None:
    usual = {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "plan", "signature": "S"},
        {"type": "text", "text": "ok"},
        {"type": "tool_use", "id": "toolu_a", "name": "ls", "input": {}}]}
    (message,) = from_anthropic([usual])
    assert set(message.metadata) == {"anthropic_thinking"}
    assert to_anthropic([message]) == (None, [usual])


@pytest.mark.parametrize("shell_name", SHELLS)
def test_the_guard_sends_interleaved_thinking_in_its_order(shell_name: str) -> None:
    recorded = from_anthropic([{"role": "user", "content": "go"}, INTERLEAVED, RESULTS])
    view = guard_view(shell_name, recorded)
    assert view.anthropic()[1][1] == INTERLEAVED
