"""The per-job token counter: same counts as the counter it wraps, each message once."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.core.errors import InvalidInput
from shared.core.messages import Message, ToolCall
from shared.core.tokens import DEFAULT_COUNTER, HeuristicCounter
from workers.summarizer.counting import JobCounter, job_counter

_MESSAGES = st.builds(
    lambda role, text, call: Message(role=role, content=text, tool_calls=(
        [ToolCall(id="c1", name="bash", arguments={"command": text[:20]})]
        if call and role == "assistant" else [])),
    st.sampled_from(["user", "assistant", "system"]), st.text(max_size=300), st.booleans())


class Spy:
    """Counts how often each message is estimated."""

    def __init__(self) -> None:
        self.asked: list[Message] = []

    def text(self, text: str) -> int:
        return DEFAULT_COUNTER.text(text)

    def message(self, message: Message) -> int:
        self.asked.append(message)
        return DEFAULT_COUNTER.message(message)

    def messages(self, messages: Sequence[Message]) -> int:
        return DEFAULT_COUNTER.messages(messages)

    def tools(self, tools: Sequence[Mapping[str, Any]]) -> int:
        return DEFAULT_COUNTER.tools(tools)


@settings(max_examples=150, deadline=None)
@given(st.lists(_MESSAGES, max_size=12), st.floats(0.0, 0.5))
def test_counts_equal_the_wrapped_heuristic(messages: list[Message], margin: float) -> None:
    base = HeuristicCounter(safety_margin=margin)
    counter = job_counter(base)
    for _ in range(2):  # the second round comes from the memo
        assert counter.messages(messages) == base.messages(messages)
        assert [counter.message(m) for m in messages] == [base.message(m) for m in messages]
        assert counter.messages(messages[1:]) == base.messages(messages[1:])


def test_each_message_is_estimated_once() -> None:
    spy = Spy()
    counter = JobCounter(spy)
    messages = [Message(role="user", content=f"message {i}") for i in range(5)]
    for _ in range(3):
        for m in messages:
            counter.message(m)
    assert spy.asked == messages


def test_equal_but_distinct_messages_are_counted_apart() -> None:
    counter = job_counter(DEFAULT_COUNTER)
    a, b = Message(role="user", content="same"), Message(role="user", content="same")
    counter.seed([a], [999])
    assert counter.message(a) == 999
    assert counter.message(b) == DEFAULT_COUNTER.message(b)


def test_seeded_counts_are_used_and_checked() -> None:
    counter = job_counter(DEFAULT_COUNTER)
    messages = [Message(role="user", content="x"), Message(role="assistant", content="y")]
    counter.seed(messages, [10, 20])
    assert counter.messages(messages) == DEFAULT_COUNTER.messages([]) + 30
    with pytest.raises(InvalidInput, match="tokens"):
        counter.seed(messages, [1])


def test_other_counters_are_asked_for_whole_requests() -> None:
    spy = Spy()
    counter = job_counter(spy)
    messages = [Message(role="user", content="hello there")]
    assert counter.messages(messages) == DEFAULT_COUNTER.messages(messages)
    assert spy.asked == []  # its own messages(), not a sum of message()


def test_bad_input_is_named_by_the_wrapped_counter() -> None:
    counter = job_counter(DEFAULT_COUNTER)
    with pytest.raises(InvalidInput, match=r"messages\[1\]"):
        counter.messages([Message(role="user", content="a"), "b"])  # type: ignore[list-item]
    with pytest.raises(InvalidInput):
        counter.messages("not a list")  # type: ignore[arg-type]


def test_never_wraps_twice() -> None:
    inner = job_counter(DEFAULT_COUNTER)
    assert job_counter(inner).counter is DEFAULT_COUNTER
