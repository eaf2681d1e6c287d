"""Emergency truncation of a message whose cost is mostly hosted tool parts (the code
interpreter's output the adapters send back with it: its ``extra_tokens``): its text
clipped cannot fit, so its notes go and the figure with them (the adapters stop sending
the parts), and the truncation note says so."""

from __future__ import annotations

from shared.core.messages import Message
from shared.core.tokens import DEFAULT_COUNTER, EXTRA_TOKENS, extra_tokens
from shared.core.truncation import emergency_truncate
from shared.integrations.agents_items import items_to_messages, messages_to_items
from tests.test_hosted_cheap import hosted_turn


def test_a_hosted_result_too_big_to_clip_is_removed_with_its_figure() -> None:
    messages = items_to_messages(hosted_turn())  # [user, assistant with ~20k hosted tokens]
    assert extra_tokens(messages[1]) > 9_000
    result = emergency_truncate(messages, 500)
    assert result.within_budget
    assert [m.role for m in result.messages] == ["user", "assistant"], \
        "the answer stays: dropping its hosted parts fits it"
    kept = result.messages[1]
    assert kept.content == "Done: 3000 rows."
    assert EXTRA_TOKENS not in kept.metadata and kept.reasoning == "I will run code."
    assert result.truncated == (1,)
    assert "1 hosted tool part (provider-run calls and their results) removed" in result.note
    assert result.tokens_after == DEFAULT_COUNTER.messages(result.messages) \
        - DEFAULT_COUNTER.messages([])
    sent = [i.get("type", i.get("role")) for i in messages_to_items(result.messages)]
    assert "code_interpreter_call" not in sent and "message" in sent


def test_a_message_whose_text_clip_fits_keeps_its_hosted_parts() -> None:
    messages = items_to_messages(hosted_turn())
    small = messages[1].model_copy(update={
        "content": "word " * 6_000, "metadata": {**messages[1].metadata, EXTRA_TOKENS: 200}})
    # a budget that fits the message with its hosted parts and its text clipped
    note_tokens = DEFAULT_COUNTER.message(small.model_copy(update={"content": ""}))
    result = emergency_truncate([messages[0], small], note_tokens + 400)
    assert result.within_budget
    kept = result.messages[1]
    assert kept.reasoning == small.reasoning and kept.metadata[EXTRA_TOKENS] == 200
    assert "hosted" not in result.note and "characters removed" in result.note


def test_a_text_only_message_is_clipped_as_before() -> None:
    messages = [Message(role="user", content="go"),
                Message(role="assistant", content="x " * 10_000)]
    result = emergency_truncate(messages, 400)
    assert result.within_budget and "hosted" not in result.note
    assert "characters removed" in result.note
