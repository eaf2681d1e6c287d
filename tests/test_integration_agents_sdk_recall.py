"""Recall through the OpenAI Agents SDK: a real ``Runner`` over a fake ``Model`` that
calls the ``recall`` FunctionTool bound to the session; the runner runs the tool, which
queries the guard (sync in a thread, or ``AsyncContextGuard``) on a real Redis, after
the real compaction job summarized the fact away and indexed it."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

pytest.importorskip("agents")

import redis.asyncio
from agents import Agent, Runner, set_tracing_disabled
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from shared.core.config import StoreConfig
from shared.core.recall_tool import NOTICE, recall_tool
from shared.guard import AsyncContextGuard, ContextGuard
from shared.integrations.agents_sdk import GuardedSession, recall_function_tool
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

set_tracing_disabled(True)
MODEL = "fake-recall"


def _outputs(items: list[Any]) -> list[dict[str, Any]]:
    calls = {i.get("call_id") for i in items
             if isinstance(i, dict) and i.get("type") == "function_call"
             and i.get("name") == "recall"}
    return [i for i in items if isinstance(i, dict) and i.get("type") == "function_call_output"
            and i.get("call_id") in calls]


class RecallingModel(Model):
    """Answers plain turns; a question that asks for recall gets the ``calls`` (one per
    request) before the answer. Keeps each request's input and the tools it offered."""

    def __init__(self, calls: list[dict[str, Any]]) -> None:
        self.calls = calls
        self.requests: list[list[Any]] = []
        self.offered: list[str] = []

    async def get_response(self, system_instructions: str | None, input: Any,
                           model_settings: Any, tools: list[Any], *args: Any,
                           **kwargs: Any) -> ModelResponse:
        items = [input] if isinstance(input, str) else list(input)
        self.requests.append(items)
        self.offered = [t.name for t in tools]
        usage = Usage(requests=1, input_tokens=100, output_tokens=10, total_tokens=110)
        users = [i.get("content") for i in items if isinstance(i, dict) and i.get("role") == "user"]
        made = len(_outputs(items))
        if users and users[-1] == ASK and made < len(self.calls):
            call = ResponseFunctionToolCall(
                type="function_call", call_id=f"call_recall_{made}", id=f"fc_{made}",
                name="recall", arguments=json.dumps(self.calls[made]), status="completed")
            return ModelResponse(output=[call], usage=usage, response_id=None)
        text = "Recalled." if users and users[-1] == ASK else "Noted."
        message = ResponseOutputMessage(
            id=f"msg_{len(self.requests)}", type="message", role="assistant",
            status="completed",
            content=[ResponseOutputText(type="output_text", text=text, annotations=[])])
        return ModelResponse(output=[message], usage=usage, response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


@pytest.fixture
def store(real_redis: Any, key_prefix: str) -> SessionStore:
    return SessionStore(real_redis, StoreConfig(key_prefix=key_prefix))


def check_second_request(model: RecallingModel, store: SessionStore, session: str) -> None:
    first, second = model.requests[-2], model.requests[-1]
    assert "recall" in model.offered
    assert FACT not in json.dumps(first)  # compacted away...
    assert NOTICE in json.dumps(first)  # ...the summary says it can be recalled...
    [result] = _outputs(second)
    assert_recalled(result["output"], fact_index(store, session))  # ...and recalled verbatim


def seed(store: SessionStore, session: GuardedSession, agent: Agent[Any]) -> None:
    for i in range(6):
        Runner.run_sync(agent, opening(i), session=session)
    assert fact_index(store, session.session_id) < compact(store, session.session_id)


@pytest.mark.redis
def test_the_model_recalls_a_compacted_fact_sync_guard(store: SessionStore) -> None:
    guard = ContextGuard(store, overrides={MODEL: 40_000})
    session = GuardedSession(guard, "sdk-recall", model=MODEL)
    model = RecallingModel([{"query": QUERY}])
    agent = Agent(name="a", instructions="Answer.", model=model, tools=[session.recall_tool()])
    seed(store, session, agent)
    result = Runner.run_sync(agent, ASK, session=session, run_config=session.run_config())
    assert result.final_output == "Recalled."
    check_second_request(model, store, "sdk-recall")


@pytest.mark.redis
def test_the_model_recalls_a_compacted_fact_async_guard(store: SessionStore,
                                                        redis_url: str) -> None:
    guard = ContextGuard(store, overrides={MODEL: 40_000})
    # the tool is bound below, to the async guard: the session is told it is offered
    session = GuardedSession(guard, "sdk-arecall", model=MODEL, tools=[recall_tool("openai")])
    model = RecallingModel([{"query": QUERY, "start": 0, "end": 12}])
    seed(store, session, Agent(name="a", instructions="Answer.", model=model))

    async def drive() -> Any:
        client = redis.asyncio.Redis.from_url(redis_url)
        try:
            aguard = AsyncContextGuard(AsyncSessionStore(client, store.config))
            agent = Agent(name="a", instructions="Answer.", model=model,
                          tools=[recall_function_tool(aguard, "sdk-arecall")])
            return (await Runner.run(agent, ASK, session=session)).final_output
        finally:
            await client.aclose()

    assert asyncio.run(drive()) == "Recalled."
    check_second_request(model, store, "sdk-arecall")


@pytest.mark.redis
def test_bad_arguments_come_back_as_error_text_and_the_run_goes_on(
        store: SessionStore) -> None:
    guard = ContextGuard(store, overrides={MODEL: 40_000})
    session = GuardedSession(guard, "sdk-bad-recall", model=MODEL)
    bad = [{"query": ""}, {"query": "x" * 5000}, {"query": CODE, "start": 9, "end": 2},
           {"query": CODE, "limit": "five"}, {"query": CODE, "path": "nope"}]
    model = RecallingModel([*bad, {"query": QUERY}])
    agent = Agent(name="a", instructions="Answer.", model=model, tools=[session.recall_tool()])
    seed(store, session, agent)
    result = Runner.run_sync(agent, ASK, session=session, max_turns=20)
    assert result.final_output == "Recalled."
    outputs = _outputs(model.requests[-1])
    assert len(outputs) == len(bad) + 1
    for item, field in zip(outputs, ["query", "query", "end", "limit", "arguments"],
                           strict=False):
        assert str(item["output"]).startswith(f"recall: invalid arguments: {field}: ")
    assert_recalled(outputs[-1]["output"], fact_index(store, "sdk-bad-recall"))


def test_the_tool_is_bound_to_a_valid_session(store: SessionStore) -> None:
    from shared.core.errors import InvalidInput

    tool = recall_function_tool(ContextGuard(store), "s1")
    assert tool.name == "recall" and tool.params_json_schema["required"] == ["query"]
    with pytest.raises(InvalidInput):
        recall_function_tool(ContextGuard(store), "bad id{")
