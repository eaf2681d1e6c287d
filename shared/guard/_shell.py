"""What the sync and async guards share besides the core: everything but the I/O.

A shell validates the request, turns it into a :class:`shared.core.guard_state.Request`
(fixed figures cached per system prompt, tool set and model), keeps the
session cache and the last request sent per session, and performs the
core's plan with its own client. Only the last step differs between
:mod:`shared.guard.sync` and :mod:`shared.guard.aio`. The cached views and the reads
they save (the change feed, the own-writes connection) are :mod:`shared.guard._fresh`.

Observability (docs/observability.md, "Guard instrumentation") lives here
too, once for both shells: the spans (:meth:`GuardShell.traced_prepare`,
:meth:`~GuardShell.traced_recover`, :meth:`~GuardShell.traced_turn`, a
``producer`` span around the append and the publish, so the job's message
carries its trace context) and the metrics, recorded from the core's plan
(:meth:`~GuardShell.performed`, :meth:`~GuardShell.finish`), the degraded
view, the overflow check and the usage report (:meth:`~GuardShell.turn_usage`).
"""

from __future__ import annotations

import copy
import functools
import gc
import hashlib
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from shared.core.boundedlru import BoundedLRU
from shared.core.budget import ensure_reducible
from shared.core.calibration import model_family, prior_ratio
from shared.core.config import CompactionPolicy
from shared.core.errors import InvalidInput
from shared.core.fastjson import MAX_DEPTH, deeper_than
from shared.core.guard_state import Plan, Request, check, newest_tokens
from shared.core.limits import (
    MIN_INPUT_TOKENS,
    LimitBook,
    ModelLimits,
    known_window,
    model_limits,
    output_reserve,
)
from shared.core.messages import Message, validate_message, validate_messages
from shared.core.pairs import PairScan
from shared.core.prepared import PreparedView, ViewReport
from shared.core.recall_tool import offers_recall
from shared.core.records import RawView, SessionState, SummaryRecord
from shared.core.renamed import adopted, made_up_keys, made_up_results, open_named
from shared.core.repair import repair_tool_pairs
from shared.core.tokens import DEFAULT_COUNTER, TokenCounter
from shared.core.truncation import emergency_truncate
from shared.core.usage import reported_prompt_tokens
from shared.core.usage_learning import Sent, usage_fields
from shared.core.view import SUMMARY_JOIN, Regions, ViewCache, assemble
from shared.core.viewcache import CachedView, KnownCounts
from shared.guard._fresh import FreshViews
from shared.guard._pending import PendingTurns
from shared.guard._recovery import Recovery
from shared.guard._tracing import Traced
from shared.store import commands
from shared.store.changes import ChangeFeed
from shared.store.commands import EncodedBatch
from shared.store.own_writes_aio import AsyncOwnWrites
from shared.store.own_writes_sync import OwnWrites
from shared.telemetry import get_metrics

log = logging.getLogger("shared.guard")
DEFAULT_MODEL = "gpt-4o"
"""What a call that names no model is budgeted for (with a warning)."""


WRITES = ("update_state", "clear_state_flags", "record_cheap", "commit_summary", "mark_pending",
          "clear_pending")
"""The store's methods a prepare writes with: the own-writes connection stands in for
them only where they are the store class's own (a store that overrides one, such as a
dry run that drops writes, keeps them)."""


def plain_writes(store: Any, base: type) -> bool:
    """Whether ``store``'s write methods are ``base``'s, not overridden (a tenant handle
    forwards to its store's)."""
    for name in WRITES:
        method = getattr(store, name, None)
        if getattr(method, "__func__", None) is not getattr(base, name, None):
            return False
    return True


def check_request(system_prompt: object, tools: object) -> None:
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


MAX_MODEL_CHARS = 256
"""The longest model name taken (a Bedrock ARN or a Vertex resource path is ~100)."""
_MODEL_OK = re.compile(r"[^\x00-\x1f\x7f\ud800-\udfff]+")


@functools.lru_cache(maxsize=256)
def _printable(model: str) -> bool:
    return _MODEL_OK.fullmatch(model) is not None


def check_model(model: str) -> str:
    """``model`` as given, refused naming the field when it is a string no provider names
    a model with (control characters, a lone surrogate, over :data:`MAX_MODEL_CHARS`): it
    is stored in the session's state and logged; a lone surrogate failed the state's write
    as if Redis were down. Other types are left to :func:`model_limits`, which names them.
    (Checked once per name: every prepare names its model.)"""
    if isinstance(model, str) and model and (len(model) > MAX_MODEL_CHARS
                                             or not _printable(model)):
        raise InvalidInput(f"expected a model name of at most {MAX_MODEL_CHARS} printable "
                           f"characters, got {model!r:.80}", field="model")
    return model


def check_min_length(min_length: object) -> int | None:
    """``prepare``'s ``min_length``: a log length, or None."""
    if min_length is None:
        return None
    if isinstance(min_length, bool) or not isinstance(min_length, int) or min_length < 0:
        raise InvalidInput(f"expected a log length (an int >= 0), got {min_length!r}",
                           field="min_length")
    return min_length


COLLECT_AFTER = 2_000
"""A read that brought at least this many messages collects the young generations of the
garbage collector at once (:func:`settle_garbage`)."""


def settle_garbage(raw: RawView) -> None:
    """After a large read (a cold start, a view read again after a summary): collect the
    young generations now, so the read pays for the objects it made. Left alone, they sit
    in the youngest generation until the allocation count next triggers a collection,
    which then walks all of them during whatever call comes next: 3-4 ms twice (young,
    then middle generation) in the guard's later warm calls after a 10k-message read.
    Nothing is done while the application has the collector disabled."""
    if len(raw.messages) >= COLLECT_AFTER and gc.isenabled():
        gc.collect(1)


class GuardShell(FreshViews, Recovery):
    """State and pure helpers of a guard shell (no store calls here)."""

    store: Any  # the shell's; read here for its tenant only (the spans name it)

    def __init__(self, counter: TokenCounter | None, policy: CompactionPolicy | None,
                 overrides: Mapping[str, ModelLimits | int] | None,
                 view_cache: ViewCache | None) -> None:
        self.policy = policy or CompactionPolicy()
        self.overrides = dict(overrides or {})
        self.counter = counter or DEFAULT_COUNTER
        self.limits = LimitBook()
        self.views = view_cache if view_cache is not None else ViewCache()
        self._fixed_cache: dict[str, int] = {}
        self._tools_seen: tuple[Any, int, bool] | None = None
        self._system_seen: tuple[str, int] | None = None
        self._overhead = self._counted_overhead()  # per request
        self._limits_seen: dict[tuple[str, int, LimitBook, int], ModelLimits] = {}
        self._known_seen: dict[str, int | None] = {}
        # per session, bounded with the view cache (every tenant's guard of a server together)
        self._sent: BoundedLRU[Sent]
        self._unanswered: BoundedLRU[tuple[list[Message], str]]
        self._sent, self._unanswered = self.views.remembered()
        self._capped_seen: set[tuple[str, int, int]] = set()
        self.turns = PendingTurns(self.counter, *self.views.pending())
        self.known_ids = self.views.known_ids()
        self._lock = threading.Lock()
        self.feed: ChangeFeed | None = None
        self.own: OwnWrites | AsyncOwnWrites | None = None
        self._own_shared = False
        self._base = ""
        self.server: tuple[Any, ...] | None = None  # the store's Redis: redis_server()
        self._default_model_warned = False
        self.model_limits(DEFAULT_MODEL)  # loads the limits registry now, not in the first prepare

    def given_model(self, model: str | None) -> str:
        """``model``, or :data:`DEFAULT_MODEL` with one warning per guard: a caller that
        forgets ``model=`` on an 8k model would be budgeted a 128k window in silence
        (a misspelt name already warns, as an unknown model)."""
        if model is not None:
            return check_model(model)
        if not self._default_model_warned:
            self._default_model_warned = True
            log.warning("no model given: budgeting for %s's window; pass model= (the model "
                        "the view is sent to) so the budget is its own", DEFAULT_MODEL)
        return DEFAULT_MODEL

    # -- fixed figures ---------------------------------------------------------------
    def _cached(self, key: str, compute: Callable[[], int]) -> int:
        value = self._fixed_cache.get(key)
        if value is None:
            if len(self._fixed_cache) > 256:
                self._fixed_cache.clear()
            value = self._fixed_cache[key] = compute()
        return value

    def _counted_overhead(self) -> tuple[TokenCounter, int, int]:
        return self.counter, self.counter.messages([]), self.counter.text(SUMMARY_JOIN)

    def _request_overhead(self) -> tuple[int, int]:
        """The counter's tokens per request, whatever its messages, and of the join of a
        summary to the system prompt (made once per counter: counting even a line break
        costs a warm prepare ~10%)."""
        if self._overhead[0] is not self.counter:
            self._overhead = self._counted_overhead()
        return self._overhead[1], self._overhead[2]

    def _system_tokens(self, system_prompt: str) -> int:
        last = self._system_seen  # an agent sends the same prompt call after call
        if last is not None and last[0] == system_prompt:
            return last[1]
        key = "s" + hashlib.blake2b(system_prompt.encode(), digest_size=16).hexdigest()
        tokens = self._cached(key, lambda: self.counter.message(
            Message(role="system", content=system_prompt)) if system_prompt else 0)
        self._system_seen = (system_prompt, tokens)
        return tokens

    def _tool_figures(self, tools: Sequence[Mapping[str, Any]] | None) -> tuple[int, bool]:
        """Tokens of the tool definitions, and whether they offer ``recall``."""
        if not tools:
            return 0, False
        seen = self._tools_seen
        if seen is not None and seen[0] == tools:  # the same definitions as last call
            return int(seen[1]), bool(seen[2])
        if deeper_than(tools):
            raise InvalidInput(f"nested more than {MAX_DEPTH} levels deep", field="tools")
        try:
            raw = json.dumps(tools, sort_keys=True, default=str)
        except (ValueError, RecursionError) as exc:
            raise InvalidInput(f"not serializable as JSON: {str(exc)[:200]}",
                               field="tools") from None
        key = "t" + hashlib.blake2b(raw.encode(), digest_size=16).hexdigest()
        tokens = self._cached(key, lambda: self.counter.tools(list(tools)))
        offers = offers_recall(tools)
        # a copy: the caller may mutate its list
        self._tools_seen = (copy.deepcopy(list(tools)), tokens, offers)
        return tokens, offers

    def known_window(self, model: str) -> int | None:
        """``model``'s window as this guard knows it without learned limits (its override,
        the registry, a family default; None: a guess): what a learned window stored with
        no owner is judged against (:meth:`SessionState.learned_for`)."""
        if not model.strip():
            return None
        if model not in self._known_seen:
            if len(self._known_seen) > 256:
                self._known_seen.clear()
            self._known_seen[model] = known_window(
                model_limits(model, overrides=self.overrides or None))
        return self._known_seen[model]

    def model_limits(self, model: str, state: SessionState | None = None) -> ModelLimits:
        stated = (state.learned_for(model, lambda: self.known_window(model))
                  if state is not None else 0)
        if not isinstance(model, str):  # model_limits names the bad field
            return model_limits(model, overrides=self.overrides or None,
                                learned=self._learned(self.limits, model, stated) or None)
        book = self.limits  # a caller may put another book in its place
        key = (model, stated, book, book.version)  # the version: read before the book
        found = self._limits_seen.get(key)
        if found is None:
            found = model_limits(model, overrides=self.overrides or None,
                                 learned=self._learned(book, model, stated) or None)
            if len(self._limits_seen) > 256:
                self._limits_seen.clear()
            self._limits_seen[key] = found
        return found

    @staticmethod
    def _learned(book: LimitBook, model: str, stated: int) -> dict[str, int]:
        """The limits learned in this process, and the one the session's state holds for
        its model (``stated``, 0: none): the smaller of the two, since the session's own
        bound comes from a request its endpoint refused (another process, or the book's
        figure from another session's error, may know a larger one)."""
        learned = book.as_mapping()
        if stated:
            known = learned.get(model)
            learned[model] = stated if known is None else min(known, stated)
        return learned

    # -- the pending turn (shared.guard._pending) ------------------------------------------
    def pending(self, session_id: str, raw: Sequence[Message | Mapping[str, Any]],
                ) -> tuple[list[Message], list[int]]:
        """The pending messages, validated and counted (re-using an earlier call's work)."""
        return self.turns.rows(session_id, raw)

    def encode_turn(self, session_id: str, store: Any,
                    messages: Sequence[Message | Mapping[str, Any]]) -> EncodedBatch:
        """The turn encoded for its append (:meth:`SessionStore.encode`), re-using what the
        pending turn's prepares validated and counted (when the store counts with the
        guard's counter): recording a long tool chain does not count it all again."""
        known, counts, rows, slots, renamed = (self.turns.recorded(session_id, messages)
                                               if store.counter is self.counter
                                               else ([], {}, {}, [], None))
        validated = (known + [validate_message(item, i) for i, item in
                              enumerate(messages[len(known):], start=len(known))]
                     if known else validate_messages(messages))
        ids = self.stored_ids(session_id, validated)
        # the ids the turn's prepares sent, when the append would rename it the same way
        adopt = adopted(renamed, validated, ids) if known else None
        batch = commands.encode(messages, store.config,
                                KnownCounts(self.counter, counts) if known else store.counter,
                                validated=validated, known=ids, reuse=rows,
                                renamed=adopt[:2] if adopt is not None else None)
        if adopt is not None:
            batch.slots, batch.slots_for = adopt[2], batch.unique
        else:
            batch.slots = slots
        return batch

    def stored_ids(self, session_id: str, batch: Sequence[Message]) -> dict[str, str]:
        """The session's mapping of ``batch``'s call ids as far as this guard knows it: ids
        the cached view shows stored, and the newest stored id of ids its own appends
        wrote (:class:`~shared.core.callids.KnownIds`; they may have left the view). The
        first attempt renames them, not an ``ID_CONFLICT`` round trip."""
        ids = {c.id for m in batch for c in m.tool_calls}
        ids.update(m.tool_call_id for m in batch if m.role == "tool" and m.tool_call_id)
        if not ids:
            return {}
        cached = self.views.get(session_id)
        known = ({p: p for p in ids if cached.scan.taken(p)} if cached is not None else {})
        if made_up_results(batch):  # Gemini results paired by name: the view knows which
            if cached is not None:  # calls are unanswered; else this process's appends
                known.update(open_named(cached))
            else:
                ids.update(made_up_keys(batch))
        known.update(self.known_ids.of(session_id, ids))
        return known

    def _capped(self, limits: ModelLimits, max_tokens: int, reserve: int) -> None:
        """Say once per model and figure that ``max_tokens`` was capped: the provider
        refuses the uncapped figure (above the model's output cap, or with the prompt over
        the window), so the call must send the reserve instead
        (``view.report.budget.reserve``)."""
        model, window = limits.model, limits.context_window
        key = (model, max_tokens, window)
        with self._lock:
            if key in self._capped_seen:
                return
            if len(self._capped_seen) >= 1024:
                self._capped_seen.clear()
            self._capped_seen.add(key)
        why = (f"is above {model}'s output cap of {limits.max_output_tokens}"
               if limits.output_known and reserve == limits.max_output_tokens
               else f"leaves no input budget in {model}'s window of {window}")
        log.warning("max_tokens %d %s: the guard reserves %d; send view.report.budget.reserve "
                    "as max_tokens", max_tokens, why, reserve)

    def squeezed(self, req: Request, max_tokens: int | None, state: SessionState) -> bool:
        """Whether the window left no room for the answer the model could give
        (``max_tokens``, or the model's known output cap below it): the reserve was
        lowered to fit the request's fixed part, and a truncation it forces is this
        call's alone, not the session's (the next call, asking less, needs none)."""
        if max_tokens is None:
            return False
        limits = self.model_limits(req.model, state)
        possible = (min(max_tokens, limits.max_output_tokens) if limits.output_known
                    else max_tokens)
        return req.reserve < possible

    def scanned(self, session_id: str, req: Request, plan: Plan, base: PairScan) -> None:
        """Keep the pending turn's pair scan and truncation input for the turn's next call."""
        self.turns.scanned(session_id, req.extra, plan.extra_scan, base, plan.extra_cut,
                           plan.extra_renamed)

    def request(self, session_id: str, system_prompt: str,
                tools: Sequence[Mapping[str, Any]] | None, max_tokens: int | None, model: str,
                state: SessionState | None, extra: list[Message], extra_tokens: list[int],
                force_ratio: float | None, *, scan: PairScan | None = None,
                exact: bool = False, said: bool = True) -> Request:
        """The core's request. ``exact``: ``max_tokens`` was made to fit this very view (an
        output-reserve overflow's retry), so the reserve leaves the input no more room than
        its fixed part, not :func:`output_reserve`'s minimum input budget on top.
        ``said``: a reserve below ``max_tokens`` is logged (:meth:`_capped`); a recovery's
        requests are not (it says so of the view it sends)."""
        limits = self.model_limits(model, state)
        tool_tokens, offers = self._tool_figures(tools)
        so_far = self.turns.known(session_id, scan, extra)
        system_tokens, (overhead, join) = (self._system_tokens(system_prompt),
                                           self._request_overhead())
        fixed = system_tokens + tool_tokens + overhead + newest_tokens(extra, extra_tokens)
        reserve = output_reserve(limits, max_tokens, fixed_tokens=fixed,
                                 min_input_tokens=1 if exact else MIN_INPUT_TOKENS)
        if max_tokens is not None and reserve < max_tokens and said and not exact \
                and force_ratio is None:  # a recovery's views: it says so of the one sent
            self._capped(limits, max_tokens, reserve)
        moved = state is not None and state.unowned_learned() and state.model != model
        return Request(
            session_id=session_id, system_prompt=system_prompt, model=model,
            window=limits.context_window, reserve=reserve,
            limits_source=limits.source, system_tokens=system_tokens,
            tool_tokens=tool_tokens, overhead=overhead, summary_join=join,
            extra=extra, extra_tokens=extra_tokens,
            extra_wire=so_far.wire, extra_scan=so_far.scan, extra_cut=so_far.cut,
            extra_renamed=so_far.renamed, counted=so_far.counted,
            force_ratio=force_ratio,
            recall=self.policy.recall_notice and offers,
            unowned_kept=not moved or bool(state and state.learned_for(
                state.model, lambda: self.known_window(state.model))))

    def remember(self, session_id: str, sent: Sent) -> None:
        with self._lock:  # against unsent()'s look-then-put
            self._sent.put(session_id, sent)

    def unsent(self, session_id: str, sent: Sent | None) -> None:
        """``sent`` kept again: the append of the turn its usage report described failed
        (or was cancelled), and the retry's report describes it too; unless a prepare
        remembered another since."""
        if sent is not None:
            with self._lock:
                if self._sent.peek(session_id) is None:
                    self._sent.put(session_id, sent)

    def unanswered(self, session_id: str, messages: list[Message] | None, rid: str) -> None:
        """Keep the request id of a turn's append that raised or was cancelled (its
        script may have run), or forget the session's (``messages`` None: answered)."""
        if messages is None:
            if self._unanswered.peek(session_id) is not None:  # rare: no lock otherwise
                self._unanswered.pop(session_id)
            return
        self._unanswered.put(session_id, (messages, rid))

    def unanswered_id(self, session_id: str, messages: list[Message]) -> str | None:
        """The request id of the session's unanswered append when ``messages`` are its
        messages: the agent retries the turn (``asyncio.wait_for`` timed the call out, a
        framework cancelled its run, Redis did not answer) without a request id of its
        own, and the append script stores it at most once instead of twice."""
        with self._lock:
            kept = self._unanswered.get(session_id)
        return kept[1] if kept is not None and kept[0] == messages else None

    def take_sent(self, session_id: str, reported: bool) -> Sent | None:
        """The last request prepared, when a usage report describes it (else kept)."""
        with self._lock:
            self.turns.forget(session_id)  # the turn is recorded: a new one starts
            return self._sent.pop(session_id) if reported else None

    # -- observability: spans and metrics, the same for both shells ---------------------------
    # Each span names the tenant too: session ids are per tenant, and one server's guards
    # serve every tenant its tokens name (two tenants' session "s" were one in traces).
    def traced_prepare(self, session_id: str, model: str) -> Traced:
        return Traced.of("compaction.prepare", lambda: {"compaction.session_id": session_id,
                                                        "compaction.tenant": self.store.tenant,
                                                        "gen_ai.request.model": model})

    def traced_recover(self, session_id: str, model: str, error: object) -> Traced:
        return Traced("compaction.recover", {"compaction.session_id": session_id,
                                             "compaction.tenant": self.store.tenant,
                                             "gen_ai.request.model": model,
                                             "error.type": type(error).__name__})

    def traced_turn(self, session_id: str) -> Traced:
        """A producer span around the append and the publish: the job's message carries
        its trace context (:func:`shared.telemetry.propagation.publish_headers`)."""
        return Traced("compaction.record_turn", {"compaction.session_id": session_id,
                                                 "compaction.tenant": self.store.tenant},
                      kind="producer")

    @staticmethod
    def performed(plan: Plan, ok: bool) -> bool:
        """Count the writes of ``plan`` the shell performed (``ok``: its truncation, if
        any, won the swap); returns ``ok``."""
        if plan.cheap or plan.view.report.truncated:
            metrics = get_metrics()
            if plan.cheap:
                metrics.compaction("cheap", "recorded")
            if plan.view.report.truncated:
                metrics.compaction("recovery" if plan.view.report.recovery else "truncation",
                                   "compacted" if ok else "lost_swap")
        return ok

    @staticmethod
    def job_wanted(plan: Plan, snap: CachedView) -> tuple[bool, bool]:
        """Whether to request the summary job, and forced. Not again while the view shows
        one queued, forced already when this plan forces (each call of a tool chain that
        overflows truncates: it would write the same flag and read it back every call).
        Never while nothing is stored: a job compacts the stored log only, and a new
        session's first turn (a long tool chain) asked on every call, each job finding no
        session and clearing the flag for the next call to set again; the turn's record
        asks when the stored log is due."""
        if not snap.end:
            return False, False
        force = plan.force and not (snap.pending and snap.state.force_requested)
        return plan.enqueue and (force or not snap.pending), force

    @staticmethod
    def finish(plan: Plan, enqueued: bool, started: float) -> PreparedView:
        """The plan's view, finished, and its figures counted."""
        seconds = time.perf_counter() - started
        get_metrics().prepare_done(seconds, view_tokens=plan.sent.heuristic,
                                   log_tokens=plan.log_tokens,
                                   path="recover" if plan.view.report.recovery else "prepare")
        return plan.finish(enqueued, seconds * 1000)

    def turn_usage(self, session_id: str, usage: Any,
                   ) -> tuple[dict[str, Any] | None, Sent | None]:
        """State fields a turn's usage report teaches, and the request it describes.

        A suspected silent truncation (the provider saw more than its window,
        or far less than was sent) is logged and counted here.
        """
        reported = reported_prompt_tokens(usage)
        sent = self.take_sent(session_id, reported is not None)
        if sent is None or not reported:
            return None, sent
        fields = usage_fields(reported, sent)
        if "silent_truncation_flags" in fields:
            log.warning("session %s: reported %d prompt tokens for ~%d sent (window %d): "
                        "silent truncation suspected", session_id, reported, sent.estimate,
                        sent.window)
            get_metrics().silent_truncation()
        return fields, sent

    # -- Redis is down: a locally truncated view of the caller's own messages -----------------
    def degraded(self, session_id: str, system_prompt: str,
                 tools: Sequence[Mapping[str, Any]] | None, max_tokens: int | None,
                 model: str, history: list[Message], started: float) -> PreparedView:
        req = self.request(session_id, system_prompt, tools, max_tokens, model, None, [], [],
                           None)
        counter, policy = self.counter, self.policy
        tokens = [counter.message(m) for m in history]
        regions = Regions(req.system_tokens, 0, req.tool_tokens, sum(tokens), req.overhead)
        logged = regions.total
        newest = newest_tokens(history, tokens)
        report = check(req.window, req.reserve, regions, regions.total, newest, policy)
        dropped, note, summary = 0, "", None
        if not report.within_budget:
            ensure_reducible(report)
            fixed = regions.system + regions.tools + regions.overhead
            budget = max(1, int(report.input_budget * 0.95) - fixed)
            result = emergency_truncate(history, budget, counter,
                                        drop_fraction=policy.emergency_drop_fraction)
            history, dropped, note = result.messages, result.dropped, result.note
            summary = SummaryRecord(watermark=0, kind="truncation", text=note,
                                    tokens=counter.text(note) + 8)
            regions = Regions(regions.system, summary.tokens, regions.tools,
                              sum(counter.message(m) for m in history), regions.overhead)
            report = check(req.window, req.reserve, regions, regions.total, newest, policy)
        messages = assemble(system_prompt, summary, repair_tool_pairs(history),
                            placement=policy.summary_placement)
        seconds = time.perf_counter() - started
        get_metrics().prepare_done(seconds, view_tokens=regions.total, log_tokens=logged,
                                   path="degraded")
        return PreparedView.model_construct(messages=messages, report=ViewReport.model_construct(
            session_id=session_id, model=model, limits_source=req.limits_source, budget=report,
            estimated_prompt_tokens=regions.total, watermark=0, version=0, length=len(history),
            summary_kind="", cheap_applied=0, truncated=dropped > 0, dropped_messages=dropped,
            note=note, enqueued=False, pending_job=False, recovery=False, degraded=True,
            elapsed_ms=seconds * 1000))

    def stats_from(self, session_id: str, tenant: str, snap: Any,
                   summaries: Sequence[SummaryRecord]) -> dict[str, Any]:
        """Tokens by region, usage ratio, watermark, summaries, pending job."""
        from shared.core.view import view_estimate

        state = snap.state
        limits = self.model_limits(state.model or DEFAULT_MODEL, state)
        # capped as prepare caps it: a window learned since below the stored max_tokens
        reserve = output_reserve(limits, state.max_tokens or None)
        prior = prior_ratio(state.model, self.counter)
        regions, estimated = view_estimate(state, snap.summary, snap.history_tokens, snap.saved,
                                           snap.end, overhead=self.counter.messages([]),
                                           prior=prior, family=model_family(state.model))
        report = check(limits.context_window, reserve, regions, estimated, 0, self.policy)
        return {
            "session_id": session_id, "tenant": tenant, "length": snap.end,
            "watermark": state.watermark, "version": state.version, "model": state.model,
            "window": limits.context_window, "limits_source": limits.source,
            "reserve": reserve, "regions": {"system": regions.system,
                                            "summary": regions.summary,
                                            "tools": regions.tools, "history": regions.history},
            "estimated_prompt_tokens": estimated, "usage_ratio": report.usage_ratio,
            "should_compact": report.should_compact, "within_budget": report.within_budget,
            "summary_kind": state.summary_kind, "cheap_decisions": len(snap.cheap),
            "summaries": [{"watermark": s.watermark, "kind": s.kind, "tokens": s.tokens,
                           "created_at": s.created_at} for s in summaries],
            "pending_job": snap.pending,
            "calibration_ratio": state.calibration_ratio if state.calibration_samples and (
                state.calibration_family in ("", model_family(state.model))) else prior,
            "calibration_samples": state.calibration_samples,
            "silent_truncation_flags": state.silent_truncation_flags,
            "requests_failed": state.requests_failed,
            "last_request_failure": state.last_request_failure or None,
        }


__all__ = ["GuardShell", "Traced", "check_request"]  # Traced: from _tracing
