"""The pair scan of what a moved watermark leaves (:func:`shared.core.pairs.scan_rest`): the
same state as scanning the rest afresh, wherever it can tell; and the views built with it
(a truncation's view read back, a turn's next truncation) the same as before."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from shared.core.messages import Message, ToolCall
from shared.core.pairs import PAIRS_START, PairScan, scan_pairs, scan_rest
from shared.core.truncation import TruncationInput
from tests.strategies import any_conversations, conversations

STARTS = st.sampled_from([PAIRS_START, PairScan(begun=True)])


def _state(scan: PairScan) -> tuple[object, ...]:
    return (scan.ok, scan.begun, scan.position, scan.open_calls,
            dict(scan.ids.first) if scan.ids is not None else None)


@settings(max_examples=400, deadline=None)
@given(messages=any_conversations(), whole_start=STARTS, start=STARTS, data=st.data())
def test_the_rest_scans_as_afresh(messages: list[Message], whole_start: PairScan,
                                  start: PairScan, data: st.DataObject) -> None:
    drop = data.draw(st.integers(0, len(messages)))
    whole = scan_pairs(messages, whole_start)
    rest = messages[drop:]
    found = scan_rest(whole, rest, start)
    fresh = scan_pairs(rest, start)
    if found is not None:
        assert _state(found) == _state(fresh)
        # and it resumes as the fresh one does
        more = data.draw(conversations(max_turns=2))
        assert _state(scan_pairs(more, found)) == _state(scan_pairs(more, fresh))
    elif whole.ok and rest and rest[0].role != "tool" and (
            start.begun or next((m.role for m in rest if m.role != "system"), "user") == "user"):
        raise AssertionError("a rest it can tell was left to a scan")


@settings(max_examples=200, deadline=None)
@given(messages=conversations(min_turns=2), data=st.data())
def test_a_valid_history_cut_at_a_turn_is_told(messages: list[Message],
                                                data: st.DataObject) -> None:
    starts = [i for i, m in enumerate(messages) if m.role == "user" and i > 0]
    if not starts:
        return
    drop = data.draw(st.sampled_from(starts))
    found = scan_rest(scan_pairs(messages), messages[drop:])
    assert found is not None and found.intact


def test_a_rest_starting_at_a_result_is_scanned() -> None:
    call = ToolCall(id="c1", name="bash", arguments="{}")
    messages = [Message(role="user", content="go"),
                Message(role="assistant", content="", tool_calls=[call]),
                Message(role="tool", tool_call_id="c1", content="ok")]
    assert scan_rest(scan_pairs(messages), messages[2:]) is None
    assert not scan_pairs(messages[2:]).ok


def test_a_stale_id_log_entry_does_not_leak_into_the_rest() -> None:
    """The scan's id log is shared with the scans resumed from it (a pending turn's): the
    rest's log holds the rest's ids alone, as a fresh scan's does."""
    call = ToolCall(id="kept", name="bash", arguments="{}")
    old = ToolCall(id="gone", name="bash", arguments="{}")
    messages = [Message(role="user", content="a"),
                Message(role="assistant", content="", tool_calls=[old]),
                Message(role="tool", tool_call_id="gone", content="x"),
                Message(role="user", content="b"),
                Message(role="assistant", content="", tool_calls=[call]),
                Message(role="tool", tool_call_id="kept", content="y")]
    whole = scan_pairs(messages)
    scan_pairs([Message(role="user", content="c"), Message(
        role="assistant", content="", tool_calls=[ToolCall(id="branch", name="x",
                                                           arguments="{}")])], whole)
    found = scan_rest(whole, messages[3:])
    assert found is not None and found.ids is not None
    assert found.ids.first == {"kept": 2} == scan_pairs(messages[3:]).ids.first  # type: ignore[union-attr]


@settings(max_examples=150, deadline=None)
@given(messages=conversations(min_turns=3), data=st.data())
def test_a_dropped_truncation_input_is_the_one_built_afresh(messages: list[Message],
                                                             data: st.DataObject) -> None:
    built = TruncationInput.build(messages, _Count())
    if not built.unit_starts:
        return
    count = data.draw(st.sampled_from(built.unit_starts))
    dropped = built.drop(count)
    if dropped is None:
        return
    afresh = TruncationInput.build(messages[count:], _Count())
    assert _state(dropped.scan) == _state(afresh.scan)
    assert (dropped.sizes, dropped.cum, dropped.units, dropped.starts) == \
        (afresh.sizes, afresh.cum, afresh.units, afresh.starts)


class _Count:
    """Counts by length: a counter the test can follow."""

    def text(self, text: str) -> int:
        return len(text) // 4

    def message(self, message: Message) -> int:
        return 4 + len(message.text()) // 4 + 3 * len(message.tool_calls)

    def messages(self, messages: list[Message]) -> int:
        return 3 + sum(self.message(m) for m in messages)

    def tools(self, tools: list[dict[str, object]]) -> int:
        return 0
