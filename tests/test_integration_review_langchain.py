"""The LangChain middleware as its users run it: server-side tools in the model's reply.

``ChatOpenAI`` on the Responses API with ``{"type": "web_search"}`` and ``ChatAnthropic``
with its web search or code execution tool answer with content blocks for the call the
provider ran itself (v1 ``server_tool_call`` / ``server_tool_result``, the Responses API's
``web_search_call``, Anthropic's ``server_tool_use`` / ``web_search_tool_result``). The
middleware must record such a reply, not fail the model call after the model answered, and
send it back as it was. A real ``create_agent`` graph over a chat model answering with those
blocks; the guard on fakeredis.
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

import fakeredis
import pytest

pytest.importorskip("langchain.agents")

from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from shared.core.config import StoreConfig
from shared.guard import ContextGuard
from shared.integrations.langchain import ContextGuardMiddleware
from shared.store.sessions import SessionStore

V1 = [{"type": "server_tool_call", "id": "ws_1", "name": "web_search",
       "args": {"query": "weather in Paris"}},
      {"type": "server_tool_result", "tool_call_id": "ws_1", "status": "success",
       "output": {"results": ["Paris: sunny, 24C"]}},
      {"type": "text", "text": "It is sunny."}]
RESPONSES = [{"type": "reasoning", "id": "rs_1", "summary": []},
             {"type": "web_search_call", "id": "ws_1", "status": "completed",
              "action": {"type": "search", "query": "weather in Paris"}},
             {"type": "text", "text": "It is sunny.", "annotations": []}]
ANTHROPIC = [{"type": "thinking", "thinking": "search it", "signature": "sig=="},
             {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search",
              "input": {"query": "weather in Paris"}},
             {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1",
              "content": [{"type": "web_search_result", "url": "https://example.com/paris",
                           "title": "Paris weather", "encrypted_content": "e" * 5000}]},
             {"type": "text", "text": "It is sunny.", "citations": []}]


class Replies(FakeMessagesListChatModel):
    """LangChain's own fake chat model, keeping what each call was sent."""

    sent: list[list[BaseMessage]] = []

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> Any:
        self.sent.append(list(messages))
        return super()._generate(messages, *args, **kwargs)


@pytest.fixture
def store() -> SessionStore:
    return SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="t" + secrets.token_hex(4)))


@pytest.mark.parametrize("blocks", [V1, RESPONSES, ANTHROPIC],
                         ids=["v1", "responses", "anthropic"])
@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_a_reply_with_server_tool_blocks_is_recorded_and_sent_back_as_it_was(
        store: SessionStore, blocks: list[dict[str, Any]], mode: str) -> None:
    model = Replies(responses=[AIMessage(content=blocks, id="ai-1"), AIMessage("Still sunny.")],
                    sent=[])
    guard = ContextGuard(store, overrides={"fake": 32_000})
    agent = create_agent(model, [], system_prompt="be brief", checkpointer=InMemorySaver(),
                         middleware=[ContextGuardMiddleware(guard, model="fake")])
    config: Any = {"configurable": {"thread_id": "lc-server"}}
    for text in ("Weather in Paris?", "Tomorrow?"):
        if mode == "invoke":
            agent.invoke({"messages": [HumanMessage(text)]}, config)
        else:
            asyncio.run(agent.ainvoke({"messages": [HumanMessage(text)]}, config))

    log = store.messages("lc-server", 0, store.length("lc-server"))
    assert [m.role for m in log] == ["user", "assistant", "user", "assistant"]
    assert log[1].text() == "It is sunny."
    notes = log[1].reasoning or ""
    if blocks is ANTHROPIC:  # signed thinking: its text stays exactly what was signed
        assert log[1].reasoning == "search it"
        notes = " ".join(log[1].metadata["lc_server_tools"])
    assert "weather in Paris" in notes and len(notes) < 2000
    replies = [m for m in model.sent[1] if isinstance(m, AIMessage)]
    assert len(replies) == 1 and replies[0].content == blocks  # the state's own message


ATTACHMENTS = [
    {"type": "text", "text": "Compare these."},
    {"type": "image", "file_id": "file-img1"},  # v1 standard: an image uploaded by id
    {"type": "file", "url": "https://example.com/spec.pdf", "mime_type": "application/pdf"},
    {"type": "text-plain", "text": "notes.txt says: ship on Friday", "mime_type": "text/plain"},
    {"type": "document", "source": {"type": "url", "url": "https://example.com/terms.pdf"}},
]


def test_user_attachments_chat_completions_cannot_carry_are_noted_not_refused(
        store: SessionStore) -> None:
    """LangChain v1 standard blocks (an image by ``file_id``, a file by URL, ``text-plain``)
    and Anthropic's ``document`` block, which providers other than Chat Completions take:
    refused, the message would stay in the thread's checkpoint and every later call of it
    would fail. The model gets the user's own message; the log a note of each."""
    model = Replies(responses=[AIMessage("Both say Friday."), AIMessage("Yes.")], sent=[])
    guard = ContextGuard(store, overrides={"fake": 32_000})
    agent = create_agent(model, [], checkpointer=InMemorySaver(),
                         middleware=[ContextGuardMiddleware(guard, model="fake")])
    config: Any = {"configurable": {"thread_id": "lc-attach"}}
    asked = HumanMessage(content=ATTACHMENTS, id="h-1")
    agent.invoke({"messages": [asked]}, config)
    agent.invoke({"messages": [HumanMessage("Sure?")]}, config)

    assert model.sent[0][-1] is asked or model.sent[0][-1].content == ATTACHMENTS
    assert model.sent[1][0].content == ATTACHMENTS
    log = store.messages("lc-attach", 0, store.length("lc-attach"))
    assert [m.role for m in log] == ["user", "assistant", "user", "assistant"]
    text = log[0].text()
    assert "Compare these." in text and "ship on Friday" in text
    for source in ("file-img1", "https://example.com/spec.pdf", "https://example.com/terms.pdf"):
        assert source in text
