"""A model call's work follows what changed, not the history's length (real Redis).

Each adapter maps the framework's history to the session log and the guard's view
back. Counted here, per model call, as a session grows: the message fingerprints
(a JSON dump and a hash each) and, for pydantic-ai, the formatted timestamps it
matches history messages by. Every view message used to be fingerprinted again on
every call, so a call's cost grew with the conversation; now only the messages the
call adds are. Counted, not timed: the counts are exact on a busy machine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("pydantic_ai")
pytest.importorskip("langchain")

from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langgraph.checkpoint.memory import InMemorySaver
from pydantic_ai import Agent
from pydantic_ai import messages as pm
from pydantic_ai.models.function import FunctionModel

import shared.integrations._common as common
import shared.integrations.pydantic_ai as pai
from shared.core.config import StoreConfig
from shared.guard import ContextGuard
from shared.integrations.langchain import ContextGuardMiddleware
from shared.integrations.pydantic_ai import ContextGuardCapability
from shared.store.sessions import SessionStore

TURNS = 24
ANSWER = "Your booking BK0042 is confirmed: seat 14C, vegetarian meal."


@pytest.fixture
def guard(real_redis: Any, key_prefix: str) -> ContextGuard:
    store = SessionStore(real_redis, StoreConfig(key_prefix=key_prefix))
    return ContextGuard(store, overrides={"fake": 1_000_000})  # no compaction: view = log


class Counted:
    """Counts the calls of a module function while the test runs (the function still runs)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> None:
        self.calls = 0
        inner: Callable[..., Any] = getattr(module, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return inner(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)


def per_call(turn: Callable[[int], None], counters: list[Counted]) -> list[int]:
    """The counters' total for each of ``TURNS`` model calls."""
    out = []
    for i in range(TURNS):
        before = sum(c.calls for c in counters)
        turn(i)
        out.append(sum(c.calls for c in counters) - before)
    return out


def assert_flat(counts: list[int]) -> None:
    """The late calls (a view ~45 messages long) cost what the early ones (~7) did."""
    early, late = counts[3:6], counts[-3:]
    assert max(late) <= max(early), counts
    assert max(late) <= 12, counts  # the call's own messages (two or three), a few times each


def test_pydantic_ai_call_work_does_not_grow_with_the_history(
        guard: ContextGuard, monkeypatch: pytest.MonkeyPatch) -> None:
    counters = [Counted(monkeypatch, common, "fingerprint"), Counted(monkeypatch, pai, "_stamp")]

    def answer(messages: list[pm.ModelMessage], info: Any) -> pm.ModelResponse:
        return pm.ModelResponse(parts=[pm.TextPart(ANSWER)])

    agent = Agent(FunctionModel(answer, model_name="fake"),
                  capabilities=[ContextGuardCapability(guard, recall=False)])
    history: list[pm.ModelMessage] = []
    sent: list[int] = []

    def turn(i: int) -> None:
        nonlocal history
        result = agent.run_sync(f"question {i}", message_history=history,
                                conversation_id="perf-pai")
        history = result.all_messages()
        sent.append(len(result.all_messages()))

    counts = per_call(turn, counters)
    assert sent[-1] == 2 * TURNS  # the whole history went through, untouched
    assert guard.store.length("perf-pai") == 2 * TURNS
    assert_flat(counts)


class Fake(BaseChatModel):
    """A new answer each call; remembers how many messages each request held."""

    seen: list[int] = []

    @property
    def _llm_type(self) -> str:
        return "fake"

    def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:
        self.seen.append(len(messages))
        return ChatResult(generations=[ChatGeneration(message=AIMessage(ANSWER))])

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


def test_langchain_call_work_does_not_grow_with_the_history(
        guard: ContextGuard, monkeypatch: pytest.MonkeyPatch) -> None:
    counters = [Counted(monkeypatch, common, "fingerprint")]
    model = Fake(seen=[])
    agent = create_agent(model, [], checkpointer=InMemorySaver(), middleware=[
        ContextGuardMiddleware(guard, model="fake", recall=False)])
    config: Any = {"configurable": {"thread_id": "perf-lc"}}

    def turn(i: int) -> None:
        agent.invoke({"messages": [HumanMessage(f"question {i}")]}, config)

    counts = per_call(turn, counters)
    assert model.seen[-1] == 2 * TURNS - 1  # the whole state went to the model
    assert guard.store.length("perf-lc") == 2 * TURNS
    assert_flat(counts)
