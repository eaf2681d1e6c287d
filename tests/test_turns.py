"""Turn boundaries, tool units, safe cuts and cut points."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.core.errors import InvalidInput
from shared.core.messages import Message, ToolCall
from shared.core.repair import validate_view
from shared.core.turns import (
    SPLIT_TURN_MIN_PREFIX,
    CutPoint,
    Unit,
    find_cut_point,
    is_safe_cut,
    leading_system_count,
    safe_cut,
    tool_units,
    turn_starts,
    unit_boundaries,
)
from tests.strategies import (
    CharCounter,
    any_conversations,
    conversations,
    load_transcripts,
    peer_cases,
    peer_messages,
)

COUNT = CharCounter()


def sys(text: str = "rules") -> Message:
    return Message(role="system", content=text)


def user(text: str = "question") -> Message:
    return Message(role="user", content=text)


def bot(text: str = "answer") -> Message:
    return Message(role="assistant", content=text)


def call(*ids: str) -> Message:
    return Message(role="assistant", tool_calls=[ToolCall(id=i, name="bash") for i in ids])


def result(call_id: str, text: str = "ok") -> Message:
    return Message(role="tool", tool_call_id=call_id, content=text)


# -- units and turns ------------------------------------------------------------------

def test_parallel_calls_and_their_results_form_one_unit() -> None:
    messages = [user(), call("a", "b"), result("b"), result("a"), bot()]
    assert tool_units(messages) == [Unit(0, 1), Unit(1, 4), Unit(4, 5)]
    assert unit_boundaries(messages) == [0, 1, 4, 5]


def test_a_result_that_drifted_away_stretches_its_unit_over_the_gap() -> None:
    messages = [user(), call("a"), user("interrupt"), bot(), result("a"), user("next")]
    assert tool_units(messages) == [Unit(0, 1), Unit(1, 5), Unit(5, 6)]
    assert turn_starts(messages) == [0, 5]  # the user message inside the unit starts nothing


def test_stray_tool_messages_are_absorbed_so_no_cut_starts_with_a_result() -> None:
    messages = [user(), result("ghost"), bot()]
    assert tool_units(messages) == [Unit(0, 2), Unit(2, 3)]
    assert not is_safe_cut(messages, 1)


def test_leading_system_messages_are_the_head_and_belong_to_no_turn() -> None:
    messages = [sys(), sys("more"), user(), bot(), sys("mid"), user()]
    assert leading_system_count(messages) == 2
    assert turn_starts(messages) == [2, 5]
    assert tool_units(messages)[0] == Unit(2, 3)
    assert not is_safe_cut(messages, 0) and is_safe_cut(messages, 2) and is_safe_cut(messages, 6)


def test_empty_and_system_only_histories() -> None:
    assert turn_starts([]) == [] and tool_units([]) == [] and unit_boundaries([]) == [0, 0]
    assert turn_starts([sys()]) == [] and unit_boundaries([sys()]) == [1, 1]


# -- safe_cut ---------------------------------------------------------------------------

def test_safe_cut_snaps_to_the_nearest_turn_start_ties_to_the_earlier() -> None:
    messages = [user(), bot(), bot(), user(), bot(), bot(), bot(), bot()]
    assert safe_cut(messages, 1) == 0
    assert safe_cut(messages, 2) == 3
    assert safe_cut(messages, 3) == 3
    assert safe_cut(messages, 7) == 8  # n is the boundary after the last turn
    tie = [user(), bot(), bot(), bot(), user(), bot()]
    assert safe_cut(tie, 2) == 0  # 2 away from 0 and from 4: the earlier compacts less


def test_safe_cut_never_compacts_the_head() -> None:
    messages = [sys(), user(), bot(), user(), bot()]
    assert safe_cut(messages, 0) == 1
    assert safe_cut(messages, 2) == 1


def test_safe_cut_without_user_messages_falls_back_to_unit_boundaries() -> None:
    messages = [call("a", "b"), result("a"), result("b"), bot(), call("c"), result("c")]
    assert safe_cut(messages, 1) == 0
    assert safe_cut(messages, 2) == 3
    assert safe_cut(messages, 5) == 4


@pytest.mark.parametrize("target", [-1, 6, True, "2"])
def test_safe_cut_rejects_targets_outside_the_list(target: Any) -> None:
    with pytest.raises(InvalidInput) as info:
        safe_cut([user(), bot(), user(), bot(), user()], target)
    assert info.value.field == "target"


# -- find_cut_point ---------------------------------------------------------------------

def test_cut_keeps_at_least_the_recent_tokens_and_lands_on_a_turn_start() -> None:
    messages = [user("a" * 9), bot("b" * 9), user("c" * 9), bot("d" * 9), user("e" * 9)]
    # 10 tokens each with CharCounter; 25 recent tokens reach back into turn 2 (index 2)
    cut = find_cut_point(messages, 25, COUNT)
    assert cut == CutPoint(index=2, turn_start=2, split_turn=False, head=0, kept_tokens=30)
    assert cut.compacted == (0, 2) and cut.prefix is None and cut.whole_turns == (0, 2)
    assert find_cut_point(messages, 20, COUNT).index == 2  # 20 reaches index 3, in turn 2


def test_cut_keeps_everything_when_history_is_smaller_than_asked() -> None:
    messages = [sys(), user(), bot()]
    cut = find_cut_point(messages, 10_000, COUNT)
    assert (cut.index, cut.head, cut.split_turn) == (1, 1, False)
    assert cut.compacted == (1, 1)


def test_zero_keep_compacts_everything_and_trivial_histories() -> None:
    messages = [user(), bot()]
    assert find_cut_point(messages, 0, COUNT).index == 2
    assert find_cut_point([], 100, COUNT) == CutPoint(0, 0, False, 0, 0)
    assert find_cut_point([sys(), sys()], 100, COUNT).index == 2


def test_a_single_giant_message_is_kept_whole() -> None:
    giant = [user("x" * 100_000)]
    assert find_cut_point(giant, 10, COUNT).index == 0
    messages = [user(), bot(), user("x" * 100_000)]
    assert find_cut_point(messages, 10, COUNT).index == 2


def _long_turn(steps: int) -> list[Message]:
    messages = [user("old"), bot("old answer"), user("do it")]
    for k in range(steps):
        messages += [call(f"c{k}a", f"c{k}b"), result(f"c{k}a", "r" * 50),
                     result(f"c{k}b", "r" * 50)]
    return [*messages, bot("done")]


def test_a_long_turn_is_split_at_a_unit_boundary_with_its_prefix_named() -> None:
    messages = _long_turn(6)  # turn 2 runs from index 2 to 21
    cut = find_cut_point(messages, 120, COUNT)
    assert cut.split_turn and cut.turn_start == 2
    assert cut.index in unit_boundaries(messages)
    assert cut.index - cut.turn_start >= SPLIT_TURN_MIN_PREFIX
    assert cut.prefix == (2, cut.index) and cut.whole_turns == (0, 2)
    assert messages[cut.index].tool_calls  # a call with its results, not a result


def test_a_short_prefix_snaps_back_to_the_turn_start() -> None:
    messages = _long_turn(1)  # turn: user, call, 2 results, final: prefix < 5
    cut = find_cut_point(messages, 60, COUNT)
    assert (cut.index, cut.split_turn) == (2, False)


def test_no_user_message_at_all_cuts_at_a_unit_boundary() -> None:
    messages = [call(f"c{k}") if k % 2 == 0 else result(f"c{k - 1}", "r" * 20) for k in range(16)]
    cut = find_cut_point(messages, 30, COUNT)
    assert cut.turn_start == 0 and cut.split_turn and cut.index % 2 == 0


@pytest.mark.parametrize("keep", [-1, 2.5, None, False])
def test_find_cut_point_rejects_bad_keep(keep: Any) -> None:
    with pytest.raises(InvalidInput) as info:
        find_cut_point([user()], keep)
    assert info.value.field == "keep_recent_tokens"


def test_a_huge_recent_tool_output_is_compacted_when_the_kept_part_has_a_bound() -> None:
    """A short turn with a huge result: the snap back keeps it all, the bound moves the cut."""
    messages = [user("old"), bot("old answer"), user("lint it"), call("c1"),
                result("c1", "W0611 unused import\n" * 200), bot("mostly unused imports")]
    loose = find_cut_point(messages, 25, COUNT)
    assert (loose.index, loose.split_turn) == (2, False) and loose.kept_tokens > 4000
    cut = find_cut_point(messages, 25, COUNT, max_kept_tokens=100)
    assert cut == CutPoint(index=5, turn_start=2, split_turn=True, head=0,
                           kept_tokens=_suffix(messages, 5))
    assert cut.kept_tokens <= 100 and cut.prefix == (2, 5)
    assert find_cut_point(messages, 25, COUNT, max_kept_tokens=10_000) == loose


def test_a_newest_unit_larger_than_the_bound_is_compacted_too() -> None:
    messages = [sys(), user("write it"), bot("x" * 5000)]
    assert find_cut_point(messages, 10, COUNT).index == 1
    cut = find_cut_point(messages, 10, COUNT, max_kept_tokens=50)
    assert (cut.index, cut.kept_tokens, cut.split_turn) == (3, 0, False)
    assert cut.compacted == (1, 3)


def test_the_bound_does_not_leave_a_question_behind_its_answer() -> None:
    """Short turns and a bound a turn and a half wide (a small window, a large system
    prompt): the first boundary that fits falls after a user message. Compacting the
    question but keeping its answer would show the model an answer to a question it is
    only told about, so the cut goes on to the next turn; the last turn is split rather
    than compacted whole."""
    messages = [m for i in range(10) for m in (user(f"question {i} " * 30),
                                               bot(f"answer {i} " * 30))]
    turn = _suffix(messages, 18)
    cut = find_cut_point(messages, turn + turn // 2, COUNT, max_kept_tokens=turn + turn // 2)
    assert (cut.index, cut.split_turn, cut.kept_tokens) == (18, False, turn)
    last = find_cut_point(messages, turn // 2, COUNT, max_kept_tokens=turn // 2 + 5)
    assert (last.index, last.split_turn) == (19, True)


def test_the_bound_never_separates_a_call_from_its_results() -> None:
    messages = [user("go"), call("a", "b"), result("a", "r" * 900), result("b", "r" * 900),
                bot("done")]
    cut = find_cut_point(messages, 5, COUNT, max_kept_tokens=200)
    assert cut.index == 4 and is_safe_cut(messages, cut.index)


@pytest.mark.parametrize("bound", [-1, 2.5, "10", True])
def test_find_cut_point_rejects_a_bad_bound(bound: Any) -> None:
    with pytest.raises(InvalidInput) as info:
        find_cut_point([user()], 0, max_kept_tokens=bound)
    assert info.value.field == "max_kept_tokens"


# -- properties ------------------------------------------------------------------------

def _suffix(messages: list[Message], index: int) -> int:
    return sum(COUNT.message(m) for m in messages[index:])


def _halves_are_valid(messages: list[Message], cut: int) -> None:
    head = leading_system_count(messages)
    assert validate_view(messages[:cut], "openai") == []
    assert validate_view(messages[:head] + messages[cut:], "openai") == []


@settings(max_examples=300, deadline=None)
@given(conversations(), st.integers(0, 400))
def test_safe_cut_lands_on_a_turn_boundary_and_separates_no_pair(
    messages: list[Message], raw: int
) -> None:
    target = raw % (len(messages) + 1)
    cut = safe_cut(messages, target)
    head = leading_system_count(messages)
    starts = turn_starts(messages)
    allowed = {head, *starts, len(messages)} if starts else set(unit_boundaries(messages))
    assert cut in allowed and is_safe_cut(messages, cut)
    assert all(abs(c - max(target, head)) >= abs(cut - max(target, head)) for c in allowed)
    _halves_are_valid(messages, cut)


@settings(max_examples=300, deadline=None)
@given(any_conversations(), st.integers(0, 3000))
def test_cut_point_invariants(messages: list[Message], keep: int) -> None:
    cut = find_cut_point(messages, keep, COUNT)
    head, n = leading_system_count(messages), len(messages)
    body_tokens = _suffix(messages, head)
    assert head <= cut.turn_start <= cut.index <= n and cut.head == head
    assert is_safe_cut(messages, cut.index)
    assert cut.kept_tokens == _suffix(messages, cut.index)
    assert cut.kept_tokens >= min(keep, body_tokens)
    if cut.split_turn:
        assert cut.index - cut.turn_start >= SPLIT_TURN_MIN_PREFIX
        assert cut.turn_start in [head, *turn_starts(messages)]
    else:
        assert cut.index in [head, *turn_starts(messages), n]
    # no later turn boundary would still keep `keep` tokens: the cut is not over-cautious
    later = [b for b in [*turn_starts(messages), n] if b > cut.index]
    assert all(_suffix(messages, b) < keep for b in later) or keep == 0


def _open_tail_start(messages: list[Message]) -> int | None:
    """Start of the last unit when it holds a tool call still waiting for its result."""
    units = tool_units(messages)
    if not units:
        return None
    tail = messages[units[-1].start:units[-1].end]
    called = {c.id for m in tail for c in m.tool_calls}
    answered = {m.tool_call_id for m in tail if m.role == "tool"}
    return units[-1].start if called - answered else None


@settings(max_examples=300, deadline=None)
@given(any_conversations(), st.integers(0, 3000), st.integers(0, 3000))
def test_a_bounded_cut_keeps_at_most_the_bound(messages: list[Message], keep: int,
                                               bound: int) -> None:
    loose = find_cut_point(messages, keep, COUNT)
    cut = find_cut_point(messages, keep, COUNT, max_kept_tokens=bound)
    assert is_safe_cut(messages, cut.index) and cut.head == loose.head
    open_start = _open_tail_start(messages)
    if open_start is not None and cut.kept_tokens > bound:
        # only an in-flight tool call (its results come next) may break the bound
        assert cut.index <= open_start
        assert cut.kept_tokens == _suffix(messages, cut.index)
        return
    assert cut.kept_tokens == _suffix(messages, cut.index) <= bound
    if loose.kept_tokens <= bound:
        assert cut == loose
        return
    # compacts more than the loose cut, but no more than it must: the first boundary that
    # fits, or the next turn's start where that boundary left a short prefix of its turn
    assert cut.index > loose.index
    skipped = [b for b in unit_boundaries(messages) if loose.index <= b < cut.index]
    starts = [cut.head, *turn_starts(messages), len(messages)]  # n ends the last turn
    fitting = [b for b in skipped if _suffix(messages, b) <= bound]
    if fitting:
        first = fitting[0]
        its_turn = max(s for s in starts if s <= first)
        assert first - its_turn < SPLIT_TURN_MIN_PREFIX and first not in starts
        assert cut.index == min(s for s in starts if s > first) < len(messages)
    assert cut.turn_start == max(s for s in starts if s <= cut.index)
    assert cut.split_turn == (cut.index not in starts)


@settings(max_examples=200, deadline=None)
@given(conversations(min_turns=1), st.integers(0, 3000))
def test_cut_point_of_a_valid_conversation_keeps_valid_halves(
    messages: list[Message], keep: int
) -> None:
    _halves_are_valid(messages, find_cut_point(messages, keep, COUNT).index)


# -- real data -------------------------------------------------------------------------

def test_cut_points_on_the_real_sessions(data_dir: Path) -> None:
    sessions = load_transcripts(data_dir)
    assert len(sessions) == 40
    for session_id, messages in sessions:
        for keep in (0, 2_000, 8_000, 20_000, 1_000_000):
            cut = find_cut_point(messages, keep)  # the project's default estimator
            assert is_safe_cut(messages, cut.index), session_id
            assert cut.kept_tokens >= min(keep, _default_suffix(messages, cut.head)), session_id
            if cut.split_turn:
                assert cut.index - cut.turn_start >= SPLIT_TURN_MIN_PREFIX
            kept = messages[:cut.head] + messages[cut.index:]
            assert not [p for p in validate_view(kept, "openai") if "tool" in p], session_id
            bounded = find_cut_point(messages, keep, max_kept_tokens=keep + 1_000)
            assert bounded.kept_tokens <= keep + 1_000, session_id
            assert is_safe_cut(messages, bounded.index), session_id


def _default_suffix(messages: list[Message], index: int) -> int:
    from shared.core.tokens import DEFAULT_COUNTER

    return sum(DEFAULT_COUNTER.message(m) for m in messages[index:])


TURN_FUNCTIONS = ("find_safe_boundary", "is_safe_boundary", "parse_turn_boundaries",
                  "find_nearest_user_message", "summarize_session_plan", "maybe_summarize_trigger")


def test_peer_cases_meet_our_invariants(data_dir: Path) -> None:
    """Peer inputs, our invariants (their expected values carry their bugs; not compared)."""
    cases = peer_cases(data_dir, *TURN_FUNCTIONS)
    assert cases, "no turn-boundary cases in peer_cases.json"
    for case in cases:
        raw = case["input"].get("messages", case["input"].get("history", []))
        messages = peer_messages(raw)
        n = len(messages)
        target = case["input"].get("target_index", case["input"].get("index", n // 2))
        if 0 <= target <= n:
            cut = safe_cut(messages, target)
            assert is_safe_cut(messages, cut), case["id"]
            _halves_are_valid(messages, cut)
        else:
            with pytest.raises(InvalidInput):
                safe_cut(messages, target)
        for keep in (0, 5, 50, 10_000):
            point = find_cut_point(messages, keep, COUNT)
            assert is_safe_cut(messages, point.index), case["id"]
            if not point.split_turn:
                assert point.index in [point.head, *turn_starts(messages), n], case["id"]


def test_a_trailing_tool_call_without_its_results_is_never_compacted() -> None:
    """The agent records the calls before running them: their results come next."""
    messages = [
        Message(role="user", content="read the config " * 50),
        Message(role="assistant", content="done " * 50),
        Message(role="user", content="now run the tests"),
        Message(role="assistant", content="", tool_calls=[
            ToolCall(id="c1", name="bash", arguments='{"cmd": "pytest"}'),
            ToolCall(id="c2", name="bash", arguments='{"cmd": "ruff"}')]),
        Message(role="tool", tool_call_id="c1", content="ok"),
    ]
    for keep, cap in ((0, None), (0, 0), (1, 0)):
        cut = find_cut_point(messages, keep, max_kept_tokens=cap)
        assert cut.index <= 3, (keep, cap, cut)
    answered = [*messages, Message(role="tool", tool_call_id="c2", content="clean")]
    assert find_cut_point(answered, 0).index == len(answered)
