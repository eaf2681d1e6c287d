"""The full budget formula, with hysteresis, as one pure check.

``system + summary + tools + history + reserve`` must fit the model's context
window. Estimates that forget a region (usually the system prompt, the tool
schemas or the output reserve) are a classic cause of overflow, so every
region is an explicit argument and the report shows each one.

Regions are disjoint, except ``newest``: it is the newest user message, a
*part of* ``history`` named separately because no compaction may drop it. It
is not added to the total again; it only enters the floor.

Two ratios of the input budget (``window - reserve``) give hysteresis:
compaction triggers at ``trigger_ratio`` (default 0.80) and aims for
``target_ratio`` (default 0.50), so it does not fire again on the next turn
and the view's prefix stays stable for provider prompt caches.

The **floor** is what no compaction can shrink: system prompt, tool
definitions, output reserve and the newest user message. When the floor alone
exceeds the window the overflow is *irreducible*; :func:`ensure_reducible`
raises instead of letting a caller compact in a loop.
"""

from __future__ import annotations

import functools
import math

from pydantic import BaseModel, ConfigDict

from shared.core.constructed import constructed
from shared.core.errors import InvalidInput, IrreducibleOverflow


class BudgetReport(BaseModel):
    """Tokens by region and what they mean for the next request (all counts in tokens)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    window: int
    reserve: int
    system: int
    summary: int
    tools: int
    history: int
    newest: int
    trigger_ratio: float
    target_ratio: float
    input_budget: int
    """``window - reserve``: what the request's input may use."""
    total_input: int
    """``system + summary + tools + history``."""
    usage_ratio: float
    """``total_input / input_budget``."""
    should_compact: bool
    """``usage_ratio >= trigger_ratio``."""
    within_budget: bool
    """``total_input <= input_budget``: the request fits as it is."""
    target_tokens: int
    """``floor(target_ratio * input_budget)``: where compaction should bring total_input."""
    floor: int
    """``system + tools + reserve + newest``: what compaction cannot shrink."""
    irreducible: bool
    """``floor > window``: no compaction can make the request fit."""

    @property
    def over_budget_by(self) -> int:
        """Tokens above the input budget (0 when within it)."""
        return max(0, self.total_input - self.input_budget)

    @property
    def to_target(self) -> int:
        """Tokens compaction must free to reach ``target_tokens`` (0 when already there)."""
        return max(0, self.total_input - self.target_tokens)

    def regions(self) -> dict[str, int]:
        """Tokens by region, in request order, for logs and reports."""
        return {"system": self.system, "summary": self.summary, "tools": self.tools,
                "history": self.history, "reserve": self.reserve}


_COUNTS = ("window", "reserve", "system", "summary", "tools", "history", "newest")


def _count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"expected a whole number of tokens, got {value!r}", field=name)
    if value < 0:
        raise InvalidInput(f"must be >= 0, got {value}", field=name)
    return value


def _ratio(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(f"expected a number, got {value!r}", field=name)
    ratio = float(value)
    if not (math.isfinite(ratio) and 0.0 < ratio <= 1.0):
        raise InvalidInput(f"must be in (0, 1], got {value!r}", field=name)
    return ratio


_INT = {int}


@functools.lru_cache(maxsize=64)
def _ratios(trigger_ratio: object, target_ratio: object) -> tuple[float, float]:
    """The trigger and target ratios, checked (cached for floats: a policy's pair is
    checked once, not on every prepare)."""
    trigger = _ratio("trigger_ratio", trigger_ratio)
    target = _ratio("target_ratio", target_ratio)
    if target >= trigger:
        raise InvalidInput(f"{target} must be below trigger_ratio {trigger}", field="target_ratio")
    return trigger, target


def check_budget(
    *,
    window: int,
    reserve: int,
    system: int = 0,
    summary: int = 0,
    tools: int = 0,
    history: int = 0,
    newest: int = 0,
    trigger_ratio: float = 0.80,
    target_ratio: float = 0.50,
) -> BudgetReport:
    """Compare the request's regions with the window; see the module docstring.

    Raises InvalidInput naming the argument for negative or non-integer
    counts, a window of 0, a reserve that leaves no input budget, ratios
    outside (0, 1] and a target not below the trigger.
    """
    counts = (window, reserve, system, summary, tools, history, newest)
    if set(map(type, counts)) != _INT or min(counts) < 0:  # name the bad one
        for name, value in zip(_COUNTS, counts, strict=True):
            _count(name, value)
    if window == 0:
        raise InvalidInput("must be > 0", field="window")
    if reserve >= window:
        raise InvalidInput(f"{reserve} leaves no input budget in a window of {window}",
                           field="reserve")
    if type(trigger_ratio) is float and type(target_ratio) is float:
        trigger, target = _ratios(trigger_ratio, target_ratio)
    else:
        trigger, target = _ratios.__wrapped__(trigger_ratio, target_ratio)

    input_budget = window - reserve
    total = system + summary + tools + history
    usage = total / input_budget
    floor = system + tools + reserve + newest
    return constructed(BudgetReport, {  # every figure checked above
        "window": window, "reserve": reserve, "system": system, "summary": summary,
        "tools": tools, "history": history, "newest": newest, "trigger_ratio": trigger,
        "target_ratio": target, "input_budget": input_budget, "total_input": total,
        "usage_ratio": usage, "should_compact": usage >= trigger,
        "within_budget": total <= input_budget,
        "target_tokens": math.floor(target * input_budget), "floor": floor,
        "irreducible": floor > window})


def ensure_reducible(report: BudgetReport) -> BudgetReport:
    """Return ``report``, or raise IrreducibleOverflow when its floor exceeds the window.

    This is what stops compaction loops: when the fixed part alone does not
    fit, summarizing history again cannot help, and the message says which
    region to shrink.
    """
    if not report.irreducible:
        return report
    parts = [("system prompt", report.system), ("tool definitions", report.tools),
             ("newest user message", report.newest), ("output reserve", report.reserve)]
    biggest = max(parts, key=lambda p: p[1])[0]
    detail = " + ".join(f"{name} {tokens}" for name, tokens in parts)
    raise IrreducibleOverflow(
        f"the fixed part of the request does not fit the context window: {detail} = "
        f"{report.floor} tokens > window {report.window} (over by "
        f"{report.floor - report.window}); no compaction can help, shrink the {biggest} "
        "(or use a model with a larger window)",
        fixed_tokens=report.floor, window=report.window,
    )


__all__ = ["BudgetReport", "check_budget", "ensure_reducible"]
