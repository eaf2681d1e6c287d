"""Ranges larger than the summarizer's window, through the real openai client and a fake
server that refuses what overflows its window: the body and a split turn's prefix are both
folded chunk by chunk, and a fold interrupted midway keeps what it folded."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from shared.core.errors import SummarizerUnavailable
from shared.core.ledger import Ledger
from shared.core.messages import Message, ToolCall
from shared.core.tokens import DEFAULT_COUNTER
from shared.core.wire import from_openai
from shared.guard import ContextGuard
from shared.store.sessions import SessionStore
from tests.test_compactor import feed, turns_of
from workers.compactor import Compactor
from workers.harness.demo_session import generate_session
from workers.harness.fakes.behaviour import Fault
from workers.harness.fakes.openai_server import FakeOpenAIServer
from workers.harness.fakes.summaries import SummarizerResponder
from workers.summarizer.engine import PREFIX_HEADING, Completion, SummaryEngine
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


def backlog_compactor(store: SessionStore, server: FakeOpenAIServer) -> Compactor:
    """A session of 30 demo turns and a compactor whose summarizer reads ~7k tokens at once."""
    turns = turns_of(from_openai(generate_session(30))[1:])
    feed(store, turns)
    client = OpenAIClient("summ-6k", api_key="k", base_url=server.base_url, timeout=5,
                          context_window=9_000)
    return Compactor(store, SummaryEngine(client, max_summary_tokens=800))


def shown(server: FakeOpenAIServer, since: int = 0) -> list[int]:
    prompts = [r.body["messages"][1]["content"] for r in server.requests[since:]
               if r.path.endswith("/chat/completions") and r.status == 200]
    return [int(i) for p in prompts for i in re.findall(r'<message index="(\d+)"', p)]


def test_a_fold_cut_by_an_unavailable_summarizer_keeps_the_chunks_it_folded(
        store: SessionStore, server: FakeOpenAIServer) -> None:
    compactor = backlog_compactor(store, server)
    server.faults.at(2, Fault.unavailable())  # chunks 1 and 2 fold, the third fails
    with pytest.raises(SummarizerUnavailable):
        compactor.run("s", force=True, keep_recent=500)
    checkpoint = store.summaries("s")[-1]
    assert checkpoint.kind == "llm" and checkpoint.covers_from == 0
    assert 0 < checkpoint.watermark == max(shown(server)) + 1  # what the two chunks covered
    assert store.state("s").watermark == checkpoint.watermark
    sent = len(server.requests)
    again = compactor.run("s", force=True, keep_recent=500)  # the retry goes on from there
    assert again.status == "compacted" and again.summary_kind == "llm", again.reason
    assert min(shown(server, sent)) == checkpoint.watermark
    assert "<previous_summary>" in server.requests[sent].body["messages"][1]["content"]


def test_a_fold_past_its_deadline_keeps_the_chunks_it_folded(
        store: SessionStore, server: FakeOpenAIServer) -> None:
    compactor = backlog_compactor(store, server)
    engine = compactor.engine
    calls = 0
    complete = engine.client.complete  # type: ignore[union-attr]
    # the deadline passes during the second call, however slow a loaded machine makes the
    # first one (a 0.3 s deadline could pass during the first)
    deadline = time.monotonic() + 3.0

    def slow(messages: list[dict[str, Any]], max_output_tokens: int) -> Completion:
        nonlocal calls
        calls += 1
        if calls == 2:
            time.sleep(max(0.0, deadline - time.monotonic()) + 0.05)
        return complete(messages, max_output_tokens)

    engine.client.complete = slow  # type: ignore[union-attr, method-assign]
    with pytest.raises(SummarizerUnavailable, match="deadline"):
        compactor.run("s", force=True, keep_recent=500, deadline=deadline)
    checkpoint = store.summaries("s")[-1]
    assert calls == 2 and checkpoint.kind == "llm"
    assert checkpoint.watermark == max(shown(server)) + 1


def test_an_overflow_that_states_no_window_never_resends_the_same_request(
        server: FakeOpenAIServer) -> None:
    """The first refold halves the request that failed, not the budget it was under."""
    body = '{"error": {"message": "prompt is too long", "code": "context_length_exceeded"}}'
    server.faults.at(0, Fault.http_error(400, body))
    client = OpenAIClient("summ-128k", api_key="k", base_url=server.base_url, timeout=5,
                          context_window=128_000)
    draft = SummaryEngine(client, max_summary_tokens=1000).summarize(
        long_turn(6), None, Ledger())
    sent = [r for r in server.requests if r.path.endswith("/chat/completions")]
    sizes = [len(r.body["messages"][1]["content"]) for r in sent]
    assert [r.status for r in sent][:2] == [400, 200] and draft.kind == "llm"
    assert sizes[1] < sizes[0] * 0.75, sizes
    assert any(s.startswith("summarizer_overflow_refold_") for s in draft.stages)


def test_only_a_caller_that_commits_partial_folds_gets_one(server: FakeOpenAIServer) -> None:
    messages = long_turn(40)
    server.faults.at(1, Fault.unavailable())
    with pytest.raises(SummarizerUnavailable):
        engine_for(server).summarize(messages, None, Ledger())
    server.faults.at(len(server.requests) + 1, Fault.unavailable())  # the second chunk
    draft = engine_for(server).summarize(messages, None, Ledger(), keep_partial=True)
    assert isinstance(draft.interrupted, SummarizerUnavailable) and draft.calls == 1
    assert draft.covered is not None and 0 < draft.covered < len(messages)


def test_the_request_size_that_passed_after_an_unstated_overflow_is_kept_for_later_jobs(
        server: FakeOpenAIServer) -> None:
    body = '{"error": {"message": "prompt is too long", "code": "context_length_exceeded"}}'
    server.faults.at(0, Fault.http_error(400, body))
    client = OpenAIClient("summ-128k", api_key="k", base_url=server.base_url, timeout=5,
                          context_window=128_000)
    engine = SummaryEngine(client, max_summary_tokens=1000)
    engine.summarize(long_turn(6), None, Ledger())
    first = len(server.requests)
    biggest = max(len(r.body["messages"][1]["content"]) for r in server.requests[1:])
    engine.summarize(long_turn(6, start=1), None, Ledger())  # a later job, same worker
    later = server.requests[first:]
    assert all(r.status == 200 for r in later)
    assert max(len(r.body["messages"][1]["content"]) for r in later) <= biggest * 1.1


def steps_of(turn: list[Message], first: int, count: int) -> list[Message]:
    """Steps ``first``..``first + count - 1`` of a :func:`long_turn` (4 messages each)."""
    return turn[1 + 4 * first: 1 + 4 * (first + count)]


def test_a_turn_compacted_job_after_job_keeps_one_current_turn_section(
        server: FakeOpenAIServer) -> None:
    """Each job's range lies inside the same turn: the turn's summary is updated, not
    stacked, and the whole summary stays within the cap."""
    engine = engine_for(server)
    turn = long_turn(48)
    previous = engine.summarize([], None, Ledger(), prefix=turn[:1 + 4 * 6]).text
    for job in range(1, 8):
        sent = len(server.requests)
        previous = engine.summarize([], previous, Ledger(), prefix=steps_of(turn, 6 * job, 6),
                                    start=1 + 4 * 6 * job).text
        prompt = server.requests[sent].body["messages"][1]["content"]
        assert "<previous_summary>" in prompt  # the turn's summary so far, updated
        assert previous.count(PREFIX_HEADING) == 1, (job, previous)
        assert engine.counter.text(previous) <= engine.max_summary_tokens, job


def test_a_summary_with_turn_sections_stacked_earlier_is_merged_into_one(
        server: FakeOpenAIServer) -> None:
    engine = engine_for(server)
    earlier = "## Goal\n- audit the project\n## Progress\n- listed modules"
    stacked = (f"{earlier}\n\n{PREFIX_HEADING}\n### Turn request\n- audit\n\n"
               f"{PREFIX_HEADING}\n### Attempted\n- read src/mod0_0.py")
    text = engine.summarize([], stacked, Ledger(), prefix=steps_of(long_turn(8), 2, 6),
                            start=9).text
    prompt = server.requests[-1].body["messages"][1]["content"]
    assert "read src/mod0_0.py" in prompt and "- audit\n" in prompt  # both parts, one update
    assert "listed modules" not in prompt  # the earlier turns' summary is kept as it was
    room = engine.max_summary_tokens - engine.counter.text(f"{earlier}\n\n{PREFIX_HEADING}\n")
    assert f"at most about {room} tokens" in prompt  # what the rest leaves of the cap
    assert text.startswith(earlier) and text.count(PREFIX_HEADING) == 1


def test_one_long_turn_compacted_by_the_compactor_keeps_one_bounded_summary(
        store: SessionStore, server: FakeOpenAIServer) -> None:
    """A coding agent's single turn (one question, then only tool calls), a job after
    every few steps: each job's range lies inside the turn, whose summary is updated."""
    guard = ContextGuard(store, overrides={"gpt-4o": 8_000})
    compactor = Compactor(store, engine_for(server))
    turn = long_turn(60)
    guard.prepare("s", "You are a coding agent.", max_tokens=1000, model="gpt-4o",
                  pending=turn[:1])
    guard.record_turn("s", turn[:1])
    jobs = 0
    for step in range(60):
        guard.record_turn("s", steps_of(turn, step, 1))
        jobs += compactor.run("s").status == "compacted"
    text = store.summaries("s")[-1].text
    assert jobs >= 4, jobs
    assert text.count(PREFIX_HEADING) == 1, text
    assert DEFAULT_COUNTER.text(text) <= 1000


def test_a_message_too_large_for_any_request_is_clipped_not_sent_offline() -> None:
    """An 8k summarizer, a pasted log and a parallel read whose results fill a request
    each: they are clipped harder, head and tail, and the range is still summarized."""
    log_lines = "\n".join(f"2024-05-21 10:{i % 60:02d} worker-{i} retry {i} failed: "
                          "connection reset by peer" for i in range(400))
    pasted = f"FIRST-LINE BUG-4711\n{log_lines}\nLAST-LINE exit 137"
    calls = [ToolCall(id=f"r{k}", name="read_file", arguments=json.dumps({"path": f"m{k}.py"}))
             for k in range(4)]
    messages = [Message(role="user", content=f"Why does the job die? Log:\n{pasted}"),
                Message(role="assistant", content="Reading the workers.", tool_calls=calls),
                *(Message(role="tool", tool_call_id=c.id, content="x = compute()  # step\n" * 400)
                  for c in calls),
                Message(role="assistant", content="It is killed by the OOM killer.")]
    with FakeOpenAIServer(window=8_000, responder=SummarizerResponder()) as fake:
        client = OpenAIClient("summ-8k", api_key="k", base_url=fake.base_url, timeout=5,
                              context_window=8_000)
        draft = SummaryEngine(client, max_summary_tokens=2000).summarize(messages, None,
                                                                         Ledger())
        prompts = [r.body["messages"][1]["content"] for r in fake.requests]
        assert completions(fake) == [200] * len(prompts) and draft.kind == "llm"
    shown = "\n".join(prompts)
    assert "FIRST-LINE BUG-4711" in shown and "LAST-LINE exit 137" in shown
    assert "characters clipped" in shown and "OOM killer" in shown
    assert "clipped_oversized_units" in draft.stages
