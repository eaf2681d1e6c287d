"""The synchronous guard: view, budget, truncation, coalesced enqueue, recovery."""

from __future__ import annotations

import time
from typing import Any

import httpx
import openai
import pytest

from shared.config import CompactionPolicy, StoreConfig
from shared.enqueue import CallbackEnqueuer
from shared.errors import IrreducibleOverflow, StoreUnavailable
from shared.guard import ContextGuard
from shared.repair import validate_view
from shared.store import SessionStore, connect
from workers.fakes.openai_server import FakeOpenAIServer

SYSTEM = "You are a careful coding agent."


def coding_turn(i: int, output_chars: int = 4000) -> list[dict[str, Any]]:
    path = f"src/module_{i % 7}.py"
    return [
        {"role": "user", "content": f"Step {i}: look at {path} and fix the failing test."},
        {"role": "assistant", "content": "Reading the file.", "tool_calls": [
            {"id": f"call_{i}_a", "name": "read_file", "arguments": f'{{"path": "{path}"}}'},
            {"id": f"call_{i}_b", "name": "bash", "arguments": '{"command": "pytest -q"}'}]},
        {"role": "tool", "tool_call_id": f"call_{i}_a",
         "content": f"# {path}\n" + ("def f(x):\n    return x + 1\n" * (output_chars // 28))},
        {"role": "tool", "tool_call_id": f"call_{i}_b", "content": "1 failed, 41 passed"},
        {"role": "assistant", "content": f"Fixed the off-by-one in {path} (step {i})."},
    ]


class Recorder:
    def __init__(self) -> None:
        self.jobs: list[tuple[str, str]] = []

    def __call__(self, tenant: str, session_id: str) -> None:
        self.jobs.append((tenant, session_id))


@pytest.fixture
def jobs() -> Recorder:
    return Recorder()


@pytest.fixture
def guard(store: SessionStore, jobs: Recorder) -> ContextGuard:
    return ContextGuard(store, CallbackEnqueuer(jobs), overrides={"small-model": 8000})


def test_empty_session_view(guard: ContextGuard) -> None:
    view = guard.prepare("s", SYSTEM, max_tokens=500, model="small-model",
                         pending=[{"role": "user", "content": "hi"}])
    assert [m.role for m in view.messages] == ["system", "user"]
    assert view.report.budget.within_budget and not view.report.truncated
    assert view.report.limits_source == "override"


def test_record_turn_burst_enqueues_once(guard: ContextGuard, jobs: Recorder) -> None:
    for i in range(100):
        guard.record_turn("s", coding_turn(i, 100))
    assert jobs.jobs == [("default", "s")]
    guard.store.clear_pending("s")  # what the worker does when it starts
    guard.record_turn("s", coding_turn(100, 100))
    assert len(jobs.jobs) == 2


def test_over_budget_truncates_records_and_enqueues(guard: ContextGuard,
                                                    jobs: Recorder) -> None:
    for i in range(12):  # recent turns alone overflow: cheap stages cannot save it
        guard.store.append("s", coding_turn(i, 12_000))
    view = guard.prepare("s", SYSTEM, max_tokens=1000, model="small-model",
                         pending=[{"role": "user", "content": "continue"}])
    report = view.report
    assert report.truncated and report.dropped_messages > 0
    assert report.budget.within_budget
    assert jobs.jobs, "a job must be enqueued to replace the truncation"
    state = guard.store.state("s")
    assert state.summary_kind == "truncation" and state.watermark == report.watermark > 0
    assert state.force_requested == 1
    for provider in ("openai", "anthropic", "gemini"):
        assert validate_view(view.messages, provider) == []
    assert "dropped" in view.messages[0].text()
    # The next call starts from the recorded truncation: no new truncation needed.
    again = guard.prepare("s", SYSTEM, max_tokens=1000, model="small-model")
    assert not again.report.truncated and again.report.watermark == report.watermark


def test_irreducible_floor_is_a_clear_error(guard: ContextGuard) -> None:
    guard.store.append("s", coding_turn(0))
    with pytest.raises(IrreducibleOverflow, match="window"):
        guard.prepare("s", SYSTEM * 2000, max_tokens=1000, model="small-model")


def test_recover_learns_limit_and_compacts_to_a_fifth(store: SessionStore,
                                                      jobs: Recorder) -> None:
    guard = ContextGuard(store, CallbackEnqueuer(jobs), overrides={"m": 100_000})
    for i in range(12):
        store.append("s", coding_turn(i))
    request = httpx.Request("POST", "http://x/v1/chat/completions")
    body = {"error": {"message": "This model's maximum context length is 16000 tokens. "
                      "However, your messages resulted in 17000 tokens.",
                      "type": "invalid_request_error", "param": "messages",
                      "code": "context_length_exceeded"}}
    error = openai.BadRequestError("overflow", response=httpx.Response(
        400, request=request, json=body), body=body["error"])
    view = guard.recover("s", error, SYSTEM, max_tokens=1000, model="m")
    assert view is not None and view.report.recovery and view.report.truncated
    assert view.report.budget.window == 16000
    assert view.report.estimated_prompt_tokens <= 0.2 * 16000 + 200
    assert guard.model_limits("m").context_window == 16000
    rate = openai.RateLimitError("slow down", response=httpx.Response(
        429, request=request, json={"error": {"message": "Rate limit reached",
                                              "type": "requests", "code": "rate_limit_exceeded"}}),
        body=None)
    assert guard.recover("s", rate, SYSTEM, model="m") is None


def test_call_wrapper_recovers_once_against_a_real_sdk(store: SessionStore,
                                                       jobs: Recorder) -> None:
    guard = ContextGuard(store, CallbackEnqueuer(jobs), overrides={"gpt-4o": 128_000},
                         policy=CompactionPolicy(proactive=False))
    for i in range(10):
        store.append("s", coding_turn(i))
    with FakeOpenAIServer(window=6000) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0, timeout=10)

        def send(view: Any) -> Any:
            return client.chat.completions.create(model="gpt-4o", messages=view.openai(),
                                                  max_tokens=500)

        response, view = guard.call("s", send, system_prompt=SYSTEM, max_tokens=500,
                                    model="gpt-4o",
                                    pending=[{"role": "user", "content": "go on"}])
        statuses = [r.status for r in server.requests]
    assert statuses == [400, 200]
    assert view.report.recovery and response.choices[0].message.content is not None
    assert guard.model_limits("gpt-4o").context_window == 6000


def test_cheap_stages_keep_the_prefix_stable(store: SessionStore, jobs: Recorder) -> None:
    """Prefix changes per 100 turns: only when a batch of decisions (or compaction) lands."""
    guard = ContextGuard(store, CallbackEnqueuer(jobs), overrides={"m": 60_000})
    changes = 0
    previous: list[Any] | None = None
    for i in range(100):
        user = coding_turn(i, 2000)
        view = guard.prepare("s", SYSTEM, max_tokens=1000, model="m", pending=user[:1])
        sent = view.messages[:-1]
        if previous is not None and sent[: len(previous)] != previous:
            changes += 1
        previous = sent
        guard.record_turn("s", user, usage=None)
    assert 0 < changes <= 10, f"{changes} prefix changes in 100 turns"
    assert any(d.stage == "clear_tool_output"
               for d in guard.store.load_view("s").cheap.values()) or \
        guard.store.state("s").watermark > 0


def test_stats_reports_regions(guard: ContextGuard) -> None:
    guard.prepare("s", SYSTEM, max_tokens=500, model="small-model")
    guard.record_turn("s", coding_turn(0, 200))
    stats = guard.stats("s")
    assert stats["length"] == 5 and stats["regions"]["history"] > 0
    assert stats["regions"]["system"] > 0 and 0 < stats["usage_ratio"] < 1
    assert stats["pending_job"] is True


def test_redis_down_is_typed_and_bounded_with_local_fallback() -> None:
    cfg = StoreConfig(socket_timeout=0.2, connect_timeout=0.2)
    guard = ContextGuard(SessionStore(connect("redis://127.0.0.1:1/0", cfg), cfg),
                         overrides={"small-model": 8000})
    started = time.monotonic()
    with pytest.raises(StoreUnavailable):
        guard.prepare("s", SYSTEM, model="small-model")
    assert time.monotonic() - started < 2
    history = [m for i in range(12) for m in coding_turn(i)]
    view = guard.prepare("s", SYSTEM, max_tokens=1000, model="small-model",
                         fallback_messages=history)
    assert view.report.degraded and view.report.truncated
    assert view.report.budget.within_budget
    assert validate_view(view.messages, "openai") == []


def test_silent_truncation_is_flagged(guard: ContextGuard) -> None:
    for i in range(3):
        guard.store.append("s", coding_turn(i))
    view = guard.prepare("s", SYSTEM, max_tokens=500, model="small-model")
    assert view.report.estimated_prompt_tokens > 2000
    guard.record_turn("s", [{"role": "assistant", "content": "ok"}], usage={"prompt_tokens": 300})
    state = guard.store.state("s")
    assert state.silent_truncation_flags == 1 and state.recover_next == 1
    nxt = guard.prepare("s", SYSTEM, max_tokens=500, model="small-model")
    assert nxt.report.recovery
