"""Tool-pair repair and per-provider view validation."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings

from shared.core.errors import InvalidInput
from shared.core.messages import ImagePart, Message, TextPart, ToolCall
from shared.core.repair import (
    CONVERSATION_START_TEXT,
    EMPTY_USER_TEXT,
    MISSING_RESULT_TEXT,
    PROVIDERS,
    RepairReport,
    repair_tool_pairs,
    repair_tool_pairs_with_report,
    validate_view,
)
from tests.strategies import (
    any_conversations,
    conversations,
    damaged_conversations,
    load_transcripts,
    peer_cases,
    peer_messages,
)


def user(text: str = "question") -> Message:
    return Message(role="user", content=text)


def bot(text: str = "answer") -> Message:
    return Message(role="assistant", content=text)


def call(*ids: str) -> Message:
    return Message(role="assistant", tool_calls=[ToolCall(id=i, name="bash") for i in ids])


def result(call_id: str, text: str = "ok") -> Message:
    return Message(role="tool", tool_call_id=call_id, content=text)


def shape(messages: list[Message]) -> list[str]:
    """Compact picture: u, a, a(x,y) for calls, t(x) for results, s for system."""
    out = []
    for m in messages:
        if m.tool_calls:
            out.append("a(" + ",".join(tc.id for tc in m.tool_calls) + ")")
        elif m.role == "tool":
            out.append(f"t({m.tool_call_id})")
        else:
            out.append(m.role[0])
    return out


def assert_valid(messages: list[Message]) -> None:
    for provider in PROVIDERS:
        assert validate_view(messages, provider) == [], provider


# -- repair: unit tests ------------------------------------------------------------------

def test_a_valid_view_comes_back_unchanged_in_any_result_order() -> None:
    messages = [Message(role="system", content="s"), user(), call("a", "b"), result("b"),
                result("a"), bot()]
    out, report = repair_tool_pairs_with_report(messages)
    assert out == messages and all(x is y for x, y in zip(out, messages, strict=True))
    assert report == RepairReport() and not report.changed and report.describe() == "no change"


def test_missing_results_get_placeholders_after_the_results_that_exist() -> None:
    out, report = repair_tool_pairs_with_report([user(), call("a", "b", "c"), result("b"), bot()])
    assert shape(out) == ["u", "a(a,b,c)", "t(b)", "t(a)", "t(c)", "a"]
    assert out[3].text() == MISSING_RESULT_TEXT and out[3].name == "bash"
    assert out[3].metadata == {"repair": "missing_result"}
    assert report.missing_results == ("a", "c")
    assert report.describe() == "2 placeholder results"


def test_a_call_at_the_very_end_gets_its_placeholder() -> None:
    out = repair_tool_pairs([user(), call("a")])
    assert shape(out) == ["u", "a(a)", "t(a)"]


def test_orphan_results_are_dropped() -> None:
    out, report = repair_tool_pairs_with_report([user(), result("ghost"), bot(), result("x")])
    assert shape(out) == ["u", "a"] and report.orphan_results == ("ghost", "x")
    assert report.describe() == "2 orphan results dropped"


def test_a_result_before_its_call_is_an_orphan_and_the_call_gets_a_placeholder() -> None:
    out, report = repair_tool_pairs_with_report([user(), result("a", "early"), call("a")])
    assert shape(out) == ["u", "a(a)", "t(a)"] and out[2].text() == MISSING_RESULT_TEXT
    assert report.orphan_results == ("a",) and report.missing_results == ("a",)


def test_duplicate_results_keep_the_first() -> None:
    out, report = repair_tool_pairs_with_report(
        [user(), call("a"), result("a", "first"), result("a", "second"), bot()])
    assert shape(out) == ["u", "a(a)", "t(a)", "a"] and out[2].text() == "first"
    assert report.duplicate_results == ("a",)


def test_results_separated_from_their_call_move_back_next_to_it() -> None:
    messages = [user(), call("a", "b"), result("a"), bot("meanwhile"), user("more"), result("b")]
    out, report = repair_tool_pairs_with_report(messages)
    assert shape(out) == ["u", "a(a,b)", "t(a)", "t(b)", "a", "u"]
    assert report.moved_results == ("b",)


def test_reused_call_ids_are_renamed_and_results_follow() -> None:
    # the real tau-bench sessions reuse ids across turns; Anthropic rejects that
    messages = [user(), call("x"), result("x", "one"), bot(), user(), call("x"),
                result("x", "two"), bot()]
    out, report = repair_tool_pairs_with_report(messages)
    assert shape(out) == ["u", "a(x)", "t(x)", "a", "u", "a(x_r2)", "t(x_r2)", "a"]
    assert out[6].text() == "two" and report.renamed_calls == (("x", "x_r2"),)
    assert validate_view(messages, "anthropic") and not validate_view(messages, "openai")
    assert_valid(out)


def test_a_result_answers_the_latest_unanswered_call_with_its_id() -> None:
    messages = [user(), call("x"), bot(), user(), call("x"), result("x", "late"), bot()]
    out, report = repair_tool_pairs_with_report(messages)
    assert shape(out) == ["u", "a(x)", "t(x)", "a", "u", "a(x_r2)", "t(x_r2)", "a"]
    assert out[2].text() == MISSING_RESULT_TEXT and out[6].text() == "late"
    assert not report.moved_results


def test_a_duplicate_id_inside_one_message_is_renamed_results_in_order() -> None:
    out = repair_tool_pairs([user(), call("x", "x"), result("x", "one"), result("x", "two")])
    assert shape(out) == ["u", "a(x,x_r2)", "t(x)", "t(x_r2)"]
    assert [m.text() for m in out[2:]] == ["one", "two"]


def test_empty_assistant_messages_are_dropped_but_media_and_calls_are_not_empty() -> None:
    image = Message(role="user", content=[ImagePart(url="https://example.com/a.png")])
    messages = [user(), bot("  "), image, bot(""), call("a"), result("a", "")]
    out, report = repair_tool_pairs_with_report(messages)
    assert shape(out) == ["u", "u", "a(a)", "t(a)"] and out[1] is image
    assert report.empty_dropped == 2 and not report.empty_filled


def test_an_empty_user_message_is_kept_with_placeholder_text() -> None:
    """The user did take a turn: dropping it would leave the view ending with the
    assistant's last message (Anthropic would continue it as a prefill)."""
    messages = [user(), bot("What next?"), Message(role="user", content=[TextPart(text="")]),
                bot("Did you mean to send something?"), user(" \n ")]
    out, report = repair_tool_pairs_with_report(messages)
    assert shape(out) == ["u", "a", "u", "a", "u"]
    assert out[2].text() == out[4].text() == EMPTY_USER_TEXT
    assert report.empty_filled == 2 and "2 empty user messages given placeholder text" in (
        report.describe())
    assert repair_tool_pairs(out) == out
    for provider in PROVIDERS:
        assert validate_view(out, provider) == []


def test_a_leading_non_user_message_gets_a_placeholder_user_before_it() -> None:
    messages = [Message(role="system", content="s"), call("a"), result("a"), bot()]
    out, report = repair_tool_pairs_with_report(messages)
    assert shape(out) == ["s", "u", "a(a)", "t(a)", "a"]
    assert out[1].text() == CONVERSATION_START_TEXT and report.inserted_user


def test_a_system_message_between_call_and_results_stays_after_them() -> None:
    out = repair_tool_pairs([user(), call("a"), Message(role="system", content="n"), result("a")])
    assert shape(out) == ["u", "a(a)", "t(a)", "s"]


def test_repair_never_mutates_its_input() -> None:
    messages = [user(), call("a", "a"), result("a"), bot(""), result("z")]
    snapshot = [m.model_copy(deep=True) for m in messages]
    repair_tool_pairs(messages)
    assert messages == snapshot


# -- validate_view ------------------------------------------------------------------------

def test_validate_view_names_each_violation() -> None:
    assert validate_view([user(), call("a"), bot()], "openai") == [
        "messages[1].tool_calls[0]: call 'a' has no result before messages[2]"]
    assert validate_view([user(), result("a")], "gemini") == [
        "messages[1]: tool result 'a' does not directly follow the assistant message that "
        "called it"]
    problems = validate_view([user(), call("a"), result("b"), result("a"), result("a")], "openai")
    assert problems == ["messages[2]: tool result 'b' answers no call of messages[1]",
                        "messages[4]: second tool result for call 'a'"]
    assert validate_view([user(), call("a")], "openai")[0].endswith("before the end")


def test_first_user_and_empty_content_rules_apply_to_anthropic_and_gemini_only() -> None:
    messages = [Message(role="system", content="s"), bot("hi"), user(" ")]
    assert validate_view(messages, "openai") == []
    for provider in ("anthropic", "gemini"):
        assert validate_view(messages, provider) == [
            "messages[1]: the first non-system message must be a user message, not assistant",
            "messages[2]: empty user message"]


def test_unknown_provider_is_invalid_input() -> None:
    with pytest.raises(InvalidInput) as info:
        validate_view([], "cohere")
    assert info.value.field == "provider"


# -- properties -----------------------------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(conversations())
def test_valid_conversations_are_valid_everywhere_and_left_alone(messages: list[Message]) -> None:
    assert_valid(messages)
    out, report = repair_tool_pairs_with_report(messages)
    assert out == messages and not report.changed


@settings(max_examples=500, deadline=None)
@given(damaged_conversations())
def test_repair_output_is_valid_for_every_provider(messages: list[Message]) -> None:
    assert_valid(repair_tool_pairs(messages))


@settings(max_examples=300, deadline=None)
@given(any_conversations())
def test_repair_is_idempotent(messages: list[Message]) -> None:
    once = repair_tool_pairs(messages)
    twice, report = repair_tool_pairs_with_report(once)
    assert twice == once and not report.changed


@settings(max_examples=300, deadline=None)
@given(damaged_conversations())
def test_repair_keeps_every_user_and_non_empty_message_in_order(messages: list[Message]) -> None:
    def plain(ms: list[Message]) -> list[tuple[str, str]]:
        return [(m.role, m.text() if m.text().strip() or m.media_count() else EMPTY_USER_TEXT)
                for m in ms if m.role != "tool"
                and (m.tool_calls or m.text().strip() or m.role in ("system", "user"))
                and m.metadata.get("repair") is None]
    assert plain(repair_tool_pairs(messages)) == plain(messages)


# -- real data ---------------------------------------------------------------------------------

def test_real_sessions_repair_to_valid_views(data_dir: Path) -> None:
    for session_id, messages in load_transcripts(data_dir):
        out, report = repair_tool_pairs_with_report(messages)
        assert validate_view(messages, "openai") == [], session_id  # the sessions are well paired
        assert not report.missing_results and not report.orphan_results, session_id
        for provider in PROVIDERS:
            assert validate_view(out, provider) == [], (session_id, provider)


def test_peer_repair_cases_meet_our_invariants(data_dir: Path) -> None:
    """Neurolink's repair inputs (adjacency pairing, synthetic calls): ours must be valid,
    idempotent, and must leave the balanced case untouched."""
    cases = peer_cases(data_dir, "repair_tool_pairs")
    assert len(cases) == 8
    for case in cases:
        messages = peer_messages(case["input"]["messages"])
        out, report = repair_tool_pairs_with_report(messages)
        assert_valid(out)
        assert repair_tool_pairs(out) == out, case["id"]
        if case["id"].endswith("balanced_pair_untouched"):
            assert out == messages and not report.changed
        if "parallel_calls" in case["id"]:  # their bug: a spurious placeholder; none here
            assert not report.missing_results, case["id"]
