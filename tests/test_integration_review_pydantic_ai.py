"""pydantic-ai as its users run it: response parts beyond text, thinking and tool calls.

A model with native tools (``WebSearchTool``, code execution: ``NativeToolCallPart`` and
``NativeToolReturnPart`` in its response), a provider's own compaction (``CompactionPart``)
or generated images (``FilePart``) answers with parts the capability must record: the run
must not fail after the model answered, and the next request must get the original
response back (the provider needs its ids and signatures). Real ``Agent`` and
``FunctionModel``; the guard on fakeredis.
"""

from __future__ import annotations

import secrets
from typing import Any

import fakeredis
import pytest

pytest.importorskip("pydantic_ai")

from pydantic_ai import Agent
from pydantic_ai import messages as pm
from pydantic_ai.models.function import AgentInfo, FunctionModel

from shared.core.config import StoreConfig
from shared.guard import ContextGuard
from shared.integrations.pydantic_ai import ContextGuardCapability
from shared.store.sessions import SessionStore

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 32


@pytest.fixture
def store() -> SessionStore:
    return SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="t" + secrets.token_hex(4)))


class Recorder:
    """A ``FunctionModel`` function answering with ``parts`` and keeping what it was sent."""

    def __init__(self, parts: list[Any]) -> None:
        self.parts = parts
        self.requests: list[list[pm.ModelMessage]] = []

    def __call__(self, messages: list[pm.ModelMessage], info: AgentInfo) -> pm.ModelResponse:
        self.requests.append(list(messages))
        return pm.ModelResponse(parts=list(self.parts))


def agent_for(store: SessionStore, model: Recorder, session: str) -> Agent[None, str]:
    guard = ContextGuard(store, overrides={"fn": 32_000})
    return Agent(FunctionModel(model, model_name="fn"), instructions="be brief",
                 capabilities=[ContextGuardCapability(guard, session_id=session)])


def test_native_tool_parts_are_recorded_and_sent_back_as_they_were(
        store: SessionStore) -> None:
    call = pm.NativeToolCallPart(tool_name="web_search", args={"query": "weather in Paris"},
                                 tool_call_id="ws_1", provider_name="openai")
    found = pm.NativeToolReturnPart(tool_name="web_search", tool_call_id="ws_1",
                                    content={"results": ["Paris: sunny, 24C"]},
                                    provider_name="openai")
    model = Recorder([call, found, pm.TextPart("It is sunny in Paris.")])
    agent = agent_for(store, model, "pai-native")
    first = agent.run_sync("Weather in Paris?")
    assert first.output == "It is sunny in Paris."
    agent.run_sync("And tomorrow?", message_history=first.all_messages())

    log = store.messages("pai-native", 0, store.length("pai-native"))
    assert [m.role for m in log] == ["user", "assistant", "user", "assistant"]
    assert log[1].text() == "It is sunny in Paris."  # the answer, no note in it
    assert "web_search" in (log[1].reasoning or "") and "Paris" in (log[1].reasoning or "")
    sent = model.requests[1]
    responses = [m for m in sent if isinstance(m, pm.ModelResponse)]
    assert responses == [first.all_messages()[1]]  # the original, native parts and all
    assert responses[0].parts[:2] == [call, found]


def test_a_generated_image_and_a_provider_compaction_do_not_fail_the_run(
        store: SessionStore) -> None:
    image = pm.FilePart(content=pm.BinaryContent(data=PNG, media_type="image/png"))
    compaction = pm.CompactionPart(content="Earlier: the user asked for a cat.",
                                   provider_name="anthropic")
    model = Recorder([compaction, pm.TextPart("Here is your cat."), image])
    agent = agent_for(store, model, "pai-image")
    first = agent.run_sync("Draw a cat")
    agent.run_sync("Make it orange", message_history=first.all_messages())

    log = store.messages("pai-image", 0, store.length("pai-image"))
    assert [m.role for m in log] == ["user", "assistant", "user", "assistant"]
    assert log[1].text() == "Here is your cat."
    reasoning = log[1].reasoning or ""
    assert "image/png" in reasoning and "Earlier: the user asked for a cat." in reasoning
    assert PNG.hex() not in reasoning  # the bytes are not copied into the log's text
    responses = [m for m in model.requests[1] if isinstance(m, pm.ModelResponse)]
    assert responses == [first.all_messages()[1]]


def test_generated_audio_does_not_fail_the_run(store: SessionStore) -> None:
    audio = pm.FilePart(content=pm.BinaryContent(data=b"RIFF" + b"\x00" * 40,
                                                 media_type="audio/wav"))
    model = Recorder([pm.TextPart("Here it is, read aloud."), audio])
    agent = agent_for(store, model, "pai-audio")
    first = agent.run_sync("Read me the poem")
    agent.run_sync("Slower, please", message_history=first.all_messages())

    log = store.messages("pai-audio", 0, store.length("pai-audio"))
    assert [m.role for m in log] == ["user", "assistant", "user", "assistant"]
    assert log[1].text() == "Here it is, read aloud."
    assert "audio/wav" in (log[1].reasoning or "")


def test_a_realtime_sessions_speech_is_recorded_as_its_transcripts(
        store: SessionStore) -> None:
    """A history from a realtime (voice) session holds ``SpeechPart``s: the user's spoken
    turns in requests, the model's in responses. pydantic-ai sends them to a standard model
    as a user prompt and a text part; the log records their transcripts the same way."""
    history: list[pm.ModelMessage] = [
        pm.ModelRequest(parts=[pm.SpeechPart(speaker="user", transcript="Book a table for two")]),
        pm.ModelResponse(parts=[pm.SpeechPart(speaker="assistant",
                                              transcript="Booked for 8 pm tonight.")]),
        pm.ModelRequest(parts=[pm.SpeechPart(speaker="user")]),  # no transcript kept
        pm.ModelResponse(parts=[pm.TextPart("Sorry, I did not catch that.")]),
    ]
    model = Recorder([pm.TextPart("Moved to 9 pm.")])
    agent = agent_for(store, model, "pai-speech")
    result = agent.run_sync("Make it 9 pm instead", message_history=history)
    assert result.output == "Moved to 9 pm."

    log = store.messages("pai-speech", 0, store.length("pai-speech"))
    assert [(m.role, m.text()) for m in log] == [
        ("user", "Book a table for two"), ("assistant", "Booked for 8 pm tonight."),
        ("user", "[speech without a transcript]"),
        ("assistant", "Sorry, I did not catch that."),
        ("user", "Make it 9 pm instead"), ("assistant", "Moved to 9 pm.")]
