"""A summary moves the watermark: Anthropic's and Gemini's folds drop their first
messages and keep the finished groups after the cut, and the view still equals the
whole conversion.

Same cases as :mod:`tests.test_wirefold` (folds made at once or append by append); the
cut is anywhere on damaged conversations, at a turn start on valid ones (where a
summary's watermark lands), where the fold must be kept.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from shared.core.chunks import Chunks
from shared.core.messages import Message, ToolCall
from shared.core.turns import turn_starts
from shared.core.wirefold import AnthropicFold, GeminiFold, fold_of
from shared.core.wireview import carry, history_fold
from tests.strategies import conversations
from tests.test_wirefold import SYSTEM, VIEW, cases, folded, read_file_turns, whole

FORMATS = st.sampled_from(["anthropic", "gemini"])

Case = tuple[list[Message], list[Message], list[Message], list[int]]


@settings(max_examples=300, deadline=None)
@given(fmt=FORMATS, case=cases(valid=False), at=st.integers(0, 60), seen=st.booleans())
def test_a_dropped_fold_gives_the_whole_conversion_of_the_rest(fmt: str, case: Case, at: int,
                                                                seen: bool) -> None:
    head, history, pending, cuts = case
    n = at % (len(history) + 1)
    fold = folded(fmt, history, cuts)
    if seen:  # its memos filled by a view made before the drop
        VIEW[fmt](head, fold, pending)
    dropped = fold.drop(n, history[n:])
    if dropped is None:
        return
    more = pending[:1]
    got = VIEW[fmt](head, dropped.extend(more), pending[1:])
    if got is not None:
        assert (got[0], list(got[1])) == whole(fmt, [*head, *history[n:], *pending])


@settings(max_examples=150, deadline=None)
@given(fmt=FORMATS, convo=conversations(max_turns=7, system=False), pick=st.integers(0, 50),
       cuts=st.lists(st.integers(1, 60), max_size=4))
def test_a_fold_dropped_at_a_turn_start_is_kept(fmt: str, convo: list[Message], pick: int,
                                               cuts: list[int]) -> None:
    starts = turn_starts(convo)
    n = starts[pick % len(starts)] if starts else 0
    fold = folded(fmt, convo, cuts)
    dropped = fold.drop(n, convo[n:])
    assert dropped is not None, "valid pairs, a cut at a turn start: the fold is kept"
    assert dropped.size == len(convo) - n
    got = VIEW[fmt]([SYSTEM], dropped, [])
    assert got is not None
    assert got == whole(fmt, [SYSTEM, *convo[n:]])


def test_the_finished_groups_after_the_cut_are_the_same_objects() -> None:
    turns = read_file_turns(200)
    for fmt in ("anthropic", "gemini"):
        fold = fold_of(fmt, turns)
        n = 4 * 150  # the watermark at turn 150
        dropped = fold.drop(n, turns[n:])
        assert isinstance(dropped, AnthropicFold | GeminiFold)
        kept = {id(w) for w in dropped.done}
        assert len(kept) >= len(dropped.done) - 1
        assert kept <= {id(w) for w in fold.done}  # shared, not made again
        assert VIEW[fmt]([SYSTEM], dropped, []) == whole(fmt, [SYSTEM, *turns[n:]])


@settings(max_examples=150, deadline=None)
@given(fmt=FORMATS, convo=conversations(max_turns=7, system=False), pick=st.integers(0, 50),
       tool=st.integers(0, 50), new=st.integers(0, 6))
def test_carry_drops_and_changes_the_fold_as_the_cache_does(fmt: str, convo: list[Message],
                                                           pick: int, tool: int,
                                                           new: int) -> None:
    """The cached view's step after a summary with a placeholder made in the same read:
    ``carry`` with a drop, a change and new messages gives the whole conversion."""
    starts = turn_starts(convo)
    n = starts[pick % len(starts)] if starts else 0
    split = max(n, len(convo) - new)
    before, added = convo[:split], convo[split:]
    wire = {fmt: fold_of(fmt, before)}
    rest = before[n:]
    tools = [i for i, m in enumerate(rest) if m.role == "tool"]
    changes = ({tools[tool % len(tools)]: rest[tools[tool % len(tools)]].model_copy(
        update={"content": "[tool output cleared]"})} if tools else {})
    changed = [changes.get(i, m) for i, m in enumerate(rest)]
    out = carry(wire, n, changes, added, history=changed)
    assert fmt in out, "a summary at a turn start keeps the fold"
    fold = history_fold(out, fmt, Chunks.of([*changed, *added]))
    got = VIEW[fmt]([SYSTEM], fold, [])
    assert got is not None
    assert got == whole(fmt, [SYSTEM, *changed, *added])


def test_a_result_cannot_name_a_call_the_cut_dropped() -> None:
    """Gemini names a result's function from its call: after the cut, a result whose call
    is gone finds no name in the kept fold, as in the whole conversion of the rest."""
    def step(i: int, name: str) -> list[Message]:
        return [Message(role="user", content=f"step {i}"),
                Message(role="assistant", content="", tool_calls=[
                    ToolCall(id=f"c{i}", name=name, arguments={"path": "a.py"})]),
                Message(role="tool", tool_call_id=f"c{i}", content=f"body {i}"),
                Message(role="assistant", content=f"done {i}")]
    history = [*step(0, "read_file"), *step(1, "bash"), *step(2, "grep"), *step(3, "bash")]
    stray = [Message(role="user", content="and again"),
             Message(role="tool", tool_call_id="c0", content="late result")]
    fold = fold_of("gemini", history)
    dropped = fold.drop(8, history[8:])
    assert dropped is not None
    expected = whole("gemini", [SYSTEM, *history[8:], *stray])
    got = VIEW["gemini"]([SYSTEM], dropped, stray)
    assert got is None or (got[0], list(got[1])) == expected
