"""The Agents SDK session as its users run it: hosted tools (``WebSearchTool``, file
search, code interpreter, image generation, hosted MCP).

The Responses API runs those tools itself and returns one item per call
(``web_search_call``...) among the run's new items; the runner hands them to the
session's ``add_items`` and, within a run, to the budget filter. Neither may fail the run,
and the next request must carry the item as the provider returned it. A real
``Runner.run`` over an SDK ``Model`` answering as the Responses API does (hosted tools
need the Responses API, which the project's fake server does not speak); the guard on
fakeredis.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from typing import Any

import fakeredis
import pytest

pytest.importorskip("agents")

from agents import Agent, Runner, WebSearchTool, function_tool, set_tracing_disabled
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseFunctionWebSearch,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseReasoningItem,
)
from openai.types.responses.response_function_web_search import ActionSearch
from openai.types.responses.response_reasoning_item import Summary

from shared.core.config import StoreConfig
from shared.guard import ContextGuard
from shared.integrations.agents_items import items_to_messages, messages_to_items
from shared.integrations.agents_sdk import GuardedSession
from shared.store.sessions import SessionStore

set_tracing_disabled(True)


def search(n: int) -> ResponseFunctionWebSearch:
    return ResponseFunctionWebSearch(id=f"ws_{n}", type="web_search_call", status="completed",
                                     action=ActionSearch(type="search", query=f"weather {n}"))


def answer(n: int, text: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(id=f"msg_{n}", type="message", role="assistant",
                                 status="completed",
                                 content=[ResponseOutputText(type="output_text", text=text,
                                                             annotations=[])])


class Searching(Model):
    """Each user turn: reasoning, a web search, then the answer (or first a ``lookup``
    call, answered, when ``call_tool``)."""

    def __init__(self, call_tool: bool = False) -> None:
        self.inputs: list[list[dict[str, Any]]] = []
        self.call_tool = call_tool

    async def get_response(self, system_instructions: str | None, input: Any, *args: Any,
                           **kwargs: Any) -> ModelResponse:
        items = [dict(i) if isinstance(i, dict) else i.model_dump(exclude_none=True)
                 for i in input]
        self.inputs.append(items)
        n = len(self.inputs)
        if self.call_tool and items[-1].get("type") != "function_call_output":
            output: list[Any] = [search(n), ResponseFunctionToolCall(
                type="function_call", call_id=f"call_{n}", name="lookup",
                arguments='{"q": "x"}', id=f"fc_{n}")]
        else:
            reasoning = ResponseReasoningItem(id=f"rs_{n}", type="reasoning",
                                              encrypted_content="opaque",
                                              summary=[Summary(text="look it up",
                                                               type="summary_text")])
            output = [reasoning, search(n), answer(n, f"sunny ({n})")]
        return ModelResponse(output=output, response_id=f"resp_{n}",
                             usage=Usage(requests=1, input_tokens=50, output_tokens=5,
                                         total_tokens=55))

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


@function_tool
def lookup(q: str) -> str:
    """Look a fact up."""
    return f"fact about {q}"


@pytest.fixture
def guard() -> ContextGuard:
    store = SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="t" + secrets.token_hex(4)))
    return ContextGuard(store)


def test_hosted_tool_calls_are_saved_and_sent_back_as_the_provider_returned_them(
        guard: ContextGuard) -> None:
    model = Searching()
    agent = Agent(name="a", instructions="be brief", tools=[WebSearchTool()])
    session = GuardedSession.for_agent(guard, "sdk-hosted", agent, model="gpt-4o")
    agent.model = session.wrap(model)

    async def runs() -> None:
        await Runner.run(agent, "Weather?", session=session, run_config=session.run_config())
        await Runner.run(agent, "Tomorrow?", session=session, run_config=session.run_config())

    asyncio.run(runs())
    log = guard.store.messages("sdk-hosted", 0, guard.store.length("sdk-hosted"))
    assert [m.role for m in log] == ["user", "assistant", "user", "assistant"]
    assert log[1].text() == "sunny (1)"
    assert "web_search_call" in (log[1].reasoning or "") and "weather 1" in (log[1].reasoning or "")
    second = model.inputs[1]
    assert [i.get("type", "message") for i in second] == [
        "message", "reasoning", "web_search_call", "message", "message"]
    assert second[2] == search(1).model_dump(exclude_none=True)  # as the provider returned it


def test_a_hosted_call_before_a_function_call_in_one_run_passes_the_filter(
        guard: ContextGuard) -> None:
    model = Searching(call_tool=True)
    agent = Agent(name="a", instructions="be brief", tools=[WebSearchTool(), lookup])
    session = GuardedSession.for_agent(guard, "sdk-hosted-fn", agent, model="gpt-4o")
    agent.model = session.wrap(model)
    result = asyncio.run(Runner.run(agent, "Weather?", session=session,
                                    run_config=session.run_config()))
    assert result.final_output == "sunny (2)"
    log = guard.store.messages("sdk-hosted-fn", 0, guard.store.length("sdk-hosted-fn"))
    assert [m.role for m in log] == ["user", "assistant", "tool", "assistant"]
    assert [c.name for c in log[1].tool_calls] == ["lookup"]
    # the input of the second call: the search, the call and its output, in the run's order
    assert [i.get("type") for i in model.inputs[1][1:]] == [
        "web_search_call", "function_call", "function_call_output"]


def test_the_mapping_round_trips_hosted_items_in_order() -> None:
    items = [{"role": "user", "content": "hi"},
             json.loads(search(1).model_dump_json(exclude_none=True)),
             {"type": "mcp_call", "id": "mcp_1", "server_label": "docs", "name": "find",
              "arguments": "{}", "output": "x" * 5000},
             json.loads(answer(1, "done").model_dump_json(exclude_none=True))]
    messages = items_to_messages(items)
    assert [m.role for m in messages] == ["user", "assistant"]
    assert len(messages[1].reasoning or "") < 1000  # a long output is clipped in the note
    assert messages_to_items(messages)[1:3] == items[1:3]


def test_an_uploaded_image_by_file_id_is_saved_and_sent_back(guard: ContextGuard) -> None:
    """``{"type": "input_image", "file_id": ...}``: an image uploaded with the Files API,
    a documented Responses input; the run must not be refused before the model is asked."""
    model = Searching()
    agent = Agent(name="a", instructions="be brief")
    session = GuardedSession.for_agent(guard, "sdk-image", agent, model="gpt-4o")
    agent.model = session.wrap(model)
    image = {"type": "input_image", "file_id": "file-abc123", "detail": "auto"}
    first: Any = [{"role": "user", "content": [{"type": "input_text", "text": "What is it?"},
                                               image]}]

    async def runs() -> None:
        await Runner.run(agent, first, session=session, run_config=session.run_config())
        await Runner.run(agent, "And its colour?", session=session,
                         run_config=session.run_config())

    asyncio.run(runs())
    assert guard.store.length("sdk-image") == 4
    assert model.inputs[1][0]["content"][1] == image


def test_an_agent_built_with_a_model_name_is_wrapped_and_budgeted_for_that_model(
        guard: ContextGuard) -> None:
    """``Agent(model="gpt-4o-mini")``, as most SDK users build one: ``session.wrap(agent.model)``
    resolves the name as the runner would (here through a provider on the fake server's
    Chat Completions), and ``for_agent`` budgets for that model, not for gpt-4o."""
    from agents.models.openai_provider import OpenAIProvider
    from openai import AsyncOpenAI

    from workers.harness.fakes import FakeOpenAIServer

    with FakeOpenAIServer(window=100_000) as fake:
        agent = Agent(name="a", instructions="be brief", model="gpt-4o-mini")
        session = GuardedSession.for_agent(guard, "sdk-named", agent)
        client = AsyncOpenAI(base_url=fake.base_url, api_key="sk-test", max_retries=0)
        agent.model = session.wrap(agent.model, provider=OpenAIProvider(
            openai_client=client, use_responses=False))
        result = asyncio.run(Runner.run(agent, "Hello there", session=session,
                                        run_config=session.run_config()))
        assert isinstance(result.final_output, str) and result.final_output
        assert fake.requests[-1].body["model"] == "gpt-4o-mini"
    assert session.model == session.input_filter.model == "gpt-4o-mini"
    assert guard.store.length("sdk-named") == 2
