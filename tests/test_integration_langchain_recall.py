"""Recall through the LangChain v1 middleware: a real ``create_agent`` graph whose fake
chat model calls the ``recall`` tool the middleware declares; the middleware runs the
call against the guard (sync and async) on a real Redis, after the real compaction job
summarized the fact away and indexed it."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

pytest.importorskip("langchain.agents")

import redis.asyncio
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.checkpoint.memory import InMemorySaver

from examples.langchain_agent import SYSTEM, WindowedChatModel, lookup, lookup_then_answer
from shared.core.config import StoreConfig
from shared.core.recall_tool import NOTICE
from shared.guard import AsyncContextGuard, ContextGuard
from shared.integrations.langchain import ContextGuardMiddleware
from shared.store.aio import AsyncSessionStore
from shared.store.sessions import SessionStore
from tests.recall_adapters_support import (
    ASK,
    CODE,
    FACT,
    QUERY,
    assert_recalled,
    compact,
    fact_index,
    opening,
)

MODEL = "windowed-fake"


class RecallingChatModel(WindowedChatModel):
    """The windowed fake, plus: it records the tools it was bound to, and a question that
    asks for recall gets ``recall`` calls (``calls``, one per request) before the answer."""

    bound: list[str] = []
    calls: list[dict[str, Any]] = []

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        self.bound = [convert_to_openai_tool(t)["function"]["name"] for t in tools]
        return self

    def policy(self, messages: Sequence[BaseMessage]) -> AIMessage:
        last = messages[-1]
        asked = [m for m in messages if isinstance(m, HumanMessage)][-1]
        if ASK not in str(asked.content):
            return lookup_then_answer(messages)
        made = sum(1 for m in messages if isinstance(m, ToolMessage) and m.name == "recall")
        if made < len(self.calls):
            return AIMessage("", tool_calls=[{"name": "recall", "args": self.calls[made],
                                              "id": f"call_recall_{made}",
                                              "type": "tool_call"}])
        return AIMessage(f"Recalled: {str(last.content)[:60]}")


def build(guard: Any, calls: list[dict[str, Any]],
          **kwargs: Any) -> tuple[Any, RecallingChatModel]:
    model = RecallingChatModel(window=40_000, requests=[], counts=[], calls=calls)
    model.reply = model.policy
    agent = create_agent(model, [lookup], system_prompt=SYSTEM, checkpointer=InMemorySaver(),
                         middleware=[ContextGuardMiddleware(guard, max_tokens=256, **kwargs)])
    return agent, model


def config(session: str) -> Any:
    return {"configurable": {"thread_id": session}}


@pytest.fixture
def store(real_redis: Any, key_prefix: str) -> SessionStore:
    return SessionStore(real_redis, StoreConfig(key_prefix=key_prefix))


def check_second_request(model: RecallingChatModel, store: SessionStore, session: str,
                         final: Any) -> None:
    first, second = model.requests[-2], model.requests[-1]
    assert "recall" in model.bound  # the model was offered the tool
    assert not any(FACT in str(m.content) for m in first)  # compacted away...
    assert NOTICE in str(first[0].content)  # ...the summary says it can be recalled...
    result = second[-1]
    assert isinstance(result, ToolMessage) and result.name == "recall"
    assert result.status == "success"
    assert_recalled(result.content, fact_index(store, session))  # ...and recalled verbatim
    assert final["messages"][-1].content.startswith("Recalled: [message")


# The session a recall call runs for is the model call's: the thread id, a fixed
# session_id, or what a session_id function returned for the model request.
SESSIONS = {"thread": {}, "string": {"session_id": "lc-recall"},
            "function": {"session_id": lambda request: "lc-recall"}}


@pytest.mark.redis
@pytest.mark.parametrize("how", list(SESSIONS))
def test_the_model_recalls_a_compacted_fact_sync(store: SessionStore, how: str) -> None:
    guard = ContextGuard(store, overrides={MODEL: 40_000})
    agent, model = build(guard, [{"query": QUERY}], **SESSIONS[how])
    thread = "lc-recall" if how == "thread" else "another-thread"
    for i in range(6):
        agent.invoke({"messages": [HumanMessage(opening(i))]}, config(thread))
    assert fact_index(store, "lc-recall") < compact(store, "lc-recall")
    final = agent.invoke({"messages": [HumanMessage(ASK)]}, config(thread))
    check_second_request(model, store, "lc-recall", final)
    # the call and its result are recorded like any tool pair (next call)
    assert any(m.name == "recall" for m in store.messages("lc-recall") if m.role == "tool")


@pytest.mark.redis
def test_the_model_recalls_a_compacted_fact_async(store: SessionStore, redis_url: str,
                                                  key_prefix: str) -> None:
    out: list[tuple[Any, RecallingChatModel]] = []

    async def drive() -> None:
        client = redis.asyncio.Redis.from_url(redis_url)
        try:
            guard = AsyncContextGuard(AsyncSessionStore(client, store.config),
                                      overrides={MODEL: 40_000})
            agent, model = build(guard, [{"query": QUERY, "limit": 3}])
            for i in range(6):
                await agent.ainvoke({"messages": [HumanMessage(opening(i))]},
                                    config("lc-arecall"))
            await asyncio.to_thread(compact, store, "lc-arecall")
            final = await agent.ainvoke({"messages": [HumanMessage(ASK)]},
                                        config("lc-arecall"))
            out.append((final, model))
        finally:
            await client.aclose()

    # Handed out through ``out``, not returned: on Python 3.11 asyncio.run's clean-up
    # formats a repr of its main task, result included (restoring the SIGINT handler),
    # and a result holding the agent's whole state took about 30 s to repr.
    asyncio.run(drive())
    final, model = out[0]
    check_second_request(model, store, "lc-arecall", final)


@pytest.mark.redis
def test_bad_arguments_come_back_as_error_results_and_the_run_goes_on(
        store: SessionStore) -> None:
    guard = ContextGuard(store, overrides={MODEL: 40_000})
    bad = [{"query": ""}, {"query": "x" * 5000}, {"query": CODE, "start": 9, "end": 2},
           {"query": CODE, "limit": 0}, {"query": CODE, "path": "nope"}]
    agent, _model = build(guard, [*bad, {"query": QUERY}])
    for i in range(4):
        agent.invoke({"messages": [HumanMessage(opening(i))]}, config("lc-bad-recall"))
    compact(store, "lc-bad-recall")
    final = agent.invoke({"messages": [HumanMessage(ASK)]}, config("lc-bad-recall"))
    results = [m for m in final["messages"] if isinstance(m, ToolMessage) and m.name == "recall"]
    assert len(results) == len(bad) + 1
    fields = ["query", "query", "end", "limit", "arguments"]
    for result, field in zip(results, fields, strict=False):
        assert result.status == "error"
        assert str(result.content).startswith(f"recall: invalid arguments: {field}: ")
    assert results[-1].status == "success"
    assert_recalled(results[-1].content, fact_index(store, "lc-bad-recall"))


def test_recall_can_be_left_out(real_redis: Any, key_prefix: str) -> None:
    guard = ContextGuard(SessionStore(real_redis, StoreConfig(key_prefix=key_prefix)))
    assert [t.name for t in ContextGuardMiddleware(guard).tools] == ["recall"]
    assert ContextGuardMiddleware(guard, recall=False).tools == []
