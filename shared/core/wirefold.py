"""Anthropic and Gemini views maintained incrementally (pure, no I/O).

OpenAI's format is one wire message per message (:mod:`shared.core.wireview`).
Anthropic's joins neighbours of one role into one message (tool results into
the user message after the calls), Gemini's a run of tool results into one
content: a message's wire form can depend on the messages after it, but only
within its group, the run of messages that join. A history is kept as the
wire forms of its groups, finished, except the last group, whose messages
are kept instead and joined again with what follows (the next append, or a
prepare's pending messages); for Anthropic the first group too, which the
view's head (system prompt, a summary leading as a user message) may join.

Per prepare the work is the head, the first group and the pending messages a
turn's last call had not seen (the end of the view is kept in the newest pending
message's memo, :class:`_End`), plus a pointer copy of the finished forms; per
append, the last group and the new messages (their conversions from the turn's
memos); a summary drops the first groups (:meth:`AnthropicFold.drop`), a
cheap-stage placeholder joins its group again (``replace``); where neither can say,
the fold is made again (once) at the next request. What this cannot do exactly (a conversion
error, wrong tool pairs, leading system messages reaching into the history)
goes to the whole conversion, ``to_anthropic`` / ``to_gemini``, which gives
the same result or raises the same error; a property test holds the two equal.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
from collections import ChainMap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.core.chunks import Chunks, concat
from shared.core.errors import InvalidInput
from shared.core.messages import Message
from shared.core.wire._common import Loc
from shared.core.wire.anthropic import (
    MEMO_KEY,
    System,
    Turn,
    add_turn,
    adjacent_ok,
    fold_turns,
    system_out,
    turn_of,
    turn_of_stored,
)
from shared.core.wire.gemini import MEMO_KEY as GEMINI_MEMO_KEY
from shared.core.wire.gemini import fold_contents, kept_of_stored, system_instruction

FOLDED = ("anthropic", "gemini")
NAME_LAYERS = 16  # Gemini's call-name layers kept before they are merged into one


def _leading_system(head: Sequence[Message], first: Message | None) -> int | None:
    """How many of the head's messages lead as system; None when the view's leading
    system messages would reach past the head (into the history or pending)."""
    lead = next((i for i, m in enumerate(head) if m.role != "system"), len(head))
    if lead == len(head) and first is not None and first.role == "system":
        return None
    return lead


# -- Anthropic ----------------------------------------------------------------------------

def _groups(turns: Sequence[Turn | None]) -> list[tuple[int, int]]:
    """``[start, end)`` of each group: a run of messages whose turns share a role (blank
    messages, turn None, stay with the group they are in, or the first one)."""
    bounds: list[tuple[int, int]] = []
    start, role = 0, None
    for i, turn in enumerate(turns):
        if turn is None:
            continue
        if role is not None and turn.role != role:
            bounds.append((start, i))
            start = i
        role = turn.role
    if turns:
        bounds.append((start, len(turns)))
    return bounds


Memo = tuple[dict[str, Any], ...]
"""A dict per message of a group kept as messages: what its conversion made (the
format's ``fold_*`` fills it), so a group is converted once, not on every prepare."""


def _memo(n: int) -> Memo:
    return tuple({} for _ in range(n))


def _turns(items: Sequence[Message], memo: Memo) -> list[Turn | None]:
    """Each message's own turn, kept in ``memo`` (error paths count from the group: a
    conversion error makes the caller fall back to the whole conversion, which reports
    it)."""
    out: list[Turn | None] = []
    for i, m in enumerate(items):
        found = memo[i].get(MEMO_KEY)
        if found is None:
            found = memo[i][MEMO_KEY] = (turn_of(m, Loc.item("messages", i)),)
        out.append(found[0])
    return out


def _joined(turns: Sequence[Turn | None]) -> list[Turn]:
    out: list[Turn] = []
    for turn in turns:
        add_turn(out, turn)
    return out


@dataclass(frozen=True, slots=True)
class AnthropicFold:
    """A history as Anthropic turns: ``front`` and ``tail`` (first and last groups) as
    messages (with their memos), the groups between as finished wire messages
    (``done``), with their first and last turns kept for the tool-pair checks at their
    ends."""

    front: tuple[Message, ...] = ()
    done: Chunks[dict[str, Any]] = field(default_factory=Chunks)
    first: Turn | None = None
    last: Turn | None = None
    tail: tuple[Message, ...] = ()
    ok: bool = True  # no conversion error, tool pairs right inside ``done``
    size: int = 0
    opens_with: Message | None = None  # the history's first message
    front_memo: Memo = ()
    tail_memo: Memo = ()
    spans: Chunks[int] = field(default_factory=Chunks)  # where each ``done`` group starts

    @classmethod
    def of(cls, history: Sequence[Message], memo: Memo | None = None) -> AnthropicFold:
        items = tuple(history)
        memo = memo if memo is not None else _memo(len(items))
        try:
            turns = _turns(items, memo)
        except InvalidInput:
            return cls(ok=False, size=len(items), opens_with=items[0] if items else None)
        return cls._made(turns, lambda a, b: memo[a:b], lambda a, b: items[a:b])

    @classmethod
    def of_stored(cls, raw: Sequence[Any], loaded: Sequence[Any],
                  decode: Callable[[tuple[Any, ...]], tuple[Message, ...]]) -> AnthropicFold:
        """:meth:`of` a history given as stored items (``raw``: stored JSON, or a message
        already decoded) and ``loaded`` (the JSON as plain data, None for a message): the
        turns are made from the data; ``decode`` makes models of the few messages the fold
        keeps as messages (its first and last groups) and of those the data cannot say."""
        def turn(i: int) -> Turn | None:
            data = loaded[i]
            found = turn_of_stored(data, i) if data is not None else None
            if found is None:
                found = (turn_of(decode((raw[i],))[0], Loc.item("messages", i)),)
            return found[0]

        try:
            turns = [turn(i) for i in range(len(raw))]
        except InvalidInput:
            return cls(ok=False, size=len(raw), opens_with=decode(tuple(raw[:1]))[0]
                       if raw else None)

        def memo(a: int, b: int) -> Memo:  # made for the kept groups alone
            return tuple({MEMO_KEY: (t,)} for t in turns[a:b])

        return cls._made(turns, memo, lambda a, b: decode(tuple(raw[a:b])))

    @classmethod
    def _made(cls, turns: list[Turn | None], memo: Callable[[int, int], Memo],
              items: Callable[[int, int], Sequence[Message]]) -> AnthropicFold:
        """The fold of messages whose own turns are ``turns``; ``items(a, b)`` and
        ``memo(a, b)``: the messages ``[a, b)`` and their memos (only the first and last
        groups are asked for)."""
        size = len(turns)
        bounds = _groups(turns)
        if len(bounds) <= 1:
            front = tuple(items(0, size))
            return cls(front=front, size=size, opens_with=front[0] if front else None,
                       front_memo=memo(0, size))
        middle = [_joined(turns[a:b])[0] for a, b in bounds[1:-1]]
        f, t = bounds[0][1], bounds[-1][0]
        front = tuple(items(0, f))  # f >= 1: the first group holds the first message
        return cls(front, Chunks.of([m.wire() for m in middle]),
                   middle[0] if middle else None, middle[-1] if middle else None,
                   tuple(items(t, size)), _pairs_ok(middle), size, front[0], memo(0, f),
                   memo(t, size), Chunks.of([a for a, _ in bounds[1:-1]]))

    def extend(self, new: Sequence[Message], memo: Memo | None = None) -> AnthropicFold:
        """The fold of the history with ``new`` appended (the last group joined again);
        ``memo``: a dict per new message, what its conversion made (the turn's pending
        slots: a recorded turn is not converted again)."""
        fresh = memo if memo is not None and len(memo) == len(new) else _memo(len(new))
        if not new:
            return self
        if not self.ok:
            return AnthropicFold(ok=False, size=self.size + len(new), opens_with=self.opens_with)
        if not self.tail:  # one group so far: the first one may grow or split
            return AnthropicFold.of((*self.front, *new), (*self.front_memo, *fresh))
        items, memo = (*self.tail, *new), (*self.tail_memo, *fresh)
        try:
            turns = _turns(items, memo)
        except InvalidInput:
            return AnthropicFold(ok=False, size=self.size + len(new), opens_with=self.opens_with)
        bounds = _groups(turns)
        if len(bounds) == 1:
            return AnthropicFold(self.front, self.done, self.first, self.last, items, self.ok,
                                 self.size + len(new), self.opens_with, self.front_memo, memo,
                                 self.spans)
        made = [_joined(turns[a:b])[0] for a, b in bounds[:-1]]
        ok = self.ok and (self.last is None or adjacent_ok(self.last, made[0])) \
            and _pairs_ok(made)
        t = bounds[-1][0]
        base = self.size - len(self.tail)
        return AnthropicFold(self.front, self.done.extend([m.wire() for m in made]),
                             self.first or made[0], made[-1], items[t:], ok,
                             self.size + len(new), self.opens_with, self.front_memo, memo[t:],
                             self.spans.extend([base + a for a, _ in bounds[:-1]]))

    def drop(self, n: int, history: Sequence[Message]) -> AnthropicFold | None:
        """The fold without its first ``n`` messages (a summary moved the watermark);
        ``history``: what is left, the same messages. The group the cut falls in becomes
        the front; the finished groups after it are kept as they are. None where only a
        new fold can say."""
        if n <= 0:
            return self
        if not self.ok or len(history) != self.size - n:
            return None
        f, t = len(self.front), self.size - len(self.tail)
        if n < f:
            return dataclasses.replace(
                self, front=self.front[n:], front_memo=self.front_memo[n:], size=self.size - n,
                opens_with=history[0] if history else None,
                spans=Chunks.of([s - n for s in self.spans]))
        if n >= t or not self.spans:  # into the last group: little is left
            return AnthropicFold.of(history)
        g = bisect.bisect_right(self.spans, n) - 1  # the finished group the cut falls in
        end = self.spans[g + 1] if g + 1 < len(self.spans) else t
        first: Turn | None = None
        last: Turn | None = None
        if g + 1 < len(self.spans):
            nxt = self.spans[g + 2] if g + 2 < len(self.spans) else t
            try:
                joined = _joined(_turns(history[end - n:nxt - n], _memo(nxt - end)))
            except InvalidInput:
                return None
            if len(joined) != 1:
                return None
            first, last = joined[0], self.last
        front = tuple(history[:end - n])
        return AnthropicFold(front, self.done.drop(g + 1), first, last, self.tail, True,
                             self.size - n, front[0] if front else None, _memo(len(front)),
                             self.tail_memo, Chunks.of([s - n for s in self.spans[g + 1:]]))

    def replace(self, history: Sequence[Message],
                changes: Mapping[int, Message]) -> AnthropicFold | None:
        """The fold of ``history``: this fold's history with ``changes`` (index -> message
        of the same role and tool ids, a cheap-stage placeholder) made. Only the groups
        holding a change are joined again; None where only a new fold can say."""
        if not changes:
            return self
        if not self.ok or len(history) != self.size:
            return None
        f, t = len(self.front), self.size - len(self.tail)
        front, front_memo = list(self.front), list(self.front_memo)
        tail, tail_memo = list(self.tail), list(self.tail_memo)
        groups: set[int] = set()
        for i, m in changes.items():
            if not 0 <= i < self.size:  # a message past the fold: the caller's to append
                continue
            if i < f:
                front[i], front_memo[i] = m, {}
            elif i >= t:
                tail[i - t], tail_memo[i - t] = m, {}
            else:
                groups.add(bisect.bisect_right(self.spans, i) - 1)
        made: dict[int, Turn] = {}
        for g in groups:
            start = self.spans[g]
            end = self.spans[g + 1] if g + 1 < len(self.spans) else t
            try:
                joined = _joined(_turns(history[start:end], _memo(end - start)))
            except InvalidInput:
                return None
            if len(joined) != 1:
                return None
            made[g] = joined[0]
        last = len(self.spans) - 1
        return dataclasses.replace(
            self, front=tuple(front), front_memo=tuple(front_memo), tail=tuple(tail),
            tail_memo=tuple(tail_memo),
            done=self.done.replace({g: turn.wire() for g, turn in made.items()}),
            first=made.get(0, self.first), last=made.get(last, self.last),
            opens_with=history[0] if history else None)


def _pairs_ok(turns: Sequence[Turn]) -> bool:
    return all(adjacent_ok(a, b) for a, b in itertools.pairwise(turns))


# -- the end of a view, kept across a turn's prepares -------------------------------------

ANTHROPIC_END = "anthropic:end"  # the key of an _End in a pending message's memo
GEMINI_END = "gemini:end"


@dataclass(frozen=True, slots=True)
class _End:
    """The end of a view (the history's last group, then the pending messages up to one)
    as a call of the turn made it, kept in the memo of that last pending message: the
    turn's next call extends it by its new messages, not the turn so far again."""

    base: tuple[Message, ...]  # the fold's tail it starts with (by identity)
    given: tuple[Message, ...]  # the pending messages it covers
    parts: tuple[Any, ...]  # Anthropic: every turn; Gemini: the finished contents
    ok: int = 0  # Anthropic: how many first turns pair up (adjacent_ok) among themselves
    wires: tuple[dict[str, Any], ...] = ()  # Anthropic: the wire message of each turn
    tail: tuple[Message, ...] = ()  # Gemini: the last group, joined again with what follows
    tail_memo: Memo = ()
    names: Mapping[str, str] = field(default_factory=dict)  # Gemini: the turn's calls so far


def _known_end(memo: Memo, pending: Sequence[Message], base: tuple[Message, ...],
               key: str) -> _End | None:
    """The end an earlier call left for the same fold tail and the same first pending
    messages (found from the newest message back: a call adds a few)."""
    for k in range(len(pending), 0, -1):
        found = memo[k - 1].get(key)
        if found is None:
            continue
        # the same messages (a tuple compares by identity first, at C speed)
        if found.base is base and len(found.given) == k and found.given == tuple(pending[:k]):
            return found  # type: ignore[no-any-return]
        return None
    return None


def _keep_end(memo: Memo, pending: Sequence[Message], known: _End | None, key: str,
              end: _End) -> None:
    if pending:
        memo[len(pending) - 1][key] = end
    if known is not None and len(known.given) != len(pending):
        memo[len(known.given) - 1].pop(key, None)  # superseded


def _anthropic_end(fold: AnthropicFold, pending: Sequence[Message], memo: Memo) -> _End:
    """The turns of ``fold.tail + pending`` (raises InvalidInput as :func:`fold_turns`)."""
    known = _known_end(memo, pending, fold.tail, ANTHROPIC_END)
    if known is None:
        turns = fold_turns((*fold.tail, *pending), memo=(*fold.tail_memo, *memo))
        trusted = 0
        wires = [t.wire() for t in turns]
    else:
        k = len(known.given)
        turns = fold_turns(pending[k:], memo=memo[k:], into=list(known.parts))
        trusted = min(known.ok, len(known.parts) - 1)  # the last turn may have grown
        same = max(len(known.parts) - 1, 0)
        wires = [*known.wires[:same], *(t.wire() for t in turns[same:])]
    ok = max(trusted, 1 if turns else 0)
    while ok < len(turns) and adjacent_ok(turns[ok - 1], turns[ok]):
        ok += 1
    end = _End(fold.tail, tuple(pending), tuple(turns), ok, tuple(wires))
    _keep_end(memo, pending, known, ANTHROPIC_END, end)
    return end


def _gemini_end(fold: GeminiFold, pending: Sequence[Message],
                memo: Memo) -> list[dict[str, Any]]:
    """The contents of ``fold.tail + pending`` (raises InvalidInput as
    :func:`fold_contents`): the finished ones kept, the last group joined again."""
    known = _known_end(memo, pending, fold.tail, GEMINI_END)
    if known is None:
        items, memos = (*fold.tail, *pending), (*fold.tail_memo, *memo)
        done: tuple[Any, ...] = ()
        names: dict[str, str] = {}
    else:
        k = len(known.given)
        items, memos = (*known.tail, *pending[k:]), (*known.tail_memo, *memo[k:])
        done, names = known.parts, dict(known.names)
    cut = _last_group(items)
    made = fold_contents(items[:cut], 0, ChainMap(names, *fold.names), memos[:cut])
    end = _End(fold.tail, tuple(pending), (*done, *made), tail=items[cut:],
               tail_memo=memos[cut:], names=names)
    last = fold_contents(end.tail, 0, ChainMap({}, names, *fold.names), end.tail_memo)
    _keep_end(memo, pending, known, GEMINI_END, end)
    return [*end.parts, *last]


def anthropic_view(head: Sequence[Message], fold: AnthropicFold, pending: Sequence[Message],
                   head_memo: Memo | None = None, pending_memo: Memo | None = None, *,
                   shared: bool = False) -> tuple[System, Sequence[dict[str, Any]]] | None:
    """``to_anthropic(head + history + pending)`` from the history's fold; None where only
    the whole conversion can say (it raises, or the fold cannot be used). The memos keep
    the head's and the pending messages' turns across prepares. ``shared``: the messages
    as chunks that share the fold's finished turns (no copy of the history), else a list."""
    first = fold.opens_with or (pending[0] if pending else None)
    lead = _leading_system(head, first)
    if not fold.ok or lead is None:
        return None
    h_memo = head_memo[lead:] if head_memo is not None else _memo(len(head) - lead)
    p_memo = pending_memo if pending_memo is not None else _memo(len(pending))
    right_ok: bool | None = None
    right_wires: list[dict[str, Any]] | None = None
    try:
        if fold.tail:
            left = fold_turns((*head[lead:], *fold.front), memo=(*h_memo, *fold.front_memo))
            if pending_memo is not None:  # kept across the turn: its new messages alone
                end = _anthropic_end(fold, pending, pending_memo)
                right, right_ok = list(end.parts), end.ok >= len(end.parts)
                right_wires = list(end.wires)
            else:
                right = fold_turns((*fold.tail, *pending), memo=(*fold.tail_memo, *p_memo))
        else:  # the history is one group (or none): pending may join it
            left = fold_turns((*head[lead:], *fold.front, *pending),
                              memo=(*h_memo, *fold.front_memo, *p_memo))
            right = []
    except InvalidInput:
        return None
    if not _ends_ok(left, fold.first, fold.last, right, right_ok):
        return None
    wires = right_wires if right_wires is not None else [t.wire() for t in right]
    system = _system(head_memo, lead, "anthropic:system", lambda: system_out(head[:lead]))
    return system, _around([t.wire() for t in left], fold.done, wires, shared)


def _system(head_memo: Memo | None, lead: int, key: str, make: Callable[[], Any]) -> Any:
    """The head's leading system messages converted, kept in the first one's memo (the
    head is made once per system prompt and summary: its calls share it)."""
    if head_memo is None or not lead:
        return make()
    found = head_memo[0].get(key)
    if found is None:
        found = head_memo[0][key] = (make(),)
    return found[0]


def _around(left: list[dict[str, Any]], done: Chunks[dict[str, Any]],
            right: list[dict[str, Any]], shared: bool) -> Sequence[dict[str, Any]]:
    """The head's and pending turns around the finished ones: chunks sharing ``done``
    (``shared``), else one new list (a pointer copy)."""
    if shared:
        return concat(left, done, right)
    return list(itertools.chain(left, *done.chunks, right))


def _ends_ok(left: list[Turn], first: Turn | None, last: Turn | None,
             right: list[Turn], right_ok: bool | None = None) -> bool:
    """The tool pairs the whole conversion checks that the fold did not: inside the
    head+front and tail+pending turns (``right_ok``: those of ``right``, if known), and
    where they meet ``done`` (or each other); the view's first turn answers no call."""
    if not (_pairs_ok(right) if right_ok is None else right_ok):
        return False
    if first is None or last is None:
        ends = [*left, *right[:1]]
        return not (ends and ends[0].result_ids) and _pairs_ok(ends)
    opening = left[0] if left else first
    return (not opening.result_ids and _pairs_ok([*left, first])
            and _pairs_ok([last, *right[:1]]))


# -- Gemini -------------------------------------------------------------------------------

def _last_group(items: Sequence[Message | _StoredShape]) -> int:
    """Where the last group starts: the run of tool results at the end, or the last one."""
    start = len(items) - 1
    if start >= 0 and items[start].role == "tool":
        while start > 0 and items[start - 1].role == "tool":
            start -= 1
    return max(start, 0)


@dataclass(frozen=True, slots=True)
class _StoredCall:
    id: str
    name: str


@dataclass(frozen=True, slots=True)
class _StoredShape:
    """What :func:`fold_contents` and :class:`GeminiFold` read of a message besides its
    content (which its memo slot holds): a stored message's, from its JSON as plain data."""

    role: str
    name: str | None
    tool_call_id: str | None
    tool_calls: tuple[_StoredCall, ...]

    @classmethod
    def of(cls, data: Any) -> _StoredShape | None:
        if type(data) is not dict:
            return None
        role, name, call_id = data.get("role"), data.get("name"), data.get("tool_call_id")
        calls = data.get("tool_calls", [])
        if type(role) is not str or type(calls) is not list or not all(
                type(c) is dict and type(c.get("id")) is str and type(c.get("name")) is str
                for c in calls) or (name is not None and type(name) is not str) \
                or (call_id is not None and type(call_id) is not str):
            return None
        return cls(role, name, call_id, tuple(_StoredCall(c["id"], c["name"]) for c in calls))


@dataclass(frozen=True, slots=True)
class GeminiFold:
    """A history as Gemini contents: finished ones (``done``) and the last group as
    messages (``tail``, with its memo); ``names``: the function name of each call id in
    ``done``'s messages, newest layer first (a result names its call from them)."""

    done: Chunks[dict[str, Any]] = field(default_factory=Chunks)
    names: tuple[dict[str, str], ...] = ()
    tail: tuple[Message, ...] = ()
    ok: bool = True
    size: int = 0
    opens_with: Message | None = None
    tail_memo: Memo = ()
    spans: Chunks[int] | None = field(default_factory=Chunks)  # where each content starts
    unique: bool = True  # no call id named twice (a result names its call the same later)

    @classmethod
    def of(cls, history: Sequence[Message]) -> GeminiFold:
        items = tuple(history)
        return cls(opens_with=items[0] if items else None).extend(items)

    @classmethod
    def of_stored(cls, raw: Sequence[Any], loaded: Sequence[Any],
                  decode: Callable[[tuple[Any, ...]], tuple[Message, ...]]) -> GeminiFold:
        """:meth:`of` a history given as stored items (as :meth:`AnthropicFold.of_stored`):
        each finished message's content is made from its JSON as plain data and put in
        its memo slot, and :func:`fold_contents` is handed a stand-in holding what it
        reads besides (role, ids, names); the last group, and any message the data cannot
        say, is decoded."""
        if not raw:
            return cls()
        shapes = [_StoredShape.of(d) if d is not None else None for d in loaded]
        cut = _last_group([s if s is not None else decode((r,))[0]
                           for s, r in zip(shapes, raw, strict=True)])  # roles alone
        memo = _memo(len(raw))
        items: list[Any] = []
        names: dict[str, str] = {}  # as fold_contents names the results (from scratch)
        for i in range(cut):
            shape, kept = shapes[i], None
            if shape is not None:
                name = (shape.name or names.get(shape.tool_call_id or "")
                        if shape.role == "tool" else None)
                try:
                    kept = kept_of_stored(loaded[i], i, name)
                except InvalidInput:
                    kept = None  # the model's conversion raises it, where fold_contents does
            if shape is None or kept is None:
                m = decode((raw[i],))[0]
                items.append(m)
                calls = [(c.id, c.name) for c in m.tool_calls]
            else:
                memo[i][GEMINI_MEMO_KEY] = kept
                items.append(shape)
                calls = [(c.id, c.name) for c in shape.tool_calls]
            if items[-1].role != "tool":
                names.update(calls)
        items.extend(decode(tuple(raw[cut:])))
        first = items[0] if isinstance(items[0], Message) else decode((raw[0],))[0]
        # the stand-ins stay inside: the fold keeps finished contents and the last group
        return cls(opens_with=first).extend(items, memo)

    def extend(self, new: Sequence[Message], memo: Memo | None = None) -> GeminiFold:
        """The fold with ``new`` appended (as :meth:`AnthropicFold.extend`)."""
        if not new:
            return self
        size = self.size + len(new)
        opens = self.opens_with or new[0]
        if not self.ok:
            return GeminiFold(ok=False, size=size, opens_with=opens)
        fresh = memo if memo is not None and len(memo) == len(new) else _memo(len(new))
        items, memo = (*self.tail, *new), (*self.tail_memo, *fresh)
        cut = _last_group(items)
        layer: dict[str, str] = {}
        try:  # (a first fold has no earlier names: a plain dict, not a ChainMap, is faster)
            made = fold_contents(items[:cut], 0, ChainMap(layer, *self.names) if self.names
                                 else layer, memo[:cut])
        except InvalidInput:
            return GeminiFold(ok=False, size=size, opens_with=opens)
        known = ChainMap(*self.names)
        unique = self.unique and not (self.names and any(c in known for c in layer)) \
            and len(layer) == sum(len(m.tool_calls) for m in items[:cut])
        names = (layer, *self.names) if layer else self.names
        if len(names) > NAME_LAYERS:
            names = (dict(ChainMap(*names)),)
        starts = _content_starts(items[:cut], memo[:cut], self.size - len(self.tail))
        spans = (self.spans.extend(starts) if self.spans is not None
                 and len(starts) == len(made) else None)
        return GeminiFold(self.done.extend(made), names, items[cut:], True, size, opens,
                          memo[cut:], spans, unique)

    def drop(self, n: int, history: Sequence[Message]) -> GeminiFold | None:
        """As :meth:`AnthropicFold.drop`: the contents after the cut kept. The call names
        are made again from the finished messages that are left (a result must not find
        the name of a call gone with the cut); None where only a new fold can say."""
        if n <= 0:
            return self
        if not self.ok or self.spans is None or len(history) != self.size - n:
            return None
        t = self.size - len(self.tail)
        if n >= t or not self.spans:
            return GeminiFold.of(history)
        g = bisect.bisect_right(self.spans, n) - 1  # the content the cut falls in
        if g >= 0 and self.spans[g] < n:
            if history and history[0].role == "tool":  # inside a run of results: split
                return None
            g += 1  # that content is gone whole
        keep = max(g, 0)
        names: dict[str, str] = {}
        calls = 0
        for m in history[:t - n]:
            if m.role == "tool" and not m.name and (m.tool_call_id or "") not in names:
                return None  # a kept result named from a call the cut took
            names.update((c.id, c.name) for c in m.tool_calls)
            calls += len(m.tool_calls)
        return GeminiFold(self.done.drop(keep), (names,) if names else (), self.tail, True,
                          self.size - n, history[0] if history else None, self.tail_memo,
                          Chunks.of([s - n for s in self.spans[keep:]]), len(names) == calls)

    def replace(self, history: Sequence[Message],
                changes: Mapping[int, Message]) -> GeminiFold | None:
        """As :meth:`AnthropicFold.replace`: the contents holding a change made again."""
        if not changes:
            return self
        if not self.ok or not self.unique or self.spans is None \
                or len(history) != self.size:
            return None
        t = self.size - len(self.tail)
        tail, tail_memo = list(self.tail), list(self.tail_memo)
        contents: set[int] = set()
        for i, m in changes.items():
            if not 0 <= i < self.size:
                continue
            if i >= t:
                tail[i - t], tail_memo[i - t] = m, {}
            else:
                contents.add(bisect.bisect_right(self.spans, i) - 1)
        names = ChainMap({}, *self.names)
        made: dict[int, dict[str, Any]] = {}
        for g in contents:
            if g < 0:
                return None
            start = self.spans[g]
            end = self.spans[g + 1] if g + 1 < len(self.spans) else t
            try:
                found = fold_contents(history[start:end], start, names, None)
            except InvalidInput:
                return None
            if len(found) != 1:
                return None
            made[g] = found[0]
        return dataclasses.replace(self, done=self.done.replace(made), tail=tuple(tail),
                                   tail_memo=tuple(tail_memo),
                                   opens_with=history[0] if history else None)


def _content_starts(items: Sequence[Message], memo: Memo, base: int) -> list[int]:
    """Where each content :func:`fold_contents` made of ``items`` starts (``base`` +
    index): a run of tool results is one, a message without parts none (its memo says)."""
    starts: list[int] = []
    for i, m in enumerate(items):
        if m.role == "tool":
            if i == 0 or items[i - 1].role != "tool":
                starts.append(base + i)
        elif memo[i].get(GEMINI_MEMO_KEY, (None, None))[1] is not None:
            starts.append(base + i)
    return starts


def gemini_view(head: Sequence[Message], fold: GeminiFold, pending: Sequence[Message],
                head_memo: Memo | None = None, pending_memo: Memo | None = None, *,
                shared: bool = False,
                ) -> tuple[dict[str, Any] | None, Sequence[dict[str, Any]]] | None:
    """``to_gemini(head + history + pending)`` from the history's fold; None where only
    the whole conversion can say. The memos keep the head's and the pending messages'
    contents across prepares (``shared``: as :func:`anthropic_view`)."""
    first = fold.opens_with or (pending[0] if pending else None)
    lead = _leading_system(head, first)
    if (not fold.ok or lead is None or any(m.tool_calls for m in head)
            or (head and head[-1].role == "tool")):
        return None  # the head would name calls, or join the history's first results
    h_memo = head_memo[lead:] if head_memo is not None else _memo(len(head) - lead)
    p_memo = pending_memo if pending_memo is not None else _memo(len(pending))
    try:
        left = fold_contents(head[lead:], 0, {}, h_memo)
        right = (_gemini_end(fold, pending, pending_memo) if pending_memo is not None else
                 fold_contents((*fold.tail, *pending), 0, ChainMap({}, *fold.names),
                               (*fold.tail_memo, *p_memo)))
    except InvalidInput:
        return None
    system = _system(head_memo, lead, "gemini:system", lambda: system_instruction(head[:lead]))
    return system, _around(left, fold.done, right, shared)


# -- the cache's side -----------------------------------------------------------------------

Fold = AnthropicFold | GeminiFold


def fold_of(fmt: str, history: Sequence[Message]) -> Fold:
    return AnthropicFold.of(history) if fmt == "anthropic" else GeminiFold.of(history)


def fold_of_stored(fmt: str, raw: Sequence[Any], loaded: Sequence[Any],
                   decode: Callable[[tuple[Any, ...]], tuple[Message, ...]]) -> Fold:
    """:func:`fold_of` a history of stored items (stored JSON, or messages already
    decoded), made from ``loaded``, their JSON as plain data (None for a message)
    (:meth:`AnthropicFold.of_stored`, :meth:`GeminiFold.of_stored`)."""
    if fmt == "anthropic":
        return AnthropicFold.of_stored(raw, loaded, decode)
    return GeminiFold.of_stored(raw, loaded, decode)


__all__ = ["FOLDED", "AnthropicFold", "Fold", "GeminiFold", "Memo", "anthropic_view",
           "fold_of", "fold_of_stored", "gemini_view"]
