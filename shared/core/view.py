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

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from shared.core import tokens_joined
from shared.core.messages import Message
from shared.core.records import CheapDecision, SessionState, SummaryRecord
from shared.core.tokens import MESSAGE_OVERHEAD, Calibration, TokenCounter, hybrid_estimate
from shared.core.tokens_joined import joined_tokens

SUMMARY_OPEN = "<conversation_summary>"
SUMMARY_CLOSE = "</conversation_summary>"
SUMMARY_INTRO = (
    "The earlier part of this conversation was compacted. What follows summarizes it; "
    "the messages after it continue from there."
)


SUMMARY_FRAMING = MESSAGE_OVERHEAD
"""What placing the summary costs beyond its text alone, or leading the history as a user
message: a message's framing. Where it is unknown how the summary will be placed (a
worker's estimate), the larger of the two costs, so that a view is never estimated below
its recount."""
SUMMARY_JOIN = "\n\n"
"""What joins the summary to the system prompt (:func:`assemble`): all that placing it
there costs, as the counter counts it (counted apart, never below its share of the joined
text)."""


def summary_region(summary: SummaryRecord | None, notice: int = 0,
                   framing: int = SUMMARY_FRAMING) -> int:
    """Tokens of the summary region of a view: its block, the recall notice, its framing
    (:func:`summary_framing`)."""
    return summary.tokens + notice + framing if summary is not None else 0


def summary_joins(history: Sequence[Message], placement: str) -> bool:
    """Whether :func:`assemble` puts the summary in the system message rather than leading
    the history with it: Anthropic and Gemini need a user message first, so a history cut
    inside a turn (an assistant message first) takes the summary as that message."""
    return placement == "system" and (not history or history[0].role == "user")


def summary_framing(join: int, system_prompt: str, history: Sequence[Message],
                    placement: str) -> int:
    """What the summary's placement costs in this view: ``join``, the counter's tokens of
    :data:`SUMMARY_JOIN`, where it joins a non-empty system prompt, else a message's
    framing (its own system message or the user message leading the history). A guard's
    view knows its placement; counting the join as a message's framing put the head 3
    tokens over its recount, which the provider's usage then taught the calibration ratio
    as if it were the tokenizer's."""
    if system_prompt and summary_joins(history, placement):
        return join
    return SUMMARY_FRAMING


def summary_block(record: SummaryRecord, notice: str = "") -> str:
    """The text injected for a summary: framed, with its fact ledger, and ``notice``
    (how to recall what it replaced) when the request offers the ``recall`` tool."""
    block = f"{SUMMARY_INTRO}\n{SUMMARY_OPEN}\n{record.injected_text()}\n{SUMMARY_CLOSE}"
    return f"{block}\n{notice}" if notice else block


def block_tokens(counter: TokenCounter, record: SummaryRecord,
                 previous: SummaryRecord | None, note: str) -> int:
    """``counter.text(summary_block(record))`` for a truncation record whose text is
    ``previous``'s, a blank line and ``note``: the block split around the note and counted
    by :func:`joined_tokens`. A tool chain that outgrows the window truncates on every
    call, each with a new note after the same previous summary: the summary was counted
    whole on every call (a third of such a call)."""
    block = summary_block(record)
    if previous is None or not tokens_joined.JOINED:
        return counter.text(block)
    found = _BLOCK_HEADS.get(id(previous))
    if found is not None and found[0] is previous:
        head = found[1]  # the same string: its hash is not computed again
    else:
        head = f"{SUMMARY_INTRO}\n{SUMMARY_OPEN}\n{previous.text}\n\n"
        if len(_BLOCK_HEADS) >= _HEADS_KEEP:
            _BLOCK_HEADS.clear()
        _BLOCK_HEADS[id(previous)] = (previous, head)
    # split where the block shows the note (a summary with leading blanks is stripped
    # there: no such split, counted whole)
    if not (block.startswith(head) and block.startswith(note, len(head))):
        return counter.text(block)
    return joined_tokens(counter, head, note, block[len(head) + len(note):])


_HEADS_KEEP = 64  # a few per live session
_BLOCK_HEADS: dict[int, tuple[SummaryRecord, str]] = {}  # id(previous) -> it, its head


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
                   else decision.apply(message))
    return out


def cheap_savings(decisions: Mapping[int, CheapDecision], start: int, end: int) -> int:
    """Tokens saved by decisions on log positions ``[start, end)``."""
    return sum(d.saved_tokens for i, d in decisions.items() if start <= i < end)


def assemble(system_prompt: str, summary: SummaryRecord | None, history: Sequence[Message],
             *, placement: str = "system", notice: str = "") -> list[Message]:
    """The message list to send, system message first (if any)."""
    out: list[Message] = []
    system = system_prompt
    lead: Message | None = None
    if summary is not None:
        block = summary_block(summary, notice)
        # A cut inside a long turn leaves the history starting at an assistant
        # message; Anthropic and Gemini need a user message first, so the
        # summary then leads as that user message.
        if summary_joins(history, placement):
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


def calibrated_total(regions: Regions, state: SessionState, covered_end: int,
                     prior: float = 1.0, family: str = "") -> int:
    """Estimated prompt tokens of this request, hybrid where possible.

    If the provider reported usage for an earlier request of the *same* view
    (same version: no compaction or edit since), the estimate is that
    report plus the calibrated heuristic for what was added since; otherwise
    the heuristic times the session's calibration ratio, which survives
    compaction. ``prior`` (:func:`shared.core.calibration.prior_ratio`) stands for the
    ratio until a report has set it, and when the reports were of another tokenizer family
    than ``family``, the request's (a fallback from one provider to another): then neither
    their ratio nor their anchor describes this request.
    """
    if family and state.calibration_family and family != state.calibration_family:
        return _calibration(prior, 0).apply(regions.total)
    ratio = state.calibration_ratio if state.calibration_samples else prior
    calibration = _calibration(ratio, state.calibration_samples)
    reported, estimated, end = state.anchor_reported, state.anchor_estimated, state.anchor_end
    if reported is not None and estimated is not None and end is not None \
            and state.anchor_version == state.version and end <= covered_end:
        return hybrid_estimate(reported, estimated, regions.total, calibration)
    return calibration.apply(regions.total)


@functools.lru_cache(maxsize=256, typed=True)
def _calibration(ratio: float, samples: int) -> Calibration:
    """A session's calibration, checked once per figures seen (every prepare estimates
    with it; an invalid one raises every time, as it is not cached)."""
    return Calibration(ratio=ratio, samples=samples)


def view_estimate(state: SessionState, summary: SummaryRecord | None, history_tokens: int,
                  cheap_saved: int, length: int, *, overhead: int, system: int | None = None,
                  tools: int | None = None, extra: int = 0,
                  notice: int = 0, prior: float = 1.0,
                  family: str = "", framing: int = SUMMARY_FRAMING) -> tuple[Regions, int]:
    """The one estimate of a view's prompt tokens, for the guard and the workers alike.

    ``history_tokens``: store-counted tokens of ``log[watermark:length]``;
    ``cheap_saved``: what the placeholders on those positions save; ``extra``:
    messages not recorded yet (the guard's pending turn). ``system`` and
    ``tools``: the request's own figures when known (the guard), else the
    ones the session last recorded (a worker). ``notice``: tokens of the recall
    notice the request's summary carries. ``prior``: the model's ratio before any usage
    report (:func:`shared.core.calibration.prior_ratio`); ``family``: the request's
    tokenizer family (:func:`shared.core.calibration.model_family`); ``framing``: what the
    summary's placement costs (:func:`summary_framing`). Returns the regions and the
    calibrated (hybrid, when a usage anchor holds) total.
    """
    regions = Regions(
        system=state.system_tokens if system is None else system,
        summary=summary_region(summary, notice, framing),
        tools=state.tool_tokens if tools is None else tools,
        history=history_tokens - cheap_saved + extra,
        overhead=overhead)
    return regions, calibrated_total(regions, state, length, prior, family)


from shared.core.pairs import PAIRS_START, PairScan, pairs_intact, scan_pairs  # noqa: E402
from shared.core.viewcache import CachedView, ViewCache, decode_view  # noqa: E402

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
    "block_tokens",
    "calibrated_total",
    "cheap_savings",
    "decode_view",
    "pairs_intact",
    "scan_pairs",
    "summary_block",
    "summary_framing",
    "summary_joins",
    "summary_region",
    "view_estimate",
]
