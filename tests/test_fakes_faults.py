"""The fake OpenAI server's faults, scripts, recording and counting, through the real SDK.

No network: every server listens on 127.0.0.1. SDK retries are off so each
assertion sees exactly one request's outcome.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.core.errors import InvalidInput
from tests.fakes_support import (
    TOKENIZER,
    TRANSCRIPTS_FILE,
    WORDS,
    ask,
    client_for,
    user,
)
from workers.harness.fakes import (
    REFUSAL_TEXT,
    DefaultResponder,
    FakeOpenAIServer,
    Fault,
    FaultPlan,
    Script,
    ScriptExhausted,
    default_counter,
)
from workers.harness.fakes.behaviour import normalize_reply
from workers.harness.fakes.recording import redact_headers


@pytest.mark.parametrize(
    ("fault", "error", "status"),
    [
        (Fault.rate_limit(2), openai.RateLimitError, 429),
        (Fault.server_error(), openai.InternalServerError, 500),
        (Fault.unavailable(), openai.InternalServerError, 503),
        (Fault.overloaded(), openai.InternalServerError, 529),
        (Fault.http_error(418, "teapot"), openai.APIStatusError, 418),
    ],
)
def test_error_faults_raise_the_sdks_exceptions(
    server: FakeOpenAIServer, fault: Fault, error: type[openai.APIStatusError], status: int
) -> None:
    server.faults.next(fault)
    with pytest.raises(error) as caught:
        ask(client_for(server), [user("hi")])
    assert caught.value.status_code == status
    if status == 429:
        assert caught.value.response.headers["retry-after"] == "2"
        assert caught.value.code == "rate_limit_exceeded"
    assert ask(client_for(server), [user("hi")]).choices[0].message.content == "Echo: hi"


def test_stall_times_the_client_out(server: FakeOpenAIServer) -> None:
    server.faults.next(Fault.stall(5))
    started = time.monotonic()
    with pytest.raises(openai.APITimeoutError):
        ask(client_for(server, timeout=0.3), [user("hi")])
    assert time.monotonic() - started < 2


def test_garbage_and_non_completion_bodies(server: FakeOpenAIServer) -> None:
    server.faults.next(Fault.garbage())
    with pytest.raises(ValueError):  # the SDK's json.loads fails (JSONDecodeError)
        ask(client_for(server), [user("hi")])
    server.faults.next(Fault.not_completion())
    assert ask(client_for(server), [user("hi")]).choices is None


def test_connection_reset_is_a_connection_error(server: FakeOpenAIServer) -> None:
    server.faults.next(Fault.reset())
    with pytest.raises(openai.APIConnectionError):
        ask(client_for(server), [user("hi")])
    assert server.requests[-1].status == 0


def test_content_faults(server: FakeOpenAIServer) -> None:
    client = client_for(server)
    server.faults.next(Fault.refusal())
    assert ask(client, [user("hi")]).choices[0].message.content == REFUSAL_TEXT
    server.faults.next(Fault.empty())
    assert ask(client, [user("hi")]).choices[0].message.content == ""
    server.faults.next(Fault.endless())
    endless = ask(client, [user("hi")], max_tokens=300)
    assert endless.choices[0].finish_reason == "length"
    assert endless.usage.completion_tokens == 300
    assert len(endless.choices[0].message.content) >= 1000


def test_faults_pinned_to_a_request_and_always() -> None:
    plan = FaultPlan()
    plan.at(2, Fault.server_error())
    plan.next(Fault.empty(), times=2)
    plan.always(Fault.refusal())
    kinds = [getattr(plan.take(i), "kind", None) for i in range(4)]
    assert kinds == ["empty", "empty", "server_error", "refusal"]
    plan.clear()
    assert plan.take(5) is None


@settings(max_examples=50)
@given(times=st.integers(1, 20), extra=st.integers(0, 5))
def test_next_n_fails_exactly_n_requests(times: int, extra: int) -> None:
    plan = FaultPlan()
    plan.next(Fault.unavailable(), times=times)
    taken = [plan.take(i) for i in range(times + extra)]
    assert sum(f is not None for f in taken) == times
    assert all(f is None for f in taken[times:])


def test_bad_fault_parameters_name_the_field() -> None:
    with pytest.raises(InvalidInput, match=r"fault\.seconds"):
        Fault.stall(-1)
    with pytest.raises(InvalidInput, match=r"fault\.status"):
        Fault.http_error(200, "")
    with pytest.raises(InvalidInput, match="times"):
        FaultPlan().next(Fault.empty(), times=0)


def test_script_replays_replies_in_order_with_nested_tool_calls() -> None:
    recorded = [
        user("ignored: only assistant messages are replies"),
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c1", "name": "bash", "arguments": {"cmd": "ls"}}]},
        {"role": "assistant", "content": "done"},
    ]
    with FakeOpenAIServer(counter=WORDS, responder=Script(recorded)) as fake:
        client = client_for(fake)
        first = ask(client, [user("go")]).choices[0]
        assert first.finish_reason == "tool_calls"
        call = first.message.tool_calls[0]
        assert (call.id, call.function.name, json.loads(call.function.arguments)) == (
            "c1", "bash", {"cmd": "ls"})
        assert ask(client, [user("go")]).choices[0].message.content == "done"
        with pytest.raises(openai.InternalServerError, match="used up"):
            ask(client, [user("go")])
        fake.reset()
        assert ask(client, [user("go")]).choices[0].finish_reason == "tool_calls"


def test_a_scripted_stall_the_client_abandons_does_not_consume_the_reply() -> None:
    script = Script([Fault.stall(0.6), {"content": "first"}, {"content": "second"}])
    with FakeOpenAIServer(counter=WORDS, responder=script) as fake:
        with pytest.raises(openai.APITimeoutError):
            ask(client_for(fake, timeout=0.2), [user("x")])
        time.sleep(0.7)
        assert ask(client_for(fake), [user("x")]).choices[0].message.content == "first"


@settings(max_examples=30)
@given(st.lists(st.text(max_size=20), max_size=10))
def test_script_hands_out_each_reply_once_in_order(texts: list[str]) -> None:
    script = Script([{"role": "assistant", "content": t} for t in texts])
    assert [script.next({})["content"] for _ in texts] == texts  # type: ignore[index]
    with pytest.raises(ScriptExhausted):
        script.next({})


def test_flat_and_nested_tool_calls_normalize_alike() -> None:
    flat = {"content": "x", "tool_calls": [{"id": "a", "name": "f", "arguments": {"k": 1}}]}
    nested = {"content": "x", "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": '{"k": 1}'}}]}
    assert normalize_reply(flat) == normalize_reply(nested)
    with pytest.raises(InvalidInput, match=r"reply\.tool_calls\[0\]\.name"):
        normalize_reply({"tool_calls": [{"id": "a"}]})


def test_callable_responder_sees_the_request_and_summary_marker() -> None:
    seen: list[dict[str, Any]] = []

    def responder(request: dict[str, Any]) -> dict[str, Any]:
        seen.append(request)
        return DefaultResponder(summary_marker="summarize")(request)

    with FakeOpenAIServer(counter=WORDS, responder=responder) as fake:
        client = client_for(fake)
        summary = ask(client, [{"role": "system", "content": "Summarize the chat."}, user("a b")])
        agent = ask(client, [user("a b")])
    assert summary.choices[0].message.content == "Summary of 2 messages. Latest: a b"
    assert agent.choices[0].message.content == "Echo: a b"
    assert seen[0]["messages"][0]["role"] == "system"


def test_requests_are_recorded_without_secrets(server: FakeOpenAIServer) -> None:
    ask(client_for(server), [user("one two")])
    record = server.requests[-1]
    assert (record.method, record.path, record.status, record.index) == (
        "POST", "/v1/chat/completions", 200, 0)
    assert record.body["messages"] == [user("one two")]
    assert record.headers["authorization"] == "<redacted>"
    assert "sk-secret" not in json.dumps(record.headers)
    assert record.prompt_tokens == WORDS([user("one two")], None)
    server.reset()
    assert server.requests == []


@given(st.dictionaries(st.sampled_from(["Authorization", "X-Goog-Api-Key", "Accept"]),
                       st.text(min_size=1, max_size=10)))
def test_redaction_never_leaks_credentials(headers: dict[str, str]) -> None:
    redacted = redact_headers(headers.items())
    assert redacted.get("authorization", "<redacted>") == "<redacted>"
    assert redacted.get("x-goog-api-key", "<redacted>") == "<redacted>"


def test_concurrent_clients_overlap_their_latency() -> None:
    with FakeOpenAIServer(counter=WORDS, latency=0.2) as fake:
        client = client_for(fake)
        started = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(32) as pool:
            replies = list(pool.map(lambda i: ask(client, [user(f"n{i}")]), range(32)))
        elapsed = time.monotonic() - started
    assert elapsed < 32 * 0.2 / 2, elapsed  # serialized would take 6.4 s (a busy runner: 2.1)
    assert sorted(r.choices[0].message.content for r in replies) == sorted(
        f"Echo: n{i}" for i in range(32))
    indexes = [r.index for r in fake.requests]
    assert sorted(i for i in indexes if i is not None) == list(range(32)), indexes


@pytest.mark.skipif(not TOKENIZER.exists(), reason=f"needs the o200k file at {TOKENIZER}")
def test_default_counter_uses_o200k_framing() -> None:
    counter = default_counter(str(TOKENIZER))
    assert counter.name == "o200k" and counter.text("hello world") == 2
    assert counter([user("hello world")], None) == 3 + 3 + 1 + 2  # priming, framing, role, text


def test_missing_tokenizer_falls_back_to_chars_with_a_warning(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    with caplog.at_level(logging.WARNING):
        counter = default_counter(str(tmp_path / "absent.tiktoken"))
    assert counter.name == "chars/4" and counter.text("12345678") == 2
    assert "chars/4" in caplog.text


@pytest.mark.skipif(not TRANSCRIPTS_FILE.exists(),
                    reason=f"needs recorded sessions at {TRANSCRIPTS_FILE}")
def test_replaying_a_recorded_session_returns_its_assistant_turns() -> None:
    session = json.loads(TRANSCRIPTS_FILE.read_text(encoding="utf-8").splitlines()[0])
    messages = session["messages"]
    with FakeOpenAIServer(responder=Script(messages)) as fake:
        client = client_for(fake)
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            reply = ask(client, [_wire(m) for m in messages[:i]]).choices[0].message
            assert (reply.content or "") == (message.get("content") or "")
            assert [c.id for c in reply.tool_calls or []] == [
                c["id"] for c in message.get("tool_calls") or []]


def _wire(message: dict[str, Any]) -> dict[str, Any]:
    """A transcript message in OpenAI's wire form (nested tool calls)."""
    out = {k: v for k, v in message.items() if k in ("role", "content", "tool_call_id", "name")}
    if message.get("tool_calls"):
        out["tool_calls"] = normalize_reply(message)["tool_calls"]
    return out


def test_module_runs_as_a_standalone_server() -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "workers.harness.fakes.openai_server",
         "--port", "0", "--window", "50"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    try:
        assert process.stdout is not None
        base_url = process.stdout.readline().strip()
        client = openai.OpenAI(base_url=base_url, api_key="t", max_retries=0, timeout=10)
        with pytest.raises(openai.BadRequestError, match="maximum context length is 50"):
            ask(client, [user("lorem ipsum " * 100)])
    finally:
        process.terminate()
        _, errors = process.communicate(timeout=10)
    # the documented command starts cleanly (no "found in sys.modules" RuntimeWarning)
    assert "Warning" not in errors, errors
