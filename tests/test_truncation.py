"""Emergency truncation: turns, units, clipping, the note, and its guarantees."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fakeredis
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.core.config import StoreConfig
from shared.core.errors import InvalidInput
from shared.core.messages import ImagePart, Message, TextPart, ToolCall
from shared.core.repair import PROVIDERS, repair_tool_pairs, validate_view
from shared.core.tokens import DEFAULT_COUNTER
from shared.core.truncation import CLIP_MARKER, emergency_truncate, files_in_calls
from shared.core.turns import leading_system_count, turn_starts
from shared.store.sessions import SessionStore
from tests.strategies import (
    CharCounter,
    any_conversations,
    load_transcripts,
    peer_cases,
    peer_messages,
)

COUNT = CharCounter()


def user(text: str = "question") -> Message:
    return Message(role="user", content=text)


def bot(text: str = "answer") -> Message:
    return Message(role="assistant", content=text)


def read(call_id: str, path: str) -> Message:
    return Message(role="assistant", tool_calls=[
        ToolCall(id=call_id, name="read_file", arguments={"path": path})])


def result(call_id: str, text: str = "ok") -> Message:
    return Message(role="tool", tool_call_id=call_id, content=text)


def turns(count: int) -> list[Message]:
    """``count`` turns of 20 tokens each (CharCounter: 1 + 9 characters per message)."""
    out: list[Message] = []
    for k in range(count):
        out += [user(f"u{k}".ljust(9, ".")), bot(f"a{k}".ljust(9, "."))]
    return out


def tokens(messages: list[Message]) -> int:
    return sum(COUNT.message(m) for m in messages)


def assert_valid(messages: list[Message]) -> None:
    for provider in PROVIDERS:
        assert validate_view(messages, provider) == [], provider


# -- dropping ------------------------------------------------------------------------------

def test_a_view_within_budget_is_returned_as_is() -> None:
    messages = turns(3)
    result_ = emergency_truncate(messages, 60, COUNT)
    assert result_.messages == messages and all(
        a is b for a, b in zip(result_.messages, messages, strict=True))
    assert (result_.dropped, result_.note, result_.changed) == (0, "", False)
    assert result_.within_budget and result_.tokens_before == result_.tokens_after == 60


def test_the_oldest_half_of_the_turns_goes_first() -> None:
    out = emergency_truncate(turns(8), 100, COUNT)
    assert out.messages == turns(8)[8:] and out.tokens_after == 80
    assert out.dropped == out.dropped_prefix == 8
    assert out.dropped_by_role == {"user": 4, "assistant": 4}
    assert out.note == "[context truncated: 8 earlier messages dropped (4 assistant, 4 user)]"


def test_halving_repeats_while_still_over_budget() -> None:
    out = emergency_truncate(turns(8), 30, COUNT)
    assert out.messages == turns(8)[14:] and out.dropped == 14


def test_drop_fraction_sets_the_step() -> None:
    out = emergency_truncate(turns(8), 100, COUNT, drop_fraction=0.25)
    assert len(out.messages) == 10  # 8 -> drop 2 -> 120 > 100 -> drop 1 -> 100


def test_one_message_object_in_every_turn_does_not_hide_the_dropped_prefix() -> None:
    """An agent that sends one message object each turn (a constant "continue"): the
    dropped prefix is where the kept messages start, not that object's first place (which
    said 0: the guard could not record the cut and truncated the whole view again on every
    call), built fresh or extended."""
    again = user("continue.")
    messages = [m for k in range(8) for m in (again, bot(f"a{k}".ljust(9, ".")))]
    out = emergency_truncate(messages, 100, COUNT)
    assert out.dropped == out.dropped_prefix == 8
    assert out.messages == messages[8:]
    from shared.core.truncation import TruncationInput
    extended = TruncationInput.build(messages[:4], COUNT).extend(
        messages[4:], [COUNT.message(m) for m in messages[4:]])
    assert extended is not None
    assert extended.cut(100, COUNT).dropped_prefix == 8


def test_leading_system_messages_are_never_dropped() -> None:
    messages = [Message(role="system", content="rules"), *turns(4)]
    out = emergency_truncate(messages, 50, COUNT)
    assert out.messages[0] is messages[0] and out.messages[1].role == "user"
    assert out.dropped_prefix == 4 and out.within_budget  # 6 + 40 tokens <= 50


def _one_long_turn() -> list[Message]:
    return [user("do it"), read("a", "src/a.py"), result("a", "r" * 50),
            read("b", "src/b.py"), result("b", "r" * 50), read("c", "src/c.py"),
            result("c", "r" * 50), bot("done")]


def test_a_single_turn_keeps_its_user_message_and_drops_the_oldest_units() -> None:
    messages = _one_long_turn()
    out = emergency_truncate(messages, 100, COUNT)
    assert out.messages == [messages[0], *messages[5:]]
    assert out.dropped == 4 and out.dropped_prefix == 0
    assert out.files_touched == ("src/a.py", "src/b.py")
    assert out.note == ("[context truncated: 4 earlier messages dropped (2 assistant, 2 tool); "
                        "files touched: src/a.py, src/b.py]")
    assert_valid(out.messages)


# -- clipping ------------------------------------------------------------------------------

def test_a_huge_tool_result_is_clipped_head_and_tail_with_a_marker() -> None:
    body = "HEAD" + "x" * 100_000 + "TAIL"
    messages = [user("read it"), read("a", "big.log"), result("a", body)]
    out = emergency_truncate(messages, 1_000, COUNT)
    clipped = out.messages[2]
    assert out.truncated == (2,) and out.dropped == 0 and out.within_budget
    assert clipped.text().startswith("HEAD") and clipped.text().endswith("TAIL")
    assert CLIP_MARKER.format(removed=out.chars_removed) in clipped.text()
    assert out.tokens_after == 1_000  # clipped exactly to what was left
    assert out.chars_removed == len(body) - (len(clipped.text()) - len(
        CLIP_MARKER.format(removed=out.chars_removed)) - 2)
    assert "1 message clipped" in out.note and messages[2].text() == body


def test_a_giant_user_message_alone_is_clipped() -> None:
    out = emergency_truncate([user("q" * 50_000)], 500, COUNT)
    assert out.truncated == (0,) and out.within_budget and out.messages[0].role == "user"


def test_only_text_parts_are_clipped_media_stay() -> None:
    image = ImagePart(url="https://example.com/a.png")
    messages = [Message(role="user", content=[TextPart(text="t" * 10_000), image])]
    out = emergency_truncate(messages, 300, COUNT)
    content = out.messages[0].content
    assert isinstance(content, list) and content[1] == image and out.within_budget


def test_the_newest_unit_goes_when_only_its_arguments_are_too_big() -> None:
    huge = Message(role="assistant", tool_calls=[
        ToolCall(id="w", name="write_file", arguments={"path": "a.py", "text": "z" * 5_000})])
    out = emergency_truncate([user("write"), huge, result("w")], 200, COUNT)
    assert [m.role for m in out.messages] == ["user"] and out.within_budget
    assert out.files_touched == ("a.py",)


def test_when_nothing_can_fit_the_result_says_so() -> None:
    messages = [Message(role="system", content="s" * 2_000), *turns(3)]
    out = emergency_truncate(messages, 100, COUNT)
    assert not out.within_budget and out.tokens_after > 100
    assert out.messages[0] is messages[0]
    # the note is read by the model: what was lost, never the cut's internal budget
    assert out.note.startswith("[context truncated: ") and "earlier message" in out.note
    assert "budget" not in out.note and str(out.tokens_after) not in out.note
    assert_valid(out.messages)


# -- repair, input handling ------------------------------------------------------------------

def test_damaged_input_is_repaired_and_reported() -> None:
    messages = [result("ghost"), user("hi"), read("a", "x.py"), bot("no result")]
    out = emergency_truncate(messages, 10_000, COUNT)
    assert out.repair.orphan_results == ("ghost",) and out.repair.missing_results == ("a",)
    assert out.dropped == 0 and out.dropped_prefix == 1 and out.changed
    assert_valid(out.messages)


def test_input_is_never_mutated() -> None:
    messages = [*_one_long_turn(), result("c", "y" * 5_000)]
    snapshot = [m.model_copy(deep=True) for m in messages]
    emergency_truncate(messages, 50, COUNT)
    assert messages == snapshot


@pytest.mark.parametrize(("arguments", "field"), [
    ({"budget_tokens": -1}, "budget_tokens"),
    ({"budget_tokens": 1.5}, "budget_tokens"),
    ({"budget_tokens": True}, "budget_tokens"),
    ({"budget_tokens": 10, "drop_fraction": 0.0}, "drop_fraction"),
    ({"budget_tokens": 10, "drop_fraction": 1.5}, "drop_fraction"),
])
def test_bad_arguments_raise_invalid_input(arguments: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInput) as info:
        emergency_truncate(turns(2), **arguments)
    assert info.value.field == field


def test_files_in_calls_reads_path_keys_and_shell_commands() -> None:
    def calls(*args: Any) -> list[Message]:
        return [Message(role="assistant", tool_calls=[ToolCall(id=f"c{k}", name="t", arguments=a)
                                                      for k, a in enumerate(args)])]
    found = files_in_calls(calls(
        {"file_path": "a/b.py"}, {"paths": ["c.md", 3, "d.txt"]}, {"filename": "e.json"},
        {"command": "cat src/x.py | grep -n foo && python -c 'import np.linalg'"},
        {"command": "cat <<'EOF' > new.py\nimport other.py\nEOF\npytest tests/test_new.py"},
        {"cmd": "curl https://example.com/a.py -o out.txt; sed -i 's/a/b/g' setup.cfg"},
        {"path": "a/b.py"},
    ))
    assert found == ["a/b.py", "c.md", "d.txt", "e.json", "src/x.py", "new.py",
                     "tests/test_new.py", "out.txt", "setup.cfg"]
    assert files_in_calls([Message(role="assistant", tool_calls=[
        ToolCall(id="x", name="t", arguments='{"n": [1, 2]}')])]) == []


# -- properties -------------------------------------------------------------------------------

def _floor(messages: list[Message]) -> int:
    """Smallest size truncation can reach: the system head plus the newest user message
    clipped to its marker (or left whole when that is smaller)."""
    repaired = repair_tool_pairs(messages)
    head = leading_system_count(repaired)
    floor = tokens(repaired[:head])
    starts = turn_starts(repaired)
    if starts:
        newest = repaired[starts[-1]]
        marker = f"\n{CLIP_MARKER.format(removed=len(newest.text()))}\n"
        floor += min(COUNT.message(newest), 1 + len(marker))
    return floor


@settings(max_examples=400, deadline=None)
@given(any_conversations(max_words=120), st.integers(0, 6_000), st.sampled_from([0.5, 0.3, 1.0]))
def test_truncation_invariants(messages: list[Message], budget: int, fraction: float) -> None:
    out = emergency_truncate(messages, budget, COUNT, drop_fraction=fraction)
    assert_valid(out.messages)
    assert repair_tool_pairs(out.messages) == out.messages
    assert out.tokens_after == tokens(out.messages)
    assert out.within_budget == (out.tokens_after <= budget)
    if budget >= _floor(messages):
        assert out.within_budget
    repaired = repair_tool_pairs(messages)
    assert out.dropped == len(repaired) - len(out.messages)
    assert sum(out.dropped_by_role.values()) == out.dropped
    head = leading_system_count(repaired)
    assert out.messages[:head] == repaired[:head]
    if len(out.messages) > head:
        assert out.messages[head].role == "user"
    unclipped = [m for k, m in enumerate(out.messages) if k not in out.truncated]
    position = iter(repaired)
    assert all(any(m == r for r in position) for m in unclipped)  # an ordered subsequence
    if tokens(repaired) <= budget:
        assert out.dropped == 0 and not out.truncated
    assert 0 <= out.dropped_prefix <= len(messages)
    assert bool(out.note) == bool(out.dropped or out.truncated)  # what was lost


# -- real and peer data -------------------------------------------------------------------------

def test_truncation_on_the_real_sessions(data_dir: Path) -> None:
    for session_id, messages in load_transcripts(data_dir):
        for budget in (2_000, 8_000, 30_000):
            out = emergency_truncate(messages, budget)  # the project's default estimator
            assert out.within_budget, (session_id, budget, out.note)
            assert sum(DEFAULT_COUNTER.message(m) for m in out.messages) <= budget
            for provider in PROVIDERS:
                assert validate_view(out.messages, provider) == [], (session_id, provider)
            assert out.messages[0] is messages[0]  # the system prompt stays
            if out.dropped:
                assert out.note.startswith("[context truncated: ")


PEER_FUNCTIONS = ("force_compression", "trim_history_to_fit_context_window",
                  "truncate_with_sliding_window")


def test_peer_truncation_cases_meet_our_invariants(data_dir: Path) -> None:
    """Peer inputs at their budgets (or half the history when they state none)."""
    cases = peer_cases(data_dir, *PEER_FUNCTIONS)
    assert len(cases) == 21
    for case in cases:
        raw = case["input"]
        messages = peer_messages(raw.get("messages") or raw.get("history") or [])
        messages += peer_messages(raw.get("protected_tail") or [])
        budget = tokens(messages) // 2
        if "context_window" in raw:
            budget = max(0, raw["context_window"] - raw.get("max_tokens", 0))
        if (raw.get("config") or {}).get("target_tokens"):
            budget = raw["config"]["target_tokens"]
        for fraction in (0.5, 1.0):
            out = emergency_truncate(messages, budget, COUNT, drop_fraction=fraction)
            assert_valid(out.messages)
            if budget >= _floor(messages):
                assert out.within_budget, case["id"]


# -- the guard's use of it: one ratio sizes the cut and re-estimates the result -------------
@pytest.mark.parametrize(("anchored", "calibration"), [(0.8, 1.3), (1.3, 1.0)])
def test_a_truncated_view_is_within_the_budget_it_was_cut_for(
        anchored: float, calibration: float, make_guard: Callable[..., Any]) -> None:
    """The provider's last report says this view costs ``anchored`` x the heuristic, the
    session's calibration says ``calibration`` x: whichever is larger sizes the cut, and
    the same ratio re-estimates it (the re-check used the calibration alone)."""
    store = SessionStore(fakeredis.FakeRedis(), StoreConfig())
    store.append("s", [m for k in range(40) for m in (
        user(f"step {k}: " + "why " * 120), bot(f"did {k}: " + "because " * 120))])
    wide = make_guard(store, overrides={"gpt-4o": 128_000})
    total = wide.prepare("s", "be brief", max_tokens=1000).report.estimated_prompt_tokens
    state = store.state("s")
    store.update_state("s", calibration_ratio=calibration, calibration_samples=5,
                       anchor_reported=int(total * anchored), anchor_estimated=total,
                       anchor_end=store.length("s"), anchor_version=state.version)
    guard = make_guard(store, overrides={"gpt-4o": 8000})
    view = guard.prepare("s", "be brief", max_tokens=1000)
    report = view.report
    assert report.truncated and report.budget.within_budget, report.budget
    sent = DEFAULT_COUNTER.messages(view.messages)
    assert report.estimated_prompt_tokens >= math.ceil(sent * max(anchored, calibration)) - 1
    assert report.estimated_prompt_tokens <= report.budget.input_budget


def test_a_guard_records_the_cut_of_a_view_whose_turns_share_a_message_object(
        make_guard: Callable[..., Any]) -> None:
    """The view is over the window and no summary comes (workers behind): the first call
    truncates and records the cut (the watermark moves), the next calls of the chain need
    no cut, though the agent sends the same user message object every turn (the guard's
    cached view holds the objects it was given)."""
    store = SessionStore(fakeredis.FakeRedis(), StoreConfig())
    again = user("Continue with the next step.")
    guard = make_guard(store, overrides={"wide": 128_000, "narrow": 8000})
    for k in range(80):  # each turn as an agent runs it: prepared, then recorded
        guard.prepare("s", "be brief", max_tokens=1000, model="wide", pending=[again])
        guard.record_turn("s", [again, bot(f"did {k}: " + "because " * 120)])
    views = [guard.prepare("s", "be brief", max_tokens=1000, model="narrow",
                           pending=[again, *chain])
             for chain in ([], [read("c1", "a.py")], [read("c1", "a.py"), result("c1")])]
    assert views[0].report.truncated and views[0].report.watermark > 0
    assert store.state("s").watermark == views[0].report.watermark
    assert not views[1].report.truncated and not views[2].report.truncated


def test_a_stored_system_message_the_cut_keeps_is_not_put_behind_the_watermark(
        make_guard: Callable[..., Any]) -> None:
    """The log after the watermark opens with a system message the agent recorded: the cut
    keeps it (never dropped) and drops what follows, which is no prefix of the log: the
    watermark stays (it moved to a position inside the dropped run: the system message left
    every later view and a dropped message came back)."""
    store = SessionStore(fakeredis.FakeRedis(), StoreConfig())
    guard = make_guard(store, overrides={"wide": 1_000_000, "narrow": 3000})
    rules = Message(role="system", content="STORED RULES: answer in French")
    guard.record_turn("s", [rules, user("u0"), bot("a0 " + "x " * 400)])
    for k in range(1, 12):
        guard.record_turn("s", [user(f"u{k}"), bot(f"a{k} " + "x " * 400)])
    view = guard.prepare("s", "be brief", max_tokens=500, model="narrow", pending=[user("next")])
    assert view.report.truncated and rules in list(view.messages)
    assert store.state("s").watermark == 0
    wide = guard.prepare("s", "be brief", max_tokens=500, model="wide", pending=[user("next")])
    assert list(wide.messages)[1:-1] == store.messages("s")


def test_a_cut_that_loses_nothing_has_no_note() -> None:
    """Nothing to drop or clip (system messages are kept whole): the result does not fit,
    and says so in its figures, but its note, meant for the model, is empty."""
    out = emergency_truncate([Message(role="system", content="s" * 2_000)], 100, COUNT)
    assert not out.within_budget and out.tokens_after > 100
    assert out.dropped == 0 and out.truncated == () and out.note == ""
