"""The Agents SDK run's guards: the model-input budget filter and overflow recovery.

Apart from the session (``agents_sdk``) because they act on each model call
of a run, not on the stored history:

- :class:`InputBudget`, the ``RunConfig(call_model_input_filter=...)`` that
  runs before every model call: when instructions + tools + input + the
  output reserve would not fit the window, it truncates the input as the
  guard does (oldest turns first, no LLM, tool pairs kept whole).
- :class:`GuardedModel` wraps any SDK ``Model``: a context-overflow error
  (detected across providers) teaches the guard the stated limit, the
  input is compacted to a fifth of the window and the call is retried once.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

try:
    from agents.items import ModelResponse, TResponseInputItem, TResponseStreamEvent
    from agents.models.interface import Model
    from agents.run_config import CallModelData, ModelInputData
    from agents.tool import FunctionTool
except ModuleNotFoundError as exc:  # tests/test_install.py runs this without the extra
    raise ModuleNotFoundError("shared.integrations.agents_run needs the 'openai-agents' extra: "
                              "pip install 'context-compaction[openai-agents]'",
                              name=exc.name) from exc

from shared.core.budget import BudgetReport, check_budget
from shared.core.calibration import Calibration, prior_ratio
from shared.core.limits import output_reserve, refused_bound, stated_limit
from shared.core.messages import Message
from shared.core.overflow import is_context_overflow, parse_overflow, unrecognised
from shared.core.repair import repair_tool_pairs
from shared.core.truncation import emergency_truncate
from shared.core.turns import leading_system_count
from shared.guard import ContextGuard
from shared.integrations.agents_items import items_to_messages, messages_to_items

if TYPE_CHECKING:
    from shared.integrations.agents_sdk import GuardedSession

HEADROOM = 0.95  # truncation fills at most this share of the input budget

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


class InputBudget:
    """The guard's budget applied to the input the runner is about to send.

    Use as ``RunConfig(call_model_input_filter=budget)``. Within budget the
    input goes out untouched; over it, the oldest turns are dropped (then
    units, then long contents clipped) without an LLM, leading system
    messages (the session's summary) kept, tool pairs repaired. Counts are
    corrected by the ratio of reported to estimated input tokens, learned
    from each response's usage when the model is wrapped in
    :class:`GuardedModel` (``session.wrap(model)``).
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

    def calibrate(self, usage: Any) -> None:
        """Fold in a response's usage (``input_tokens``) for the input last let through."""
        reported = getattr(usage, "input_tokens", None)
        if isinstance(reported, int) and not isinstance(reported, bool) and self.sent:
            self.calibration = self.calibration.update(reported, self.sent)

    def ratio(self) -> float:
        """The learned ratio, or the model's prior until a response reported usage."""
        if self.calibration.samples:
            return self.calibration.ratio
        return prior_ratio(self.model, self.guard.counter)

    def fit(self, items: Sequence[Any], instructions: str | None, tools: Sequence[Any], *,
            force_ratio: float | None = None) -> Fitted:
        """Fit ``items`` into the budget (or into ``force_ratio`` of the window), counting
        with the heuristic corrected by what responses reported (:meth:`calibrate`)."""
        counter = self.guard.counter
        messages = items_to_messages(items, prefix="input")
        head = leading_system_count(messages)
        # the request's own tokens besides its messages: instructions, tools, framing
        outside = (counter.message(Message(role="system", content=instructions))
                   if instructions else 0) + counter.messages([])
        schemas = tool_schemas(tools)
        tool_tokens = counter.tools(schemas) if schemas else 0
        lead = sum(counter.message(m) for m in messages[:head])
        history = sum(counter.message(m) for m in messages[head:])
        limits = self.guard.model_limits(self.model)
        reserve = output_reserve(limits, self.max_tokens)
        newest = counter.message(messages[-1]) if messages and messages[-1].role == "user" else 0
        ratio = self.ratio()

        def calibrated(tokens: int) -> int:
            return math.ceil(tokens * ratio - 1e-9)
        report = check_budget(window=limits.context_window, reserve=reserve,
                              system=calibrated(outside + lead), tools=calibrated(tool_tokens),
                              history=calibrated(history), newest=calibrated(newest),
                              trigger_ratio=self.guard.policy.trigger_ratio,
                              target_ratio=self.guard.policy.target_ratio)
        if report.within_budget and force_ratio is None:
            self.sent = outside + tool_tokens + lead + history
            return Fitted(list(items), report, False, 0, "")
        room = int(report.input_budget * HEADROOM)
        if force_ratio is not None:
            room = min(room, int(limits.context_window * force_ratio))
        # heuristic units for the messages (the leading system ones are kept whole)
        budget = max(1, int(room / ratio) - outside - tool_tokens)
        result = emergency_truncate(messages, budget, counter,
                                    drop_fraction=self.guard.policy.emergency_drop_fraction)
        kept = repair_tool_pairs(result.messages)
        if result.note and result.dropped:
            at = leading_system_count(kept)
            kept.insert(at, Message(role="system", content=result.note))
        self.truncations += 1
        self.sent = outside + tool_tokens + sum(counter.message(m) for m in kept)
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
    uses it from then on; when the error states none, the input the filter let
    through bounds it: :func:`~shared.core.limits.refused_bound`), the input
    is compacted to the policy's recovery ratio of the window and the call is
    retried once; a second failure, or any other error, reaches the caller
    unchanged (an error nothing recognises is taken for an overflow when the refused
    input was nearly as large as the window: ``CompactionPolicy.unrecognised_overflow_at``).
    """

    def __init__(self, inner: Model, budget: InputBudget, *,
                 session: GuardedSession | None = None) -> None:
        self.inner, self.budget, self.session = inner, budget, session
        self.recoveries = 0

    def _recover(self, error: Exception, system_instructions: str | None,
                 input: str | list[TResponseInputItem], tools: Sequence[Any]) -> list[Any]:
        guard = self.budget.guard
        limits = guard.model_limits(self.budget.model)
        window = limits.context_window
        ratio = guard.policy.recovery_ratio
        if not is_context_overflow(error):
            # an error nothing recognises, refusing input nearly as large as the window: an
            # overflow in a wording no pattern knows (the guard's rule, ContextGuard.recover)
            near = guard.policy.unrecognised_overflow_at
            sent = math.ceil(self.budget.sent * self.budget.ratio()) \
                + output_reserve(limits, self.budget.max_tokens)
            if near is None or not self.budget.sent or not unrecognised(error) \
                    or sent < near * window:
                raise error
            ratio = guard.policy.target_ratio
        info = parse_overflow(error)
        limit = stated_limit(info.limit, window) if info is not None else None
        if limit is None and info is not None and info.kind == "context_overflow" \
                and info.limit != window and self.budget.sent:
            # the input this filter let through bounds the window (unless the error states the
            # window it knew: then the count was short, not the window wrong)
            limit = refused_bound(math.ceil(self.budget.sent * self.budget.ratio()), window,
                                  info.excess)
        if limit:
            guard.limits.learn(self.budget.model, limit)
            if self.session is not None:
                guard.store.update_state(self.session.session_id, learned_window=limit,
                                         model=self.budget.model)
        items = [{"role": "user", "content": input}] if isinstance(input, str) else input
        self.recoveries += 1
        return self.budget.fit(items, system_instructions, tools, force_ratio=ratio).items

    async def get_response(self, system_instructions: str | None,
                           input: str | list[TResponseInputItem], *args: Any,
                           **kwargs: Any) -> ModelResponse:
        try:
            response = await self.inner.get_response(system_instructions, input, *args,
                                                     **kwargs)
        except Exception as exc:
            tools = _tools_arg(args, kwargs)
            retry = self._recover(exc, system_instructions, input, tools)
            response = await self.inner.get_response(
                system_instructions, cast(list[TResponseInputItem], retry), *args, **kwargs)
        self.budget.calibrate(response.usage)
        return response

    async def stream_response(self, system_instructions: str | None,
                              input: str | list[TResponseInputItem], *args: Any,
                              **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        started = False
        try:
            async for event in self.inner.stream_response(system_instructions, input,
                                                          *args, **kwargs):
                started = True
                self._usage_of(event)
                yield event
            return
        except Exception as exc:
            if started:  # events already reached the caller: no silent retry
                raise
            tools = _tools_arg(args, kwargs)
            retry = self._recover(exc, system_instructions, input, tools)
        async for event in self.inner.stream_response(
                system_instructions, cast(list[TResponseInputItem], retry), *args, **kwargs):
            self._usage_of(event)
            yield event

    def _usage_of(self, event: Any) -> None:
        """The usage a stream reports in its ``response.completed`` event."""
        if getattr(event, "type", None) == "response.completed":
            self.budget.calibrate(getattr(getattr(event, "response", None), "usage", None))

    def get_retry_advice(self, request: Any) -> Any:
        return self.inner.get_retry_advice(request)

    async def close(self) -> None:
        await self.inner.close()
