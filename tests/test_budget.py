"""The budget formula, hysteresis ratios, the floor and irreducible overflow."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from shared.core.budget import BudgetReport, check_budget, ensure_reducible
from shared.core.errors import InvalidInput, IrreducibleOverflow
from tests.strategies import CharCounter, peer_cases, peer_messages


def test_every_region_counts_once_against_the_input_budget() -> None:
    report = check_budget(window=10_000, reserve=2_000, system=1_000, summary=500, tools=700,
                          history=3_000, newest=200)
    assert report.input_budget == 8_000
    assert report.total_input == 1_000 + 500 + 700 + 3_000  # newest is part of history
    assert report.usage_ratio == pytest.approx(5_200 / 8_000)
    assert report.target_tokens == 4_000
    assert report.floor == 1_000 + 700 + 2_000 + 200
    assert not report.should_compact and report.within_budget and not report.irreducible
    assert report.over_budget_by == 0 and report.to_target == 1_200
    assert report.regions() == {"system": 1_000, "summary": 500, "tools": 700,
                                "history": 3_000, "reserve": 2_000}


def test_trigger_fires_at_exactly_the_ratio() -> None:
    at = check_budget(window=1_100, reserve=100, history=800)
    below = check_budget(window=1_100, reserve=100, history=799)
    assert at.usage_ratio == 0.8 and at.should_compact
    assert not below.should_compact


def test_within_budget_up_to_and_including_the_input_budget() -> None:
    assert check_budget(window=1_000, reserve=100, history=900).within_budget
    over = check_budget(window=1_000, reserve=100, history=901)
    assert not over.within_budget and over.over_budget_by == 1 and over.usage_ratio > 1


def test_custom_ratios_and_target_rounding_down() -> None:
    report = check_budget(window=1_001, reserve=0, history=10, trigger_ratio=0.9,
                          target_ratio=0.333)
    assert report.target_tokens == 333 and report.trigger_ratio == 0.9


def test_irreducible_when_the_floor_alone_exceeds_the_window() -> None:
    fits = check_budget(window=1_000, reserve=200, system=300, tools=300, newest=200,
                        history=200)
    assert fits.floor == 1_000 and not fits.irreducible
    assert ensure_reducible(fits) is fits
    over = check_budget(window=1_000, reserve=200, system=300, tools=300, newest=201,
                        history=201)
    assert over.irreducible and not over.within_budget
    with pytest.raises(IrreducibleOverflow) as info:
        ensure_reducible(over)
    text = str(info.value)
    for piece in ("system prompt 300", "tool definitions 300", "newest user message 201",
                  "output reserve 200", "= 1001 tokens > window 1000", "over by 1",
                  "no compaction can help"):
        assert piece in text
    assert info.value.fixed_tokens == 1_001 and info.value.window == 1_000


def test_the_message_names_the_biggest_region_to_shrink() -> None:
    report = check_budget(window=1_000, reserve=10, tools=5_000, history=0)
    with pytest.raises(IrreducibleOverflow, match="shrink the tool definitions"):
        ensure_reducible(report)


def test_the_report_is_frozen() -> None:
    report = check_budget(window=100, reserve=10)
    with pytest.raises(ValidationError):
        report.history = 5  # type: ignore[misc]
    assert isinstance(report, BudgetReport)


@pytest.mark.parametrize(("overrides", "field"), [
    ({"window": 0}, "window"),
    ({"window": -5}, "window"),
    ({"reserve": -1}, "reserve"),
    ({"reserve": 1_000}, "reserve"),
    ({"system": -1}, "system"),
    ({"summary": 1.5}, "summary"),
    ({"tools": True}, "tools"),
    ({"history": "12"}, "history"),
    ({"newest": -3}, "newest"),
    ({"trigger_ratio": 0.0}, "trigger_ratio"),
    ({"trigger_ratio": 1.2}, "trigger_ratio"),
    ({"trigger_ratio": float("nan")}, "trigger_ratio"),
    ({"target_ratio": -0.1}, "target_ratio"),
    ({"target_ratio": 0.8}, "target_ratio"),
    ({"target_ratio": 0.9, "trigger_ratio": 0.85}, "target_ratio"),
    ({"target_ratio": "half"}, "target_ratio"),
])
def test_bad_arguments_raise_invalid_input_naming_them(overrides: dict[str, Any],
                                                        field: str) -> None:
    arguments: dict[str, Any] = {"window": 1_000, "reserve": 100, **overrides}
    with pytest.raises(InvalidInput) as info:
        check_budget(**arguments)
    assert info.value.field == field


def test_a_trigger_of_one_is_allowed() -> None:
    report = check_budget(window=100, reserve=0, history=99, trigger_ratio=1.0)
    assert not report.should_compact and report.usage_ratio == 0.99


counts = st.integers(0, 300_000)


@settings(max_examples=500)
@given(st.integers(1, 2_000_000), st.data())
def test_report_is_consistent(window: int, data: st.DataObject) -> None:
    reserve = data.draw(st.integers(0, window - 1))
    history = data.draw(counts)
    target = data.draw(st.floats(0.01, 0.98))
    trigger = data.draw(st.floats(target + 0.01, 1.0))
    regions = {"system": data.draw(counts), "summary": data.draw(counts),
               "tools": data.draw(counts), "history": history,
               "newest": data.draw(st.integers(0, history))}
    report = check_budget(window=window, reserve=reserve, trigger_ratio=trigger,
                          target_ratio=target, **regions)
    total = regions["system"] + regions["summary"] + regions["tools"] + history
    assert report.total_input == total and report.input_budget == window - reserve
    assert report.within_budget == (total + reserve <= window)
    assert report.should_compact == (total / (window - reserve) >= trigger)
    assert report.target_tokens <= report.input_budget
    assert report.irreducible == (report.floor > window)
    if report.irreducible:  # the floor is inside the total: nothing can fit then
        assert not report.within_budget
        with pytest.raises(IrreducibleOverflow):
            ensure_reducible(report)
    else:
        ensure_reducible(report)
    if report.within_budget:
        assert report.over_budget_by == 0


def test_peer_budget_cases_meet_our_invariants(data_dir: Path) -> None:
    """Picoclaw's budget inputs through our formula; a reserve that eats the window is an
    input error here (they answer "over budget")."""
    counter = CharCounter()
    cases = peer_cases(data_dir, "is_over_context_budget")
    assert len(cases) == 8
    for case in cases:
        raw = case["input"]
        messages = peer_messages(raw["messages"])
        system = sum(counter.message(m) for m in messages if m.role == "system")
        history = sum(counter.message(m) for m in messages if m.role != "system")
        users = [m for m in messages if m.role == "user"]
        newest = counter.message(users[-1]) if users else 0
        arguments = {"window": raw["context_window"], "reserve": raw["max_tokens"],
                     "system": system, "tools": counter.tools(raw["tool_defs"]),
                     "history": history, "newest": newest}
        if raw["max_tokens"] >= raw["context_window"]:
            with pytest.raises(InvalidInput, match="no input budget"):
                check_budget(**arguments)
            continue
        report = check_budget(**arguments)
        fixed = system + arguments["tools"] + history + raw["max_tokens"]
        assert report.within_budget == (fixed <= raw["context_window"]), case["id"]
