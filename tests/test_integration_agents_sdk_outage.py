"""Redis outages under the Agents SDK session: a real ``Runner.run`` over the SDK's Chat
Completions model and the real ``openai`` client, against the fake OpenAI-compatible
server, with a redis-server of the test's own that really goes away.

Redis dies while the model answers, stays down for a whole run (with a tool call), and
comes back with the data it had (saved before it died): every run completes, the model
sees the whole conversation throughout, and once Redis answers the items it missed are
saved, in order, each once.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("agents")

import redis
from agents import Agent, ModelSettings, Runner, function_tool, set_tracing_disabled
from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel
from openai import AsyncOpenAI

from shared.core.config import StoreConfig
from shared.guard import ContextGuard
from shared.integrations.agents_sdk import GuardedSession
from shared.store.sessions import SessionStore, connect
from workers.harness.fakes.openai_server import FakeOpenAIServer
from workers.harness.stack.redis_server import RedisServer, ReplyDroppingProxy, start_server

set_tracing_disabled(True)
MODEL = "gpt-4o"
SID = "sdk-outage"


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    server = start_server()
    yield server
    server.remove()


def down(server: RedisServer) -> None:
    """Redis dies (connection refused at once), its data saved for when it is back."""
    client = redis.Redis.from_url(server.url)
    client.save()
    client.close()
    server.stop()


def guard_on(server: RedisServer) -> ContextGuard:
    return ContextGuard(SessionStore(connect(server.url), StoreConfig(key_prefix="sdkout")),
                        warm_up=False, watch_changes=False)


@function_tool
def read_file(path: str) -> str:
    """Read a file."""
    return f"# {path}\nprint('hello')"


def provider(server: RedisServer) -> Any:
    """The fake's replies: Redis dies while "two" is answered; "three" reads a file."""
    def reply(request: dict[str, Any]) -> dict[str, Any]:
        last = request["messages"][-1]
        if last["role"] == "tool":
            return {"role": "assistant", "content": "answer three"}
        if last["content"] == "two":
            down(server)
        if last["content"] == "three":
            return {"role": "assistant", "content": None, "tool_calls": [{
                "id": "call_1", "type": "function",
                "function": {"name": "read_file", "arguments": json.dumps({"path": "a.py"})}}]}
        return {"role": "assistant", "content": f"answer {last['content']}"}
    return reply


def said(request: Any) -> list[str]:
    return [m["content"] for m in request.body["messages"]
            if m["role"] in ("user", "assistant") and m.get("content")]


@pytest.mark.redis
def test_a_run_goes_on_through_a_redis_outage_and_the_missed_items_are_saved_once(
        own_redis: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    guard = guard_on(own_redis)
    session = GuardedSession(guard, SID, model=MODEL, max_tokens=500)

    async def main(server: FakeOpenAIServer) -> None:
        client = AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0)
        agent = Agent(name="a", instructions="Be brief.", tools=[read_file],
                      model=session.wrap(OpenAIChatCompletionsModel(model=MODEL,
                                                                    openai_client=client)),
                      model_settings=ModelSettings(max_tokens=500))

        async def run(text: str) -> Any:
            return (await Runner.run(agent, text, session=session,
                                     run_config=session.run_config())).final_output

        assert await run("one") == "answer one"
        with caplog.at_level(logging.WARNING, "shared.integrations"):
            assert await run("two") == "answer two"  # Redis died while the model answered
            assert session.local.unsaved == 1
            assert await run("three") == "answer three"  # down for the whole run, a tool call
        assert "were not saved" in caplog.text and "degraded view" in caplog.text
        assert session.last_view.report.degraded
        assert said(server.requests[2]) == ["one", "answer one", "two", "answer two", "three"]
        assert said(server.requests[3])[-1] == "three"  # the tool's result follows
        assert session.local.unsaved == 5  # the answer, the input, call, output, answer
        own_redis.start()  # back with what it had saved: "one", its answer, "two"
        assert await run("four") == "answer four"
        assert said(server.requests[-1]) == ["one", "answer one", "two", "answer two",
                                             "three", "answer three", "four"]
        await client.close()

    with FakeOpenAIServer(window=128_000, responder=provider(own_redis)) as server:
        asyncio.run(main(server))
    assert session.local.unsaved == 0
    logged = guard_on(own_redis).store.messages(SID, 0, 100)
    assert [(m.role, m.text() or [c.name for c in m.tool_calls]) for m in logged] == [
        ("user", "one"), ("assistant", "answer one"), ("user", "two"),
        ("assistant", "answer two"), ("user", "three"), ("assistant", ["read_file"]),
        ("tool", "# a.py\nprint('hello')"), ("assistant", "answer three"),
        ("user", "four"), ("assistant", "answer four")]


@pytest.mark.redis
def test_items_whose_reply_was_lost_are_not_saved_twice(own_redis: RedisServer) -> None:
    """Redis applies the append but its replies are lost (the retry's too): the items wait
    with their request id, and the save that follows, Redis answering, stores them once."""
    config = StoreConfig(key_prefix="sdkout", socket_timeout=0.3, connect_timeout=0.3)
    with ReplyDroppingProxy(own_redis.port) as proxy:
        guard = ContextGuard(SessionStore(connect(proxy.url(), config), config),
                             warm_up=False, watch_changes=False)
        session = GuardedSession(guard, SID, model=MODEL)

        async def main() -> None:
            await session.add_items([{"role": "user", "content": "one"}])  # connected
            proxy.dropping.set()
            await session.add_items([{"role": "assistant", "content": "answer one"}])
            assert session.local.unsaved == 1  # applied, but no reply said so
            proxy.dropping.clear()
            await session.add_items([{"role": "user", "content": "two"}])
            assert session.local.unsaved == 0

        asyncio.run(main())
        assert proxy.dropped_bytes > 0
    logged = guard_on(own_redis).store.messages(SID, 0, 100)
    assert [m.text() for m in logged] == ["one", "answer one", "two"]
