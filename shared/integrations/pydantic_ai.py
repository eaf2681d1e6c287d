"""pydantic-ai: ``ContextGuardCapability`` (extra ``[pydantic-ai]``).

::

    agent = Agent(model, capabilities=[ContextGuardCapability(guard)])
    result = agent.run_sync("hello")
    result = agent.run_sync("more", message_history=result.all_messages())

A capability (pydantic-ai's hook API, ``pydantic_ai.capabilities``) with the
same contract as the LangChain middleware:

- ``prepare_model_request`` (before each attempt): the history's messages
  not yet in the session log are ``pending``; the request gets the guard's
  view (summary + recent messages within the window). Only this request's
  message list changes: the run's history (``ctx.messages``) is not
  rewritten (view, not delete);
- ``on_model_request_error``: a context overflow goes through ``recover``
  and the request is attempted once more (``RetryModelRequest``) with the
  recovered view; any other error, or a second overflow, propagates;
- ``after_model_request``: the pending messages and the response are
  recorded with the response's usage; that enqueues ``maybe_summarize``. A
  response with tool calls is recorded with its results, at the next call
  (a log never ends in an unanswered tool call);
- ``wrap_run``: a run's in-flight request state goes when the run ends, also
  when it is cancelled or times out mid-request (no other hook sees that).

Recall (on by default, ``recall=False`` to leave it out): the capability's
toolset holds a ``recall`` tool, run here against the guard's index of what
compaction summarized away, for the run's session; the model gets the
matching messages verbatim with their index, or an error text naming the
bad argument (never an exception that ends the run).

The session is the run's ``conversation_id`` (kept on ``message_history``
across runs), or ``session_id=`` (a string or a function of the RunContext).
System prompt parts and instructions are the fixed system prompt: never
recorded, always sent. User images and documents (inline, by URL, uploaded)
are recorded as image and file parts, audio and video as a text placeholder
(the neutral model holds neither), cache points not at all; the model gets
the original parts while they are in the view. A realtime session's speech is recorded
as its transcripts (a user message, the answer's text), as pydantic-ai sends it to a
standard model. Response parts the provider makes and answers itself (native tool calls
and results, its compaction, generated images, audio and documents) are recorded as
notes in the message's reasoning; the response goes back
as it was while it is in the view. A response or part compaction changed (clipped text, a
cleared result, a call id made unique) is rebuilt from its original, only the change
replaced (:mod:`shared.integrations.pydantic_ai_parts`): signed thinking, encrypted
reasoning, ids and the response's fields stay. Parts it cannot map raise
:class:`InvalidInput` naming ``messages[i].parts[j]`` before anything is
written. pydantic-ai's hooks are async: the guard runs as
``AsyncContextGuard`` when given one, else in a thread (stopgap,
:class:`shared.integrations._common.ThreadedAsyncGuard`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

try:
    from pydantic_ai import AgentRunResult
    from pydantic_ai import messages as pm
    from pydantic_ai.capabilities import AbstractCapability, WrapRunHandler
    from pydantic_ai.exceptions import RetryModelRequest
    from pydantic_ai.models import ModelRequestContext
    from pydantic_ai.tools import RunContext, Tool
    from pydantic_ai.toolsets import FunctionToolset
except ModuleNotFoundError as exc:  # tests/test_install.py runs this without the extra
    raise ModuleNotFoundError("shared.integrations.pydantic_ai needs the 'pydantic-ai' extra: "
                              "pip install 'context-compaction[pydantic-ai]'",
                              name=exc.name) from exc

from shared.core.errors import InvalidInput, StoreUnavailable
from shared.core.messages import Message
from shared.core.prepared import PreparedView
from shared.integrations._common import (
    FW_KEY,
    RECALL_DESCRIPTION,
    RECALL_NAME,
    AsyncGuard,
    ByIdentity,
    Cursors,
    Deferred,
    Request,
    ThreadedAsyncGuard,
    aanswer_recall,
    aload_cursor,
    as_async_guard,
    degraded_view,
    divergence,
    edit_hint,
    origin,
    read_log,
    recall_failure,
    recall_parameters,
    record_failed,
    tag,
)
from shared.integrations.pydantic_ai_parts import (
    rebuilt_request_part,
    rebuilt_response,
    request_part,
    response_message,
)
from shared.store.cancelled import cancel_mark, raise_swallowed

STAMP_KEY = "pai_ts"


def _timestamp(message: Any) -> Any:
    stamp = getattr(message, "timestamp", None)
    if stamp is None and getattr(message, "parts", None):
        stamp = getattr(message.parts[0], "timestamp", None)
    return stamp


def _stamp(message: Any) -> str | None:
    """A key of a history message that survives serialization: its timestamp."""
    stamp = _timestamp(message)
    return stamp.isoformat() if stamp is not None else None


_MISS: Any = object()
# view message -> (where it was recorded from, the history timestamp seen matching its stamp)
_SOURCES: ByIdentity[tuple[tuple[int, int] | None, Any]] = ByIdentity()


def _where(message: Message) -> tuple[int, int] | None:
    """(framework index, part) a view message was recorded from, changed since or not."""
    where = message.metadata.get(FW_KEY)
    if not isinstance(where, list) or len(where) != 2:
        return None
    try:
        return int(where[0]), int(where[1])
    except (TypeError, ValueError):
        return None


def _source(message: Message, history: Sequence[Any],
            ) -> tuple[tuple[int, int] | None, Any, bool]:
    """(where, the history message, untouched) of a view message recorded from a history
    message that still carries the stamp it was recorded with; else (None, None, False).
    ``untouched``: compaction left the message as recorded (its fingerprint matches), so
    the original goes back as it is; else the original is what a rebuild copies from. A
    timestamp object seen matching before matches again unformatted (one lookup a call)."""
    found, matched = _SOURCES.lookup(message, (_MISS, None))
    if found is _MISS:
        found, matched = _where(message), None
    if found is None or not 0 <= found[0] < len(history):
        return None, None, False
    source = history[found[0]]
    stamp = _timestamp(source)
    if stamp is None or stamp is not matched:
        if _stamp(source) != message.metadata.get(STAMP_KEY):
            return None, None, False
        _SOURCES.put(message, (found, stamp))
    return found, source, origin(message) is not None


def _part(source: Any, found: tuple[int, int] | None) -> Any:
    """The request part ``found`` names in ``source``, else None."""
    parts = getattr(source, "parts", None)
    if not isinstance(source, pm.ModelRequest) or found is None or parts is None:
        return None
    return parts[found[1]] if 0 <= found[1] < len(parts) else None


def system_text(history: Sequence[Any]) -> str:
    """The text of every system prompt part of the history (fixed, never recorded)."""
    return "\n\n".join(p.content for m in history if isinstance(m, pm.ModelRequest)
                       for p in m.parts if isinstance(p, pm.SystemPromptPart) and p.content)


def to_neutral(history: Sequence[Any], start: int = 0) -> list[Message]:
    """History messages ``history[start:]`` as tagged neutral messages (system parts skipped)."""
    out: list[Message] = []
    for index in range(start, len(history)):
        message = history[index]
        where = f"messages[{index}]"
        extra = {STAMP_KEY: _stamp(message)}
        if isinstance(message, pm.ModelResponse):
            out.append(tag(response_message(message, where), index, -1, extra))
        elif isinstance(message, pm.ModelRequest):
            for j, part in enumerate(message.parts):
                neutral = request_part(part, f"{where}.parts[{j}]", index)
                if neutral is not None:
                    out.append(tag(neutral, index, j, extra))
        else:
            raise InvalidInput(f"expected a ModelRequest or ModelResponse, got "
                               f"{type(message).__name__}", field=where, index=index)
    return out


def from_view(view: PreparedView, history: Sequence[Any], fixed_system: str,
              system_parts: str) -> list[Any]:
    """The view as pydantic-ai messages; untouched parts and responses are the originals,
    changed ones are rebuilt from their originals (:mod:`.pydantic_ai_parts`).

    ``fixed_system`` is the system prompt the guard was given (system parts and
    instructions); only ``system_parts`` and the summary go back as a system
    prompt part: instructions reach the model on their own.
    """
    messages = list(view.messages)
    parts: list[Any] = []
    out: list[Any] = []
    if messages and messages[0].role == "system":
        rest = messages.pop(0).text().removeprefix(fixed_system).lstrip("\n")
        text = "\n\n".join(t for t in (system_parts, rest) if t)
        if text:
            parts.append(pm.SystemPromptPart(content=text))
    for message in messages:
        found, source, untouched = _source(message, history)
        if message.role == "assistant":
            if parts:
                out.append(pm.ModelRequest(parts=parts))
                parts = []
            response = source if isinstance(source, pm.ModelResponse) else None
            out.append(response if response is not None and untouched
                       else rebuilt_response(message, response))
            continue
        original = _part(source, found)
        parts.append(original if original is not None and untouched
                     else rebuilt_request_part(message, original))
    if parts:
        last = history[-1] if history else None
        out.append(pm.ModelRequest(parts=parts, instructions=getattr(last, "instructions", None)))
    return out


@dataclass
class _Pending:
    session_id: str
    request: Request
    pending: list[Message]
    system_parts: str
    retry: PreparedView | None = None
    recovered: bool = False
    known: bool = True  # False: Redis was down and the log's cursor unknown (not recorded)


SessionFn = Callable[[RunContext[Any]], str]


def _key(ctx: RunContext[Any]) -> str:
    """The run a hook belongs to (pydantic-ai gives every run an id)."""
    return ctx.run_id or str(id(ctx))


@dataclass
class ContextGuardCapability(AbstractCapability[Any]):
    """Sends the guard's view to the model, records each turn, recovers from overflow once.

    ``guard``: a :class:`ContextGuard` or an ``AsyncContextGuard``. ``model``:
    the name the guard looks limits up by (default: the model's
    ``model_name``); ``max_tokens``: the output reserve (default: the run's
    ``max_tokens`` setting). ``recall``: give the model the ``recall`` tool,
    run here against the guard (default on). ``rewind``: when ``message_history``
    holds the first messages of the session log and then only messages the log does
    not (a regenerate or an edit: ``all_messages()[:-2]`` plus a new prompt), drop the
    rest of the log (``store.truncate_after``, a history edit) and continue; off by
    default, since it rewrites a log another agent sharing the session may still be
    writing. Off, that case raises :class:`InvalidInput` naming the ``truncate_after``
    call.
    """

    guard: Any
    session_id: str | SessionFn | None = None
    model: str | None = None
    max_tokens: int | None = None
    recall: bool = True
    rewind: bool = False
    cursors: Cursors = field(default_factory=Cursors)
    _async: AsyncGuard | None = field(default=None, repr=False)
    _runs: dict[str, _Pending] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self._async = as_async_guard(self.guard)
        if self.rewind and not isinstance(self._async, ThreadedAsyncGuard):
            raise InvalidInput("rewind=True edits the log through a ContextGuard's store: "
                               "pass a ContextGuard (an AsyncContextGuard's store has no "
                               "history edits)", field="rewind")

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None  # holds a live guard: not spec-serializable

    @property
    def aguard(self) -> AsyncGuard:
        assert self._async is not None
        return self._async

    # -- recall ------------------------------------------------------------------------------
    def get_toolset(self) -> FunctionToolset[Any] | None:
        """The ``recall`` tool (one schema, ``shared.core.recall_tool``), when on."""
        if not self.recall:
            return None
        return FunctionToolset([Tool.from_schema(
            self._recall, name=RECALL_NAME, description=RECALL_DESCRIPTION,
            json_schema=recall_parameters(), takes_ctx=True)])

    async def _recall(self, ctx: RunContext[Any], **arguments: Any) -> str:
        """A ``recall`` call of the run's session: the hits rendered, or the error text."""
        try:
            session_id = self._session(ctx)
        except InvalidInput as exc:
            return recall_failure(exc)
        return (await aanswer_recall(self.aguard, session_id, arguments)).text

    def _session(self, ctx: RunContext[Any]) -> str:
        if callable(self.session_id):
            return self.session_id(ctx)
        session = self.session_id or ctx.conversation_id
        if not session:
            raise InvalidInput("no session: pass conversation_id= to the run or session_id=",
                               field="session_id")
        return session

    def _request(self, rc: ModelRequestContext, system: str) -> Request:
        params = rc.model_request_parameters
        instructions = "\n\n".join(p.content for p in params.instruction_parts or [])
        tools = [{"type": "function", "function": {
            "name": t.name, "description": t.description or "",
            "parameters": t.parameters_json_schema}}
            for t in [*params.function_tools, *params.output_tools]]
        settings: Any = rc.model_settings or {}
        max_tokens = self.max_tokens or settings.get("max_tokens")
        return Request(system_prompt="\n\n".join(t for t in (system, instructions) if t),
                       tools=tools or None,
                       max_tokens=max_tokens if isinstance(max_tokens, int) else None,
                       model=self.model or rc.model.model_name or "unknown")

    async def _pending(self, session_id: str, history: list[Any],
                       ) -> tuple[int, list[Message]]:
        """(history messages in the log, the rest as pending messages)."""
        cached = self.cursors.get(session_id)
        recorded = 0
        for attempt in (0, 1):
            cursor = cached if cached is not None and not attempt else await aload_cursor(
                self.aguard, session_id, STAMP_KEY)
            recorded, stamp = cursor
            if recorded <= len(history) and (
                    not recorded or stamp is None or _stamp(history[recorded - 1]) == stamp):
                return recorded, to_neutral(history, recorded)
            if cached is None:
                break
        error = InvalidInput(f"the message history ({len(history)} messages) does not "
                             f"continue session {session_id!r} ({recorded} recorded): pass the "
                             "previous run's all_messages() as message_history",
                             field="message_history")
        sync = getattr(self.aguard, "guard", None)  # the ThreadedAsyncGuard's ContextGuard
        if sync is not None:
            log = await asyncio.to_thread(read_log, sync, session_id)
        else:  # an AsyncContextGuard (no rewind: its store has no history edits)
            store: Any = self.aguard.store  # type: ignore[attr-defined]
            log = await store.messages(session_id, 0, await store.length(session_id))
        found = divergence(log, len(history),
                           lambda i, m: _stamp(history[i]) == m.metadata.get(STAMP_KEY))
        if not found.prefix:
            raise error
        if not self.rewind or sync is None:
            raise InvalidInput(
                f"the message history ({len(history)} messages) does not continue session "
                f"{session_id!r}: it holds the log's first {found.at} messages, then messages "
                f"the log does not ({len(log) - found.at} recorded ones are not in it): "
                + edit_hint(session_id, found, "ContextGuardCapability(..., rewind=True)"),
                field="message_history")
        await asyncio.to_thread(sync.store.truncate_after, session_id, found.at)
        sync.views.discard(session_id)
        self.cursors.drop(session_id)
        recorded, _ = await aload_cursor(self.aguard, session_id, STAMP_KEY)
        return recorded, to_neutral(history, recorded)

    # -- the hooks ---------------------------------------------------------------------------
    async def wrap_run(self, ctx: RunContext[Any], *,
                       handler: WrapRunHandler) -> AgentRunResult[Any]:
        """The run's in-flight request is dropped when the run ends by any path: a run
        cancelled or timed out mid-request reaches neither ``after_model_request`` nor
        ``on_model_request_error`` (pydantic-ai cancels through this hook)."""
        try:
            return await handler()
        finally:
            with self._lock:
                self._runs.pop(_key(ctx), None)

    async def prepare_model_request(self, ctx: RunContext[Any],
                                    request_context: ModelRequestContext) -> ModelRequestContext:
        history = list(ctx.messages)
        key = _key(ctx)
        mark = cancel_mark()
        with self._lock:
            run = self._runs.get(key)
        if run is None or run.retry is None:
            session_id = self._session(ctx)
            system = system_text(history)
            fixed = self._request(request_context, system)
            known = True
            try:
                recorded, pending = await self._pending(session_id, history)
            except StoreUnavailable:  # Redis down: all of it to the degraded view, unrecorded
                recorded, pending, known = 0, to_neutral(history), False
            if known:
                # the history before pending, mapped only if Redis is down: a degraded view
                fallback = Deferred(lambda: to_neutral(history[:recorded]))
                view = await self.aguard.prepare(session_id, pending=pending,
                                                 fallback_messages=fallback, **fixed.kwargs())
            else:  # the whole history is this call's: a prepare must not add the log to it
                view = degraded_view(self.aguard, session_id, fixed, pending)
            run = _Pending(session_id, fixed, pending, system, known=known)
            # a cancellation Python 3.11 dropped in an await above (the run timed out) is
            # raised before the entry is made: wrap_run, which drops it, may be done already
            raise_swallowed(mark)
            with self._lock:
                self._runs[key] = run
        else:
            view, run.retry = run.retry, None
        request_context.messages = from_view(view, history, run.request.system_prompt,
                                             run.system_parts)
        return request_context

    async def on_model_request_error(self, ctx: RunContext[Any], *,
                                     request_context: ModelRequestContext,
                                     error: Exception) -> pm.ModelResponse:
        with self._lock:
            run = self._runs.get(_key(ctx))
        if run is None or run.recovered:
            with self._lock:
                self._runs.pop(_key(ctx), None)
            raise error
        retry = await self.aguard.recover(run.session_id, error, pending=run.pending,
                                          **run.request.kwargs())
        if retry is None:
            with self._lock:
                self._runs.pop(_key(ctx), None)
            raise error
        run.retry, run.recovered = retry, True
        raise RetryModelRequest()

    async def after_model_request(self, ctx: RunContext[Any], *,
                                  request_context: ModelRequestContext,
                                  response: pm.ModelResponse) -> pm.ModelResponse:
        key = _key(ctx)
        with self._lock:
            run = self._runs.pop(key, None)
        if run is None:
            return response
        index = len(ctx.messages)
        reply = to_neutral([*ctx.messages, response], index)
        usage = {"prompt_tokens": response.usage.input_tokens} \
            if response.usage and response.usage.input_tokens else None
        cursor = (index + 1, _stamp(response))
        if any(m.tool_calls for m in reply):
            # Tool calls wait for their results: a log never ends in an unanswered call, so
            # a worker's cut cannot strand the result. Recorded with them next call.
            reply, usage, cursor = [], None, (index, _stamp(ctx.messages[-1]))
        turn = [*run.pending, *reply]
        if not turn:
            return response
        if not run.known:
            record_failed(run.session_id, StoreUnavailable("the log could not be read"),
                          len(turn))
            self.cursors.drop(run.session_id)
            return response
        try:
            await self.aguard.record_turn(run.session_id, turn, usage=usage)
        except StoreUnavailable as exc:  # the answer is returned; the next call records it
            record_failed(run.session_id, exc, len(turn))
            self.cursors.drop(run.session_id)
            return response
        self.cursors.put(run.session_id, *cursor)
        return response


__all__ = ["ContextGuardCapability", "from_view", "system_text", "to_neutral"]
