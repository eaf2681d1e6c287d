"""Redis outages under the LangChain middleware and the pydantic-ai capability.

A redis-server of the test's own is killed (connection refused at once) and
started again empty, as a restart without persistence leaves it. The agents
are real ``create_agent`` graphs and pydantic-ai ``Agent`` runs over the
examples' windowed test models; the guard is the real one, with the client
``shared.connect`` builds. Two cases, for each adapter:

- Redis dies while the model is answering: the answer (a billed call) is
  returned, the failed recording is logged, and the next call, Redis back,
  records what was missed;
- Redis is down between turns: the call goes out on the guard's degraded
  view of the framework's own history (``prepare(fallback_messages=...)``)
  instead of failing, and recording resumes when Redis is back.

The Agents SDK session's outages: tests/test_integration_agents_sdk_outage.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import pytest

pytest.importorskip("langchain.agents")
pytest.importorskip("pydantic_ai")

from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from pydantic_ai import messages as pm
from pydantic_ai.models.function import AgentInfo, FunctionModel

from examples.langchain_agent import WindowedChatModel
from examples.pydantic_ai_agent import WindowedModel, build_agent
from shared.core.config import StoreConfig
from shared.core.errors import StoreUnavailable
from shared.guard import AsyncContextGuard, ContextGuard
from shared.integrations.langchain import ContextGuardMiddleware
from shared.store.aio import AsyncSessionStore, connect_async
from tests.outage_support import guard_on as guard_with_prefix
from workers.harness.stack.redis_server import RedisServer

PREFIX = "outage"



def guard_on(server: RedisServer) -> ContextGuard:
    return guard_with_prefix(server, PREFIX)


def log_of(server: RedisServer, session: str) -> list[Any]:
    return guard_on(server).store.messages(session, 0, 1000)


def answer(text: str, then: Any = None) -> Any:
    """A LangChain reply policy: a plain answer (``then`` runs first, inside the call)."""
    def reply(messages: Sequence[BaseMessage]) -> AIMessage:
        if then is not None:
            then()
        return AIMessage(content=f"{text} ({len(messages)} messages seen)")
    return reply


def lc_agent(guard: Any, model: WindowedChatModel) -> Any:
    return create_agent(model, [], system_prompt="You answer briefly.",
                        middleware=[ContextGuardMiddleware(guard, max_tokens=256)],
                        checkpointer=InMemorySaver())


CFG = {"configurable": {"thread_id": "lc-outage"}}


@pytest.mark.redis
def test_langchain_answer_is_kept_when_redis_dies_during_the_model_call(
        own_redis: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    model = WindowedChatModel(window=100_000, requests=[], counts=[],
                              reply=answer("first"))
    agent = lc_agent(guard_on(own_redis), model)
    agent.invoke({"messages": [HumanMessage("one")]}, CFG)
    model.reply = answer("second", then=own_redis.stop)  # Redis dies while the model answers
    with caplog.at_level(logging.WARNING, "shared.integrations"):
        out = agent.invoke({"messages": [HumanMessage("two")]}, CFG)
    assert out["messages"][-1].content.startswith("second")  # returned, in the state
    assert [m.type for m in out["messages"]] == ["human", "ai", "human", "ai"]
    assert "were not recorded" in caplog.text
    own_redis.start()  # back, empty (no persistence)
    model.reply = answer("third")
    out = agent.invoke({"messages": [HumanMessage("three")]}, CFG)
    assert [m.text() for m in log_of(own_redis, "lc-outage")] == [
        m.text for m in out["messages"]]  # everything the outage missed is recorded now


@pytest.mark.redis
def test_langchain_runs_on_the_degraded_view_while_redis_is_down(
        own_redis: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    model = WindowedChatModel(window=100_000, requests=[], counts=[], reply=answer("ok"))
    agent = lc_agent(guard_on(own_redis), model)
    agent.invoke({"messages": [HumanMessage("one")]}, CFG)
    own_redis.stop()
    with caplog.at_level(logging.WARNING, "shared.integrations"):
        out = agent.invoke({"messages": [HumanMessage("two")]}, CFG)
    assert out["messages"][-1].content.startswith("ok")
    # the model got the whole history from the graph state (nothing truncated: it fits)
    assert [m.text for m in model.requests[-1] if m.type != "system"] == [
        "one", out["messages"][1].text, "two"]
    own_redis.start()
    out = agent.invoke({"messages": [HumanMessage("three")]}, CFG)
    assert [m.text() for m in log_of(own_redis, "lc-outage")] == [
        m.text for m in out["messages"]]


@pytest.mark.redis
def test_langchain_async_runs_on_the_degraded_view_while_redis_is_down(
        own_redis: RedisServer) -> None:
    model = WindowedChatModel(window=100_000, requests=[], counts=[], reply=answer("ok"))

    async def main() -> list[BaseMessage]:
        guard = AsyncContextGuard(AsyncSessionStore(connect_async(own_redis.url),
                                                    StoreConfig(key_prefix=PREFIX)),
                                  watch_changes=False)
        agent = lc_agent(guard, model)
        await agent.ainvoke({"messages": [HumanMessage("one")]}, CFG)
        own_redis.stop()
        await agent.ainvoke({"messages": [HumanMessage("two")]}, CFG)
        assert len(model.requests[-1]) >= 3
        own_redis.start()
        out = await agent.ainvoke({"messages": [HumanMessage("three")]}, CFG)
        await guard.aclose()
        return list(out["messages"])

    messages = asyncio.run(main())
    assert [m.text() for m in log_of(own_redis, "lc-outage")] == [m.text for m in messages]


def killing(model: WindowedModel, server: RedisServer) -> FunctionModel:
    """``model``, but Redis dies while it answers a question (not a tool result)."""
    def call(messages: list[pm.ModelMessage], info: AgentInfo) -> pm.ModelResponse:
        if not isinstance(messages[-1].parts[-1], pm.ToolReturnPart):
            server.stop()
        return model(messages, info)
    return FunctionModel(call, model_name="windowed-fake")


@pytest.mark.redis
def test_pydantic_ai_answer_is_kept_when_redis_dies_during_the_model_call(
        own_redis: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    model = WindowedModel(window=100_000)
    agent = build_agent(guard_on(own_redis), model, session_id="pai-outage")
    history = agent.run_sync("one").all_messages()
    with caplog.at_level(logging.WARNING, "shared.integrations"):
        result = agent.run_sync("two", message_history=history,
                                model=killing(model, own_redis))
    assert result.output.startswith("Found:")  # the run finished, answer returned
    assert "were not recorded" in caplog.text
    own_redis.start()
    history = agent.run_sync("three", message_history=result.all_messages()).all_messages()
    logged = log_of(own_redis, "pai-outage")
    assert [m.role for m in logged].count("user") == 3  # every turn is in the log again
    assert logged[-1].text() == history[-1].parts[0].content


@pytest.mark.redis
def test_pydantic_ai_runs_on_the_degraded_view_while_redis_is_down(
        own_redis: RedisServer) -> None:
    model = WindowedModel(window=100_000)
    agent = build_agent(guard_on(own_redis), model, session_id="pai-outage")
    history = agent.run_sync("one").all_messages()
    own_redis.stop()
    result = agent.run_sync("two", message_history=history)
    assert result.output.startswith("Found:")
    sent = model.requests[-2]  # the question's request: the whole history went out
    assert [p.content for m in sent for p in m.parts if isinstance(p, pm.UserPromptPart)] \
        == ["one", "two"]
    own_redis.start()
    history = agent.run_sync("three", message_history=result.all_messages()).all_messages()
    logged = log_of(own_redis, "pai-outage")
    assert [m.role for m in logged].count("user") == 3
    assert logged[-1].text() == history[-1].parts[0].content


def failing_once(guard: ContextGuard) -> None:
    """The adapter's read of the log fails once (a dropped connection, a socket timeout on
    that one read), and Redis answers again at once."""
    real, armed = guard.load, [True]

    def load(session_id: str, *args: Any, **kwargs: Any) -> Any:
        if armed:
            armed.clear()
            raise StoreUnavailable("redis unavailable during view/read: Timeout reading")
        return real(session_id, *args, **kwargs)
    guard.load = load  # type: ignore[method-assign]


@pytest.mark.redis
def test_a_flapping_redis_never_sends_the_history_twice(own_redis: RedisServer) -> None:
    """QA: with the log's cursor unread, the whole framework history went to prepare as
    this call's messages, and a prepare that reached Redis added the log to them: every
    earlier message twice in one request. The call now goes out on the degraded view."""
    model = WindowedChatModel(window=100_000, requests=[], counts=[], reply=answer("ok"))
    guard = guard_on(own_redis)
    middleware = ContextGuardMiddleware(guard, max_tokens=256)
    agent = create_agent(model, [], system_prompt="You answer briefly.",
                         middleware=[middleware], checkpointer=InMemorySaver())
    for text in ("one", "two"):
        agent.invoke({"messages": [HumanMessage(text)]}, CFG)
    middleware.cursors.drop("lc-outage")  # another replica serves the thread, say
    failing_once(guard)
    out = agent.invoke({"messages": [HumanMessage("three")]}, CFG)
    sent = [m.text for m in model.requests[-1] if m.type == "human"]
    assert sent == ["one", "two", "three"]
    agent.invoke({"messages": [HumanMessage("four")]}, CFG)
    assert [m.text() for m in log_of(own_redis, "lc-outage")][:len(out["messages"])] == [
        m.text for m in out["messages"]]

    pai = WindowedModel(window=100_000)
    first = build_agent(guard_on(own_redis), pai, session_id="pai-flap")
    history = first.run_sync("one").all_messages()
    history = first.run_sync("two", message_history=history).all_messages()
    replica = guard_on(own_redis)  # another process: no cursor for the conversation yet
    failing_once(replica)
    build_agent(replica, pai, session_id="pai-flap").run_sync("three", message_history=history)
    asked = [p.content for m in pai.requests[-2] for p in m.parts
             if isinstance(p, pm.UserPromptPart)]
    assert asked == ["one", "two", "three"]
