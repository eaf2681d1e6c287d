"""A stored view that needs tool-pair repair, repaired once and extended as the log grows.

A log that once broke the pairing rules (a call interrupted before its
result, say) stays broken for the scan (:mod:`shared.core.pairs`) until a
summary moves past it, and every prepare used to repair the whole view
again (~150 ms at 10k messages). :class:`RepairedView` keeps the repair of
the stored view up to its last closed unit, with its wire forms, and
extends it by the messages stored since (:func:`shared.core.repair.repair_continued`);
a prepare repairs only that unit and the pending turn. Kept with the cached
view while its applied messages only grow; rebuilt when they change.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shared.core.chunks import Chunks
from shared.core.messages import Message
from shared.core.repair import call_ids, open_unit_start, repair_continued, repair_tool_pairs
from shared.core.tokens import TokenCounter
from shared.core.turns import leading_system_count
from shared.core.wireview import carry


@dataclass(frozen=True, slots=True)
class RepairedView:
    """``repair_tool_pairs(applied[:covers])``, its ids and its wire forms.

    ``taken`` is shared by the views that extend one another and only grows:
    an id of a message past this view's end can only turn a continuation down
    (then the whole is repaired), never let a wrong one through.
    """

    covers: int
    messages: Chunks[Message]
    taken: set[str]
    wire: dict[str, Any]
    opened: bool = False  # a summary opens the view (repair_tool_pairs's ``opened``)
    added: int = 0  # tokens the repair added (placeholder results), less those it removed

    @classmethod
    def of(cls, applied: Sequence[Message], opened: bool = False,
           counter: TokenCounter | None = None) -> RepairedView:
        k = open_unit_start(applied)
        body = list(applied[:k])
        fixed = repair_tool_pairs(body, opened=opened)
        return cls(k, Chunks.of(fixed), call_ids(body) | call_ids(fixed), {}, opened,
                   repair_added(body, fixed, counter))

    @property
    def begun(self) -> bool:
        """Whether it holds a non-system message (else what follows may not continue it)."""
        return leading_system_count(self.messages) < len(self.messages)

    def extended(self, applied: Sequence[Message],
                 counter: TokenCounter | None = None) -> RepairedView | None:
        """This view over more of ``applied`` (whose first ``covers`` messages it was made
        from), to its last closed unit; None when the new messages reach back into it."""
        k = open_unit_start(applied, self.covers)
        if k <= self.covers:
            return self
        more = list(applied[self.covers:k])
        if not self.begun:
            return None
        tail = repair_continued(more, self.taken)
        if tail is None:
            return None
        self.taken.update(call_ids(more))
        self.taken.update(call_ids(tail))
        wire = carry(self.wire, 0, {}, tail) if self.wire else {}
        return RepairedView(k, self.messages.extend(tail), self.taken, wire, self.opened,
                            self.added + repair_added(more, tail, counter))

    def continued(self, applied: Sequence[Message],
                  extra: Sequence[Message]) -> list[Message] | None:
        """The repair of what follows: the open unit ``applied[covers:]`` and ``extra``."""
        if not self.begun:
            return None
        return repair_continued([*applied[self.covers:], *extra], self.taken)


def repair_added(before: Sequence[Message], after: Sequence[Message],
                 counter: TokenCounter | None) -> int:
    """Tokens ``after`` (a repair of ``before``) holds that ``before`` did not: the
    placeholder results it made, less the messages it dropped (compared by object: a
    repair keeps the messages it does not change). The view sends them: the budget
    counts them (0 without a counter)."""
    if counter is None:
        return 0
    kept = {id(m) for m in before}
    out = {id(m) for m in after}
    return (sum(counter.message(m) for m in after if id(m) not in kept)
            - sum(counter.message(m) for m in before if id(m) not in out))


def repaired_view(known: RepairedView | None, applied: Sequence[Message],
                  opened: bool = False, counter: TokenCounter | None = None) -> RepairedView:
    """``known`` extended over ``applied``, or made afresh (no view yet, new messages
    that reach back into it, or a summary now opening the view or no longer)."""
    if known is not None and known.covers <= len(applied) and known.opened == opened:
        grown = known.extended(applied, counter)
        if grown is not None:
            return grown
    return RepairedView.of(applied, opened, counter)


__all__ = ["RepairedView", "repair_added", "repaired_view"]
