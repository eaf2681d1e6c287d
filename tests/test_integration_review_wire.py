"""Overflow in the middle of a run, on the wire: the real ``openai`` client against the
fake OpenAI-compatible server, which refuses an input past its window with OpenAI's own
400 ``context_length_exceeded`` body.

Each run asks, the model calls two tools in parallel, their long results push the next
request past the window (the guard is told a far larger one, so only the provider's error
can tell): that request is refused once, compacted and retried once, and the run ends.
pydantic-ai (``OpenAIChatModel``, ``run`` and ``run_stream``) and the Agents SDK
(``OpenAIChatCompletionsModel``, ``Runner.run`` and ``run_streamed``); every message is in
the log once.
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

import fakeredis
import pytest

pytest.importorskip("pydantic_ai")
pytest.importorskip("agents")

from openai import AsyncOpenAI

from shared.core.config import StoreConfig
from shared.guard import ContextGuard
from shared.store.sessions import SessionStore
from tests.fakes_support import words
from workers.harness.fakes import FakeOpenAIServer

MODEL = "gpt-4o-fake"
WINDOW = 3000


def parallel_calls(request: dict[str, Any]) -> dict[str, Any]:
    """A user turn gets two parallel ``lookup`` calls; their results, the answer."""
    messages = request["messages"]
    if messages[-1]["role"] == "user":
        n = len(messages)
        return {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"a{n}", "name": "lookup", "arguments": {"q": "fare"}},
            {"id": f"b{n}", "name": "lookup", "arguments": {"q": "seat"}}]}
    return {"role": "assistant", "content": "Done: " + words(10)}


def lookup(q: str) -> str:
    """Look a booking record up."""
    return f"record for {q}: " + words(450)


@pytest.fixture
def guard() -> ContextGuard:
    store = SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="t" + secrets.token_hex(4)))
    return ContextGuard(store, overrides={MODEL: 100_000})  # the provider's window is smaller


def statuses(fake: FakeOpenAIServer, since: int) -> list[int]:
    return [r.status for r in fake.requests[since:] if r.path.endswith("/chat/completions")]


def roles(guard: ContextGuard, session: str) -> list[str]:
    return [m.role for m in guard.store.messages(session, 0, guard.store.length(session))]


ONE_RUN = ["user", "assistant", "tool", "tool", "assistant"]


@pytest.mark.parametrize("stream", [False, True], ids=["run", "run_stream"])
def test_pydantic_ai_recovers_a_mid_run_overflow_once(guard: ContextGuard, stream: bool) -> None:
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    from shared.integrations.pydantic_ai import ContextGuardCapability

    with FakeOpenAIServer(window=WINDOW, responder=parallel_calls) as fake:
        client = AsyncOpenAI(base_url=fake.base_url, api_key="sk-test", max_retries=0)
        agent = Agent(OpenAIChatModel(MODEL, provider=OpenAIProvider(openai_client=client)),
                      instructions="be brief", tools=[lookup],
                      capabilities=[ContextGuardCapability(guard, session_id="pai-wire",
                                                           max_tokens=100)])

        async def runs() -> list[list[int]]:
            history: list[Any] = []
            seen = []
            for i in range(3):
                since = len(fake.requests)
                prompt = f"Question {i}: " + words(60)
                if stream:
                    async with agent.run_stream(prompt, message_history=history) as result:
                        await result.get_output()
                    history = result.all_messages()
                else:
                    history = (await agent.run(prompt, message_history=history)).all_messages()
                seen.append(statuses(fake, since))
            return seen

        seen = asyncio.run(runs())
    assert seen[0] == [200, 200]
    assert [400, 200] in [s[1:] for s in seen[1:]]  # refused after the tool results, retried
    assert all(s.count(400) <= 1 for s in seen)
    assert roles(guard, "pai-wire") == ONE_RUN * 3


@pytest.mark.parametrize("stream", [False, True], ids=["run", "run_streamed"])
def test_agents_sdk_recovers_a_mid_run_overflow_once(guard: ContextGuard, stream: bool) -> None:
    from agents import Agent, Runner, function_tool, set_tracing_disabled
    from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel

    from shared.integrations.agents_sdk import GuardedSession

    set_tracing_disabled(True)
    with FakeOpenAIServer(window=WINDOW, responder=parallel_calls) as fake:
        client = AsyncOpenAI(base_url=fake.base_url, api_key="sk-test", max_retries=0)
        agent = Agent(name="a", instructions="be brief", tools=[function_tool(lookup)])
        session = GuardedSession.for_agent(guard, "sdk-wire", agent, model=MODEL, max_tokens=100)
        agent.model = session.wrap(OpenAIChatCompletionsModel(MODEL, client))

        async def runs() -> list[list[int]]:
            seen = []
            for i in range(3):
                since = len(fake.requests)
                prompt = f"Question {i}: " + words(60)
                if stream:
                    streamed = Runner.run_streamed(agent, prompt, session=session,
                                                   run_config=session.run_config())
                    async for _ in streamed.stream_events():
                        pass
                else:
                    await Runner.run(agent, prompt, session=session,
                                     run_config=session.run_config())
                seen.append(statuses(fake, since))
            return seen

        seen = asyncio.run(runs())
    assert seen[0] == [200, 200]
    assert [400, 200] in [s[1:] for s in seen[1:]]
    assert all(s.count(400) <= 1 for s in seen)
    assert roles(guard, "sdk-wire") == ONE_RUN * 3
