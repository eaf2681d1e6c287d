"""The turn in progress, per session: what a tool chain's calls need not redo.

Between two recorded turns an agent calls ``prepare`` once per model call,
each time with the turn so far as ``pending``. Each message of it is
validated and counted once (compared with what the last call passed), keeps
its wire forms, the turn's tool-pair scan resumes where the last call left
it, and so does a truncation of the turn (:class:`shared.core.guard_state.TurnCut`):
a call costs what its new messages cost, not the whole turn.
"""

from __future__ import annotations

import copy
import operator
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from shared.core.errors import InvalidInput
from shared.core.guard_state import Counted, RenamedTurn, TurnCut
from shared.core.messages import Message, validate_messages
from shared.core.pairs import PairScan
from shared.core.tokens import TokenCounter
from shared.core.wireview import Slots

PENDING_KEEP = 1024  # sessions whose pending turn is remembered (validated, counted)

_SCALARS = (str, int, float, bool, type(None))


def _kept(item: Any) -> Any:
    """What a later call's item is compared with: a copy of a mapping, which the caller
    may change in place (a flat one of strings, as most messages are, copied cheaply)."""
    if not isinstance(item, Mapping):
        return item
    if all(type(value) in _SCALARS for value in item.values()):
        return dict(item)
    return copy.deepcopy(item)


class _Turn:
    """One session's turn so far, as parallel lists (each call extends them at C speed: a
    long chain's calls do not walk the whole turn in Python), scan and cut."""

    __slots__ = ("cut", "extra", "given", "renamed", "scan", "slots", "tokens")

    def __init__(self) -> None:
        self.given: list[Any] = []  # each message as given (a mapping: a copy of it)
        self.extra: list[Message] = []  # the messages :meth:`rows` last returned, validated
        self.tokens: list[int] = []  # their counts
        self.slots = Slots()  # their wire-form slots, index for index
        self.scan: tuple[PairScan, tuple[Message, ...], PairScan] | None = None
        self.cut: TurnCut | None = None
        self.renamed: RenamedTurn | None = None


class PendingTurns:
    """The pending turn of up to :data:`PENDING_KEEP` sessions (LRU); thread-safe."""

    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter
        self._lock = threading.Lock()
        self._turns: OrderedDict[str, _Turn] = OrderedDict()
        # per session, what its last truncation build counted (kept across turns)
        self._counted: OrderedDict[str, Counted] = OrderedDict()

    def _get(self, session_id: str) -> _Turn | None:
        with self._lock:
            return self._turns.get(session_id)

    def _turn(self, session_id: str) -> _Turn:
        """The session's turn record, made if absent (most recently used)."""
        with self._lock:
            turn = self._turns.get(session_id)
            if turn is None:
                turn = self._turns[session_id] = _Turn()
            self._turns.move_to_end(session_id)
            while len(self._turns) > PENDING_KEEP:
                self._turns.popitem(last=False)
            return turn

    def rows(self, session_id: str, raw: Sequence[Message | Mapping[str, Any]],
             ) -> tuple[list[Message], list[int]]:
        """The pending messages, validated and counted; a tool chain's prepares re-use
        what an earlier prepare of the same turn already did (compared by value), the
        messages' wire forms included (:meth:`wire`)."""
        if not isinstance(raw, (list, tuple)):
            items = validate_messages(raw, prefix="pending")
            return items, [self.counter.message(m) for m in items]
        if not raw:
            return [], []
        found = self._get(session_id)
        given: list[Any] = found.given if found is not None else []
        if len(given) <= len(raw) and all(map(operator.is_, given, raw)):
            reuse = len(given)  # the same objects (a chain's calls): checked at C speed
        else:
            reuse = 0
            for old, item in zip(given, raw, strict=False):
                if old is not item and old != item:
                    break
                reuse += 1
        try:
            fresh = validate_messages(raw[reuse:], prefix="pending") if reuse < len(raw) else []
        except InvalidInput:
            if not reuse:
                raise
            validate_messages(raw, prefix="pending")  # the error, named by its place in raw
            raise
        assert reuse == 0 or found is not None
        turn = self._turn(session_id)
        keep = found is not None and reuse == len(given)
        base = found if found is not None else turn

        def kept(part: list[Any]) -> list[Any]:
            return part if keep else part[:reuse]

        # new lists (an earlier view holds the last ones), made at C speed
        turn.given = kept(base.given) + [_kept(item) for item in raw[reuse:]]
        turn.extra = extra = kept(base.extra) + fresh
        turn.tokens = tokens = kept(base.tokens) + [self.counter.message(m) for m in fresh]
        turn.slots = (base.slots if isinstance(base.slots, Slots) else Slots(base.slots)
                      ).continued(reuse, len(fresh))
        return extra, list(tokens)

    def known_scan(self, session_id: str, scan: PairScan | None,
                   extra: list[Message]) -> tuple[PairScan, int] | None:
        """Where the pair scan of this pending turn can resume: the state an earlier call
        left after the same first messages, from the same stored view's scan."""
        turn = self._get(session_id)
        known = turn.scan if turn is not None else None
        if known is None or scan is None or known[0] is not scan:
            return None
        seen = known[1]
        if len(seen) > len(extra) or not all(map(operator.is_, seen, extra)):
            return None
        return known[2], len(seen)

    def known_renamed(self, session_id: str) -> RenamedTurn | None:
        """The turn as the last call renamed it (repeated call ids; checked by the core)."""
        turn = self._get(session_id)
        return turn.renamed if turn is not None else None

    def known_cut(self, session_id: str) -> TurnCut | None:
        """The truncation input the turn's last truncating call left (checked by the core)."""
        turn = self._get(session_id)
        return turn.cut if turn is not None else None

    def counted(self, session_id: str) -> Counted | None:
        """What the session's last truncation build counted: the next build re-uses it."""
        with self._lock:
            return self._counted.get(session_id)

    def scanned(self, session_id: str, extra: Sequence[Message], scan: PairScan | None,
                base: PairScan, cut: TurnCut | None = None,
                renamed: RenamedTurn | None = None) -> None:
        """Keep the pending turn's scan (``scan``, from ``base``), truncation input
        (``cut``, when this call truncated) and renaming (``renamed``: its call ids
        repeat) for the next call."""
        turn = (self._get(session_id) if (scan is None or not extra) and cut is None
                and renamed is None else self._turn(session_id))
        if turn is None:
            return
        turn.renamed = renamed
        turn.scan = None if scan is None or not extra else (base, tuple(extra), scan)
        if cut is not None:
            turn.cut = cut
            with self._lock:
                self._counted[session_id] = cut.counted
                self._counted.move_to_end(session_id)
                while len(self._counted) > PENDING_KEEP:
                    self._counted.popitem(last=False)

    def wire(self, session_id: str, extra: list[Message]) -> list[dict[str, Any]]:
        """The wire-form slots of the pending messages when ``extra`` is the turn
        :meth:`rows` last returned for the session (else none: converted afresh)."""
        turn = self._get(session_id)
        return turn.slots if turn is not None and turn.extra is extra else []

    def recorded(self, session_id: str, messages: Sequence[Any],
                 ) -> tuple[list[Message], dict[int, int], list[dict[str, Any]]]:
        """For the turn being recorded: its first messages as the pending turn validated
        them (the same given, compared as :meth:`rows` does), their token counts by
        message object and their wire-form slots, so that recording the turn does not
        validate, count or convert them again."""
        turn = self._get(session_id)
        if turn is None or not isinstance(messages, (list, tuple)):
            return [], {}, []
        known: list[Message] = []
        counts: dict[int, int] = {}
        slots: list[dict[str, Any]] = []
        for old, message, tokens, slot, item in zip(turn.given, turn.extra, turn.tokens,
                                                    turn.slots, messages, strict=False):
            if old is not item and old != item:
                break
            known.append(message)
            counts[id(message)] = tokens
            slots.append(slot)
        return known, counts, slots

    def forget(self, session_id: str) -> None:
        """The turn was recorded: the next call starts a new one."""
        with self._lock:
            self._turns.pop(session_id, None)


__all__ = ["PENDING_KEEP", "PendingTurns"]
