"""The fake Gemini / Vertex server, driven by the real google-genai SDK over HTTP."""

from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest
from google.genai import errors as genai_errors
from google.genai import types as genai_types

from tests.fakes_support import (
    HTTP_TIMEOUTS,
    WORDS,
    ask,
    client_for,
    gemini_clients,
    user,
    words,
)
from workers.harness.fakes import (
    REFUSAL_TEXT,
    FakeGeminiServer,
    FakeOpenAIServer,
    Fault,
    Script,
)


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
