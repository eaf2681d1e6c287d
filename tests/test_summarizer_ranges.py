"""Ranges larger than the summarizer's window, through the real openai client and a fake
server that refuses what overflows its window: the body and a split turn's prefix are both
folded chunk by chunk, and a fold interrupted midway keeps what it folded."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from shared.core.ledger import Ledger
from shared.core.messages import Message, ToolCall
from workers.harness.fakes.openai_server import FakeOpenAIServer
from workers.harness.fakes.summaries import SummarizerResponder
from workers.summarizer.engine import PREFIX_HEADING, SummaryEngine
from workers.summarizer.providers import OpenAIClient

WINDOW = 12_000


def long_turn(steps: int, start: int = 0) -> list[Message]:
    """One user message, then ``steps`` x (3 parallel read_file calls and their results)."""
    out = [Message(role="user", content="Audit every module of the project for dead code.")]
    for step in range(steps):
        calls = [ToolCall(id=f"c{start}_{step}_{k}", name="read_file",
                          arguments=json.dumps({"path": f"src/mod{step}_{k}.py"}))
                 for k in range(3)]
        out.append(Message(role="assistant", content="", tool_calls=calls))
        out.extend(Message(role="tool", tool_call_id=c.id,
                           content=f"# {c.arguments}\n" + "def unused():\n    return 1\n" * 40)
                   for c in calls)
    return out


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(window=WINDOW, responder=SummarizerResponder()) as fake:
        yield fake


def engine_for(server: FakeOpenAIServer) -> SummaryEngine:
    client = OpenAIClient("summ-12k", api_key="k", base_url=server.base_url, timeout=5,
                          context_window=WINDOW)
    return SummaryEngine(client, max_summary_tokens=1000)


def completions(server: FakeOpenAIServer) -> list[int]:
    return [r.status for r in server.requests if r.path.endswith("/chat/completions")]


def test_a_split_turns_prefix_larger_than_the_window_is_folded_chunk_by_chunk(
        server: FakeOpenAIServer) -> None:
    body = long_turn(2, start=1)
    prefix = long_turn(40)
    draft = engine_for(server).summarize(body, None, Ledger(), prefix=prefix)
    statuses = completions(server)
    assert draft.kind == "llm" and PREFIX_HEADING in draft.text
    assert "turn_prefix_summary" in draft.stages
    assert set(statuses) == {200}, statuses  # nothing sent past the window
    assert len(statuses) >= 3  # the body, then the prefix in several requests
