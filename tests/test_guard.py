"""The synchronous guard: view, budget, truncation, coalesced enqueue, recovery."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest
import redis

from shared.core.config import CompactionPolicy, StoreConfig
from shared.core.errors import (
    InvalidInput,
    IrreducibleOverflow,
    SessionNotFound,
    StoreUnavailable,
)
from shared.core.limits import LimitBook
from shared.core.messages import ImagePart, Message, TextPart
from shared.core.records import AppendResult, SummaryRecord
from shared.core.repair import EMPTY_USER_TEXT, validate_view
from shared.enqueue import CallbackEnqueuer
from shared.guard import ContextGuard
from shared.store.sessions import SessionStore, connect
from tests.guard_shells import Recorder
from workers.harness.fakes.openai_server import FakeOpenAIServer
from workers.harness.stack.redis_server import ReplyDroppingProxy

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


def test_empty_session_view(guard: ContextGuard) -> None:
    view = guard.prepare("s", SYSTEM, max_tokens=500, model="small-model",
                         pending=[{"role": "user", "content": "hi"}])
    assert [m.role for m in view.messages] == ["system", "user"]
    assert view.report.budget.within_budget and not view.report.truncated
    assert view.report.limits_source == "override"


def test_a_blank_newest_user_message_is_kept_for_the_model_to_answer(
        guard: ContextGuard) -> None:
    """A user who sends only whitespace still took a turn: without it the view would end
    with the assistant's message (answered by itself; on Anthropic, continued as a prefill)."""
    guard.record_turn("s", [{"role": "user", "content": "hi"},
                            {"role": "assistant", "content": "Hello! What next?"}])
    for blank in ("", "  \n"):
        view = guard.prepare("s", SYSTEM, max_tokens=500, model="small-model",
                             pending=[{"role": "user", "content": blank}])
        assert view.openai()[-1] == {"role": "user", "content": EMPTY_USER_TEXT}
        assert view.anthropic()[1][-1] == {"role": "user", "content": EMPTY_USER_TEXT}
        assert view.gemini()[1][-1] == {"role": "user", "parts": [{"text": EMPTY_USER_TEXT}]}
        for provider in ("openai", "anthropic", "gemini"):
            assert validate_view(view.messages, provider) == []
    guard.record_turn("s", [{"role": "user", "content": " "},
                            {"role": "assistant", "content": "Did you mean to send something?"}])
    view = guard.prepare("s", SYSTEM, max_tokens=500, model="small-model",
                         pending=[{"role": "user", "content": "yes"}])
    assert [m["content"] for m in view.openai()[1:]] == [
        "hi", "Hello! What next?", EMPTY_USER_TEXT, "Did you mean to send something?", "yes"]


def test_a_pending_result_of_a_recorded_call_whose_id_was_renamed_reaches_the_view(
        guard: ContextGuard) -> None:
    """Positional ids repeat across turns, so the append renames a call; an agent that
    records the call before its result (a framework recording each message) then passes
    the result with the provider's id. It used to be dropped as an orphan, the call
    answered "[tool result missing ...]": the model never saw the tool's output."""
    def call(text: str) -> dict[str, Any]:
        return {"role": "assistant", "content": text, "tool_calls": [
            {"id": "call_1", "name": "bash", "arguments": '{"command": "ls"}'}]}

    guard.record_turn("s", [{"role": "user", "content": "list"}, call("first"),
                            {"role": "tool", "tool_call_id": "call_1", "content": "a.py"},
                            {"role": "assistant", "content": "a.py"}])
    guard.record_turn("s", [{"role": "user", "content": "again"}, call("second")])
    result = {"role": "tool", "tool_call_id": "call_1", "content": "a.py b.py"}
    for _ in range(2):  # the turn's first call, and the next one of the chain
        view = guard.prepare("s", SYSTEM, max_tokens=500, model="small-model",
                             pending=[result])
        wire = view.openai()
        assert wire[-1]["content"] == "a.py b.py"
        assert wire[-1]["tool_call_id"] == wire[-2]["tool_calls"][0]["id"]
        assert not any("tool result missing" in str(m.get("content")) for m in wire)
    guard.record_turn("s", [result, {"role": "assistant", "content": "two files"}])
    wire = guard.prepare("s", SYSTEM, max_tokens=500, model="small-model").openai()
    assert [m.get("content") for m in wire[-3:]] == ["second", "a.py b.py", "two files"]
    assert not any("tool result missing" in str(m.get("content")) for m in wire)


def test_a_session_truncated_every_turn_still_calibrates(guard: ContextGuard) -> None:
    """No worker yet, every prepare truncates: its usage report describes the view sent at
    the version the truncation made. It was dropped as stale (the version moved), so such
    a session never calibrated and an estimate short of the provider's count overflowed
    on every turn."""
    truncated = 0
    for i in range(6):
        turn = coding_turn(i, 12_000)
        view = guard.prepare("s", SYSTEM, max_tokens=1000, model="small-model",
                             pending=turn[:1])
        truncated += view.report.truncated
        reported = int(view.report.estimated_prompt_tokens * 1.1)  # the provider counts more
        guard.record_turn("s", turn, usage={"prompt_tokens": reported})
    state = guard.store.state("s")
    assert truncated >= 3 and state.calibration_samples >= 5, (truncated, state)


def test_a_turn_retried_after_a_failed_append_still_calibrates(guard: Any) -> None:
    """The append failed (Redis did not answer; in the async shell, the task was
    cancelled: tests/test_async_cancel.py): the request its usage describes was
    forgotten all the same, so the agent's retry with the same usage taught nothing."""
    turn = coding_turn(0, 2000)
    view = guard.prepare("s", SYSTEM, model="small-model", pending=turn[:1])
    usage = {"prompt_tokens": int(view.report.estimated_prompt_tokens * 1.1)}
    inner = getattr(guard, "inner", guard)  # the async shell's guard
    perform, failures = inner.perform, [1, 1]

    def failing(io: Any) -> Any:
        if io.method == "append_encoded" and failures:
            failures.pop()
            raise StoreUnavailable("redis unavailable during append: connection refused")
        return perform(io)

    inner.perform = failing
    with pytest.raises(StoreUnavailable):
        guard.record_turn("s", turn, usage=usage)
    assert guard.record_turn("s", turn, usage=usage) == 5
    assert guard.store.state("s").calibration_samples == 1


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


def test_a_truncating_chain_requests_its_forced_job_once(guard: ContextGuard,
                                                         jobs: Recorder) -> None:
    """Each call of a tool chain that overflows truncates; the forced job it asks for is
    asked once, not written and read back on every call."""
    writes: list[dict[str, object]] = []
    store = getattr(guard, "inner", guard).store  # the async shell's own store
    update = store.update_state

    def spy(session_id: str, **fields: object) -> object:
        writes.append(fields)
        return update(session_id, **fields)  # a coroutine for the async store
    store.update_state = spy
    own = getattr(guard, "inner", guard).own  # writes on the own-writes connection too
    if own is not None:
        run_many = own.run_many

        def spy_own(base: str, steps: list[Any]) -> Any:
            writes.extend({"force_requested": 1} for step in steps
                          if isinstance(step, tuple) and "force_requested" in step)
            return run_many(base, steps)
        own.run_many = spy_own
    guard.record_turn("s", coding_turn(9, 100))  # a job has something stored to compact
    turn = coding_turn(0, 12_000) + coding_turn(1, 12_000)[1:] + coding_turn(2, 12_000)[1:]
    calls = [i for i, m in enumerate(turn) if m["role"] == "assistant"]
    reports = [guard.prepare("s", SYSTEM, max_tokens=1000, model="small-model",
                             pending=turn[:i]).report for i in calls[1:]]
    assert [r.truncated for r in reports] == [False, False, True, True, True]
    assert reports[-1].pending_job
    assert [w for w in writes if "force_requested" in w] == [{"force_requested": 1}]
    assert jobs.jobs == [("default", "s")]
    assert guard.store.state("s").force_requested == 1


def test_a_new_sessions_first_turn_asks_no_job_until_it_is_recorded(
        guard: ContextGuard, jobs: Recorder) -> None:
    """Nothing is stored yet: a job would find no session. Each truncating call of a long
    first turn asked for one, the worker's claim clearing the flag for the next call to set
    again; the turn's record asks once the stored log is due."""
    turn = coding_turn(0, 12_000) + coding_turn(1, 12_000)[1:] + coding_turn(2, 12_000)[1:]
    calls = [i for i, m in enumerate(turn) if m["role"] == "assistant"]
    truncated = []
    for i in calls[1:]:
        view = guard.prepare("s", SYSTEM, max_tokens=1000, model="small-model",
                             pending=turn[:i])
        truncated.append(view.report.truncated)
        guard.store.clear_pending("s")  # a worker claiming whatever job was asked
    assert truncated == [False, False, True, True, True]
    assert jobs.jobs == []
    guard.record_turn("s", turn)
    assert jobs.jobs == [("default", "s")]


def test_irreducible_floor_is_a_clear_error(guard: ContextGuard) -> None:
    guard.store.append("s", coding_turn(0))
    with pytest.raises(IrreducibleOverflow, match="window"):
        guard.prepare("s", SYSTEM * 2000, max_tokens=1000, model="small-model")


def test_recover_learns_limit_and_compacts_to_a_fifth(make_guard: Callable[..., Any],
        store: SessionStore,
                                                      jobs: Recorder) -> None:
    guard = make_guard(store, CallbackEnqueuer(jobs), overrides={"m": 100_000})
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
    # learned for the session (its state, which every process reads), not for every
    # session of a model whose window the caller configured
    assert store.state("s").learned_window == 16000
    assert guard.model_limits("m", store.state("s")).context_window == 16000
    assert guard.model_limits("m").context_window == 100_000
    rate = openai.RateLimitError("slow down", response=httpx.Response(
        429, request=request, json={"error": {"message": "Rate limit reached",
                                              "type": "requests", "code": "rate_limit_exceeded"}}),
        body=None)
    assert guard.recover("s", rate, SYSTEM, model="m") is None


def test_a_window_stated_in_thousands_is_learned_and_a_misparse_never_is(
        make_guard: Callable[..., Any], store: SessionStore) -> None:
    """"128k" is 128,000 tokens; a figure no window can be (a misparse, e.g. of
    "1.048.576") is neither learned nor stored, and one an older version stored in the
    session's state is not used: it would truncate every later view to nothing."""
    guard = make_guard(store, overrides={"m": 100_000})
    for i in range(12):
        store.append("s", coding_turn(i))
    view = guard.recover("s", RuntimeError("Input exceeds the maximum context length of 32k "
                                           "tokens"), SYSTEM, max_tokens=1000, model="m")
    assert view is not None and view.report.budget.window == 32_000
    assert store.state("s").learned_window == 32_000
    store.update_state("s", learned_window=0)
    refused = make_guard(store, overrides={"m": 100_000}).prepare(
        "s", SYSTEM, max_tokens=1000, model="m").report
    guard = make_guard(store, overrides={"m": 100_000})  # another process recovers
    assert refused.budget.window == 100_000
    view = guard.recover("s", RuntimeError("maximum context length is 1.048.576 tokens"),
                         SYSTEM, max_tokens=1000, model="m")
    # the refused request bounds the window (as an error stating none), not the misparse
    assert view is not None and view.report.budget.window == refused.estimated_prompt_tokens
    assert store.state("s").learned_window == refused.estimated_prompt_tokens
    assert guard.limits.get("m") is None
    store.update_state("s", learned_window=1, model="m")  # written before the check
    assert guard.prepare("s", SYSTEM, max_tokens=1000, model="m").report.budget.window \
        == 100_000


def test_an_overflow_never_raises_the_window(make_guard: Callable[..., Any],
                                             store: SessionStore) -> None:
    """A stated figure above the window the refused request was made for is another number
    of the text (a string's length in characters) or a misparse: believing it would send
    larger requests after a refusal. The refused request bounds the window instead (for
    every session of a model whose window was a guess)."""
    guard = make_guard(store)
    for i in range(12):
        store.append("s", coding_turn(i))
    sent = guard.prepare("s", SYSTEM, max_tokens=1000, model="m").report.estimated_prompt_tokens
    view = guard.recover("s", RuntimeError("This model's maximum context length is 1000000 "
                                           "tokens. Please reduce the length of the messages."),
                         SYSTEM, max_tokens=1000, model="m")
    assert view is not None and view.report.budget.window == sent
    assert guard.limits.get("m") == sent == store.state("s").learned_window


class StatusError(Exception):
    def __init__(self, message: str, status_code: int) -> None:
        super().__init__(message)
        self.status_code = status_code


def _filled(make_guard: Callable[..., Any], store: SessionStore, fill: float,
            **kw: Any) -> tuple[Any, int]:
    """A guard whose last request for "s" was ``fill`` of the window (prompt + reserve)."""
    for i in range(6):
        store.append("s", coding_turn(i, 2000))
    probe = make_guard(store, overrides={"m": 1_000_000})
    sent = probe.prepare("s", SYSTEM, max_tokens=1000, model="m").report.estimated_prompt_tokens
    window = int((sent + 1000) / fill)
    guard = make_guard(store, overrides={"m": window},
                       policy=kw.pop("policy", CompactionPolicy(proactive=False)), **kw)
    assert guard.prepare("s", SYSTEM, max_tokens=1000, model="m").report.estimated_prompt_tokens \
        == sent
    return guard, window


UNKNOWN = StatusError("Error code: 400 - {'error': {'message': 'Request could not be "
                      "processed by the inference engine.'}}", 400)


def test_an_error_nothing_recognises_refusing_a_nearly_full_request_is_recovered(
        make_guard: Callable[..., Any], store: SessionStore) -> None:
    """A provider's overflow worded in a way no pattern knows (a fifth to a third of new
    wordings, BENCHMARKS.md): the refused request was 95% of the window, so the guard takes
    it for one and compacts to the target ratio; it learns no window from it."""
    guard, window = _filled(make_guard, store, 0.95)
    view = guard.recover("s", UNKNOWN, SYSTEM, max_tokens=1000, model="m")
    assert view is not None and view.report.truncated
    assert view.report.estimated_prompt_tokens <= 0.5 * window
    assert guard.limits.get("m") is None and store.state("s").learned_window == 0


@pytest.mark.parametrize(("error", "fill"), [
    (UNKNOWN, 0.5),  # far from the window: not an overflow
    (StatusError("Rate limit reached for requests", 429), 0.95),  # recognised: not one
    (StatusError("The model `m` does not exist", 404), 0.95),  # a lookup failure
    (StatusError("Invalid 'temperature': decimal above maximum value.", 400), 0.95),
    (StatusError("InvalidParameter: Invalid base64 image_url", 400), 0.95),
    (StatusError("the message at position 4 with role 'assistant' must not be empty", 400),
     0.95),
])
def test_other_errors_are_not_taken_for_an_overflow(make_guard: Callable[..., Any],
        store: SessionStore, error: Exception, fill: float) -> None:
    guard, _ = _filled(make_guard, store, fill)
    assert guard.recover("s", error, SYSTEM, max_tokens=1000, model="m") is None


def test_unrecognised_errors_can_be_left_to_the_caller(make_guard: Callable[..., Any],
                                                       store: SessionStore) -> None:
    guard, window = _filled(make_guard, store, 0.95,
                            policy=CompactionPolicy(proactive=False, unrecognised_overflow_at=None))
    assert guard.recover("s", UNKNOWN, SYSTEM, max_tokens=1000, model="m") is None
    # another process prepared the refused request: its size comes with the call
    fresh = make_guard(store, overrides={"m": window})
    sent = int(0.95 * window) - 1000
    assert fresh.recover("s", UNKNOWN, SYSTEM, max_tokens=1000, model="m",
                         prepared_tokens=sent) is not None
    assert fresh.recover("s", UNKNOWN, SYSTEM, max_tokens=1000, model="m") is None


@pytest.mark.parametrize(("error", "excess"), [
    ("the request exceeds the available context size, try increasing it", 0),  # llama.cpp
    ('{"error":"prompt too long; exceeded max context length by 40 tokens"}', 40),  # Ollama
])
def test_an_overflow_that_states_no_window_is_bounded_by_the_refused_request(
        make_guard: Callable[..., Any], store: SessionStore, error: str, excess: int) -> None:
    """A server started with less context than the model has (llama.cpp's default, Ollama's
    num_ctx): the refused request, which the guard made to fit the window it knew, bounds
    the real one; the retry fits that bound and so do the next calls. The model's window
    was a guess (``fallback``), so the bound holds for its other sessions too; where the
    caller (or the registry) knows the window, it holds for the refused session only."""
    guard = make_guard(store)
    for i in range(12):
        store.append("s", coding_turn(i))
    refused = guard.prepare("s", SYSTEM, max_tokens=1000, model="m")
    sent = refused.report.estimated_prompt_tokens
    assert 20_000 < sent < 100_000
    view = guard.recover("s", RuntimeError(error), SYSTEM, max_tokens=1000, model="m")
    assert view is not None and view.report.budget.window == sent - excess
    assert view.report.estimated_prompt_tokens <= 0.2 * (sent - excess) + 200
    assert store.state("s").learned_window == sent - excess == guard.limits.get("m")
    later = guard.prepare("s", SYSTEM, max_tokens=1000, model="m")
    assert later.report.budget.window == sent - excess
    # another model's overflow, or a refusal of the body's bytes, teaches this one nothing
    other = make_guard(store, overrides={"m": 100_000, "n": 100_000})
    other.prepare("s", SYSTEM, max_tokens=1000, model="n")
    other.recover("s", RuntimeError(error), SYSTEM, max_tokens=1000, model="m")
    assert other.limits.get("m") is None
    known = make_guard(store, overrides={"m": 100_000})
    known.prepare("s", SYSTEM, max_tokens=1000, model="m")
    store.update_state("s", learned_window=0)
    view = known.recover("s", RuntimeError(error), SYSTEM, max_tokens=1000, model="m")
    assert view is not None and store.state("s").learned_window == view.report.budget.window
    assert view.report.budget.window < 100_000 and known.limits.get("m") is None
    for i in range(12):
        store.append("big", coding_turn(i))
    other.prepare("big", SYSTEM, max_tokens=1000, model="m")
    assert other.recover("big", RuntimeError("413 Request Entity Too Large"), SYSTEM,
                         max_tokens=1000, model="m") is not None
    assert other.limits.get("m") is None


def test_the_refused_size_can_come_from_the_process_that_prepared_it(
        make_guard: Callable[..., Any], store: SessionStore) -> None:
    """A guard that did not prepare the refused view (another server process) takes its
    estimate from the caller; a stated window still wins, and a bad figure is refused."""
    for i in range(12):
        store.append("s", coding_turn(i))
    quiet = RuntimeError("the request exceeds the available context size, try increasing it")
    guard = make_guard(store, overrides={"m": 100_000})
    with pytest.raises(InvalidInput, match="prepared_tokens"):
        guard.recover("s", quiet, SYSTEM, max_tokens=1000, model="m", prepared_tokens=0)
    assert store.state("s").learned_window == 0  # nothing written
    view = guard.recover("s", quiet, SYSTEM, max_tokens=1000, model="m",
                         prepared_tokens=30_000)
    assert view is not None and view.report.budget.window == 30_000
    stated = RuntimeError("maximum context length is 20000 tokens, you requested 29000")
    fresh = make_guard(store, overrides={"m": 100_000})
    view = fresh.recover("s", stated, SYSTEM, max_tokens=1000, model="m",
                         prepared_tokens=25_000)
    assert view is not None and view.report.budget.window == 20_000


def test_the_callers_refused_size_wins_over_an_old_prepare_of_this_process(
        make_guard: Callable[..., Any], store: SessionStore) -> None:
    """Two processes serve the session: this one prepared its first turn only. The refused
    request, many turns later, was prepared by the other one; the caller's figure bounds
    the window, not this process's stale (and much smaller) last prepare."""
    here = make_guard(store, overrides={"m": 100_000})
    there = make_guard(store, overrides={"m": 100_000})
    store.append("s", coding_turn(0))
    early = here.prepare("s", SYSTEM, max_tokens=1000, model="m")
    for i in range(1, 12):
        store.append("s", coding_turn(i))
    refused = there.prepare("s", SYSTEM, max_tokens=1000, model="m")
    sent = refused.report.estimated_prompt_tokens
    assert early.report.estimated_prompt_tokens * 5 < sent
    quiet = RuntimeError("the request exceeds the available context size, try increasing it")
    view = here.recover("s", quiet, SYSTEM, max_tokens=1000, model="m", prepared_tokens=sent)
    assert view is not None and view.report.budget.window == sent
    assert store.state("s").learned_window == sent


def test_limits_seen_follow_the_book(make_guard: Callable[..., Any], store: SessionStore,
                                     ) -> None:
    """The guard keeps the limits it resolved per model; a limit learned or forgotten, or
    another book put in place, is seen by the very next call."""
    guard = make_guard(store, overrides={"m": 100_000})
    assert guard.model_limits("m").context_window == 100_000
    version = guard.limits.version
    assert guard.limits.learn("m", 16_000) and guard.limits.version == version + 1
    assert not guard.limits.learn("m", 20_000) and guard.limits.version == version + 1
    assert guard.model_limits("m").context_window == 16_000
    assert guard.limits.forget("m") and not guard.limits.forget("m")
    assert guard.model_limits("m").context_window == 100_000
    shell = getattr(guard, "inner", guard)  # the async guard behind its test driver
    shell.limits = LimitBook({"m": 9_000})  # a book of the same version, in its place
    assert guard.limits.version == version + 1
    assert guard.model_limits("m").context_window == 9_000


def test_call_wrapper_recovers_once_against_a_real_sdk(make_guard: Callable[..., Any],
        store: SessionStore,
                                                       jobs: Recorder) -> None:
    guard = make_guard(store, CallbackEnqueuer(jobs), overrides={"gpt-4o": 128_000},
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
    assert guard.model_limits("gpt-4o", store.state("s")).context_window == 6000
    assert guard.model_limits("gpt-4o").context_window == 128_000  # the session's alone


def test_cheap_stages_keep_the_prefix_stable(make_guard: Callable[..., Any],
        store: SessionStore, jobs: Recorder) -> None:
    """Prefix changes per 100 turns: only when a batch of decisions (or compaction) lands."""
    guard = make_guard(store, CallbackEnqueuer(jobs), overrides={"m": 60_000})
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
    turn = coding_turn(0, 200)
    # the first turn's prepare writes the request's figures (a probe of a session with
    # nothing stored and nothing pending writes none)
    guard.prepare("s", SYSTEM, max_tokens=500, model="small-model", pending=turn[:1])
    guard.record_turn("s", turn)
    stats = guard.stats("s")
    assert stats["length"] == 5 and stats["regions"]["history"] > 0
    assert stats["regions"]["system"] > 0 and 0 < stats["usage_ratio"] < 1
    assert stats["pending_job"] is True


def test_a_call_naming_no_model_is_budgeted_for_the_default_with_one_warning(
        guard: ContextGuard, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="shared.guard"):
        for _ in range(3):
            view = guard.prepare("s", SYSTEM, max_tokens=500,
                                 pending=[{"role": "user", "content": "hi"}])
        assert view.report.budget.window == 128_000
        guard.prepare("s", SYSTEM, max_tokens=500, model="small-model")
    warned = [r.getMessage() for r in caplog.records if "no model given" in r.getMessage()]
    assert len(warned) == 1 and "gpt-4o" in warned[0]


def test_stats_of_a_session_never_recorded_is_session_not_found(guard: ContextGuard) -> None:
    """Before: the defaults (model '', a 128k window) read as a real session's figures."""
    with pytest.raises(SessionNotFound, match="no session 'nobody'"):
        guard.stats("nobody")
    guard.prepare("nobody", SYSTEM, max_tokens=500, model="small-model")  # records nothing
    with pytest.raises(SessionNotFound):
        guard.stats("nobody")


def test_stats_cap_the_reserve_as_prepare_does(make_guard: Callable[..., Any],
                                               store: SessionStore) -> None:
    """A window learned below the max_tokens the session last asked for (llama.cpp's 4096
    against an agent's 8192): stats report it as prepare budgets it, not refuse."""
    guard = make_guard(store, overrides={"m": 100_000})
    store.append("s", coding_turn(0))
    guard.prepare("s", SYSTEM, max_tokens=8192, model="m")
    store.update_state("s", learned_window=4096, learned_model="m")
    stats = guard.stats("s")
    assert stats["window"] == 4096 and 0 < stats["reserve"] < 4096


def test_redis_down_is_typed_and_bounded_with_local_fallback(
        make_guard: Callable[..., Any]) -> None:
    cfg = StoreConfig(socket_timeout=0.2, connect_timeout=0.2)
    guard = make_guard(SessionStore(connect("redis://127.0.0.1:1/0", cfg), cfg),
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


def guard_over_its_cheap_stages(make_guard: Callable[..., Any], store: SessionStore) -> Any:
    """A guard whose session "s" (four turns of big tool outputs in an 8k window) has
    cheap-stage decisions to write on its next prepare."""
    guard = make_guard(store, overrides={"m": 8_000},
                       policy=CompactionPolicy(clear_keep_recent_turns=1))
    for i in range(4):
        turn = coding_turn(i, 3000)
        guard.prepare("s", SYSTEM, model="m", pending=turn[:1])
        guard.record_turn("s", turn)
    return guard


def test_cheap_decisions_whose_write_failed_are_planned_again(
        make_guard: Callable[..., Any], store: SessionStore) -> None:
    """A prepare whose cheap-stage write did not reach Redis (a timeout; in the async
    shell, a cancellation: tests/test_async_cancel.py) kept the decisions in its cached
    view: the next prepare showed them, planned nothing new and wrote nothing, and
    Redis (workers, other guards) never got them."""
    guard = guard_over_its_cheap_stages(make_guard, store)
    inner = getattr(guard, "inner", guard)  # the async shell's guard
    perform, failed = inner.perform, []

    def failing(io: Any) -> Any:
        if io.method in ("run_many", "record_cheap") and not failed:
            failed.append(io.method)
            raise StoreUnavailable("redis unavailable during record_cheap: timed out")
        return perform(io)

    inner.perform = failing
    new = coding_turn(9, 3000)
    with pytest.raises(StoreUnavailable):
        guard.prepare("s", SYSTEM, model="m", pending=new[:1])
    assert failed
    view = guard.prepare("s", SYSTEM, model="m", pending=new[:1])
    stored = sorted(store.load_view("s").cheap)
    assert sorted(guard.snapshot("s").cheap) == stored
    assert view.report.cheap_applied == len(stored) == 3


WRITES = ("run_many", "record_cheap", "commit_summary", "mark_pending", "update_state")


def test_a_write_failing_after_a_good_read_sends_the_planned_view_with_fallback(
        make_guard: Callable[..., Any], store: SessionStore) -> None:
    """Redis gone between a prepare's read and its writes (a restart, found by the soak):
    with ``fallback_messages`` the call still answers, with the view planned from that
    read (not a degraded one); without it, it raises as before."""
    guard = guard_over_its_cheap_stages(make_guard, store)
    inner = getattr(guard, "inner", guard)  # the async shell's guard
    perform, failed = inner.perform, []

    def failing(io: Any) -> Any:
        if io.method in WRITES:
            failed.append(io.method)
            raise StoreUnavailable(f"redis unavailable during {io.method}: timed out")
        return perform(io)

    inner.perform = failing
    new = coding_turn(9, 3000)
    with pytest.raises(StoreUnavailable):
        guard.prepare("s", SYSTEM, model="m", pending=new[:1])
    failed.clear()
    view = guard.prepare("s", SYSTEM, model="m", pending=new[:1], fallback_messages=[])
    assert failed and not view.report.degraded
    assert view.report.budget.within_budget and view.messages[-1].content == new[0]["content"]
    assert validate_view(view.messages, "openai") == []
    inner.perform = perform
    again = guard.prepare("s", SYSTEM, model="m", pending=new[:1])
    assert again.report.estimated_prompt_tokens == view.report.estimated_prompt_tokens


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


# -- record_turn: at most once, bounded, never raising after the turn is stored -------------
class LostReply(SessionStore):
    """A store whose first append is applied but answered with a timeout."""

    lose = 1

    def append_encoded(self, *args: Any, **kwargs: Any) -> AppendResult:
        result = super().append_encoded(*args, **kwargs)
        if self.lose:
            self.lose -= 1
            raise StoreUnavailable("redis unavailable during append: timed out")
        return result


def test_record_turn_retries_a_lost_append_without_duplicating(any_redis: Any,
                                                              key_prefix: str) -> None:
    recorder = Recorder()
    store = LostReply(any_redis, StoreConfig(key_prefix=key_prefix))
    guard = ContextGuard(store, CallbackEnqueuer(recorder))
    assert guard.record_turn("s", coding_turn(0, 100)) == 5
    assert store.length("s") == 5
    # The first attempt set the pending flag; the caller only learns it from the retry.
    assert recorder.jobs == [("default", "s")]
    assert guard.record_turn("s", coding_turn(1, 100), request_id="turn-1") == 10
    assert guard.record_turn("s", coding_turn(1, 100), request_id="turn-1") == 10
    assert store.length("s") == 10


def test_a_turn_retried_after_an_unanswered_append_is_stored_once(any_redis: Any,
                                                                  key_prefix: str) -> None:
    """Both attempts applied, neither answered: record_turn raises; the agent's retry of
    the same messages, without a request id of its own, re-uses the unanswered one (it
    was stored twice). Another turn is a new append."""
    store = LostReply(any_redis, StoreConfig(key_prefix=key_prefix))
    store.lose = 2
    guard = ContextGuard(store)
    with pytest.raises(StoreUnavailable):
        guard.record_turn("s", coding_turn(0, 100))
    assert store.length("s") == 5
    assert guard.record_turn("s", coding_turn(0, 100)) == 5
    assert guard.record_turn("s", coding_turn(0, 100)) == 10  # answered: a new turn
    store.lose = 2
    with pytest.raises(StoreUnavailable):
        guard.record_turn("s", coding_turn(1, 100))
    assert guard.record_turn("s", coding_turn(2, 100)) == 20  # not the unanswered one
    assert guard.record_turn("s", coding_turn(1, 100)) == 25  # that one is forgotten now
    assert [m.text() for m in store.messages("s") if m.role == "user"] == [
        coding_turn(i)[0]["content"] for i in (0, 0, 1, 2, 1)]


def test_record_turn_through_a_proxy_that_loses_the_reply(make_guard: Callable[..., Any],
        redis_url: str,
                                                           key_prefix: str) -> None:
    upstream = redis.Redis.from_url(redis_url)
    kwargs = upstream.connection_pool.connection_kwargs
    cfg = StoreConfig(key_prefix=key_prefix, socket_timeout=0.3, connect_timeout=0.3)
    with ReplyDroppingProxy(kwargs["port"]) as proxy:
        store = SessionStore(connect(proxy.url(kwargs.get("db", 0)), cfg), cfg)
        guard = make_guard(store)
        guard.record_turn("s", coding_turn(0, 100))  # scripts loaded, connection made
        proxy.drop_next = 1  # the next reply (the append's) is lost
        started = time.monotonic()
        assert guard.record_turn("s", coding_turn(1, 100)) == 10
        assert time.monotonic() - started < 2 * (cfg.socket_timeout + cfg.connect_timeout) + 0.5
        assert proxy.dropped_bytes > 0
        assert [m.text() for m in store.messages("s") if m.role == "user"] == [
            coding_turn(0)[0]["content"], coding_turn(1)[0]["content"]]
    SessionStore(upstream, cfg).delete_session("s")


def test_record_turn_with_redis_down_is_typed_and_bounded(make_guard: Callable[..., Any]) -> None:
    cfg = StoreConfig(socket_timeout=0.2, connect_timeout=0.2)
    guard = make_guard(SessionStore(connect("redis://127.0.0.1:1/0", cfg), cfg))
    started = time.monotonic()
    with pytest.raises(StoreUnavailable):
        guard.record_turn("s", coding_turn(0, 100))
    assert time.monotonic() - started < 2 * (0.2 + 0.2) + 0.5


def test_a_failed_publish_after_the_append_unmarks_and_does_not_raise(
        make_guard: Callable[..., Any], store: SessionStore) -> None:
    def broken(tenant: str, session_id: str) -> None:
        raise ConnectionError("broker down")

    guard = make_guard(store, CallbackEnqueuer(broken))
    assert guard.record_turn("s", coding_turn(0, 100)) == 5
    assert store.length("s") == 5 and not store.is_pending("s")  # the next turn retries

# -- a truncation that loses its swap ---------------------------------------------------------
def test_a_truncation_that_loses_its_swap_is_rebuilt_from_the_winner(
        make_guard: Callable[..., Any], store: SessionStore, jobs: Recorder) -> None:
    guard = make_guard(store, CallbackEnqueuer(jobs), overrides={"small-model": 8000})
    for i in range(12):
        store.append("s", coding_turn(i, 12_000))
    raced: list[int] = []

    def worker_commits(snap: Any) -> Any:
        if not raced:  # a worker's summary lands between the guard's read and its swap
            record = SummaryRecord(watermark=50, kind="llm", text="worker summary", tokens=20)
            raced.append(store.commit_summary("s", record, snap.state.version).version)
        return snap

    shell = guard if isinstance(guard, ContextGuard) else guard.inner
    real_steps = shell._read_steps

    def read_steps(sid: str, *more: Any) -> Any:  # the read of the flow both shells drive
        return worker_commits((yield from real_steps(sid, *more)))

    shell._read_steps = read_steps
    view = guard.prepare("s", SYSTEM, max_tokens=1000, model="small-model",
                         pending=[{"role": "user", "content": "continue"}])
    assert raced == [1]
    assert view.report.version >= 1  # built from the worker's summary, not the lost read
    assert view.report.budget.within_budget
    assert "worker summary" in view.messages[0].text()
    state = store.state("s")
    assert state.watermark >= 50 and state.watermark == view.report.watermark


def test_a_view_that_needs_repair_is_still_repaired(guard: ContextGuard) -> None:
    """The log ends in a tool call whose result was never recorded: a placeholder is sent."""
    turn = coding_turn(0, 100)
    guard.store.append("s", turn[:2])  # the call, without its results
    view = guard.prepare("s", SYSTEM, max_tokens=500, model="small-model")
    for provider in ("openai", "anthropic", "gemini"):
        assert validate_view(view.messages, provider) == []
    assert [m.role for m in view.messages] == ["system", "user", "assistant", "tool", "tool"]


def test_a_forced_cut_that_drops_nothing_adds_no_summary(make_guard: Callable[..., Any],
                                                         store: SessionStore) -> None:
    """The provider reported far fewer tokens than the guard sent (silent truncation
    suspected): the next view is forced down, but it fits already. It is the same
    conversation, with no empty "compacted" block telling the model of a compaction
    that never happened."""
    guard = make_guard(store)
    question = Message(role="user", content=[TextPart(text="what is this?"), ImagePart(
        data="iVBORw0KGgo=", media_type="image/png")])
    for _ in range(2):
        guard.prepare("s", "You are terse.", model="gpt-4o", pending=[question])
        guard.record_turn("s", [question, Message(role="assistant", content="ok")],
                          usage={"prompt_tokens": 50})
    view = guard.prepare("s", "You are terse.", model="gpt-4o",
                         pending=[Message(role="user", content="third")])
    assert view.report.recovery and view.report.dropped_messages == 0
    assert [m.role for m in view.messages] == ["system", "user", "assistant", "user",
                                               "assistant", "user"]
    assert view.messages[0].text() == "You are terse."
    assert "conversation_summary" not in str(view.openai())
    assert store.summaries("s") == []


def test_a_recovery_scales_by_what_the_provider_counted(make_guard: Callable[..., Any],
                                                        store: SessionStore) -> None:
    """The provider counted a hundred times the guard's estimate (video or files it
    decodes, by URI): a fifth of the window by the guard's count would be the refused
    request again. The retry is scaled by the stated count."""
    guard = make_guard(store, overrides={"m": 1_000_000})
    for i in range(12):
        store.append("s", coding_turn(i))
    refused = guard.prepare("s", SYSTEM, max_tokens=1000, model="m")
    sent = refused.report.estimated_prompt_tokens
    assert sent < 200_000  # a fifth of the window by the guard's count: nothing to drop
    error = RuntimeError(f"The input token count ({sent * 100}) exceeds the maximum number "
                         f"of tokens allowed (1000000).")
    view = guard.recover("s", error, SYSTEM, max_tokens=1000, model="m")
    assert view is not None and view.report.dropped_messages > 0
    assert view.report.estimated_prompt_tokens * 100 <= 0.2 * 1_000_000 + 10_000


def test_a_recovery_with_nothing_smaller_to_send_returns_none(
        make_guard: Callable[..., Any], store: SessionStore,
        caplog: pytest.LogCaptureFixture) -> None:
    """max_tokens larger than the window is capped (and said so, once); the provider then
    refuses the uncapped figure the caller sent: the view is as small as it gets, so
    recover returns None and the caller raises the provider's error, rather than sending
    the same request again."""
    guard = make_guard(store, overrides={"tiny": 4000})
    guard.record_turn("s", [Message(role="user", content="w " * 300),
                            Message(role="assistant", content="ok")])
    pending = [Message(role="user", content="q")]
    with caplog.at_level("WARNING", logger="shared.guard"):
        for _ in range(2):
            view = guard.prepare("s", "sys", model="tiny", max_tokens=10_000, pending=pending)
    assert view.report.budget.reserve < 4000
    assert sum("send view.report.budget.reserve" in r.message for r in caplog.records) == 1
    error = RuntimeError("This model's maximum context length is 4000 tokens. However, you "
                         "requested 10330 tokens (330 in the messages, 10000 in the "
                         "completion).")
    assert guard.recover("s", error, "sys", model="tiny", max_tokens=10_000,
                         pending=pending) is None
