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
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from shared.core.boundedlru import BoundedLRU
from shared.core.errors import InvalidInput
from shared.core.guard_state import Counted, TurnCut
from shared.core.messages import Message, validate_messages
from shared.core.pairs import PairScan
from shared.core.quiet import Again
from shared.core.renamed import RenamedTurn
from shared.core.tokens import TokenCounter
from shared.core.wireview import Slots

_SCALARS = (str, int, float, bool, type(None))


def _kept(item: Any) -> Any:
    """What a later call's item is compared with: a copy of a mapping, which the caller
    may change in place (a flat one of strings, as most messages are, copied cheaply)."""
    if not isinstance(item, Mapping):
        return item
    if all(type(value) in _SCALARS for value in item.values()):
        return dict(item)
    return copy.deepcopy(item)


def _plain_ascii(m: Message) -> bool:
    """Whether ``m``'s JSON cannot fail: text and ids all ASCII (no lone surrogate), no
    metadata (no nesting to exhaust the stack), no content parts."""
    if not (type(m.content) is str and m.content.isascii() and not m.metadata
            and (m.reasoning is None or m.reasoning.isascii())
            and (m.name is None or m.name.isascii())
            and (m.tool_call_id is None or m.tool_call_id.isascii())):
        return False
    for c in m.tool_calls:  # noqa: SIM110 (a loop: no generator for a call or none)
        if not (c.id.isascii() and c.name.isascii() and c.arguments.isascii()):
            return False
    return True


def encoded(items: list[Message], offset: int) -> list[bytes | None]:
    """The stored JSON of ``items`` (pending messages from ``pending[offset]`` on), each
    refused, named, when it cannot be written as JSON (a lone surrogate, absurd nesting),
    as the store refuses it: else the view holding it is what fails, in the provider's SDK
    or the HTTP server's answer, and the turn's record is refused later. Kept with the
    turn: recording it does not encode those messages again. None for a message whose
    JSON cannot fail (:func:`_plain_ascii`, most tool output): not made until recorded."""
    out: list[bytes | None] = []
    for i, message in enumerate(items):
        if _plain_ascii(message):
            out.append(None)
            continue
        try:
            out.append(message.to_json_bytes())
        except (ValueError, RecursionError) as exc:
            raise InvalidInput(f"cannot be sent as JSON: {str(exc)[:200]}",
                               field=f"pending[{offset + i}]", index=offset + i) from None
    return out


class _Turn:
    """One session's turn so far, as parallel lists (each call extends them at C speed: a
    long chain's calls do not walk the whole turn in Python), scan and cut. The lists are
    set once, before the record is kept: a call makes a new record, never changes them."""

    __slots__ = ("again", "cut", "extra", "given", "raw", "renamed", "scan", "slots", "tokens")

    def __init__(self) -> None:
        self.given: list[Any] = []  # each message as given (a mapping: a copy of it)
        self.extra: list[Message] = []  # the messages :meth:`rows` last returned, validated
        self.tokens: list[int] = []  # their counts
        self.raw: list[bytes | None] = []  # their stored JSON, where made
        self.slots = Slots()  # their wire-form slots, index for index
        self.scan: tuple[PairScan, tuple[Message, ...], PairScan] | None = None
        self.cut: TurnCut | None = None
        self.renamed: RenamedTurn | None = None
        # the last call's quiet plan and the request key it was made for (shared.core.quiet)
        self.again: tuple[Again, Any] | None = None


class SoFar(NamedTuple):
    """What a turn's earlier calls left for its next one: the pending messages' wire-form
    slots (none unless ``extra`` is the list :meth:`PendingTurns.rows` last returned),
    where the pair scan resumes (state, messages already scanned), the last truncation
    input, the renaming of repeated call ids, and the session's last truncation counts."""

    wire: Sequence[dict[str, Any]]
    scan: tuple[PairScan, int] | None
    cut: TurnCut | None
    renamed: RenamedTurn | None
    counted: Counted | None


class PendingTurns:
    """The pending turns of recent sessions, least recently used out first; thread-safe.

    Bounded by sessions and by tokens (``turns``, sized by each turn's token count;
    :meth:`shared.core.viewcache.ViewCache.pending` gives the guard its cache's two
    maps, so the guards of one cache share those bounds): a turn an agent never
    recorded stays only until newer ones push it out.
    """

    def __init__(self, counter: TokenCounter, turns: BoundedLRU[_Turn],
                 counted: BoundedLRU[Counted]) -> None:
        self.counter = counter
        self._turns = turns
        # per session, what its last truncation build counted (kept across turns), sized
        # by messages
        self._counted = counted

    def _get(self, session_id: str) -> _Turn | None:
        return self._turns.peek(session_id)

    def _turn(self, session_id: str) -> _Turn:
        """The session's turn record, made if absent (most recently used)."""
        turn = self._turns.get(session_id)
        if turn is None:
            turn = _Turn()
            self._turns.put(session_id, turn, 0)
        return turn

    def _sized(self, session_id: str, turn: _Turn) -> None:
        """Account for ``turn``'s tokens now (the bound may push older turns out, or this
        one when it alone is over it: its next call then starts afresh)."""
        self._turns.put(session_id, turn, sum(turn.tokens))

    def rows(self, session_id: str, raw: Sequence[Message | Mapping[str, Any]],
             ) -> tuple[list[Message], list[int]]:
        """The pending messages, validated and counted; a tool chain's prepares re-use
        what an earlier prepare of the same turn already did (compared by value), the
        messages' wire forms included (:meth:`wire`)."""
        if not isinstance(raw, (list, tuple)):
            items = validate_messages(raw, prefix="pending")
            encoded(items, 0)
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
        fresh_raw = encoded(fresh, reuse)
        assert reuse == 0 or found is not None
        # A new record, kept whole (as most recent) by _sized: another request of the
        # session may be reading or replacing ``found`` meanwhile (filled in place, its
        # fields came from two requests, and a recording took one's messages with the
        # other's stored JSON).
        keep = found is not None and reuse == len(given)
        base = found if found is not None else _Turn()
        turn = _Turn.__new__(_Turn)  # every field set below
        turn.scan, turn.cut, turn.renamed = base.scan, base.cut, base.renamed
        turn.again = base.again if keep else None
        # new lists (an earlier view holds the last ones), made at C speed
        if keep:
            turn.given = base.given + [_kept(item) for item in raw[reuse:]]
            turn.extra = extra = base.extra + fresh
            turn.tokens = tokens = base.tokens + [self.counter.message(m) for m in fresh]
            turn.raw = base.raw + fresh_raw
        else:
            turn.given = base.given[:reuse] + [_kept(item) for item in raw[reuse:]]
            turn.extra = extra = base.extra[:reuse] + fresh
            turn.tokens = tokens = (base.tokens[:reuse]
                                    + [self.counter.message(m) for m in fresh])
            turn.raw = base.raw[:reuse] + fresh_raw
        turn.slots = (base.slots if isinstance(base.slots, Slots) else Slots(base.slots)
                      ).continued(reuse, len(fresh))
        self._sized(session_id, turn)
        return extra, list(tokens)

    def known(self, session_id: str, scan: PairScan | None, extra: list[Message]) -> SoFar:
        """What the turn's earlier calls left that this call's pending messages (``extra``,
        as :meth:`rows` returned them) can re-use; the core checks each before use."""
        turn = self._turns.peek(session_id) if extra else None
        counted = self._counted.get(session_id)
        if turn is None:
            return SoFar((), None, None, None, counted)
        wire: Sequence[dict[str, Any]] = turn.slots if turn.extra is extra else []
        resumed = None
        known = turn.scan
        if known is not None and scan is not None and known[0] is scan:
            seen = known[1]
            if len(seen) <= len(extra) and all(map(operator.is_, seen, extra)):
                resumed = known[2], len(seen)  # the scan resumes after the same messages
        return SoFar(wire, resumed, turn.cut, turn.renamed, counted)

    def scanned(self, session_id: str, extra: Sequence[Message], scan: PairScan | None,
                base: PairScan, cut: TurnCut | None = None,
                renamed: RenamedTurn | None = None) -> None:
        """Keep the pending turn's scan (``scan``, from ``base``), truncation input
        (``cut``, when this call truncated) and renaming (``renamed``: its call ids
        repeat) for the next call."""
        if cut is not None:
            self._counted.put(session_id, cut.counted, len(cut.counted))
        turn = self._get(session_id)
        if turn is None:
            if extra or (cut is None and renamed is None):
                return  # :meth:`rows` kept no turn (over the bound, or not a list)
            turn = self._turn(session_id)
        turn.renamed = renamed
        turn.scan = None if scan is None or not extra else (base, tuple(extra), scan)
        if cut is not None:
            turn.cut = cut

    def again(self, session_id: str, extra: list[Message],
              ) -> tuple[Again, Any, Sequence[dict[str, Any]]] | None:
        """The turn's last quiet plan (:class:`~shared.core.quiet.Again`), the request key
        it was made for and the pending messages' wire slots, when ``extra`` is the list
        :meth:`rows` last returned (this call continues that turn)."""
        turn = self._turns.peek(session_id) if extra else None
        if turn is None or turn.extra is not extra or turn.again is None:
            return None
        return turn.again[0], turn.again[1], turn.slots

    def keep_again(self, session_id: str, extra: list[Message], again: Again | None,
                   key: Any) -> None:
        """Keep ``again`` (made for request ``key``) for the turn's next call, and its pair
        scan for a call planned in full (see :meth:`scanned`)."""
        turn = self._turns.peek(session_id) if extra else None
        if turn is None or turn.extra is not extra:
            return
        turn.again = None if again is None else (again, key)
        snap = again.snap() if again is not None else None
        if again is not None and snap is not None:  # as :meth:`scanned` keeps a full plan's
            turn.scan, turn.renamed = ((snap.scan, again.extra, again.scan), None) \
                if again.renamed is None else (None, again.renamed)

    def recorded(self, session_id: str, messages: Sequence[Any],
                 ) -> tuple[list[Message], dict[int, int], dict[int, tuple[bytes, int]],
                            list[dict[str, Any]], RenamedTurn | None]:
        """For the turn being recorded: its first messages as the pending turn validated
        them (the same given, compared as :meth:`rows` does), their token counts and stored
        JSON by message object, their wire-form slots and the turn's renaming, so that
        recording the turn does not validate, count, encode, rename or convert them again.
        Stored JSON only of the messages given as mappings (compared by value): a
        :class:`Message` given again is the same object, but its metadata dict or content
        list may have been changed in place since, so its JSON is made anew."""
        turn = self._get(session_id)
        if turn is None or not isinstance(messages, (list, tuple)):
            return [], {}, {}, [], None
        known: list[Message] = []
        counts: dict[int, int] = {}
        rows: dict[int, tuple[bytes, int]] = {}
        slots: list[dict[str, Any]] = []
        for old, message, tokens, raw, slot, item in zip(
                turn.given, turn.extra, turn.tokens, turn.raw, turn.slots, messages,
                strict=False):
            if old is not item and old != item:
                break
            known.append(message)
            counts[id(message)] = tokens
            if old is not item and raw is not None:
                rows[id(message)] = (raw, tokens)
            slots.append(slot)
        return known, counts, rows, slots, turn.renamed

    def forget(self, session_id: str) -> None:
        """The turn was recorded: the next call starts a new one."""
        self._turns.pop(session_id)


__all__ = ["PendingTurns", "SoFar"]
