"""The asynchronous guard (redis.asyncio): the same core and plan, awaited.

``prepare`` reads what changed in the session since the cached view (one
atomic script), lets the core (:func:`shared.core.guard_state.plan_view`)
decide, performs the plan's writes (figures, cheap decisions, a truncation
through the compare-and-swap, the job) and returns the view. ``record_turn``
appends and enqueues, coalesced. ``recover`` handles a context-overflow
error: learn the stated limit, compact hard, return a view for one retry.

Its twin :mod:`shared.guard.sync` is the same code without ``await``; both
are tested by the same tests (tests/test_guard.py runs every test on both).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from shared.core.config import CompactionPolicy
from shared.core.errors import StoreUnavailable
from shared.core.guard_state import Plan, plan_view
from shared.core.limits import ModelLimits
from shared.core.messages import Message, check_tool_results, validate_messages
from shared.core.prepared import PreparedView
from shared.core.recall import DEFAULT_LIMIT, RecallHit
from shared.core.records import AppendResult
from shared.core.tokens import TokenCounter
from shared.core.view import ViewCache
from shared.core.viewcache import CachedView, decode_view
from shared.core.wireview import carry
from shared.enqueue import Enqueuer, NullEnqueuer, redis_server
from shared.guard._shell import (
    GuardShell,
    check_min_length,
    check_request,
    plain_writes,
    settle_garbage,
)
from shared.store import recall_query
from shared.store.aio import AsyncSessionStore
from shared.store.changes import CHANGED, ChangeFeed
from shared.store.commands import Command
from shared.store.keys import validate_session_id
from shared.store.own_writes import OwnMark, vouch
from shared.store.own_writes_aio import AsyncOwnWrites

log = logging.getLogger("shared.guard")
R = TypeVar("R")


class AsyncContextGuard(GuardShell):
    """Asynchronous, LLM-free context guard for one tenant's sessions (asyncio).

    ``view_cache``: the views it keeps between calls (default: 256 sessions,
    200,000 messages in all, about :data:`shared.core.viewcache.BYTES_PER_MESSAGE`
    bytes each); ``ViewCache(0, 0)`` turns caching off. ``watch_changes``: skip the
    read while Redis reports nothing of the session written since the cached one
    (client tracking, :mod:`shared.store.changes`; a connection of its own, used
    where the server supports it; a :class:`~shared.store.changes.ChangeFeed` to share
    one between guards, e.g. one per tenant). ``warm_up``: connect the change feed at
    construction (:meth:`warm_up` connects the rest). One guard per process is the
    intended use; it is thread-safe.
    """

    def __init__(self, store: AsyncSessionStore, enqueuer: Enqueuer | None = None, *,
                 policy: CompactionPolicy | None = None,
                 overrides: Mapping[str, ModelLimits | int] | None = None,
                 counter: TokenCounter | None = None,
                 view_cache: ViewCache | None = None,
                 watch_changes: bool | ChangeFeed = True, warm_up: bool = True) -> None:
        super().__init__(counter or store.counter, policy, overrides, view_cache)
        self.store = store
        self.enqueuer = enqueuer or NullEnqueuer()
        self.server = redis_server(getattr(store, "redis", None))
        self.watch(getattr(store, "redis", None), store.config.key_prefix, store.tenant,
                   watch_changes)
        if warm_up:
            self.mark()  # the change feed connects now (its connection is a blocking one)

    async def warm_up(self) -> None:
        """Connect now, best effort (the store's connection, its scripts, the change feed):
        the first ``prepare`` then pays only for its read. The constructor connects only
        the feed: the store's connection belongs to the event loop that awaits this."""
        warm = getattr(self.store, "warm_up", None)
        if warm is not None:
            await warm()
        self.mark()
        if isinstance(self.own, AsyncOwnWrites):
            await self.own.warm_up()

    # -- reading -------------------------------------------------------------------
    async def snapshot(self, session_id: str, min_length: int | None = None) -> CachedView:
        """The session's view, read incrementally against the cached one (one round trip,
        none while Redis reports nothing of the session written since the cached read and
        the log is known to be no longer than it: ``min_length``)."""
        validate_session_id(session_id)  # before it is used as a cache key
        if not self.behind(session_id, min_length):
            fresh = self.fresh(session_id)
            if fresh is not None:
                return fresh
            own = self.own_vouched(session_id)
            if own is not None and isinstance(self.own, AsyncOwnWrites):
                seen = await self.own.since(self.session_base(session_id), own[1])
                if seen != CHANGED:
                    return self.settled(session_id, own[0], max(seen, own[2]))
        cached = self.views.get(session_id)
        mark = self.mark()
        raw = await self.store.read_view(
            session_id, cached.cursor if cached is not None else None, with_counts=True)
        snap = decode_view(raw, cached, carry)
        settle_garbage(raw)
        snap.mark = mark
        if raw.epoch:
            self.views.put(session_id, snap)
        return snap

    async def load(self, session_id: str) -> CachedView:
        return await self.snapshot(session_id)

    # -- prepare -------------------------------------------------------------------
    async def prepare(self, session_id: str, system_prompt: str = "",
                tools: Sequence[Mapping[str, Any]] | None = None,
                max_tokens: int | None = None, model: str = "gpt-4o", *,
                pending: Sequence[Message | Mapping[str, Any]] = (),
                fallback_messages: Sequence[Message | Mapping[str, Any]] | None = None,
                min_length: int | None = None) -> PreparedView:
        """The view to send now, with its budget report.

        ``pending`` are messages of the current turn not yet recorded (the
        new user message, say). ``fallback_messages``: when Redis is down,
        build a locally truncated view from these instead of raising.
        ``min_length``: the log length ``record_turn`` returned in another process
        that handed this turn over (a job, an HTTP request): the view then holds
        that turn even if Redis's change notice has not reached this process yet.
        """
        started = time.perf_counter()
        with self.traced_prepare(session_id, model) as trace:
            validate_session_id(session_id)  # before it is used as a cache key
            check_request(system_prompt, tools)
            check_min_length(min_length)
            extra, extra_tokens = self.pending(session_id, pending)
            try:
                snap = await self.snapshot(session_id, min_length)
            except StoreUnavailable:
                if fallback_messages is None:
                    raise
                return trace.view(self.degraded(session_id, system_prompt, tools, max_tokens,
                                                model, validate_messages(fallback_messages)
                                                + extra, started))
            force = self.policy.recovery_ratio if snap.state.recover_next else None
            return trace.view(await self._build(session_id, snap, system_prompt, tools,
                                                max_tokens, model, extra, extra_tokens, started,
                                                force))

    async def _build(self, session_id: str, snap: CachedView, system_prompt: str,
               tools: Sequence[Mapping[str, Any]] | None, max_tokens: int | None, model: str,
               extra: list[Message], extra_tokens: list[int], started: float,
               force_ratio: float | None, retry_lost_swap: bool = True) -> PreparedView:
        req = self.request(session_id, system_prompt, tools, max_tokens, model, snap.state,
                           extra, extra_tokens, force_ratio, scan=snap.scan)
        base = snap.scan
        plan, snap = plan_view(snap, req, self.policy, self.counter)
        self.scanned(session_id, req, plan, base)
        if snap.epoch:
            self.views.put(session_id, snap)
        # a job already queued (the flag in this view) needs no second request
        wanted, force = self.job_wanted(plan, snap)
        done = await self._perform_own(session_id, plan, snap, wanted, force)
        won = await self._perform(session_id, plan) if done is None else done[0]
        if not self.performed(plan, won) and retry_lost_swap:
            # A worker's summary (or an edit) landed since the read: build from it
            # instead (it may fit without truncating), once.
            fresh = await self.snapshot(session_id)
            return await self._build(session_id, fresh, system_prompt, tools, max_tokens, model,
                                     extra, extra_tokens, started, force_ratio,
                                     retry_lost_swap=False)
        self.remember(session_id, plan.sent)
        if done is not None:
            enqueued = done[1]
        else:
            enqueued = await self._enqueue(session_id, force=force) if wanted else False
        return self.finish(plan, enqueued, started)

    async def _perform_own(self, session_id: str, plan: Plan, snap: CachedView, wanted: bool,
                           force: bool) -> tuple[bool, bool] | None:
        """See :meth:`shared.guard.sync.ContextGuard._perform_own`."""
        if not (plan.figures or plan.cheap or plan.truncation is not None
                or plan.clear_recover_next or wanted) or not isinstance(self.own, AsyncOwnWrites) \
                or not plain_writes(self.store, AsyncSessionStore):
            return None
        job = self.inline_job(self.enqueuer, self.store.tenant, session_id, snap) \
            if wanted else None
        built = self.own_steps(self.store, session_id, plan, snap.cursor, wanted, force,
                               job)
        before = self.own_tally(session_id)
        if built is None or before is None:
            return None
        self.touched(session_id)
        done = await self.own.run_many(self.session_base(session_id), built[0])
        if done is None:
            return None
        won, marked, pushed = self.own_written(session_id, snap, built[0], built[1], *done,
                                               before)
        return won, marked and (pushed or await self._publish(session_id))

    async def _perform(self, session_id: str, plan: Plan) -> bool:
        """The plan's writes, in order; False when its truncation lost the swap."""
        if plan.figures or plan.cheap or plan.truncation is not None or plan.clear_recover_next:
            self.touched(session_id)
        if plan.figures:
            await self.store.update_state(session_id, **plan.figures)
        if plan.cheap:
            await self.store.record_cheap(session_id, plan.cheap, plan.version)
        if plan.truncation is not None:
            result = await self.store.commit_summary(session_id, plan.truncation, plan.version)
            if not result.ok:
                log.info("truncation summary for %s lost its swap (%s)", session_id,
                         result.reason)
                return False
        if plan.clear_recover_next:
            await self.store.update_state(session_id, recover_next=0)
        return True

    async def _enqueue(self, session_id: str, *, force: bool = False) -> bool:
        if force:
            self.touched(session_id)
            await self.store.update_state(session_id, force_requested=1)
        if not await self.store.mark_pending(session_id):
            return False
        return await self._publish(session_id)

    async def _publish(self, session_id: str) -> bool:
        """Publish the job (the enqueuer is synchronous: a broker publish, ~1 ms)."""
        try:
            self.enqueuer.enqueue(self.store.tenant, session_id)
        except Exception as exc:
            with contextlib.suppress(StoreUnavailable):
                await self.store.clear_pending(session_id)
            log.warning("enqueue failed for session %s: %s", session_id, exc)
            return False
        return True

    # -- after the call --------------------------------------------------------------
    async def record_turn(self, session_id: str, messages: Sequence[Message | Mapping[str, Any]],
                    usage: Any = None, *, request_id: str | None = None) -> int:
        """Append the turn's messages and enqueue ``maybe_summarize`` (coalesced).

        ``usage`` is the provider's usage for the request that produced the
        last assistant message of ``messages`` (the last prepared view); it
        anchors the hybrid estimate and updates the calibration (written by
        the append itself, only if no compaction or edit changed the view
        since). The append carries a request id and is retried once with
        it when Redis did not answer: applied at most once. Once the turn is
        stored, a failure to publish the job is logged, not raised.
        """
        with self.traced_turn(session_id) as trace:  # the publish carries its context
            validate_session_id(session_id)
            encoded = self.encode_turn(session_id, self.store, messages)
            check_tool_results(encoded.messages)  # an orphan result: InvalidInput naming its index
            fields, sent = self.turn_usage(session_id, usage)
            rid = request_id if request_id is not None else secrets.token_hex(12)

            marks: list[OwnMark | None] = []

            async def attempt() -> AppendResult:
                return await self.store.append_encoded(
                    session_id, encoded, request_id=rid, mark_pending=self.policy.proactive,
                    state_fields=fields, fields_version=sent.version if sent else None,
                    with_state=cached is not None, job=job,
                    run=functools.partial(self._run_own, session_id, marks))

            cached = self.views.get(session_id)
            job = self.inline_job(self.enqueuer, self.store.tenant, session_id,
                                  self.unflagged(session_id, cached))
            self.touched(session_id)
            try:
                result = await attempt()
            except StoreUnavailable as exc:
                log.info("session %s: append %s unanswered (%s); retrying once", session_id,
                         rid, exc)
                result = await attempt()
            self.appended(session_id, cached, result, marks[-1] if marks else None)
            if result.marked and not result.published:
                await self._publish(session_id)
            return trace.turn(result.length)

    async def _run_own(self, session_id: str, marks: list[OwnMark | None],
                       cmd: Command[AppendResult]) -> AppendResult:
        """See :meth:`shared.guard.sync.ContextGuard._run_own`."""
        done = None
        before = self.own_tally(session_id) if isinstance(self.own, AsyncOwnWrites) else None
        if isinstance(self.own, AsyncOwnWrites) and before is not None:
            done = await self.own.run(self.session_base(session_id), cmd.script, cmd.keys,
                                      cmd.args)
        if done is None:
            marks.append(None)
            return await self.store.execute(cmd)
        reply, mark = done
        marks.append(vouch(mark, before, self.own_tally(session_id)))
        return cmd.parse(reply)

    # -- reactive recovery -----------------------------------------------------------------
    async def recover(self, session_id: str, error: object, system_prompt: str = "",
                tools: Sequence[Mapping[str, Any]] | None = None,
                max_tokens: int | None = None, model: str = "gpt-4o", *,
                pending: Sequence[Message | Mapping[str, Any]] = (),
                prepared_tokens: int | None = None,
                min_length: int | None = None) -> PreparedView | None:
        """See :meth:`shared.guard.sync.ContextGuard.recover`."""
        check_min_length(min_length)
        decided = self.overflow_ratio(session_id, error, model, max_tokens, prepared_tokens)
        if decided is None:
            return None
        ratio, recognised = decided
        with self.traced_recover(session_id, model, error) as trace:
            if not recognised:
                trace.current.set_attribute("compaction.unrecognised_error", True)
            validate_session_id(session_id)
            limit = self.learn_overflow(session_id, error, model, trace, prepared_tokens)
            if limit:
                self.touched(session_id)
                await self.store.update_state(session_id, learned_window=limit, model=model,
                                              last_overflow_at=time.time())
            started = time.perf_counter()
            extra, extra_tokens = self.pending(session_id, pending)
            snap = await self.snapshot(session_id, min_length)
            return trace.recovered(await self._build(session_id, snap, system_prompt, tools,
                                                     max_tokens, model, extra, extra_tokens,
                                                     started, ratio))

    async def call(self, session_id: str, send: Callable[[PreparedView], Awaitable[R]], *,
             system_prompt: str = "", tools: Sequence[Mapping[str, Any]] | None = None,
             max_tokens: int | None = None, model: str = "gpt-4o",
             pending: Sequence[Message | Mapping[str, Any]] = ()) -> tuple[R, PreparedView]:
        """prepare -> send -> on overflow recover and send once more."""
        view = await self.prepare(session_id, system_prompt, tools, max_tokens, model,
                                  pending=pending)
        try:
            return await send(view), view
        except Exception as exc:
            retry = await self.recover(session_id, exc, system_prompt, tools, max_tokens, model,
                                 pending=pending)
            if retry is None:
                raise
        return await send(retry), retry

    # -- recall ------------------------------------------------------------------------
    async def recall(self, session_id: str, query: str, *, limit: int = DEFAULT_LIMIT,
                     start: int | None = None, end: int | None = None) -> list[RecallHit]:
        """Messages of the session's compacted range that best match ``query``, best first.

        The sync guard's query over redis.asyncio: the same sans-I/O steps
        (:func:`shared.store.recall_query.recall_steps`), each reply awaited.
        """
        return await recall_query.recall_async(self.store, session_id, query, limit=limit,
                                               start=start, end=end)

    async def aclose(self) -> None:
        """Close the guard's own connections (the change feed and the own-writes one) on
        this event loop; the guard keeps working, reading every call. The store's client
        is the caller's to close."""
        if isinstance(self.own, AsyncOwnWrites):
            await self.own.aclose()
        self.close()

    async def stats(self, session_id: str) -> dict[str, Any]:
        """Tokens by region, usage ratio, watermark, summaries, pending job."""
        snap = await self.snapshot(session_id)
        return self.stats_from(session_id, self.store.tenant, snap,
                               await self.store.summaries(session_id))


__all__ = ["AsyncContextGuard"]
