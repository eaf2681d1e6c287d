"""A turn's calls: the end of the view (the history's last group and the pending
messages) is kept across prepares in the pending messages' memos and extended by each
call's new messages; every call's view still equals the whole conversion.

The pending turn grows a few messages per call, as a tool chain does, over folds made at
once or append by append (:mod:`tests.test_wirefold`'s cases); damaged conversations
included, where the fold may leave the view to the whole conversion (None).
"""

from __future__ import annotations

from typing import Any

import fakeredis
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.core.config import StoreConfig
from shared.core.messages import Message, ToolCall
from shared.core.wire.anthropic import MEMO_KEY
from shared.core.wirefold import ANTHROPIC_END, GEMINI_END, fold_of
from shared.core.wirefold import anthropic as anthropic_fold
from shared.store.sessions import SessionStore
from tests.guard_shells import SHELLS, make
from tests.test_guard import SYSTEM as PROMPT
from tests.test_guard import coding_turn
from tests.test_wirefold import SYSTEM, VIEW, WHOLE, cases, folded, whole

Case = tuple[list[Message], list[Message], list[Message], list[int]]


def calls(pending: list[Message], steps: list[int]) -> list[int]:
    """Where the turn's calls end: growing prefixes of ``pending``, the last one whole."""
    ends, at = [], 0
    for step in steps:
        at = min(len(pending), at + step)
        ends.append(at)
    return [*ends, len(pending)]


@settings(max_examples=300, deadline=None)
@given(fmt=st.sampled_from(["anthropic", "gemini"]), case=cases(valid=False),
       steps=st.lists(st.integers(0, 3), max_size=8), redo=st.booleans())
def test_a_turn_prepared_call_by_call_converts_as_the_whole(fmt: str, case: Case,
                                                            steps: list[int],
                                                            redo: bool) -> None:
    head, history, pending, cuts = case
    fold = folded(fmt, history, cuts)
    memo = tuple({} for _ in pending)  # the pending turn's slots, kept across its calls
    for end in calls(pending, steps):
        got = VIEW[fmt](head, fold, pending[:end], None, memo[:end])
        if got is not None:
            assert (got[0], list(got[1])) == whole(fmt, [*head, *history, *pending[:end]])
        if redo:  # the same call again (a retry): the kept end as it is
            again = VIEW[fmt](head, fold, pending[:end], None, memo[:end])
            assert again == got


@settings(max_examples=150, deadline=None)
@given(fmt=st.sampled_from(["anthropic", "gemini"]), case=cases(valid=True),
       steps=st.lists(st.integers(1, 3), max_size=8))
def test_on_valid_turns_every_call_gives_the_view(fmt: str, case: Case,
                                                  steps: list[int]) -> None:
    head, history, pending, cuts = case
    if pending and pending[0].role == "tool":
        return
    fold = folded(fmt, history, cuts)
    memo = tuple({} for _ in pending)
    for end in calls(pending, steps):
        expected = whole(fmt, [*head, *history, *pending[:end]])
        got = VIEW[fmt](head, fold, pending[:end], None, memo[:end])
        if isinstance(expected, tuple) and expected[0] == "raises":
            continue  # a call cut from its results: not sent, the whole conversion says why
        assert got is not None
        assert (got[0], list(got[1])) == expected


def test_a_tool_chain_converts_each_new_message_once() -> None:
    """A 30-call chain prepared call by call: each call converts its two new messages,
    keeps one end (the newest message's), and the turns before are the same objects."""
    history = [Message(role="user", content="Fix the tests."),
               Message(role="assistant", content="On it.")]
    chain: list[Message] = [Message(role="user", content="Go on, step by step.")]
    for i in range(30):
        chain += [Message(role="assistant", content="", tool_calls=[
                      ToolCall(id=f"c{i}", name="bash", arguments={"command": f"step {i}"})]),
                  Message(role="tool", tool_call_id=f"c{i}", name="bash", content=f"ok {i}")]
    for fmt, key in (("anthropic", ANTHROPIC_END), ("gemini", GEMINI_END)):
        fold = fold_of(fmt, history)
        memo = tuple({} for _ in chain)
        before: list[Any] = []
        for end in range(1, len(chain) + 1, 2):
            got = VIEW[fmt]([SYSTEM], fold, chain[:end], None, memo[:end])
            assert got is not None and got == WHOLE[fmt]([SYSTEM, *history, *chain[:end]])
            out = list(got[1])
            # the finished messages of the last call are the same objects in this one
            assert all(a is b for a, b in zip(out[:max(0, len(before) - 2)], before,
                                              strict=False))
            before = out
            assert [i for i, slot in enumerate(memo[:end]) if key in slot] == [end - 1]
        if fmt == "anthropic":
            assert all(MEMO_KEY in slot for slot in memo)


def test_a_result_joining_the_last_turn_is_checked_again() -> None:
    """The last turn of the kept end may grow (tool results join it): its pairing is
    checked again, not trusted from the call that made it."""
    history = [Message(role="user", content="Fix the tests."),
               Message(role="assistant", content="", tool_calls=[
                   ToolCall(id="a", name="bash", arguments={"command": "ls"})])]
    pending = [Message(role="tool", tool_call_id="a", name="bash", content="ok"),
               Message(role="tool", tool_call_id="x", name="bash", content="stray")]
    for fmt in ("anthropic",):
        fold = fold_of(fmt, history)
        memo = tuple({} for _ in pending)
        first = VIEW[fmt]([SYSTEM], fold, pending[:1], None, memo[:1])
        assert first == WHOLE[fmt]([SYSTEM, *history, *pending[:1]])
        second = VIEW[fmt]([SYSTEM], fold, pending, None, memo)
        assert second is None  # the whole conversion's error, not a view
        assert whole(fmt, [SYSTEM, *history, *pending])[0] == "raises"


@pytest.mark.parametrize("shell_name", SHELLS)
@pytest.mark.parametrize("fmt", ["anthropic", "gemini"])
def test_a_recorded_turn_is_not_converted_again(shell_name: str, fmt: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The turn's prepares converted its messages (memos in its pending slots): recording
    it extends the cached fold with those conversions, and the next prepare's view is
    still the whole conversion of its messages."""
    store = SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="f"))
    guard = make(shell_name, store, overrides={"m": 1_000_000})
    guard.record_turn("s", [dict(m) for m in coding_turn(0, 400)])
    turn = coding_turn(1, 400)
    for end in (1, 4, 5):  # the turn's calls: each converts its new messages
        view = guard.prepare("s", PROMPT, model="m", pending=turn[:end])
        getattr(view, fmt)(shared=True)
    made: list[Message] = []
    import shared.core.wire.anthropic as anthropic_wire
    import shared.core.wire.gemini as gemini_wire
    if fmt == "anthropic":
        real = anthropic_wire.turn_of
        monkeypatch.setattr(anthropic_wire, "turn_of",
                            lambda m, loc: made.append(m) or real(m, loc))
        monkeypatch.setattr(anthropic_fold, "turn_of", anthropic_wire.turn_of)
    else:
        real_model, real_parts = gemini_wire._model_out, gemini_wire._parts_out
        monkeypatch.setattr(gemini_wire, "_model_out",
                            lambda m, *a: made.append(m) or real_model(m, *a))
        monkeypatch.setattr(gemini_wire, "_parts_out",
                            lambda m, *a: made.append(m) or real_parts(m, *a))
    guard.record_turn("s", turn)
    view = guard.prepare("s", PROMPT, model="m", pending=[{"role": "user", "content": "next"}])
    got = getattr(view, fmt)()
    assert not [m for m in made if m.role != "system" and m.text() != "next"], \
        "only the head and the new message are converted"
    monkeypatch.undo()
    assert got == WHOLE[fmt](list(view.messages))
