"""Helpers of the fake-server tests (tests/test_fakes*.py); their fixtures are in conftest."""

from __future__ import annotations

from typing import Any

import httpx
import openai
from google import genai

from workers.harness.fakes import FakeGeminiServer, FakeOpenAIServer
from workers.harness.fakes.counting import FramedCounter
from workers.harness.transcripts import DATA_DIR, TRANSCRIPTS

TOKENIZER = DATA_DIR / "tokenizers" / "o200k_base.tiktoken"
TRANSCRIPTS_FILE = DATA_DIR / TRANSCRIPTS

try:  # google-genai sends through httpx2 (a drop-in httpx fork) when it is installed
    import httpx2

    HTTP_TIMEOUTS: tuple[type[Exception], ...] = (httpx.TimeoutException, httpx2.TimeoutException)
except ImportError:
    HTTP_TIMEOUTS = (httpx.TimeoutException,)

WORDS = FramedCounter(lambda text: len(text.split()), "words")  # predictable counts


def words(n: int) -> str:
    return " ".join(["word"] * n)


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def client_for(fake: FakeOpenAIServer, timeout: float = 5.0) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=fake.base_url, api_key="sk-secret", max_retries=0, timeout=timeout
    )


def ask(client: openai.OpenAI, messages: list[dict[str, Any]], **kw: Any) -> Any:
    return client.chat.completions.create(model="gpt-4o", messages=messages, **kw)  # type: ignore[arg-type]


def gemini_clients(fake: FakeGeminiServer, timeout_ms: int | None = None) -> dict[str, Any]:
    """One genai client per mode; keep the Client itself alive (its finalizer closes it)."""
    options = fake.http_options(timeout_ms)
    return {
        "api_key": genai.Client(api_key="secret-key", http_options=options),
        "vertex": genai.Client(vertexai=True, project="proj", location="us-central1",
                               credentials=fake.credentials(), http_options=options),
        "express": genai.Client(vertexai=True, api_key="secret-key", http_options=options),
    }
