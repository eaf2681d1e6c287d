"""A full read's decode (the cold path): wire forms made in place equal to_openai's,
shapes equal the pair scan's, the first message reads alone, and the first Anthropic or
Gemini fold made from those wire forms is the fold of the messages."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.core.chunks import Lazy
from shared.core.messages import Message
from shared.core.pairs import scan_pairs
from shared.core.records import CheapDecision, RawView
from shared.core.viewcache import decode_view
from shared.core.wire.openai import to_openai
from shared.core.wirefold import fold_of
from shared.core.wireview import carry, history_fold
from tests.strategies import any_conversations

ODD = [
    Message(role="user", content="hi"),
    Message(role="user", content="   "),
    Message(role="user", content=[{"type": "text", "text": "a"}, {"type": "text", "text": " "}]),
    Message(role="user", content=[{"type": "text", "text": "look"},
                                  {"type": "image", "url": "https://x/y.png"}]),
    Message(role="assistant", content="", tool_calls=[
        {"id": "c1", "name": "read", "arguments": {"path": "a"}}], reasoning="think"),
    Message(role="assistant", content="", tool_calls=[{"id": "c3", "name": "ls"}],
            metadata={"wire_ids": {"c3": "call_3"}}),
    Message(role="assistant", content="both", tool_calls=[{"id": "c2", "name": "ls"}]),
    Message(role="tool", content="out", tool_call_id="c1", name="read"),
    Message(role="tool", content="out", tool_call_id="c2", metadata={"k": 1}),
    Message(role="system", content="dev", metadata={"openai_role": "developer"}),
    Message(role="assistant", content="no", metadata={"openai_refusal": "r", "k": 1}),
    Message(role="assistant", content="", metadata={"usage": {"x": 1}}),
    Message(role="assistant", content="go", tool_calls=[{"id": "c4", "name": "ls"}],
            metadata={"usage": {"prompt_tokens": 9}, "wire_ids": {"c4": "call_4"}}),
    Message(role="tool", content="err", tool_call_id="c4",
            metadata={"usage": {"x": 1}, "is_error": True}),
    Message(role="assistant", content=""),
    # numbers where orjson and json could differ: dropped with the metadata of a message
    # made in place; kept exact for one converted from its data
    Message(role="assistant", content="paid", metadata={"usage": {"cost": 0.1 + 0.2,
                                                                  "big": 2**70}}),
    Message(role="assistant", content="kept", metadata={"openai_audio": {"id": 2**70},
                                                        "score": 1e-7}),
]


def full_read(messages: list[Message], cheap: dict[int, CheapDecision] | None = None) -> RawView:
    return RawView(state_raw={"epoch": "e", "version": "1"},
                   messages=[m.to_json().encode() for m in messages], start=0,
                   tokens_before_watermark=0, tokens_total=len(messages), length=len(messages),
                   summary_json=None, summary_included=True,
                   cheap_raw={i: d.model_dump_json() for i, d in (cheap or {}).items()},
                   pending=False, incremental=False)


def check(messages: list[Message], cheap: dict[int, CheapDecision] | None = None) -> None:
    snap = decode_view(full_read(messages, cheap), None, carry)
    applied = [m.model_copy(update={"content": cheap[i].placeholder}) if cheap and i in cheap
               else m for i, m in enumerate(messages)]
    for fmt in ("anthropic", "gemini"):  # folded from the wire forms made in place (first:
        # before anything reads the history, which would decode its chunks)
        assert history_fold(dict(snap.wire), fmt, snap.applied) == fold_of(fmt, applied)
    wire = list(snap.wire["openai"])
    expected_wire = to_openai(applied, include_reasoning=False)
    assert wire == expected_wire
    assert [json.dumps(w) for w in wire] == [json.dumps(w) for w in expected_wire]  # key order
    assert list(snap.history) == messages
    expected = scan_pairs(messages)
    assert (snap.scan.ok, snap.scan.position if snap.scan.ok else 0) == \
        (expected.ok, expected.position if expected.ok else 0)


def test_odd_messages_convert_as_to_openai_does() -> None:
    check(ODD)
    check(ODD, {1: CheapDecision(index=1, stage="clear_tool_output", placeholder="[x]",
                                 saved_tokens=1),
                8: CheapDecision(index=8, stage="clear_tool_output", placeholder="[y]",
                                 saved_tokens=1)})


@settings(max_examples=200, deadline=None)
@given(messages=any_conversations())
def test_any_conversation_converts_and_scans_as_before(messages: list[Message]) -> None:
    check(messages)


def test_a_fold_reads_plain_messages_from_the_wire_forms(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Assistant messages with a response's ``usage`` (as OpenAI-format logs keep them) are
    plain to every format: the first Anthropic or Gemini fold of a cold read does not
    parse their stored JSON again (a 10k-message view: ~10 ms)."""
    from shared.core import wireview

    messages: list[Message] = [Message(role="user", content="start")]
    for k in range(20):
        messages += [Message(role="assistant", content="", tool_calls=[
                         {"id": f"c{k}", "name": "ls", "arguments": {"k": k}}],
                             metadata={"usage": {"prompt_tokens": k}}),
                     Message(role="tool", content=f"out {k}", tool_call_id=f"c{k}")]
    parsed: list[bytes] = []
    real = wireview._loads
    monkeypatch.setattr(wireview, "_loads", lambda raw: parsed.append(raw) or real(raw))
    snap = decode_view(full_read(messages), None, carry)
    for fmt in ("anthropic", "gemini"):
        assert history_fold(dict(snap.wire), fmt, snap.applied) == fold_of(fmt, messages)
    assert parsed == []


def test_the_first_message_is_a_chunk_of_its_own() -> None:
    """Reading the view's first message (every prepare does) decodes it alone."""
    messages = [Message(role="user", content=f"m{i}") for i in range(1200)]
    snap = decode_view(full_read(messages), None, carry)
    assert snap.applied[:1] == messages[:1]
    chunks = snap.history.chunks
    assert len(chunks[0]) == 1 and all(isinstance(c, Lazy) for c in chunks)
    assert not any(c.decoded for c in chunks[1:])  # type: ignore[attr-defined]
    assert list(snap.history) == messages


def test_placeholders_decode_their_messages_alone() -> None:
    """A cold read with cheap decisions decodes the decided messages, not their chunks."""
    messages: list[Message] = [Message(role="user", content="go")]
    for i in range(400):
        messages += [Message(role="assistant", content="", tool_calls=[
                         {"id": f"c{i}", "name": "read", "arguments": {"path": f"f{i}"}}]),
                     Message(role="tool", content=f"out {i} " * 50, tool_call_id=f"c{i}")]
    cheap = {i: CheapDecision(index=i, stage="clear_tool_output", placeholder=f"[cleared {i}]",
                              saved_tokens=100) for i in (2, 300, 700)}
    snap = decode_view(full_read(messages, cheap), None, carry)
    assert not any(c.decoded for c in snap.history.chunks)  # type: ignore[attr-defined]
    assert [snap.applied[i].content for i in cheap] == [d.placeholder for d in cheap.values()]
    assert snap.saved == 300
    assert list(snap.history) == messages
    check(messages, cheap)


def test_new_placeholders_in_old_chunks_decode_their_messages_alone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A warm view over the trigger plans cheap stages for each new batch; a placeholder
    for an old message (a file read again) must not decode the 512 messages of its chunk
    (5-25 ms in a warm call, four times in 200 turns of the benchmark), nor the folds of
    Anthropic's and Gemini's views that join the runs around it again."""
    from shared.core import guard_state
    from shared.core.config import CompactionPolicy
    from shared.core.tokens import DEFAULT_COUNTER

    messages: list[Message] = [Message(role="user", content="go")]
    for i in range(700):
        messages += [Message(role="assistant", content="", tool_calls=[
                         {"id": f"c{i}", "name": "read", "arguments": {"path": f"f{i}"}}]),
                     Message(role="tool", content=f"out {i} " * 50, tool_call_id=f"c{i}")]
    snap = decode_view(full_read(messages), None, carry)
    for fmt in ("anthropic", "gemini"):  # the folds a view kept join the changed runs again
        history_fold(snap.wire, fmt, snap.applied)
    plan = [CheapDecision(index=i, stage="clear_tool_output", placeholder=f"[cleared {i}]",
                          saved_tokens=100) for i in (2, 600, 1300)]
    monkeypatch.setattr(guard_state, "_cheap_plan", lambda *_: plan)
    decisions, after = guard_state._cheap(snap, CompactionPolicy(), DEFAULT_COUNTER)
    assert decisions == plan
    assert not any(c.decoded for c in after.history.chunks)  # type: ignore[attr-defined]
    applied = list(after.applied)
    assert [applied[d.index].content for d in plan] == [d.placeholder for d in plan]
    assert applied[3] == messages[3] and after.saved == 300
    for fmt in ("anthropic", "gemini"):
        assert after.wire[fmt] == fold_of(fmt, applied)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(0, 3))
def test_tiny_reads(n: int) -> None:
    check(ODD[:n])


def test_stored_counts_answer_for_the_applied_messages_but_placeholders() -> None:
    """A truncation counts the applied view (its own decoded objects): the store's count
    answers for each stored message, a placeholder is counted afresh."""
    from shared.core.tokens import DEFAULT_COUNTER
    from shared.core.viewcache import KnownCounts

    messages = [Message(role="user", content="read it"),
                Message(role="assistant", content="", tool_calls=[{"id": "c1", "name": "read"}]),
                Message(role="tool", content="x" * 400, tool_call_id="c1"),
                Message(role="assistant", content="done")]
    cheap = {2: CheapDecision(index=2, stage="clear_tool_output", placeholder="[cleared]",
                              saved_tokens=90)}
    raw = full_read(messages, cheap)
    stored = [7, 11, 105, 3]  # the store's counts (not the default counter's)
    raw = RawView(**{**{f: getattr(raw, f) for f in raw.__dataclass_fields__},
                     "tokens_total": sum(stored),
                     "totals": [sum(stored[:i + 1]) for i in range(4)]})
    snap = decode_view(raw, None, carry)
    counter = KnownCounts.of(DEFAULT_COUNTER, snap, applied=True)
    applied = list(snap.applied)
    assert [counter.message(m) for m in applied] == [
        7, 11, DEFAULT_COUNTER.message(applied[2]), 3]
    assert applied[2].content == "[cleared]"
