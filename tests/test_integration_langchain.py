"""The LangChain v1 middleware, driven through a real ``create_agent`` graph.

The chat model is ``WindowedChatModel`` (examples/langchain_agent.py): a real
``BaseChatModel`` that enforces a context window and raises
``ContextOverflowError`` past it. Nothing of LangChain is mocked; the
compaction side is the real guard on a real Redis (random key prefix), and
summaries come from the embedded stack's in-process Celery worker.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest

pytest.importorskip("langchain.agents")

from langchain.agents import create_agent
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.messages.utils import count_tokens_approximately
from langgraph.checkpoint.memory import InMemorySaver

from examples.langchain_agent import SYSTEM, WindowedChatModel, lookup
from shared.core.config import StoreConfig
from shared.core.errors import InvalidInput
from shared.core.records import SummaryRecord
from shared.core.view import SUMMARY_OPEN
from shared.guard import ContextGuard
from shared.integrations._common import ThreadedAsyncGuard, as_async_guard
from shared.integrations.langchain import ContextGuardMiddleware, from_view, to_neutral
from shared.store.sessions import SessionStore

MODEL = "windowed-fake"


def question(i: int) -> HumanMessage:
    return HumanMessage(f"Question {i}: booking BK{i:04d}, check fare, seat and meal. " * 4)


def agent_for(guard: Any, model: WindowedChatModel, **kwargs: Any) -> Any:
    middleware = ContextGuardMiddleware(guard, max_tokens=256, **kwargs)
    return create_agent(model, [lookup], system_prompt=SYSTEM, middleware=[middleware],
                        checkpointer=InMemorySaver())


def config(session: str) -> Any:
    return {"configurable": {"thread_id": session}}


def has_summary(request: list[BaseMessage]) -> bool:
    return any(SUMMARY_OPEN in str(m.content) for m in request)


@pytest.fixture
def fake_store() -> SessionStore:
    return SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="t" + secrets.token_hex(4)))


@pytest.fixture
def stack(redis_url: str, key_prefix: str) -> Iterator[Any]:
    """The embedded stack on the real Redis: memory broker, in-process Celery worker."""
    from workers.harness.stack.demo import choose_backends, open_stack
    from workers.settings import Settings

    settings = Settings(redis_url=redis_url, key_prefix=key_prefix)
    with open_stack(settings, choose_backends(settings, "embedded"), concurrency=1) as found:
        yield found
        for key in found.store.redis.scan_iter(match=f"{key_prefix}:*"):
            found.store.redis.delete(key)


# -- the contract ---------------------------------------------------------------------------
@pytest.mark.redis
@pytest.mark.celery
def test_a_session_longer_than_the_window_never_overflows_and_sees_worker_summaries(
        stack: Any) -> None:
    guard = ContextGuard(stack.store, stack.enqueuer, overrides={MODEL: 3000})
    model = WindowedChatModel(window=3000, requests=[], counts=[])
    agent = agent_for(guard, model)
    session, turns = "lc-long", 30
    for i in range(turns):
        state = agent.invoke({"messages": [question(i)]}, config(session))
        assert stack.wait_idle(session, timeout=20)
    messages = state["messages"]
    # View, not delete: the graph state keeps every message, in order, as LangChain made it.
    assert len(messages) == 4 * turns
    assert messages[0].content == question(0).content
    assert [type(m) for m in messages[:4]] == [HumanMessage, AIMessage, ToolMessage, AIMessage]
    # What the model was sent: always inside its window, although the session is not.
    assert model.overflows == 0
    assert sum(model.counts[-2:]) > 0 and max(model.counts) <= 3000
    assert count_tokens_approximately(messages) > 2 * 3000  # the session outgrew the window
    # The session log mirrors the state; the worker's summaries reach later requests.
    assert stack.store.length(session) == len(messages)
    assert any(s.kind != "truncation" for s in stack.store.summaries(session))
    first = next(i for i, r in enumerate(model.requests) if has_summary(r))
    assert first < len(model.requests) - 5
    assert all(has_summary(r) for r in model.requests[-5:])


def test_a_provider_overflow_is_recovered_and_retried_once(fake_store: SessionStore) -> None:
    # The guard believes the window is 40k; the model's is 3000: the model will refuse.
    guard = ContextGuard(fake_store, overrides={MODEL: 40_000})
    model = WindowedChatModel(window=3000, requests=[], counts=[])
    agent = agent_for(guard, model)
    for i in range(14):
        state = agent.invoke({"messages": [question(i)]}, config("lc-recover"))
    assert model.overflows >= 1  # the provider did refuse ...
    assert len(state["messages"]) == 4 * 14  # ... and no turn failed or repeated
    assert fake_store.state("lc-recover").learned_window == 3000  # the stated limit, learned
    assert max(model.counts) <= 3000


def test_other_errors_propagate_and_record_nothing(fake_store: SessionStore) -> None:
    guard = ContextGuard(fake_store, overrides={MODEL: 3000})
    model = WindowedChatModel(window=3000, requests=[], counts=[])
    agent = agent_for(guard, model)
    agent.invoke({"messages": [question(0)]}, config("lc-error"))
    length = fake_store.length("lc-error")

    def boom(messages: Any) -> AIMessage:
        raise RuntimeError("rate limited, not an overflow")

    model.reply = boom
    with pytest.raises(RuntimeError, match="rate limited"):
        agent.invoke({"messages": [question(1)]}, config("lc-error"))
    assert fake_store.length("lc-error") == length


def test_the_async_hook_with_the_threaded_stopgap(fake_store: SessionStore) -> None:
    """ainvoke -> awrap_model_call. STOPGAP: shared.guard.AsyncContextGuard does not exist
    yet, so the sync guard runs in a thread (ThreadedAsyncGuard, asyncio.to_thread)."""
    guard = ContextGuard(fake_store, overrides={MODEL: 40_000})
    assert isinstance(as_async_guard(guard), ThreadedAsyncGuard)
    model = WindowedChatModel(window=3000, requests=[], counts=[])
    agent = agent_for(guard, model)

    async def drive() -> Any:
        state = None
        for i in range(12):
            state = await agent.ainvoke({"messages": [question(i)]}, config("lc-async"))
        return state

    state = asyncio.run(drive())
    assert len(state["messages"]) == 48
    assert model.overflows >= 1 and max(model.counts) <= 3000
    assert fake_store.length("lc-async") == 48


def test_the_async_hook_with_async_context_guard(fake_store: SessionStore) -> None:
    import shared.guard as guard_module
    from shared.store.aio import AsyncSessionStore

    store = AsyncSessionStore(fakeredis.FakeAsyncRedis(), fake_store.config)
    async_guard = guard_module.AsyncContextGuard(store, overrides={MODEL: 3000})
    model = WindowedChatModel(window=3000, requests=[], counts=[])
    agent = agent_for(async_guard, model)

    async def drive() -> Any:
        for i in range(6):
            state = await agent.ainvoke({"messages": [question(i)]}, config("lc-aguard"))
        return state

    assert len(asyncio.run(drive())["messages"]) == 24


# -- bad input: named, and nothing half-written ------------------------------------------------
def test_a_message_it_cannot_map_is_named_and_nothing_is_written(
        fake_store: SessionStore) -> None:
    agent = agent_for(ContextGuard(fake_store), WindowedChatModel(requests=[], counts=[]))
    bad = ChatMessage(role="critic", content="not a role any provider takes")
    with pytest.raises(InvalidInput) as info:
        agent.invoke({"messages": [question(0), bad]}, config("lc-bad"))
    assert info.value.field is not None and info.value.field.startswith("state.messages[1]")
    assert "ChatMessage" in str(info.value)
    assert "RemoveMessage" in str(info.value)  # the checkpoint keeps it: the way out
    assert fake_store.length("lc-bad") == 0


def test_no_session_is_refused(fake_store: SessionStore) -> None:
    model = WindowedChatModel(requests=[], counts=[])
    agent = create_agent(model, [lookup], middleware=[ContextGuardMiddleware(
        ContextGuard(fake_store))])  # no checkpointer, no thread id
    with pytest.raises(InvalidInput) as info:
        agent.invoke({"messages": [question(0)]})
    assert info.value.field == "session_id"


def test_a_state_that_does_not_continue_the_session_is_refused(
        fake_store: SessionStore) -> None:
    guard = ContextGuard(fake_store)
    agent_for(guard, WindowedChatModel(requests=[], counts=[])).invoke(
        {"messages": [question(0)]}, config("lc-shared"))
    length = fake_store.length("lc-shared")
    # Another graph (fresh state) on the same session id: its history is not the log's.
    other = agent_for(guard, WindowedChatModel(requests=[], counts=[]))
    with pytest.raises(InvalidInput) as info:
        other.invoke({"messages": [question(9)]}, config("lc-shared"))
    assert info.value.field in ("state.messages", "session_id")
    assert fake_store.length("lc-shared") == length


def test_a_log_written_by_someone_else_is_refused(fake_store: SessionStore) -> None:
    guard = ContextGuard(fake_store)
    guard.record_turn("lc-foreign", [{"role": "user", "content": "hi"}])
    agent = agent_for(guard, WindowedChatModel(requests=[], counts=[]))
    with pytest.raises(InvalidInput) as info:
        agent.invoke({"messages": [question(0)]}, config("lc-foreign"))
    assert info.value.field == "session_id"
    assert fake_store.length("lc-foreign") == 1


# -- the mapping ------------------------------------------------------------------------------
def test_untouched_messages_go_back_as_the_states_own_objects(
        fake_store: SessionStore) -> None:
    state: list[BaseMessage] = [
        HumanMessage("hello", id="h1"),
        AIMessage("", id="a1", tool_calls=[{"name": "lookup", "args": {"query": "x"},
                                             "id": "c1", "type": "tool_call"}],
                  additional_kwargs={"provider_detail": "kept"}),
        ToolMessage("result", tool_call_id="c1", id="t1"),
    ]
    neutral = to_neutral(state)
    assert [m.role for m in neutral] == ["user", "assistant", "tool"]
    guard = ContextGuard(fake_store)
    guard.record_turn("lc-map", neutral[:2])
    view = guard.prepare("lc-map", "be brief", pending=neutral[2:])
    system = SystemMessage("be brief")
    new_system, messages = from_view(view, state, system)
    assert new_system is system
    assert all(a is b for a, b in zip(messages, state, strict=True))


def test_to_neutral_names_the_bad_index() -> None:
    with pytest.raises(InvalidInput) as info:
        to_neutral([HumanMessage("ok"), "not a message"], start=5)
    assert info.value.field == "state.messages[6]"


@pytest.mark.parametrize("fully_summarized", [False, True])
def test_a_new_process_continues_the_session_from_the_store(
        fake_store: SessionStore, fully_summarized: bool) -> None:
    guard = ContextGuard(fake_store, overrides={MODEL: 40_000})
    checkpointer = InMemorySaver()
    model = WindowedChatModel(window=40_000, requests=[], counts=[])

    def agent() -> Any:  # a fresh middleware: no cursor in memory, as after a restart
        return create_agent(model, [lookup], system_prompt=SYSTEM, checkpointer=checkpointer,
                            middleware=[ContextGuardMiddleware(guard, max_tokens=256)])

    for i in range(3):
        agent().invoke({"messages": [question(i)]}, config("lc-restart"))
    if fully_summarized:  # a summary that covers the whole log: the view holds no message
        state = fake_store.state("lc-restart")
        record = SummaryRecord(watermark=12, kind="offline", text="all of it", tokens=5,
                               source_version=state.version)
        assert fake_store.commit_summary("lc-restart", record, state.version).ok
    out = agent().invoke({"messages": [question(3)]}, config("lc-restart"))
    assert len(out["messages"]) == 16
    assert fake_store.length("lc-restart") == 16


def test_a_summary_keeps_the_callers_system_blocks(fake_store: SessionStore) -> None:
    state: list[BaseMessage] = [HumanMessage("one", id="h1"), AIMessage("two", id="a1"),
                                HumanMessage("three", id="h2")]
    guard = ContextGuard(fake_store)
    guard.record_turn("lc-system", to_neutral(state[:2]))
    version = fake_store.state("lc-system").version
    record = SummaryRecord(watermark=2, kind="offline", text="they counted", tokens=5,
                           source_version=version)
    assert fake_store.commit_summary("lc-system", record, version).ok
    system = SystemMessage(content=[{"type": "text", "text": "be brief",
                                     "cache_control": {"type": "ephemeral"}}])
    view = guard.prepare("lc-system", "be brief", pending=to_neutral(state[2:], 2))
    new_system, messages = from_view(view, state, system)
    assert new_system is not None and isinstance(new_system.content, list)
    assert new_system.content[0] == system.content[0]  # the cached prefix, untouched
    assert SUMMARY_OPEN in str(new_system.content[1])
    assert messages == [state[2]] and messages[0] is state[2]
