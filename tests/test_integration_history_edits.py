"""Regenerate / edit the last turn under the LangChain middleware and the pydantic-ai
capability: the framework's history is a prefix of the session log followed by new
messages. Without ``rewind`` the refusal names the log edit (with its index); with
``rewind=True`` the adapter makes it and continues. Real ``create_agent`` graphs and
pydantic-ai ``Agent`` runs over the examples' test models, the real guard on fakeredis.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

import fakeredis
import pytest

pytest.importorskip("langchain.agents")
pytest.importorskip("pydantic_ai")

from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, RemoveMessage
from langgraph.checkpoint.memory import InMemorySaver

from examples.langchain_agent import WindowedChatModel
from examples.pydantic_ai_agent import WindowedModel, build_agent
from shared.core.config import StoreConfig
from shared.core.errors import InvalidInput
from shared.guard import ContextGuard
from shared.integrations.langchain import ContextGuardMiddleware
from shared.store.sessions import SessionStore


@pytest.fixture
def guard() -> ContextGuard:
    store = SessionStore(fakeredis.FakeRedis(),
                         StoreConfig(key_prefix="t" + secrets.token_hex(4)))
    return ContextGuard(store)


def reply(messages: Sequence[BaseMessage]) -> AIMessage:
    return AIMessage(content=f"re: {messages[-1].text}")


def lc(guard: ContextGuard, **kwargs: Any) -> tuple[Any, WindowedChatModel]:
    model = WindowedChatModel(window=100_000, requests=[], counts=[], reply=reply)
    agent = create_agent(model, [], system_prompt="Be brief.", checkpointer=InMemorySaver(),
                         middleware=[ContextGuardMiddleware(guard, **kwargs)])
    return agent, model


CFG = {"configurable": {"thread_id": "edits"}}


def regenerate(agent: Any) -> None:
    """Two turns, then the last one removed from the graph state (to ask it again)."""
    agent.invoke({"messages": [HumanMessage("one")]}, CFG)
    out = agent.invoke({"messages": [HumanMessage("two")]}, CFG)
    agent.update_state(CFG, {"messages": [RemoveMessage(id=m.id) for m in out["messages"][2:]]})


def test_langchain_refusal_names_the_log_edit(guard: ContextGuard) -> None:
    agent, _ = lc(guard)
    regenerate(agent)
    with pytest.raises(InvalidInput) as caught:
        agent.invoke({"messages": [HumanMessage("two, rephrased")]}, CFG)
    text = str(caught.value)
    assert "truncate_after('edits', 2)" in text and "rewind=True" in text
    assert "checkpointer" not in text  # not the misleading hint
    guard.store.truncate_after("edits", 2)  # the edit it names works
    out = agent.invoke({"messages": [HumanMessage("two, rephrased")]}, CFG)
    assert [m.text() for m in guard.store.messages("edits")] == [m.text for m in out["messages"]]


def test_langchain_rewind_edits_the_log_and_continues(guard: ContextGuard) -> None:
    agent, model = lc(guard, rewind=True)
    regenerate(agent)
    out = agent.invoke({"messages": [HumanMessage("two, rephrased")]}, CFG)
    assert [m.text for m in model.requests[-1] if m.type != "system"] == [
        "one", "re: one", "two, rephrased"]
    assert [m.text() for m in guard.store.messages("edits")] == [
        "one", "re: one", "two, rephrased", "re: two, rephrased"]
    assert [m.text for m in out["messages"]] == [m.text() for m in guard.store.messages("edits")]


def test_langchain_rewind_leaves_an_unrelated_state_refused(guard: ContextGuard) -> None:
    agent, _ = lc(guard, rewind=True)
    agent.invoke({"messages": [HumanMessage("one")]}, CFG)
    other, _ = lc(guard, rewind=True)  # a fresh graph on the same thread id: no common prefix
    with pytest.raises(InvalidInput, match="does not continue"):
        other.invoke({"messages": [HumanMessage("else")]}, CFG)
    assert [m.text() for m in guard.store.messages("edits")] == ["one", "re: one"]


def test_pydantic_ai_refusal_names_the_log_edit_and_rewind_makes_it(
        guard: ContextGuard) -> None:
    model = WindowedModel(window=100_000)
    agent = build_agent(guard, model, session_id="pai-edits")
    first = agent.run_sync("one").all_messages()
    second = agent.run_sync("two", message_history=first).all_messages()
    recorded = guard.store.length("pai-edits")
    with pytest.raises(InvalidInput) as caught:
        agent.run_sync("two, rephrased", message_history=first)
    at = [m.text() for m in guard.store.messages("pai-edits")].index("two")
    assert f"truncate_after('pai-edits', {at})" in str(caught.value)
    assert "rewind=True" in str(caught.value)
    assert guard.store.length("pai-edits") == recorded  # nothing written
    rewinding = build_agent(guard, model, session_id="pai-edits", rewind=True)
    third = rewinding.run_sync("two, rephrased", message_history=first).all_messages()
    users = [m.text() for m in guard.store.messages("pai-edits") if m.role == "user"]
    assert users == ["one", "two, rephrased"]
    assert len(second) == len(third)


def test_langchain_audio_is_logged_as_a_note_and_sent_as_it_is(guard: ContextGuard) -> None:
    """An audio block (LangChain v1 and OpenAI's input_audio) is logged as a text note, as
    pydantic-ai's capability does; the model gets the state's original message, and the
    thread keeps working (it used to raise on every later turn: the state held it)."""
    agent, model = lc(guard)
    audio = HumanMessage(content=[
        {"type": "text", "text": "what is said here?"},
        {"type": "audio", "base64": "UklGRiQAAABXQVZF", "mime_type": "audio/wav"},
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "mp3"}}])
    out = agent.invoke({"messages": [audio]}, CFG)
    sent = model.requests[-1][-1]
    assert sent.id == out["messages"][0].id  # the state's own message went out, audio in it
    assert [(b["type"], b.get("base64")) for b in sent.content] == [
        ("text", None), ("audio", "UklGRiQAAABXQVZF"), ("audio", "AAAA")]
    agent.invoke({"messages": [HumanMessage("and now?")]}, CFG)
    logged = guard.store.messages("edits")
    assert logged[0].text().startswith("what is said here?")
    assert "[audio attachment: audio/wav, 12 bytes, not kept in the history]" in logged[0].text()
    assert "[audio attachment: mp3, 3 bytes, not kept in the history]" in logged[0].text()
    assert [m.text() for m in logged[1:]] == ["re: what is said here?", "and now?", "re: and now?"]
