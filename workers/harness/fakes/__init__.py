"""Local fake LLM provider servers that the real SDKs talk to over HTTP.

``FakeOpenAIServer`` (OpenAI-compatible chat completions) and ``FakeGeminiServer``
(Gemini API and Vertex AI ``generateContent``) run on 127.0.0.1 with an ephemeral
port, count prompt tokens against a configurable window, answer with the
providers' real response and error shapes, inject faults on demand and record
every request. Used by the worker tests and by ``compaction replay``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from workers.harness.fakes.behaviour import (
    REFUSAL_TEXT,
    DefaultResponder,
    Fault,
    FaultPlan,
    Script,
    ScriptExhausted,
)
from workers.harness.fakes.counting import PromptCounter, char_counter, default_counter
from workers.harness.fakes.recording import RecordedRequest

if TYPE_CHECKING:
    from workers.harness.fakes.gemini_server import FakeGeminiServer
    from workers.harness.fakes.openai_server import FakeOpenAIServer

_SERVERS = {"FakeGeminiServer": "gemini_server", "FakeOpenAIServer": "openai_server"}


def __getattr__(name: str) -> Any:
    """The servers are imported on first use: a module imported by its package's
    ``__init__`` and then run with ``python -m`` (``python -m
    workers.harness.fakes.openai_server``) runs twice and Python warns about it."""
    module = _SERVERS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{module}"), name)

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
