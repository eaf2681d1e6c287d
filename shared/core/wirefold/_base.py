"""What Anthropic's and Gemini's folds share: memos, the view's end kept across a turn's
prepares, and the head put around the finished forms (pure, no I/O)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.core.chunks import Chunks, concat
from shared.core.messages import Message

FOLDED = ("anthropic", "gemini")


def leading_system(head: Sequence[Message], first: Message | None) -> int | None:
    """How many of the head's messages lead as system; None when the view's leading
    system messages would reach past the head (into the history or pending)."""
    lead = next((i for i, m in enumerate(head) if m.role != "system"), len(head))
    if lead == len(head) and first is not None and first.role == "system":
        return None
    return lead


Memo = tuple[dict[str, Any], ...]
"""A dict per message of a group kept as messages: what its conversion made (the
format's ``fold_*`` fills it), so a group is converted once, not on every prepare."""


def blank_memo(n: int) -> Memo:
    return tuple({} for _ in range(n))


# -- the end of a view, kept across a turn's prepares -------------------------------------

ANTHROPIC_END = "anthropic:end"  # the key of an End in a pending message's memo
GEMINI_END = "gemini:end"


@dataclass(frozen=True, slots=True)
class End:
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


def known_end(memo: Memo, pending: Sequence[Message], base: tuple[Message, ...],
               key: str) -> End | None:
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


def keep_end(memo: Memo, pending: Sequence[Message], known: End | None, key: str,
              end: End) -> None:
    if pending:
        memo[len(pending) - 1][key] = end
    if known is not None and len(known.given) != len(pending):
        memo[len(known.given) - 1].pop(key, None)  # superseded


def head_system(head_memo: Memo | None, lead: int, key: str, make: Callable[[], Any]) -> Any:
    """The head's leading system messages converted, kept in the first one's memo (the
    head is made once per system prompt and summary: its calls share it)."""
    if head_memo is None or not lead:
        return make()
    found = head_memo[0].get(key)
    if found is None:
        found = head_memo[0][key] = (make(),)
    return found[0]


def around(left: list[dict[str, Any]], done: Chunks[dict[str, Any]],
            right: list[dict[str, Any]], shared: bool) -> Sequence[dict[str, Any]]:
    """The head's and pending turns around the finished ones: chunks sharing ``done``
    (``shared``), else one new list (a pointer copy)."""
    if shared:
        return concat(left, done, right)
    return list(itertools.chain(left, *done.chunks, right))


__all__ = ["ANTHROPIC_END", "FOLDED", "GEMINI_END", "End", "Memo", "around", "blank_memo",
           "head_system", "keep_end", "known_end", "leading_system"]
