"""The guard's decisions, sans-I/O: a session snapshot and a request in, a plan out.

Every shell (the sync :class:`shared.guard.ContextGuard`, the async
:class:`shared.guard.AsyncContextGuard`, framework adapters) reads the
session, calls :func:`plan_view`, performs the plan's writes in order and
finishes the view with what they returned. Nothing here touches Redis or a
provider, so every edge case is a unit test.

- budget: ``system + summary + tools + history since watermark + pending +
  reserve`` against the window, one estimate (:func:`shared.core.view.view_estimate`);
- cheap stages when the trigger is reached: planned only over stored messages
  the last plan had not seen (a tool chain's prepares re-plan nothing);
- emergency truncation when the view does not fit (or recovery forces it),
  recorded as a summary through the store's compare-and-swap;
- what the provider's usage teaches (calibration, silent truncation) is
  :mod:`shared.core.usage_learning`'s, about the :class:`Sent` a plan describes.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.core.budget import BudgetReport, check_budget, ensure_reducible
from shared.core.calibration import (
    model_family,
    prior_ratio,
)
from shared.core.cheap import CheapScan
from shared.core.chunks import Chunks, Peeked, concat
from shared.core.config import CompactionPolicy
from shared.core.messages import Message
from shared.core.pairs import PairScan, pairs_intact, scan_pairs
from shared.core.prepared import PreparedView, ViewReport
from shared.core.recall_tool import notice as recall_notice
from shared.core.records import CheapDecision, SessionState, SummaryRecord
from shared.core.renamed import RenamedTurn, known_renamed, renamed_turn
from shared.core.repair import repair_tool_pairs, without_conversation_start
from shared.core.repaired import RepairedView, repair_added, repaired_view
from shared.core.tokens import TokenCounter
from shared.core.truncation import TruncationInput
from shared.core.usage_learning import Sent
from shared.core.view import (
    SUMMARY_FRAMING,
    Regions,
    assemble,
    block_tokens,
    summary_framing,
    summary_region,
    view_estimate,
)
from shared.core.viewcache import CachedView, KnownCounts, placeholder
from shared.core.wireview import carry, raw_items

TRUNCATION_HEADROOM = 0.95  # emergency truncation fills at most this share of the budget


Counted = dict[int, tuple[Message, int]]  # id -> (message, its tokens by the base counter)


class _Memo:
    """Counts exactly as :class:`KnownCounts` gives them (the store's count of a message it
    knows, else the base counter's), remembering what the base counter counted, by message
    object: the next build over the same stored messages (the next snapshot: they survive
    a moved watermark) does not count them again."""

    def __init__(self, base: TokenCounter, known: TokenCounter, memo: Counted) -> None:
        self.base, self.memo = base, memo
        self.known: dict[int, int] = known.known if isinstance(known, KnownCounts) else {}
        self.counted: Counted = {}

    def text(self, text: str) -> int:
        return self.base.text(text)

    def message(self, message: Message) -> int:
        found = self.known.get(id(message))
        if found is not None:
            return found
        kept = self.memo.get(id(message))
        tokens = kept[1] if kept is not None and kept[0] is message else self.base.message(message)
        self.counted[id(message)] = (message, tokens)
        return tokens

    def messages(self, messages: Sequence[Message]) -> int:
        return self.base.messages([]) + sum(self.message(m) for m in messages)

    def tools(self, tools: Sequence[Mapping[str, Any]]) -> int:
        return self.base.tools(tools)


@dataclass(frozen=True, slots=True)
class TurnCut:
    """A truncation input over a stored view (``applied``, by identity) and the pending
    turn so far (``extra``): the turn's next truncating call extends it with its new
    messages instead of walking the whole history again."""

    applied: Sequence[Message]
    extra: tuple[Message, ...]
    source: TruncationInput
    counted: Counted = field(default_factory=dict)  # what its build counted (see _Memo)
    # id -> (message, its wire forms): the kept messages of the turn's truncated views,
    # converted once across its calls (shared by the cuts it is extended into)
    slots: dict[int, tuple[Message, dict[str, Any]]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Request:
    """One call's fixed parts, already counted by the shell (cached per prompt/tools)."""

    session_id: str
    system_prompt: str
    model: str
    window: int
    reserve: int
    limits_source: str
    system_tokens: int
    tool_tokens: int
    overhead: int
    summary_join: int  # tokens of the line break that joins a summary to the system prompt
    extra: Sequence[Message] = ()
    extra_tokens: Sequence[int] = ()
    extra_wire: Sequence[dict[str, Any]] = ()  # per pending message: its wire forms, kept
    # the pair scan of ``extra[:k]`` from the snapshot's scan, as an earlier call of the
    # turn left it: (that scan, k); the scan then resumes over the new messages only
    extra_scan: tuple[PairScan, int] | None = None
    # the truncation input an earlier truncating call of the turn left: extended, not rebuilt
    extra_cut: TurnCut | None = None
    # the pending turn as an earlier call of the turn renamed it (repeated call ids)
    extra_renamed: RenamedTurn | None = None
    counted: Counted | None = None  # what the session's last truncation build counted
    # the state's learned window with no recorded owner is plausible for the state's
    # model (SessionState.learned_for, judged by the shell): when the session moves on
    # to another model it is pinned to that one, else dropped
    unowned_kept: bool = True
    force_ratio: float | None = None
    recall: bool = False  # the request offers the ``recall`` tool: the summary says so


@dataclass(slots=True)
class Plan:
    """The view, and the writes the shell performs (in this order) before returning it."""

    view: PreparedView
    sent: Sent
    figures: dict[str, Any] | None = None  # update_state, when the request figures changed
    cheap: list[CheapDecision] = field(default_factory=list)  # record_cheap
    truncation: SummaryRecord | None = None  # commit_summary at ``version``; lost: rebuild
    version: int = 0
    clear_recover_next: bool = False
    enqueue: bool = False
    force: bool = False
    log_tokens: int = 0  # the request with the whole log instead of the view (metrics)
    extra_scan: PairScan | None = None  # the pending turn's scan, for the next call's resume
    extra_cut: TurnCut | None = None  # the truncation input, for the next call's resume
    extra_renamed: RenamedTurn | None = None  # the pending turn renamed, for the next call

    def finish(self, enqueued: bool, elapsed_ms: float) -> PreparedView:
        """The view, its report completed. The report was built by :func:`plan_view` for
        this plan alone and nobody holds it yet, so it is completed in place (a copy of
        both models cost a fifth of a warm prepare)."""
        report = self.view.report
        report.__dict__.update(enqueued=enqueued, pending_job=report.pending_job or enqueued,
                               elapsed_ms=elapsed_ms)
        return self.view


def check(window: int, reserve: int, regions: Regions, estimated: int, newest: int,
          policy: CompactionPolicy) -> BudgetReport:
    fixed = regions.system + regions.summary + regions.tools + regions.overhead
    return check_budget(window=window, reserve=reserve, system=regions.system,
                        summary=regions.summary, tools=regions.tools + regions.overhead,
                        history=max(0, estimated - fixed), newest=newest,
                        trigger_ratio=policy.trigger_ratio, target_ratio=policy.target_ratio)


def newest_tokens(extra: Sequence[Message], tokens: Sequence[int]) -> int:
    """Tokens of the newest message when it is a *user* message (the floor counts it)."""
    return tokens[-1] if extra and tokens and extra[-1].role == "user" else 0


def _figures(state: SessionState, req: Request) -> dict[str, Any] | None:
    figures = {"system_tokens": req.system_tokens, "tool_tokens": req.tool_tokens,
               "max_tokens": req.reserve, "model": req.model, "window": req.window}
    current = {"system_tokens": state.system_tokens, "tool_tokens": state.tool_tokens,
               "max_tokens": state.max_tokens, "model": state.model, "window": state.window}
    if figures == current:
        return None
    if state.unowned_learned() and state.model != req.model:
        # a window learned before ``learned_model`` was stored belongs to the model the
        # state names: named, before that field moves on to another model; dropped where
        # it cannot be that model's (another model's limit an older guard carried over a
        # switch: left unowned, it would pass to the next model)
        figures.update({"learned_model": state.model} if req.unowned_kept
                       else {"learned_window": 0})
    return figures


def _cheap(snap: CachedView, policy: CompactionPolicy,
           counter: TokenCounter) -> tuple[list[CheapDecision], CachedView]:
    """New cheap decisions, planned only when stored messages changed since the last plan.

    Returns them and the snapshot with their placeholders applied.
    """
    if snap.planned_end == snap.end:
        return [], snap
    plan = _cheap_plan(snap, policy, counter)
    snap.planned_end = snap.end  # the entry is the shell's; no other reader depends on it
    if not plan:
        return [], snap
    cheap = {**snap.cheap, **{d.index: d for d in plan}}
    # each replaced message made alone where its chunk was not read (Chunks.peek): a
    # placeholder in an old chunk of a cold view must not decode its 512 messages
    changes = {d.index - snap.start: placeholder(snap.history.peek(d.index - snap.start), d)
               for d in plan}
    applied = snap.applied.replace(changes)
    wire = carry(snap.wire, 0, changes, [], history=applied) if snap.wire else {}
    cheap_raw = {**snap.cheap_raw, **{d.index: d.model_dump_json() for d in plan}}
    return plan, dataclasses.replace(snap, cheap=cheap, cheap_raw=cheap_raw, applied=applied,
                                     repaired=None,
                                     wire=wire,
                                     saved=snap.saved + sum(d.saved_tokens for d in plan))


def _cheap_plan(snap: CachedView, policy: CompactionPolicy,
                counter: TokenCounter) -> list[CheapDecision]:
    """The decisions the messages stored since the last plan made possible: the view's
    :class:`~shared.core.cheap.CheapScan` reads only those (from scratch after the
    watermark moved or the log was edited: a new cached view)."""
    scan = snap.cheap_scan
    if scan is None or not scan.fits(snap.start, snap.end, policy):
        scan = snap.cheap_scan = CheapScan.for_policy(snap.start, policy)
    counts = snap.counts if snap.counts is not None and len(snap.counts) == len(snap.history) \
        else None
    with scan.lock:
        if scan.end > snap.end:  # another call read past this (older) entry: its own scan
            scan = snap.cheap_scan = CheapScan.for_policy(snap.start, policy)
        at = scan.end - snap.start  # (stored JSON where not decoded: no chunk decoded for it)
        scan.advance(raw_items(snap.history, at), counts[at:] if counts is not None else None,
                     counter)
        return [d for d in scan.decide(Peeked(snap.history), snap.cheap, counter)
                if d.index not in snap.cheap]


def _scan_pending(extra: list[Message], snap: CachedView,
                  known: tuple[PairScan, int] | None) -> PairScan:
    """The pair scan of the pending turn from the stored view's, resumed where an earlier
    call of the same turn stopped (``known``: its state after ``extra[:k]``)."""
    if known is not None and 0 < known[1] <= len(extra) and known[0].ok:
        return scan_pairs(extra[known[1]:], known[0])
    return scan_pairs(extra, snap.scan)


def plan_view(snap: CachedView, req: Request, policy: CompactionPolicy, counter: TokenCounter,
              *, proactive: bool | None = None) -> tuple[Plan, CachedView]:
    """The plan for one prepare (or recover) of ``snap`` and the snapshot to cache after it."""
    state, w = snap.state, snap.start
    proactive = policy.proactive if proactive is None else proactive
    given = list(req.extra)
    renamed = known_renamed(given, snap, req.extra_renamed)
    pending_scan = renamed.scan if renamed is not None else _scan_pending(given, snap,
                                                                          req.extra_scan)
    if renamed is None and not pending_scan.ok and any(
            m.tool_calls or m.role == "tool" for m in given):
        # new, unique ids scan ok; results of the stored view's renamed calls follow them
        renamed = renamed_turn(given, snap, None, req.extra_wire)
    extra = given if renamed is None else list(renamed.renamed)
    extra_tokens = list(req.extra_tokens)
    extra_wire = (renamed.slots if renamed is not None else
                  req.extra_wire if len(req.extra_wire) == len(extra) else ())
    newest = newest_tokens(extra, extra_tokens)
    figures = _figures(state, req)
    notice, notice_tokens = _notice(snap.summary, req, counter)
    prior, family = prior_ratio(req.model, counter), model_family(req.model)

    # a view whose pairs need repair sends the repair's placeholder results too: repaired
    # before the budget is checked, so that it counts them
    needs_repair = not (pending_scan.intact if renamed is None else renamed.scan.intact)
    mended = _mended(snap, extra, counter) if needs_repair else None

    def estimate(saved: int) -> tuple[Regions, int, BudgetReport]:
        added = mended[3] if mended is not None else 0
        framing = summary_framing(req.summary_join, req.system_prompt,
                                  _first(snap.applied, extra), policy.summary_placement)
        regions, est = view_estimate(state, snap.summary, snap.history_tokens, saved,
                                     snap.end, overhead=req.overhead, system=req.system_tokens,
                                     tools=req.tool_tokens, extra=sum(extra_tokens) + added,
                                     notice=notice_tokens, prior=prior, family=family,
                                     framing=framing)
        return regions, est, check(req.window, req.reserve, regions, est, newest, policy)

    regions, estimated, report = estimate(snap.saved)
    decisions: list[CheapDecision] = []
    enqueue = False
    if proactive and report.should_compact:
        decisions, snap = _cheap(snap, policy, counter)
        if decisions:
            if needs_repair:  # placeholders changed the stored messages: repaired again
                mended = _mended(snap, extra, counter)
            regions, estimated, report = estimate(snap.saved)
        enqueue = True

    history: Sequence[Message] = ()  # the truncated or repaired history, where one is made
    summary = snap.summary
    truncation: SummaryRecord | None = None
    truncated, dropped, note, dropped_prefix = False, 0, "", 0
    cut: TurnCut | None = None
    over = not report.within_budget and (proactive or req.force_ratio is not None)
    if over or req.force_ratio is not None:
        ensure_reducible(report)
        # One ratio sizes the cut and re-estimates the result.
        ratio = max(estimated / regions.total if regions.total else 1.0, state.calibration_ratio)
        budget = _history_budget(report, regions, math.ceil(regions.total * ratio),
                                 req.window, req.force_ratio)
        cut = _cut_input(req.extra_cut, snap, extra, extra_tokens, counter, req.counted)
        result = cut.source.cut(budget, counter, drop_fraction=policy.emergency_drop_fraction)
        history, dropped, note, truncated = result.messages, result.dropped, result.note, True
        dropped_prefix = result.dropped_prefix
        # stored system messages the cut kept at its head stand before what it dropped:
        # the watermark cannot pass them (those messages would leave every later view)
        summary, truncation = _truncation(snap, counter,
                                          0 if cut.source.head else result.dropped_prefix, note)
        notice, notice_tokens = _notice(summary, req, counter)
        enqueue = True
        # the kept messages' tokens, as the cut counted them (clipped ones included)
        kept_tokens = result.tokens_after
        if summary is not None:  # it leads as the user message, not repair's opening one
            history, opening = without_conversation_start(history)
            kept_tokens -= counter.message(opening) if opening is not None else 0
        # placed as the history it now leads asks (a history repair reshapes is not known
        # yet: the larger framing)
        framing = (summary_framing(req.summary_join, req.system_prompt, history[:1],
                                   policy.summary_placement)
                   if cut.source.repaired is cut.source.messages else SUMMARY_FRAMING)
        regions = Regions(regions.system, summary_region(summary, notice_tokens, framing),
                          regions.tools, kept_tokens, regions.overhead)
        estimated = math.ceil(regions.total * ratio - 1e-9)
        report = check(req.window, req.reserve, regions, estimated, newest, policy)

    # a cut of an input that needed no repair keeps whole units: its pairs hold (a property
    # test holds it), without a walk of what it kept on every call of a turn it cuts
    intact = ((cut is not None and cut.source.repaired is cut.source.messages)
              or pairs_intact(history) if truncated else not needs_repair)
    incremental = not truncated and intact
    repaired: RepairedView | None = None
    tail: list[Message] | None = None
    if mended is not None and not truncated:  # the stored view's repair kept: only the rest
        repaired, tail, whole, _ = mended
        if whole is not None:
            history = whole
    if tail is not None and repaired is not None:
        history = concat(repaired.messages, tail)
    elif not intact and truncated:
        history = repair_tool_pairs(history, opened=summary is not None)
    messages: Sequence[Message]
    head: Sequence[Message] = ()
    head_wire: dict[str, Any] | None = None
    if incremental:  # the head alone; the history is shared with the cache, not copied
        head, head_wire = _head(req.system_prompt, summary, _first(snap.applied, extra),
                                policy.summary_placement, notice)
        messages = concat(head, snap.applied, extra)
    elif tail is not None and repaired is not None:  # the same over the kept repair
        head, head_wire = _head(req.system_prompt, summary, repaired.messages[:1] or tail[:1],
                                policy.summary_placement, notice)
        messages = concat(head, repaired.messages, tail)
    elif truncated and cut is not None:  # what is kept converted once per turn, not per call
        head, head_wire = _head(req.system_prompt, summary, history[:1],
                                policy.summary_placement, notice)
        messages = concat(head, history)
    else:
        messages = Chunks.of(assemble(req.system_prompt, summary, history,
                                      placement=policy.summary_placement, notice=notice))
    report_ = ViewReport.built(
        req.session_id, req.model, req.limits_source, report, estimated,
        summary.watermark if truncated and summary is not None else w, state.version,
        snap.end, state.summary_kind, len(snap.cheap), truncated, dropped, note, False,
        snap.pending, req.force_ratio is not None, False, 0.0)
    if incremental:
        view = PreparedView.built(messages, report_, head=head, head_wire=head_wire,
                                  wire=snap.wire, applied=snap.applied, extra=extra,
                                  extra_wire=extra_wire)
    elif tail is not None and repaired is not None:
        view = PreparedView.built(messages, report_, head=head, head_wire=head_wire,
                                  wire=repaired.wire, applied=repaired.messages, extra=tail)
    elif truncated and cut is not None:
        view = PreparedView.built(
            messages, report_, head=head, head_wire=head_wire, wire={}, applied=Chunks(),
            extra=history, extra_wire=_truncated_slots(history, snap, extra, extra_wire, cut,
                                                       dropped_prefix))
    else:
        view = PreparedView.built(messages, report_)
    sent = Sent(regions.total, estimated, snap.end + len(extra), req.window, state.version, state,
                req.model)
    return Plan(view=view, sent=sent, figures=figures, cheap=decisions, truncation=truncation,
                version=state.version, clear_recover_next=req.force_ratio is not None,
                enqueue=enqueue, force=truncated,
                log_tokens=(req.system_tokens + req.tool_tokens + req.overhead + snap.total
                            + sum(extra_tokens)),
                extra_scan=pending_scan if renamed is None and pending_scan.ok else None,
                extra_cut=cut, extra_renamed=renamed), snap


def _first(applied: Sequence[Message], extra: Sequence[Message]) -> Sequence[Message]:
    """``applied[:1] or extra[:1]``: the message the view's history starts with, read by
    index (a slice of the cached view walks its chunks, twice a call)."""
    return (applied[0],) if len(applied) else extra[:1]


def _mended(snap: CachedView, extra: list[Message], counter: TokenCounter,
            ) -> tuple[RepairedView, list[Message] | None, list[Message] | None, int]:
    """The repair of ``applied + extra``: the stored view's kept repair and its
    continuation (or, where it cannot continue, the whole repaired), and the tokens the
    repair added. A summary before the history leads as its user message (assemble):
    repair puts no "the conversation opens here" message first then."""
    opened = snap.summary is not None
    repaired = snap.repaired = repaired_view(snap.repaired, snap.applied, opened=opened,
                                             counter=counter)
    tail = repaired.continued(snap.applied, extra)
    if tail is not None:
        rest = [*snap.applied[repaired.covers:], *extra]
        return repaired, tail, None, repaired.added + repair_added(rest, tail, counter)
    given = list(concat(snap.applied, extra))
    whole = repair_tool_pairs(given, opened=opened)
    return repaired, None, whole, repair_added(given, whole, counter)


def _cut_input(known: TurnCut | None, snap: CachedView, extra: list[Message],
               extra_tokens: list[int], counter: TokenCounter,
               counted: Counted | None = None) -> TurnCut:
    """The truncation input of ``applied + extra``: the one an earlier call of the turn
    left, extended by the messages added since (same stored view, same first pending
    messages), else built over the whole (the store's counts for stored messages)."""
    if known is not None and len(known.extra) <= len(extra):
        k = len(known.extra)
        source = (known.source if known.applied is snap.applied
                  else _dropped(known, snap.applied))
        if source is not None and all(map(operator.is_, known.extra, extra)):
            grown = source.extend(extra[k:], extra_tokens[k:])
            if grown is not None:
                return TurnCut(snap.applied, tuple(extra), grown, known.counted, known.slots)
    history = list(concat(snap.applied, extra))
    memo = _Memo(counter, KnownCounts.of(counter, snap, extra, extra_tokens, applied=True),
                 counted or {})
    source = TruncationInput.build(history, memo)
    slots = known.slots if known is not None and len(known.slots) < SLOTS_KEEP else {}
    return TurnCut(snap.applied, tuple(extra), source, memo.counted, slots)


SLOTS_KEEP = 4096  # kept conversions a turn's truncations carry to its next rebuilt cut


def _truncated_slots(kept: Sequence[Message], snap: CachedView, extra: Sequence[Message],
                     extra_wire: Sequence[dict[str, Any]], cut: TurnCut,
                     dropped: int) -> list[dict[str, Any]]:
    """A wire-form slot per message of a truncated view (see
    :func:`shared.core.wireview.convert_kept`): the pending message's own, the stored
    message's OpenAI form from the cached view, or what an earlier truncation of the turn
    made; a clipped or repaired message gets a new one. Most of a truncated view is the
    newest part of the last one: each message is converted once per turn, not per call."""
    pending = ({id(m): w for m, w in zip(extra, extra_wire, strict=True)}
               if len(extra_wire) == len(extra) else {})
    stored = snap.wire.get("openai")
    applied = snap.applied
    if stored is not None and len(stored) != len(applied):
        stored = None
    out: list[dict[str, Any]] = []
    at = dropped  # where the kept stored messages start, when none was clipped
    size = len(applied)
    for m in kept:
        # the stored message it is, if any: the next one, or the one after (a clipped copy
        # stands for the one before)
        here: int | None = None
        if 0 <= at < size and applied[at] is m:
            here = at
        elif 0 <= at + 1 < size and applied[at + 1] is m:
            here = at + 1
        if here is not None:
            at = here + 1
        found = cut.slots.get(id(m))
        slot = found[1] if found is not None and found[0] is m else pending.get(id(m))
        if slot is None:
            slot = {"openai": stored[here]} if stored is not None and here is not None else {}
        cut.slots[id(m)] = (m, slot)
        out.append(slot)
    return out


def _dropped(known: TurnCut, applied: Sequence[Message]) -> TruncationInput | None:
    """``known``'s input without the stored messages a moved watermark left behind (the
    turn's own truncation committed), when ``applied`` is the rest of ``known.applied``
    (the same objects): the turn's next call does not build it again."""
    gone = len(known.applied) - len(applied)
    if gone <= 0 or not all(map(operator.is_, applied, known.applied[gone:])):
        return None
    return known.source.drop(gone)


_HEADS: dict[tuple[str, int, str, str, bool],
             tuple[SummaryRecord | None, list[Message], dict[str, Any]]] = {}
HEADS_KEEP = 64  # heads kept (system prompt, summary, notice): a few per live session


def _head(system_prompt: str, summary: SummaryRecord | None, first: Sequence[Message],
          placement: str, notice: str) -> tuple[list[Message], dict[str, Any]]:
    """The messages before the history (system message, a summary leading as a user
    message) and a slot for their wire forms, made once per system prompt, summary and
    notice: the calls of a tool chain share them (messages are immutable)."""
    lead = bool(first) and first[0].role != "user"
    key = (system_prompt, id(summary), notice, placement, lead)
    found = _HEADS.get(key)
    if found is not None and found[0] is summary:
        return found[1], found[2]
    head = assemble(system_prompt, summary, first, placement=placement,
                    notice=notice)[: -1 if first else None]
    if len(_HEADS) >= HEADS_KEEP:
        _HEADS.clear()
    _HEADS[key] = (summary, head, {})
    return head, _HEADS[key][2]


def _notice(summary: SummaryRecord | None, req: Request,
            counter: TokenCounter) -> tuple[str, int]:
    """The recall notice for this request's summary, and its tokens (none without the
    tool, or without a range summarized away)."""
    if not req.recall or summary is None or summary.watermark <= 0:
        return "", 0
    text = recall_notice(summary.watermark)
    return text, counter.text(text) + 1  # the line break before it


def _history_budget(report: BudgetReport, regions: Regions, estimated: int, window: int,
                    force_ratio: float | None) -> int:
    """History tokens (heuristic units) that fit: the budget, or the recovery target."""
    ratio = estimated / regions.total if regions.total else 1.0
    fixed = regions.system + regions.summary + regions.tools + regions.overhead
    room = int(report.input_budget * TRUNCATION_HEADROOM) - int(fixed * ratio)
    if force_ratio is not None:
        room = min(room, int(window * force_ratio) - int(fixed * ratio))
    return max(1, int(room / max(ratio, 1e-6)))


def _truncation(snap: CachedView, counter: TokenCounter, dropped: int,
                note: str) -> tuple[SummaryRecord | None, SummaryRecord | None]:
    """The truncation as a summary record, and the record to commit (None: nothing
    gone from the start, the note rides along unrecorded). A cut that dropped and clipped
    nothing (a recovery forced on a view that already fits) leaves the summary as it was:
    an empty one would tell the model of a compaction that never happened."""
    previous, state = snap.summary, snap.state
    logged = max(0, min(dropped, snap.end - state.watermark))
    if not logged and not note:
        return previous, None
    text = (previous.text + "\n\n" if previous else "") + note
    record = SummaryRecord(
        watermark=state.watermark + logged, kind="truncation", text=text,
        ledger=previous.ledger if previous else "",
        ledger_json=previous.ledger_json if previous else None,
        tokens=0, covers_from=state.watermark, source_version=state.version,
        stages=["emergency_truncation"])
    record = record.model_copy(update={"tokens": block_tokens(counter, record, previous, note)})
    return record, (record if logged else None)


__all__ = ["TRUNCATION_HEADROOM", "Plan", "Request", "TurnCut", "check", "newest_tokens",
           "plan_view"]
