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
import os
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
from tests.outage_support import guard_on as guard_with_prefix
from workers.harness.fakes.openai_server import FakeOpenAIServer
from workers.harness.stack.redis_server import RedisServer, ReplyDroppingProxy

set_tracing_disabled(True)
MODEL = "gpt-4o"
SID = "sdk-outage"



def down(server: RedisServer) -> None:
    """Redis dies (connection refused at once), its data saved for when it is back."""
    client = redis.Redis.from_url(server.url)
    client.save()
    client.close()
    server.stop()


def guard_on(server: RedisServer) -> ContextGuard:
    return guard_with_prefix(server, "sdkout")


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


# -- one copy per session in a process; a log Redis lost; the bound on unsaved items ---------
def answers(server: RedisServer, dies: dict[str, bool]) -> Any:
    """The fake's replies: "answer X" to X; Redis dies while the model answers a text in
    ``dies`` (True: its data saved first, False: lost, as a restart without persistence)."""
    def reply(request: dict[str, Any]) -> dict[str, Any]:
        text = request["messages"][-1]["content"]
        if text in dies:
            (down if dies[text] else lose)(server)
        return {"role": "assistant", "content": f"answer {text}"}
    return reply


def lose(server: RedisServer) -> None:
    """Redis dies and comes back (on ``start``) with nothing: no dump to load."""
    server.stop()
    for name in os.listdir(server.directory):
        os.remove(os.path.join(server.directory, name))


def texts_of(server: RedisServer, session_id: str = SID) -> list[str]:
    return [m.text() for m in guard_on(server).store.messages(session_id, 0, 100)]


def agent_on(client: AsyncOpenAI, session: GuardedSession) -> Agent[Any]:
    return Agent(name="a", instructions="Be brief.",
                 model=session.wrap(OpenAIChatCompletionsModel(model=MODEL,
                                                               openai_client=client)))


async def run_in(client: AsyncOpenAI, session: GuardedSession, text: Any) -> Any:
    return (await Runner.run(agent_on(client, session), text, session=session,
                             run_config=session.run_config())).final_output


@pytest.mark.redis
def test_a_session_object_per_request_shares_the_process_copy(own_redis: RedisServer) -> None:
    """As apps build SDK sessions: a new GuardedSession per request. While Redis is down a
    request's run sees the turns before it (not nothing), and once Redis is back what the
    earlier objects could not save is saved, in order, before the next request's turn."""
    guard = guard_on(own_redis)

    async def main(server: FakeOpenAIServer) -> None:
        client = AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0)

        def request() -> GuardedSession:
            return GuardedSession(guard, SID, model=MODEL, max_tokens=500)

        assert await run_in(client, request(), "one") == "answer one"
        assert await run_in(client, request(), "two") == "answer two"  # Redis died
        assert await run_in(client, request(), "three") == "answer three"  # still down
        assert said(server.requests[2]) == ["one", "answer one", "two", "answer two", "three"]
        own_redis.start()
        assert await run_in(client, request(), "four") == "answer four"
        assert said(server.requests[3])[:-1] == ["one", "answer one", "two", "answer two",
                                                 "three", "answer three"]
        await client.close()

    with FakeOpenAIServer(window=128_000, responder=answers(own_redis, {"two": True})) as server:
        asyncio.run(main(server))
    assert texts_of(own_redis) == ["one", "answer one", "two", "answer two", "three",
                                   "answer three", "four", "answer four"]


@pytest.mark.redis
def test_a_missed_turn_saved_after_another_process_saved_a_newer_one_is_reported(
        own_redis: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    """Two processes (two guards) of one session: the turn one of them missed reaches the log
    after the turn the other saved once Redis was back. Nothing orders them across
    processes; the turn is kept, and the misplacement is an ERROR naming the session."""
    first, second = guard_on(own_redis), guard_on(own_redis)

    async def main(server: FakeOpenAIServer) -> None:
        client = AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0)
        here = GuardedSession(first, SID, model=MODEL, max_tokens=500)
        there = GuardedSession(second, SID, model=MODEL, max_tokens=500)
        assert await run_in(client, here, "one") == "answer one"
        assert await run_in(client, here, "two") == "answer two"  # Redis died: missed
        own_redis.start()
        assert await run_in(client, there, "three") == "answer three"
        with caplog.at_level(logging.ERROR, "shared.integrations"):
            assert await run_in(client, here, "four") == "answer four"
        await client.close()

    with FakeOpenAIServer(window=128_000, responder=answers(own_redis, {"two": True})) as server:
        asyncio.run(main(server))
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any(SID in e and "out of order" in e for e in errors), errors
    # "two" was saved before Redis died; its answer was missed
    assert texts_of(own_redis) == ["one", "answer one", "two", "three", "answer three",
                                   "answer two", "four", "answer four"]


@pytest.mark.redis
def test_a_log_redis_lost_is_reported_and_never_re_seeded(
        own_redis: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    """Redis restarts without persistence twice: between two runs (found by the read), and
    while the model answers, back at once (found by the save of the answer). Each time one
    ERROR names the session, the copy's old history is dropped (never written back: the
    process cannot tell a loss from a deletion) and the run's new items are saved."""
    guard = guard_on(own_redis)
    rule = {"role": "system", "content": "Answer in French."}

    def restart_empty() -> None:
        lose(own_redis)
        own_redis.start()

    def reply(request: dict[str, Any]) -> dict[str, Any]:
        text = request["messages"][-1]["content"]
        if text == "three":
            restart_empty()
        return {"role": "assistant", "content": f"answer {text}"}

    async def main(server: FakeOpenAIServer) -> None:
        client = AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0)
        session = GuardedSession(guard, SID, model=MODEL, max_tokens=500)
        assert await run_in(client, session, [rule, {"role": "user", "content": "one"}])
        restart_empty()
        with caplog.at_level(logging.ERROR, "shared.integrations"):
            assert await run_in(client, session, "two") == "answer two"
            assert said(server.requests[1]) == ["two"]
            assert "Answer in French." not in str(server.requests[1].body["messages"])
            assert await run_in(client, session, "three") == "answer three"
            assert await run_in(client, session, "four") == "answer four"
        assert said(server.requests[3])[-2:] == ["answer three", "four"]
        assert "one" not in said(server.requests[3])
        await client.close()

    with FakeOpenAIServer(window=128_000, responder=reply) as server:
        asyncio.run(main(server))
    # the adapter's own (an earlier test's threads may log errors of their own meanwhile)
    errors = [r.getMessage() for r in caplog.records
              if r.levelno >= logging.ERROR and r.name.startswith("shared.integrations")]
    # each loss is reported (on a loaded machine the answer's save can meet Redis still
    # starting and report the same loss again when it saves later: twice, never silent)
    assert len(errors) >= 2 and all(e.startswith("Redis lost") and SID in e
                                    and "without persistence" in e for e in errors), errors
    assert texts_of(own_redis) == ["answer three", "four", "answer four"]


@pytest.mark.redis
def test_the_bound_on_unsaved_items_never_saves_a_result_without_its_call(
        own_redis: RedisServer) -> None:
    """Beyond ``keep`` the oldest missed batch goes; a tool result it answered goes with it
    (a later batch), so the log never holds an orphan result."""
    guard = guard_on(own_redis)
    session = GuardedSession(guard, SID, model=MODEL, keep=3)

    async def main() -> None:
        await session.add_items([{"role": "user", "content": "start"}])
        down(own_redis)
        await session.add_items([{"role": "user", "content": "read a.py"},
                                 {"type": "function_call", "call_id": "c1",
                                  "name": "read_file", "arguments": "{}"}])
        await session.add_items([{"type": "function_call_output", "call_id": "c1",
                                  "output": "x=1"}])
        await session.add_items([{"role": "assistant", "content": "done"}])
        own_redis.start()
        await session.get_items()

    asyncio.run(main())
    logged = guard.store.messages(SID, 0, 100)
    assert not [m for m in logged if m.role == "tool"]
    assert [m.text() for m in logged] == ["start", "done"]


def tenant_guard(server: RedisServer) -> ContextGuard:
    config = StoreConfig(key_prefix="sdkout")
    return ContextGuard(SessionStore(connect(server.url), config).for_tenant("acme"),  # type: ignore[arg-type]
                        warm_up=False, watch_changes=False)


@pytest.mark.redis
@pytest.mark.parametrize("make", [guard_on, tenant_guard], ids=["plain", "tenant"])
def test_a_session_deleted_by_another_process_is_never_written_back(
        own_redis: RedisServer, make: Any) -> None:
    """Another process deletes the session (Redis up, or after a restart that kept the
    data): the copy here is dropped, never written back, on a plain or a tenant store."""
    guard = make(own_redis)

    async def main(server: FakeOpenAIServer) -> None:
        client = AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0)
        session = GuardedSession(guard, SID, model=MODEL, max_tokens=500)
        assert await run_in(client, session, "secret one") == "answer secret one"
        down(own_redis)
        own_redis.start()  # a restart with persistence: nothing lost
        make(own_redis).store.delete_session(SID)
        assert await run_in(client, session, "two") == "answer two"
        assert said(server.requests[1]) == ["two"]
        await client.close()

    with FakeOpenAIServer(window=128_000, responder=answers(own_redis, {})) as server:
        asyncio.run(main(server))
    assert [m.text() for m in make(own_redis).store.messages(SID, 0, 100)] == [
        "two", "answer two"]


@pytest.mark.redis
def test_a_lost_reply_saved_after_the_request_id_ttl_is_not_stored_twice(
        own_redis: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    """The append landed, its reply was lost, and the session's next access comes after
    the store forgot the request id (a 2 s ``idempotency_ttl`` stands in for the hour):
    the batch is found at the log's tail and not stored again, and nothing is reported
    out of order."""
    config = StoreConfig(key_prefix="sdkout", socket_timeout=0.3, connect_timeout=0.3)
    with ReplyDroppingProxy(own_redis.port) as proxy:
        store = SessionStore(connect(proxy.url(), config), config, idempotency_ttl=2)
        session = GuardedSession(ContextGuard(store, warm_up=False, watch_changes=False),
                                 SID, model=MODEL)

        async def main() -> None:
            await session.add_items([{"role": "user", "content": "one"}])
            proxy.dropping.set()
            await session.add_items([{"role": "assistant", "content": "answer one"}])
            assert session.local.unsaved == 1  # applied, no reply
            proxy.dropping.clear()
            await asyncio.sleep(3)  # later than the store remembers the request id
            with caplog.at_level(logging.ERROR, "shared.integrations"):
                await session.get_items()

        asyncio.run(main())
    assert texts_of(own_redis) == ["one", "answer one"]
    assert not [r for r in caplog.records
                if r.levelno >= logging.ERROR and r.name.startswith("shared.integrations")]


@pytest.mark.redis
def test_a_process_that_never_read_the_session_reports_nothing_out_of_order(
        own_redis: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    """A fresh process runs during an outage: once Redis is back its turn follows the
    log it never read; nothing was saved meanwhile, so no ERROR."""
    async def main(server: FakeOpenAIServer) -> None:
        client = AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0)
        old = GuardedSession(guard_on(own_redis), SID, model=MODEL, max_tokens=500)
        assert await run_in(client, old, "one") == "answer one"
        down(own_redis)
        fresh = GuardedSession(guard_on(own_redis), SID, model=MODEL, max_tokens=500)
        assert await run_in(client, fresh, "two") == "answer two"
        own_redis.start()
        with caplog.at_level(logging.ERROR, "shared.integrations"):
            assert await run_in(client, fresh, "three") == "answer three"
        await client.close()

    with FakeOpenAIServer(window=128_000, responder=answers(own_redis, {})) as server:
        asyncio.run(main(server))
    assert texts_of(own_redis) == ["one", "answer one", "two", "answer two", "three",
                                   "answer three"]
    assert not [r for r in caplog.records
                if r.levelno >= logging.ERROR and r.name.startswith("shared.integrations")]


@pytest.mark.redis
def test_the_copies_stay_within_their_token_bounds_with_redis_up(
        own_redis: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """QA's memory scenario scaled down: sessions of tool turns with large outputs, Redis
    up throughout. Each copy stays within the model's window, all of them within the
    guard's budget (scaled down too)."""
    from shared.integrations import agents_local

    monkeypatch.setattr(agents_local, "TOKENS", 60_000, raising=False)
    guard = guard_on(own_redis)
    window = guard.model_limits("gpt-4o").context_window

    async def main() -> None:
        for s in range(4):
            session = GuardedSession(guard, f"mem{s}", model=MODEL, max_tokens=500)
            for t in range(40):
                await session.add_items([{"role": "user", "content": f"read file {t}"}])
                await session.add_items([
                    {"type": "function_call", "call_id": f"c{t}", "name": "read_file",
                     "arguments": "{}"},
                    {"type": "function_call_output", "call_id": f"c{t}",
                     "output": f"{t} " + "word " * 8_000}])
                await session.add_items([{"role": "assistant", "content": "ok"}])
                assert text_held(session.local) <= 6 * window  # (some 5 characters a word)

    asyncio.run(main())
    held = sum(text_held(c) for c in agents_local._COPIES[guard]._copies.values())
    assert held <= 6 * (60_000 + window), held  # 6.4 MB of output was saved in all


def text_held(local: Any) -> int:
    return sum(len(m.text()) for m in local.messages())
