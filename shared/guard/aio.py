"""The asynchronous guard (redis.asyncio): the guard's flows, each call awaited.

The same flows as :mod:`shared.guard.sync` (:mod:`shared.guard._flow`), driven
by :meth:`AsyncContextGuard.drive`, which awaits each store and own-writes call
instead of blocking on it. Both shells are tested by the same tests
(tests/test_guard.py runs every test on both).
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
import sys
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar, cast

from shared.core.config import CompactionPolicy
from shared.core.errors import InvalidInput
from shared.core.limits import ModelLimits
from shared.core.messages import Message
from shared.core.prepared import PreparedView
from shared.core.recall import DEFAULT_LIMIT, RecallHit, validate_query
from shared.core.tokens import TokenCounter
from shared.core.view import ViewCache
from shared.core.viewcache import CachedView
from shared.enqueue import Enqueuer, NullEnqueuer, redis_server
from shared.guard._flow import Io, Steps, abandon
from shared.guard._recover_flow import RecoveringFlow
from shared.store import recall_query
from shared.store.aio import AsyncSessionStore
from shared.store.cancelled import cancel_mark, raise_swallowed, swallowed
from shared.store.changes import ChangeFeed
from shared.store.commands import drive_async
from shared.store.own_writes_aio import AsyncOwnWrites
from shared.store.recall_index import recall_keys, send_step
from shared.store.sessions import redis_errors

log = logging.getLogger("shared.guard")
R = TypeVar("R")
T = TypeVar("T")


def async_store(store: AsyncSessionStore) -> AsyncSessionStore:
    """``store``, refused if it is a blocking one (a SessionStore or its tenant handle):
    the flows would await its replies and fail at the first call, far from the cause."""
    read = getattr(store, "read_view", None)
    if read is not None and not inspect.iscoroutinefunction(read):
        raise InvalidInput("is a blocking store (SessionStore): give it to ContextGuard, "
                           "or give AsyncContextGuard an AsyncSessionStore", field="store")
    return store


async def sent(result: Awaitable[R]) -> R:
    """``send``'s result, awaited. ``send`` may be a plain function returning an
    awaitable (a lambda over an async client), so a blocking one is told only by its
    result: refused naming it, not with a TypeError about the reply's type."""
    if not inspect.isawaitable(result):
        raise InvalidInput(f"returned {type(result).__name__}, not an awaitable: a blocking "
                           "send needs ContextGuard, AsyncContextGuard.call awaits what send "
                           "returns", field="send")
    return await result


ERROR_READER = "shared.core.overflow_read"
"""The error classifier's pattern tables, imported by :mod:`shared.core.overflow` on the
first error it reads (~135 ms of module code and regex compilation)."""


async def error_reader_loaded() -> None:
    """Import the classifier's tables in a worker thread before an async path reads its
    first error: imported on the event loop, they stalled every other coroutine on it."""
    if ERROR_READER not in sys.modules:
        await asyncio.to_thread(importlib.import_module, ERROR_READER)


class AsyncContextGuard(RecoveringFlow):
    """Asynchronous, LLM-free context guard for one tenant's sessions (asyncio).

    ``view_cache``: the views it keeps between calls (default: 256 sessions,
    200,000 messages in all, about :data:`shared.core.viewcache.BYTES_PER_MESSAGE`
    bytes each); ``ViewCache(0, 0)`` turns caching off. ``watch_changes``: skip the
    read while Redis reports nothing of the session written since the cached one
    (client tracking, :mod:`shared.store.changes`; a connection of its own, used
    where the server supports it; a :class:`~shared.store.changes.ChangeFeed` to share
    one between guards, e.g. one per tenant). ``warm_up``: connect the change feed at
    construction (:meth:`warm_up` connects the rest).

    A guard serves one event loop, the first that awaits it: its store's client and
    connections belong to that loop. A call from another loop (another thread's, a later
    ``asyncio.run``) raises :class:`~shared.core.errors.InvalidInput` before doing
    anything: make one guard per loop (a thread of its own: :class:`ContextGuard`).
    """

    store_class = AsyncSessionStore
    own_class = AsyncOwnWrites

    def __init__(self, store: AsyncSessionStore, enqueuer: Enqueuer | None = None, *,
                 policy: CompactionPolicy | None = None,
                 overrides: Mapping[str, ModelLimits | int] | None = None,
                 counter: TokenCounter | None = None,
                 view_cache: ViewCache | None = None,
                 watch_changes: bool | ChangeFeed = True, warm_up: bool = True) -> None:
        store = async_store(store)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_lock = threading.Lock()
        self._closing: set[asyncio.Task[None]] = set()
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
        self._on_its_loop()
        mark = cancel_mark()
        warm = getattr(self.store, "warm_up", None)
        if warm is not None:
            await warm()
            raise_swallowed(mark)
        self.mark()
        if isinstance(self.own, AsyncOwnWrites):
            await self.own.warm_up()
            raise_swallowed(mark)

    # -- the flows (shared.guard._flow), awaited ------------------------------------------
    async def drive(self, steps: Steps[T]) -> T:
        """Run a flow's steps to their end, each call awaited; a call's exception is
        thrown into the flow at its step. A cancellation of the task that a library
        swallowed during a step is raised after it (:func:`swallowed`)."""
        self._on_its_loop()
        mark = cancel_mark()
        reply: Any = None
        error: Exception | None = None
        while True:
            try:
                io = steps.send(reply) if error is None else steps.throw(error)
            except StopIteration as done:
                return cast(T, done.value)
            try:
                reply, error = await self.perform(io), None
            except Exception as exc:
                reply, error = None, exc
            except BaseException as exc:  # cancelled, interrupted: the flow cleans up now
                abandon(steps, exc)
                raise
            try:
                raise_swallowed(mark)
            except asyncio.CancelledError as lost:
                abandon(steps, lost)
                raise

    def perform(self, io: Io) -> Any:
        """The call ``io`` names, as an awaitable; a ``local`` one (a large read's decode,
        tens of milliseconds) on the loop's default executor, so that the loop serves
        other requests meanwhile."""
        if io.local:
            return asyncio.to_thread(getattr(self, io.method), *io.args, **io.kwargs)
        return super().perform(io)

    async def snapshot(self, session_id: str, min_length: int | None = None) -> CachedView:
        """See :meth:`shared.guard.sync.ContextGuard.snapshot`."""
        return await self.drive(self.snapshot_steps(session_id, min_length))

    async def load(self, session_id: str) -> CachedView:
        return await self.snapshot(session_id)

    async def prepare(self, session_id: str, system_prompt: str = "",
                      tools: Sequence[Mapping[str, Any]] | None = None,
                      max_tokens: int | None = None, model: str | None = None, *,
                      pending: Sequence[Message | Mapping[str, Any]] = (),
                      fallback_messages: Sequence[Message | Mapping[str, Any]] | None = None,
                      min_length: int | None = None) -> PreparedView:
        """See :meth:`shared.guard.sync.ContextGuard.prepare`."""
        return await self.drive(self.prepare_steps(
            session_id, system_prompt, tools, max_tokens, model, pending, fallback_messages,
            min_length))

    async def record_turn(self, session_id: str,
                          messages: Sequence[Message | Mapping[str, Any]], usage: Any = None,
                          *, request_id: str | None = None) -> int:
        """See :meth:`shared.guard.sync.ContextGuard.record_turn`."""
        return await self.drive(self.record_turn_steps(session_id, messages, usage,
                                                       request_id))

    async def recover(self, session_id: str, error: object, system_prompt: str = "",
                      tools: Sequence[Mapping[str, Any]] | None = None,
                      max_tokens: int | None = None, model: str | None = None, *,
                      pending: Sequence[Message | Mapping[str, Any]] = (),
                      prepared_tokens: int | None = None,
                      min_length: int | None = None) -> PreparedView | None:
        """See :meth:`shared.guard.sync.ContextGuard.recover`."""
        await error_reader_loaded()
        return await self.drive(self.recover_steps(
            session_id, error, system_prompt, tools, max_tokens, model, pending,
            prepared_tokens, min_length))

    async def call(self, session_id: str, send: Callable[[PreparedView], Awaitable[R]], *,
             system_prompt: str = "", tools: Sequence[Mapping[str, Any]] | None = None,
             max_tokens: int | None = None, model: str | None = None,
             pending: Sequence[Message | Mapping[str, Any]] = (),
             fallback_messages: Sequence[Message | Mapping[str, Any]] | None = None,
             ) -> tuple[R, PreparedView]:
        """prepare -> send -> on overflow recover and send once more. ``fallback_messages``:
        as for :meth:`prepare` (a degraded view when Redis is down)."""
        view = await self.prepare(session_id, system_prompt, tools, max_tokens, model,
                                  pending=pending, fallback_messages=fallback_messages)
        try:
            reply = send(view)
            if inspect.isawaitable(reply):
                return await reply, view
        except Exception as exc:
            retry = await self.recover(session_id, exc, system_prompt, tools, max_tokens, model,
                                 pending=pending)
            if retry is None:
                raise
            return await sent(send(retry)), retry
        return await sent(reply), view  # refused outside the try: not taken for an overflow

    # -- recall ------------------------------------------------------------------------
    async def recall(self, session_id: str, query: str, *, limit: int = DEFAULT_LIMIT,
                     start: int | None = None, end: int | None = None) -> list[RecallHit]:
        """Messages of the session's compacted range that best match ``query``, best first.

        See :func:`shared.store.recall_query.recall`: ``end`` defaults to the
        watermark; nothing past a history edit is returned; :class:`InvalidInput`
        for a bad query or range, :class:`SessionNotFound` for an unknown session.
        The sync guard's query over redis.asyncio: the same sans-I/O steps
        (:func:`shared.store.recall_query.recall_steps`), each reply awaited and each
        step between two replies run on a worker thread (``drive_async(off_loop=True)``).
        """
        self._on_its_loop()
        mark = cancel_mark()
        q = validate_query(query, limit=limit, start=start, end=end)
        steps = recall_query.recall_steps(recall_keys(self.store, session_id), q,
                                          session_id=session_id, tenant=self.store.tenant)
        client = self.store.redis
        with redis_errors("recall"):
            hits = await drive_async(steps, lambda step: send_step(client, step),
                                     off_loop=True)
        raise_swallowed(mark)  # Python 3.11 (:func:`swallowed`)
        return hits

    def _on_its_loop(self) -> None:
        if asyncio.get_running_loop() is not self._loop:
            self._adopt_loop()

    def _adopt_loop(self) -> None:
        """The first loop to await the guard becomes its loop; another one is refused (its
        calls failed at random with redis.asyncio's RuntimeErrors, some turns unrecorded)."""
        loop = asyncio.get_running_loop()
        with self._loop_lock:
            if self._loop is None:
                self._loop = loop
            elif self._loop is not loop:
                raise InvalidInput("an AsyncContextGuard serves one event loop, the first "
                                   "that awaited it: make one guard per loop",
                                   field="event loop")

    async def aclose(self) -> None:
        """Close the guard's own connections (the change feed and the own-writes one) on
        this event loop; the guard keeps working, reading every call. The store's client
        is the caller's to close."""
        if isinstance(self.own, AsyncOwnWrites):
            await self.own.aclose()
        super().close()

    def close(self) -> None:
        """Close the change feed's connection (the guard keeps working, reading every call).

        The own-writes connection is closed too: called on the guard's event loop (a
        ``contextlib.closing``, a shutdown hook), by a task of that loop, since closing
        it is awaited (:meth:`aclose` awaits it before returning); elsewhere it is only
        dropped. Left to :meth:`GuardShell.close`, it was dropped unclosed on the loop
        too: its socket open until the garbage collector got to it."""
        own = self.own
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if isinstance(own, AsyncOwnWrites) and running is not None and running is self._loop:
            self.own = None  # closed by the task, not dropped by the shell's close
            task = running.create_task(own.aclose())
            self._closing.add(task)  # held until done (the loop keeps weak references)
            task.add_done_callback(self._closing.discard)
        super().close()

    async def stats(self, session_id: str) -> dict[str, Any]:
        """Tokens by region, usage ratio, watermark, summaries, pending job."""
        return await self.drive(self.stats_steps(session_id))


__all__ = ["AsyncContextGuard", "cancel_mark", "raise_swallowed", "swallowed"]
