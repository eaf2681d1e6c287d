"""The Agents SDK adapter against a local OpenAI-compatible server, through the real
``openai`` client and ``Runner.run``: what the provider reports and refuses reaches the
guard's rules (its calibration, its anchor, its recovery)."""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any, cast

import pytest

pytest.importorskip("agents")

from agents import Agent, ModelSettings, Runner, function_tool, set_tracing_disabled
from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel
from openai import AsyncOpenAI

from shared.core.config import StoreConfig
from shared.guard import ContextGuard
from shared.integrations.agents_sdk import GuardedSession
from shared.store.sessions import SessionStore
from workers.harness.fakes.behaviour import Fault
from workers.harness.fakes.openai_server import FakeOpenAIServer, overflow_message

set_tracing_disabled(True)
MODEL = "gpt-4o"  # a window the registry knows (128k)
BIG = "x = compute(value)  # " + "lorem ipsum dolor sit amet " * 3


def json_count(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
               ) -> int:
    """A provider whose count follows the request's JSON (its ratio to the guard's
    heuristic differs from short messages to long tool outputs)."""
    return int(len(json.dumps([messages, tools or []], ensure_ascii=False)) / 3.5) + 1


def overflow_fault(window: int, prompt: int) -> Fault:
    body = {"error": {"message": overflow_message(window, prompt, None),
                      "type": "invalid_request_error", "param": "messages",
                      "code": "context_length_exceeded"}}
    return Fault.http_error(400, json.dumps(body))


@function_tool
def read_file(path: str) -> str:
    """Read a file."""
    return f"# {path}\n" + (BIG + "\n") * 60


@function_tool
def failing(path: str) -> str:
    """Fails."""
    raise ValueError(f"cannot open {path}")


@pytest.fixture
def guard(real_redis: Any, key_prefix: str) -> ContextGuard:
    return ContextGuard(SessionStore(real_redis, StoreConfig(key_prefix=key_prefix)))


def agent_for(session: GuardedSession, server: FakeOpenAIServer, **kwargs: Any) -> Agent[Any]:
    client = AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0)
    model = OpenAIChatCompletionsModel(model=MODEL, openai_client=client)
    return Agent(name="a", instructions="You are a coder.", model=session.wrap(model),
                 model_settings=ModelSettings(max_tokens=500), **kwargs)


def prompt_of(server: FakeOpenAIServer, k: int) -> int:
    request = server.requests[k]
    return json_count(request.body["messages"], request.body.get("tools"))


# -- finding: the guard's recovery rules -----------------------------------------------------
def fill(session: GuardedSession, turns: int) -> None:
    history = [{"role": "user" if i % 2 == 0 else "assistant",
                "content": f"message {i}: " + "word " * 300} for i in range(turns)]
    asyncio.run(session.add_items(cast(Any, history)))


def test_a_refusal_counting_far_more_than_estimated_is_retried_smaller(
        guard: ContextGuard) -> None:
    """The error restates the known window and counts ~13x the estimate: the retry is
    compacted to a fifth of what the estimate would have to be (not to a fifth of the
    window, which the refused input already was under: the same request again)."""
    session = GuardedSession(guard, "counted", model=MODEL, max_tokens=500)
    fill(session, 30)  # ~10k tokens
    with FakeOpenAIServer(window=128_000, counter=json_count,
                          responder=lambda req: {"content": "done"}) as server:
        server.faults.next(overflow_fault(128_000, 130_512))
        result = asyncio.run(Runner.run(agent_for(session, server), "next", session=session,
                                        run_config=session.run_config()))
        statuses = [r.status for r in server.requests]
        refused, retried = prompt_of(server, 0), prompt_of(server, 1)
    assert result.final_output == "done"
    assert statuses == [400, 200]
    assert refused > 8000 and retried < refused / 4
    assert MODEL not in guard.limits.as_mapping()  # the window it restated: nothing learned


def test_a_retry_no_smaller_than_the_refused_request_is_not_sent(guard: ContextGuard) -> None:
    session = GuardedSession(guard, "tiny", model=MODEL, max_tokens=500)
    with FakeOpenAIServer(window=128_000, counter=json_count,
                          responder=lambda req: {"content": "done"}) as server:
        server.faults.next(overflow_fault(128_000, 130_512), times=2)
        agent = agent_for(session, server)
        with pytest.raises(Exception, match="maximum context length"):
            asyncio.run(Runner.run(agent, "hi", session=session,
                                   run_config=session.run_config()))
        assert len(server.requests) == 1  # "hi" alone: nothing to drop, so no retry
    assert cast(Any, agent.model).recoveries == 0


def test_a_limit_stated_below_a_known_window_is_the_sessions_alone(
        guard: ContextGuard) -> None:
    """One endpoint serving gpt-4o with an 8k context: its session learns 8k (state and
    filter), every other session of the model keeps the registry's 128k."""
    session = GuardedSession(guard, "small-endpoint", model=MODEL, max_tokens=500)
    fill(session, 30)
    with FakeOpenAIServer(window=128_000, counter=json_count,
                          responder=lambda req: {"content": "done"}) as server:
        server.faults.next(overflow_fault(8000, 12_000))
        asyncio.run(Runner.run(agent_for(session, server), "next", session=session,
                               run_config=session.run_config()))
        assert [r.status for r in server.requests] == [400, 200]
        assert prompt_of(server, 1) + 500 <= 8000
    assert guard.store.state("small-endpoint").learned_window == 8000
    assert MODEL not in guard.limits.as_mapping()
    assert session.input_filter.limits().context_window == 8000
    other = GuardedSession(guard, "other-endpoint", model=MODEL, max_tokens=500)
    assert other.input_filter.limits().context_window == 128_000
    fill(other, 2)
    asyncio.run(other.get_items())
    assert other.last_view.report.budget.window == 128_000
    # a new session object (another process) reads it from the session's state
    again = GuardedSession(guard, "small-endpoint", model=MODEL, max_tokens=500)
    asyncio.run(again.get_items())
    assert again.input_filter.limits().context_window == 8000


# -- finding: reported usage calibrates the guard and anchors the filter ---------------------
def tool_heavy(runs: int, session: GuardedSession, server: FakeOpenAIServer) -> None:
    """``runs`` runs; every third starts with two parallel reads (~1.9k tokens each) and
    a failing call."""
    counter = itertools.count()

    def responder(request: dict[str, Any]) -> dict[str, Any]:
        n = next(counter)
        if request["messages"][-1]["role"] == "user" and n % 3 == 0:
            return {"tool_calls": [
                {"id": f"c{n}a", "name": "read_file", "arguments": {"path": f"a{n}.py"}},
                {"id": f"c{n}b", "name": "read_file", "arguments": {"path": f"b{n}.py"}},
                {"id": f"c{n}c", "name": "failing", "arguments": {"path": f"z{n}"}}]}
        return {"content": f"answer {n}"}

    server.responder = responder
    agent = agent_for(session, server, tools=[read_file, failing])

    async def scenario() -> None:
        for i in range(runs):
            await Runner.run(agent, f"step {i}: " + "please look at the code " * 40,
                             session=session, run_config=session.run_config())

    asyncio.run(scenario())


def test_a_long_tool_heavy_session_stays_inside_a_provider_counting_json(
        real_redis: Any, key_prefix: str) -> None:
    guard = ContextGuard(SessionStore(real_redis, StoreConfig(key_prefix=key_prefix)),
                         overrides={MODEL: 16_000})
    session = GuardedSession(guard, "long", model=MODEL, max_tokens=500,
                             instructions="You are a coder.")
    with FakeOpenAIServer(window=16_000, counter=json_count) as server:
        tool_heavy(60, session, server)
        refused = sum(r.status != 200 for r in server.requests)
        total = len(server.requests)
    assert total >= 80
    assert refused == 0, f"{refused} of {total} requests refused for overflow"
    state = guard.store.state("long")
    assert state.calibration_samples > 10 and state.anchor_reported


def test_each_response_calibrates_the_guards_view(guard: ContextGuard) -> None:
    """The view get_items builds counts with what the provider reported: its estimate of
    the next run's request is the provider's count (anchor) plus what was added since."""
    session = GuardedSession(guard, "calibrated", model=MODEL, max_tokens=500,
                             instructions="You are a coder.")
    with FakeOpenAIServer(window=128_000, counter=json_count) as server:
        tool_heavy(4, session, server)
        last = server.requests[-1]
        reported = json_count(last.body["messages"], last.body.get("tools"))
    state = guard.store.state("calibrated")
    assert state.calibration_samples >= 4
    assert state.anchor_reported == reported  # the last request, counted by the provider
    items = asyncio.run(session.get_items())
    estimate = session.last_view.report.estimated_prompt_tokens
    # what the next request would hold (the view; no new input yet), counted as sent
    sent = json_count([{"role": "system", "content": "You are a coder."},
                       *[{"content": json.dumps(i)} for i in items]])
    assert reported < estimate < sent * 1.2


def test_an_output_reserve_overflow_is_retried_with_a_lower_max_tokens(
        guard: ContextGuard) -> None:
    """The prompt alone fits the 3000-token endpoint, prompt + max_tokens does not: as the
    guard's ``recover`` does, the retry sends the question whole with the max_tokens the
    window leaves it (compacting to make room would clip the question itself)."""
    session = GuardedSession(guard, "reserve", model=MODEL, max_tokens=1500)
    question = "Summarize this log: " + "event ok " * 800  # ~1.7k tokens, the turn's only item
    with FakeOpenAIServer(window=3000, responder=lambda req: {"content": "done"}) as server:
        client = AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0)
        model = session.wrap(OpenAIChatCompletionsModel(model=MODEL, openai_client=client))
        agent = Agent(name="a", instructions="Be brief.", model=model,
                      model_settings=ModelSettings(max_tokens=1500))
        result = asyncio.run(Runner.run(agent, question, session=session,
                                        run_config=session.run_config()))
        refused, retried = server.requests
    assert result.final_output == "done"
    assert (refused.status, retried.status) == (400, 200)
    assert refused.prompt_tokens <= 3000 < refused.prompt_tokens + 1500  # the reserve's
    assert retried.body["messages"][-1]["content"] == question  # whole, not clipped
    lowered = retried.body.get("max_tokens") or retried.body.get("max_completion_tokens")
    assert 750 <= lowered < 1500
    assert retried.prompt_tokens + lowered <= 3000
    assert model.recoveries == 1
