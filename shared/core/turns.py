"""Turn boundaries, indivisible tool units and cut points.

Vocabulary (see docs/CONTRIBUTING.md):

* A **turn** starts at a user message: ``user -> assistant/tool ... -> final
  assistant``.
* A **unit** is the smallest run of messages a cut may never split: an
  assistant message with tool calls together with every result of those calls
  (parallel calls included, wherever the results sit), or any other single
  message. Tool messages that directly follow a unit are absorbed into it, so a
  kept range never starts with a tool result.
* A **cut index** ``c`` means ``[0, c)`` is compacted and ``[c, n)`` is kept.

The **head** is the run of leading system messages. It belongs to no turn and
is never compacted: every cut returned here is ``>= head``, the range to
compact is ``[head, c)`` (:attr:`CutPoint.compacted`), and callers keep
``[0, head)`` in front of whatever they send. ``c == head`` means "nothing to
compact". A system message later in the history is an ordinary message.

Everything here is pure: no I/O, inputs are never modified.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shared.core.errors import InvalidInput
from shared.core.messages import Message
from shared.core.tokens import DEFAULT_COUNTER, TokenCounter

SPLIT_TURN_MIN_PREFIX = 5
"""A cut may stay inside a turn when the turn's compacted prefix has this many messages."""


@dataclass(frozen=True, slots=True)
class Unit:
    """Messages ``[start, end)`` that must be kept or compacted together."""

    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class CutPoint:
    """Where to cut, and how.

    ``index``: messages ``[head, index)`` are compacted, ``[index, n)`` kept.
    ``turn_start``: start of the turn containing the cut (``== index`` unless
    the cut splits a turn; ``head`` when no user message precedes the cut).
    ``split_turn``: the cut lies inside a turn, at a unit boundary, because the
    turn's compacted prefix ``[turn_start, index)`` has at least
    :data:`SPLIT_TURN_MIN_PREFIX` messages, or because the kept part had to fit
    ``max_kept_tokens``; that prefix gets its own summary.
    ``kept_tokens``: tokens of ``[index, n)`` by the counter used (per message,
    without request overhead).
    """

    index: int
    turn_start: int
    split_turn: bool
    head: int
    kept_tokens: int

    @property
    def compacted(self) -> tuple[int, int]:
        """The range to compact, ``[head, index)``; empty when ``index == head``."""
        return (self.head, self.index)

    @property
    def prefix(self) -> tuple[int, int] | None:
        """The split turn's compacted prefix ``[turn_start, index)``, or None."""
        return (self.turn_start, self.index) if self.split_turn else None

    @property
    def whole_turns(self) -> tuple[int, int]:
        """Compacted range made of whole turns: ``[head, turn_start)`` for a split cut."""
        return (self.head, self.turn_start if self.split_turn else self.index)


def leading_system_count(messages: Sequence[Message]) -> int:
    """Length of the head: the run of system messages at the very start."""
    head = 0
    while head < len(messages) and messages[head].role == "system":
        head += 1
    return head


def _reach(messages: Sequence[Message]) -> list[int]:
    """For each index, the last index its unit must extend to (itself if nothing)."""
    reach = list(range(len(messages)))
    latest_call: dict[str, int] = {}
    for j, message in enumerate(messages):
        if message.role == "assistant":
            for call in message.tool_calls:
                latest_call[call.id] = j
        elif message.role == "tool" and message.tool_call_id in latest_call:
            i = latest_call[message.tool_call_id]
            reach[i] = max(reach[i], j)
    return reach


def tool_units(messages: Sequence[Message]) -> list[Unit]:
    """Partition ``[head, n)`` into indivisible units, oldest first.

    A result is tied to the nearest earlier call with its id, so a result that
    drifted away from its call stretches the unit over everything in between:
    cutting there would orphan one side. Results that precede every call with
    their id tie nothing (repair drops them).
    """
    n = len(messages)
    reach = _reach(messages)
    units: list[Unit] = []
    start = leading_system_count(messages)
    while start < n:
        end, k = start + 1, start
        while k < end:
            end = max(end, reach[k] + 1)
            k += 1
            if k == end:
                while end < n and messages[end].role == "tool":
                    end += 1
        units.append(Unit(start, end))
        start = end
    return units


def _boundaries(messages: Sequence[Message], units: list[Unit]) -> list[int]:
    return [leading_system_count(messages), *(u.start for u in units[1:]), len(messages)]


def _turn_starts(messages: Sequence[Message], units: list[Unit]) -> list[int]:
    return [u.start for u in units if messages[u.start].role == "user"]


def unit_boundaries(messages: Sequence[Message]) -> list[int]:
    """Every index a cut may use without splitting a unit: head, unit starts, n."""
    return _boundaries(messages, tool_units(messages))


def turn_starts(messages: Sequence[Message]) -> list[int]:
    """Indexes of user messages that start a turn (a user message inside a unit does not)."""
    return _turn_starts(messages, tool_units(messages))


def is_safe_cut(messages: Sequence[Message], index: int) -> bool:
    """True when cutting at ``index`` splits no unit and spares the head."""
    return index in set(unit_boundaries(messages))


def _check_index(messages: Sequence[Message], index: int, field: str) -> None:
    if isinstance(index, bool) or not isinstance(index, int):
        raise InvalidInput(f"expected an int, got {type(index).__name__}", field=field)
    if not 0 <= index <= len(messages):
        raise InvalidInput(f"{index} is outside [0, {len(messages)}]", field=field)


def safe_cut(messages: Sequence[Message], target: int) -> int:
    """Snap ``target`` to the nearest turn boundary.

    Candidates are the turn starts plus ``head`` (compact nothing) and ``n``
    (compact everything). When no user message starts a turn, the candidates
    are the unit boundaries instead, so a call is still never parted from its
    results. A target inside the head counts as ``head``. Ties go to the
    earlier index: it compacts less, and keeping too much is the cheaper error.

    Raises InvalidInput when ``target`` is not within ``[0, len(messages)]``.
    """
    _check_index(messages, target, "target")
    head = leading_system_count(messages)
    starts = turn_starts(messages)
    candidates = [head, *starts, len(messages)] if starts else unit_boundaries(messages)
    target = max(target, head)
    return min(candidates, key=lambda c: (abs(c - target), c))


def find_cut_point(
    messages: Sequence[Message],
    keep_recent_tokens: int,
    counter: TokenCounter | None = None,
    *,
    max_kept_tokens: int | None = None,
) -> CutPoint:
    """Cut so that at least ``keep_recent_tokens`` of the newest messages stay.

    Walks back from the newest message summing per-message tokens until the sum
    reaches ``keep_recent_tokens``, then snaps *back* (keeping more, never
    less) to the start of the turn containing that point. When the turn's
    compacted prefix would have :data:`SPLIT_TURN_MIN_PREFIX` or more messages,
    the cut instead stays in the turn at the nearest unit boundary at or before
    the point (``split_turn``), so one long agentic turn can still shrink.
    Messages before the first user message form a pseudo-turn starting at
    ``head``; the same rule applies to them.

    If the whole history holds fewer tokens than asked, nothing is compacted
    (``index == head``); ``keep_recent_tokens == 0`` compacts everything
    (``index == n``, the boundary after the last turn). Only system messages,
    or none: ``index == n == head``.

    ``max_kept_tokens`` bounds the kept part from above, and wins over
    ``keep_recent_tokens``: snapping back to a turn start, or one huge unit
    (a long tool output, a heredoc written in one reply), can keep far more
    than asked, and a compaction that keeps more than its budget leaves the
    session over its window. When the kept part would exceed the bound, the
    cut moves forward to the first unit boundary whose kept part fits, and on
    to the next turn's start where that would leave a prefix of fewer than
    :data:`SPLIT_TURN_MIN_PREFIX` messages of its turn to compact (but for the
    last turn, which is split rather than compacted whole); it compacts
    everything (``index == n``) when nothing smaller fits. A tool call and
    its results still stay on one side.
    """
    if isinstance(keep_recent_tokens, bool) or not isinstance(keep_recent_tokens, int):
        raise InvalidInput("expected an int", field="keep_recent_tokens")
    if keep_recent_tokens < 0:
        raise InvalidInput(f"must be >= 0, got {keep_recent_tokens}", field="keep_recent_tokens")
    if max_kept_tokens is not None and (
        isinstance(max_kept_tokens, bool) or not isinstance(max_kept_tokens, int)
        or max_kept_tokens < 0
    ):
        raise InvalidInput(f"expected an int >= 0, got {max_kept_tokens!r}",
                           field="max_kept_tokens")
    count = counter or DEFAULT_COUNTER
    n = len(messages)
    head = leading_system_count(messages)
    kept = 0
    point = n
    while point > head and kept < keep_recent_tokens:
        point -= 1
        kept += count.message(messages[point])
    if kept < keep_recent_tokens:
        point = head
    units = tool_units(messages)
    unit_cut = max(b for b in _boundaries(messages, units) if b <= point)
    starts = [s for s in [*_turn_starts(messages, units), n] if s <= point]
    turn_start = starts[-1] if starts else head
    if unit_cut == turn_start or unit_cut - turn_start < SPLIT_TURN_MIN_PREFIX:
        index, split = turn_start, False
    else:
        index, split = unit_cut, True
    kept_tokens = kept if index == point else sum(count.message(m) for m in messages[index:])
    if max_kept_tokens is None or kept_tokens <= max_kept_tokens:
        cut = CutPoint(index, turn_start, split, head, kept_tokens)
    else:
        cut = _cap_kept(messages, units, index, kept_tokens, max_kept_tokens, count)
    return _spare_open_unit(messages, units, cut, count)


def _spare_open_unit(messages: Sequence[Message], units: list[Unit], cut: CutPoint,
                     count: TokenCounter) -> CutPoint:
    """Never compact a trailing tool call whose results are still to come.

    An agent records the assistant's tool calls before it runs them; a cut past
    such a call would summarize it, and the results appended next would be
    orphans that repair drops (the agent then calls the tool again). The
    in-flight unit stays on the kept side, even over ``max_kept_tokens``.
    """
    if not units or cut.index <= units[-1].start:
        return cut
    last = units[-1]
    called = {c.id for m in messages[last.start:last.end] for c in m.tool_calls}
    answered = {m.tool_call_id for m in messages[last.start:last.end] if m.role == "tool"}
    if not called or called <= answered:
        return cut
    index = last.start
    starts = [s for s in _turn_starts(messages, units) if s <= index]
    turn_start = starts[-1] if starts else cut.head
    if index - turn_start < SPLIT_TURN_MIN_PREFIX:
        index = turn_start  # too short a prefix for a split-turn summary: keep the turn
    kept = sum(count.message(m) for m in messages[index:])
    return CutPoint(index, turn_start, index != turn_start, cut.head, kept)


def _cap_kept(messages: Sequence[Message], units: list[Unit], index: int, kept: int,
              limit: int, count: TokenCounter) -> CutPoint:
    """The first unit boundary after ``index`` whose kept part holds at most ``limit``
    tokens; or, where that leaves only a short prefix of its turn to compact (a user
    message alone, its answer kept: the model would see an answer to a question it is
    only told about), the next turn's start, unless that turn is the last."""
    n = len(messages)
    head = leading_system_count(messages)
    for unit in units:
        if unit.start < index:
            continue
        if kept <= limit:
            index = unit.start
            break
        kept -= sum(count.message(m) for m in messages[unit.start:unit.end])
    else:
        index, kept = n, 0
    starts = [*_turn_starts(messages, units), n]
    turn_start = max((s for s in starts if s <= index), default=head)
    if index != turn_start and index - turn_start < SPLIT_TURN_MIN_PREFIX:
        after = min(s for s in starts if s > index)
        if after < n:
            kept -= sum(count.message(m) for m in messages[index:after])
            index = turn_start = after
    return CutPoint(index, turn_start, index != turn_start, head, kept)


__all__ = [
    "SPLIT_TURN_MIN_PREFIX",
    "CutPoint",
    "Unit",
    "find_cut_point",
    "is_safe_cut",
    "leading_system_count",
    "safe_cut",
    "tool_units",
    "turn_starts",
    "unit_boundaries",
]
