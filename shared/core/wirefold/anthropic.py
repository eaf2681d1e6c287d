"""Anthropic's fold: a history as turns, its first and last groups kept as messages
(pure, no I/O; see :mod:`shared.core.wirefold`)."""

from __future__ import annotations

import bisect
import dataclasses
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.core.chunks import Chunks
from shared.core.errors import InvalidInput
from shared.core.messages import Message
from shared.core.wire._common import Loc
from shared.core.wire.anthropic import (
    BLANK,
    MEMO_KEY,
    Piece,
    System,
    Turn,
    add_turn,
    adjacent_ok,
    fold_turns,
    group_wire,
    piece_of_stored,
    piece_of_turn,
    system_out,
    turn_of,
    turn_of_piece,
)
from shared.core.wirefold._base import (
    ANTHROPIC_END,
    End,
    Memo,
    around,
    blank_memo,
    head_system,
    keep_end,
    known_end,
    leading_system,
)


def _groups(roles: Sequence[str | None]) -> list[tuple[int, int]]:
    """``[start, end)`` of each group: a run of messages whose turns share a role (blank
    messages, role None, stay with the group they are in, or the first one)."""
    bounds: list[tuple[int, int]] = []
    start, last = 0, None
    for i, role in enumerate(roles):
        if role is None:
            continue
        if last is not None and role != last:
            bounds.append((start, i))
            start = i
        last = role
    if roles:
        bounds.append((start, len(roles)))
    return bounds


def _roles(turns: Sequence[Turn | None]) -> list[str | None]:
    return [t.role if t is not None else None for t in turns]


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
        memo = memo if memo is not None else blank_memo(len(items))
        try:
            turns = _turns(items, memo)
        except InvalidInput:
            return cls(ok=False, size=len(items), opens_with=items[0] if items else None)
        return cls._made(turns, lambda a, b: memo[a:b], lambda a, b: items[a:b])

    @classmethod
    def of_stored(cls, raw: Sequence[Any], load: Callable[[int], Any],
                  decode: Callable[[tuple[Any, ...]], tuple[Message, ...]]) -> AnthropicFold:
        """:meth:`of` a history given as stored items (``raw``: stored JSON, or a message
        already decoded); ``load(i)``: item ``i``'s JSON as plain data (None for a
        message), asked once. Each message's turn is made from the data as plain parts
        (:data:`Piece`) and joined into its group's wire message as the groups close, in
        one pass; ``decode`` makes models of the few messages the fold keeps as messages
        (its first and last groups) and of those the data cannot say. A cold cache folds
        its whole view this way (a :class:`Turn` per message cost four times as much, and
        what every message left alive until the end made the collector walk it)."""
        size = len(raw)
        head: list[Piece] | None = None  # the first group's pieces, once it closed
        first: tuple[int, list[Piece]] | None = None  # the first finished group
        last: tuple[int, list[Piece]] | None = None  # the last one so far
        start, role, group = 0, None, []  # the open group
        wires: list[dict[str, Any]] = []
        spans: list[int] = []
        ok, answered = True, None  # answered: the calls of the last finished group
        try:
            for i in range(size):
                data = load(i)
                piece = piece_of_stored(data, i) if data is not None else None
                if piece is None:
                    piece = piece_of_turn(turn_of(decode((raw[i],))[0], Loc.item("messages", i)))
                if piece is not BLANK and role is not None and piece[0] != role:
                    if head is None:
                        head = group
                    else:  # a finished group: its wire message, its tool pairs
                        wires.append(group_wire(group))
                        spans.append(start)
                        if answered is not None and answered != {r for p in group for r in p[4]}:
                            ok = False
                        answered = {c for p in group for c in p[5]}
                        last = (start, group)
                        first = first or last
                    start, group = i, []
                if piece is not BLANK:
                    role = piece[0]
                group.append(piece)
        except InvalidInput:
            return cls(ok=False, size=size, opens_with=decode(tuple(raw[:1]))[0]
                       if raw else None)

        def turns(at: int, pieces: list[Piece]) -> list[Turn | None]:
            return [turn_of_piece(p, at + k) for k, p in enumerate(pieces)]

        def memo(at: int, pieces: list[Piece]) -> Memo:  # made for the kept groups alone
            return tuple({MEMO_KEY: (t,)} for t in turns(at, pieces))

        if head is None:  # one group (or none)
            front = tuple(decode(tuple(raw)))
            return cls(front=front, size=size, opens_with=front[0] if front else None,
                       front_memo=memo(0, group))
        opening = _joined(turns(*first))[0] if first is not None else None
        closing = (opening if last is first or last is None
                   else _joined(turns(*last))[0])
        if opening is not None and closing is not None:  # their wire messages: their turns'
            wires[0], wires[-1] = opening.wire(), closing.wire()
        front = tuple(decode(tuple(raw[:len(head)])))
        return cls(front, Chunks.of(wires), opening, closing, tuple(decode(tuple(raw[start:]))),
                   ok, size, front[0], memo(0, head), memo(start, group), Chunks.of(spans))

    @classmethod
    def _made(cls, turns: list[Turn | None], memo: Callable[[int, int], Memo],
              items: Callable[[int, int], Sequence[Message]]) -> AnthropicFold:
        """The fold of messages whose own turns are ``turns``; ``items(a, b)`` and
        ``memo(a, b)``: the messages ``[a, b)`` and their memos (only the first and last
        groups are asked for)."""
        size = len(turns)
        bounds = _groups(_roles(turns))
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
        fresh = memo if memo is not None and len(memo) == len(new) else blank_memo(len(new))
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
        bounds = _groups(_roles(turns))
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
                joined = _joined(_turns(history[end - n:nxt - n], blank_memo(nxt - end)))
            except InvalidInput:
                return None
            if len(joined) != 1:
                return None
            first, last = joined[0], self.last
        front = tuple(history[:end - n])
        return AnthropicFold(front, self.done.drop(g + 1), first, last, self.tail, True,
                             self.size - n, front[0] if front else None, blank_memo(len(front)),
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
                joined = _joined(_turns(history[start:end], blank_memo(end - start)))
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


def _anthropic_end(fold: AnthropicFold, pending: Sequence[Message], memo: Memo) -> End:
    """The turns of ``fold.tail + pending`` (raises InvalidInput as :func:`fold_turns`)."""
    known = known_end(memo, pending, fold.tail, ANTHROPIC_END)
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
    end = End(fold.tail, tuple(pending), tuple(turns), ok, tuple(wires))
    keep_end(memo, pending, known, ANTHROPIC_END, end)
    return end


def anthropic_view(head: Sequence[Message], fold: AnthropicFold, pending: Sequence[Message],
                   head_memo: Memo | None = None, pending_memo: Memo | None = None, *,
                   shared: bool = False) -> tuple[System, Sequence[dict[str, Any]]] | None:
    """``to_anthropic(head + history + pending)`` from the history's fold; None where only
    the whole conversion can say (it raises, or the fold cannot be used). The memos keep
    the head's and the pending messages' turns across prepares. ``shared``: the messages
    as chunks that share the fold's finished turns (no copy of the history), else a list."""
    first = fold.opens_with or (pending[0] if pending else None)
    lead = leading_system(head, first)
    if not fold.ok or lead is None:
        return None
    h_memo = head_memo[lead:] if head_memo is not None else blank_memo(len(head) - lead)
    p_memo = pending_memo if pending_memo is not None else blank_memo(len(pending))
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
    system = head_system(head_memo, lead, "anthropic:system", lambda: system_out(head[:lead]))
    return system, around([t.wire() for t in left], fold.done, wires, shared)


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


__all__ = ["AnthropicFold", "anthropic_view"]
