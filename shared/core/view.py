"""Pure assembly of the view sent to the model, and its token accounting.

The view is ``[system prompt (+ summary)] [summary message?] [log from the
watermark, with cheap-stage placeholders] [pending messages]``. Nothing here
does I/O: the guard reads the store once and calls these functions; the
workers use the same accounting for their trigger, so both agree on what a
session costs (one estimator).

The hot path's cost lives here too. Decoding the messages of the view is
most of what ``prepare`` would spend, and between two compactions the view
only grows at its end, so :class:`ViewCache` keeps each session's decoded
view and :func:`decode_view` decodes only what an incremental read brought.
:func:`pairs_intact` lets the guard skip tool-pair repair of a view that
needs none (the common case: the log holds complete turns).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from shared.core.messages import Message
from shared.core.records import (
    CheapDecision,
    RawView,
    SessionState,
    SummaryRecord,
    ViewCursor,
    ViewData,
)
from shared.core.tokens import Calibration, hybrid_estimate

SUMMARY_OPEN = "<conversation_summary>"
SUMMARY_CLOSE = "</conversation_summary>"
SUMMARY_INTRO = (
    "The earlier part of this conversation was compacted. What follows summarizes it; "
    "the messages after it continue from there."
)


def summary_block(record: SummaryRecord) -> str:
    """The text injected for a summary: framed, with its fact ledger."""
    return f"{SUMMARY_INTRO}\n{SUMMARY_OPEN}\n{record.injected_text()}\n{SUMMARY_CLOSE}"


def apply_cheap(messages: Sequence[Message], offset: int,
                decisions: Mapping[int, CheapDecision]) -> list[Message]:
    """Replace the content of decided messages by their placeholders.

    ``offset`` is the log index of ``messages[0]``. Tool calls and ids are
    kept, so tool pairs stay intact.
    """
    if not decisions:
        return list(messages)
    out: list[Message] = []
    for i, message in enumerate(messages):
        decision = decisions.get(offset + i)
        out.append(message if decision is None
                   else message.model_copy(update={"content": decision.placeholder}))
    return out


def cheap_savings(decisions: Mapping[int, CheapDecision], start: int, end: int) -> int:
    """Tokens saved by decisions on log positions ``[start, end)``."""
    return sum(d.saved_tokens for i, d in decisions.items() if start <= i < end)


def assemble(system_prompt: str, summary: SummaryRecord | None, history: Sequence[Message],
             *, placement: str = "system") -> list[Message]:
    """The message list to send, system message first (if any)."""
    out: list[Message] = []
    system = system_prompt
    lead: Message | None = None
    if summary is not None:
        block = summary_block(summary)
        # A cut inside a long turn leaves the history starting at an assistant
        # message; Anthropic and Gemini need a user message first, so the
        # summary then leads as that user message.
        if placement == "system" and (not history or history[0].role == "user"):
            system = f"{system_prompt}\n\n{block}" if system_prompt else block
        else:
            lead = Message(role="user", content=block, metadata={"compaction": "summary"})
    if system:
        out.append(Message(role="system", content=system))
    if lead is not None:
        out.append(lead)
    out.extend(history)
    return out


@dataclass(frozen=True, slots=True)
class Regions:
    """Heuristic tokens of each region of one request (before calibration)."""

    system: int
    summary: int
    tools: int
    history: int
    overhead: int

    @property
    def total(self) -> int:
        return self.system + self.summary + self.tools + self.history + self.overhead


def calibrated_total(regions: Regions, state: SessionState, covered_end: int) -> int:
    """Estimated prompt tokens of this request, hybrid where possible.

    If the provider reported usage for an earlier request of the *same* view
    (same version: no compaction or edit since), the estimate is that
    report plus the calibrated heuristic for what was added since; otherwise
    the heuristic times the session's calibration ratio, which survives
    compaction.
    """
    calibration = Calibration(ratio=state.calibration_ratio, samples=state.calibration_samples)
    anchor = state.anchor()
    if anchor is not None and anchor.version == state.version and anchor.end <= covered_end:
        return hybrid_estimate(anchor.reported, anchor.estimated, regions.total, calibration)
    return calibration.apply(regions.total)


def _blank(message: Message) -> bool:
    """A user/assistant message without tool calls, media or text (repair drops these)."""
    if message.tool_calls or message.role not in ("user", "assistant"):
        return False
    if isinstance(message.content, str):
        return not message.content.strip()
    return message.media_count() == 0 and not message.text().strip()


@dataclass(frozen=True, slots=True)
class PairScan:
    """Where the walk of :func:`scan_pairs` stands, so that it can resume later.

    ``begun``: a non-system message was seen (the leading system run is
    over); ``seen``: every tool call id so far; ``open_calls``: calls of the
    last assistant message still waiting for their result.
    """

    ok: bool = True
    begun: bool = False
    seen: frozenset[str] = frozenset()
    open_calls: frozenset[str] = frozenset()

    @property
    def intact(self) -> bool:
        return self.ok and not self.open_calls


PAIRS_START = PairScan()


def scan_pairs(messages: Sequence[Message], state: PairScan = PAIRS_START) -> PairScan:
    """Continue the check of :func:`pairs_intact` over ``messages`` from ``state``.

    ``scan_pairs(a + b) == scan_pairs(b, scan_pairs(a))``: a view that only
    grew at its end is checked from where the last check stopped.
    """
    if not state.ok:
        return state
    begun = state.begun
    seen = set(state.seen)
    open_calls = set(state.open_calls)
    for message in messages:
        role = message.role
        if not begun:
            if role == "system":
                continue
            if role != "user":
                return PairScan(ok=False)
            begun = True
        if role == "tool":
            call_id = message.tool_call_id or ""
            if call_id not in open_calls:
                return PairScan(ok=False)
            open_calls.discard(call_id)
            continue
        if open_calls or _blank(message):
            return PairScan(ok=False)
        for call in message.tool_calls:
            if call.id in seen:
                return PairScan(ok=False)
            seen.add(call.id)
            open_calls.add(call.id)
    return PairScan(True, begun, frozenset(seen), frozenset(open_calls))


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


@dataclass(frozen=True, slots=True)
class CachedView:
    """One session's decoded view as of one read: ``log[start:end]`` and the rest.

    ``start`` is the watermark of that read; a later read whose watermark
    moved forward inside ``[start, end]`` (a summary was committed) reuses
    the tail of ``history`` instead of reading it again.
    """

    epoch: str
    gen: int
    version: int
    start: int
    end: int
    total: int
    history: tuple[Message, ...]
    summary: SummaryRecord | None
    state_raw: Mapping[str, str]
    state: SessionState
    cheap_raw: Mapping[int, str]
    cheap: Mapping[int, CheapDecision]
    scan: PairScan  # scan_pairs(history): the next view resumes from it

    @property
    def cursor(self) -> ViewCursor:
        return ViewCursor(self.epoch, self.gen, self.version, self.start, self.end, self.total)


class ViewCache:
    """Decoded views of recently used sessions, least recently used evicted.

    Bounded twice: at most ``max_sessions`` sessions and ``max_messages``
    messages in all (a view larger than that is not kept). Entries are
    immutable and replaced whole, so concurrent prepares of one session
    cannot corrupt each other: the worst case is a re-read.
    """

    def __init__(self, max_sessions: int = 256, max_messages: int = 50_000) -> None:
        self.max_sessions = max_sessions
        self.max_messages = max_messages
        self._entries: OrderedDict[str, CachedView] = OrderedDict()
        self._messages = 0
        self._lock = threading.Lock()

    def get(self, session_id: str) -> CachedView | None:
        with self._lock:
            entry = self._entries.get(session_id)
            if entry is not None:
                self._entries.move_to_end(session_id)
            return entry

    def put(self, session_id: str, entry: CachedView | None) -> None:
        with self._lock:
            old = self._entries.pop(session_id, None)
            if old is not None:
                self._messages -= len(old.history)
            if entry is None or len(entry.history) > self.max_messages or not self.max_sessions:
                return
            self._entries[session_id] = entry
            self._messages += len(entry.history)
            while self._entries and (len(self._entries) > self.max_sessions
                                     or self._messages > self.max_messages):
                _, evicted = self._entries.popitem(last=False)
                self._messages -= len(evicted.history)

    def discard(self, session_id: str) -> None:
        self.put(session_id, None)

    def __len__(self) -> int:
        return len(self._entries)


def decode_view(raw: RawView, cached: CachedView | None,
                ) -> tuple[ViewData, PairScan, CachedView | None]:
    """The full view from a read and the cached view it was made against.

    Decodes only what ``cached`` does not hold: the new messages of an
    incremental read, a changed summary or state hash, new cheap decisions.
    Returns the view, the :class:`PairScan` of its history, and the entry
    to cache (None when the session has no epoch yet: nothing was appended).
    """
    state = (cached.state if cached is not None and cached.state_raw == raw.state_raw
             else raw.state())
    if raw.incremental:
        if cached is None or cached.end != raw.start or not \
                cached.start <= state.watermark <= cached.end:
            raise ValueError("an incremental read needs the cached view it continues")
        new = raw.decode_messages()
        history = list(cached.history[state.watermark - cached.start:]) + new
        scan = (scan_pairs(new, cached.scan) if state.watermark == cached.start
                else scan_pairs(history))
    else:
        history = raw.decode_messages()
        scan = scan_pairs(history)
    if raw.summary_included:
        summary = (SummaryRecord.model_validate_json(raw.summary_json)
                   if raw.summary_json else None)
    elif cached is not None:  # unchanged since the cached read: not sent again
        summary = cached.summary
    else:
        raise ValueError("the summary was left out of a read that continues no cached view")
    if cached is not None and cached.cheap_raw == raw.cheap_raw:
        cheap = dict(cached.cheap)
    else:
        known = cached.cheap_raw if cached is not None else {}
        cheap = {i: (cached.cheap[i] if cached is not None and known.get(i) == v
                     else CheapDecision.model_validate_json(v))
                 for i, v in raw.cheap_raw.items()}
    data = ViewData.model_construct(
        state=state, history=history, tokens_before_watermark=raw.tokens_before_watermark,
        tokens_total=raw.tokens_total, length=raw.length, summary=summary, cheap=cheap,
        pending=raw.pending, epoch=raw.epoch)
    if not raw.epoch:
        return data, scan, None
    entry = CachedView(
        epoch=raw.epoch, gen=raw.gen, version=state.version, start=state.watermark,
        end=raw.length, total=raw.tokens_total, history=tuple(history), summary=summary,
        state_raw=raw.state_raw, state=state, cheap_raw=raw.cheap_raw, cheap=cheap, scan=scan)
    return data, scan, entry


__all__ = [
    "PAIRS_START",
    "SUMMARY_CLOSE",
    "SUMMARY_OPEN",
    "CachedView",
    "PairScan",
    "Regions",
    "ViewCache",
    "apply_cheap",
    "assemble",
    "calibrated_total",
    "cheap_savings",
    "decode_view",
    "pairs_intact",
    "scan_pairs",
    "summary_block",
]
