"""The Agents SDK run's guards: the model-input budget filter and overflow recovery.

Apart from the session (``agents_sdk``) because they act on each model call
of a run, not on the stored history:

- :class:`InputBudget`, the ``RunConfig(call_model_input_filter=...)`` that
  runs before every model call: when instructions + tools + input + the
  output reserve would not fit the window, it truncates the input as the
  guard does (oldest turns first, no LLM, tool pairs kept whole).
- :class:`GuardedModel` wraps any SDK ``Model``: after a context-overflow error
  (detected across providers) the guard's recovery rules (``ContextGuard.recover``'s)
  decide what is learned and how hard the input is compacted, and the call is
  retried once; each response's reported input tokens calibrate the filter and,
  with a session, the guard's view.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, cast

try:
    from agents.items import ModelResponse, TResponseInputItem, TResponseStreamEvent
    from agents.model_settings import ModelSettings
    from agents.models.interface import Model
    from agents.run_config import CallModelData, ModelInputData
    from agents.tool import FunctionTool
except ModuleNotFoundError as exc:  # tests/test_install.py runs this without the extra
    raise ModuleNotFoundError("shared.integrations.agents_run needs the 'openai-agents' extra: "
                              "pip install 'context-compaction[openai-agents]'",
                              name=exc.name) from exc

from shared.core.budget import BudgetReport, check_budget
from shared.core.calibration import Calibration, prior_ratio
from shared.core.errors import StoreUnavailable
from shared.core.limits import output_reserve
from shared.core.messages import Message
from shared.core.records import SessionState
from shared.core.repair import repair_tool_pairs
from shared.core.truncation import emergency_truncate
from shared.core.turns import leading_system_count
from shared.guard import ContextGuard
from shared.guard.aio import error_reader_loaded
from shared.integrations._common import ByIdentity
from shared.integrations.agents_items import items_to_messages, mapped_from, messages_to_items
from shared.telemetry import get_metrics

if TYPE_CHECKING:
    from shared.integrations.agents_sdk import GuardedSession

log = logging.getLogger("shared.integrations.agents_sdk")
HEADROOM = 0.95  # truncation fills at most this share of the input budget
MARGIN = 0.05
"""The share of an estimate's unreported part (what no usage report counted: the heuristic
times the ratio) kept free below the input budget: an input whose estimate fits only
without it is trimmed (an overflow's recovery costs far more than a trim)."""

__all__ = ["Fitted", "GuardedModel", "InputBudget", "tool_schemas"]


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


@dataclass(frozen=True)
class _Measured:
    """An input counted: its messages, their heuristic tokens and keys, the request's
    other tokens (instructions and framing; tools) and its calibrated estimate."""

    messages: list[Message]
    tokens: list[int]
    keys: list[str]
    outside: int
    tool_tokens: int
    estimate: int
    unreported: int  # the part of the estimate no report counted

    @property
    def heuristic(self) -> int:
        return self.outside + self.tool_tokens + sum(self.tokens)


@dataclass(frozen=True)
class _Anchor:
    """The provider's count of the input last let through (``reported``), with what it
    held: the messages by key (heuristic tokens of each) and its other tokens."""

    reported: int
    fixed: int
    messages: Mapping[str, list[int]]


class InputBudget:
    """The guard's budget applied to the input the runner is about to send.

    Use as ``RunConfig(call_model_input_filter=budget)``. Within budget the
    input goes out untouched; over it, the oldest turns are dropped (then
    units, then long contents clipped) without an LLM, leading system
    messages (the session's summary) kept, tool pairs repaired. When the model
    is wrapped in :class:`GuardedModel` (``session.wrap(model)``), each response's
    reported input tokens count: the estimate is hybrid, as the guard's is (the
    provider's count of the input last let through, plus the heuristic, corrected
    by the learned ratio of reported to estimated tokens, for what was added since),
    and the ratio is learned from every report.
    """

    def __init__(self, guard: ContextGuard, *, model: str = "gpt-4o",
                 max_tokens: int | None = None) -> None:
        self.guard, self.model, self.max_tokens = guard, model, max_tokens
        self.truncations = 0  # how many calls this filter had to truncate
        # The heuristic against the provider's own counts (fed by GuardedModel from each
        # response's usage): a denser tokenizer than the heuristic's is learned, not
        # discovered by an overflow.
        self.calibration = Calibration()
        self.sent = 0  # the heuristic tokens of the input last let through
        self.estimate = 0  # its calibrated (hybrid) estimate
        self.truncated = False  # whether the input last let through was cut by this filter
        # A window smaller than the one known for the model, which an overflow of this
        # session stated or implied (where the window is known, it is this session's alone:
        # ContextGuard.learn_overflow); GuardedSession also sets it from the session's state.
        self.learned_window: int | None = None
        self._sent: _Measured | None = None
        self._anchor: _Anchor | None = None
        # the heuristic tokens of the last input measured, by message key: the runner
        # rebuilds its items each call, so a message is counted once, not on every call
        self._counted: dict[str, int] = {}
        # the last input mapped: its items, messages and cuts (agents_items.mapped_from)
        self._mapped: tuple[list[Any], list[Message], list[tuple[int, int]]] | None = None
        self._keys: ByIdentity[str] = ByIdentity()

    def limits(self) -> Any:
        """The model's limits, with the window this session learned (if smaller)."""
        state = (SessionState(learned_window=self.learned_window, learned_model=self.model,
                              model=self.model)
                 if self.learned_window else None)
        return self.guard.model_limits(self.model, state)

    def calibrate(self, usage: Any) -> None:
        """Fold in a response's usage (``input_tokens``) for the input last let through:
        it updates the ratio and anchors the next estimates."""
        reported = getattr(usage, "input_tokens", usage)
        if not isinstance(reported, int) or isinstance(reported, bool) or reported <= 0:
            return
        sent = self._sent
        if sent is None or not self.sent:
            return
        self.calibration = self.calibration.update(reported, self.sent)
        held: dict[str, list[int]] = {}
        for key, tokens in zip(sent.keys, sent.tokens, strict=True):
            held.setdefault(key, []).append(tokens)
        self._anchor = _Anchor(reported, sent.outside + sent.tool_tokens, held)

    def ratio(self) -> float:
        """The learned ratio, or the model's prior until a response reported usage."""
        if self.calibration.samples:
            return self.calibration.ratio
        return prior_ratio(self.model, self.guard.counter)

    def _anchored(self, fixed: int, keys: Sequence[str], tokens: Sequence[int],
                  ratio: float) -> tuple[int, int] | None:
        """The hybrid estimate of an input: the provider's count of the input last let
        through, plus the calibrated heuristic of the messages added since, minus that of
        the ones gone, with the part of it no report counted (None without a report)."""
        anchor = self._anchor
        if anchor is None:
            return None
        held = {key: list(found) for key, found in anchor.messages.items()}
        added = max(0, fixed - anchor.fixed)
        removed = max(0, anchor.fixed - fixed)
        for key, count in zip(keys, tokens, strict=True):
            found = held.get(key)
            if found:
                found.pop()
            else:
                added += count
        removed += sum(sum(found) for found in held.values())
        grown = math.ceil(added * ratio - 1e-9)
        estimate = anchor.reported + grown - int(removed * ratio)
        if removed:
            # Messages gone (a truncation, the guard's compaction between runs): the ratio
            # of what left is not known, so the estimate is never below the ratio's alone.
            plain = math.ceil((fixed + sum(tokens)) * ratio - 1e-9)
            if plain >= estimate:
                return plain, plain
        return max(estimate, 1), grown

    def _measure(self, items: Sequence[Any], instructions: str | None,
                 tools: Sequence[Any]) -> _Measured:
        counter = self.guard.counter
        messages = self._messages(items)
        # the request's own tokens besides its messages: instructions, tools, framing
        outside = (counter.message(Message(role="system", content=instructions))
                   if instructions else 0) + counter.messages([])
        schemas = tool_schemas(tools)
        tool_tokens = counter.tools(schemas) if schemas else 0
        return self._measured(messages, outside, tool_tokens)

    def _key(self, message: Message) -> str:
        """A message's key (its JSON), once per message object: the last input's messages
        are mostly those of the input before (:meth:`_messages`)."""
        key = self._keys.lookup(message, None)
        if key is None:
            key = message.model_dump_json()
            self._keys.put(message, key)
        return key

    def _messages(self, items: Sequence[Any]) -> list[Message]:
        """``items`` as messages. The runner sends the items of the call before again (as
        new, equal objects) with the new ones after them: the messages of the longest
        equal prefix that ends at a cut are the last call's, only the rest is mapped."""
        start, kept, cuts = 0, [], []
        if self._mapped is not None:
            before, messages, known = self._mapped
            same = 0
            for new, old in zip(items, before, strict=False):
                if new != old:
                    break
                same += 1
            for at, count in reversed(known):
                if at <= same:
                    start, kept = at, messages[:count]
                    cuts = [cut for cut in known if cut[0] <= at]
                    break
        added, more = mapped_from(items, "input", start)
        messages = [*kept, *added]
        cuts += [(at, count + len(kept)) for at, count in more]
        self._mapped = (list(items), messages, cuts)
        return list(messages)  # the caller's own list

    def _measured(self, messages: list[Message], outside: int,
                  tool_tokens: int) -> _Measured:
        counter = self.guard.counter
        keys = [self._key(m) for m in messages]
        known = self._counted
        tokens = [known[k] if k in known else counter.message(m)
                  for k, m in zip(keys, messages, strict=True)]
        self._counted = dict(zip(keys, tokens, strict=True))
        ratio = self.ratio()
        plain = math.ceil((outside + tool_tokens + sum(tokens)) * ratio - 1e-9)
        anchored = self._anchored(outside + tool_tokens, keys, tokens, ratio)
        estimate, unreported = (plain, plain) if anchored is None else anchored
        return _Measured(messages, tokens, keys, outside, tool_tokens, estimate, unreported)

    def estimate_of(self, items: Sequence[Any], instructions: str | None,
                    tools: Sequence[Any]) -> int:
        """The calibrated (hybrid) estimate of the request's input tokens."""
        return self._measure(items, instructions, tools).estimate

    def sent_history(self) -> tuple[int, int] | None:
        """How many messages the input last let through held after its leading system
        ones, and their heuristic tokens (None before any)."""
        sent = self._sent
        if sent is None:
            return None
        head = leading_system_count(sent.messages)
        return len(sent.messages) - head, sum(sent.tokens[head:])

    def _let_through(self, measured: _Measured, truncated: bool) -> None:
        self._sent, self.sent = measured, measured.heuristic
        self.estimate, self.truncated = measured.estimate, truncated

    def fit(self, items: Sequence[Any], instructions: str | None, tools: Sequence[Any], *,
            force_ratio: float | None = None) -> Fitted:
        """Fit ``items`` into the budget (or into ``force_ratio`` of the window), counting
        with the hybrid estimate (:meth:`calibrate`)."""
        measured = self._measure(items, instructions, tools)
        messages, outside, tool_tokens = measured.messages, measured.outside, measured.tool_tokens
        head = leading_system_count(messages)
        limits = self.limits()
        reserve = output_reserve(limits, self.max_tokens)
        # the estimate spread over the regions by their heuristic shares
        ratio = measured.estimate / measured.heuristic if measured.heuristic else self.ratio()

        def calibrated(tokens: int) -> int:
            return math.ceil(tokens * ratio - 1e-9)
        lead = sum(measured.tokens[:head])
        history = sum(measured.tokens[head:])
        newest = measured.tokens[-1] if messages and messages[-1].role == "user" else 0
        report = check_budget(window=limits.context_window, reserve=reserve,
                              system=calibrated(outside + lead), tools=calibrated(tool_tokens),
                              history=calibrated(history), newest=calibrated(newest),
                              trigger_ratio=self.guard.policy.trigger_ratio,
                              target_ratio=self.guard.policy.target_ratio)
        margin = math.ceil(measured.unreported * MARGIN)
        if report.within_budget and force_ratio is None \
                and measured.estimate + margin <= report.input_budget:
            self._let_through(measured, False)
            return Fitted(list(items), report, False, 0, "")
        room = int(report.input_budget * HEADROOM)
        if force_ratio is not None:
            room = min(room, int(limits.context_window * force_ratio))
        # heuristic units for the messages (the leading system ones are kept whole)
        budget = max(1, int(room / ratio) - outside - tool_tokens)
        result = emergency_truncate(messages, budget, self.guard.counter,
                                    drop_fraction=self.guard.policy.emergency_drop_fraction)
        kept = repair_tool_pairs(result.messages)
        if result.note and result.dropped:
            at = leading_system_count(kept)
            kept.insert(at, Message(role="system", content=result.note))
        self.truncations += 1
        self._let_through(self._measured(kept, outside, tool_tokens), True)
        return Fitted(messages_to_items(kept), report, True, result.dropped, result.note)

    def resent(self, items: Sequence[Any], instructions: str | None, tools: Sequence[Any],
               truncated: bool) -> None:
        """``items`` go out again as they were (a retry that lowers ``max_tokens``
        instead): what was let through, cut by this filter before or not (``truncated``)."""
        self._let_through(self._measure(items, instructions, tools), truncated)

    def payload_share(self, error: object, items: Sequence[Any], instructions: str | None,
                      tools: Sequence[Any], ratio: float) -> float:
        """``ratio``, or for a refusal of the body's bytes the share of the window that
        keeps ``ratio`` of the input's bytes (``ContextGuard.payload_ratio``)."""
        measured = self._measure(items, instructions, tools)
        found = self.guard.payload_ratio(error, measured.messages,
                                         measured.outside + measured.tool_tokens,
                                         self.limits().context_window, ratio)
        return ratio if found is None else found

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


def _max_tokens(args: Sequence[Any], kwargs: Mapping[str, Any]) -> int | None:
    """``model_settings.max_tokens`` of a ``get_response`` / ``stream_response`` call (the
    argument right after ``input``), however it was passed."""
    settings = args[0] if args else kwargs.get("model_settings")
    value = getattr(settings, "max_tokens", None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _with_max_tokens(args: tuple[Any, ...], kwargs: dict[str, Any], max_tokens: int | None,
                     ) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The call's arguments with ``model_settings.max_tokens`` set to ``max_tokens``
    (unchanged for None)."""
    if max_tokens is None:
        return args, kwargs
    settings = args[0] if args else kwargs.get("model_settings")
    lowered = replace(settings if settings is not None else ModelSettings(),
                      max_tokens=max_tokens)
    if args:
        return (lowered, *args[1:]), kwargs
    return args, {**kwargs, "model_settings": lowered}


def _user_kept(items: Sequence[Any], kept: Sequence[Any]) -> bool:
    """Whether the newest user message of ``items`` is in ``kept`` as it was (a cut may
    clip it when nothing older is left to drop)."""
    messages = items_to_messages(items, prefix="input")
    newest = next((m for m in reversed(messages) if m.role == "user"), None)
    return newest is None or newest in items_to_messages(kept, prefix="input")


def _input_tokens(usage: Any) -> int | None:
    """The input tokens a response's usage reports (the SDK's ``Usage`` or the Responses
    API's ``ResponseUsage``), or None."""
    reported = getattr(usage, "input_tokens", None)
    if isinstance(reported, int) and not isinstance(reported, bool) and reported > 0:
        return reported
    return None


class GuardedModel(Model):
    """An SDK ``Model`` that survives one context overflow per call.

    On an overflow error the guard's own recovery rules decide
    (:meth:`ContextGuard.recover`'s, applied to the runner's input instead of the
    session's view): the limit the error states is learned (when it states none, the
    input the filter let through bounds it: :func:`~shared.core.limits.refused_bound`;
    below a window the registry or the caller knows, for this session only: its state,
    not the process's :class:`~shared.core.limits.LimitBook`), the input is compacted to
    the policy's recovery ratio of the smaller of the window and the refused input (less
    when the error's count of the refused input is far above the estimate), and the call
    is retried once, unless the compacted input would be no smaller than the refused one
    (then the error reaches the caller: the same request would be refused again). A
    second failure, or any other error, reaches the caller unchanged (an error nothing
    recognises is taken for an overflow when the refused input was nearly as large as
    the window: ``CompactionPolicy.unrecognised_overflow_at``). After an output-reserve
    overflow (the prompt alone fitted) whose compaction would clip the user's newest
    message, or make nothing smaller, the same input is retried with the ``max_tokens``
    the stated window leaves it (:meth:`ContextGuard.answer_room`, as ``recover`` does).

    Each response's reported input tokens calibrate the budget filter and, with a
    session, reach the guard with the turn (``GuardedSession.add_items``).
    """

    def __init__(self, inner: Model, budget: InputBudget, *,
                 session: GuardedSession | None = None) -> None:
        self.inner, self.budget, self.session = inner, budget, session
        self.recoveries = 0

    async def _recover(self, error: Exception, system_instructions: str | None,
                       input: str | list[TResponseInputItem], tools: Sequence[Any],
                       asked: int | None) -> tuple[list[Any], int | None]:
        """The input to retry with and, after an output-reserve overflow, the lower
        ``max_tokens`` to send it with (None: the request's own). ``asked``: the
        ``max_tokens`` the refused request sent."""
        await error_reader_loaded()
        budget, guard, model = self.budget, self.budget.guard, self.budget.model
        session_id = self.session.session_id if self.session is not None else ""
        items = [{"role": "user", "content": input}] if isinstance(input, str) else list(input)
        refused = budget.estimate_of(items, system_instructions, tools)
        asked = asked or budget.max_tokens
        decided = guard.overflow_ratio(session_id, error, model, asked, refused)
        if decided is None:
            raise error
        ratio, recognised = decided
        with guard.traced_recover(session_id, model, error) as trace:
            if not recognised:
                trace.current.set_attribute("compaction.unrecognised_error", True)
            state = await self._state(session_id)
            limit = guard.learn_overflow(session_id, error, model, trace, refused, state)
            if limit:
                if limit < budget.limits().context_window:
                    budget.learned_window = limit
                if self.session is not None:
                    await self.session.learned(limit, model)
            window = budget.limits().context_window
            if recognised:
                ratio = guard.refused_ratio(ratio, error, window, refused)
            ratio = budget.payload_share(error, items, system_instructions, tools, ratio)
            truncated = budget.truncated
            fitted = budget.fit(items, system_instructions, tools, force_ratio=ratio)
            smaller = not (budget.estimate > refused
                           or (budget.estimate == refused and not fitted.dropped))
            room = (guard.answer_room(error, asked, refused)
                    if not smaller or not _user_kept(items, fitted.items) else None)
            if room is not None:
                # As the guard's recover: the prompt alone fitted, and compacting it makes
                # no room for the answer without clipping the user's newest message, so the
                # same input goes out with the max_tokens the window leaves it.
                budget.resent(items, system_instructions, tools, truncated)
                get_metrics().recovery("recovered")
                self.recoveries += 1
                return items, room
            if not smaller:
                budget.truncated = True  # what was let through is not what went out
                trace.current.set_attribute("compaction.no_smaller_view", True)
                get_metrics().recovery("no_smaller_view")
                log.warning("session %s: overflow, but no smaller input than the refused one "
                            "(~%d tokens) can be made; not retried", session_id or "-",
                            refused)
                raise error
            get_metrics().recovery("recovered")
            self.recoveries += 1
            return fitted.items, None

    async def _state(self, session_id: str) -> SessionState | None:
        """The session's state (the window it learned) with this filter's learned window
        where that is smaller; None without a session or its state."""
        budget = self.budget
        state: SessionState | None = None
        if self.session is not None:
            try:
                state = await asyncio.to_thread(budget.guard.store.state, session_id)
            except StoreUnavailable:
                state = None
        learned = budget.learned_window
        own = (state.learned_for(budget.model, lambda: budget.guard.known_window(budget.model))
               if state is not None else 0)
        if learned and (state is None or not own or learned < own):
            state = (state or SessionState()).model_copy(update={
                "learned_window": learned, "learned_model": budget.model,
                "model": budget.model})
        return state

    def _responded(self, usage: Any, recovered: bool) -> None:
        """A response's usage: the filter's calibration and anchor, and (for a request the
        runner's input went out unchanged in, as the session's view extended by the run)
        the guard's, through the session's next ``add_items``."""
        reported = _input_tokens(usage)
        if reported is None:
            return
        self.budget.calibrate(reported)
        if self.session is not None:
            self.session.responded(reported, faithful=not recovered and not self.budget.truncated)

    async def get_response(self, system_instructions: str | None,
                           input: str | list[TResponseInputItem], *args: Any,
                           **kwargs: Any) -> ModelResponse:
        recovered = False
        try:
            response = await self.inner.get_response(system_instructions, input, *args,
                                                     **kwargs)
        except Exception as exc:
            retry, room = await self._recover(exc, system_instructions, input,
                                              _tools_arg(args, kwargs), _max_tokens(args, kwargs))
            recovered = True
            args, kwargs = _with_max_tokens(args, kwargs, room)
            response = await self.inner.get_response(
                system_instructions, cast(list[TResponseInputItem], retry), *args, **kwargs)
        self._responded(response.usage, recovered)
        return response

    async def stream_response(self, system_instructions: str | None,
                              input: str | list[TResponseInputItem], *args: Any,
                              **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        started = False
        try:
            async for event in self.inner.stream_response(system_instructions, input,
                                                          *args, **kwargs):
                started = True
                self._usage_of(event, False)
                yield event
            return
        except Exception as exc:
            if started:  # events already reached the caller: no silent retry
                raise
            retry, room = await self._recover(exc, system_instructions, input,
                                              _tools_arg(args, kwargs), _max_tokens(args, kwargs))
            args, kwargs = _with_max_tokens(args, kwargs, room)
        async for event in self.inner.stream_response(
                system_instructions, cast(list[TResponseInputItem], retry), *args, **kwargs):
            self._usage_of(event, True)
            yield event

    def _usage_of(self, event: Any, recovered: bool) -> None:
        """The usage a stream reports in its ``response.completed`` event."""
        if getattr(event, "type", None) == "response.completed":
            self._responded(getattr(getattr(event, "response", None), "usage", None),
                            recovered)

    def get_retry_advice(self, request: Any) -> Any:
        return self.inner.get_retry_advice(request)

    async def close(self) -> None:
        await self.inner.close()
