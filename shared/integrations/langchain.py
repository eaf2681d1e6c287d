"""LangChain v1: ``ContextGuardMiddleware`` for ``create_agent`` (extra ``[langchain]``).

::

    agent = create_agent(model, tools, middleware=[ContextGuardMiddleware(guard)],
                         checkpointer=InMemorySaver())
    agent.invoke({"messages": [user]}, {"configurable": {"thread_id": "s1"}})

Around every model call (``wrap_model_call`` / ``awrap_model_call``):

1. the graph state's messages not yet in the session log (the new user
   message, tool results) go to :meth:`ContextGuard.prepare` as ``pending``;
2. the model gets the guard's view (summary + recent messages within the
   window) instead of the whole state; the graph state is not rewritten
   (view, not delete): the full history stays in the state and in the log;
3. a context-overflow error from the provider goes through ``recover`` and
   the call is retried once; any other error propagates;
4. the pending messages and the model's reply are recorded with the
   provider's usage, which enqueues ``maybe_summarize``: workers summarize
   off the hot path, and the next view starts from their summary. A reply
   with tool calls is recorded with its results, at the next call (a log
   never ends in an unanswered tool call, so no cut can strand a result).

Recall (on by default, ``recall=False`` to leave it out): the middleware
declares a ``recall`` tool, so the model sees it among the agent's tools,
and runs its calls itself (``wrap_tool_call`` / ``awrap_tool_call``)
against the guard's index of what compaction summarized away, for the
session of the model call that asked. The result is the matching messages,
verbatim, with their index; a bad argument comes back as an error
``ToolMessage`` the model can correct, never an exception.

The system prompt is ``create_agent(system_prompt=...)`` and the system
messages at the head of the graph state (``{"role": "system"}``
input), joined in that order: sent on every call, never recorded, so no
compaction cuts it. A system message later in the conversation is an
ordinary log message. Reasoning blocks (``thinking``, ``redacted_thinking``,
``reasoning``) are recorded as the message's reasoning; untouched messages go
back as the state's own objects, signatures and all.

The session is the graph's ``thread_id`` (or ``session_id=``, a string or a
function of the request): a guarded agent run from a tool of another one
inherits its thread id, so give it its own ``session_id=``. Put this
middleware last in ``middleware=[...]``: it builds the request's messages
from the graph state. Messages it cannot map raise :class:`InvalidInput`
naming ``state.messages[i]`` before anything is written. The async hook
uses ``shared.guard.AsyncContextGuard`` when it is passed one; with the sync
guard it runs the guard in a thread (stopgap). The message mapping is in
:mod:`shared.integrations.langchain_messages` (``to_neutral`` and
``from_view`` are importable from here too).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

try:
    from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
    from langchain_core.messages import AIMessage, BaseMessage, SystemMessage, ToolMessage
    from langchain_core.tools import BaseTool, StructuredTool
    from langchain_core.utils.function_calling import convert_to_openai_tool
    from langgraph.prebuilt.tool_node import ToolCallRequest
except ModuleNotFoundError as exc:  # tests/test_install.py runs this without the extra
    raise ModuleNotFoundError("shared.integrations.langchain needs the 'langchain' extra: "
                              "pip install 'context-compaction[langchain]'",
                              name=exc.name) from exc

from shared.core.errors import CompactionError, InvalidInput, StoreUnavailable
from shared.core.messages import Message
from shared.core.prepared import PreparedView
from shared.guard import ContextGuard
from shared.integrations._common import (
    FW_KEY,
    RECALL_DESCRIPTION,
    RECALL_NAME,
    AsyncGuard,
    Cursors,
    Deferred,
    Divergence,
    RecallAnswer,
    Request,
    ThreadedAsyncGuard,
    aanswer_recall,
    aload_cursor,
    answer_recall,
    arun_with_recovery,
    as_async_guard,
    degraded_view,
    divergence,
    edit_hint,
    load_cursor,
    read_log,
    recall_failure,
    recall_parameters,
    record_failed,
    run_with_recovery,
)
from shared.integrations.langchain_messages import (
    ID_KEY,
    from_view,
    join_system,
    leading_system,
    to_neutral,
)

SessionFn = Callable[[ModelRequest[Any]], str]


UNBOUND = ("recall: not available here: the agent's ContextGuardMiddleware runs recall "
           "calls, and none ran this one")


def _unbound(**_: Any) -> str:
    return UNBOUND


async def _aunbound(**_: Any) -> str:
    return UNBOUND


def recall_tool() -> BaseTool:
    """The ``recall`` tool as LangChain declares it (one schema, ``shared.core.recall_tool``).

    :class:`ContextGuardMiddleware` registers it and runs its calls; the
    tool's own body only answers a call no middleware intercepted.
    """
    return StructuredTool(name=RECALL_NAME, description=RECALL_DESCRIPTION,
                          args_schema=recall_parameters(), func=_unbound, coroutine=_aunbound)


def _thread_of(runtime: Any) -> Any:
    """The graph's thread id, as a model or tool hook's runtime carries it (or None)."""
    thread = getattr(getattr(runtime, "execution_info", None), "thread_id", None)
    if thread is None:
        config: Any = getattr(runtime, "config", None) or {}
        thread = config.get("configurable", {}).get("thread_id")
    return thread


def _graph_hint(runtime: Any) -> str:
    """Why a state may not continue its session, as far as the run's config tells."""
    namespace = getattr(getattr(runtime, "execution_info", None), "checkpoint_ns", None)
    configurable: dict[str, Any] = {}
    try:
        from langgraph.config import get_config

        configurable = get_config().get("configurable", {})
    except RuntimeError:
        pass
    namespace = namespace or configurable.get("checkpoint_ns")
    if isinstance(namespace, str) and "|" in namespace:
        return ("this agent runs inside another graph (a tool or node of it) and inherits "
                "its thread_id: give this agent's ContextGuardMiddleware its own session_id=")
    # LangGraph's own key for the run's checkpointer: a hint only, so absent means unknown.
    if "__pregel_checkpointer" in configurable and configurable["__pregel_checkpointer"] is None:
        return ("the agent has no checkpointer, so each invoke starts a fresh state and "
                "re-sent history gets new message ids: pass checkpointer= to create_agent "
                "and send only the new messages")
    return ("likely causes: no checkpointer while the caller re-sends the history (pass "
            "checkpointer= and send only new messages); a guarded sub-agent sharing its "
            "parent's thread_id (give it its own session_id=); another graph or middleware "
            "using this session or removing messages from the state")


def _model_name(model: Any) -> str:
    for attr in ("model_name", "model", "model_id"):
        value = getattr(model, attr, None)
        if isinstance(value, str) and value:
            return value
    return "unknown"


class ContextGuardMiddleware(AgentMiddleware):
    """Sends the guard's view to the model, records each turn, recovers from overflow once.

    ``guard``: a :class:`ContextGuard` (or an ``AsyncContextGuard`` for async
    agents). ``model``: the name the guard looks limits up by (default: the
    chat model's ``model_name``/``model``); ``max_tokens``: the output reserve
    (default: the request's or the chat model's ``max_tokens``). ``recall``:
    give the model the ``recall`` tool, run here against the guard (default on).
    ``rewind``: when the state holds the first messages of the session log and then
    only messages the log does not (the last turns were removed, e.g. with
    ``RemoveMessage``, to regenerate or edit them), drop the rest of the log
    (``store.truncate_after``, a history edit) and continue; off by default, since it
    rewrites a log another agent sharing the session may still be writing. Off, that
    case raises :class:`InvalidInput` naming the ``truncate_after`` call.
    """

    def __init__(self, guard: Any, *, session_id: str | SessionFn | None = None,
                 model: str | None = None, max_tokens: int | None = None,
                 async_guard: AsyncGuard | None = None, recall: bool = True,
                 rewind: bool = False) -> None:
        super().__init__()
        is_async = not isinstance(guard, ContextGuard)
        if rewind and is_async and async_guard is None \
                and not isinstance(as_async_guard(guard), ThreadedAsyncGuard):
            raise InvalidInput("rewind=True edits the log through a ContextGuard's store: "
                               "pass a ContextGuard (an AsyncContextGuard's store has no "
                               "history edits)", field="rewind")
        self.rewind = rewind
        self.guard: ContextGuard | None = None if is_async else guard
        self.async_guard: AsyncGuard = async_guard or as_async_guard(guard)
        self.session_id = session_id
        self.model = model
        self.max_tokens = max_tokens
        self.cursors = Cursors()
        self._tools: tuple[tuple[int, ...], list[dict[str, Any]]] | None = None
        self.tools: list[BaseTool] = [recall_tool()] if recall else []
        self._recall_calls = Cursors()  # call id -> (0, session): for a session_id function

    # -- the request ---------------------------------------------------------------
    def _session(self, request: ModelRequest[Any]) -> str:
        if callable(self.session_id):
            return self.session_id(request)
        if self.session_id is not None:
            return self.session_id
        thread = _thread_of(request.runtime)
        if thread is None:
            try:
                from langgraph.config import get_config

                thread = get_config().get("configurable", {}).get("thread_id")
            except RuntimeError:
                thread = None
        if not isinstance(thread, str) or not thread:
            raise InvalidInput("no session: run the agent with config={'configurable': "
                               "{'thread_id': ...}} or pass session_id=", field="session_id")
        return thread

    @staticmethod
    def _system(request: ModelRequest[Any], state: Sequence[Any]) -> SystemMessage | None:
        """The fixed system prompt: ``system_prompt=``, then the state's leading ones."""
        parts = [request.system_message] if request.system_message is not None else []
        return join_system([*parts, *state[:leading_system(state)]])

    def _request(self, request: ModelRequest[Any], system: SystemMessage | None) -> Request:
        tools = request.tools or []
        key = tuple(id(t) for t in tools)
        if self._tools is None or self._tools[0] != key:
            try:
                specs = [convert_to_openai_tool(t) for t in tools]
            except (ValueError, TypeError) as exc:
                raise InvalidInput(f"cannot describe a tool: {str(exc)[:200]}",
                                   field="tools") from None
            self._tools = (key, specs)
        max_tokens = self.max_tokens or request.model_settings.get("max_tokens") \
            or getattr(request.model, "max_tokens", None)
        return Request(system_prompt=system.text if system is not None else "",
                       tools=self._tools[1] or None,
                       max_tokens=max_tokens if isinstance(max_tokens, int) else None,
                       model=self.model or _model_name(request.model))

    @staticmethod
    def _pending(session_id: str, state: list[Any], cursor: tuple[int, Any],
                 runtime: Any = None) -> list[Message]:
        """The state's messages after the log's (not the leading system ones)."""
        recorded, last_id = cursor
        if recorded > len(state) or (last_id is not None and recorded
                                     and state[recorded - 1].id != last_id):
            raise InvalidInput(
                f"the graph state ({len(state)} messages) does not continue session "
                f"{session_id!r} ({recorded} recorded): {_graph_hint(runtime)}",
                field="state.messages")
        start = max(recorded, leading_system(state))
        return to_neutral(state[start:], start)

    @staticmethod
    def _send(request: ModelRequest[Any], view: PreparedView,
              system: SystemMessage | None) -> ModelRequest[Any]:
        new_system, messages = from_view(view, request.state["messages"], system)
        return request.override(system_message=new_system, messages=messages)

    @staticmethod
    def _reply(response: Any) -> tuple[list[BaseMessage], Any]:
        """The messages the response adds to the state (each with an id), and its usage."""
        result = response.result if isinstance(response, ModelResponse) else \
            response.model_response.result if hasattr(response, "model_response") else [response]
        usage = None
        for message in result:
            if message.id is None:  # the id the state will keep: the next call checks it
                message.id = str(uuid.uuid4())
            if isinstance(message, AIMessage) and message.usage_metadata:
                usage = {"prompt_tokens": message.usage_metadata.get("input_tokens")}
        return list(result), usage

    # -- the hooks -------------------------------------------------------------------
    # -- the state against the log -------------------------------------------------------
    def _cached_pending(self, session_id: str, state: list[Any],
                        runtime: Any) -> list[Message] | None:
        """The state's messages after the cached cursor; None when there is none, or when
        the log moved past it (another process may have written: read again)."""
        cursor = self.cursors.get(session_id)
        if cursor is None:
            return None
        try:
            return self._pending(session_id, state, cursor, runtime)
        except InvalidInput:
            self.cursors.drop(session_id)
            return None

    def _continued(self, guard: ContextGuard, session_id: str, state: list[Any],
                   runtime: Any) -> list[Message]:
        """The state's messages not in the log yet (the cached cursor, else a read)."""
        cached = self._cached_pending(session_id, state, runtime)
        if cached is not None:
            return cached
        cursor = load_cursor(guard, session_id, ID_KEY)
        try:
            return self._pending(session_id, state, cursor, runtime)
        except InvalidInput as exc:
            found = self._divergence(session_id, state, read_log(guard, session_id), exc)
        guard.store.truncate_after(session_id, found.at)  # rewind=True: the edit, here
        guard.views.discard(session_id)
        return self._pending(session_id, state, load_cursor(guard, session_id, ID_KEY), runtime)

    async def _acontinued(self, guard: AsyncGuard, session_id: str, state: list[Any],
                          runtime: Any) -> list[Message]:
        """:meth:`_continued` through the async guard."""
        cached = self._cached_pending(session_id, state, runtime)
        if cached is not None:
            return cached
        cursor = await aload_cursor(guard, session_id, ID_KEY)
        try:
            return self._pending(session_id, state, cursor, runtime)
        except InvalidInput as exc:
            sync = getattr(guard, "guard", None)  # the ThreadedAsyncGuard's own
            if sync is None:  # an AsyncContextGuard (no rewind): the refusal, explained
                store: Any = guard.store  # type: ignore[attr-defined]
                log = await store.messages(session_id, 0, await store.length(session_id))
                self._divergence(session_id, state, log, exc)
                raise
            found = self._divergence(session_id, state,
                                     await asyncio.to_thread(read_log, sync, session_id), exc)
        await asyncio.to_thread(sync.store.truncate_after, session_id, found.at)
        sync.views.discard(session_id)
        return self._pending(session_id, state, await aload_cursor(guard, session_id, ID_KEY),
                             runtime)

    def _divergence(self, session_id: str, state: list[Any], log: list[Message],
                    error: InvalidInput) -> Divergence:
        """Where the state leaves the log, when ``rewind`` may drop the rest; else the
        refusal, naming the edit that makes the state continue the log, when one does."""
        found = divergence(log, len(state), lambda i, m: state[i].id is not None
                           and state[i].id == m.metadata.get(ID_KEY))
        if found.prefix and self.rewind:
            return found
        if not found.prefix:
            raise error
        raise InvalidInput(
            f"the graph state ({len(state)} messages) does not continue session "
            f"{session_id!r}: it holds the log's first {found.at} messages, then messages "
            f"the log does not ({len(log) - found.at} recorded ones are gone from the state, "
            f"e.g. by RemoveMessage): "
            + edit_hint(session_id, found, "ContextGuardMiddleware(..., rewind=True)"),
            field="state.messages") from None

    @staticmethod
    def _unknown(state: list[Any]) -> list[Message]:
        """Redis is down and the log's cursor unknown: the whole state (after the system
        prompt) goes to the degraded view as this call's messages; nothing is recorded."""
        start = leading_system(state)
        return to_neutral(state[start:], start)

    @staticmethod
    def _fallback(state: list[Any], pending: Sequence[Message]) -> Deferred:
        """The state before ``pending``, mapped only if Redis is down (the degraded view)."""
        first = min([int(m.metadata[FW_KEY][0]) for m in pending[:1]] or [len(state)])
        start = leading_system(state)
        return Deferred(lambda: to_neutral(state[start:first], start))

    def _record(self, session_id: str, state: list[Any], first: int, known: bool,
                pending: list[Message], result: list[BaseMessage],
                usage: Any) -> tuple[list[Message], list[BaseMessage], Any, bool]:
        """What to record of this turn; False when nothing may be (cursor unknown)."""
        reply = to_neutral(result, first)
        if any(m.tool_calls for m in reply):  # recorded with its results, next call
            reply, usage, result = [], None, []
        if not known:
            record_failed(session_id, StoreUnavailable("the log could not be read"),
                          len(pending) + len(reply))
            self.cursors.drop(session_id)
        return [*pending, *reply], result, usage, known

    def wrap_model_call(self, request: ModelRequest[Any],
                        handler: Callable[[ModelRequest[Any]], Any]) -> Any:
        if self.guard is None:
            raise CompactionError("an async guard was given: run the agent with ainvoke")
        guard = self.guard
        session_id = self._session(request)
        state = list(request.state["messages"])
        system = self._system(request, state)
        fixed = self._request(request, system)
        known = True
        try:
            pending = self._continued(guard, session_id, state, request.runtime)
        except StoreUnavailable:
            pending, known = self._unknown(state), False
        if known:
            response, _view = run_with_recovery(
                guard, session_id, fixed, pending,
                lambda view: handler(self._send(request, view, system)),
                fallback=self._fallback(state, pending))
        else:  # the whole state is this call's: a prepare must not add the log to it
            response = handler(self._send(request, degraded_view(guard, session_id, fixed,
                                                                 pending), system))
        turn, result, usage, record = self._answered(session_id, state, known, pending,
                                                     response)
        if record and turn:
            try:
                guard.record_turn(session_id, turn, usage=usage)
            except StoreUnavailable as exc:
                return self._unrecorded(session_id, exc, turn, response)
        if record:
            self._advance(session_id, state, len(state), result)
        return response

    async def awrap_model_call(self, request: ModelRequest[Any],
                               handler: Callable[[ModelRequest[Any]], Awaitable[Any]]) -> Any:
        guard = self.async_guard
        session_id = self._session(request)
        state = list(request.state["messages"])
        system = self._system(request, state)
        fixed = self._request(request, system)
        known = True
        try:
            pending = await self._acontinued(guard, session_id, state, request.runtime)
        except StoreUnavailable:
            pending, known = self._unknown(state), False

        async def send(view: PreparedView) -> Any:
            return await handler(self._send(request, view, system))

        if known:
            response, _view = await arun_with_recovery(
                guard, session_id, fixed, pending, send, fallback=self._fallback(state, pending))
        else:  # the whole state is this call's: a prepare must not add the log to it
            response = await send(degraded_view(guard, session_id, fixed, pending))
        turn, result, usage, record = self._answered(session_id, state, known, pending,
                                                     response)
        if record and turn:
            try:
                await guard.record_turn(session_id, turn, usage=usage)
            except StoreUnavailable as exc:
                return self._unrecorded(session_id, exc, turn, response)
        if record:
            self._advance(session_id, state, len(state), result)
        return response

    def _answered(self, session_id: str, state: list[Any], known: bool,
                  pending: list[Message], response: Any,
                  ) -> tuple[list[Message], list[BaseMessage], Any, bool]:
        """The model answered: what to record of the turn (:meth:`_record`)."""
        result, usage = self._reply(response)
        self._note_recall_calls(session_id, result)
        return self._record(session_id, state, len(state), known, pending, result, usage)

    def _unrecorded(self, session_id: str, exc: StoreUnavailable, turn: list[Message],
                    response: Any) -> Any:
        """Redis failed to store the turn: logged, and the answer returned all the same
        (the next call reads what the log holds and records the rest)."""
        record_failed(session_id, exc, len(turn))
        self.cursors.drop(session_id)
        return response

    # -- recall ------------------------------------------------------------------------
    def _note_recall_calls(self, session_id: str, result: Sequence[BaseMessage]) -> None:
        """With a ``session_id`` function (it needs the model request), remember the
        session of each recall call the model just made, for the tool hook."""
        if not self.tools or not callable(self.session_id):
            return
        for message in result:
            for call in getattr(message, "tool_calls", None) or []:
                if call.get("name") == RECALL_NAME and call.get("id"):
                    self._recall_calls.put(call["id"], 0, session_id)

    def _recall_session(self, request: ToolCallRequest) -> str:
        """The session a recall call runs for: the model call's (same rules)."""
        if isinstance(self.session_id, str):
            return self.session_id
        if callable(self.session_id):
            call_id = str(request.tool_call.get("id"))
            noted = self._recall_calls.get(call_id)
            self._recall_calls.drop(call_id)
            thread = noted[1] if noted is not None else None
        else:
            thread = _thread_of(request.runtime)
        if not isinstance(thread, str) or not thread:
            raise InvalidInput("no session for this recall call (no thread id, or not made "
                               "by a model call this middleware saw)", field="session_id")
        return thread

    def _is_recall(self, request: ToolCallRequest) -> bool:
        return bool(self.tools) and request.tool_call.get("name") == RECALL_NAME

    @staticmethod
    def _tool_message(request: ToolCallRequest, answer: RecallAnswer) -> ToolMessage:
        return ToolMessage(content=answer.text, tool_call_id=request.tool_call.get("id") or "",
                           name=RECALL_NAME, status="success" if answer.ok else "error",
                           artifact=[h.model_dump() for h in answer.hits])

    def wrap_tool_call(self, request: ToolCallRequest,
                       handler: Callable[[ToolCallRequest], Any]) -> Any:
        if not self._is_recall(request):
            return handler(request)
        if self.guard is None:
            raise CompactionError("an async guard was given: run the agent with ainvoke")
        try:
            session_id = self._recall_session(request)
        except InvalidInput as exc:
            return self._tool_message(request, RecallAnswer(recall_failure(exc), ok=False))
        return self._tool_message(request, answer_recall(self.guard, session_id,
                                                         request.tool_call.get("args")))

    async def awrap_tool_call(self, request: ToolCallRequest,
                              handler: Callable[[ToolCallRequest], Awaitable[Any]]) -> Any:
        if not self._is_recall(request):
            return await handler(request)
        try:
            session_id = self._recall_session(request)
        except InvalidInput as exc:
            return self._tool_message(request, RecallAnswer(recall_failure(exc), ok=False))
        return self._tool_message(request, await aanswer_recall(
            self.async_guard, session_id, request.tool_call.get("args")))

    def _advance(self, session_id: str, state: Sequence[BaseMessage], first: int,
                 result: Sequence[BaseMessage]) -> None:
        last = result[-1] if result else state[first - 1] if first else None
        if last is None:
            self.cursors.drop(session_id)
        else:
            self.cursors.put(session_id, first + len(result), last.id)


__all__ = ["ContextGuardMiddleware", "from_view", "recall_tool", "to_neutral"]
