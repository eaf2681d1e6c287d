"""Recall through the pydantic-ai capability: a real ``Agent`` over ``FunctionModel``
whose function calls the ``recall`` tool the capability's toolset provides; the
capability runs it against the guard (the sync guard in a thread, or
``AsyncContextGuard``) on a real Redis, after the real compaction job summarized the
fact away and indexed it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

pytest.importorskip("pydantic_ai")

import redis.asyncio
from pydantic_ai import messages as pm
from pydantic_ai.models.function import AgentInfo

from examples.pydantic_ai_agent import WindowedModel, build_agent
from shared.core.config import StoreConfig
from shared.core.recall_tool import NOTICE
from shared.guard import AsyncContextGuard, ContextGuard
from shared.integrations.pydantic_ai import ContextGuardCapability
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


def _returns(messages: list[pm.ModelMessage]) -> list[pm.ToolReturnPart]:
    return [p for m in messages for p in m.parts
            if isinstance(p, pm.ToolReturnPart) and p.tool_name == "recall"]


@dataclass
class RecallingModel(WindowedModel):
    """The windowed fake, plus: the tools it was offered, and a question that asks for
    recall gets the ``calls`` (one per request) before the answer."""

    calls: list[dict[str, Any]] = field(default_factory=list)
    offered: list[str] = field(default_factory=list)

    def __call__(self, messages: list[pm.ModelMessage], info: AgentInfo) -> pm.ModelResponse:
        self.offered = [t.name for t in info.function_tools]
        asked = [p.content for m in messages for p in m.parts
                 if isinstance(p, pm.UserPromptPart)][-1]
        if asked != ASK:
            return super().__call__(messages, info)
        self.requests.append(list(messages))
        made = len(_returns(messages))
        if made < len(self.calls):
            return pm.ModelResponse(parts=[pm.ToolCallPart(
                "recall", self.calls[made], tool_call_id=f"call_recall_{made}")])
        return pm.ModelResponse(parts=[pm.TextPart("Recalled.")])


@pytest.fixture
def store(real_redis: Any, key_prefix: str) -> SessionStore:
    return SessionStore(real_redis, StoreConfig(key_prefix=key_prefix))


def check_second_request(model: RecallingModel, store: SessionStore, session: str) -> None:
    first, second = model.requests[-2], model.requests[-1]
    assert "recall" in model.offered  # the capability's toolset offered it
    assert FACT not in str(first)  # compacted away...
    assert NOTICE in str(first)  # ...the summary says it can be recalled...
    [result] = _returns(second)
    assert_recalled(result.content, fact_index(store, session))  # ...and recalled verbatim


@pytest.mark.redis
def test_the_model_recalls_a_compacted_fact_sync_guard(store: SessionStore) -> None:
    guard = ContextGuard(store, overrides={MODEL: 40_000})
    model = RecallingModel(window=40_000, calls=[{"query": QUERY}])
    agent = build_agent(guard, model, session_id="pai-recall")
    history: list[pm.ModelMessage] = []
    for i in range(6):
        history = agent.run_sync(opening(i), message_history=history).all_messages()
    assert fact_index(store, "pai-recall") < compact(store, "pai-recall")
    result = agent.run_sync(ASK, message_history=history)
    assert result.output == "Recalled."
    check_second_request(model, store, "pai-recall")


@pytest.mark.redis
def test_the_model_recalls_a_compacted_fact_async_guard(store: SessionStore,
                                                        redis_url: str) -> None:
    model = RecallingModel(window=40_000, calls=[{"query": QUERY, "limit": 2}])

    async def drive() -> str:
        client = redis.asyncio.Redis.from_url(redis_url)
        try:
            guard = AsyncContextGuard(AsyncSessionStore(client, store.config),
                                      overrides={MODEL: 40_000})
            agent = build_agent(guard, model, session_id="pai-arecall")
            history: list[pm.ModelMessage] = []
            for i in range(6):
                history = (await agent.run(opening(i), message_history=history)).all_messages()
            await asyncio.to_thread(compact, store, "pai-arecall")
            return (await agent.run(ASK, message_history=history)).output
        finally:
            await client.aclose()

    assert asyncio.run(drive()) == "Recalled."
    check_second_request(model, store, "pai-arecall")


@pytest.mark.redis
def test_bad_arguments_come_back_as_error_text_and_the_run_goes_on(
        store: SessionStore) -> None:
    guard = ContextGuard(store, overrides={MODEL: 40_000})
    bad = [{"query": ""}, {"query": "x" * 5000}, {"query": CODE, "start": 9, "end": 2},
           {"query": CODE, "limit": 99}, {"query": CODE, "path": "nope"}]
    model = RecallingModel(window=40_000, calls=[*bad, {"query": QUERY}])
    agent = build_agent(guard, model, session_id="pai-bad-recall")
    history: list[pm.ModelMessage] = []
    for i in range(4):
        history = agent.run_sync(opening(i), message_history=history).all_messages()
    compact(store, "pai-bad-recall")
    result = agent.run_sync(ASK, message_history=history)
    assert result.output == "Recalled."
    results = _returns(result.all_messages())
    assert len(results) == len(bad) + 1
    for part, field_name in zip(results, ["query", "query", "end", "limit", "arguments"],
                                strict=False):
        assert str(part.content).startswith(f"recall: invalid arguments: {field_name}: ")
    assert_recalled(results[-1].content, fact_index(store, "pai-bad-recall"))


def test_recall_can_be_left_out(store: SessionStore) -> None:
    guard = ContextGuard(store)
    toolset = ContextGuardCapability(guard).get_toolset()
    assert toolset is not None and list(toolset.tools) == ["recall"]  # type: ignore[attr-defined]
    assert ContextGuardCapability(guard, recall=False).get_toolset() is None
