"""What one summarization job does, independent of Celery.

1. Trigger: the full budget formula (with the figures the guard recorded)
   reaches the trigger ratio, or the messages since the watermark reach the
   count threshold, or a compaction was forced. Otherwise exit at once.
2. Cut: keep about a quarter of the window of recent messages, aiming at the
   target ratio (hysteresis), on a safe turn boundary; skip if it would free
   under 10%; a split turn's prefix gets its own summary.
3. Summarize the range since the base summary, merged into it.
4. Fact ledger beside the summary: facts the summary dropped are injected.
5. Write through the store's compare-and-swap; on conflict re-read, stop if
   the range is covered, else try once more; never overwrite newer state.

A summary that is not an LLM summary (truncation, offline fallback) is
rebuilt from the raw log the next time an LLM is available: the range then
starts at the newest LLM summary, so the better summary replaces it.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from shared.budget import check_budget
from shared.config import CompactionPolicy
from shared.ledger import Ledger, extract_facts
from shared.limits import model_limits, output_reserve
from shared.records import SessionState, SummaryRecord, ViewData
from shared.store import SessionStore
from shared.tokens import DEFAULT_COUNTER, TokenCounter
from shared.turns import find_cut_point
from shared.view import Regions, calibrated_total, cheap_savings, summary_block
from workers.summarizer.engine import SummaryEngine

log = logging.getLogger("compaction.job")
Status = Literal["skipped", "compacted", "covered", "conflict"]
SUMMARY_FRAMING_TOKENS = 40


@dataclass(slots=True)
class JobOutcome:
    """Reported at the end of every job (task result, Flower, structured log)."""

    session_id: str
    status: Status
    reason: str = ""
    tokens_before: int = 0
    tokens_after: int = 0
    messages_before: int = 0
    messages_after: int = 0
    watermark_before: int = 0
    watermark_after: int = 0
    summary_kind: str = ""
    stages: list[str] = field(default_factory=list)
    model: str | None = None
    summarizer_input_tokens: int = 0
    summarizer_output_tokens: int = 0
    latency_ms: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class _Plan:
    base: int
    base_summary: SummaryRecord | None
    cut: int
    prefix_start: int | None
    tokens_before: int
    forced: bool


class Compactor:
    """Decides, summarizes and commits one session's compaction."""

    def __init__(self, store: SessionStore, engine: SummaryEngine, *,
                 policy: CompactionPolicy | None = None,
                 counter: TokenCounter | None = None) -> None:
        self.store = store
        self.engine = engine
        self.policy = policy or CompactionPolicy()
        self.counter = counter or store.counter or DEFAULT_COUNTER

    # -- decision ------------------------------------------------------------------
    def _window(self, state: SessionState) -> tuple[int, int]:
        limits = model_limits(state.model or "gpt-4o",
                              learned={state.model: state.learned_window}
                              if state.learned_window and state.model else None)
        window = state.learned_window or state.window or limits.context_window
        reserve = state.max_tokens or output_reserve(limits, None)
        return window, min(reserve, max(0, window - 1024))

    def _estimate(self, data: ViewData) -> tuple[int, int, int]:
        """(estimated prompt tokens, window, input budget) of the current view."""
        state = data.state
        window, reserve = self._window(state)
        history = (data.history_tokens
                   - cheap_savings(data.cheap, state.watermark, data.length))
        regions = Regions(state.system_tokens, data.summary.tokens if data.summary else 0,
                          state.tool_tokens, history, self.counter.messages([]))
        return calibrated_total(regions, state, data.length), window, window - reserve

    def plan(self, session_id: str, data: ViewData, *, force: bool,
             keep_recent: int | None, manual: bool = False) -> _Plan | str:
        """A plan, or the reason to skip.

        ``manual`` (a /compact) skips the trigger check; ``force`` (after an
        overflow or truncation) also skips the minimum-saving check.
        """
        state = data.state
        forced = force or bool(state.force_requested)
        estimated, window, budget = self._estimate(data)
        since = data.length - state.watermark
        report = check_budget(window=window, reserve=window - budget, history=estimated,
                              trigger_ratio=self.policy.trigger_ratio,
                              target_ratio=self.policy.target_ratio)
        # A truncation, or an offline fallback while an LLM is configured, is
        # replaced by a real summary as soon as possible, due or not.
        rebuild = data.summary is not None and (
            data.summary.kind == "truncation"
            or (data.summary.kind == "offline" and self.engine.is_llm))
        if not forced and not manual and not rebuild:
            if not self.policy.proactive:
                return "proactive compaction is switched off"
            if not report.should_compact and since < self.policy.message_threshold:
                return (f"below trigger: {report.usage_ratio:.0%} of the input budget, "
                        f"{since} messages since the watermark")
        fixed = state.system_tokens + state.tool_tokens + self.policy.max_summary_tokens
        keep = keep_recent if keep_recent is not None else min(
            self.policy.keep_recent_for(window), max(0, report.target_tokens - fixed))
        messages = data.messages()
        cut = find_cut_point(messages, max(0, keep), self.counter)
        if cut.index <= cut.head and not rebuild:
            return "nothing to cut: the recent messages alone are what is kept"
        freed = self.counter.messages(messages[:cut.index]) - SUMMARY_FRAMING_TOKENS
        if not forced and not rebuild and freed < self.policy.min_saving_ratio * estimated:
            return f"would free {freed} tokens, under {self.policy.min_saving_ratio:.0%}"
        base_summary = data.summary
        if rebuild:
            base_summary = self._rebuild_base(session_id, state.watermark)
        base = base_summary.watermark if base_summary else 0
        prefix = (state.watermark + cut.turn_start) if cut.split_turn else None
        return _Plan(base=base, base_summary=base_summary, cut=state.watermark + cut.index,
                     prefix_start=prefix, tokens_before=estimated, forced=forced)

    def _rebuild_base(self, session_id: str, watermark: int) -> SummaryRecord | None:
        """The newest summary worth building on: an LLM one, else offline, else none."""
        wanted = ("llm",) if self.engine.is_llm else ("llm", "offline")
        candidates = [s for s in self.store.summaries(session_id)
                      if s.kind in wanted and s.watermark <= watermark]
        return candidates[-1] if candidates else None

    # -- the job -------------------------------------------------------------------
    def run(self, session_id: str, *, force: bool = False, keep_recent: int | None = None,
            use_llm: bool = True, deadline: float | None = None,
            manual: bool = False) -> JobOutcome:
        """One compaction attempt (and one retry after a lost compare-and-swap)."""
        started = time.perf_counter()
        args = (session_id, force, keep_recent, use_llm, deadline, manual)
        outcome = self._attempt(*args)
        if outcome.status == "conflict":
            outcome = self._attempt(*args)
        outcome.latency_ms = round((time.perf_counter() - started) * 1000, 2)
        log.info("compaction.end %s", json.dumps(outcome.as_dict(), sort_keys=True))
        return outcome

    def _attempt(self, session_id: str, force: bool, keep_recent: int | None, use_llm: bool,
                 deadline: float | None, manual: bool) -> JobOutcome:
        data = self.store.load_view(session_id)
        state = data.state
        outcome = JobOutcome(session_id=session_id, status="skipped",
                             messages_before=data.length - state.watermark,
                             watermark_before=state.watermark)
        plan = self.plan(session_id, data, force=force, keep_recent=keep_recent, manual=manual)
        if isinstance(plan, str):
            outcome.reason = plan
            return outcome
        log.info("compaction.start %s", json.dumps({
            "session_id": session_id, "watermark": state.watermark, "cut": plan.cut,
            "base": plan.base, "tokens_before": plan.tokens_before, "forced": plan.forced}))
        outcome.tokens_before = plan.tokens_before
        record, draft_stages = self._summarize(session_id, data, plan, use_llm, deadline)
        result = self.store.commit_summary(session_id, record, state.version)
        if not result.ok:
            current = self.store.state(session_id)
            covered = current.watermark >= record.watermark
            outcome.status = "covered" if covered else "conflict"
            outcome.reason = f"compare-and-swap lost ({result.reason})"
            return outcome
        if state.force_requested:
            self.store.update_state(session_id, force_requested=0)
        after = self.store.load_view(session_id)
        outcome.status = "compacted"
        outcome.tokens_after = self._estimate(after)[0]
        outcome.messages_after = after.length - after.state.watermark
        outcome.watermark_after = record.watermark
        outcome.summary_kind = record.kind
        outcome.stages = draft_stages
        outcome.model = record.model
        outcome.summarizer_input_tokens = record.input_tokens
        outcome.summarizer_output_tokens = record.output_tokens
        return outcome

    def _summarize(self, session_id: str, data: ViewData, plan: _Plan, use_llm: bool,
                   deadline: float | None) -> tuple[SummaryRecord, list[str]]:
        state = data.state
        start = plan.base
        if start >= state.watermark:
            messages = data.messages()[: plan.cut - state.watermark]
        else:  # rebuilding a truncation/offline summary from the raw log
            messages = self.store.messages(session_id, start, plan.cut)
        split = plan.prefix_start - start if plan.prefix_start is not None else len(messages)
        body, prefix = messages[:split], messages[split:]
        base = plan.base_summary
        previous_ledger = (Ledger.from_json(base.ledger_json)
                           if base is not None and base.ledger_json else Ledger())
        ledger = previous_ledger.merge(extract_facts(messages, start=start)).capped(
            self.policy.max_ledger_chars)
        draft = self.engine.summarize(body, base.text if base else None, ledger,
                                      prefix=prefix, use_llm=use_llm, deadline=deadline,
                                      start=start)
        injected = ledger.missing_from(draft.text).render()
        record = SummaryRecord(
            watermark=plan.cut, kind=draft.kind,
            text=draft.text, ledger=injected, ledger_json=ledger.to_json(),
            tokens=0, covers_from=start, source_version=state.version, model=draft.model,
            input_tokens=draft.input_tokens, output_tokens=draft.output_tokens,
            stages=draft.stages)
        tokens = self.counter.text(summary_block(record)) + SUMMARY_FRAMING_TOKENS
        return record.model_copy(update={"tokens": tokens}), draft.stages


__all__ = ["Compactor", "JobOutcome"]
