"""Each session's view, maintained incrementally between reads (pure, no I/O).

Between two compactions a session's view only grows at its end, gains a
batch of cheap-stage placeholders now and then, and loses a prefix when a
summary lands. :class:`CachedView` keeps what the guard needs in a form
where each of those changes costs what changed, never the history length:

- ``history``: ``log[start:end]`` decoded, as shared :class:`Chunks`;
- ``applied``: the same with the placeholders of ``cheap`` applied, and
  ``saved``, the tokens those placeholders save (kept in step);
- ``wire``: ``applied`` converted to the wire formats asked for so far
  (:mod:`shared.core.wireview`), extended in step with ``applied``;
- ``scan``: the tool-pair scan of ``history``, resumed over new messages.

:func:`decode_view` turns one store read (:class:`RawView`) plus the
cached entry into the next entry, decoding only what the read brought.
:class:`ViewCache` bounds the entries (sessions and messages), least
recently used first out.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.core import fastjson
from shared.core.boundedlru import BoundedLRU
from shared.core.callids import KnownIds
from shared.core.cheap import CheapScan
from shared.core.chunks import Chunks, Lazy
from shared.core.errors import StoreError
from shared.core.messages import Message
from shared.core.pairs import (
    PAIRS_START,
    PairScan,
    Shape,
    scan_pairs,
    scan_rest,
    scan_shapes,
    shape,
    stored_shape,
)
from shared.core.records import (
    CheapDecision,
    RawView,
    SessionState,
    SummaryRecord,
    ViewCursor,
    current_decisions,
)
from shared.core.repaired import RepairedView
from shared.core.tokens import TokenCounter
from shared.core.wire._common import USAGE
from shared.core.wireview import ReadWire, convert, decode_stored, load_stored

BYTES_PER_MESSAGE = 2_800
"""Measured bytes per cached message (decoded Message, its store count, its OpenAI
wire dict, chunk overhead): 2,292-2,831 on the real transcripts of the benchmark
(~1 kB of JSON a message; tracemalloc in ``scripts/bench_guard.py``). A session's
cost is about this times the messages of its view."""

PENDING_TURNS = 1_024
"""Sessions whose turn in progress a guard remembers between its prepares (see
:meth:`ViewCache.pending`)."""
PENDING_TOKENS = 10_000_000
"""Tokens of those turns, in all: a turn costs 3-15 bytes a token (the messages as given,
validated, counted, their wire forms; the text itself is held once): 14.7 on 27-call real
tool chains, 3 on the same chains with 40 kB tool outputs (tracemalloc).
Counted in tokens, not messages, so that a few turns of huge tool outputs are bounded too."""


@dataclass(slots=True, weakref_slot=True)  # weakly held by a pending turn's quiet plan
class CachedView:
    """One session's view as of one read: ``log[start:end]`` and what derives from it."""

    epoch: str
    gen: int
    version: int
    start: int
    end: int
    total: int
    tokens_before: int
    history: Chunks[Message]
    applied: Chunks[Message]
    saved: int
    summary: SummaryRecord | None
    state_raw: Mapping[str, str]
    state: SessionState
    cheap_gen: str
    cheap: Mapping[int, CheapDecision]
    cheap_raw: Mapping[int, Any]
    scan: PairScan
    pending: bool = False
    counts: Chunks[int] | None = None  # the store's token count of each ``history`` message
    wire: dict[str, Any] = field(default_factory=dict)
    planned_end: int = -1  # log length the cheap stages were last planned at (-1: never)
    cheap_scan: CheapScan | None = None  # what planning read of this view (shared.core.cheap)
    repaired: RepairedView | None = None  # its repair, when it needs one (shared.core.repaired)
    mark: Any = None  # the change feed's mark of the read this entry came from (None: read)
    tail: str = ""  # the state's ``tail`` naming ``end`` ('' = unknown): see :attr:`cursor`
    tail_raw: bytes | None = None  # the stored ``log[end - 1]`` (None: not held)
    digest_memo: str | None = None  # :attr:`digest`, once asked for
    # what a tool chain's quiet calls share (shared.core.quiet): the view before the
    # pending turn, messages and wire forms, keyed by what each was made of (a replaced
    # copy shares the dict: every entry is checked against its parts before use)
    quiet: dict[Any, Any] = field(default_factory=dict)

    @property
    def length(self) -> int:
        """Messages in the log (``ViewData.length``, which ``guard.load`` used to return)."""
        return self.end

    @property
    def cursor(self) -> ViewCursor:
        """What this view holds, for an incremental read; with the entry that ends it, so
        that a log whose lost tail another writer replaced by as many tokens is read
        again (``view.lua``)."""
        return ViewCursor(self.epoch, self.gen, self.version, self.start, self.end, self.total,
                          self.cheap_gen, self.tail, self.digest)

    @property
    def digest(self) -> str:
        """sha1 of the stored ``log[end - 1]`` ('' when not held), made once per entry and
        only when a read needs it (a call the change feed vouches for reads nothing)."""
        memo = self.digest_memo
        if memo is None:
            raw = self.tail_raw
            memo = "" if raw is None else hashlib.sha1(raw, usedforsecurity=False).hexdigest()
            self.digest_memo = memo
        return memo

    @property
    def history_tokens(self) -> int:
        """Store-counted tokens of ``log[start:end]``, before cheap-stage savings."""
        return self.total - self.tokens_before


@dataclass(slots=True)
class _Shelf:
    """What the scopes of one :class:`ViewCache` share: bounds, entries, LRU order, the
    id hints of the sessions (:class:`~shared.core.callids.KnownIds`, as many) and the
    guards' turns in progress (:meth:`ViewCache.pending`)."""

    max_sessions: int
    max_messages: int
    ids: KnownIds
    turns: BoundedLRU[Any]
    counted: BoundedLRU[Any]
    sent: BoundedLRU[Any]
    unanswered: BoundedLRU[Any]
    entries: OrderedDict[Any, CachedView] = field(default_factory=OrderedDict)
    messages: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class ViewCache:
    """Cached views of recently used sessions, least recently used evicted.

    Bounded twice: at most ``max_sessions`` sessions and ``max_messages``
    messages in all (a view larger than that is not kept); about
    :data:`BYTES_PER_MESSAGE` bytes per cached message. Entries are replaced
    whole, so concurrent prepares of one session cannot corrupt each other.
    The turns in progress its guards remember (:meth:`pending`) have bounds of
    their own: ``pending_turns`` sessions, ``pending_tokens`` tokens in all.

    :meth:`scoped` gives guards of different namespaces (a server's tenants,
    whose session ids may be the same) one memory bound between them.
    """

    __slots__ = ("_scope", "_shelf")

    def __init__(self, max_sessions: int = 256, max_messages: int = 200_000, *,
                 pending_turns: int = PENDING_TURNS,
                 pending_tokens: int = PENDING_TOKENS) -> None:
        remembered = max(pending_turns, max_sessions) or PENDING_TURNS  # usage learns uncached
        self._shelf = _Shelf(max_sessions, max_messages, KnownIds(max_sessions),
                             BoundedLRU(pending_turns, pending_tokens),
                             BoundedLRU(pending_turns, max_messages),
                             BoundedLRU(remembered, remembered),
                             BoundedLRU(remembered, remembered))
        self._scope = ""

    def scoped(self, scope: str) -> ViewCache:
        """This cache as seen by one namespace: its session ids are its own; the bounds,
        and the order in which sessions leave, are shared with every other scope."""
        if not scope:
            raise ValueError("a scope of a view cache needs a name")
        view = ViewCache.__new__(ViewCache)
        view._shelf, view._scope = self._shelf, scope
        return view

    def known_ids(self) -> KnownIds:
        """The id hints of this cache's sessions (this scope's), bounded with it."""
        ids = self._shelf.ids
        return ids.scoped(self._scope) if self._scope else ids

    def pending(self) -> tuple[BoundedLRU[Any], BoundedLRU[Any]]:
        """Where this cache's guards keep their sessions' turns in progress (bounded by
        turns and tokens) and the counts of their last truncations (by turns and messages:
        mostly the cached views' own messages); this scope's."""
        shelf = self._shelf
        if not self._scope:
            return shelf.turns, shelf.counted
        return shelf.turns.scoped(self._scope), shelf.counted.scoped(self._scope)

    def remembered(self) -> tuple[BoundedLRU[Any], BoundedLRU[Any]]:
        """Where this cache's guards keep, per session, the last request prepared (until a
        usage report describes it) and a turn's unanswered append: ``max(pending_turns,
        max_sessions)`` sessions each (:data:`PENDING_TURNS` when both are 0), every
        scope's together, so a server's many tenants share one bound (each tenant's guard
        kept its own); this scope's."""
        shelf = self._shelf
        if not self._scope:
            return shelf.sent, shelf.unanswered
        return shelf.sent.scoped(self._scope), shelf.unanswered.scoped(self._scope)

    @property
    def max_sessions(self) -> int:
        return self._shelf.max_sessions

    @property
    def max_messages(self) -> int:
        return self._shelf.max_messages

    def get(self, session_id: str) -> CachedView | None:
        shelf, key = self._shelf, (self._scope, session_id) if self._scope else session_id
        with shelf.lock:
            entry = shelf.entries.get(key)
            if entry is not None:
                shelf.entries.move_to_end(key)
            return entry

    def put(self, session_id: str, entry: CachedView | None) -> None:
        """Keep ``entry`` (None: drop the session's), unless the one kept is newer: two
        requests of one session in a threaded server can finish out of order, and a
        prepare that read before the other's append would otherwise put its older view
        over the one the append made (stale until the append's push arrives, which can
        come after the next call)."""
        shelf, key = self._shelf, (self._scope, session_id) if self._scope else session_id
        with shelf.lock:
            old = shelf.entries.get(key)
            if old is not None and entry is not None and _older(entry, old):
                return
            shelf.entries.pop(key, None)
            if old is not None:
                shelf.messages -= len(old.history)
            if entry is None or len(entry.history) > shelf.max_messages \
                    or not shelf.max_sessions:
                return
            shelf.entries[key] = entry
            shelf.messages += len(entry.history)
            while shelf.entries and (len(shelf.entries) > shelf.max_sessions
                                     or shelf.messages > shelf.max_messages):
                _, evicted = shelf.entries.popitem(last=False)
                shelf.messages -= len(evicted.history)

    def discard(self, session_id: str) -> None:
        self.put(session_id, None)

    @property
    def messages(self) -> int:
        """Messages cached in all, every scope's."""
        return self._shelf.messages

    def __len__(self) -> int:
        """Sessions cached in all, every scope's."""
        return len(self._shelf.entries)


def _older(entry: CachedView, kept: CachedView) -> bool:
    """Whether ``entry`` was read before ``kept``: the same log (epoch and generation: no
    edit, no delete between), where the version and the length only grow, and neither
    further on while one is behind."""
    return (entry.epoch == kept.epoch and entry.gen == kept.gen
            and entry.version <= kept.version and entry.end <= kept.end
            and (entry.version < kept.version or entry.end < kept.end))


class KnownCounts:
    """A :class:`TokenCounter` that answers from the store's counts for the messages it
    knows (the view's own objects), and asks ``base`` for anything else.

    Truncation and the cheap stages count every message of the view; the
    store counted each one once, at append, with the same counter.
    """

    def __init__(self, base: TokenCounter, known: dict[int, int]) -> None:
        self.base, self.known = base, known

    def text(self, text: str) -> int:
        return self.base.text(text)

    def message(self, message: Message) -> int:
        found = self.known.get(id(message))
        return found if found is not None else self.base.message(message)

    def messages(self, messages: Sequence[Message]) -> int:
        return self.base.messages([]) + sum(self.message(m) for m in messages)

    def tools(self, tools: Sequence[Mapping[str, Any]]) -> int:
        return self.base.tools(tools)

    @classmethod
    def of(cls, base: TokenCounter, snap: CachedView, extra: Sequence[Message] = (),
           extra_tokens: Sequence[int] = (), *, applied: bool = False) -> TokenCounter:
        """``applied``: for the messages of ``snap.applied`` (what a truncation counts: its
        chunks decode their own objects), the placeholders of cheap stages left to
        ``base``; else for ``snap.history``."""
        if snap.counts is None or len(snap.counts) != len(snap.history):
            return base
        if applied:
            placed, w = snap.cheap, snap.start
            known = {id(m): n for i, (m, n) in enumerate(zip(snap.applied, snap.counts,
                                                             strict=True))
                     if w + i not in placed}
        else:
            known = dict(zip(map(id, snap.history), snap.counts, strict=True))
        known.update(zip(map(id, extra), extra_tokens, strict=False))
        return cls(base, known)


def placeholder(message: Message, decision: CheapDecision) -> Message:
    return decision.apply(message)


def _apply(history: Sequence[Message], start: int, decisions: Mapping[int, CheapDecision],
           indexes: list[int]) -> tuple[dict[int, Message], int]:
    changes: dict[int, Message] = {}
    saved = 0
    for i in indexes:
        if start <= i < start + len(history):
            changes[i - start] = placeholder(history[i - start], decisions[i])
            saved += decisions[i].saved_tokens
    return changes, saved


def _apply_stored(raw: Sequence[bytes], start: int, decisions: Mapping[int, CheapDecision],
                  ) -> tuple[dict[int, Message], int]:
    """:func:`_apply` to a read's stored messages (``raw[0]`` at log index ``start``): the
    decided ones decoded together and alone (a lazy chunk decoded for one of them decodes
    its 512 messages, ~5 ms, which a cold prepare otherwise never reads)."""
    found = [i for i in decisions if start <= i < start + len(raw)]
    originals = decode_stored(tuple(raw[i - start] for i in found))
    changes = {i - start: placeholder(m, decisions[i])
               for i, m in zip(found, originals, strict=True)}
    return changes, sum(decisions[i].saved_tokens for i in found)


class _Stored(Sequence[Message]):
    """Stored messages decoded one at a time, when read (the few a placeholder needs)."""

    def __init__(self, raw: Sequence[bytes]) -> None:
        self.raw = raw

    def __len__(self) -> int:
        return len(self.raw)

    def __getitem__(self, index: Any) -> Any:
        return decode_stored((self.raw[index],))[0]


def _scan_dropped(cached: CachedView, drop: int, history: Chunks[Message],
                  summary: SummaryRecord | None) -> PairScan:
    """The pair scan of ``history``: ``cached``'s without its first ``drop`` messages (a
    truncation moved the watermark), then the new ones. What is left of the cached
    history is read for its call ids alone where :func:`scan_rest` can tell, the new
    messages scanned on from there."""
    kept = len(cached.history) - drop
    start = _scan_start(summary)
    rest = scan_rest(cached.scan, history[:kept], start) if kept > 0 else None
    if rest is None:
        return scan_pairs(history, start)
    return scan_pairs(history[kept:], rest) if len(history) > kept else rest


def _scan_start(summary: SummaryRecord | None) -> PairScan:
    """Where the pair scan of a view's history starts: with a summary, the view opens
    with a user message whatever the history starts with (the summary leads as one
    when the cut fell inside a turn, :func:`shared.core.view.assemble`), so a history
    that starts at an assistant message needs no repair."""
    return PairScan(begun=True) if summary is not None else PAIRS_START


_TALK = ("user", "assistant")
_UNSENT = frozenset({"wire_ids", USAGE})
"""Metadata no wire format sends or reads: the store's ``wire_ids`` and the response's
``usage`` that OpenAI-format logs keep on assistant messages (:mod:`shared.core.wire.openai`)."""


def _openai_ok(data: dict[str, Any], call_id: Any) -> bool:
    """Whether :func:`_read_stored` can make ``data``'s wire form in place: text
    content (checked by the caller), and nothing that needs the model (media, a name,
    reasoning, OpenAI passthrough metadata, an unknown field)."""
    meta = data.get("metadata")
    if type(meta) is not dict or len(data) != (4 if call_id is None else 5):
        return False
    if meta and not (len(meta) == 1 and "wire_ids" in meta):  # wire_ids: the store's own
        return not any(k.startswith("openai_") for k in meta)
    return True


def _read_stored(raw: Sequence[bytes], wire: bool,
                 ) -> tuple[list[Shape], list[dict[str, Any] | None],
                            list[dict[str, Any] | None], dict[int, Any]]:
    """Each stored message of a full read parsed once: its pair-scan shape
    (:func:`stored_shape`); with ``wire``, the OpenAI wire form of the ones that are text
    with or without tool calls (None for the others); the same for the bare ones alone,
    whose stored JSON holds nothing more to any format (no metadata but :data:`_UNSENT`:
    what Anthropic's and Gemini's folds may read back from the form, see
    :class:`~shared.core.wireview.ReadWire`; a Gemini signature, a made-up id or an
    ``is_error`` mean nothing to OpenAI and everything to them); and the others' JSON as
    plain data for their conversion (:func:`~shared.core.wireview.openai_of_stored`).

    The wire form is made in place, since the data was parsed for this read alone:
    exactly what :func:`~shared.core.wireview.openai_of_stored` makes (keys in the same
    order), without a new dict per message (converting 10k messages one by one cost
    ~15 ms), and what it drops is garbage at once (a read that parsed every message first
    kept all of it alive for the collector to walk while the rest were parsed). No number
    of a message is read here nor by that conversion (which leaves metadata to the
    model's), so the parse is not checked for floats (:func:`fastjson.loads_unchecked`)."""
    shapes: list[Shape] = []
    found: list[dict[str, Any] | None] = []
    bare: list[dict[str, Any] | None] = []
    others: dict[int, Any] = {}
    for i, stored in enumerate(raw):
        data = fastjson.loads_unchecked(stored)
        role, content, calls = data.get("role"), data.get("content"), data.get("tool_calls")
        if type(content) is not str or type(calls) is not list or type(role) is not str:
            shapes.append(stored_shape(data))
            found.append(None)
            bare.append(None)
            if wire:
                others[i] = data
            continue
        call_id = data.get("tool_call_id")
        if calls:
            shapes.append((role, call_id, tuple(c["id"] for c in calls), False))
        else:
            shapes.append((role, call_id, (), role in _TALK and not content.strip()))
        if not wire or not _openai_ok(data, call_id) or not all(
                len(c) == 3 and "arguments" in c for c in calls):
            found.append(None)
            bare.append(None)
            if wire:
                others[i] = data
            continue
        meta = data["metadata"]
        if calls:
            data["tool_calls"] = [{"id": c["id"], "type": "function",
                                   "function": {"name": c["name"],
                                                "arguments": c["arguments"]}}
                                  for c in calls]
            if content == "" and role == "assistant":
                data["content"] = None
        else:
            del data["tool_calls"]
        del data["metadata"]
        found.append(data)
        bare.append(data if not meta or meta.keys() <= _UNSENT else None)
    return shapes, found, bare, others


def _openai_of_read(raw: Sequence[bytes], loaded: Mapping[int, Any],
                    found: list[dict[str, Any] | None],
                    changes: Mapping[int, Message]) -> list[dict[str, Any]]:
    """The OpenAI wire form of a full read: ``found`` where made, the placeholders of
    ``changes`` and the other messages converted (:func:`convert`; ``loaded``: their
    JSON as plain data)."""
    todo = [i for i, f in enumerate(found) if f is None or i in changes]
    items = [changes.get(i, raw[i]) for i in todo]
    out: list[Any] = list(found)
    for i, converted in zip(todo, convert("openai", items, [loaded.get(i) for i in todo]),
                            strict=True):
        out[i] = converted
    return out


def _lazy_history(raw: Sequence[bytes]) -> Chunks[Message]:
    """Stored messages as lazy chunks, the first one alone: every prepare reads the first
    message of the view (the head is assembled around it), and reading it should not
    decode a whole chunk of 512 with pydantic (~5 ms) that a cold prepare never reads."""
    if len(raw) <= 1:
        return Chunks.lazy(raw, decode_stored)
    rest = Chunks.lazy(raw[1:], decode_stored)
    return Chunks((Lazy((raw[0],), decode_stored), *rest.chunks))


def decode_view(raw: RawView, cached: CachedView | None,
                wire_update: Any = None, decoded: Sequence[Message] | None = None) -> CachedView:
    """:func:`_decode_view`; a :class:`StoreError` naming the log position of a stored
    entry that is not a message's JSON (edited by hand, written by another program),
    where the parse's own error (``JSONDecodeError``, ``AttributeError``) named neither
    the session's problem nor which entry to repair."""
    try:
        return _decode_view(raw, cached, wire_update, decoded)
    except (ValueError, AttributeError, TypeError, KeyError):
        for i, entry in enumerate(raw.messages):
            problem = _not_a_message(entry)
            if problem:
                raise StoreError(
                    f"log entry #{raw.start + i} of this session is not a stored message "
                    f"({problem}); repair it, or drop it and what follows with "
                    "truncate_after") from None
        raise


def _not_a_message(entry: Any) -> str:
    """Why ``entry`` cannot be a stored message's JSON ("" when it can)."""
    try:
        data = fastjson.loads_unchecked(entry)
    except ValueError as exc:
        return f"not JSON: {exc}"
    if type(data) is not dict or type(data.get("role")) is not str:
        return "not a JSON object with a role"
    return ""


def _decode_view(raw: RawView, cached: CachedView | None,
                 wire_update: Any = None, decoded: Sequence[Message] | None = None,
                 ) -> CachedView:
    """The session's next cached view from a read and the entry it was made against.

    Decodes only what ``cached`` does not hold. ``wire_update(old_wire,
    drop, changes, new_messages)`` carries the wire forms along (see
    :func:`shared.core.wireview.carry`). ``decoded``: the new messages as models,
    index for index with ``raw.messages`` (the guard's own append: it holds them), for
    their pair shapes and wire forms; the cache keeps their stored JSON all the same.
    """
    if (cached is not None and raw.incremental and not raw.messages
            and not raw.summary_included and not raw.cheap_included
            and raw.start == cached.end and cached.state_raw == raw.state_raw):
        # Nothing changed since the cached read (a tool chain's next call): the entry as is.
        return (cached if cached.pending == raw.pending
                else dataclasses.replace(cached, pending=raw.pending))
    state = (cached.state if cached is not None and _same_state(cached.state_raw, raw.state_raw)
             else raw.state())
    w = state.watermark
    cheap_gen = raw.state_raw.get("cheap_gen", "")
    if raw.cheap_included or cached is None:
        cheap: Mapping[int, CheapDecision] = current_decisions(
            raw.cheap_raw, cached.cheap if cached is not None else None,
            cached.cheap_raw if cached is not None else None)
        cheap_raw: Mapping[int, Any] = raw.cheap_raw
    else:
        cheap, cheap_raw = cached.cheap, cached.cheap_raw
    if raw.summary_included:
        summary = (SummaryRecord.model_validate_json(raw.summary_json)
                   if raw.summary_json else None)
    elif cached is not None:
        summary = cached.summary
    else:
        raise ValueError("the summary was left out of a read that continues no cached view")
    # The new messages stay stored JSON (decoded into models only when read, a chunk at
    # a time): the pair scan and the OpenAI wire form are made from the JSON as plain data.
    new_raw = raw.messages
    if decoded is not None and len(decoded) != len(new_raw):
        decoded = None
    if raw.incremental:
        shapes = (map(shape, decoded) if decoded is not None
                  else map(stored_shape, load_stored(new_raw)))
        if cached is None or cached.end != raw.start or not cached.start <= w <= cached.end:
            raise ValueError("an incremental read needs the cached view it continues")
        drop = w - cached.start
        history = cached.history.drop(drop).extend_lazy(new_raw, decode_stored, decoded)
        applied = cached.applied.drop(drop)
        same_cheap = cheap is cached.cheap and drop == 0
        if same_cheap:
            saved = cached.saved
            changes: dict[int, Message] = {}
        else:  # a new batch of decisions, or the watermark moved: re-derive the placeholders
            old = cached.cheap
            # an unchanged decision is the cached object itself (its JSON matched above)
            fresh = [i for i, d in cheap.items() if old.get(i) is not d]
            gone = [i for i in old if i not in cheap and w <= i < cached.end]
            changes, _ = _apply(history, w, cheap, fresh)
            changes.update({i - w: history[i - w] for i in gone})
            saved = sum(d.saved_tokens for i, d in cheap.items() if w <= i < cached.end)
        applied = applied.replace(changes)
        changed = applied  # the folds join the groups of a change again from it
        start_new = len(applied)
        tail_changes, tail_saved = _apply(_Stored(new_raw), raw.start, cheap,
                                          [i for i in cheap if i >= raw.start])
        if tail_changes:  # a placeholder is not the message its wire forms were made for
            decoded = None
        new_applied: list[Any] = [tail_changes.get(j, r) for j, r in enumerate(new_raw)]
        applied = applied.extend_lazy(new_applied, decode_stored, decoded)
        saved += tail_saved
        scan = ((scan_shapes(shapes, cached.scan) if new_raw else cached.scan) if drop == 0
                else _scan_dropped(cached, drop, history, summary))
        new_counts = raw.message_counts()
        counts = (cached.counts.drop(drop).extend(new_counts)
                  if cached.counts is not None and new_counts is not None else None)
        models = (new_applied if decoded is None else  # placeholders stay, JSON: its model
                  [m if isinstance(r, bytes) else r for r, m in zip(new_applied, decoded,
                                                                     strict=True)])
        if not (drop or changes or models):  # the same messages: the same wire forms, and
            wire = cached.wire  # a fold made from this entry's view lands in the next one too
        else:
            wire = (wire_update(cached.wire, drop, changes, models, start_new,
                                history=changed if changes or drop else None)
                    if wire_update is not None and cached.wire else {})
        planned_end = cached.planned_end if same_cheap or drop == 0 else -1
        cheap_scan = cached.cheap_scan if drop == 0 else None  # the log only grew
        repaired = cached.repaired if drop == 0 and not changes else None  # applied only grew
    else:
        # the shell keeps wire forms: OpenAI's, from the JSON read
        shapes_of, made, bare, loaded = _read_stored(new_raw, wire_update is not None)
        history = _lazy_history(new_raw)
        changes, saved = _apply_stored(new_raw, w, cheap)
        applied = history.replace(changes)
        scan = scan_shapes(shapes_of, _scan_start(summary))
        found = raw.message_counts()
        counts = Chunks.of(found) if found is not None else None
        wire, planned_end, cheap_scan, repaired = {}, -1, None, None
        if wire_update is not None:
            wire = {"openai": ReadWire.of_read(
                _openai_of_read(new_raw, loaded, made, changes),
                [None if i in changes else m for i, m in enumerate(bare)])}
    tail_raw: bytes | None
    digest_memo: str | None
    if new_raw:
        tail_raw, digest_memo = new_raw[-1], None
    elif raw.incremental and cached is not None:  # the same end (checked above)
        tail_raw, digest_memo = cached.tail_raw, cached.digest_memo
    else:
        tail_raw, digest_memo = None, None
    return CachedView(
        epoch=raw.epoch, gen=raw.gen, version=state.version, start=w, end=raw.length,
        total=raw.tokens_total, tokens_before=raw.tokens_before_watermark, history=history,
        applied=applied, saved=saved, summary=summary, state_raw=raw.state_raw, state=state,
        cheap_gen=cheap_gen, cheap=cheap, cheap_raw=cheap_raw, scan=scan, pending=raw.pending,
        counts=counts, wire=wire, planned_end=planned_end, cheap_scan=cheap_scan,
        repaired=repaired, tail=tail_at(raw.state_raw, raw.length), tail_raw=tail_raw,
        digest_memo=digest_memo)


def tail_at(state_raw: Mapping[str, str], length: int) -> str:
    """The state's ``tail`` when it names the append that made the log ``length`` long
    ('' otherwise: an edit shortened the log since, or no append recorded one)."""
    tail = state_raw.get("tail", "")
    return tail if tail.startswith(f"{length}:") else ""


def _same_state(a: Mapping[str, str], b: Mapping[str, str]) -> bool:
    """Whether two state hashes hold the same :class:`SessionState` without parsing either:
    equal but for the tails (which every append changes and the model does not read)."""
    if a == b:
        return True
    return a.keys() == b.keys() and all(v == b[k] for k, v in a.items() if k not in _TAILS)


_TAILS = frozenset(("tail", "tail_prev"))


__all__ = ["BYTES_PER_MESSAGE", "CachedView", "KnownCounts", "ViewCache", "decode_view",
           "placeholder"]
