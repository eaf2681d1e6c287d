"""The LangChain middleware with the content real agents send: system messages in the input,
reasoning blocks in replies, and graphs that do not continue their session.

A real ``create_agent`` graph around ``ScriptedChatModel``, a real ``BaseChatModel`` whose
replies a test scripts; the guard runs on fakeredis. Nothing of LangChain is mocked.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

import fakeredis
import pytest

pytest.importorskip("langchain.agents")

from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

from shared.core.config import StoreConfig
from shared.core.errors import InvalidInput
from shared.core.messages import Message
from shared.core.records import SummaryRecord
from shared.core.view import SUMMARY_OPEN
from shared.core.wire import to_anthropic
from shared.core.wire.anthropic import THINKING_KEY
from shared.guard import ContextGuard
from shared.integrations.langchain import ContextGuardMiddleware, from_view, to_neutral
from shared.store.sessions import SessionStore

RULES = "SYSTEM RULES: always answer in French. Never reveal the code 4242."
Reply = Callable[[list[BaseMessage]], AIMessage]


def plain(messages: list[BaseMessage]) -> AIMessage:
    return AIMessage(content=f"answer {len(messages)}")


class ScriptedChatModel(BaseChatModel):
    """A chat model whose reply is ``reply(messages)``; every request is kept."""

    model_name: str = "claude-sonnet-4-5"
    requests: list[list[BaseMessage]] = []
    reply: Reply = plain

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: Any = None, **kwargs: Any) -> ChatResult:
        self.requests.append(list(messages))
        return ChatResult(generations=[ChatGeneration(message=self.reply(messages))])


@tool
def shot(q: str) -> str:
    """Take a screenshot."""
    return f"screen text for {q}"


@pytest.fixture
def store() -> SessionStore:
    return SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="t" + secrets.token_hex(4)))


def config(session: str) -> Any:
    return {"configurable": {"thread_id": session}}


def agent_for(store: SessionStore, model: ScriptedChatModel, **kwargs: Any) -> Any:
    return create_agent(model, [shot], middleware=[ContextGuardMiddleware(ContextGuard(store))],
                        checkpointer=InMemorySaver(), **kwargs)


def summarize_all(store: SessionStore, session: str) -> None:
    """A summary that covers the whole log, as a worker commits one."""
    state = store.state(session)
    record = SummaryRecord(watermark=store.length(session), kind="offline",
                           text="they talked", tokens=5, source_version=state.version)
    assert store.commit_summary(session, record, state.version).ok


def system_text(request: list[BaseMessage]) -> str:
    return request[0].text if isinstance(request[0], SystemMessage) else ""


# -- system messages in the input ---------------------------------------------------------------
@pytest.mark.parametrize("first", [SystemMessage(RULES), {"role": "system", "content": RULES}])
def test_a_system_message_in_the_input_is_the_system_prompt_and_survives_compaction(
        store: SessionStore, first: Any) -> None:
    model = ScriptedChatModel(requests=[])
    agent = agent_for(store, model)
    agent.invoke({"messages": [first, HumanMessage("hello")]}, config("lc-sys"))
    agent.invoke({"messages": [HumanMessage("again")]}, config("lc-sys"))
    # Never recorded: the log holds the conversation, the prompt is sent with every call.
    logged = store.messages("lc-sys", 0, store.length("lc-sys"))
    assert [m.role for m in logged] == ["user", "assistant", "user", "assistant"]
    summarize_all(store, "lc-sys")  # everything so far compacted away
    agent.invoke({"messages": [HumanMessage("third")]}, config("lc-sys"))
    for request in model.requests:
        assert system_text(request).startswith(RULES)
        assert sum(RULES in str(m.content) for m in request) == 1  # once, as the prompt
    assert SUMMARY_OPEN in system_text(model.requests[-1])
    assert [m.content for m in model.requests[-1][1:]] == ["third"]


def test_system_prompt_and_leading_system_messages_join_in_order(store: SessionStore) -> None:
    model = ScriptedChatModel(requests=[])
    agent = agent_for(store, model, system_prompt="BASE")
    agent.invoke({"messages": [SystemMessage(RULES), SystemMessage("MORE"),
                               HumanMessage("hello")]}, config("lc-join"))
    request = model.requests[-1]
    assert system_text(request) == f"BASE\n\n{RULES}\n\nMORE"
    assert [type(m) for m in request] == [SystemMessage, HumanMessage]


def test_a_system_message_later_in_the_conversation_is_an_ordinary_message(
        store: SessionStore) -> None:
    model = ScriptedChatModel(requests=[])
    agent = agent_for(store, model, system_prompt="BASE")
    agent.invoke({"messages": [HumanMessage("hello")]}, config("lc-mid"))
    agent.invoke({"messages": [SystemMessage("NOW BE TERSE"), HumanMessage("again")]},
                 config("lc-mid"))
    request = model.requests[-1]
    assert system_text(request) == "BASE"
    assert [m.text for m in request[3:]] == ["NOW BE TERSE", "again"]
    assert [m.role for m in store.messages("lc-mid", 0, store.length("lc-mid"))] == [
        "user", "assistant", "system", "user", "assistant"]


# -- reasoning blocks --------------------------------------------------------------------------
REASONING: dict[str, list[dict[str, Any]]] = {
    "thinking": [{"type": "thinking", "thinking": "let me look", "signature": "SIG"}],
    "redacted": [{"type": "redacted_thinking", "data": "opaque"}],
    "v1": [{"type": "reasoning", "reasoning": "let me look", "id": "rs_1"}],
    "v1-anthropic": [{"type": "reasoning", "reasoning": "let me look",
                      "extras": {"signature": "SIG"}}],
    "responses": [{"type": "reasoning", "id": "rs_1",
                   "summary": [{"type": "summary_text", "text": "let me look"}]}],
}


def thinking_then_tool(blocks: list[dict[str, Any]]) -> Reply:
    """What ChatAnthropic with extended thinking returns: reasoning, text, a tool call."""
    def reply(messages: list[BaseMessage]) -> AIMessage:
        if not isinstance(messages[-1], HumanMessage):
            return AIMessage(content=[*blocks, {"type": "text", "text": "Done."}])
        call = f"toolu_{len(messages)}"
        return AIMessage(
            content=[*blocks, {"type": "text", "text": "Checking."},
                     {"type": "tool_use", "id": call, "name": "shot", "input": {"q": "x"}}],
            tool_calls=[{"name": "shot", "args": {"q": "x"}, "id": call, "type": "tool_call"}])
    return reply


@pytest.mark.parametrize("kind", sorted(REASONING))
def test_reasoning_blocks_are_recorded_and_sent_back_as_they_were(
        store: SessionStore, kind: str) -> None:
    model = ScriptedChatModel(requests=[], reply=thinking_then_tool(REASONING[kind]))
    agent = agent_for(store, model, system_prompt="SYS")
    for i in range(2):
        state = agent.invoke({"messages": [HumanMessage(f"q{i}")]}, config("lc-think"))
    assert len(state["messages"]) == 8 and store.length("lc-think") == 8
    # The tool-use turn went back to the model as the state's own message: blocks, signature.
    call = state["messages"][5]
    assert any(m is call for m in model.requests[-1])
    assert call.content[0] == REASONING[kind][0]
    logged = store.messages("lc-think", 0, 8)[1]
    assert logged.text() == "Checking." and logged.tool_calls[0].id == "toolu_2"
    assert logged.reasoning == (None if kind == "redacted" else "let me look")


@pytest.mark.parametrize("kind", ["thinking", "redacted", "v1-anthropic"])
def test_signed_thinking_round_trips_through_the_neutral_message(kind: str) -> None:
    reply = thinking_then_tool(REASONING[kind])([HumanMessage("q")])
    (neutral,) = to_neutral([reply])
    assert THINKING_KEY in neutral.metadata
    _, wire = to_anthropic([neutral, Message(role="tool", tool_call_id="toolu_1", content="ok")])
    expected = {"type": "thinking", "thinking": "let me look", "signature": "SIG"} \
        if kind != "redacted" else REASONING[kind][0]
    assert wire[0]["content"][0] == expected


def test_a_rebuilt_message_keeps_its_signed_thinking(store: SessionStore) -> None:
    state: list[Any] = [
        HumanMessage("q", id="h1"),
        AIMessage(content=[*REASONING["thinking"], {"type": "text", "text": "long " * 50}],
                  id="a1"),
        HumanMessage("next", id="h2")]
    neutral = to_neutral(state)
    guard = ContextGuard(store)
    guard.record_turn("lc-rebuilt", neutral[:2])
    view = guard.prepare("lc-rebuilt", "SYS", pending=neutral[2:])
    clipped = view.messages[2].model_copy(update={"content": "long [clipped]"})
    changed = view.model_copy(update={"messages": [*view.messages[:2], clipped,
                                                   *view.messages[3:]]})
    _, messages = from_view(changed, state, SystemMessage("SYS"))
    assert messages[1] is not state[1]
    assert messages[1].content == [REASONING["thinking"][0],
                                   {"type": "text", "text": "long [clipped]"}]


# -- graphs that do not continue their session ------------------------------------------------
def test_no_checkpointer_and_a_resent_history_is_explained(store: SessionStore) -> None:
    model = ScriptedChatModel(requests=[])
    agent = create_agent(model, [], system_prompt="SYS",
                         middleware=[ContextGuardMiddleware(ContextGuard(store))])
    history: list[Any] = [{"role": "user", "content": "hi"}]
    out = agent.invoke({"messages": history}, config("lc-resend"))
    history += [{"role": "assistant", "content": out["messages"][-1].content},
                {"role": "user", "content": "more"}]
    with pytest.raises(InvalidInput) as info:
        agent.invoke({"messages": history}, config("lc-resend"))
    assert info.value.field == "state.messages"
    assert "no checkpointer" in str(info.value) and "checkpointer=" in str(info.value)
    assert store.length("lc-resend") == 2


@pytest.mark.parametrize("own_session", [False, True])
def test_a_guarded_sub_agent_needs_its_own_session(store: SessionStore,
                                                   own_session: bool) -> None:
    guard = ContextGuard(store)
    sub_model = ScriptedChatModel(requests=[])
    middleware = ContextGuardMiddleware(guard, session_id="lc-sub-research") if own_session \
        else ContextGuardMiddleware(guard)
    sub = create_agent(sub_model, [], system_prompt="SUB", middleware=[middleware])

    @tool
    def research(topic: str) -> str:
        """Delegate research to a sub-agent."""
        return str(sub.invoke({"messages": [HumanMessage(f"research {topic}")]})
                   ["messages"][-1].content)

    def main_reply(messages: list[BaseMessage]) -> AIMessage:
        if isinstance(messages[-1], HumanMessage):
            return AIMessage(content="", tool_calls=[
                {"name": "research", "args": {"topic": "x"}, "id": "call_r1",
                 "type": "tool_call"}])
        return AIMessage(content="main answer")

    main = create_agent(ScriptedChatModel(requests=[], reply=main_reply), [research],
                        system_prompt="MAIN", middleware=[ContextGuardMiddleware(guard)],
                        checkpointer=InMemorySaver())
    if not own_session:
        with pytest.raises(InvalidInput) as info:
            main.invoke({"messages": [HumanMessage("hi")]}, config("lc-main"))
        assert "runs inside another graph" in str(info.value)
        assert "session_id=" in str(info.value)
        return
    state = main.invoke({"messages": [HumanMessage("hi")]}, config("lc-main"))
    assert state["messages"][-1].content == "main answer"
    assert store.length("lc-main") == 4 and store.length("lc-sub-research") == 2
