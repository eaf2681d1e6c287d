"""What one summarization job does, independent of Celery.

1. Trigger: the full budget formula (with the figures the guard recorded)
   reaches the trigger ratio, or the messages since the watermark reach the
   count threshold, or a compaction was forced. Otherwise exit at once.
2. Cut: keep about a quarter of the window of recent messages, aiming at the
   target ratio (hysteresis), on a safe turn boundary; skip if it would free
   under 10%; a split turn's prefix gets its own summary.
3. Summarize the range since the base summary, merged into it.
4. Fact ledger beside the summary: facts the summary dropped are injected.
5. Write through the store's compare-and-swap; on conflict re-read and try
   again (at most :data:`MAX_ATTEMPTS` in all); never overwrite newer state.
   A job holding the session's lease commits fenced with its token: if the
   lease expired or moved to another job meanwhile, the commit is refused
   and the job stops (status ``lease_lost``, see :mod:`shared.store.lease`).

The kept part is bounded too: the cut keeps at least about a quarter of the
window, but never more than the target leaves beside the fixed parts and a
full-size summary. Snapping back to a turn start can otherwise keep a huge
recent tool output whole, and the compaction would leave the session over
its window (the guard then truncates every turn until the next job).

A summary that is not an LLM summary (truncation, offline) is rebuilt from
the raw log the next time an LLM is available: the range then starts at the
newest LLM summary, so the better summary replaces it. Not an offline
summary the fallback wrote after the LLM failed on its range in a way
retrying cannot fix (marked :data:`FALLBACK_STAGE`): rebuilding it would
send the same, ever longer range to the same failing model every job (for
an 18k-token conversation, ~1M summarizer tokens over 60 turns). It is a
base like an LLM summary instead, and the next due compaction merges onto
it. A fallback after the LLM was unreachable is rebuilt once it answers; it
counts the fallbacks in a row (:data:`UNAVAILABLE_STAGE`), and after two the
rebuild is tried before a compaction is due only after a wait that doubles
with each failure (a summarizer that stays down cost every job all its
retries, however small the session).

A fold of many chunks that stops midway (a deadline, a summarizer that
fails on a later chunk) keeps its progress: the summary of the chunks folded
so far is committed (watermark at the end of the last one, a boundary between
tool units) before the error is raised, so the retry, or the offline fallback,
goes on from there instead of sending the whole range again.

The guard's emergency truncation commits through the same compare-and-swap,
and it happens exactly when a job is late, so a job often loses its swap to
one. Throwing the real summary away would leave the lossy truncation in
place until yet another job; instead, when every commit since the job read
the session was a guard truncation (the log is append-only otherwise, so
the summary still describes it), the summary is kept: committed as it is
when it reaches at least the truncation's watermark, else used as the base
that the range the truncation dropped is merged onto. A newer real summary
or a history edit in between makes it worthless, and it is dropped.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from shared.core.budget import check_budget
from shared.core.calibration import model_family, prior_ratio
from shared.core.config import CompactionPolicy
from shared.core.errors import SessionDamaged, StoreUnavailable, SummarizerError
from shared.core.facts import extract_facts
from shared.core.ledger import Ledger
from shared.core.limits import LimitBook, model_limits, output_reserve
from shared.core.records import CommitResult, SessionState, SummaryRecord, ViewData
from shared.core.tokens import DEFAULT_COUNTER, TokenCounter
from shared.core.turns import CutPoint, find_cut_point
from shared.core.view import apply_cheap, cheap_savings, summary_block, view_estimate
from shared.store.recall_index import index_compacted  # recall (issue 16)
from shared.store.sessions import SessionStore
from workers.summarizer.counting import JobCounter, job_counter
from workers.summarizer.engine import SummaryEngine

log = logging.getLogger("compaction.job")
COMMIT_RETRY_DELAYS = (0.25, 0.5, 1.0, 2.0)
"""Waits before the commit is sent again when Redis did not answer: a pause that long
(a fork for BGSAVE or an AOF rewrite, a failover) would otherwise throw away a summary
already paid for; past them the job fails and is delivered again."""


def _not_found(store: SessionStore, session_id: str) -> str:
    """Why a job finds no session: usually the workers read other keys than the agent
    writes (another key prefix, tenant or database), which looked like an empty session
    "below trigger" and compacted nothing, ever."""
    client = getattr(store, "redis", None)  # a tenant's handle holds no raw client
    pool = getattr(client, "connection_pool", None)  # nor does a cluster client
    db = getattr(pool, "connection_kwargs", {}).get("db")
    where = f", Redis db {db}" if db is not None else ""  # unknown: not guessed
    return (f"no session {session_id!r} under key prefix {store.config.key_prefix!r}, tenant "
            f"{store.tenant!r}{where}: the agent and the workers "
            "must share COMPACTION_REDIS_URL, COMPACTION_KEY_PREFIX and COMPACTION_TENANT "
            "(or the session was deleted or expired)")


def _commit_retried(commit: Callable[[], CommitResult], session_id: str) -> CommitResult:
    """``commit()``, sent again while Redis does not answer. Safe to repeat: it is a
    compare-and-swap on the version, so an attempt that did land makes the next one lose
    its swap (the job then reports the range covered)."""
    for delay in COMMIT_RETRY_DELAYS:
        try:
            return commit()
        except StoreUnavailable as exc:
            log.warning("commit of %s: redis did not answer (%s); again in %.2f s",
                        session_id, exc, delay)
            time.sleep(delay)
    return commit()
Status = Literal["skipped", "compacted", "covered", "conflict", "lease_lost"]
SUMMARY_FRAMING_TOKENS = 40
"""What a summary costs at the least (its introduction and tags), set against what a cut
would free when deciding whether it is worth making. A record's own tokens count its
whole block (:func:`shared.core.view.summary_block`), framing included."""
MAX_ATTEMPTS = 3
"""Summarize-and-swap attempts per job: a late job may lose to the guard's
truncation twice in a row on a fast agent; a third loss is left to the next job."""
RecallIndexer = Callable[[SessionStore, str, int], None]
"""``(store, session_id, watermark)``, called after a successful commit."""
MAX_VERSIONS_CHECKED = 50
"""Commits since the read that are inspected before reusing a lost summary."""
UNAVAILABLE_STAGE = "llm_unavailable_x"
"""Marks an offline summary written because the LLM could not be reached (retries spent),
with the number of such fallbacks in a row: ``llm_unavailable_x3``."""
REBUILD_BACKOFF_SECONDS = 60.0
"""The wait before rebuilding such a summary when not due, after two failures in a row;
it doubles with each further one, up to :data:`REBUILD_BACKOFF_MAX_SECONDS`."""
REBUILD_BACKOFF_MAX_SECONDS = 3600.0
FALLBACK_STAGE = "llm_failed_on_range"
"""The stage that marks an offline summary written because the LLM failed on its range in
a way retrying cannot fix (a refusal, a reply without the required sections, a 4xx)."""


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
    attempts: int = 1
    over_truncation: bool = False
    """The summary replaced a guard truncation that had won the compare-and-swap."""
    latency_ms: float = 0.0
    lost_swaps: list[str] = field(default_factory=list)
    """Each compare-and-swap this job lost, in order (``covered`` or ``conflict``), those a
    later attempt made up for included: ``compaction_compactions_total`` counts each."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class _Lost:
    """A summary that lost its compare-and-swap, and the version it was written against."""

    record: SummaryRecord
    version: int
    reusable: bool
    """Every commit since ``version`` was a guard truncation: the record is still true."""


@dataclass(frozen=True, slots=True)
class _Plan:
    base: int
    base_summary: SummaryRecord | None
    cut: int
    prefix_start: int | None
    tokens_before: int
    forced: bool


def index_inline(store: SessionStore, session_id: str, watermark: int) -> None:
    """Recall (issue 16): index the range a commit summarized away, in the same job
    (4-5 ms of worker CPU and 2 ms of Redis for 46 messages: BENCHMARKS.md)."""
    index_compacted(store, session_id, watermark)


class Compactor:
    """Decides, summarizes and commits one session's compaction."""

    def __init__(self, store: SessionStore, engine: SummaryEngine, *,
                 policy: CompactionPolicy | None = None,
                 counter: TokenCounter | None = None,
                 recall_indexer: RecallIndexer | None = index_inline) -> None:
        """``recall_indexer``: called after each successful commit (recall, issue 16);
        default :func:`index_inline`, ``None`` for none (a Celery worker asks for an
        index job instead, ``workers.tasks``)."""
        self.store = store
        self.engine = engine
        self.policy = policy or CompactionPolicy()
        self.counter = counter or store.counter or DEFAULT_COUNTER
        self.recall_indexer = recall_indexer

    # -- decision ------------------------------------------------------------------
    def _window(self, state: SessionState) -> tuple[int, int]:
        learned = state.stored_learned()
        learned = learned if LimitBook.credible(learned) else 0
        model = state.model or "gpt-4o"
        # the window the guard was given (its overrides) is no guess: no "unknown model"
        limits = model_limits(model, learned={model: learned} if learned and state.model
                              else None,
                              overrides={model: state.window} if state.window else None)
        window = learned or state.window or limits.context_window
        reserve = state.max_tokens or output_reserve(limits, None)
        return window, min(reserve, max(0, window - 1024))

    def _estimate(self, data: ViewData) -> tuple[int, int, int]:
        """(estimated prompt tokens, window, input budget) of the current view."""
        state = data.state
        window, reserve = self._window(state)
        _, estimated = view_estimate(
            state, data.summary, data.history_tokens,
            cheap_savings(data.cheap, state.watermark, data.length), data.length,
            overhead=self.counter.messages([]), prior=prior_ratio(state.model, self.counter),
            family=model_family(state.model))
        return estimated, window, window - reserve

    def plan(self, session_id: str, data: ViewData, *, force: bool,
             keep_recent: int | None, manual: bool = False,
             carry: SummaryRecord | None = None,
             counter: TokenCounter | None = None) -> _Plan | str:
        """A plan, or the reason to skip.

        ``manual`` (a /compact) skips the trigger check; ``force`` (after an
        overflow or truncation) also skips the minimum-saving check.
        ``carry``: a real summary of an earlier range of this log that lost
        its swap to a truncation; it is a base candidate for the rebuild.
        ``counter``: the job's counter (it remembers the messages it counted).
        """
        counter = counter or job_counter(self.counter)
        state = data.state
        forced = force or bool(state.force_requested)
        estimated, window, budget = self._estimate(data)
        since = data.length - state.watermark
        report = check_budget(window=window, reserve=window - budget, history=estimated,
                              trigger_ratio=self.policy.trigger_ratio,
                              target_ratio=self.policy.target_ratio)
        # A truncation, or an offline summary while an LLM is configured, is replaced
        # by a real summary as soon as possible, due or not (not one written because
        # the LLM failed on this session: see the module's docstring).
        rebuild = data.summary is not None and (
            data.summary.kind == "truncation"
            or (data.summary.kind == "offline" and self.engine.is_llm
                and FALLBACK_STAGE not in data.summary.stages))
        # After the LLM was unreachable, the next try waits (longer after each failure)
        # unless a compaction is due anyway: each try costs the job all its retries.
        backoff = (self._backoff_record(session_id, data.summary)
                   if rebuild and data.summary is not None else None)
        waiting = backoff is not None and not _rebuild_due(backoff)
        if not forced and not manual and (not rebuild or waiting):
            if not self.policy.proactive:
                return "proactive compaction is switched off"
            if not report.should_compact and since < self.policy.message_threshold:
                return (f"below trigger: {report.usage_ratio:.0%} of the input budget, "
                        f"{since} messages since the watermark"
                        + ("; the rebuild of the offline summary waits after "
                           f"{_unavailable_count(backoff)} failed tries"
                           if waiting and backoff is not None else ""))
        fixed = state.system_tokens + state.tool_tokens + self.policy.max_summary_tokens
        room = max(0, report.target_tokens - fixed)
        keep = max(0, keep_recent if keep_recent is not None else min(
            self.policy.keep_recent_for(window), room))
        # Cut on what the guard sends (cheap-stage placeholders applied), keep at
        # most what the target leaves: the summary then fits beside the kept part.
        messages = apply_cheap(data.messages(), state.watermark, data.cheap)
        cut = find_cut_point(messages, keep, counter, max_kept_tokens=max(keep, room))
        if cut.split_turn and cut.index - cut.turn_start < self.policy.split_turn_min_messages:
            # The bound split the newest turn after its question (less room than a turn):
            # keep the turn whole when that still leaves the session under its trigger,
            # rather than show the model an answer whose question it is only told about.
            whole = sum(counter.message(m) for m in messages[cut.turn_start:])
            if cut.turn_start > cut.head and fixed + whole < (
                    self.policy.trigger_ratio * report.input_budget):
                cut = CutPoint(cut.turn_start, cut.turn_start, False, cut.head, whole)
        if cut.index <= cut.head and not rebuild:
            return "nothing to cut: the recent messages alone are what is kept"
        freed = counter.messages(messages[:cut.index]) - SUMMARY_FRAMING_TOKENS
        if not forced and not rebuild and freed < self.policy.min_saving_ratio * estimated:
            return f"would free {freed} tokens, under {self.policy.min_saving_ratio:.0%}"
        base_summary = data.summary
        if rebuild:
            base_summary = self._rebuild_base(session_id, state.watermark, carry)
        base = base_summary.watermark if base_summary else 0
        # A split turn's prefix gets a summary of its own when it is long enough to
        # be worth one; a short one (the bound on the kept part can split a turn
        # right after its user message) is merged with the rest: a summary of two
        # messages is no shorter than they are.
        long_prefix = cut.index - cut.turn_start >= self.policy.split_turn_min_messages
        prefix = (state.watermark + cut.turn_start) if cut.split_turn and long_prefix else None
        return _Plan(base=base, base_summary=base_summary, cut=state.watermark + cut.index,
                     prefix_start=prefix, tokens_before=estimated, forced=forced)

    def _backoff_record(self, session_id: str, summary: SummaryRecord) -> SummaryRecord:
        """The summary whose failed tries the rebuild's backoff counts: ``summary``, or
        under a guard's truncations the newest other one (a busy agent truncating during
        an LLM outage restarted the count, and every job spent its retries again)."""
        if summary.kind != "truncation":
            return summary
        beneath = [s for s in self.store.summaries(session_id) if s.kind != "truncation"
                   and s.watermark <= summary.watermark]
        return max(beneath, key=lambda s: s.watermark) if beneath else summary

    def _rebuild_base(self, session_id: str, watermark: int,
                      carry: SummaryRecord | None = None) -> SummaryRecord | None:
        """The newest summary worth building on: an LLM one, else offline (with an LLM, only
        the fallback's, written after the LLM failed on that range), else none."""
        stored = self.store.summaries(session_id)
        candidates = [s for s in [*stored, *([carry] if carry else [])]
                      if s.watermark <= watermark and (
                          s.kind == "llm" or (s.kind == "offline" and (
                              not self.engine.is_llm or FALLBACK_STAGE in s.stages)))]
        return max(candidates, key=lambda s: s.watermark) if candidates else None

    def _only_truncations(self, session_id: str, since: int, until: int) -> bool:
        """True when versions ``[since, until)`` were all committed by guard truncations.

        Every commit bumps the version by one and stores a record whose
        ``source_version`` is the version it replaced; an edit or a rewind
        bumps it without a record. So a gap, or any other kind, means the log
        or the summary changed in a way a lost summary cannot survive.
        """
        if not 0 <= since < until or until - since > MAX_VERSIONS_CHECKED:
            return False
        kinds = {s.source_version: s.kind for s in self.store.summaries(session_id)}
        return all(kinds.get(v) == "truncation" for v in range(since, until))

    def _seed_counts(self, data: ViewData, counter: JobCounter) -> None:
        """Give the job's counter the store's own count of every message read.

        The store keeps running totals per message (counted by its counter at
        append time), read with the view; they replace estimating the range
        again (the plan and the quality gate count it). Only when the store
        counts with this job's counter.
        """
        if self.store.counter is self.counter and data.history_counts is not None:
            counter.seed(data.history, data.history_counts)

    # -- the job -------------------------------------------------------------------
    def run(self, session_id: str, *, force: bool = False, keep_recent: int | None = None,
            use_llm: bool = True, deadline: float | None = None,
            manual: bool = False, lease_token: str | None = None,
            llm_failed: bool = False, fallback_reason: str | None = None) -> JobOutcome:
        """One compaction; after a lost compare-and-swap, up to :data:`MAX_ATTEMPTS` in all.

        ``lease_token``: the session's lease held by the caller; every commit is
        fenced with it (refused once the lease is lost: status ``lease_lost``).
        ``llm_failed`` (with ``use_llm=False``): the offline fallback after the LLM
        failed on this range in a way retrying cannot fix; its summary is marked
        :data:`FALLBACK_STAGE`, merged onto rather than rebuilt. ``fallback_reason``
        (the offline fallback after any LLM failure): why the LLM failed; it is the
        outcome's reason and ``fallback_after_llm_failure`` its first stage, in the
        ``compaction.end`` log line too.
        """
        started = time.perf_counter()
        args = (session_id, force, keep_recent, use_llm and not llm_failed, deadline, manual,
                lease_token, llm_failed)
        lost: _Lost | None = None
        lost_swaps: list[str] = []
        for attempt in range(1, MAX_ATTEMPTS + 1):
            outcome, lost = self._attempt(*args, lost=lost)
            if lost is not None:
                lost_swaps.append(outcome.status)
            outcome.attempts, outcome.lost_swaps = attempt, lost_swaps
            if lost is None or (outcome.status == "covered" and not lost.reusable):
                break
        outcome.latency_ms = round((time.perf_counter() - started) * 1000, 2)
        if fallback_reason is not None:
            outcome.stages.insert(0, "fallback_after_llm_failure")
            outcome.reason = fallback_reason[:500]
        log.info("compaction.end %s", json.dumps(outcome.as_dict(), sort_keys=True))
        return outcome

    def _attempt(self, session_id: str, force: bool, keep_recent: int | None, use_llm: bool,
                 deadline: float | None, manual: bool, lease_token: str | None,
                 llm_failed: bool, *,
                 lost: _Lost | None = None) -> tuple[JobOutcome, _Lost | None]:
        try:
            data = self.store.load_view(session_id, with_counts=True)
        except SessionDamaged as exc:  # the guard mends it at the session's next call
            outcome = JobOutcome(session_id=session_id, status="skipped", reason=str(exc))
            log.warning("compaction job for %s: %s", session_id, exc)
            return outcome, None
        state = data.state
        interrupted: SummarizerError | None = None  # the fold stopped; its part is committed
        counter = job_counter(self.counter)  # counts each message of this read once
        self._seed_counts(data, counter)
        outcome = JobOutcome(session_id=session_id, status="skipped",
                             messages_before=data.length - state.watermark,
                             watermark_before=state.watermark)
        if data.length == 0 and state.version == 0 and data.summary is None:
            outcome.reason = _not_found(self.store, session_id)
            log.warning("compaction job for %s: %s", session_id, outcome.reason)
            return outcome, None
        # Checked against this read: the swap below expects exactly this version.
        carry = (lost.record if lost is not None
                 and self._only_truncations(session_id, lost.version, state.version) else None)
        if carry is not None and carry.watermark >= state.watermark:
            # The truncation dropped less than the summary covers: it replaces it as it is.
            record = carry.model_copy(update={"source_version": state.version})
            outcome.tokens_before = self._estimate(data)[0]
            stages, kept = [*record.stages, "replaced_truncation"], True
        else:
            plan = self.plan(session_id, data, force=force, keep_recent=keep_recent,
                             manual=manual, carry=carry, counter=counter)
            if isinstance(plan, str):
                outcome.reason = plan
                return outcome, None
            log.info("compaction.start %s", json.dumps({
                "session_id": session_id, "watermark": state.watermark, "cut": plan.cut,
                "base": plan.base, "tokens_before": plan.tokens_before, "forced": plan.forced,
                "attempt_over_truncation": carry is not None}))
            outcome.tokens_before = plan.tokens_before
            record, stages, interrupted = self._summarize(session_id, data, plan, use_llm,
                                                          deadline, counter, llm_failed)
            kept = carry is not None and plan.base_summary is carry
            if kept:
                stages = [*stages, "merged_over_truncation"]
        result = _commit_retried(
            lambda: (self.store.commit_summary(session_id, record, state.version)
                     if lease_token is None else
                     self.store.commit_under_lease(session_id, record, state.version,
                                                   lease_token)), session_id)
        if not result.ok and result.reason == "lease":
            outcome.status = "lease_lost"
            outcome.reason = ("commit refused: this job's lease expired or passed to another "
                              "job (fenced); the holder now runs the session")
            return outcome, None
        if not result.ok and interrupted is not None:
            raise interrupted
        if not result.ok:
            current = self.store.state(session_id)
            outcome.status = "covered" if current.watermark >= record.watermark else "conflict"
            outcome.reason = f"compare-and-swap lost ({result.reason})"
            reusable = self._only_truncations(session_id, state.version, current.version)
            return outcome, _Lost(record, state.version, reusable)
        if self.recall_indexer is not None:  # recall (issue 16)
            _index_for_recall(self.recall_indexer, self.store, session_id, record.watermark)
        if interrupted is not None:  # the retry, or the fallback, goes on from the commit
            raise interrupted
        if state.force_requested:
            self.store.clear_state_flags(session_id, "force_requested")
        after = _view_after(data, record, result.version, counter)
        outcome.status = "compacted"
        outcome.over_truncation = kept
        outcome.tokens_after = self._estimate(after)[0]
        outcome.messages_after = after.length - after.state.watermark
        outcome.watermark_after = record.watermark
        outcome.summary_kind = record.kind
        outcome.stages = stages
        outcome.model = record.model
        outcome.summarizer_input_tokens = record.input_tokens
        outcome.summarizer_output_tokens = record.output_tokens
        return outcome, None

    def _summarize(self, session_id: str, data: ViewData, plan: _Plan, use_llm: bool,
                   deadline: float | None, counter: TokenCounter,
                   llm_failed: bool = False
                   ) -> tuple[SummaryRecord, list[str], SummarizerError | None]:
        """The record to commit, its stages, and what interrupted the fold if it stopped
        midway: the record then covers the chunks folded before (raises when those end
        at or before the watermark: committing them would move it back)."""
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
                                      start=start, keep_partial=True,
                                      counter=counter if self.engine.counter is self.counter
                                      else None)
        cut = plan.cut
        if draft.interrupted is not None and draft.covered is not None:
            cut = start + draft.covered
            if cut <= state.watermark:
                raise draft.interrupted
            ledger = previous_ledger.merge(extract_facts(messages[:draft.covered],
                                                         start=start)).capped(
                self.policy.max_ledger_chars)
        injected = ledger.missing_from(draft.text).render()
        if llm_failed:
            draft.stages.insert(0, FALLBACK_STAGE)
        elif not use_llm and self.engine.is_llm:  # the fallback after retries were spent
            failed = (_unavailable_count(self._backoff_record(session_id, data.summary))
                      if data.summary is not None else 0)
            draft.stages.insert(0, f"{UNAVAILABLE_STAGE}{failed + 1}")
        record = SummaryRecord(
            watermark=cut, kind=draft.kind,
            text=draft.text, ledger=injected, ledger_json=ledger.to_json(),
            tokens=0, covers_from=start, source_version=state.version, model=draft.model,
            input_tokens=draft.input_tokens, output_tokens=draft.output_tokens,
            stages=draft.stages)
        tokens = self.counter.text(summary_block(record))
        return record.model_copy(update={"tokens": tokens}), draft.stages, draft.interrupted


def _now() -> float:
    return time.time()


def _unavailable_count(summary: SummaryRecord) -> int:
    """Offline fallbacks in a row after the LLM was unreachable, ending with ``summary``."""
    for stage in summary.stages:
        if stage.startswith(UNAVAILABLE_STAGE) and stage[len(UNAVAILABLE_STAGE):].isdigit():
            return int(stage[len(UNAVAILABLE_STAGE):])
    return 0


def _rebuild_due(summary: SummaryRecord) -> bool:
    """Whether a rebuild of ``summary`` may be tried before a compaction is due."""
    failed = _unavailable_count(summary)
    if failed < 2:  # one failure may have been a blip: the next job tries at once
        return True
    wait = min(REBUILD_BACKOFF_MAX_SECONDS, REBUILD_BACKOFF_SECONDS * 2 ** (failed - 2))
    return bool(_now() - summary.created_at >= wait)


def _index_for_recall(indexer: RecallIndexer, store: SessionStore, session_id: str,
                      watermark: int) -> None:
    """A failure costs recall of that range until the next index call, never the
    compaction."""
    try:
        indexer(store, session_id, watermark)
    except Exception:
        log.warning("recall indexing failed for %s", session_id, exc_info=True)


def _view_after(data: ViewData, record: SummaryRecord, version: int,
                counter: TokenCounter) -> ViewData:
    """The view as this commit left it, derived from the view it was written against.

    What the commit script changes: the watermark, version and summary
    fields of the state, the summary, and the cheap-stage decisions below the
    new watermark (dropped). Reading the session again only to report
    ``tokens_after`` cost a second full view load per job; messages appended
    since the read are not in this figure (they are not this job's doing).
    """
    kept = record.watermark - data.state.watermark
    state = data.state.model_copy(update={
        "version": version, "watermark": record.watermark, "summary_tokens": record.tokens,
        "summary_kind": record.kind, "force_requested": 0})
    dropped = sum(counter.message(m) for m in data.history[:kept])
    return data.model_copy(update={
        "state": state, "history": data.history[kept:], "summary": record,
        "tokens_before_watermark": data.tokens_before_watermark + dropped,
        "cheap": {i: d for i, d in data.cheap.items() if i >= record.watermark}})


__all__ = ["REBUILD_BACKOFF_MAX_SECONDS", "REBUILD_BACKOFF_SECONDS", "UNAVAILABLE_STAGE",
           "Compactor", "JobOutcome", "RecallIndexer", "index_inline"]
