"""A pending turn whose call ids repeat, renamed once per message (sans-I/O).

The guard renames a turn's repeated call ids (:mod:`shared.core.callids`) while the
turn is still pending, so that each prepare sends a view that pairs without a repair
of the whole view; each call renames only the messages added since the last one. The
append then stores the very ids the prepares sent (:func:`adopted`): the provider saw
them, so a prompt cache keeps matching, and the turn is not renamed a second time. The
ids' nonce is the log position the turn was renamed at (:func:`position_nonce`), bound
to it by the append's claims.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shared.core.callids import SYNTHETIC_KEY, Claims, Renaming, name_key, position_nonce, wire_id
from shared.core.messages import Message
from shared.core.pairs import PairScan, scan_pairs
from shared.core.viewcache import CachedView
from shared.core.wireview import Slots


@dataclass(frozen=True, slots=True)
class RenamedTurn:
    """A pending turn whose call ids repeat (within it, or ids the stored view used),
    renamed so that it pairs without a repair of the whole view, and stored so by its
    append (:func:`adopted`). Kept across the turn's calls: each message is renamed,
    scanned and converted to the wire once (:func:`renamed_turn`)."""

    base: PairScan  # the stored view's scan it was made against
    end: int  # the log length it was made at (its nonce's position)
    nonce: str
    given: tuple[Message, ...]
    renamed: tuple[Message, ...]
    renaming: Renaming  # its state after ``given`` (copied before it is fed more)
    scan: PairScan  # the pair scan of ``renamed``, from ``base``
    slots: Slots  # the wire forms of ``renamed``, index for index


def renamed_turn(given: list[Message], snap: CachedView, known: RenamedTurn | None,
                 given_wire: Sequence[dict[str, Any]] = ()) -> RenamedTurn:
    """The pending turn renamed: ``known`` (an earlier call's) extended by the messages
    added since, when it was made from the same stored view and the same first
    messages, else from scratch. ``given_wire``: the wire-form slots of ``given`` (the
    pending turn's), kept for the messages the renaming leaves as they are."""
    nonce = position_nonce(snap.end)
    k = 0
    slots: Sequence[dict[str, Any]]
    if known is not None and known.base is snap.scan and known.nonce == nonce \
            and len(known.given) <= len(given) \
            and all(map(operator.is_, known.given, given)):
        k = len(known.given)
        renaming, renamed, scan = known.renaming.copy(), known.renamed, known.scan
        slots = known.slots
    else:
        renaming, renamed, scan, slots = Renaming(nonce, open_calls(snap)), (), snap.scan, ()
    more = given[k:]
    # ids the stored view used: renamed as the store's mapping will have them renamed
    renaming.known = {**renaming.known, **{c.id: c.id for m in more for c in m.tool_calls
                                           if snap.scan.taken(c.id)},
                      **(open_named(snap) if made_up_results(more) else {})}
    fresh = renaming.feed(more)
    wire = given_wire if len(given_wire) == len(given) else ()
    added = [wire[k + j] if wire and new is old else {}
             for j, (new, old) in enumerate(zip(fresh, more, strict=True))]
    made = ({fmt: found for fmt, found in list(slots.made.items()) if len(found) <= len(slots)}
            if isinstance(slots, Slots) else {})  # the next wire() extends what it made
    return RenamedTurn(snap.scan, snap.end, nonce, tuple(given), (*renamed, *fresh), renaming,
                       scan_pairs(fresh, scan), Slots([*slots, *added], made))


def open_calls(snap: CachedView) -> dict[str, str]:
    """Provider id -> stored id of the stored view's calls still waiting for results,
    where the append renamed them (an id the session had used): a pending result names
    its call by the provider's id, which the renamed call no longer carries, and would
    be dropped as an orphan while its call got a "result missing" placeholder."""
    waiting = snap.scan.open_calls
    if not waiting:
        return {}
    last = next((m for m in reversed(snap.applied[-64:]) if m.tool_calls), None)
    if last is None:
        return {}
    return {wire_id(last, c.id): c.id for c in last.tool_calls
            if c.id in waiting and wire_id(last, c.id) != c.id}


def made_up_results(messages: Sequence[Message]) -> bool:
    """Whether a result of ``messages`` carries an id the Gemini adapter made up and
    answers no call of ``messages``: it is paired by function name with a stored call
    (:func:`open_named`); a whole Gemini turn (calls and results) needs no look."""
    made_up = [m for m in messages if m.role == "tool" and m.metadata.get(SYNTHETIC_KEY) is True]
    if not made_up:
        return False
    called = {c.name for m in messages for c in m.tool_calls}
    return any(m.name not in called for m in made_up) or len(made_up) > sum(
        len(m.tool_calls) for m in messages)


def made_up_keys(messages: Sequence[Message]) -> set[str]:
    """The name keys the made-up results of ``messages`` may be claimed under, when
    nothing says which calls are answered: the k-th result of a name, the k-th call."""
    counts: dict[str, int] = {}
    for m in messages:
        if m.role == "tool" and m.name and m.metadata.get(SYNTHETIC_KEY) is True:
            counts[m.name] = counts.get(m.name, 0) + 1
    return {name_key(name, k) for name, n in counts.items() for k in range(n)}


def open_named(snap: CachedView) -> dict[str, str]:
    """Name key (:func:`~shared.core.callids.name_key`) -> stored id of the stored view's
    unanswered calls with made-up ids, in the newest message calling each name (within
    the last 64): a Gemini result sent or recorded after its call names only the
    function, and answers the first of these (a view broken elsewhere has no open calls
    in its pair scan, so the messages are read here)."""
    answered: set[str] = set()
    seen: set[str] = set()
    out: dict[str, str] = {}
    for m in reversed(snap.applied[-64:]):
        if m.role == "tool" and m.tool_call_id:
            answered.add(m.tool_call_id)
            continue
        synthetic = m.metadata.get(SYNTHETIC_KEY) if m.tool_calls else None
        if not isinstance(synthetic, list):
            continue
        counts: dict[str, int] = {}
        for c in m.tool_calls:
            if c.id in synthetic:
                k = counts[c.name] = counts.get(c.name, -1) + 1
                if c.name not in seen and c.id not in answered:
                    out[name_key(c.name, k)] = c.id
        seen.update(counts)
    return out


def adopted(renamed: RenamedTurn | None, messages: list[Message], known: Mapping[str, str],
            ) -> tuple[list[Message], Claims, list[dict[str, Any]]] | None:
    """The turn being recorded renamed as its prepares renamed it (and sent it): the
    pending turn's renaming extended by the messages after it, its claims bound to the
    log length it was made at, and the renamed messages' wire-form slots. None unless
    ``messages`` start with the messages it renamed and the append's id mapping
    (``known``) is the one it renamed with: the append then renames as usual."""
    if renamed is None or len(renamed.given) > len(messages) \
            or not all(map(operator.is_, renamed.given, messages)) \
            or not _same_mapping(renamed.renaming.known, known, messages):
        return None
    renaming = renamed.renaming.copy()
    more = renaming.feed(messages[len(renamed.given):])
    claims = dataclasses.replace(renaming.claims(), at_length=renamed.end)
    return ([*renamed.renamed, *more], claims,
            [*renamed.slots, *({} for _ in more)])


def _same_mapping(prepared: Mapping[str, str], known: Mapping[str, str],
                  messages: Sequence[Message]) -> bool:
    """Whether the append's id mapping renames ``messages`` as the prepares' did: the same
    ids known to be taken, and the same stored id for each result whose call is not in
    the turn. Which stored id an id that the turn calls again maps to does not matter: the
    turn's own results follow its calls (an id called in two earlier turns maps to the
    view's first stored one at prepare and the newest one at the append)."""
    if prepared.keys() != known.keys():
        return False
    called: set[str] = set()
    for m in messages:
        called.update(c.id for c in m.tool_calls)
        if m.role == "tool" and m.tool_call_id is not None and m.tool_call_id not in called \
                and prepared.get(m.tool_call_id) != known.get(m.tool_call_id):
            return False
    return True


def known_renamed(given: list[Message], snap: CachedView,
                  known: RenamedTurn | None) -> RenamedTurn | None:
    """``known`` extended, when this call's turn continues the one it was made for: the
    turn needs renaming, and its scan of the given messages can be skipped."""
    if known is None or not known.given or known.base is not snap.scan:
        return None
    if len(known.given) > len(given) or not all(map(operator.is_, known.given, given)):
        return None
    return renamed_turn(given, snap, known)


__all__ = ["RenamedTurn", "adopted", "known_renamed", "made_up_keys", "made_up_results",
           "open_calls",
           "open_named", "renamed_turn"]
