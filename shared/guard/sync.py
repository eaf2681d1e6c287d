"""The synchronous guard (redis-py): the guard's flows, each call blocking.

What a guard does is written once, as steps (:mod:`shared.guard._flow`):
``prepare`` reads what changed since the cached view, lets the core
(:func:`shared.core.guard_state.plan_view`) decide and performs the plan's
writes; ``record_turn`` appends and enqueues, coalesced; ``recover`` handles a
context-overflow error. This shell performs each step with a blocking call
(:meth:`ContextGuard.drive`); its twin :mod:`shared.guard.aio` awaits them. Both
are tested by the same tests.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, cast

from shared.core.config import CompactionPolicy
from shared.core.errors import InvalidInput
from shared.core.limits import ModelLimits
from shared.core.messages import Message
from shared.core.prepared import PreparedView
from shared.core.recall import DEFAULT_LIMIT, RecallHit
from shared.core.tokens import TokenCounter
from shared.core.view import ViewCache
from shared.core.viewcache import CachedView
from shared.enqueue import Enqueuer, NullEnqueuer, redis_server
from shared.guard._flow import Steps, abandon
from shared.guard._recover_flow import RecoveringFlow
from shared.store import recall_query
from shared.store.changes import ChangeFeed
from shared.store.own_writes_sync import OwnWrites
from shared.store.sessions import SessionStore

log = logging.getLogger("shared.guard")
R = TypeVar("R")
T = TypeVar("T")


def sync_store(store: SessionStore) -> SessionStore:
    """``store``, refused if it is an asyncio one: its calls would hand the flows
    coroutines where they expect replies, failing at the first call, far from the cause."""
    if inspect.iscoroutinefunction(getattr(store, "read_view", None)):
        raise InvalidInput("is an asyncio store (AsyncSessionStore): give it to "
                           "AsyncContextGuard, or give ContextGuard a SessionStore",
                           field="store")
    return store


def sent(result: R) -> R:
    """``send``'s result, refused if it is awaitable (nothing ran: a coroutine is closed)."""
    if inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            result.close()
        raise InvalidInput("returned an awaitable: an async send needs AsyncContextGuard "
                           "(ContextGuard.call calls send and uses its result as it is)",
                           field="send")
    return result


class ContextGuard(RecoveringFlow):
    """Synchronous, LLM-free context guard for one tenant's sessions.

    ``view_cache``: the views it keeps between calls (default: 256 sessions,
    200,000 messages in all, about :data:`shared.core.viewcache.BYTES_PER_MESSAGE`
    bytes each); ``ViewCache(0, 0)`` turns caching off. ``watch_changes``: skip the
    read while Redis reports nothing of the session written since the cached one
    (client tracking, :mod:`shared.store.changes`; a connection of its own, used
    where the server supports it; a :class:`~shared.store.changes.ChangeFeed` to share
    one between guards, e.g. one per tenant). ``warm_up``: connect at construction
    (best effort, :meth:`warm_up`). One guard per process is the intended use; it is
    thread-safe.
    """

    store_class = SessionStore
    own_class = OwnWrites

    def __init__(self, store: SessionStore, enqueuer: Enqueuer | None = None, *,
                 policy: CompactionPolicy | None = None,
                 overrides: Mapping[str, ModelLimits | int] | None = None,
                 counter: TokenCounter | None = None,
                 view_cache: ViewCache | None = None,
                 watch_changes: bool | ChangeFeed = True, warm_up: bool = True) -> None:
        store = sync_store(store)
        super().__init__(counter or store.counter, policy, overrides, view_cache)
        self.store = store
        self.enqueuer = enqueuer or NullEnqueuer()
        self.server = redis_server(getattr(store, "redis", None))
        self.watch(getattr(store, "redis", None), store.config.key_prefix, store.tenant,
                   watch_changes)
        if warm_up:
            self.warm_up()

    def warm_up(self) -> None:
        """Connect now, best effort (the store's connection, its scripts, the change feed):
        the first ``prepare`` of a new process then pays only for its read."""
        warm = getattr(self.store, "warm_up", None)  # a TenantStore or a stand-in may lack it
        if warm is not None:
            warm()
        self.mark()  # the feed connects (it reports its own failures)
        if isinstance(self.own, OwnWrites):
            self.own.warm_up()

    # -- the flows (shared.guard._flow), blocking ----------------------------------------
    def drive(self, steps: Steps[T]) -> T:
        """Run a flow's steps to their end, each call blocking; a call's exception is
        thrown into the flow at its step."""
        reply: Any = None
        error: Exception | None = None
        while True:
            try:
                io = steps.send(reply) if error is None else steps.throw(error)
            except StopIteration as done:
                return cast(T, done.value)
            try:
                reply, error = self.perform(io), None
            except Exception as exc:
                reply, error = None, exc
            except BaseException as exc:  # cancelled, interrupted: the flow cleans up now
                abandon(steps, exc)
                raise

    def snapshot(self, session_id: str, min_length: int | None = None) -> CachedView:
        """The session's view, read incrementally against the cached one (one round trip,
        none while Redis reports nothing of the session written since the cached read and
        the log is known to be no longer than it: ``min_length``)."""
        return self.drive(self.snapshot_steps(session_id, min_length))

    def load(self, session_id: str) -> CachedView:
        return self.snapshot(session_id)

    def prepare(self, session_id: str, system_prompt: str = "",
                tools: Sequence[Mapping[str, Any]] | None = None,
                max_tokens: int | None = None, model: str | None = None, *,
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
        return self.drive(self.prepare_steps(session_id, system_prompt, tools, max_tokens,
                                             model, pending, fallback_messages, min_length))

    def record_turn(self, session_id: str, messages: Sequence[Message | Mapping[str, Any]],
                    usage: Any = None, *, request_id: str | None = None) -> int:
        """Append the turn's messages and enqueue ``maybe_summarize`` (coalesced).

        ``usage`` is the provider's usage for the request that produced the
        last assistant message of ``messages`` (the last prepared view); it
        anchors the hybrid estimate and updates the calibration (written by
        the append itself, only if no compaction or edit changed the view
        since). The append carries a request id and is retried once with
        it when Redis did not answer: applied at most once. A call that raised
        (or, in the async guard, was cancelled) leaves its id to the session's
        next call with the same messages: the agent's retry without a request id
        of its own is stored once too. Once the turn is stored, a failure to
        publish the job is logged, not raised.
        """
        return self.drive(self.record_turn_steps(session_id, messages, usage, request_id))

    def recover(self, session_id: str, error: object, system_prompt: str = "",
                tools: Sequence[Mapping[str, Any]] | None = None,
                max_tokens: int | None = None, model: str | None = None, *,
                pending: Sequence[Message | Mapping[str, Any]] = (),
                prepared_tokens: int | None = None,
                min_length: int | None = None) -> PreparedView | None:
        """After a provider error: None if it is not a context overflow, else a view to retry.

        The stated limit is learned (or, when the error states none, the bound the
        refused request sets: :meth:`refused_bound`; ``prepared_tokens``, the refused
        view's ``report.estimated_prompt_tokens``, when given; else this process's prepare
        of the turn, or the view a prepare of the session with these arguments makes,
        planned here where another process prepared it); the view is compacted to a
        fifth of the window with force, without an LLM, and a worker is asked to replace
        the truncation with a real summary. Runs even with proactive
        compaction switched off. An error nothing recognises that refused a request at
        least ``policy.unrecognised_overflow_at`` full is taken for an overflow in a
        wording no pattern knows: compacted to the target ratio, nothing learned.
        A view that would be refused again (no smaller than the refused one) is not
        returned, and nothing of its plan is written: the session keeps its history.
        ``min_length``: as for :meth:`prepare`.
        """
        return self.drive(self.recover_steps(session_id, error, system_prompt, tools,
                                             max_tokens, model, pending, prepared_tokens,
                                             min_length))

    def call(self, session_id: str, send: Callable[[PreparedView], R], *,
             system_prompt: str = "", tools: Sequence[Mapping[str, Any]] | None = None,
             max_tokens: int | None = None, model: str | None = None,
             pending: Sequence[Message | Mapping[str, Any]] = (),
             fallback_messages: Sequence[Message | Mapping[str, Any]] | None = None,
             ) -> tuple[R, PreparedView]:
        """prepare -> send -> on overflow recover and send once more. ``send`` is a
        plain function (a coroutine function is refused before anything is prepared).
        ``fallback_messages``: as for :meth:`prepare` (a degraded view when Redis is down)."""
        if inspect.iscoroutinefunction(send):
            raise InvalidInput("is a coroutine function: use AsyncContextGuard.call, or a "
                               "plain function here", field="send")
        view = self.prepare(session_id, system_prompt, tools, max_tokens, model, pending=pending,
                            fallback_messages=fallback_messages)
        try:
            reply = send(view)
        except Exception as exc:
            retry = self.recover(session_id, exc, system_prompt, tools, max_tokens, model,
                                 pending=pending)
            if retry is None:
                raise
            return sent(send(retry)), retry
        return sent(reply), view  # checked outside the try: no refusal is taken for an overflow

    # -- recall ------------------------------------------------------------------------
    def recall(self, session_id: str, query: str, *, limit: int = DEFAULT_LIMIT,
               start: int | None = None, end: int | None = None) -> list[RecallHit]:
        """Messages of the session's compacted range that best match ``query``, best first.

        See :func:`shared.store.recall_query.recall`: ``end`` defaults to the
        watermark; nothing past a history edit is returned; :class:`InvalidInput`
        for a bad query or range, :class:`SessionNotFound` for an unknown session.
        """
        return recall_query.recall(self.store, session_id, query, limit=limit, start=start,
                                   end=end)

    def stats(self, session_id: str) -> dict[str, Any]:
        """Tokens by region, usage ratio, watermark, summaries, pending job."""
        return self.drive(self.stats_steps(session_id))


__all__ = ["ContextGuard"]
