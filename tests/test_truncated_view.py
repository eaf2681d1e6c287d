"""A truncated view's wire forms: kept across the turn's calls, equal to the whole
conversion of its messages in every format.

A turn that outgrows the budget truncates on each of its calls; what each call keeps
is mostly what the last one kept, so its conversions are kept with the turn's
truncation input (:func:`shared.core.guard_state._truncated_slots`), not made again.
"""

from __future__ import annotations

from typing import Any

import fakeredis
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.core.config import StoreConfig
from shared.core.errors import InvalidInput, IrreducibleOverflow
from shared.core.messages import Message
from shared.core.wire import to_anthropic, to_gemini, to_openai
from shared.store.sessions import SessionStore
from tests.guard_shells import SHELLS, make
from tests.strategies import conversations
from tests.test_guard import SYSTEM, coding_turn


def whole(convert: Any, messages: list[Message]) -> Any:
    try:
        return convert(messages)
    except InvalidInput as exc:
        return ("raises", str(exc))


def same(view: Any, fmt: str) -> Any:
    try:
        got = getattr(view, fmt)()
        shared = getattr(view, fmt)(shared=True)
    except InvalidInput as exc:
        return ("raises", str(exc))
    assert (shared[0], list(shared[1])) == got
    return got


@pytest.mark.parametrize("shell_name", SHELLS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stored=conversations(min_turns=1, max_turns=4, system=False),
       turn=conversations(min_turns=1, max_turns=1, max_steps=8, system=False),
       window=st.integers(300, 3000))
def test_truncated_views_convert_as_their_messages_do(shell_name: str, stored: list[Message],
                                                      turn: list[Message],
                                                      window: int) -> None:
    store = SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="t"))
    store.append("s", stored)
    guard = make(shell_name, store, overrides={"m": window})
    pending = [m.model_dump(exclude_none=True) for m in turn]
    for end in range(1, len(pending) + 1):
        try:
            view = guard.prepare("s", SYSTEM, model="m", max_tokens=50, pending=pending[:end])
        except IrreducibleOverflow:  # nothing left to drop: the guard's refusal
            continue
        messages = list(view.messages)
        assert view.openai() == to_openai(messages)
        assert list(view.wire("openai")) == to_openai(messages)
        assert same(view, "anthropic") == whole(to_anthropic, messages)
        assert same(view, "gemini") == whole(to_gemini, messages)


@pytest.mark.parametrize("shell_name", SHELLS)
def test_a_tool_chain_that_truncates_converts_each_kept_message_once(shell_name: str) -> None:
    """Call after call of a chain over the budget: the messages a view keeps from the last
    one bring their wire forms along (the same objects), for OpenAI and Anthropic alike."""
    store = SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="t"))
    for step in range(6):
        store.append("s", coding_turn(step, 400))
    guard = make(shell_name, store, overrides={"m": 3000})
    chain = [Message(role="user", content="Fix it, step by step.")]
    for step in range(12):
        chain += coding_turn(100 + step, 1200)[1:4]  # calls and their results, one turn
    forms: dict[str, dict[int, Any]] = {"openai": {}, "anthropic": {}}
    reused = {"openai": 0, "anthropic": 0}
    truncated = 0
    for end in range(4, len(chain) + 1, 3):
        view = guard.prepare("s", SYSTEM, model="m", max_tokens=50, pending=chain[:end])
        if not view.report.truncated:  # the last view's forms count for a truncated one
            forms = {"openai": {}, "anthropic": {}}
            continue
        truncated += 1
        messages = list(view.messages)
        wire = list(view.wire("openai"))
        assert wire == to_openai(messages)
        _, folded = view.anthropic(shared=True)
        assert (view.anthropic()[0], list(folded)) == to_anthropic(messages)
        for fmt, out in (("openai", wire), ("anthropic", list(folded))):
            before = forms[fmt]
            reused[fmt] += sum(1 for w in out if before.get(id(w)) is w)
            forms[fmt] = {id(w): w for w in out}
    assert truncated >= 5, "the chain outgrows the window"
    assert reused["openai"] >= 60 and reused["anthropic"] >= 25
