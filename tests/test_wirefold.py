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

from collections.abc import Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from shared.core.errors import InvalidInput
from shared.core.messages import Message, ToolCall
from shared.core.wire import to_anthropic, to_gemini
from shared.core.wirefold import (
    AnthropicFold,
    GeminiFold,
    anthropic_view,
    fold_of,
    gemini_view,
)
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


def test_a_long_history_is_folded_once() -> None:
    """Appending keeps the finished groups (shared, not made again) and only the last
    group as messages: per append and per view, work on the tail alone."""
    turns = []
    for i in range(300):
        call = ToolCall(id=f"c{i}", name="read_file", arguments={"path": f"f{i}.py"})
        turns += [Message(role="user", content=f"step {i}"),
                  Message(role="assistant", content="", tool_calls=[call]),
                  Message(role="tool", tool_call_id=f"c{i}", content=f"body {i}"),
                  Message(role="assistant", content=f"done {i}")]
    for fmt in ("anthropic", "gemini"):
        fold = fold_of(fmt, turns[:1196])
        before = fold.done.chunks
        fold = fold.extend(turns[1196:])
        assert len(before) >= 2 and all(  # the finished chunks are the same objects
            a is b for a, b in zip(fold.done.chunks[:len(before) - 1], before[:-1], strict=True))
        assert len(fold.tail) <= 2
        got = VIEW[fmt]([SYSTEM], fold, [Message(role="user", content="next")])
        assert got == WHOLE[fmt]([SYSTEM, *turns, Message(role="user", content="next")])
