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


def test_agents_sdk_call_work_does_not_grow_with_the_history(
        guard: ContextGuard, monkeypatch: pytest.MonkeyPatch) -> None:
    """The budget filter maps and counts the whole input before each model call, and the
    session counts the view again to check a response's usage: items mapped to messages
    and messages counted, per call, stay flat (the input and the view grow)."""
    pytest.importorskip("agents")
    import asyncio

    from agents import Agent as SdkAgent
    from agents import Runner, set_tracing_disabled
    from agents.items import ModelResponse
    from agents.models.interface import Model
    from agents.usage import Usage
    from openai.types.responses import ResponseOutputMessage, ResponseOutputText

    import shared.integrations.agents_items as items
    from shared.integrations.agents_sdk import GuardedSession

    set_tracing_disabled(True)
    counters = [Counted(monkeypatch, items._Builder, "add"),
                Counted(monkeypatch, guard.counter, "message")]

    class Fake(Model):
        inputs: list[int] = []

        async def get_response(self, system_instructions: Any, input: Any, *args: Any,
                               **kwargs: Any) -> ModelResponse:
            self.inputs.append(len(input))
            text = ResponseOutputText(type="output_text", text=ANSWER, annotations=[])
            message = ResponseOutputMessage(id="msg_1", type="message", role="assistant",
                                            status="completed", content=[text])
            sent = 20 * len(input)
            return ModelResponse(output=[message], response_id=None, usage=Usage(
                requests=1, input_tokens=sent, output_tokens=20, total_tokens=sent + 20))

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

    model = Fake()
    session = GuardedSession(guard, "perf-sdk", model="fake", instructions="Answer.")
    agent = SdkAgent(name="perf", instructions="Answer.", model=session.wrap(model))

    async def converse() -> list[int]:
        out = []
        for i in range(TURNS):
            before = sum(c.calls for c in counters)
            await Runner.run(agent, f"question {i}", session=session,
                             run_config=session.run_config())
            out.append(sum(c.calls for c in counters) - before)
        return out

    counts = asyncio.run(converse())
    assert model.inputs[-1] == 2 * TURNS - 1  # the whole history went to the model
    assert guard.store.length("perf-sdk") == 2 * TURNS
    assert_flat(counts)


def test_agents_sdk_budget_maps_a_grown_input_as_a_fresh_mapping_would(
        guard: ContextGuard) -> None:
    """The filter reuses the last input's messages up to a cut: an assistant turn still
    open at the end (function calls follow in the next input), reasoning waiting for its
    turn, an edited earlier item, a shorter input: each maps as the whole input would."""
    pytest.importorskip("agents")
    from shared.integrations.agents_items import items_to_messages
    from shared.integrations.agents_run import InputBudget

    def user(text: str) -> dict[str, Any]:
        return {"role": "user", "content": text}

    def said(text: str, n: int) -> dict[str, Any]:
        return {"type": "message", "role": "assistant", "id": f"msg_{n}", "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}]}

    def call(n: int) -> dict[str, Any]:
        return {"type": "function_call", "call_id": f"c{n}", "name": "lookup",
                "arguments": '{"booking": "BK0042"}', "id": f"fc_{n}"}

    def output(n: int) -> dict[str, Any]:
        return {"type": "function_call_output", "call_id": f"c{n}", "output": f"result {n}"}

    thinking = {"type": "reasoning", "id": "rs_1", "summary": [
        {"type": "summary_text", "text": "Look the booking up."}]}
    budget = InputBudget(guard, model="fake")
    inputs = [
        [user("a"), said("b", 1)],
        [user("a"), said("b", 1), call(1)],  # the open turn gains a call
        [user("a"), said("b", 1), call(1), output(1), thinking],
        [user("a"), said("b", 1), call(1), output(1), thinking, said("c", 2), user("d")],
        [user("A"), said("b", 1), call(1), output(1), thinking, said("c", 2), user("d")],
        [user("A"), said("b", 1)],  # shorter: a new run from a compacted view
        [user("A"), said("b", 1), call(2), output(2), user("e")],
    ]
    for items in inputs:
        copies = [dict(item) for item in items]  # the runner sends new, equal objects
        assert budget._messages(copies) == items_to_messages(copies, prefix="input"), items


def test_the_per_message_memo_goes_with_its_messages() -> None:
    """What the adapters remember per view message (its origin, its matched timestamp) is
    held weakly: it never keeps a message alive and empties as the messages go."""
    import gc

    from shared.core.messages import Message
    from shared.integrations._common import ByIdentity, tag

    memo: ByIdentity[int] = ByIdentity()
    messages = [tag(Message(role="user", content=f"m{i}"), i) for i in range(500)]
    for i, message in enumerate(messages):
        memo.put(message, i)
    assert len(memo) == 500
    assert [memo.lookup(m, None) for m in messages[:3]] == [0, 1, 2]
    assert memo.lookup(Message(role="user", content="m0"), None) is None  # equal, not it
    kept = messages[-1]
    del messages, message
    gc.collect()
    assert len(memo) == 1 and memo.lookup(kept, None) == 499
    changed = kept.model_copy(update={"content": "edited"})  # compaction made a new message
    assert common.origin(kept) == (499, -1) and common.origin(changed) is None
