"""compaction replay: loading real and broken sessions (workers/harness/replay/sessions.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.core.errors import InvalidInput
from shared.core.messages import Message
from shared.core.wire import to_openai
from shared.store.keys import validate_session_id
from tests.replay_support import synthetic_session, write_jsonl
from tests.strategies import any_conversations
from workers.harness.replay.sessions import load_sessions, parse_session, session_key


# -- loading ------------------------------------------------------------------------------
def test_malformed_lines_are_skipped_with_their_reason(tmp_path: Path) -> None:
    good = {"id": "ok", "messages": [{"role": "user", "content": "hi"},
                                     {"role": "assistant", "content": "hello"}]}
    path = write_jsonl(tmp_path / "s.jsonl", [
        "{not json", json.dumps([1, 2]), {"id": "no-messages"}, {"id": "empty", "messages": []},
        {"id": "no-assistant", "messages": [{"role": "user", "content": "hi"}]},
        {"id": "bad-tool", "messages": [{"role": "tool", "content": "x"},
                                        {"role": "assistant", "content": "y"}]},
        {"id": "bad-role", "messages": [{"role": "robot", "content": "x"}]},
        "", good])
    loaded = load_sessions(path)
    assert [s.source_id for s in loaded.sessions] == ["ok"]
    reasons = {s.source_id: s.reason for s in loaded.skipped}
    assert set(reasons) == {"line-1", "line-2", "no-messages", "empty", "no-assistant",
                            "bad-tool", "bad-role"}
    assert "messages" in reasons["no-messages"]
    assert "no assistant message" in reasons["no-assistant"]
    assert "tool_call_id" in reasons["bad-tool"]
    assert "robot" in reasons["bad-role"]


def test_repairs_keep_the_meaning_and_are_noted() -> None:
    session = parse_session({"id": "weird id/with spaces", "messages": [
        {"role": "user", "content": "go", "timestamp": 3},
        {"role": "assistant", "content": None, "tool_calls": [
            {"name": "bash", "arguments": "ls -la {"},
            {"id": "c2", "name": "read", "arguments": {"path": "a.py"}}]},
        {"role": "tool", "tool_call_id": "call_replay_1", "content": {"files": ["a.py"]}},
        {"role": "tool", "tool_call_id": "c2", "content": "print(1)"},
        {"role": "assistant", "content": "done"}]}, line=1, position=7)
    assert session.key == "0007-weird_id_with_spaces"
    assert session.system_prompt == ""
    calls = session.messages[1].tool_calls
    assert calls[0].id == "call_replay_1"
    assert json.loads(calls[0].arguments) == {"raw_arguments": "ls -la {"}
    assert json.loads(calls[1].arguments) == {"path": "a.py"}
    assert json.loads(session.messages[2].text()) == {"files": ["a.py"]}
    assert len(session.repairs) == 4  # dropped key, generated id, wrapped args, JSON content
    assert session.tools_source == "derived"
    assert session.tools is not None
    names = [t["function"]["name"] for t in session.tools]
    assert names == ["bash", "read"]
    assert session.tools[1]["function"]["parameters"]["properties"] == {"path": {"type": "string"}}


def test_system_prompt_tools_reused_ids_and_turns() -> None:
    call = {"id": "c", "name": "bash", "arguments": "{}"}
    raw = {"messages": [
        {"role": "system", "content": "be brief"}, {"role": "developer", "content": "really"},
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c", "content": "1"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c", "content": "2"},
        {"role": "assistant", "content": "ok"}, {"role": "user", "content": "trailing"}],
        "tools": [{"type": "function", "function": {"name": "bash"}}]}
    session = parse_session(raw, line=3, position=0)
    assert session.source_id == "line-3"
    assert session.system_prompt == "be brief\n\nreally"
    assert session.tools_source == "recorded"
    assert session.reused_tool_ids == 1
    turns = session.turns()
    assert [t.index for t in turns] == [1, 3, 5]
    assert [len(t.pending) for t in turns] == [1, 1, 1]
    no_tools = parse_session({"messages": [{"role": "assistant", "content": "x"}]}, 1, 1)
    assert no_tools.tools is None and no_tools.tools_source == "none"


def test_limit_select_and_max_messages(tmp_path: Path) -> None:
    items = [synthetic_session(3, seed) for seed in range(4)]
    path = write_jsonl(tmp_path / "s.jsonl", items)
    assert len(load_sessions(path, limit=2).sessions) == 2
    chosen = load_sessions(path, select=["-2", "-3"]).sessions
    assert [s.source_id for s in chosen] == ["synthetic-2", "synthetic-3"]
    cut = load_sessions(path, max_messages=5).sessions
    assert all(len(s.messages) == 5 for s in cut)
    with pytest.raises(InvalidInput, match="path"):
        load_sessions(tmp_path / "missing.jsonl")
    with pytest.raises(InvalidInput, match="sessions"):
        load_sessions(path, limit=0)


@given(st.text(max_size=300), st.integers(0, 9999))
def test_session_keys_are_always_valid_store_ids(source_id: str, position: int) -> None:
    assert validate_session_id(session_key(position, source_id))


@settings(max_examples=60, deadline=None)
@given(any_conversations(max_turns=5))
def test_turns_partition_the_body_up_to_the_last_reply(messages: list[Message]) -> None:
    if not any(m.role == "assistant" for m in messages):
        return
    session = parse_session({"messages": to_openai(messages)}, line=1, position=0)
    rebuilt: list[Message] = []
    for turn in session.turns():
        assert turn.reply.role == "assistant"
        assert all(m.role != "assistant" for m in turn.pending)
        rebuilt += [*turn.pending, turn.reply]
    last = max(i for i, m in enumerate(session.messages) if m.role == "assistant")
    assert rebuilt == list(session.messages[: last + 1])
