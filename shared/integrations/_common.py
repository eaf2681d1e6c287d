"""What every framework adapter shares: provenance tags, cursors, recover-and-retry-once,
and running the model's ``recall`` calls.

An adapter mirrors the framework's conversation into the session log: each
framework message (or part) becomes one neutral :class:`Message` tagged with
where it came from (``metadata["fw"]``: its index in the framework's history,
and part index or -1) and a fingerprint of what was recorded
(``metadata["fp"]``). Metadata is stored, never sent, and never counted but for
``extra_tokens`` (what is sent beside a message: :mod:`shared.integrations.notes`). On the
way back, a view message whose fingerprint still matches was not changed by
compaction, so the adapter can send the framework's original object (ids,
provider details, reasoning signatures intact); a changed one (placeholder,
clipped, summary) is built fresh.

A :class:`Cursors` entry remembers how much of a session's framework history
is in the log, so a model call costs no extra read; a miss (new process) is
one read.

Each adapter gives the model the ``recall`` tool (:func:`recall_parameters`,
the one schema of ``shared.core.recall_tool``) and runs its calls with
:func:`answer_recall` / :func:`aanswer_recall`: the arguments are validated
once, here, the guard's ``recall`` runs for the adapter's session, and the
model gets the rendered hits, or a text naming the bad argument (a failed
recall never ends the agent's run). Nothing here imports a framework.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import logging
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, cast, overload

from shared.core.errors import CompactionError, InvalidInput, SessionNotFound, StoreUnavailable
from shared.core.messages import Message
from shared.core.prepared import PreparedView
from shared.core.recall import RecallQuery, parse_tool_arguments
from shared.core.recall_tool import (
    DEFAULT_LIMIT,
    TOOL_DESCRIPTION,
    TOOL_NAME,
    RecallHit,
    recall_tool,
    render_hits,
)
from shared.core.records import ViewData

FW_KEY = "fw"
FP_KEY = "fp"
R = TypeVar("R")
V = TypeVar("V")
D = TypeVar("D")
log = logging.getLogger("shared.integrations")


def fingerprint(message: Message) -> str:
    """A short digest of everything sent for ``message`` (metadata excluded)."""
    raw = message.model_dump_json(exclude={"metadata"}, exclude_none=True)
    return hashlib.blake2b(raw.encode(), digest_size=8).hexdigest()


def tag(message: Message, index: int, part: int = -1,
        extra: Mapping[str, Any] | None = None) -> Message:
    """``message`` with its provenance (framework index, part) and fingerprint."""
    meta = {**message.metadata, **(extra or {}), FW_KEY: [index, part],
            FP_KEY: fingerprint(message)}
    return message.model_copy(update={"metadata": meta})


def _origin(message: Message) -> tuple[int, int] | None:
    where = message.metadata.get(FW_KEY)
    if (not isinstance(where, list) or len(where) != 2
            or message.metadata.get(FP_KEY) != fingerprint(message)):
        return None
    return int(where[0]), int(where[1])


class _Ref(weakref.ref):  # type: ignore[type-arg]
    """A weak reference that knows its key in :class:`ByIdentity` (for its callback)."""

    __slots__ = ("key",)
    key: int


class ByIdentity(Generic[V]):
    """A value per live object, keyed by identity (frozen messages, their timestamps' holders).

    The guard's cached view hands the same (frozen) message objects back call after
    call, so what an adapter works out about one (its origin, its timestamp's match) is
    worked out once, when it first appears, not on every call: a call's cost follows
    what changed, not the history's length. An entry goes with its object (a weak
    reference), so the memo never outgrows the live objects.
    """

    def __init__(self) -> None:
        self._items: dict[int, tuple[_Ref, V]] = {}

    def __len__(self) -> int:
        return len(self._items)

    def lookup(self, obj: object, default: D) -> V | D:
        hit = self._items.get(id(obj))
        return hit[1] if hit is not None and hit[0]() is obj else default

    def put(self, obj: object, value: V) -> None:
        ref = _Ref(obj, self._gone)
        ref.key = id(obj)
        self._items[ref.key] = (ref, value)

    def _gone(self, ref: weakref.ref[Any]) -> None:
        # no module globals here: at interpreter exit they may already be None
        key: int = ref.key  # type: ignore[attr-defined]
        entry = self._items.get(key)
        if entry is not None and entry[0] is ref:
            self._items.pop(key, None)


_MISSING: Any = object()
_ORIGINS: ByIdentity[tuple[int, int] | None] = ByIdentity()


def origin(message: Message) -> tuple[int, int] | None:
    """(framework index, part) of a view message the compaction left untouched, else None
    (once per message object: a frozen message's fingerprint cannot change)."""
    found = _ORIGINS.lookup(message, _MISSING)
    if found is _MISSING:
        found = _origin(message)
        _ORIGINS.put(message, found)
    return cast("tuple[int, int] | None", found)


@dataclass(frozen=True, slots=True)
class Request:
    """The fixed parts of a model request, as the guard's ``prepare``/``recover`` take them."""

    system_prompt: str = ""
    tools: Sequence[Mapping[str, Any]] | None = None
    max_tokens: int | None = None
    model: str = "gpt-4o"

    def kwargs(self) -> dict[str, Any]:
        return {"system_prompt": self.system_prompt, "tools": self.tools,
                "max_tokens": self.max_tokens, "model": self.model}


@dataclass
class Cursors:
    """Per session: (framework messages recorded, provenance key of the last one)."""

    limit: int = 4096
    _items: dict[str, tuple[int, Any]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, session_id: str) -> tuple[int, Any] | None:
        with self._lock:
            return self._items.get(session_id)

    def put(self, session_id: str, recorded: int, last: Any) -> None:
        with self._lock:
            if len(self._items) >= self.limit and session_id not in self._items:
                self._items.pop(next(iter(self._items)))
            self._items[session_id] = (recorded, last)

    def drop(self, session_id: str) -> None:
        with self._lock:
            self._items.pop(session_id, None)


def cursor_from_view(data: ViewData, key: str, last: Message | None = None,
                     ) -> tuple[int, Any]:
    """(framework messages recorded, ``metadata[key]`` of the last) from a fresh read.

    ``last``: the log's last message, when the view holds none (a summary
    covers the whole log). A session whose log was not written by an adapter
    cannot be continued: InvalidInput, before anything is written.
    """
    if data.length == 0:
        return 0, None
    last = data.history[-1] if data.history else last
    where = last.metadata.get(FW_KEY) if last is not None else None
    if last is None or not isinstance(where, list) or len(where) != 2:
        raise InvalidInput("the session's log was not written by this adapter (its last "
                           "message has no framework index): use a session id of its own",
                           field="session_id")
    return int(where[0]) + 1, last.metadata.get(key)


def load_cursor(guard: Any, session_id: str, key: str) -> tuple[int, Any]:
    """:func:`cursor_from_view` of a fresh read through the sync guard."""
    data = guard.load(session_id)
    last = None
    if data.length and not data.history:
        found = guard.store.messages(session_id, data.length - 1, data.length)
        last = found[-1] if found else None
    return cursor_from_view(data, key, last)


async def aload_cursor(guard: Any, session_id: str, key: str) -> tuple[int, Any]:
    """:func:`cursor_from_view` of a fresh read through an async guard."""
    data = await guard.load(session_id)
    last = None
    if data.length and not data.history:
        store = getattr(guard, "guard", guard).store  # ThreadedAsyncGuard wraps the sync one
        found = store.messages(session_id, data.length - 1, data.length)
        if inspect.isawaitable(found):
            found = await found
        last = found[-1] if found else None
    return cursor_from_view(data, key, last)


class Deferred(Sequence[Message]):
    """Messages built on first use: the framework's history before ``pending``, which the
    guard reads only when Redis is down (``prepare(fallback_messages=...)``: a locally
    truncated view, ``path="degraded"``), so a call with Redis up never maps it."""

    def __init__(self, build: Callable[[], Sequence[Message]]) -> None:
        self._build: Callable[[], Sequence[Message]] | None = build
        self._items: list[Message] = []

    def _all(self) -> list[Message]:
        if self._build is not None:
            self._items, self._build = list(self._build()), None
        return self._items

    @overload
    def __getitem__(self, index: int) -> Message: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Message]: ...
    def __getitem__(self, index: int | slice) -> Message | Sequence[Message]:
        return self._all()[index]

    def __len__(self) -> int:
        return len(self._all())

    def __iter__(self) -> Iterator[Message]:
        return iter(self._all())


def record_failed(session_id: str, error: StoreUnavailable, count: int) -> None:
    """A turn the adapter could not record (Redis down): logged, not raised. The model's
    answer is returned; the next call works out what is unrecorded from the log (the
    adapter dropped its cursor) and records it then."""
    log.warning("session %s: the turn's %d messages were not recorded (%s); the answer is "
                "returned, and the next call records them once Redis answers",
                session_id, count, error)


def degraded_view(guard: Any, session_id: str, request: Request,
                  history: Sequence[Message]) -> PreparedView:
    """The guard's degraded view of ``history`` alone, Redis not asked: where the adapter
    could not read the log's cursor, the whole framework history is this call's messages,
    and a prepare that reached Redis after all (a flapping connection) would add the log
    to them, sending the history twice in one request."""
    target = guard.guard if isinstance(guard, ThreadedAsyncGuard) else guard
    return cast(PreparedView, target.degraded(
        session_id, request.system_prompt, request.tools, request.max_tokens,
        target.given_model(request.model), list(history), time.perf_counter()))


def run_with_recovery(guard: Any, session_id: str, request: Request,
                      pending: Sequence[Message],
                      send: Callable[[PreparedView], R], *,
                      fallback: Sequence[Message] | None = None) -> tuple[R, PreparedView]:
    """prepare -> send -> on a context overflow: recover and send once more (the sync guard).
    ``fallback``: the history before ``pending``, for a degraded view when Redis is down."""
    result: tuple[R, PreparedView] = guard.call(session_id, send, pending=pending,
                                                fallback_messages=fallback,
                                                **request.kwargs())
    return result


# -- history edits: a framework history that no longer continues the log ------------------
@dataclass(frozen=True, slots=True)
class Divergence:
    """Where a framework history leaves the session log.

    ``at``: the log index of the first message the history does not hold (the ``n`` of
    ``store.truncate_after(session_id, n)``); ``kept``: how many history messages the
    log up to there covers; ``prefix``: the history is that much of the log followed only
    by messages the log does not hold (the user dropped or edited the last turn(s)), so
    dropping the log from ``at`` on makes the history continue it.
    """

    at: int
    kept: int
    prefix: bool


def divergence(log: Sequence[Message], length: int,
               same: Callable[[int, Message], bool]) -> Divergence:
    """Where ``log`` stops matching a framework history of ``length`` messages (``same(i,
    message)``: the log message is the history's message ``i``, as recorded)."""
    def held(message: Message) -> int | None:
        where = message.metadata.get(FW_KEY)
        if not isinstance(where, list) or len(where) != 2:
            return None
        i = int(where[0])
        return i if 0 <= i < length and same(i, message) else None

    at, kept = len(log), 0
    for n, message in enumerate(log):
        i = held(message)
        if i is None or i < kept - 1:
            at = n
            break
        kept = i + 1
    prefix = 0 < at < len(log) and all(
        (i := held(m)) is None or i < kept for m in log[at:])
    return Divergence(at, kept, prefix)


def read_log(guard: Any, session_id: str) -> list[Message]:
    """The session's whole log (an error path's read: history edits)."""
    store = guard.store
    messages: list[Message] = store.messages(session_id, 0, store.length(session_id))
    return messages


def edit_hint(session_id: str, found: Divergence, option: str) -> str:
    """How to make the session log follow a history that was edited (regenerate, edit)."""
    if not found.prefix:
        return ""
    return (f"if the last turn(s) were dropped or edited on purpose (regenerate, edit), "
            f"drop them from the log too: store.truncate_after({session_id!r}, {found.at}) "
            f"(a ContextGuard's guard.store; a history edit of the shared log), or pass "
            f"{option} to do that edit here")


class AsyncGuard(Protocol):
    """The async guard's interface: ContextGuard's methods, ``async def`` (AsyncContextGuard)."""

    async def prepare(self, session_id: str, system_prompt: str = "",
                      tools: Sequence[Mapping[str, Any]] | None = None,
                      max_tokens: int | None = None, model: str = "gpt-4o", *,
                      pending: Sequence[Message | Mapping[str, Any]] = (),
                      fallback_messages: Sequence[Message | Mapping[str, Any]] | None = None,
                      ) -> PreparedView: ...

    async def record_turn(self, session_id: str,
                          messages: Sequence[Message | Mapping[str, Any]],
                          usage: Any = None, *, request_id: str | None = None) -> int: ...

    async def recover(self, session_id: str, error: object, system_prompt: str = "",
                      tools: Sequence[Mapping[str, Any]] | None = None,
                      max_tokens: int | None = None, model: str = "gpt-4o", *,
                      pending: Sequence[Message | Mapping[str, Any]] = (),
                      ) -> PreparedView | None: ...

    async def load(self, session_id: str) -> ViewData: ...

    async def recall(self, session_id: str, query: str, *, limit: int = DEFAULT_LIMIT,
                     start: int | None = None, end: int | None = None) -> list[RecallHit]: ...


class ThreadedAsyncGuard:
    """A sync guard where an async one is needed: each call runs it through
    ``asyncio.to_thread``, so the event loop never blocks on Redis. An
    ``AsyncContextGuard`` (same method names) needs no threads;
    :func:`as_async_guard` wraps only a sync guard."""

    def __init__(self, guard: Any) -> None:
        self.guard = guard

    async def prepare(self, session_id: str, *args: Any, **kwargs: Any) -> PreparedView:
        view: PreparedView = await asyncio.to_thread(self.guard.prepare, session_id, *args,
                                                     **kwargs)
        return view

    async def record_turn(self, session_id: str, *args: Any, **kwargs: Any) -> int:
        return int(await asyncio.to_thread(self.guard.record_turn, session_id, *args, **kwargs))

    async def recover(self, session_id: str, *args: Any, **kwargs: Any) -> PreparedView | None:
        view: PreparedView | None = await asyncio.to_thread(self.guard.recover, session_id,
                                                            *args, **kwargs)
        return view

    async def load(self, session_id: str) -> ViewData:
        data: ViewData = await asyncio.to_thread(self.guard.load, session_id)
        return data

    async def recall(self, session_id: str, query: str, **kwargs: Any) -> list[RecallHit]:
        hits: list[RecallHit] = await asyncio.to_thread(self.guard.recall, session_id, query,
                                                        **kwargs)
        return hits


def as_async_guard(guard: Any) -> AsyncGuard:
    """An async guard: ``guard`` itself when its methods are coroutines, else the stopgap."""
    if asyncio.iscoroutinefunction(getattr(guard, "prepare", None)):
        async_guard: AsyncGuard = guard
        return async_guard
    return ThreadedAsyncGuard(guard)


async def arun_with_recovery(guard: AsyncGuard, session_id: str, request: Request,
                             pending: Sequence[Message],
                             send: Callable[[PreparedView], Awaitable[R]], *,
                             fallback: Sequence[Message] | None = None,
                             ) -> tuple[R, PreparedView]:
    """prepare -> send -> on a context overflow: recover and send once more (async).
    ``fallback``: the history before ``pending``, for a degraded view when Redis is down."""
    view = await guard.prepare(session_id, pending=pending, fallback_messages=fallback,
                               **request.kwargs())
    try:
        return await send(view), view
    except Exception as exc:
        retry = await guard.recover(session_id, exc, pending=pending, **request.kwargs())
        if retry is None:
            raise
    return await send(retry), retry


# -- recall: the tool each adapter gives the model and executes itself ----------------------
RECALL_NAME = TOOL_NAME
RECALL_DESCRIPTION = TOOL_DESCRIPTION


def recall_parameters() -> dict[str, Any]:
    """The ``recall`` tool's JSON schema (the one definition in ``shared.core.recall_tool``)."""
    parameters: dict[str, Any] = recall_tool("openai")["function"]["parameters"]
    return parameters


def recall_failure(error: CompactionError) -> str:
    """The tool result for a recall call that could not run: text the model can act on
    (a bad argument names its field), never an exception that ends the agent's run."""
    if isinstance(error, InvalidInput):
        return f"recall: invalid arguments: {error}"
    return f"recall: failed ({type(error).__name__}): {error}"


@dataclass(frozen=True, slots=True)
class RecallAnswer:
    """What a ``recall`` call returns to the model: the rendered hits, or the error text."""

    text: str
    hits: tuple[RecallHit, ...] = ()
    ok: bool = True


def _query(arguments: str | Mapping[str, Any] | None) -> RecallQuery | RecallAnswer:
    try:
        return parse_tool_arguments(arguments if arguments is not None else {})
    except InvalidInput as exc:
        return RecallAnswer(recall_failure(exc), ok=False)


def _failed(error: CompactionError) -> RecallAnswer:
    if isinstance(error, SessionNotFound):  # nothing recorded yet: nothing earlier to find
        return RecallAnswer(render_hits([]))
    return RecallAnswer(recall_failure(error), ok=False)


def answer_recall(guard: Any, session_id: str,
                  arguments: str | Mapping[str, Any] | None) -> RecallAnswer:
    """Run a model's ``recall`` call (its JSON arguments, or their mapping) through the sync
    guard's :meth:`~shared.guard.ContextGuard.recall` for ``session_id``."""
    query = _query(arguments)
    if isinstance(query, RecallAnswer):
        return query
    try:
        hits = guard.recall(session_id, query.text, limit=query.limit, start=query.start,
                            end=query.end)
    except CompactionError as exc:
        return _failed(exc)
    return RecallAnswer(render_hits(hits), tuple(hits))


async def aanswer_recall(guard: AsyncGuard, session_id: str,
                         arguments: str | Mapping[str, Any] | None) -> RecallAnswer:
    """:func:`answer_recall` through an async guard (``AsyncContextGuard.recall``)."""
    query = _query(arguments)
    if isinstance(query, RecallAnswer):
        return query
    try:
        hits = await guard.recall(session_id, query.text, limit=query.limit,
                                  start=query.start, end=query.end)
    except CompactionError as exc:
        return _failed(exc)
    return RecallAnswer(render_hits(hits), tuple(hits))


__all__ = [
    "FP_KEY",
    "FW_KEY",
    "RECALL_DESCRIPTION",
    "RECALL_NAME",
    "AsyncGuard",
    "ByIdentity",
    "Cursors",
    "Deferred",
    "Divergence",
    "RecallAnswer",
    "Request",
    "ThreadedAsyncGuard",
    "aanswer_recall",
    "aload_cursor",
    "answer_recall",
    "arun_with_recovery",
    "as_async_guard",
    "cursor_from_view",
    "degraded_view",
    "divergence",
    "edit_hint",
    "fingerprint",
    "load_cursor",
    "origin",
    "read_log",
    "recall_failure",
    "recall_parameters",
    "record_failed",
    "run_with_recovery",
]
