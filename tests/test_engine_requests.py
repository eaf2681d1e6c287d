"""What the engine sends: the facts block once per compaction, each transcript rendered once."""

from __future__ import annotations

from typing import Any

from shared.core.facts import extract_facts
from shared.core.messages import Message, ToolCall
from workers.summarizer.counting import job_counter
from workers.summarizer.engine import PREFIX_HEADING, Completion, SummaryEngine

REPLY = "## Goal\n- fix src/app.py\n## Progress\n- started"


class Recorder:
    """An LLMClient that keeps every request and answers with a valid summary."""

    name = "recorder"
    model = "fake-model"
    context_window = 128_000

    def __init__(self) -> None:
        self.requests: list[list[dict[str, Any]]] = []

    def complete(self, messages: list[dict[str, Any]], max_output_tokens: int) -> Completion:
        self.requests.append(messages)
        return Completion(text=REPLY, input_tokens=100, output_tokens=10, model=self.model)


def body() -> list[Message]:
    return [
        Message(role="user", content="Fix the crash in src/app.py; never touch tests/."),
        Message(role="assistant", content="Reading it.", tool_calls=[
            ToolCall(id="c1", name="bash", arguments={"command": "cat src/app.py"})]),
        Message(role="tool", tool_call_id="c1", content="def main(): raise KeyError(42)\n" * 20),
    ]


def prefix() -> list[Message]:
    return [
        Message(role="user", content="Now also update docs/usage.md with ticket ABC-123."),
        Message(role="assistant", content="", tool_calls=[
            ToolCall(id="c2", name="bash", arguments={"command": "cat docs/usage.md"})]),
        Message(role="tool", tool_call_id="c2", content="# Usage\n" * 30),
    ]


def facts_blocks(client: Recorder) -> list[int]:
    return [sum("\n<facts>\n" in str(m["content"]) for m in request if m["role"] == "user")
            for request in client.requests]


def test_facts_go_out_once_with_a_split_turn() -> None:
    client = Recorder()
    messages = body() + prefix()
    ledger = extract_facts(messages)
    assert not ledger.is_empty()
    draft = SummaryEngine(client).summarize(body(), "## Goal\n- earlier", ledger,
                                            prefix=prefix(), start=10)
    assert facts_blocks(client) == [1, 0]  # the merge call carries them, the prefix call not
    assert PREFIX_HEADING in draft.text and "turn_prefix_summary" in draft.stages


def test_facts_go_with_the_prefix_when_it_is_the_only_call() -> None:
    client = Recorder()
    ledger = extract_facts(prefix())
    SummaryEngine(client).summarize([], None, ledger, prefix=prefix(), start=10)
    assert facts_blocks(client) == [1]


def test_a_passed_job_counter_is_the_one_used() -> None:
    client = Recorder()
    counter = job_counter(SummaryEngine(client).counter)
    msgs = body()
    counter.seed(msgs, [5, 5, 5])  # the quality gate's input size comes from these counts
    SummaryEngine(client).summarize(msgs, None, extract_facts(msgs), counter=counter)
    assert counter.messages(msgs) == counter.counter.messages([]) + 15
    assert len(client.requests) == 1
