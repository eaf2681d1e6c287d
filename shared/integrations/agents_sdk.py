"""OpenAI Agents SDK integration: a ``Session`` backed by the store, a model-input
budget filter and one-shot overflow recovery (the ``[openai-agents]`` extra).

The runner reads the session once per run, then keeps the run's items in
memory; three pieces keep a long run inside the window::

    session = GuardedSession(guard, "user-42", model="gpt-4o", max_tokens=2000)
    agent = Agent(name="a", instructions=SYSTEM, tools=[...], model=session.wrap(model))
    result = await Runner.run(agent, text, session=session, run_config=session.run_config())

- :class:`GuardedSession` (the SDK's ``Session`` protocol): ``get_items``
  returns the guard's view (the system/developer items the log starts with,
  kept like the instructions, then the summary, then recent items, tool pairs
  intact); ``add_items`` appends and enqueues the worker job; ``pop_item``
  and ``clear_session`` are history edits (``truncate_after`` / delete).
  While Redis is down a run goes on: ``get_items`` serves the guard's
  degraded view of what this process last saw plus what its runs added
  (:mod:`shared.integrations.agents_local`: one copy per guard, tenant and
  session id in the process, shared by every session object of that id), and
  items ``add_items`` could not save are logged and saved, in order and once,
  before the session's next read or write that Redis answers. A log Redis
  lost (back empty after a restart without persistence) is not re-seeded:
  the loss is logged as an ERROR and the copy's old history dropped.
- :meth:`GuardedSession.recall_tool` (or :func:`recall_function_tool`): the
  ``recall`` tool as a ``FunctionTool`` bound to the session; the runner
  runs it like any tool, against the guard's index of what compaction
  summarized away (``tools=[..., session.recall_tool()]``).
- :class:`InputBudget` (the ``RunConfig`` input filter that truncates before
  a model call that would not fit) and :class:`GuardedModel` (one retry
  after a context overflow, compacted): see :mod:`shared.integrations.agents_run`.

The item <-> message mapping is in :mod:`shared.integrations.agents_items`,
the budget filter and the model wrapper in :mod:`shared.integrations.agents_run`;
their public names are importable from here too.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any, cast

try:
    from agents.items import TResponseInputItem
    from agents.models.interface import Model, ModelProvider
    from agents.models.multi_provider import MultiProvider
    from agents.run_config import RunConfig
    from agents.tool import FunctionTool
    from agents.tool_context import ToolContext
except ModuleNotFoundError as exc:  # tests/test_install.py runs this without the extra
    raise ModuleNotFoundError("shared.integrations.agents_sdk needs the 'openai-agents' extra: "
                              "pip install 'context-compaction[openai-agents]'",
                              name=exc.name) from exc

from shared.core.errors import InvalidInput, StoreUnavailable
from shared.core.messages import Message
from shared.core.turns import leading_system_count
from shared.guard import ContextGuard
from shared.integrations._common import (
    RECALL_DESCRIPTION,
    RECALL_NAME,
    ByIdentity,
    Deferred,
    Request,
    aanswer_recall,
    as_async_guard,
    degraded_view,
    recall_parameters,
)
from shared.integrations.agents_items import (
    CALL_TYPES,
    OUTPUT_TYPES,
    items_to_messages,
    messages_to_items,
)
from shared.integrations.agents_local import IDS_TTL, KEEP, LocalHistory, copy_of
from shared.integrations.agents_run import GuardedModel, InputBudget, tool_schemas

__all__ = [
    "GuardedModel",
    "GuardedSession",
    "InputBudget",
    "items_to_messages",
    "messages_to_items",
    "recall_function_tool",
]
log = logging.getLogger("shared.integrations.agents_sdk")


def recall_function_tool(guard: Any, session_id: str) -> FunctionTool:
    """The ``recall`` tool bound to ``session_id``, for an agent's ``tools``.

    The runner runs it: the call's JSON arguments go through ``guard.recall``
    (a :class:`ContextGuard` in a worker thread, or an ``AsyncContextGuard``
    awaited) and the model gets the matching earlier messages verbatim with
    their index; a bad argument comes back as an error text naming it.
    """
    from shared.store.keys import validate_session_id

    validate_session_id(session_id)
    async_guard = as_async_guard(guard)

    async def invoke(context: ToolContext[Any], arguments: str) -> str:
        return (await aanswer_recall(async_guard, session_id, arguments)).text

    return FunctionTool(name=RECALL_NAME, description=RECALL_DESCRIPTION,
                        params_json_schema=recall_parameters(), on_invoke_tool=invoke,
                        strict_json_schema=False)


def _last(items: list[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    """At most ``limit`` of the newest items, each kept output with its call (a provider
    refuses an output without its call).

    Taken newest first: an output brings its call along (both count against the
    limit), so the tail is never extended past ``limit``; taking stops at the first
    item (or output and call) that no longer fits. An output whose call is not in
    ``items`` at all is dropped. The items keep their order.
    """
    calls: dict[Any, int] = {}
    for n, i in enumerate(items):
        if i.get("type") in CALL_TYPES:
            calls[i.get("call_id")] = n
            if i.get("type") == "local_shell_call" and "id" in i:
                calls.setdefault(i["id"], n)  # a local shell output may name the call's id
    chosen: set[int] = set()
    for n in range(len(items) - 1, -1, -1):
        if n in chosen:
            continue
        need = {n}
        if items[n].get("type") in OUTPUT_TYPES:
            call = calls.get(items[n].get("call_id", items[n].get("id")))
            if call is None:
                continue  # an orphan: no call to send with it
            need.add(call)
        if len(chosen | need) > limit:
            break
        chosen |= need
    return [items[n] for n in sorted(chosen)]


PINNED_READ = 8  # log messages read at a time looking for the leading system ones


# -- the session -----------------------------------------------------------------------------
class GuardedSession:
    """The Agents SDK ``Session`` protocol over the store, through the guard.

    ``instructions`` and ``tools`` (definitions as dicts) let the guard
    count the fixed part of the request when it builds the view; ``model``
    and ``max_tokens`` size the budget. Blocking store calls run in a
    worker thread, so the event loop never waits on Redis; an
    ``AsyncContextGuard`` is refused (:class:`InvalidInput` on ``guard``): its
    store has no history edits for ``pop_item`` and ``clear_session``.
    ``keep``: the messages kept in-process for a Redis outage (the last view read
    and what runs added since, newest kept; as many unsaved ones at most), also bounded
    to the model's window in tokens, in one copy per session shared by the session
    objects of the guard (the first one's bounds apply). The edits need Redis; reads and
    saves do not stop a run while it is down.
    """

    session_settings: Any = None

    def __init__(self, guard: ContextGuard, session_id: str, *, model: str = "gpt-4o",
                 max_tokens: int | None = None, instructions: str = "",
                 tools: Sequence[Mapping[str, Any]] | None = None, keep: int = KEEP) -> None:
        from shared.store.keys import validate_session_id

        validate_session_id(session_id)
        if inspect.iscoroutinefunction(getattr(guard, "prepare", None)):
            # pop_item and clear_session are history edits the async store does not offer
            # (truncate_after, delete_session); the blocking guard runs in a worker thread.
            raise InvalidInput("GuardedSession needs a ContextGuard, not an AsyncContextGuard "
                               "(its blocking calls already run in a worker thread)",
                               field="guard")
        self.guard, self.session_id = guard, session_id
        self.model, self.max_tokens = model, max_tokens
        self.instructions, self.tools = instructions, list(tools) if tools else None
        self.input_filter = InputBudget(guard, model=model, max_tokens=max_tokens)
        self.last_view: Any = None  # the PreparedView behind the last get_items
        self._pinned_known: list[Message] | None = None  # see _pinned
        # the input tokens the last response reported, for the items the runner adds next
        # (None when its request was not the view extended by the run: see responded)
        self._reported: int | None = None
        self._whole = False  # whether the last get_items returned the whole view
        self._keep = keep  # for the session's copy, when this object makes it (local)
        self._window: int | None = None  # the model's window, the copy's bound in tokens
        self._counts: ByIdentity[int] = ByIdentity()  # view message -> heuristic tokens

    @property
    def local(self) -> LocalHistory:
        """The process's copy of the session for a Redis outage (the guard's, shared)."""
        store = self.guard.store
        if self._window is None:
            self._window = self.guard.model_limits(self.model).context_window
        return copy_of(self.guard, store.tenant, self.session_id, self._keep,
                       store.config.ttl_seconds or 0, limit=self._window,
                       count=self.guard.counter.message,
                       ids_ttl=getattr(store, "idempotency_ttl", IDS_TTL))

    @classmethod
    def for_agent(cls, guard: ContextGuard, session_id: str, agent: Any, *,
                  model: str | None = None, max_tokens: int | None = None) -> GuardedSession:
        """A session that counts ``agent``'s instructions (when a string) and tools.
        ``model``: the name the budget looks limits up by (default: ``agent.model`` when
        it is a name, else ``"gpt-4o"``)."""
        if model is None:
            named = getattr(agent, "model", None)
            model = named if isinstance(named, str) and named else "gpt-4o"
        instructions = agent.instructions if isinstance(agent.instructions, str) else ""
        return cls(guard, session_id, model=model, max_tokens=max_tokens,
                   instructions=instructions, tools=tool_schemas(agent.tools or []))

    # -- wiring -----------------------------------------------------------------------------
    def recall_tool(self) -> FunctionTool:
        """The ``recall`` tool bound to this session (:func:`recall_function_tool`), also
        added to the tools the session counts: the budget includes it, and the summary
        tells the model what it can recall."""
        from shared.core.recall_tool import offers_recall

        tool = recall_function_tool(self.guard, self.session_id)
        if not offers_recall(self.tools):
            self.tools = [*(self.tools or []), *tool_schemas([tool])]
        return tool

    def wrap(self, model: Model | str | None, *,
             provider: ModelProvider | None = None) -> GuardedModel:
        """``model`` with overflow recovery sharing this session's budget. A model name (an
        ``Agent(model="gpt-4o")``'s ``agent.model``; None: the SDK's default model) is
        resolved here, as the runner would, by ``provider`` (default: the SDK's
        ``MultiProvider``, which uses ``set_default_openai_client`` and ``_api``)."""
        if model is None or isinstance(model, str):
            model = (provider or MultiProvider()).get_model(model)
        return GuardedModel(model, self.input_filter, session=self)

    def run_config(self, **kwargs: Any) -> RunConfig:
        """A ``RunConfig`` with this session's budget filter (other options passed on)."""
        return RunConfig(call_model_input_filter=self.input_filter, **kwargs)

    # -- the Session protocol ------------------------------------------------------------------
    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                                  or limit < 0):
            raise InvalidInput("must be a non-negative integer or None", field="limit")
        return cast(list[TResponseInputItem], await asyncio.to_thread(self._view_items, limit))

    def _fixed(self, pinned: Sequence[Message]) -> str:
        """The fixed prompt the guard counts: the instructions and the pinned messages."""
        return "\n\n".join(t for t in (self.instructions, *(m.text() for m in pinned)) if t)

    def _prepare(self, pinned: Sequence[Message],
                 fallback: Sequence[Message] | None = None) -> Any:
        view = self.guard.prepare(self.session_id, self._fixed(pinned), self.tools,
                                  self.max_tokens, self.model, fallback_messages=fallback)
        report = view.report
        if report.limits_source == "learned" \
                and report.budget.window < self.input_filter.limits().context_window:
            self.input_filter.learned_window = report.budget.window  # the session's state's
        return view

    def _view_items(self, limit: int | None) -> list[dict[str, Any]]:
        self._reported = None  # a new run: no response is pending
        local = self.local
        with local.lock:  # another session object of this id reads or saves after this
            try:
                view, pinned, items = self._read(local)
            except StoreUnavailable as exc:
                log.warning("session %s: Redis is down (%s); the run starts from this "
                            "process's copy of the session (degraded view)",
                            self.session_id, exc)
                pinned = list(local.pinned)
                view = degraded_view(self.guard, self.session_id,
                                     Request(self._fixed(pinned), self.tools, self.max_tokens,
                                             self.model), local.messages())
                items = self._items(view, pinned)[0]
        self.last_view = view
        if limit is not None:
            limited = _last(items, limit)
            self._whole = limited == items and not view.report.degraded
            return limited
        self._whole = not view.report.degraded  # a degraded run's usage describes no view
        return items

    def _read(self, local: LocalHistory) -> tuple[Any, list[Message], list[dict[str, Any]]]:
        """The view from Redis (what it missed saved first: the view holds it), its pinned
        messages and items; after a log found shorter than ``local`` knew (logged there),
        read again: the pinned messages this object knew may be gone too."""
        for _ in range(2):
            local.flush(self._append, self._length, self._messages)
            pinned = self._pinned()
            # Redis gone after this read: a view of the local copy (built only then)
            view = self._prepare(pinned, Deferred(local.messages))
            items, body = self._items(view, pinned)
            report = view.report
            if report.degraded or not local.seen(pinned, body, report.length, report.version,
                                                 report.estimated_prompt_tokens) \
                    or not self._pinned_known:
                break
            self._pinned_known = None
        return view, pinned, items

    def _items(self, view: Any, pinned: list[Message]) -> tuple[list[dict[str, Any]],
                                                               list[Message]]:
        """The view as the runner's items (the pinned messages first, the agent's own
        instructions left out), and its messages after the pinned ones."""
        fixed = self._fixed(pinned)
        messages = list(view.messages)
        if messages and messages[0].role == "system" and fixed:
            # The runner sends the agent's own instructions; keep only the summary part.
            rest = messages[0].text().removeprefix(fixed).lstrip("\n")
            messages = ([Message(role="system", content=rest)] if rest else []) + messages[1:]
        unsent = [m.text() for m in pinned]
        body: list[Message] = []
        for message in messages:  # pinned messages not yet summarized: sent once, first
            if unsent and message.role == "system" and message.text() in unsent:
                unsent.remove(message.text())
            else:
                body.append(message)
        return messages_to_items([*pinned, *body]), body

    def _pinned(self) -> list[Message]:
        """The system/developer messages the log starts with (rules given in the first
        run's input): fixed like the agent's instructions, never summarized away.

        The guard counts them in the fixed prompt (twice while the log's copies are
        still in the view, a small over-count). Read once per session object: the log
        only grows, and the history edits here reset it.
        """
        if self._pinned_known is not None:
            return self._pinned_known
        pinned: list[Message] = []
        start = 0
        while True:
            batch = self.guard.store.messages(self.session_id, start, start + PINNED_READ)
            for message in batch:
                if message.role != "system":
                    self._pinned_known = pinned
                    return pinned
                pinned.append(message)
            if len(batch) < PINNED_READ:
                return pinned  # nothing but system messages yet: read again next time
            start += PINNED_READ

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        messages = items_to_messages(items)  # all mapped before anything is written
        if not messages:
            return
        reported, self._reported = self._reported, None
        await asyncio.to_thread(self._record, messages, reported)

    async def flush(self) -> int:
        """Save now the messages Redis missed (they are saved anyway before the session's
        next read or write that Redis answers): how many; :class:`StoreUnavailable` while
        Redis is still down (nothing is lost: they stay for the next attempt)."""
        return await asyncio.to_thread(self.local.flush, self._append, self._length,
                                       self._messages)

    def _append(self, messages: list[Message], request_id: str) -> int:
        return self.guard.record_turn(self.session_id, messages, request_id=request_id)

    def _length(self) -> int:
        return int(self.guard.store.length(self.session_id))

    def _messages(self, start: int, end: int) -> list[Message]:
        return list(self.guard.store.messages(self.session_id, start, end))

    def responded(self, reported: int, *, faithful: bool) -> None:
        """The input tokens a response of this session's run reported (called by
        :class:`GuardedModel`). ``faithful``: its request was the runner's input as it was
        (neither trimmed by the budget filter nor compacted by a recovery); then, when the
        run started from the whole view, that request was the guard's view extended by
        what the run added (all of it recorded by now), and the report is recorded with
        the items that follow (the response's): it calibrates the guard and anchors its
        estimate, as ``record_turn``'s ``usage`` does."""
        self._reported = reported if faithful and self._whole else None

    def _record(self, messages: list[Message], reported: int | None) -> None:
        """Append ``messages`` after any Redis missed, with ``reported`` as their usage
        where it describes the view; while Redis is down they wait (logged, not raised:
        the runner would end the run, the model's answer lost with it)."""
        local = self.local

        def append(batch: list[Message], request_id: str) -> int:
            usage = self._usage(reported) if batch is messages else None
            return self.guard.record_turn(self.session_id, batch, usage,
                                          request_id=request_id)

        if not local.record(messages, append, self._length, self._messages):
            roles = ", ".join(sorted({m.role for m in messages}))
            log.warning("session %s: %d messages of this run (%s) were not saved: Redis "
                        "did not answer; the run goes on, and they are saved before the "
                        "session's next read or write that Redis answers (%d waiting)",
                        self.session_id, len(messages), roles, local.unsaved)

    def _usage(self, reported: int | None) -> int | None:
        """``reported``, when the view as the guard renders it now is the request it
        counted."""
        usage: int | None = None
        if reported is not None and self.last_view is not None:
            # the view as the guard renders it now is the request the report counted (the
            # one the run started from, extended by the items recorded since), unless a
            # compaction or an edit changed it: then the report describes no view of it
            view = self._prepare(self._pinned())
            history = view.messages[leading_system_count(view.messages):]
            counted = len(history), sum(self._tokens(m) for m in history)
            if view.report.version == self.last_view.report.version \
                    and counted == self.input_filter.sent_history():
                usage = reported
        return usage

    def _tokens(self, message: Message) -> int:
        """The heuristic tokens of a view message, counted once per message object (the
        guard's cached view hands the same frozen messages back call after call)."""
        tokens = self._counts.lookup(message, None)
        if tokens is None:
            tokens = self.guard.counter.message(message)
            self._counts.put(message, tokens)
        return tokens

    async def pop_item(self) -> TResponseInputItem | None:
        return cast(TResponseInputItem | None, await asyncio.to_thread(self._pop))

    def _pop(self) -> dict[str, Any] | None:
        store, local = self.guard.store, self.local
        with local.lock:
            # the last item may be one Redis missed
            local.flush(self._append, self._length, self._messages)
            length = store.length(self.session_id)
            if length == 0:
                return None
            last = store.messages(self.session_id, length - 1, length)[0]
            items = messages_to_items([last])
            popped = items.pop()
            rest = items_to_messages(items)  # mapped before the log is touched
            edit = store.truncate_after(self.session_id, length - 1)
            after = store.append(self.session_id, rest) if rest else edit.length
            # (the message held more than one item: the others are put back)
            self.guard.views.discard(self.session_id)
            self._pinned_known = None
            local.popped(last, rest, after, edit.version)
        return popped

    async def clear_session(self) -> None:
        await asyncio.to_thread(self._clear)

    def _clear(self) -> None:
        local = self.local
        with local.lock:
            self.guard.store.delete_session(self.session_id)
            self.guard.views.discard(self.session_id)
            self._pinned_known = None
            local.cleared()

    async def learned(self, limit: int, model: str) -> None:
        """A window an overflow of this session's run implied or stated, for the session's
        state (every process and the workers read it); while Redis is down, logged: the
        run's filter knows it, and the next overflow states it again."""
        try:
            await asyncio.to_thread(self.guard.store.update_state, self.session_id,
                                    learned_window=limit, learned_model=model, model=model,
                                    last_overflow_at=time.time())
        except StoreUnavailable as exc:
            log.warning("session %s: the window learned from an overflow (%d tokens) was "
                        "not saved in the session's state (%s)", self.session_id, limit, exc)
