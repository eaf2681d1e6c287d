"""The agent's hot path: a synchronous guard that never calls an LLM.

``prepare`` reads the session in one atomic Redis call, builds the view
(summary + messages since the watermark + pending messages), checks the
full budget and, when the request would not fit, truncates the view
without an LLM, records that truncation through the store's
compare-and-swap (so the next call starts from it) and asks a worker to
replace it with a real summary. ``record_turn`` appends and enqueues,
coalesced. ``recover`` handles a provider's context-overflow error: learn the
stated limit, compact hard, return a view for one retry.

Cost on the hot path: one Redis round trip per ``prepare`` (two more only
when it writes: new figures, cheap decisions, a truncation), and Python work
that does not grow with the history. The guard keeps each session's decoded
view (:class:`shared.core.view.ViewCache`) and asks the store only for what was
appended since, so a 10,000-message session costs what a 100-message one
does. ``record_turn`` is one round trip (append, pending flag and state in
one script) plus the calibration write and the publish.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import logging
import math
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from shared.core.budget import BudgetReport, check_budget, ensure_reducible
from shared.core.calibration import Calibration
from shared.core.cheap import plan_cheap_stages
from shared.core.config import CompactionPolicy
from shared.core.errors import InvalidInput, StoreUnavailable
from shared.core.limits import LimitBook, ModelLimits, model_limits, output_reserve
from shared.core.messages import Message, validate_messages
from shared.core.overflow import is_context_overflow, parse_overflow
from shared.core.prepared import PreparedView, ViewReport
from shared.core.records import AppendResult, SessionState, SummaryRecord, ViewData
from shared.core.repair import repair_tool_pairs
from shared.core.tokens import DEFAULT_COUNTER, TokenCounter
from shared.core.truncation import emergency_truncate
from shared.core.usage import reported_prompt_tokens
from shared.core.view import (
    PairScan,
    Regions,
    ViewCache,
    apply_cheap,
    assemble,
    calibrated_total,
    cheap_savings,
    decode_view,
    pairs_intact,
    scan_pairs,
    summary_block,
)
from shared.enqueue import Enqueuer, NullEnqueuer, request_summary
from shared.store.keys import validate_session_id
from shared.store.sessions import SessionStore

log = logging.getLogger(__name__)
TRUNCATION_HEADROOM = 0.95  # emergency truncation fills at most this share of the budget
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class _Sent:
    """The last view prepared for a session: what the provider's usage will describe."""

    heuristic: int  # estimated tokens (heuristic units) of the request
    end: int  # log length the request covered
    window: int  # the context window it was sized for (learned limits included)
    state: SessionState  # the session as the view was built from it


def _check_request(system_prompt: object, tools: object) -> None:
    """The caller's fixed request parts, checked before anything is read or hashed."""
    if not isinstance(system_prompt, str):
        raise InvalidInput(f"expected a string, got {type(system_prompt).__name__}",
                           field="system_prompt")
    try:
        system_prompt.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput("is not valid unicode (lone surrogate)",
                           field="system_prompt") from None
    if tools is None:
        return
    if not isinstance(tools, (list, tuple)):
        raise InvalidInput(f"expected a list of tool definitions, got {type(tools).__name__}",
                           field="tools")
    for i, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            raise InvalidInput("expected an object", field=f"tools[{i}]")


class ContextGuard:
    """Synchronous, LLM-free context guard for one tenant's sessions.

    ``view_cache``: the decoded views it keeps between calls (default: 256
    sessions, 50,000 messages in all); ``ViewCache(0, 0)`` turns caching off.
    One guard per process is the intended use; it is thread-safe.
    """

    def __init__(self, store: SessionStore, enqueuer: Enqueuer | None = None, *,
                 policy: CompactionPolicy | None = None,
                 overrides: Mapping[str, ModelLimits | int] | None = None,
                 counter: TokenCounter | None = None,
                 view_cache: ViewCache | None = None) -> None:
        self.store = store
        self.enqueuer = enqueuer or NullEnqueuer()
        self.policy = policy or CompactionPolicy()
        self.overrides = dict(overrides or {})
        self.counter = counter or store.counter or DEFAULT_COUNTER
        self.limits = LimitBook()
        self.views = view_cache if view_cache is not None else ViewCache()
        self._fixed_cache: dict[str, int] = {}
        self._tools_seen: tuple[Any, int] | None = None  # (a private copy of tools, tokens)
        self._limits_seen: dict[tuple[str, tuple[tuple[str, int], ...]], ModelLimits] = {}
        self._sent: dict[str, _Sent] = {}  # the last view prepared, per session

    # -- figures -----------------------------------------------------------------
    def _cached(self, key: str, compute: Callable[[], int]) -> int:
        value = self._fixed_cache.get(key)
        if value is None:
            if len(self._fixed_cache) > 256:
                self._fixed_cache.clear()
            value = self._fixed_cache[key] = compute()
        return value

    def _system_tokens(self, system_prompt: str) -> int:
        key = "s" + hashlib.blake2b(system_prompt.encode(), digest_size=16).hexdigest()
        return self._cached(key, lambda: self.counter.message(
            Message(role="system", content=system_prompt)) if system_prompt else 0)

    def _tool_tokens(self, tools: Sequence[Mapping[str, Any]] | None) -> int:
        if not tools:
            return 0
        seen = self._tools_seen
        if seen is not None and seen[0] == tools:  # the same definitions as last call
            return int(seen[1])
        try:
            raw = json.dumps(tools, sort_keys=True, default=str)
        except (ValueError, RecursionError) as exc:
            raise InvalidInput(f"not serializable as JSON: {str(exc)[:200]}",
                               field="tools") from None
        key = "t" + hashlib.blake2b(raw.encode(), digest_size=16).hexdigest()
        tokens = self._cached(key, lambda: self.counter.tools(list(tools)))
        # A private copy: the caller may mutate its list in place between calls.
        self._tools_seen = (copy.deepcopy(list(tools)), tokens)
        return tokens

    def model_limits(self, model: str, state: SessionState | None = None) -> ModelLimits:
        learned = dict(self.limits.as_mapping())
        if state is not None and state.learned_window and state.model == model:
            learned.setdefault(model, state.learned_window)
        if not isinstance(model, str):  # model_limits names the bad field
            return model_limits(model, overrides=self.overrides or None, learned=learned or None)
        key = (model, tuple(sorted(learned.items())))
        found = self._limits_seen.get(key)
        if found is None:
            found = model_limits(model, overrides=self.overrides or None,
                                 learned=learned or None)
            if len(self._limits_seen) > 256:
                self._limits_seen.clear()
            self._limits_seen[key] = found
        return found

    def load(self, session_id: str) -> ViewData:
        """The session's view, read incrementally against the cached one (one round trip)."""
        return self._read(session_id)[0]

    def _read(self, session_id: str) -> tuple[ViewData, PairScan]:
        validate_session_id(session_id)  # before it is used as a cache key
        cached = self.views.get(session_id)
        raw = self.store.read_view(session_id, cached.cursor if cached is not None else None)
        data, scan, entry = decode_view(raw, cached)
        self.views.put(session_id, entry)
        return data, scan

    # -- prepare -------------------------------------------------------------------
    def prepare(self, session_id: str, system_prompt: str = "",
                tools: Sequence[Mapping[str, Any]] | None = None,
                max_tokens: int | None = None, model: str = "gpt-4o", *,
                pending: Sequence[Message | Mapping[str, Any]] = (),
                fallback_messages: Sequence[Message | Mapping[str, Any]] | None = None,
                ) -> PreparedView:
        """The view to send now, with its budget report.

        ``pending`` are messages of the current turn not yet recorded (the
        new user message, say). ``fallback_messages``: when Redis is down,
        build a locally truncated view from these instead of raising.
        """
        started = time.perf_counter()
        _check_request(system_prompt, tools)
        extra = validate_messages(pending, prefix="pending")
        try:
            data, scan = self._read(session_id)
        except StoreUnavailable:
            if fallback_messages is None:
                raise
            return self._degraded(session_id, system_prompt, tools, max_tokens, model,
                                  validate_messages(fallback_messages) + extra, started)
        force = self.policy.recovery_ratio if data.state.recover_next else None
        return self._build(session_id, data, system_prompt, tools, max_tokens, model, extra,
                           started, force_ratio=force, scan=scan)

    def _build(self, session_id: str, data: ViewData, system_prompt: str,
               tools: Sequence[Mapping[str, Any]] | None, max_tokens: int | None, model: str,
               extra: list[Message], started: float, *, force_ratio: float | None = None,
               retry_lost_swap: bool = True, scan: PairScan | None = None) -> PreparedView:
        state = data.state
        limits = self.model_limits(model, state)
        reserve = output_reserve(limits, max_tokens)
        window = limits.context_window
        w = state.watermark
        extra_tokens = [self.counter.message(m) for m in extra]
        newest = self._newest(extra, extra_tokens)
        regions = Regions(
            system=self._system_tokens(system_prompt),
            summary=data.summary.tokens if data.summary else 0,
            tools=self._tool_tokens(tools),
            history=(data.history_tokens - cheap_savings(data.cheap, w, data.length)
                     + sum(extra_tokens)),
            overhead=self.counter.messages([]),
        )
        self._remember_figures(session_id, state, regions, reserve, model, window)
        estimated = calibrated_total(regions, state, data.length)
        report = self._check(window, reserve, regions, estimated, newest)

        decisions = data.cheap
        enqueued = False
        if self.policy.proactive and report.should_compact:
            decisions = self._cheap_stage(session_id, data)
            if len(decisions) != len(data.cheap):
                regions = Regions(regions.system, regions.summary, regions.tools,
                                  regions.history - (cheap_savings(decisions, w, data.length)
                                                     - cheap_savings(data.cheap, w, data.length)),
                                  regions.overhead)
                estimated = calibrated_total(regions, state, data.length)
                report = self._check(window, reserve, regions, estimated, newest)
            enqueued = self._enqueue(session_id)

        history = apply_cheap(data.messages(), w, decisions) + extra
        summary = data.summary
        truncated, dropped, note = False, 0, ""
        over = not report.within_budget and (self.policy.proactive or force_ratio is not None)
        if over or force_ratio is not None:
            ensure_reducible(report)
            # One ratio sizes the cut and re-estimates the result: the larger of the
            # usage-anchored one (it describes the view before the cut) and the
            # session's calibration, so a view cut to fit is never judged over budget.
            ratio = max(estimated / regions.total if regions.total else 1.0,
                        state.calibration_ratio)
            budget = self._history_budget(report, regions, math.ceil(regions.total * ratio),
                                          window, force_ratio)
            result = emergency_truncate(history, budget, self.counter,
                                        drop_fraction=self.policy.emergency_drop_fraction)
            history, dropped, note, truncated = result.messages, result.dropped, result.note, True
            # Only what is gone from the start moves the watermark; messages dropped
            # inside one long turn are dropped again (deterministically) next time.
            summary, recorded = self._record_truncation(session_id, data,
                                                        result.dropped_prefix, note)
            if not recorded and retry_lost_swap:
                # A worker's summary (or an edit) landed since the read: build from it
                # instead (it may fit without truncating), once.
                fresh, fresh_scan = self._read(session_id)
                return self._build(session_id, fresh, system_prompt, tools, max_tokens, model,
                                   extra, started, force_ratio=force_ratio,
                                   retry_lost_swap=False, scan=fresh_scan)
            if force_ratio is not None:
                self.store.update_state(session_id, recover_next=0)
            enqueued = self._enqueue(session_id, force=True) or enqueued
            regions = Regions(regions.system, summary.tokens if summary else 0, regions.tools,
                              sum(self.counter.message(m) for m in history), regions.overhead)
            estimated = math.ceil(regions.total * ratio - 1e-9)
            report = self._check(window, reserve, regions, estimated, newest)

        if not self._intact(data, decisions, history, extra, None if truncated else scan):
            history = repair_tool_pairs(history)
        messages = assemble(system_prompt, summary, history,
                            placement=self.policy.summary_placement)
        self._sent[session_id] = _Sent(regions.total, data.length + len(extra), window, state)
        # Trusted, typed values: constructed without re-validating ~60 messages.
        return PreparedView.model_construct(messages=messages, report=ViewReport.model_construct(
            session_id=session_id, model=model, limits_source=limits.source, budget=report,
            estimated_prompt_tokens=estimated,
            watermark=summary.watermark if truncated and summary is not None else w,
            version=state.version, length=data.length, summary_kind=state.summary_kind,
            cheap_applied=len(decisions), truncated=truncated, dropped_messages=dropped,
            note=note, enqueued=enqueued, pending_job=data.pending or enqueued,
            recovery=force_ratio is not None, degraded=False,
            elapsed_ms=(time.perf_counter() - started) * 1000))

    @staticmethod
    def _intact(data: ViewData, decisions: Mapping[int, Any], history: Sequence[Message],
                extra: Sequence[Message], scan: PairScan | None) -> bool:
        """Whether ``history`` needs no tool-pair repair, resuming ``scan`` when it applies.

        ``scan`` covers the stored messages; cheap-stage placeholders only
        replace the content of tool results, which the check does not read,
        so only the pending messages remain to be scanned. Otherwise (a
        truncated view, a decision on another role) the whole view is scanned.
        """
        w, end = data.state.watermark, data.length
        if scan is None or any(data.history[i - w].role != "tool"
                               for i in decisions if w <= i < end):
            return pairs_intact(history)
        return scan_pairs(extra, scan).intact

    def _newest(self, extra: Sequence[Message], tokens: Sequence[int] | None = None) -> int:
        """Tokens of the newest message when it is a *user* message (else 0).

        The budget's floor counts it: it cannot be dropped. A huge tool
        result can: emergency truncation clips it head and tail.
        """
        if not extra or extra[-1].role != "user":
            return 0
        return tokens[-1] if tokens else self.counter.message(extra[-1])

    def _check(self, window: int, reserve: int, regions: Regions, estimated: int,
               newest: int) -> BudgetReport:
        fixed = regions.system + regions.summary + regions.tools + regions.overhead
        return check_budget(window=window, reserve=reserve, system=regions.system,
                            summary=regions.summary, tools=regions.tools + regions.overhead,
                            history=max(0, estimated - fixed), newest=newest,
                            trigger_ratio=self.policy.trigger_ratio,
                            target_ratio=self.policy.target_ratio)

    def _history_budget(self, report: BudgetReport, regions: Regions, estimated: int,
                        window: int, force_ratio: float | None) -> int:
        """History tokens (heuristic units) that fit: the budget, or the recovery target."""
        ratio = estimated / regions.total if regions.total else 1.0
        fixed = regions.system + regions.summary + regions.tools + regions.overhead
        # Aim a little below the budget: the estimate is only an estimate.
        room = int(report.input_budget * TRUNCATION_HEADROOM) - int(fixed * ratio)
        if force_ratio is not None:
            room = min(room, int(window * force_ratio) - int(fixed * ratio))
        return max(1, int(room / max(ratio, 1e-6)))

    def _cheap_stage(self, session_id: str, data: ViewData) -> dict[int, Any]:
        """Decide cheap-stage replacements once, record them, return all decisions."""
        plan = plan_cheap_stages(data.messages(), data.state.watermark, data.cheap,
                                 policy=self.policy, counter=self.counter)
        if not plan:
            return dict(data.cheap)
        self.store.record_cheap(session_id, plan)
        decisions = dict(data.cheap)
        for d in plan:
            decisions.setdefault(d.index, d)
        return decisions

    def _record_truncation(self, session_id: str, data: ViewData, dropped: int,
                           note: str) -> tuple[SummaryRecord, bool]:
        """Store the truncation as a summary (CAS), so the next call starts from it.

        Returns the record and False when its swap was lost (someone wrote first).
        """
        previous = data.summary
        logged = max(0, min(dropped, data.length - data.state.watermark))
        text = (previous.text + "\n\n" if previous else "") + note
        record = SummaryRecord(
            watermark=data.state.watermark + logged, kind="truncation", text=text,
            ledger=previous.ledger if previous else "",
            ledger_json=previous.ledger_json if previous else None,
            tokens=0, covers_from=data.state.watermark, source_version=data.state.version,
            stages=["emergency_truncation"])
        record = record.model_copy(update={"tokens": self.counter.text(summary_block(record))})
        if logged == 0:  # nothing gone from the start: the note rides along, unrecorded
            return record, True
        result = self.store.commit_summary(session_id, record, data.state.version)
        if not result.ok:
            log.info("truncation summary for %s lost its swap (%s)", session_id, result.reason)
        return record, result.ok

    def _remember_figures(self, session_id: str, state: SessionState, regions: Regions,
                          reserve: int, model: str, window: int) -> None:
        """Record the request figures the worker needs, only when they changed."""
        figures = {"system_tokens": regions.system, "tool_tokens": regions.tools,
                   "max_tokens": reserve, "model": model, "window": window}
        current = {"system_tokens": state.system_tokens, "tool_tokens": state.tool_tokens,
                   "max_tokens": state.max_tokens, "model": state.model, "window": state.window}
        if figures != current:
            self.store.update_state(session_id, **figures)

    def _enqueue(self, session_id: str, *, force: bool = False) -> bool:
        if force:
            self.store.update_state(session_id, force_requested=1)
        return request_summary(self.store, self.enqueuer, session_id)

    def _degraded(self, session_id: str, system_prompt: str,
                  tools: Sequence[Mapping[str, Any]] | None, max_tokens: int | None,
                  model: str, history: list[Message], started: float) -> PreparedView:
        """Redis is down: a locally truncated view of the caller's own messages."""
        limits = self.model_limits(model)
        reserve = output_reserve(limits, max_tokens)
        regions = Regions(self._system_tokens(system_prompt), 0, self._tool_tokens(tools),
                          sum(self.counter.message(m) for m in history), self.counter.messages([]))
        report = self._check(limits.context_window, reserve, regions, regions.total,
                             self._newest(history))
        dropped, note, summary = 0, "", None
        if not report.within_budget:
            ensure_reducible(report)
            budget = self._history_budget(report, regions, regions.total,
                                          limits.context_window, None)
            result = emergency_truncate(history, budget, self.counter,
                                        drop_fraction=self.policy.emergency_drop_fraction)
            history, dropped, note = result.messages, result.dropped, result.note
            summary = SummaryRecord(watermark=0, kind="truncation", text=note,
                                    tokens=self.counter.text(note) + 8)
            regions = Regions(regions.system, summary.tokens, regions.tools,
                              sum(self.counter.message(m) for m in history), regions.overhead)
            report = self._check(limits.context_window, reserve, regions, regions.total,
                                 self._newest(history))
        messages = assemble(system_prompt, summary, repair_tool_pairs(history),
                            placement=self.policy.summary_placement)
        # Trusted, typed values: constructed without re-validating ~60 messages.
        return PreparedView.model_construct(messages=messages, report=ViewReport.model_construct(
            session_id=session_id, model=model, limits_source=limits.source, budget=report,
            estimated_prompt_tokens=regions.total, watermark=0, version=0, length=len(history),
            summary_kind="", cheap_applied=0, truncated=dropped > 0, dropped_messages=dropped,
            note=note, enqueued=False, pending_job=False, recovery=False, degraded=True,
            elapsed_ms=(time.perf_counter() - started) * 1000))

    # -- after the call --------------------------------------------------------------
    def record_turn(self, session_id: str, messages: Sequence[Message | Mapping[str, Any]],
                    usage: Any = None, *, request_id: str | None = None) -> int:
        """Append the turn's messages and enqueue ``maybe_summarize`` (coalesced).

        ``usage`` is the provider's usage for the request that produced the
        last assistant message of ``messages``; it anchors the hybrid
        estimate and updates the calibration ratio (written by the append
        itself, and only if no compaction or edit changed the view since).

        The append carries a request id (``request_id``, or a fresh one per
        call) and is retried once, with the same id, when Redis did not
        answer: the store applies it at most once, so a lost reply cannot
        duplicate the turn. The wait is bounded by two socket timeouts.
        Once the turn is stored, a failure to publish the job is logged, not
        raised: raising would invite the caller to record the turn again,
        and the next turn enqueues again anyway.
        """
        encoded = self.store.encode(session_id, messages)
        reported = reported_prompt_tokens(usage)
        sent = self._sent.pop(session_id, None) if reported is not None else None
        fields = (self._calibration(session_id, reported, sent)
                  if sent is not None and reported is not None else None)
        rid = request_id if request_id is not None else secrets.token_hex(12)

        def attempt() -> AppendResult:
            return self.store.append_encoded(
                session_id, encoded, request_id=rid, mark_pending=self.policy.proactive,
                state_fields=fields, fields_version=sent.state.version if sent else None)

        try:
            result = attempt()
        except StoreUnavailable as exc:
            log.info("session %s: append %s unanswered (%s); retrying once", session_id, rid,
                     exc)
            result = attempt()
        if result.marked:
            self._publish(session_id)
        return result.length

    def _publish(self, session_id: str) -> None:
        """Publish the job this turn's append marked pending; unmark if it cannot be sent.

        The same contract as :func:`shared.enqueue.request_summary`, whose
        flag-setting half ran inside the append script.
        """
        try:
            self.enqueuer.enqueue(self.store.tenant, session_id)
        except Exception as exc:
            with contextlib.suppress(StoreUnavailable):
                self.store.clear_pending(session_id)
            log.warning("enqueue failed for session %s: %s", session_id, exc)

    def _calibration(self, session_id: str, reported: int, sent: _Sent) -> dict[str, Any]:
        """State fields learned from the provider's reported prompt tokens for ``sent``."""
        state, heuristic, window = sent.state, sent.heuristic, sent.window
        if window and (reported > window or (heuristic > 1000 and reported < heuristic * 0.5)):
            # Silent truncation upstream: the provider saw far less than we sent,
            # or more than its window. Treat it like an overflow.
            log.warning("session %s: reported %d prompt tokens for ~%d sent (window %d): "
                        "silent truncation suspected", session_id, reported, heuristic, window)
            return {"silent_truncation_flags": state.silent_truncation_flags + 1,
                    "recover_next": 1}
        cal = Calibration(state.calibration_ratio, state.calibration_samples).update(
            reported, heuristic)
        return {"anchor_reported": reported, "anchor_estimated": heuristic,
                "anchor_end": sent.end, "anchor_version": state.version,
                "calibration_ratio": cal.ratio, "calibration_samples": cal.samples}

    # -- reactive recovery -----------------------------------------------------------------
    def recover(self, session_id: str, error: object, system_prompt: str = "",
                tools: Sequence[Mapping[str, Any]] | None = None,
                max_tokens: int | None = None, model: str = "gpt-4o", *,
                pending: Sequence[Message | Mapping[str, Any]] = ()) -> PreparedView | None:
        """After a provider error: None if it is not a context overflow, else a view to retry.

        The stated limit is learned (used from now on); the view is compacted
        to a fifth of the window with force, without an LLM, and a worker is
        asked to replace the truncation with a real summary. Recovery runs
        even when proactive compaction is switched off.
        """
        if not is_context_overflow(error):
            return None
        info = parse_overflow(error)
        if info is not None and info.limit:
            self.limits.learn(model, info.limit)
            self.store.update_state(session_id, learned_window=info.limit, model=model,
                                    last_overflow_at=time.time())
        started = time.perf_counter()
        extra = validate_messages(pending, prefix="pending")
        data = self.load(session_id)
        return self._build(session_id, data, system_prompt, tools, max_tokens, model, extra,
                           started, force_ratio=self.policy.recovery_ratio)

    def call(self, session_id: str, send: Callable[[PreparedView], R], *,
             system_prompt: str = "", tools: Sequence[Mapping[str, Any]] | None = None,
             max_tokens: int | None = None, model: str = "gpt-4o",
             pending: Sequence[Message | Mapping[str, Any]] = ()) -> tuple[R, PreparedView]:
        """prepare -> send -> on overflow recover and send once more.

        ``send`` does the provider call with the view (e.g. an ``openai``
        client call with ``view.openai()``). The retry after recovery is not
        one of the caller's retry attempts; any other error propagates.
        """
        view = self.prepare(session_id, system_prompt, tools, max_tokens, model, pending=pending)
        try:
            return send(view), view
        except Exception as exc:
            retry = self.recover(session_id, exc, system_prompt, tools, max_tokens, model,
                                 pending=pending)
            if retry is None:
                raise
        return send(retry), retry

    # -- introspection -------------------------------------------------------------------------
    def stats(self, session_id: str) -> dict[str, Any]:
        """Tokens by region, usage ratio, watermark, summaries, pending job."""
        data = self.load(session_id)
        state = data.state
        limits = self.model_limits(state.model or "gpt-4o", state)
        reserve = state.max_tokens or output_reserve(limits, None)
        history = data.history_tokens - cheap_savings(data.cheap, state.watermark, data.length)
        regions = Regions(state.system_tokens, data.summary.tokens if data.summary else 0,
                          state.tool_tokens, history, self.counter.messages([]))
        estimated = calibrated_total(regions, state, data.length)
        report = self._check(limits.context_window, reserve, regions, estimated, 0)
        summaries = self.store.summaries(session_id)
        return {
            "session_id": session_id, "tenant": self.store.tenant, "length": data.length,
            "watermark": state.watermark, "version": state.version, "model": state.model,
            "window": limits.context_window, "limits_source": limits.source,
            "reserve": reserve, "regions": {"system": regions.system, "summary": regions.summary,
                                            "tools": regions.tools, "history": history},
            "estimated_prompt_tokens": estimated, "usage_ratio": report.usage_ratio,
            "should_compact": report.should_compact, "within_budget": report.within_budget,
            "summary_kind": state.summary_kind, "cheap_decisions": len(data.cheap),
            "summaries": [{"watermark": s.watermark, "kind": s.kind, "tokens": s.tokens,
                           "created_at": s.created_at} for s in summaries],
            "pending_job": data.pending, "calibration_ratio": state.calibration_ratio,
            "calibration_samples": state.calibration_samples,
            "silent_truncation_flags": state.silent_truncation_flags,
            "requests_failed": state.requests_failed,
            "last_request_failure": state.last_request_failure or None,
        }


__all__ = ["ContextGuard", "PreparedView", "ViewReport"]
