"""Repair keeps an assistant message that is only hosted tool parts (a response that was
only a web search and its results, a provider's compaction item): the adapters send those
parts back, and the provider needs them (a compaction item holds the whole compacted
context). Dropped only when nothing of it would go on the wire (its parts' notes cleared:
see tests/test_hosted_cheap.py). Through the real adapters."""

from __future__ import annotations

import secrets
from typing import Any

import fakeredis
import pytest

from shared.core.config import StoreConfig
from shared.core.messages import Message
from shared.core.repair import repair_tool_pairs, validate_view
from shared.core.tokens import EXTRA_TOKENS
from shared.guard import ContextGuard
from shared.integrations.agents_items import items_to_messages, messages_to_items
from shared.store.sessions import SessionStore

pm = pytest.importorskip("pydantic_ai.messages")

SEARCH = {"type": "web_search_call", "id": "ws_1", "status": "completed",
          "action": {"type": "search", "query": "paris weather",
                     "sources": [{"type": "url", "url": f"https://example.com/{i}"}
                                 for i in range(200)]}}


def test_agents_a_turn_that_was_only_a_hosted_call_is_kept_and_sent() -> None:
    messages = items_to_messages([{"role": "user", "content": "weather?"}, SEARCH,
                                  {"role": "user", "content": "and tomorrow?"}])
    assert [m.role for m in messages] == ["user", "assistant", "user"]
    assert messages[1].text() == "" and messages[1].metadata[EXTRA_TOKENS] > 0
    repaired = repair_tool_pairs(messages)
    assert repaired == messages
    assert "web_search_call" in [i.get("type") for i in messages_to_items(repaired)]
    assert validate_view(repaired, "openai") == []


def test_a_message_whose_hosted_parts_were_cleared_is_dropped() -> None:
    messages = items_to_messages([{"role": "user", "content": "weather?"}, SEARCH,
                                  {"role": "user", "content": "and tomorrow?"}])
    cleared = messages[1].model_copy(update={"reasoning": "[hosted tool output cleared]",
                                             "metadata": {}})
    assert [m.role for m in repair_tool_pairs([messages[0], cleared, messages[2]])] \
        == ["user", "user"]
    assert [m.role for m in repair_tool_pairs([messages[0], Message(
        role="assistant", reasoning="thinking only"), messages[2]])] == ["user", "user"]


def _history() -> list[Any]:
    return [
        pm.ModelRequest(parts=[pm.UserPromptPart(content="Search the web for Paris.")]),
        pm.ModelResponse(parts=[
            pm.NativeToolCallPart(tool_name="web_search", args={"query": "paris"},
                                  tool_call_id="ws_1", provider_name="openai"),
            pm.NativeToolReturnPart(tool_name="web_search", tool_call_id="ws_1",
                                    content={"results": ["sunny " * 400]},
                                    provider_name="openai")], provider_name="openai"),
        pm.ModelRequest(parts=[pm.UserPromptPart(content="Now compact.")]),
        pm.ModelResponse(parts=[pm.CompactionPart(
            content=None, id="cmp_1", provider_name="openai",
            provider_details={"encrypted_content": "gAAAA" + "x" * 200})],
            provider_name="openai"),
    ]


def test_pydantic_ai_a_run_sends_the_native_only_and_compaction_responses() -> None:
    from pydantic_ai import Agent
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from shared.integrations.pydantic_ai import ContextGuardCapability

    store = SessionStore(fakeredis.FakeRedis(),
                         StoreConfig(key_prefix="hr" + secrets.token_hex(4)))
    requests: list[list[Any]] = []

    def answer(messages: list[Any], info: AgentInfo) -> Any:
        requests.append(list(messages))
        return pm.ModelResponse(parts=[pm.TextPart("It is sunny.")])

    guard = ContextGuard(store, overrides={"fn": 128_000})
    agent = Agent(FunctionModel(answer, model_name="fn"),
                  capabilities=[ContextGuardCapability(guard, session_id="pai")])
    agent.run_sync("And tomorrow?", message_history=_history())
    (sent,) = requests
    parts = [p for m in sent if isinstance(m, pm.ModelResponse) for p in m.parts]
    kinds = [type(p).__name__ for p in parts]
    assert kinds == ["NativeToolCallPart", "NativeToolReturnPart", "CompactionPart"], kinds


@pytest.mark.parametrize("reasoning, extra", [
    ("[web_search_call: {...}]", 900),  # counted hosted parts
    ("[provider compaction (opaque)]", None),  # sent with no figure
])
def test_the_pair_scan_agrees_that_a_hosted_only_message_needs_no_repair(
        reasoning: str, extra: int | None) -> None:
    """The guard skips the repair of a view whose pair scan is intact: a hosted-only
    message (kept by repair) is not blank to the scan either, from the model or from its
    stored JSON, else every call of such a session repaired its whole view."""
    from shared.core.pairs import pairs_intact, shape, stored_shape

    hosted = Message(role="assistant", content="", reasoning=reasoning,
                     metadata={EXTRA_TOKENS: extra} if extra else {})
    messages = [Message(role="user", content="weather?"), hosted,
                Message(role="user", content="and tomorrow?")]
    assert repair_tool_pairs(messages) == messages
    assert pairs_intact(messages)
    assert shape(hosted) == stored_shape(hosted.model_dump(mode="json"))
    cleared = hosted.model_copy(update={"reasoning": "[hosted tool output cleared]",
                                        "metadata": {}})
    assert not pairs_intact([messages[0], cleared, messages[2]])  # repair drops it
    assert shape(cleared) == stored_shape(cleared.model_dump(mode="json"))
