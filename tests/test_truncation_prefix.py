"""The dropped prefix of a truncation: what a watermark may skip, never more.

The guard moves the session's watermark past ``dropped_prefix`` messages when it records a
cut; one too many and a message the view still shows leaves every later view. Each input
message is tagged with its place, so that where the output's messages came from is known
whatever repair made of them; inputs repeat message objects (an agent that sends one
"continue" every turn), carry media (the cut replaces them) and need repair.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.core.messages import ImagePart, Message, TextPart
from shared.core.pairs import pairs_intact
from shared.core.repair import repair_tool_pairs
from shared.core.truncation import TruncationInput
from shared.core.turns import leading_system_count
from tests.strategies import CharCounter, any_conversations


class MediaCounter(CharCounter):
    """Media cost 400 tokens a part, so that the cut replaces them."""

    def message(self, message: Message) -> int:
        return super().message(message) + 400 * message.media_count()


COUNTERS = [CharCounter(), MediaCounter()]


def _tagged(messages: list[Message]) -> list[Message]:
    return [m.model_copy(update={"metadata": {**m.metadata, "place": i}})
            for i, m in enumerate(messages)]


def _untagged(m: Message) -> dict[str, Any]:
    data = m.model_dump()
    data["metadata"] = {k: v for k, v in data["metadata"].items() if k != "place"}
    return data


def _may_skip(tagged: list[Message], out: list[Message]) -> int:
    """Input messages after the leading system ones that no output message came from, up
    to the first that one did (made-up messages carry no place)."""
    start = leading_system_count(tagged)
    shown = [m.metadata["place"] for m in out if "place" in m.metadata]
    return min([p for p in shown if p >= start], default=len(tagged)) - start


@st.composite
def conversations(draw: st.DrawFn) -> list[Message]:
    messages = list(draw(any_conversations(max_words=80)))
    for i, m in enumerate(messages):
        if m.role != "system" and draw(st.integers(0, 5)) == 0:
            messages[i] = m.model_copy(update={"content": [
                TextPart(text=m.text() or "x"), ImagePart(url="https://e.x/a.png")]})
    if draw(st.booleans()):  # one user message object every turn
        again = Message(role="user", content=draw(st.sampled_from(["continue.", "go " * 30])))
        messages = [again if m.role == "user" else m for m in messages]
    for _ in range(draw(st.integers(0, 3)) if len(messages) > 1 else 0):
        i, j = (draw(st.integers(0, len(messages) - 1)) for _ in range(2))
        messages[j] = messages[i]  # the same object at another place
    return messages


def _check(source: TruncationInput, given: list[Message], budget: int, counter: CharCounter,
           fraction: float) -> None:
    tagged = _tagged(given)
    out = source.cut(budget, counter, drop_fraction=fraction)
    reference = TruncationInput.build(tagged, counter).cut(budget, counter,
                                                           drop_fraction=fraction)
    assert [_untagged(m) for m in out.messages] == [_untagged(m) for m in reference.messages]
    assert 0 <= out.dropped_prefix <= _may_skip(tagged, reference.messages)
    if source.repaired is source.messages:  # intact: exactly where the kept ones start
        assert out.dropped_prefix == _may_skip(tagged, reference.messages)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(conversations(), st.integers(0, 4000), st.sampled_from([0.5, 0.3, 1.0]),
       st.sampled_from(COUNTERS))
def test_a_fresh_cut_skips_only_what_it_dropped(messages: list[Message], budget: int,
                                                fraction: float, counter: CharCounter) -> None:
    _check(TruncationInput.build(messages, counter), messages, budget, counter, fraction)


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(conversations(), st.integers(0, 4000), st.sampled_from([0.5, 1.0]),
       st.sampled_from(COUNTERS), st.data())
def test_an_extended_or_dropped_cut_skips_only_what_it_dropped(
        messages: list[Message], budget: int, fraction: float, counter: CharCounter,
        data: st.DataObject) -> None:
    k = data.draw(st.integers(0, len(messages)))
    grown = TruncationInput.build(messages[:k], counter).extend(
        messages[k:], [counter.message(m) for m in messages[k:]])
    if grown is not None:
        _check(grown, messages, budget, counter, fraction)
    d = data.draw(st.integers(0, len(messages)))
    rest = TruncationInput.build(messages, counter).drop(d)
    if rest is not None:
        _check(rest, messages[d:], budget, counter, fraction)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(conversations(), st.integers(0, 4000), st.sampled_from([0.3, 0.5, 1.0]),
       st.sampled_from(COUNTERS))
def test_a_cut_of_an_input_that_needs_no_repair_keeps_its_pairs(
        messages: list[Message], budget: int, fraction: float, counter: CharCounter) -> None:
    """The guard does not scan such a cut's pairs again (every call of a turn it cuts)."""
    source = TruncationInput.build(repair_tool_pairs(messages), counter)
    if source.repaired is source.messages:
        assert pairs_intact(source.cut(budget, counter, drop_fraction=fraction).messages)
