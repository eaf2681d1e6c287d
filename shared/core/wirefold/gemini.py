"""Gemini's fold: a history as contents, its last group kept as messages (pure, no I/O;
see :mod:`shared.core.wirefold`)."""

from __future__ import annotations

import bisect
import dataclasses
from collections import ChainMap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.core.chunks import Chunks
from shared.core.errors import InvalidInput
from shared.core.messages import Message
from shared.core.wire.gemini import MEMO_KEY as GEMINI_MEMO_KEY
from shared.core.wire.gemini import (
    Contents,
    fold_contents,
    join_all,
    joined,
    joins,
    kept_of_stored,
    system_instruction,
)
from shared.core.wirefold._base import (
    GEMINI_END,
    End,
    Memo,
    around,
    blank_memo,
    head_system,
    keep_end,
    known_end,
    leading_system,
)

NAME_LAYERS = 16  # Gemini's call-name layers kept before they are merged into one


def _last_group(roles: Sequence[str]) -> int:
    """Where the last group starts: the run of tool results at the end, or the last one."""
    start = len(roles) - 1
    if start >= 0 and roles[start] == "tool":
        while start > 0 and roles[start - 1] == "tool":
            start -= 1
    return max(start, 0)


def _stored_role(data: Any) -> str | None:
    """The role of a stored message from its JSON as plain data, when the rest of what a
    fold reads besides its content (name, ids) is as the store writes it; None: decode."""
    if type(data) is not dict:
        return None
    role, name, call_id = data.get("role"), data.get("name"), data.get("tool_call_id")
    if type(role) is not str or (name is not None and type(name) is not str) \
            or (call_id is not None and type(call_id) is not str):
        return None
    return role


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
    def of_stored(cls, raw: Sequence[Any], load: Callable[[int], Any],
                  decode: Callable[[tuple[Any, ...]], tuple[Message, ...]]) -> GeminiFold:
        """:meth:`of` a history given as stored items (as :meth:`AnthropicFold.of_stored`):
        each finished message's content is made from its JSON as plain data
        (:func:`kept_of_stored`) and joined as :func:`fold_contents` joins them, in one
        pass; the last group, and any message the data cannot say, is decoded (that one
        converted by :func:`fold_contents` itself)."""
        if not raw:
            return cls()

        def stored(i: int) -> tuple[str, Any, Message | None]:
            """(role, data, the message where the data cannot say)."""
            data = load(i)
            role = _stored_role(data) if data is not None else None
            if role is None:
                m = decode((raw[i],))[0]
                return m.role, data, m
            return role, data, None

        cut = len(raw) - 1  # where the last group starts (as _last_group finds it)
        if stored(cut)[0] == "tool":
            while cut > 0 and stored(cut - 1)[0] == "tool":
                cut -= 1
        opens = decode((raw[0],))[0]
        starts: list[int] = []
        contents = Contents(starts)
        names: dict[str, str] = {}  # as fold_contents names the results (from scratch)
        calls = 0
        for i in range(cut):
            role, data, m = stored(i)
            kept = None
            if m is None:
                name = (data.get("name") or names.get(data.get("tool_call_id") or "")
                        if role == "tool" else None)
                try:
                    kept = kept_of_stored(data, i, name)
                except InvalidInput:
                    kept = None  # the model's conversion raises it, in fold_contents
            if kept is None:  # converted from the model, as the fold of messages does
                m = m if m is not None else decode((raw[i],))[0]
                slot: dict[str, Any] = {}
                try:  # (names its calls in ``names`` as it goes)
                    fold_contents([m], i, names, (slot,))
                except InvalidInput:
                    return GeminiFold(ok=False, size=len(raw), opens_with=opens)
                kept = slot[GEMINI_MEMO_KEY]
                made = len(m.tool_calls)
            elif role != "tool":
                found = data.get("tool_calls", ())
                names.update((c["id"], c["name"]) for c in found)
                made = len(found)
            if role == "tool":
                contents.response(kept[1], i)  # type: ignore[arg-type]  # a result's part
                continue
            calls += made
            if kept[1] is not None:  # the API refuses a content without parts
                contents.add(kept[1], i)
        return GeminiFold(Chunks.of(contents.items), (names,) if names else (),
                          tuple(decode(tuple(raw[cut:]))), True, len(raw), opens,
                          blank_memo(len(raw) - cut), Chunks.of(starts), len(names) == calls)

    def extend(self, new: Sequence[Message], memo: Memo | None = None) -> GeminiFold:
        """The fold with ``new`` appended (as :meth:`AnthropicFold.extend`)."""
        if not new:
            return self
        size = self.size + len(new)
        opens = self.opens_with or new[0]
        if not self.ok:
            return GeminiFold(ok=False, size=size, opens_with=opens)
        fresh = memo if memo is not None and len(memo) == len(new) else blank_memo(len(new))
        items, memo = (*self.tail, *new), (*self.tail_memo, *fresh)
        cut = _last_group([m.role for m in items])
        layer: dict[str, str] = {}
        starts: list[int] = []
        try:  # (a first fold has no earlier names: a plain dict, not a ChainMap, is faster)
            made = fold_contents(items[:cut], 0, ChainMap(layer, *self.names) if self.names
                                 else layer, memo[:cut], starts)
        except InvalidInput:
            return GeminiFold(ok=False, size=size, opens_with=opens)
        known = ChainMap(*self.names)
        unique = self.unique and not (self.names and any(c in known for c in layer)) \
            and len(layer) == sum(len(m.tool_calls) for m in items[:cut])
        names = (layer, *self.names) if layer else self.names
        if len(names) > NAME_LAYERS:
            names = (dict(ChainMap(*names)),)
        done = self.done
        if done and made and joins(done[-1], made[0]):  # the last content grows: a new one
            done = done.replace({len(done) - 1: joined(done[-1], made[0])})
            made, starts = made[1:], starts[1:]
        base = self.size - len(self.tail)
        spans = (self.spans.extend([base + s for s in starts]) if self.spans is not None
                 else None)
        return GeminiFold(done.extend(made), names, items[cut:], True, size, opens,
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
        rest: dict[str, Any] | None = None  # what is left of it
        if g >= 0 and self.spans[g] < n:
            if history and history[0].role == "tool":  # inside a run of results: split
                return None
            end = self.spans[g + 1] if g + 1 < len(self.spans) else t
            try:  # the messages of a joined content left after the cut, joined again
                found = fold_contents(history[:end - n], 0, {}, None)
            except InvalidInput:
                return None
            if len(found) > 1:
                return None
            if found:
                rest = found[0]
            else:
                g += 1  # that content is gone whole
        keep = max(g, 0)
        names: dict[str, str] = {}
        calls = 0
        for m in history[:t - n]:
            if m.role == "tool" and not m.name and (m.tool_call_id or "") not in names:
                return None  # a kept result named from a call the cut took
            names.update((c.id, c.name) for c in m.tool_calls)
            calls += len(m.tool_calls)
        done, spans = self.done.drop(keep), [max(s - n, 0) for s in self.spans[keep:]]
        if rest is not None:
            done = done.replace({0: rest})
        return GeminiFold(done, (names,) if names else (), self.tail, True,
                          self.size - n, history[0] if history else None, self.tail_memo,
                          Chunks.of(spans), len(names) == calls)

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


def _gemini_end(fold: GeminiFold, pending: Sequence[Message],
                memo: Memo) -> list[dict[str, Any]]:
    """The contents of ``fold.tail + pending`` (raises InvalidInput as
    :func:`fold_contents`): the finished ones kept, the last group joined again."""
    known = known_end(memo, pending, fold.tail, GEMINI_END)
    if known is None:
        items, memos = (*fold.tail, *pending), (*fold.tail_memo, *memo)
        done: tuple[Any, ...] = ()
        names: dict[str, str] = {}
    else:
        k = len(known.given)
        items, memos = (*known.tail, *pending[k:]), (*known.tail_memo, *memo[k:])
        done, names = known.parts, dict(known.names)
    cut = _last_group([m.role for m in items])
    made = fold_contents(items[:cut], 0, ChainMap(names, *fold.names), memos[:cut])
    end = End(fold.tail, tuple(pending), tuple(join_all(done, made)), tail=items[cut:],
               tail_memo=memos[cut:], names=names)
    last = fold_contents(end.tail, 0, ChainMap({}, names, *fold.names), end.tail_memo)
    keep_end(memo, pending, known, GEMINI_END, end)
    return join_all(end.parts, last)


def gemini_view(head: Sequence[Message], fold: GeminiFold, pending: Sequence[Message],
                head_memo: Memo | None = None, pending_memo: Memo | None = None, *,
                shared: bool = False,
                ) -> tuple[dict[str, Any] | None, Sequence[dict[str, Any]]] | None:
    """``to_gemini(head + history + pending)`` from the history's fold; None where only
    the whole conversion can say. The memos keep the head's and the pending messages'
    contents across prepares (``shared``: as :func:`anthropic_view`)."""
    first = fold.opens_with or (pending[0] if pending else None)
    lead = leading_system(head, first)
    if (not fold.ok or lead is None or any(m.tool_calls for m in head)
            or (head and head[-1].role == "tool")):
        return None  # the head would name calls, or join the history's first results
    h_memo = head_memo[lead:] if head_memo is not None else blank_memo(len(head) - lead)
    p_memo = pending_memo if pending_memo is not None else blank_memo(len(pending))
    try:
        left = fold_contents(head[lead:], 0, {}, h_memo)
        right = (_gemini_end(fold, pending, pending_memo) if pending_memo is not None else
                 fold_contents((*fold.tail, *pending), 0, ChainMap({}, *fold.names),
                               (*fold.tail_memo, *p_memo)))
    except InvalidInput:
        return None
    system = head_system(head_memo, lead, "gemini:system", lambda: system_instruction(head[:lead]))
    return system, _joined_around(left, fold.done, right, shared)


def _joined_around(left: list[dict[str, Any]], done: Chunks[dict[str, Any]],
                   right: list[dict[str, Any]], shared: bool) -> Sequence[dict[str, Any]]:
    """:func:`around`, the contents joined where the head's, the finished and the end's
    meet (a summary leading as a user message, then the history's first user message; the
    end's first message of the finished last content's role): the finished contents that
    grow are new ones in a copy of their chunk, the fold's left as it is."""
    if not done:
        return around(join_all(left, right), done, [], shared)
    changes: dict[int, dict[str, Any]] = {}
    if left and joins(left[-1], done[0]):
        changes[0] = joined(left[-1], done[0])
        left = left[:-1]
    if right:
        at = len(done) - 1
        last = changes.get(at) or done[at]
        if joins(last, right[0]):
            changes[at] = joined(last, right[0])
            right = right[1:]
    return around(left, done.replace(changes) if changes else done, right, shared)


__all__ = ["NAME_LAYERS", "GeminiFold", "gemini_view"]
