"""OpenAI Agents SDK integration: a ``Session`` backed by the store, a model-input
budget filter and one-shot overflow recovery (the ``[openai-agents]`` extra).

The runner reads the session once per run, then keeps the run's items in
memory; three pieces keep a long run inside the window::

    session = GuardedSession(guard, "user-42", model="gpt-4o", max_tokens=2000)
    agent = Agent(name="a", instructions=SYSTEM, tools=[...], model=session.wrap(model))
    result = await Runner.run(agent, text, session=session, run_config=session.run_config())

- :class:`GuardedSession` (the SDK's ``Session`` protocol): ``get_items``
  returns the guard's view (summary first, then recent items, tool pairs
  intact); ``add_items`` appends and enqueues the worker job; ``pop_item``
  and ``clear_session`` are history edits (``truncate_after`` / delete).
- :class:`InputBudget`, the ``RunConfig(call_model_input_filter=...)`` that
  runs before every model call: when instructions + tools + input + the
  output reserve would not fit the window, it truncates the input as the
  guard does (oldest turns first, no LLM, tool pairs kept whole).
- :class:`GuardedModel` wraps any SDK ``Model``: a context-overflow error
  (detected across providers) teaches the guard the stated limit, the
  input is compacted to a fifth of the window and the call is retried once.

Item mapping (Responses input items <-> neutral :class:`Message`), lossless
for what these item types carry:

==============================  ===============================================
item                            message
==============================  ===============================================
``message`` user / system       ``user`` / ``system`` (``developer`` is a system
/ developer (easy or typed)     message with metadata ``agents_role``); parts
                                ``input_text`` / ``input_image`` / ``input_file``
``message`` assistant           ``assistant``; ``output_text`` parts joined, the
                                original parts and item id kept in metadata
``function_call``               a tool call on the assistant message before it
                                (one message per model turn: parallel calls stay
                                together)
``function_call_output``        ``tool`` (``call_id`` -> ``tool_call_id``)
``reasoning``                   ``Message.reasoning`` of the next assistant
                                message; the item itself kept in metadata
==============================  ===============================================

Any other item (hosted tool calls, computer use, item references...) is
refused with :class:`InvalidInput` naming ``items[i].type``; a batch is
mapped completely before anything is written, so a refused batch leaves
the session as it was.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

try:
    from agents.items import ModelResponse, TResponseInputItem, TResponseStreamEvent
    from agents.models.interface import Model
    from agents.run_config import CallModelData, ModelInputData, RunConfig
    from agents.tool import FunctionTool
except ModuleNotFoundError as exc:  # tests/test_install.py runs this without the extra
    raise ModuleNotFoundError("shared.integrations.agents_sdk needs the 'openai-agents' extra: "
                              "pip install 'context-compaction[openai-agents]'",
                              name=exc.name) from exc

from shared.core.budget import BudgetReport, check_budget
from shared.core.errors import InvalidInput
from shared.core.limits import output_reserve
from shared.core.messages import Message
from shared.core.overflow import is_context_overflow, parse_overflow
from shared.core.repair import repair_tool_pairs
from shared.core.truncation import emergency_truncate
from shared.core.turns import leading_system_count
from shared.guard import ContextGuard

ID = "agents_id"  # the item id (msg_..., fc_..., rs_...) of a message
ROLE = "agents_role"  # "developer" for a developer message
PARTS = "agents_content"  # an assistant message's original output parts
CALL_IDS = "agents_call_ids"  # {call_id: function_call item id}
REASONING = "agents_reasoning"  # reasoning items that preceded the message
HEADROOM = 0.95  # truncation fills at most this share of the input budget
SUPPORTED = ("message", "function_call", "function_call_output", "reasoning")

__all__ = [
    "GuardedModel",
    "GuardedSession",
    "InputBudget",
    "items_to_messages",
    "messages_to_items",
]


# -- items -> messages ---------------------------------------------------------------------
def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _mapping(raw: Any, where: str) -> Mapping[str, Any]:
    if hasattr(raw, "model_dump"):  # an SDK pydantic item (ResponseFunctionToolCall...)
        raw = raw.model_dump(mode="json", exclude_none=True)
    if not isinstance(raw, Mapping):
        raise InvalidInput(f"expected an object, got {_kind(raw)}", field=where)
    return raw


def _str(obj: Mapping[str, Any], key: str, where: str, *, nonempty: bool = False) -> str:
    value = obj.get(key)
    if not isinstance(value, str):
        raise InvalidInput("required" if key not in obj else
                           f"expected a string, got {_kind(value)}", field=f"{where}.{key}")
    if nonempty and not value:
        raise InvalidInput("must not be empty", field=f"{where}.{key}")
    return value


def _input_parts(content: Any, where: str) -> str | list[dict[str, Any]]:
    """User/system/tool-output content: a string, or input_text/image/file parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidInput(f"expected a string or a list of parts, got {_kind(content)}",
                           field=where)
    parts: list[dict[str, Any]] = []
    for j, raw in enumerate(content):
        at = f"{where}[{j}]"
        part = _mapping(raw, at)
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text"):
            parts.append({"type": "text", "text": _str(part, "text", at)})
        elif kind == "input_image":
            url = part.get("image_url")
            if isinstance(url, str) and url.startswith("data:") and ";base64," in url:
                media, data = url[5:].split(";base64,", 1)
                image = {"type": "image", "data": data, "media_type": media}
            elif isinstance(url, str) and url:
                image = {"type": "image", "url": url}
            else:
                raise InvalidInput("only images by URL or data URL are supported "
                                   "(file_id images are not)", field=f"{at}.image_url")
            if isinstance(part.get("detail"), str):
                image["detail"] = part["detail"]
            parts.append(image)
        elif kind == "input_file":
            file: dict[str, Any] = {"type": "file"}
            for src, dst in (("file_url", "url"), ("file_id", "file_id"),
                             ("filename", "filename"), ("file_data", "data")):
                if isinstance(part.get(src), str):
                    file[dst] = part[src]
            if not ({"url", "file_id", "data"} & file.keys()):
                raise InvalidInput("a file needs file_url, file_id or file_data", field=at)
            parts.append(file)
        else:
            raise InvalidInput(f"unknown content part type {kind!r} (expected input_text, "
                               "input_image or input_file)", field=f"{at}.type")
    return parts


@dataclass
class _Builder:
    """Folds a flat item list into messages (one assistant message per model turn)."""

    prefix: str
    out: list[Message] = field(default_factory=list)
    reasoning: list[dict[str, Any]] = field(default_factory=list)
    turn: dict[str, Any] | None = None  # the assistant message being built
    turn_at: str = ""

    def start_turn(self, content: str, meta: dict[str, Any], where: str) -> dict[str, Any]:
        """A new assistant message; reasoning items seen since the last one belong to it."""
        self._close()
        turn: dict[str, Any] = {"role": "assistant", "content": content, "tool_calls": [],
                                "metadata": meta}
        if self.reasoning:
            meta[REASONING] = self.reasoning
            texts = [str(s.get("text", "")) for r in self.reasoning
                     for s in r.get("summary") or [] if isinstance(s, Mapping)]
            if any(texts):
                turn["reasoning"] = "\n\n".join(t for t in texts if t)
            self.reasoning = []
        self.turn, self.turn_at = turn, where
        return turn

    def _close(self) -> None:
        if self.turn is not None:
            turn, self.turn = self.turn, None
            self.out.append(_build(turn, self.turn_at))

    def end_turn(self) -> None:
        """Close the assistant message; reasoning with nothing after it gets its own."""
        if self.turn is None and self.reasoning:
            self.start_turn("", {}, self.turn_at or self.prefix)
        self._close()

    def add(self, raw: Any, i: int) -> None:
        where = f"{self.prefix}[{i}]"
        item = _mapping(raw, where)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            self._message(item, where)
        elif kind == "function_call":
            call_id = _str(item, "call_id", where, nonempty=True)
            name = _str(item, "name", where, nonempty=True)
            arguments = _str(item, "arguments", where)
            try:
                json.loads(arguments or "{}")
            except ValueError as exc:
                raise InvalidInput(f"not valid JSON ({exc})", field=f"{where}.arguments") from None
            turn = self.turn if self.turn is not None else self.start_turn("", {}, where)
            turn["tool_calls"].append({"id": call_id, "name": name, "arguments": arguments or "{}"})
            if isinstance(item.get("id"), str):
                turn["metadata"].setdefault(CALL_IDS, {})[call_id] = item["id"]
        elif kind == "function_call_output":
            self.end_turn()
            content = _input_parts(item.get("output"), f"{where}.output")
            meta = {ID: item["id"]} if isinstance(item.get("id"), str) else {}
            self.out.append(_build({"role": "tool", "content": content, "metadata": meta,
                                    "tool_call_id": _str(item, "call_id", where, nonempty=True)},
                                   where))
        elif kind == "reasoning":
            if self.turn is not None:
                self.end_turn()
            self.turn_at = where
            self.reasoning.append(json.loads(json.dumps(dict(item), default=str)))
        else:
            raise InvalidInput(f"cannot map item type {kind!r} to a message (supported: "
                               f"{', '.join(SUPPORTED)})", field=f"{where}.type")

    def _message(self, item: Mapping[str, Any], where: str) -> None:
        role = item.get("role")
        if role not in ("user", "system", "developer", "assistant"):
            raise InvalidInput(f"unknown role {role!r} (expected user, system, developer or "
                               "assistant)", field=f"{where}.role")
        meta: dict[str, Any] = {}
        if isinstance(item.get("id"), str):
            meta[ID] = item["id"]
        content = item.get("content")
        if role == "assistant":
            text = content if isinstance(content, str) else None
            if text is None:
                if not isinstance(content, list):
                    raise InvalidInput(f"expected a string or a list of parts, got "
                                       f"{_kind(content)}", field=f"{where}.content")
                texts = []
                for j, raw in enumerate(content):
                    part = _mapping(raw, f"{where}.content[{j}]")
                    if part.get("type") in ("output_text", "input_text", "text"):
                        texts.append(_str(part, "text", f"{where}.content[{j}]"))
                    elif part.get("type") == "refusal":
                        texts.append(_str(part, "refusal", f"{where}.content[{j}]"))
                    else:
                        raise InvalidInput(f"unknown content part type {part.get('type')!r} "
                                           "(expected output_text or refusal)",
                                           field=f"{where}.content[{j}].type")
                text = "".join(texts)
                meta[PARTS] = json.loads(json.dumps(content, default=str))
            self.start_turn(text, meta, where)
            return
        self.end_turn()
        if role == "developer":
            role, meta[ROLE] = "system", "developer"
        self.out.append(_build({"role": role, "metadata": meta,
                                "content": _input_parts(content, f"{where}.content")}, where))


def _build(data: dict[str, Any], where: str) -> Message:
    try:
        return Message.model_validate(data)
    except ValueError as exc:
        raise InvalidInput(str(exc).splitlines()[-1].strip() if str(exc) else "invalid",
                           field=where) from None


def items_to_messages(items: Sequence[Any], prefix: str = "items") -> list[Message]:
    """Neutral messages from Responses input items (see the module docstring)."""
    if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Sequence):
        raise InvalidInput(f"expected a list of items, got {_kind(items)}", field=prefix)
    builder = _Builder(prefix)
    for i, raw in enumerate(items):
        builder.add(raw, i)
    builder.end_turn()
    return builder.out


# -- messages -> items ---------------------------------------------------------------------
def _parts_out(content: Any, *, output: bool = False) -> Any:
    if isinstance(content, str):
        return content
    out: list[dict[str, Any]] = []
    for part in content:
        if part.type == "text":
            out.append({"type": "input_text", "text": part.text})
        elif part.type == "image":
            url = part.url or f"data:{part.media_type};base64,{part.data}"
            image: dict[str, Any] = {"type": "input_image", "image_url": url,
                                     "detail": part.detail or "auto"}
            out.append(image)
        else:
            file: dict[str, Any] = {"type": "input_file"}
            for src, dst in (("url", "file_url"), ("file_id", "file_id"),
                             ("filename", "filename"), ("data", "file_data")):
                if getattr(part, src) is not None:
                    file[dst] = getattr(part, src)
            out.append(file)
    return out


def messages_to_items(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Responses input items from neutral messages (the inverse of :func:`items_to_messages`)."""
    items: list[dict[str, Any]] = []
    for m in messages:
        meta = m.metadata
        if m.role == "tool":
            item: dict[str, Any] = {"type": "function_call_output", "call_id": m.tool_call_id,
                                    "output": _parts_out(m.content)}
            if ID in meta:
                item["id"] = meta[ID]
            items.append(item)
        elif m.role == "assistant":
            items.extend(cast(list[dict[str, Any]], meta.get(REASONING, [])))
            text = m.text()
            if text or (not m.tool_calls and REASONING not in meta):
                parts = meta.get(PARTS)
                if ID in meta:
                    joined = ("".join(p.get("text", p.get("refusal", "")) for p in parts)
                              if isinstance(parts, list) else None)
                    content = parts if joined == text else [
                        {"type": "output_text", "text": text, "annotations": []}]
                    items.append({"type": "message", "role": "assistant", "id": meta[ID],
                                  "status": "completed", "content": content})
                else:
                    items.append({"role": "assistant", "content": text})
            calls = meta.get(CALL_IDS, {})
            for c in m.tool_calls:
                call: dict[str, Any] = {"type": "function_call", "call_id": c.id,
                                        "name": c.name, "arguments": c.arguments}
                if c.id in calls:
                    call["id"] = calls[c.id]
                items.append(call)
        else:
            role = "developer" if meta.get(ROLE) == "developer" else m.role
            item = {"role": role, "content": _parts_out(m.content)}
            if ID in meta:
                item["id"], item["type"] = meta[ID], "message"
            items.append(item)
    return items


# -- the budget filter ---------------------------------------------------------------------
def tool_schemas(tools: Sequence[Any]) -> list[dict[str, Any]]:
    """Tool definitions as the provider sees them (for counting their tokens)."""
    out: list[dict[str, Any]] = []
    for tool in tools:
        if isinstance(tool, FunctionTool):
            out.append({"type": "function", "name": tool.name,
                        "description": tool.description or "",
                        "parameters": tool.params_json_schema})
        else:
            out.append({"type": getattr(tool, "name", type(tool).__name__)})
    return out


@dataclass(frozen=True)
class Fitted:
    """What :meth:`InputBudget.fit` did: the items to send and the budget before."""

    items: list[Any]
    report: BudgetReport
    truncated: bool
    dropped: int
    note: str


class InputBudget:
    """The guard's budget applied to the input the runner is about to send.

    Use as ``RunConfig(call_model_input_filter=budget)``. Within budget the
    input goes out untouched; over it, the oldest turns are dropped (then
    units, then long contents clipped) without an LLM, leading system
    messages (the session's summary) kept, tool pairs repaired.
    """

    def __init__(self, guard: ContextGuard, *, model: str = "gpt-4o",
                 max_tokens: int | None = None) -> None:
        self.guard, self.model, self.max_tokens = guard, model, max_tokens
        self.truncations = 0  # how many calls this filter had to truncate

    def fit(self, items: Sequence[Any], instructions: str | None, tools: Sequence[Any], *,
            force_ratio: float | None = None) -> Fitted:
        """Fit ``items`` into the budget (or into ``force_ratio`` of the window)."""
        counter = self.guard.counter
        messages = items_to_messages(items, prefix="input")
        head = leading_system_count(messages)
        system = counter.message(Message(role="system", content=instructions)) \
            if instructions else 0
        system += sum(counter.message(m) for m in messages[:head])
        schemas = tool_schemas(tools)
        tool_tokens = counter.tools(schemas) if schemas else 0
        history = sum(counter.message(m) for m in messages[head:])
        limits = self.guard.model_limits(self.model)
        reserve = output_reserve(limits, self.max_tokens)
        newest = counter.message(messages[-1]) if messages and messages[-1].role == "user" else 0
        report = check_budget(window=limits.context_window, reserve=reserve, system=system,
                              tools=tool_tokens + counter.messages([]), history=history,
                              newest=newest, trigger_ratio=self.guard.policy.trigger_ratio,
                              target_ratio=self.guard.policy.target_ratio)
        if report.within_budget and force_ratio is None:
            return Fitted(list(items), report, False, 0, "")
        fixed = system + tool_tokens + counter.messages([])
        room = int(report.input_budget * HEADROOM)
        if force_ratio is not None:
            room = min(room, int(limits.context_window * force_ratio))
        budget = max(1, room - fixed + sum(counter.message(m) for m in messages[:head]))
        result = emergency_truncate(messages, budget, counter,
                                    drop_fraction=self.guard.policy.emergency_drop_fraction)
        kept = repair_tool_pairs(result.messages)
        if result.note and result.dropped:
            at = leading_system_count(kept)
            kept.insert(at, Message(role="system", content=result.note))
        self.truncations += 1
        return Fitted(messages_to_items(kept), report, True, result.dropped, result.note)

    def __call__(self, data: CallModelData[Any]) -> ModelInputData:
        fitted = self.fit(data.model_data.input, data.model_data.instructions,
                          list(getattr(data.agent, "tools", []) or []))
        if not fitted.truncated:
            return data.model_data
        return ModelInputData(input=cast(list[TResponseInputItem], fitted.items),
                              instructions=data.model_data.instructions)


# -- recovery --------------------------------------------------------------------------------
def _tools_arg(args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[Any]:
    """``tools`` of a ``get_response`` / ``stream_response`` call after ``input``
    (positional order: model_settings, tools, ...), however it was passed."""
    tools = args[1] if len(args) > 1 else kwargs.get("tools")
    return list(tools or [])


class GuardedModel(Model):
    """An SDK ``Model`` that survives one context overflow per call.

    On an overflow error the stated limit is learned (the budget filter
    uses it from then on), the input is compacted to the policy's recovery
    ratio of the window and the call is retried once; a second failure, or
    any other error, reaches the caller unchanged.
    """

    def __init__(self, inner: Model, budget: InputBudget, *,
                 session: GuardedSession | None = None) -> None:
        self.inner, self.budget, self.session = inner, budget, session
        self.recoveries = 0

    def _recover(self, error: Exception, system_instructions: str | None,
                 input: str | list[TResponseInputItem], tools: Sequence[Any]) -> list[Any]:
        if not is_context_overflow(error):
            raise error
        guard = self.budget.guard
        info = parse_overflow(error)
        if info is not None and info.limit:
            guard.limits.learn(self.budget.model, info.limit)
            if self.session is not None:
                guard.store.update_state(self.session.session_id, learned_window=info.limit,
                                         model=self.budget.model)
        items = [{"role": "user", "content": input}] if isinstance(input, str) else input
        self.recoveries += 1
        return self.budget.fit(items, system_instructions, tools,
                               force_ratio=guard.policy.recovery_ratio).items

    async def get_response(self, system_instructions: str | None,
                           input: str | list[TResponseInputItem], *args: Any,
                           **kwargs: Any) -> ModelResponse:
        try:
            return await self.inner.get_response(system_instructions, input, *args, **kwargs)
        except Exception as exc:
            tools = _tools_arg(args, kwargs)
            retry = self._recover(exc, system_instructions, input, tools)
        return await self.inner.get_response(
            system_instructions, cast(list[TResponseInputItem], retry), *args, **kwargs)

    async def stream_response(self, system_instructions: str | None,
                              input: str | list[TResponseInputItem], *args: Any,
                              **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        started = False
        try:
            async for event in self.inner.stream_response(system_instructions, input,
                                                          *args, **kwargs):
                started = True
                yield event
            return
        except Exception as exc:
            if started:  # events already reached the caller: no silent retry
                raise
            tools = _tools_arg(args, kwargs)
            retry = self._recover(exc, system_instructions, input, tools)
        async for event in self.inner.stream_response(
                system_instructions, cast(list[TResponseInputItem], retry), *args, **kwargs):
            yield event

    def get_retry_advice(self, request: Any) -> Any:
        return self.inner.get_retry_advice(request)

    async def close(self) -> None:
        await self.inner.close()


def _last(items: list[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    """The newest ``limit`` items, less outputs whose call was cut off (a provider
    refuses an output without its call)."""
    tail = items[len(items) - limit:] if limit else []
    calls = {i.get("call_id") for i in tail if i.get("type") == "function_call"}
    return [i for i in tail if i.get("type") != "function_call_output"
            or i.get("call_id") in calls]


# -- the session -----------------------------------------------------------------------------
class GuardedSession:
    """The Agents SDK ``Session`` protocol over the store, through the guard.

    ``instructions`` and ``tools`` (definitions as dicts) let the guard
    count the fixed part of the request when it builds the view; ``model``
    and ``max_tokens`` size the budget. Blocking store calls run in a
    worker thread, so the event loop never waits on Redis.
    """

    session_settings: Any = None

    def __init__(self, guard: ContextGuard, session_id: str, *, model: str = "gpt-4o",
                 max_tokens: int | None = None, instructions: str = "",
                 tools: Sequence[Mapping[str, Any]] | None = None) -> None:
        from shared.store.keys import validate_session_id

        validate_session_id(session_id)
        self.guard, self.session_id = guard, session_id
        self.model, self.max_tokens = model, max_tokens
        self.instructions, self.tools = instructions, list(tools) if tools else None
        self.input_filter = InputBudget(guard, model=model, max_tokens=max_tokens)
        self.last_view: Any = None  # the PreparedView behind the last get_items

    @classmethod
    def for_agent(cls, guard: ContextGuard, session_id: str, agent: Any, *,
                  model: str = "gpt-4o", max_tokens: int | None = None) -> GuardedSession:
        """A session that counts ``agent``'s instructions (when a string) and tools."""
        instructions = agent.instructions if isinstance(agent.instructions, str) else ""
        return cls(guard, session_id, model=model, max_tokens=max_tokens,
                   instructions=instructions, tools=tool_schemas(agent.tools or []))

    # -- wiring -----------------------------------------------------------------------------
    def wrap(self, model: Model) -> GuardedModel:
        """``model`` with overflow recovery sharing this session's budget."""
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

    def _view_items(self, limit: int | None) -> list[dict[str, Any]]:
        view = self.guard.prepare(self.session_id, self.instructions, self.tools,
                                  self.max_tokens, self.model)
        self.last_view = view
        messages = list(view.messages)
        if messages and messages[0].role == "system" and self.instructions:
            # The runner sends the agent's own instructions; keep only the summary part.
            rest = str(messages[0].content).removeprefix(self.instructions).lstrip("\n")
            messages = ([Message(role="system", content=rest)] if rest else []) + messages[1:]
        items = messages_to_items(messages)
        if limit is not None:
            return _last(items, limit)
        return items

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        messages = items_to_messages(items)  # all mapped before anything is written
        if messages:
            await asyncio.to_thread(self.guard.record_turn, self.session_id, messages)

    async def pop_item(self) -> TResponseInputItem | None:
        return cast(TResponseInputItem | None, await asyncio.to_thread(self._pop))

    def _pop(self) -> dict[str, Any] | None:
        store = self.guard.store
        length = store.length(self.session_id)
        if length == 0:
            return None
        last = store.messages(self.session_id, length - 1, length)[0]
        items = messages_to_items([last])
        popped = items.pop()
        rest = items_to_messages(items)  # mapped before the log is touched
        store.truncate_after(self.session_id, length - 1)
        if rest:  # the message held more than one item: put the others back
            store.append(self.session_id, rest)
        self.guard.views.discard(self.session_id)
        return popped

    async def clear_session(self) -> None:
        await asyncio.to_thread(self.guard.store.delete_session, self.session_id)
        self.guard.views.discard(self.session_id)
