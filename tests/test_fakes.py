"""The fake provider servers, driven by the real openai and google-genai SDKs over HTTP.

No network: every server listens on 127.0.0.1. SDK retries are off so each
assertion sees exactly one request's outcome.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types as genai_types
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.core.errors import InvalidInput
from workers.harness.fakes import (
    REFUSAL_TEXT,
    DefaultResponder,
    FakeGeminiServer,
    FakeOpenAIServer,
    Fault,
    FaultPlan,
    Script,
    ScriptExhausted,
    default_counter,
)
from workers.harness.fakes.behaviour import normalize_reply
from workers.harness.fakes.counting import FramedCounter
from workers.harness.fakes.recording import redact_headers

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
TOKENIZER = DATA / "tokenizers" / "o200k_base.tiktoken"
TRANSCRIPTS = DATA / "transcripts.dev.jsonl"

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


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(window=1000, counter=WORDS) as fake:
        yield fake


def client_for(fake: FakeOpenAIServer, timeout: float = 5.0) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=fake.base_url, api_key="sk-secret", max_retries=0, timeout=timeout
    )


def ask(client: openai.OpenAI, messages: list[dict[str, Any]], **kw: Any) -> Any:
    return client.chat.completions.create(model="gpt-4o", messages=messages, **kw)  # type: ignore[arg-type]


# -- OpenAI: normal answers ----------------------------------------------------------


def test_completion_reports_usage_like_openai(server: FakeOpenAIServer) -> None:
    messages = [{"role": "system", "content": "be brief"}, user("hello there world")]
    reply = ask(client_for(server), messages)
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content == "Echo: hello there world"
    assert reply.choices[0].finish_reason == "stop"
    assert reply.model == "gpt-4o" and reply.id.startswith("chatcmpl-")
    assert reply.usage.prompt_tokens == WORDS(messages, None)
    assert reply.usage.completion_tokens == 4  # "Echo: hello there world"
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 4


def test_models_endpoint_lists_the_model(server: FakeOpenAIServer) -> None:
    assert [m.id for m in client_for(server).models.list()] == ["gpt-4o-fake"]


def test_missing_api_key_is_401(server: FakeOpenAIServer) -> None:
    response = httpx.post(server.base_url + "/chat/completions", json={})
    assert response.status_code == 401
    assert "didn't provide an API key" in response.json()["error"]["message"]


def test_streaming_yields_content_and_usage(server: FakeOpenAIServer) -> None:
    stream = ask(client_for(server), [user("a b c")], stream=True,
                 stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Echo: a b c"
    assert chunks[-1].usage.prompt_tokens == WORDS([user("a b c")], None)


# -- OpenAI: context window ------------------------------------------------------------


def test_overflow_has_openais_exact_body(server: FakeOpenAIServer) -> None:
    messages = [user(words(2000))]
    prompt = WORDS(messages, None)
    with pytest.raises(openai.BadRequestError) as caught:
        ask(client_for(server), messages)
    assert caught.value.status_code == 400
    assert caught.value.body == {
        "message": f"This model's maximum context length is 1000 tokens. However, your messages "
        f"resulted in {prompt} tokens. Please reduce the length of the messages.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
    assert server.requests[-1].prompt_tokens == prompt


def test_max_tokens_that_tips_over_uses_the_completion_variant(server: FakeOpenAIServer) -> None:
    messages = [user(words(500))]
    prompt = WORDS(messages, None)
    with pytest.raises(openai.BadRequestError) as caught:
        ask(client_for(server), messages, max_tokens=600)
    assert caught.value.code == "context_length_exceeded"
    assert caught.value.message.endswith(
        f"However, you requested {prompt + 600} tokens ({prompt} in the messages, 600 in the "
        "completion). Please reduce the length of the messages or completion."
    )
    ok = ask(client_for(server), messages, max_completion_tokens=1000 - prompt)
    assert ok.usage.prompt_tokens == prompt


def test_silent_truncation_drops_oldest_and_reports_reduced_usage() -> None:
    with FakeOpenAIServer(window=100, counter=WORDS, truncate=True) as fake:
        messages = [{"role": "system", "content": "sys"}] + [user(words(30)) for _ in range(6)]
        reply = ask(client_for(fake), messages)
        record = fake.requests[-1]
        assert reply.usage.prompt_tokens <= 100 < WORDS(messages, None)
        assert record.dropped_messages > 0 and record.prompt_tokens == reply.usage.prompt_tokens


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(0, 60), min_size=1, max_size=8), window=st.integers(20, 200))
def test_truncation_keeps_system_and_the_newest_suffix(sizes: list[int], window: int) -> None:
    """Silent truncation answers with the system prompt plus the newest messages that fit."""
    system = {"role": "system", "content": "rules here"}
    messages = [system] + [user(f"m{i} " + words(n)) for i, n in enumerate(sizes)]
    seen: list[list[dict[str, Any]]] = []

    def responder(request: dict[str, Any]) -> dict[str, Any]:
        seen.append(request["messages"])
        return {"content": "ok"}

    fake = _shared_fake(window)
    fake.truncate, fake.responder = True, responder
    try:
        reply = ask(client_for(fake), messages)
    except openai.BadRequestError as exc:  # even system + newest alone do not fit
        assert WORDS([system, messages[-1]], None) > window
        assert f"resulted in {WORDS(messages, None)} tokens" in exc.message
        return
    finally:
        fake.truncate, fake.responder = False, DefaultResponder()
    kept = seen[-1]
    assert kept[0] == system and kept[1:] == messages[len(messages) - len(kept) + 1 :]
    assert reply.usage.prompt_tokens == WORDS(kept, None) <= window
    if len(kept) < len(messages):  # the next older message would not have fit
        assert WORDS([system, *messages[len(messages) - len(kept) :]], None) > window
    assert fake.requests[-1].dropped_messages == len(messages) - len(kept)


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 60), min_size=1, max_size=8),
    window=st.integers(20, 300),
    max_tokens=st.none() | st.integers(1, 100),
)
def test_accepts_exactly_what_fits(sizes: list[int], window: int, max_tokens: int | None) -> None:
    """200 iff prompt + max_tokens <= window; a 400 states the counted numbers."""
    messages = [user(words(n)) for n in sizes]
    prompt = WORDS(messages, None)
    extra = {} if max_tokens is None else {"max_tokens": max_tokens}
    fake = _shared_fake(window)
    try:
        reply = ask(client_for(fake), messages, **extra)
        assert prompt + (max_tokens or 0) <= window
        assert reply.usage.prompt_tokens == prompt
    except openai.BadRequestError as exc:
        assert prompt + (max_tokens or 0) > window
        assert f"maximum context length is {window} tokens" in exc.message
        assert f"{prompt}" in exc.message


_FAKES: dict[int, FakeOpenAIServer] = {}


def _shared_fake(window: int) -> FakeOpenAIServer:
    """One server for all hypothesis examples (its window is set per example)."""
    fake = _FAKES.get(0)
    if fake is None:
        fake = _FAKES[0] = FakeOpenAIServer(counter=WORDS).start()
    fake.window = window
    return fake


def teardown_module() -> None:
    for fake in _FAKES.values():
        fake.stop()


# -- OpenAI: request validation --------------------------------------------------------


def test_orphan_tool_message_gets_openais_error(server: FakeOpenAIServer) -> None:
    messages = [user("hi"), {"role": "tool", "tool_call_id": "call_1", "content": "42"}]
    with pytest.raises(openai.BadRequestError) as caught:
        ask(client_for(server), messages)
    assert caught.value.body == {
        "message": "Invalid parameter: messages with role 'tool' must be a response to a "
        "preceeding message with 'tool_calls'.",
        "type": "invalid_request_error",
        "param": "messages.[1].role",
        "code": None,
    }


def _call(call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": "f", "arguments": "{}"}}


@pytest.mark.parametrize(
    ("tail", "needle"),
    [
        ([{"role": "tool", "tool_call_id": "call_x", "content": "1"}], "'call_x' not found"),
        ([user("next")], "did not have response messages: call_1"),
        ([], "did not have response messages: call_1"),
    ],
)
def test_tool_results_must_answer_the_preceding_calls(
    server: FakeOpenAIServer, tail: list[dict[str, Any]], needle: str
) -> None:
    messages = [user("hi"), {"role": "assistant", "content": None, "tool_calls": [_call("call_1")]}]
    with pytest.raises(openai.BadRequestError, match=needle):
        ask(client_for(server), messages + tail)


def test_parallel_tool_results_are_accepted(server: FakeOpenAIServer) -> None:
    messages = [
        user("hi"),
        {"role": "assistant", "content": None, "tool_calls": [_call("a"), _call("b")]},
        {"role": "tool", "tool_call_id": "b", "content": "2"},
        {"role": "tool", "tool_call_id": "a", "content": "1"},
    ]
    assert ask(client_for(server), messages).choices[0].finish_reason == "stop"


def test_missing_messages_is_400(server: FakeOpenAIServer) -> None:
    response = httpx.post(
        server.base_url + "/chat/completions", json={"model": "m"},
        headers={"Authorization": "Bearer x"},
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "missing_required_parameter"


# -- OpenAI: faults --------------------------------------------------------------------


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


# -- OpenAI: responders, scripts, recording ------------------------------------------------


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
    assert elapsed < 32 * 0.2 / 4, elapsed  # serialized would take 6.4 s
    assert sorted(r.choices[0].message.content for r in replies) == sorted(
        f"Echo: n{i}" for i in range(32))
    assert sorted(r.index for r in fake.requests) == list(range(32))


# -- counting and the command line ------------------------------------------------------------


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


@pytest.mark.skipif(not TRANSCRIPTS.exists(), reason=f"needs recorded sessions at {TRANSCRIPTS}")
def test_replaying_a_recorded_session_returns_its_assistant_turns() -> None:
    session = json.loads(TRANSCRIPTS.read_text(encoding="utf-8").splitlines()[0])
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
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1],
    )
    try:
        assert process.stdout is not None
        base_url = process.stdout.readline().strip()
        client = openai.OpenAI(base_url=base_url, api_key="t", max_retries=0, timeout=10)
        with pytest.raises(openai.BadRequestError, match="maximum context length is 50"):
            ask(client, [user("lorem ipsum " * 100)])
    finally:
        process.terminate()
        process.wait(timeout=10)


# -- Gemini / Vertex -------------------------------------------------------------------------


@pytest.fixture
def gemini() -> Iterator[FakeGeminiServer]:
    with FakeGeminiServer(window=1000, counter=WORDS) as fake:
        yield fake


def gemini_clients(fake: FakeGeminiServer, timeout_ms: int | None = None) -> dict[str, Any]:
    """One genai client per mode; keep the Client itself alive (its finalizer closes it)."""
    options = fake.http_options(timeout_ms)
    return {
        "api_key": genai.Client(api_key="secret-key", http_options=options),
        "vertex": genai.Client(vertexai=True, project="proj", location="us-central1",
                               credentials=fake.credentials(), http_options=options),
        "express": genai.Client(vertexai=True, api_key="secret-key", http_options=options),
    }


@pytest.mark.parametrize("mode", ["api_key", "vertex", "express"])
def test_gemini_completion_with_usage(gemini: FakeGeminiServer, mode: str) -> None:
    client = gemini_clients(gemini)[mode]
    config = genai_types.GenerateContentConfig(system_instruction="be brief")
    reply = client.models.generate_content(model="gemini-2.5-flash", contents="hi you",
                                           config=config)
    expected = WORDS([{"role": "system", "content": "be brief"}, user("hi you")], None)
    assert reply.text == "Echo: hi you"
    assert reply.candidates[0].finish_reason == genai_types.FinishReason.STOP
    usage = reply.usage_metadata
    assert (usage.prompt_token_count, usage.candidates_token_count) == (expected, 3)
    assert usage.total_token_count == expected + 3
    record = gemini.requests[-1]
    assert record.path.endswith("/models/gemini-2.5-flash:generateContent")
    assert ("/projects/proj/locations/us-central1/" in record.path) == (mode == "vertex")
    assert "secret-key" not in json.dumps(record.headers)


@pytest.mark.parametrize("mode", ["api_key", "vertex"])
def test_gemini_overflow_is_a_client_error(gemini: FakeGeminiServer, mode: str) -> None:
    client = gemini_clients(gemini)[mode]
    with pytest.raises(genai_errors.ClientError) as caught:
        client.models.generate_content(model="gemini-2.5-flash", contents=words(2000))
    prompt = gemini.requests[-1].prompt_tokens
    assert (caught.value.code, caught.value.status) == (400, "INVALID_ARGUMENT")
    assert caught.value.message == (
        f"The input token count ({prompt}) exceeds the maximum number of tokens allowed (1000).")


@pytest.mark.parametrize(
    ("fault", "error", "code", "status"),
    [
        (Fault.rate_limit(), genai_errors.ClientError, 429, "RESOURCE_EXHAUSTED"),
        (Fault.server_error(), genai_errors.ServerError, 500, "INTERNAL"),
        (Fault.unavailable(), genai_errors.ServerError, 503, "UNAVAILABLE"),
    ],
)
def test_gemini_error_faults(
    gemini: FakeGeminiServer, fault: Fault, error: type[Exception], code: int, status: str
) -> None:
    for client in gemini_clients(gemini).values():
        gemini.faults.next(fault)
        with pytest.raises(error) as caught:
            client.models.generate_content(model="gemini-2.5-flash", contents="hi")
        assert (caught.value.code, caught.value.status) == (code, status)  # type: ignore[attr-defined]


def test_gemini_stall_times_out_and_content_faults(gemini: FakeGeminiServer) -> None:
    client = gemini_clients(gemini, timeout_ms=300)["vertex"]
    gemini.faults.next(Fault.stall(5))
    started = time.monotonic()
    with pytest.raises(HTTP_TIMEOUTS):
        client.models.generate_content(model="gemini-2.5-flash", contents="hi")
    assert time.monotonic() - started < 2
    gemini.faults.next(Fault.empty())
    assert client.models.generate_content(model="m", contents="hi").text is None
    gemini.faults.next(Fault.refusal())
    assert client.models.generate_content(model="m", contents="hi").text == REFUSAL_TEXT
    gemini.faults.next(Fault.endless())
    config = genai_types.GenerateContentConfig(max_output_tokens=50)
    long = client.models.generate_content(model="m", contents="hi", config=config)
    assert long.candidates[0].finish_reason == genai_types.FinishReason.MAX_TOKENS
    assert long.usage_metadata.candidates_token_count == 50


def test_gemini_function_calls_and_pairing(gemini: FakeGeminiServer) -> None:
    gemini.responder = Script(
        [{"tool_calls": [{"id": "c", "name": "lookup", "arguments": {"q": "x"}}]}])
    client = gemini_clients(gemini)["api_key"]
    reply = client.models.generate_content(model="m", contents="find x")
    assert [(c.name, c.args) for c in reply.function_calls] == [("lookup", {"q": "x"})]
    orphan = genai_types.Content(role="user", parts=[
        genai_types.Part.from_function_response(name="lookup", response={"r": 1})])
    with pytest.raises(genai_errors.ClientError, match="function response turn"):
        client.models.generate_content(model="m", contents=[orphan])


def test_gemini_count_tokens_and_auth(gemini: FakeGeminiServer) -> None:
    client = gemini_clients(gemini)["vertex"]
    counted = client.models.count_tokens(model="m", contents="a b c")
    assert counted.total_tokens == WORDS([user("a b c")], None)
    path = "/v1beta/models/m:generateContent"
    assert httpx.post(gemini.root_url + path, json={}).status_code == 403
    vertex = "/v1beta1/projects/p/locations/l/publishers/google/models/m:generateContent"
    assert httpx.post(gemini.root_url + vertex, json={}).json()["error"]["status"] == (
        "UNAUTHENTICATED")


def test_stop_releases_stalled_requests() -> None:
    fake = FakeOpenAIServer(counter=WORDS).start()
    fake.faults.always(Fault.stall(30))
    errors: list[BaseException] = []

    def call() -> None:
        try:
            ask(client_for(fake, timeout=20), [user("hi")])
        except openai.APIConnectionError as exc:
            errors.append(exc)

    thread = threading.Thread(target=call)
    thread.start()
    time.sleep(0.3)
    started = time.monotonic()
    fake.stop()
    thread.join(timeout=10)
    assert time.monotonic() - started < 5 and len(errors) == 1
