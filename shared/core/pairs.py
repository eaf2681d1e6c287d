"""The tool-pair scan: whether a view needs repair, resumable over new messages (pure).

:func:`pairs_intact` lets the guard skip tool-pair repair of a view that
needs none (the common case: the log holds complete turns, and call ids are
unique since the store made them so at append, :mod:`shared.core.callids`);
:func:`scan_pairs` resumes the check over what was appended since.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shared.core.messages import Message
from shared.core.tokens import EXTRA_TOKENS, extra_tokens

Shape = tuple[str, str | None, tuple[str, ...], bool]
"""What the scan reads of a message: role, tool_call_id, its calls' ids, blank."""


UNCOUNTED_NOTES = ("[provider compaction (opaque)]", "[generated file: ")
"""Notes (pydantic-ai's) of parts an adapter sends back with no :data:`EXTRA_TOKENS`
figure: an encrypted compaction item, a generated file."""


def sends_hosted(message: Message) -> bool:
    """Whether an adapter sends provider-run parts with ``message`` (the Agents SDK its
    hosted items, pydantic-ai its native tool and compaction parts, LangChain its server
    tool blocks): its :data:`~shared.core.tokens.EXTRA_TOKENS` figure, which a stage that
    clears the parts' notes drops with them, or a note of a part sent without one. Such an
    assistant message is not blank though it has no text: repair keeps it."""
    if extra_tokens(message) > 0:
        return True
    reasoning = message.reasoning
    return bool(reasoning) and any(line.startswith(UNCOUNTED_NOTES)
                                   for line in (reasoning or "").split("\n"))


def _stored_sends_hosted(data: Mapping[str, Any]) -> bool:
    """:func:`sends_hosted` of a message's stored JSON, decoded as plain data."""
    metadata = data.get("metadata")
    value = metadata.get(EXTRA_TOKENS) if type(metadata) is dict else None
    if (type(value) is int or type(value) is float) and value > 0:  # not a bool, nor NaN
        return True
    reasoning = data.get("reasoning")
    return type(reasoning) is str and any(line.startswith(UNCOUNTED_NOTES)
                                          for line in reasoning.split("\n"))


def _blank(message: Message) -> bool:
    """A user/assistant message without tool calls, media, text or hosted parts (repair
    drops these)."""
    if message.tool_calls or message.role not in ("user", "assistant"):
        return False
    if isinstance(message.content, str):
        blank = not message.content.strip()
    else:
        blank = message.media_count() == 0 and not message.text().strip()
    return blank and not (message.role == "assistant" and sends_hosted(message))


def shape(message: Message) -> Shape:
    return (message.role, message.tool_call_id, tuple(c.id for c in message.tool_calls),
            _blank(message))


def stored_shape(data: Mapping[str, Any]) -> Shape:
    """:func:`shape` of a message from its stored JSON, decoded as plain data (no model)."""
    role = data["role"]
    calls = data.get("tool_calls") or ()
    blank = False
    if not calls and role in ("user", "assistant"):
        content = data.get("content")
        if content is None or isinstance(content, str):
            blank = not (content or "").strip()
        else:
            blank = (all(p.get("type") == "text" for p in content)
                     and not "\n".join(p["text"] for p in content).strip())
        blank = blank and not (role == "assistant" and _stored_sends_hosted(data))
    return role, data.get("tool_call_id"), tuple(c["id"] for c in calls), blank


class IdLog:
    """Tool-call ids seen by a scan, with the position of their first call.

    Append-only and shared by every scan state that continues one walk, so
    resuming costs what the new messages cost, not the history (a frozenset
    of every id would be copied each time). A state sees an id as taken when
    it was recorded at a position before the state's own; entries left by a
    branch that was abandoned (the scan of a pending turn) sit at positions
    at or after that turn's, so they never count as earlier calls.
    """

    __slots__ = ("first",)

    def __init__(self) -> None:
        self.first: dict[str, int] = {}

    def taken(self, call_id: str, position: int) -> bool:
        at = self.first.get(call_id)
        return at is not None and at < position

    def add(self, call_id: str, position: int) -> None:
        at = self.first.get(call_id)
        if at is None or at > position:
            self.first[call_id] = position

    def __len__(self) -> int:
        return len(self.first)


@dataclass(frozen=True, slots=True)
class PairScan:
    """Where the walk of :func:`scan_pairs` stands, so that it can resume later.

    ``begun``: a non-system message was seen (the leading system run is
    over); ``ids``: tool call ids of the walk (:class:`IdLog`); ``position``:
    messages walked; ``open_calls``: calls of the last assistant message
    still waiting for their result.
    """

    ok: bool = True
    begun: bool = False
    ids: IdLog | None = None
    position: int = 0
    open_calls: frozenset[str] = frozenset()

    @property
    def intact(self) -> bool:
        return self.ok and not self.open_calls

    def taken(self, call_id: str) -> bool:
        """Whether a call before this state's position already used ``call_id``."""
        return self.ids is not None and self.ids.taken(call_id, self.position)


PAIRS_START = PairScan()


def scan_pairs(messages: Sequence[Message], state: PairScan = PAIRS_START) -> PairScan:
    """Continue the check of :func:`pairs_intact` over ``messages`` from ``state``.

    ``scan_pairs(a + b) == scan_pairs(b, scan_pairs(a))``: a view that only
    grew at its end is checked from where the last check stopped, in time
    proportional to ``b``.
    """
    return scan_shapes(map(shape, messages), state)


def scan_shapes(shapes: Iterable[Shape], state: PairScan = PAIRS_START) -> PairScan:
    """:func:`scan_pairs` over the messages' :data:`Shape` (:func:`shape`, :func:`stored_shape`)."""
    if not state.ok:
        return state
    begun = state.begun
    ids = state.ids if state.ids is not None else IdLog()
    position = state.position
    open_calls = set(state.open_calls)
    for role, tool_call_id, call_ids, blank in shapes:
        position += 1
        if not begun:
            if role == "system":
                continue
            if role != "user":
                return PairScan(ok=False)
            begun = True
        if role == "tool":
            call_id = tool_call_id or ""
            if call_id not in open_calls:
                return PairScan(ok=False)
            open_calls.discard(call_id)
            continue
        if open_calls or blank:
            return PairScan(ok=False)
        for call in call_ids:
            if ids.taken(call, position) or call in open_calls:
                return PairScan(ok=False)
            ids.add(call, position)
            open_calls.add(call)
    return PairScan(True, begun, ids, position, frozenset(open_calls))


def scan_rest(whole: PairScan, rest: Sequence[Message],
              start: PairScan = PAIRS_START) -> PairScan | None:
    """``scan_pairs(rest, start)`` where ``whole`` (ok) is the scan of a list that ends
    with ``rest`` (a prefix dropped: a watermark moved), without reading the rest's shapes
    again: its call ids alone; None when that cannot be told so (then scan it).

    Where ``whole`` is ok, every result follows its call's message directly, so a rest
    that does not start at a result starts with no call open; its messages pass the checks
    they passed in ``whole`` (its ids are a part of those, unique), its end leaves the
    calls open that ``whole``'s did; a start not ``begun`` asks one thing more, that its
    first message after any system ones is a user message."""
    if not whole.ok or not rest or rest[0].role == "tool" or start.ids is not None \
            or start.open_calls or not start.ok:
        return None
    begun = start.begun
    first: dict[str, int] = {}
    position = start.position
    for message in rest:
        position += 1
        if not begun:
            if message.role == "system":
                continue
            if message.role != "user":
                return None
            begun = True
        if message.role != "tool":  # as the scan reads them: a result's calls are not
            for call in message.tool_calls:
                first.setdefault(call.id, position)
    ids = IdLog()
    ids.first = first
    return PairScan(True, begun, ids, position, whole.open_calls)


def pairs_intact(messages: Sequence[Message]) -> bool:
    """True when :func:`shared.core.repair.repair_tool_pairs` would return ``messages`` unchanged.

    A linear check of what repair guarantees: after the leading system
    messages, the first message is a user message; every assistant message
    with tool calls is followed directly by exactly one result per call;
    call ids are unique in the list; no result stands elsewhere; no user or
    assistant message is blank. False means "repair it", not "it is broken":
    the guard then runs the full repair.
    """
    return scan_pairs(messages).intact


__all__ = ["PAIRS_START", "UNCOUNTED_NOTES", "IdLog", "PairScan", "Shape", "pairs_intact",
           "scan_pairs", "scan_rest", "scan_shapes", "sends_hosted", "shape", "stored_shape"]
