"""Local fake LLM provider servers that the real SDKs talk to over HTTP.

``FakeOpenAIServer`` (OpenAI-compatible chat completions) and ``FakeGeminiServer``
(Gemini API and Vertex AI ``generateContent``) run on 127.0.0.1 with an ephemeral
port, count prompt tokens against a configurable window, answer with the
providers' real response and error shapes, inject faults on demand and record
every request. Used by the worker tests and by ``compaction replay``.
"""

from __future__ import annotations

from workers.harness.fakes.behaviour import (
    REFUSAL_TEXT,
    DefaultResponder,
    Fault,
    FaultPlan,
    Script,
    ScriptExhausted,
)
from workers.harness.fakes.counting import PromptCounter, char_counter, default_counter
from workers.harness.fakes.gemini_server import FakeGeminiServer
from workers.harness.fakes.openai_server import FakeOpenAIServer
from workers.harness.fakes.recording import RecordedRequest

__all__ = [
    "REFUSAL_TEXT",
    "DefaultResponder",
    "FakeGeminiServer",
    "FakeOpenAIServer",
    "Fault",
    "FaultPlan",
    "PromptCounter",
    "RecordedRequest",
    "Script",
    "ScriptExhausted",
    "char_counter",
    "default_counter",
]
