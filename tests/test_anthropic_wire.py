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
from shared.core.errors import InvalidInput
from shared.core.messages import Message
from shared.core.wire import from_anthropic, from_openai, to_anthropic
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


# -- ids ---------------------------------------------------------------------


def kimi_turn(suffix: str = "") -> list[dict[str, Any]]:
    """A turn from an OpenAI-compatible server that ids calls ``functions.NAME:IDX``."""
    return [{"role": "user", "content": "go" + suffix},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "functions.read_file:0", "type": "function",
                 "function": {"name": "read_file", "arguments": '{"path": "/a"}'}},
                {"id": "functions_read_file_0", "type": "function",
                 "function": {"name": "read_file", "arguments": '{"path": "/b"}'}}]},
            {"role": "tool", "tool_call_id": "functions.read_file:0", "content": "A"},
            {"role": "tool", "tool_call_id": "functions_read_file_0", "content": "B"},
            {"role": "assistant", "content": "done"}]


def ids_of(wire: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    blocks = [b for m in wire if isinstance(m["content"], list) for b in m["content"]]
    return ([b["id"] for b in blocks if b["type"] == "tool_use"],
            [b["tool_use_id"] for b in blocks if b["type"] == "tool_result"])


def test_ids_outside_the_pattern_are_mapped_and_results_follow() -> None:
    _, wire = to_anthropic(from_openai(kimi_turn()))
    calls, results = ids_of(wire)
    assert all(ID.match(i) for i in calls + results)
    assert calls == results and len(set(calls)) == 2
    assert calls[1] == "functions_read_file_0"  # a valid id stays as it is
    assert to_anthropic(from_openai(kimi_turn()))[1] == wire  # the same every time


@pytest.mark.parametrize("shell_name", SHELLS)
def test_the_guard_view_has_only_valid_unique_ids(shell_name: str) -> None:
    store = SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="t"))
    guard = make(shell_name, store)
    guard.record_turn("s", from_openai(kimi_turn()))
    guard.record_turn("s", from_openai(kimi_turn(" again")))  # the same ids: renamed
    _, wire = guard.prepare("s", "sys", model=MODEL, max_tokens=100).anthropic()
    calls, results = ids_of(wire)
    assert len(calls) == 4 and len(set(calls)) == 4 and calls == results
    assert all(ID.match(i) for i in calls)


# -- arguments -------------------------------------------------------------------


def paying(arguments: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": "pay"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function",
                 "function": {"name": "pay", "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"}]


@pytest.mark.parametrize("arguments", ['{"big": 1e400}', '{"x": -1e999}', '{"n": NaN}',
                                       '{"n": [Infinity]}', '{"n": {"m": -Infinity}}'])
def test_numbers_beyond_a_float_are_refused_at_the_field(arguments: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        from_openai(paying(arguments))
    assert caught.value.field == "messages[1].tool_calls[0].function.arguments"


def test_anthropic_input_with_a_non_finite_number_is_refused_at_the_field() -> None:
    wire = [{"role": "user", "content": "pay"},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "c1", "name": "pay", "input": {"x": float("inf")}}]}]
    with pytest.raises(InvalidInput) as caught:
        from_anthropic(wire)
    assert caught.value.field == "messages[1].content[0].input"


@pytest.mark.parametrize("shell_name", SHELLS)
def test_exact_argument_text_still_goes_out_as_it_came(shell_name: str) -> None:
    arguments = '{"account": 123456789012345678901234567890, "ratio": 1.10, "tiny": 1e-300}'
    store = SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="t"))
    guard = make(shell_name, store)
    guard.record_turn("s", from_openai(paying(arguments)))
    view = guard.prepare("s", "sys", model=MODEL, max_tokens=100)
    assert view.openai()[2]["tool_calls"][0]["function"]["arguments"] == arguments
    (call,) = [b for b in view.anthropic()[1][1]["content"] if b["type"] == "tool_use"]
    assert call["input"]["account"] == 123456789012345678901234567890


# -- blank pieces ------------------------------------------------------------------


def run_results(content: Any, is_error: bool) -> list[dict[str, Any]]:
    result: dict[str, Any] = {"type": "tool_result", "tool_use_id": "toolu_a",
                              "content": content}
    if is_error:
        result["is_error"] = True
    return [{"role": "user", "content": "run it"},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "toolu_a", "name": "bash", "input": {}}]},
            {"role": "user", "content": [result]}]


def result_text(result: dict[str, Any]) -> str:
    content = result["content"]
    return content if isinstance(content, str) else "".join(b["text"] for b in content)


@pytest.mark.parametrize("content", ["", " ", "\n", [], [{"type": "text", "text": " "}]])
def test_an_error_result_is_never_empty(content: Any) -> None:
    _, wire = to_anthropic(from_anthropic(run_results(content, is_error=True)))
    (result,) = wire[2]["content"]
    assert result["is_error"] is True and result_text(result).strip()


@pytest.mark.parametrize("content", ["\n", "  ", [{"type": "text", "text": "\n"}]])
def test_a_blank_result_gets_a_placeholder(content: Any) -> None:
    _, wire = to_anthropic(from_anthropic(run_results(content, is_error=False)))
    (result,) = wire[2]["content"]
    assert result_text(result).strip()


@pytest.mark.parametrize("content", ["", []])
def test_an_empty_result_without_an_error_stays_empty(content: Any) -> None:
    wire = run_results(content, is_error=False)
    assert to_anthropic(from_anthropic(wire))[1] == wire


@pytest.mark.parametrize("shell_name", SHELLS)
def test_the_guard_sends_no_blank_result(shell_name: str) -> None:
    recorded = from_openai([
        {"role": "user", "content": "run"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "\n"},
        {"role": "assistant", "content": "done"}])
    view = guard_view(shell_name, recorded)
    (result,) = view.anthropic()[1][2]["content"]
    assert result_text(result).strip()


@pytest.mark.parametrize("system", ["   ", "\n"])
def test_a_blank_system_prompt_is_not_sent(system: str) -> None:
    assert to_anthropic([Message(role="system", content=system),
                         Message(role="user", content="hi")])[0] is None
    assert to_anthropic([Message(role="system", content=[{"type": "text", "text": system}]),
                         Message(role="user", content="hi")])[0] == []


@pytest.mark.parametrize("shell_name", SHELLS)
def test_the_guard_sends_no_blank_system_prompt(shell_name: str) -> None:
    view = guard_view(shell_name, [], system="   ",
                      pending=[Message(role="user", content="hi")])
    assert view.anthropic()[0] is None
