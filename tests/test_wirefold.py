"""Anthropic and Gemini views from a history's fold equal the whole conversion.

The fold is made at once or append by append, at random cuts; the view is a
head (system prompt, maybe a summary leading as a user message), the history
and pending messages. Where the fold gives a view it must be exactly what
``to_anthropic`` / ``to_gemini`` make of the whole; where it gives None the
guard converts the whole (so an error is the whole conversion's own). On
valid conversations under a normal head it must give a view, so the fast
path is what these tests exercise.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from shared.core.errors import InvalidInput
from shared.core.messages import Message, TextPart, ToolCall
from shared.core.wire import to_anthropic, to_gemini
from shared.core.wirefold import (
    AnthropicFold,
    GeminiFold,
    anthropic_view,
    fold_of,
    fold_of_stored,
    gemini_view,
)
from shared.core.wireview import decode_stored
from tests.strategies import any_conversations, conversations

SYSTEM = Message(role="system", content="You are a careful coding agent.")
LEAD = Message(role="user", content="Summary of the conversation so far: tests pass.")
WHOLE: dict[str, Callable[[list[Message]], Any]] = {"anthropic": to_anthropic,
                                                    "gemini": to_gemini}
VIEW: dict[str, Callable[..., Any]] = {"anthropic": anthropic_view, "gemini": gemini_view}


def whole(fmt: str, messages: list[Message]) -> Any:
    try:
        return WHOLE[fmt](messages)
    except InvalidInput as exc:
        return ("raises", str(exc))


def folded(fmt: str, history: list[Message], cuts: list[int]) -> AnthropicFold | GeminiFold:
    """The fold made by appends at ``cuts`` (the first part made at once)."""
    points = sorted({c for c in cuts if 0 < c < len(history)})
    parts = [history[a:b] for a, b in zip([0, *points], [*points, len(history)], strict=True)]
    fold = fold_of(fmt, parts[0] if parts else [])
    for part in parts[1:]:
        fold = fold.extend(part)
    return fold


@st.composite
def cases(draw: st.DrawFn, valid: bool) -> tuple[list[Message], list[Message], list[Message],
                                                  list[int]]:
    # valid: no system message of its own (after the head's it would lead too: the whole
    # conversion's case)
    convo = draw(conversations(max_turns=5, system=False) if valid
                 else any_conversations(max_turns=5))
    if draw(st.booleans()):  # results that name their function only through the call's id
        convo = [m.model_copy(update={"name": None}) if m.role == "tool" else m for m in convo]
    head = [SYSTEM, *([LEAD] if draw(st.booleans()) else [])]
    if not valid and draw(st.booleans()):
        head = draw(st.sampled_from([[], [LEAD], [SYSTEM, SYSTEM]]))
    split = draw(st.integers(0, len(convo)))
    cuts = draw(st.lists(st.integers(0, max(1, split)), max_size=6))
    return head, convo[:split], convo[split:], cuts


@settings(max_examples=300, deadline=None)
@given(fmt=st.sampled_from(["anthropic", "gemini"]), case=cases(valid=False))
def test_the_fold_gives_the_whole_conversion_or_leaves_it_to_it(
        fmt: str, case: tuple[list[Message], list[Message], list[Message], list[int]]) -> None:
    head, history, pending, cuts = case
    expected = whole(fmt, [*head, *history, *pending])
    for fold in (folded(fmt, history, cuts), fold_of(fmt, history)):
        got = VIEW[fmt](head, fold, pending)
        assert got is None or got == expected


@settings(max_examples=200, deadline=None)
@given(fmt=st.sampled_from(["anthropic", "gemini"]), case=cases(valid=True))
def test_on_valid_conversations_the_fold_gives_the_view(
        fmt: str, case: tuple[list[Message], list[Message], list[Message], list[int]]) -> None:
    head, history, pending, cuts = case
    if pending and pending[0].role == "tool":  # a turn cut between a call and its results
        return
    got = VIEW[fmt](head, folded(fmt, history, cuts), pending)
    assert got is not None
    assert got == WHOLE[fmt]([*head, *history, *pending])


def read_file_turns(n: int) -> list[Message]:
    """``n`` turns of four messages: a step, a read_file call, its result, a reply."""
    turns = []
    for i in range(n):
        call = ToolCall(id=f"c{i}", name="read_file", arguments={"path": f"f{i}.py"})
        turns += [Message(role="user", content=f"step {i}"),
                  Message(role="assistant", content="", tool_calls=[call]),
                  Message(role="tool", tool_call_id=f"c{i}", content=f"body {i}"),
                  Message(role="assistant", content=f"done {i}")]
    return turns


def test_a_long_history_is_folded_once() -> None:
    """Appending keeps the finished groups (shared, not made again) and only the last
    group as messages: per append and per view, work on the tail alone."""
    turns = read_file_turns(300)
    for fmt in ("anthropic", "gemini"):
        fold = fold_of(fmt, turns[:1196])
        before = fold.done.chunks
        fold = fold.extend(turns[1196:])
        assert len(before) >= 2 and all(  # the finished chunks are the same objects
            a is b for a, b in zip(fold.done.chunks[:len(before) - 1], before[:-1], strict=True))
        assert len(fold.tail) <= 2
        got = VIEW[fmt]([SYSTEM], fold, [Message(role="user", content="next")])
        assert got == WHOLE[fmt]([SYSTEM, *turns, Message(role="user", content="next")])


@settings(max_examples=300, deadline=None)
@given(fmt=st.sampled_from(["anthropic", "gemini"]), case=cases(valid=False),
       picks=st.lists(st.integers(0, 200), max_size=4), text=st.sampled_from(
           ["[tool output cleared]", "", "[earlier read of a.py omitted]"]))
def test_a_fold_with_placeholders_made_is_the_fold_of_the_changed_history(
        fmt: str, case: tuple[list[Message], list[Message], list[Message], list[int]],
        picks: list[int], text: str) -> None:
    """Cheap-stage placeholders (a tool result's content replaced) join only their groups
    again: the view equals the whole conversion of the changed history, or the fold says
    it cannot (None) and the guard makes a new one."""
    head, history, pending, cuts = case
    tools = [i for i, m in enumerate(history) if m.role == "tool"]
    if not tools:
        return
    changes = {tools[p % len(tools)]: history[tools[p % len(tools)]].model_copy(
        update={"content": text}) for p in picks}
    changed = [changes.get(i, m) for i, m in enumerate(history)]
    fold = folded(fmt, history, cuts).replace(changed, changes)
    if fold is None:
        return
    more = pending[:1]
    fold = fold.extend(more)
    expected = whole(fmt, [*head, *changed, *more, *pending[1:]])
    got = VIEW[fmt](head, fold, pending[1:])
    if got is not None:
        assert (got[0], list(got[1])) == expected


@settings(max_examples=100, deadline=None)
@given(fmt=st.sampled_from(["anthropic", "gemini"]),
       convo=conversations(max_turns=6, system=False), picks=st.lists(st.integers(0, 200),
                                                                      min_size=1, max_size=4),
       cuts=st.lists(st.integers(1, 40), max_size=4))
def test_placeholders_on_valid_conversations_keep_the_fold(
        fmt: str, convo: list[Message], picks: list[int], cuts: list[int]) -> None:
    tools = [i for i, m in enumerate(convo) if m.role == "tool"]
    if not tools:
        return
    changes = {tools[p % len(tools)]: convo[tools[p % len(tools)]].model_copy(
        update={"content": "[tool output cleared]"}) for p in picks}
    changed = [changes.get(i, m) for i, m in enumerate(convo)]
    before = folded(fmt, convo, cuts)
    assert VIEW[fmt]([SYSTEM], before, []) is not None  # its kept groups' memos filled
    fold = before.replace(changed, changes)
    assert fold is not None, "unique ids, no conversion error: the fold is kept"
    got = VIEW[fmt]([SYSTEM], fold, [])
    assert got is not None and (got[0], list(got[1])) == whole(fmt, [SYSTEM, *changed])


@st.composite
def stored_histories(draw: st.DrawFn) -> tuple[list[Message], list[Any]]:
    """A conversation with some messages dressed as real sessions have them (an error
    result, thinking blocks, Gemini's signatures, synthetic ids and JSON responses,
    reasoning, content parts, results named only by their call), and the
    same as a cache holds it: stored JSON, some of it decoded already."""
    convo = draw(any_conversations(max_turns=5))
    dressed: list[Message] = []
    for m in convo:
        kind = draw(st.sampled_from(["as is"] * 6 + ["error", "thinking", "parts", "signed",
                                                     "synthetic", "json", "unnamed",
                                                     "reasoning"]))
        ids = [c.id for c in m.tool_calls]
        if kind == "signed":  # Gemini's thought signatures, on every part they may sign
            m = m.model_copy(update={"metadata": {**m.metadata, "gemini_signatures": {
                "content:0": "s0", "response": "s1", **{f"call:{i}": "s2" for i in ids}}}})
        elif kind == "synthetic" and (ids or m.role == "tool"):
            m = m.model_copy(update={"metadata": {**m.metadata, "gemini_synthetic_ids": (
                ids[:1] if ids else True)}})
        elif kind == "json" and m.role == "tool":
            m = m.model_copy(update={"content": draw(st.sampled_from(
                ['{"ok": true, "n": [1, 2]}', '[1]', 'not json'])),
                "metadata": {**m.metadata, "gemini_response": "json"}})
        elif kind == "unnamed" and m.role == "tool":
            m = m.model_copy(update={"name": None})
        elif kind == "reasoning" and m.role == "assistant":
            m = m.model_copy(update={"reasoning": "thinking it over"})
        elif kind == "error" and m.role == "tool":
            m = m.model_copy(update={"metadata": {**m.metadata, "is_error": True}})
        elif kind == "thinking" and m.role == "assistant":
            m = m.model_copy(update={"reasoning": "abc", "metadata": {
                **m.metadata, "anthropic_thinking": [{"chars": 3, "signature": "s"}]}})
        elif kind == "parts" and m.role in ("user", "tool"):
            m = m.model_copy(update={"content": [TextPart(text=m.text() or "x"),
                                                 TextPart(text=" ")]})
        dressed.append(m)
    raw = [m if draw(st.booleans()) and draw(st.booleans()) else m.to_json().encode()
           for m in dressed]
    return dressed, raw


@settings(max_examples=300, deadline=None)
@given(case=stored_histories())
def test_a_fold_made_from_stored_json_is_the_fold_of_its_messages(
        case: tuple[list[Message], list[Any]]) -> None:
    """A cold cache folds the stored JSON as plain data: the same fold (turns, kept
    messages, memos) as the decoded messages give, or the same refusal."""
    messages, raw = case
    decoded: list[tuple[Any, ...]] = []

    def decode(items: tuple[Any, ...]) -> tuple[Message, ...]:
        decoded.append(items)
        return decode_stored(items)

    for fmt in ("anthropic", "gemini"):
        loaded = [json.loads(r) if isinstance(r, bytes) else None for r in raw]
        assert fold_of_stored(fmt, raw, loaded.__getitem__, decode) == fold_of(fmt, messages)


def test_a_stored_fold_decodes_only_the_messages_it_keeps() -> None:
    """A cold fold of 800 messages decodes two of them into models."""
    turns = read_file_turns(200)
    decoded: list[int] = []

    def decode(items: tuple[Any, ...]) -> tuple[Message, ...]:
        decoded.append(sum(isinstance(r, bytes) for r in items))
        return decode_stored(items)

    for fmt in ("anthropic", "gemini"):
        decoded.clear()
        raw = [m.to_json().encode() for m in turns]
        fold = fold_of_stored(fmt, raw, [json.loads(r) for r in raw].__getitem__, decode)
        assert fold == fold_of(fmt, turns)
        assert sum(decoded) == 2  # the first message and the last group (one message)
