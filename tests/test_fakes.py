"""The fake provider servers, driven by the real openai and google-genai SDKs over HTTP.

No network: every server listens on 127.0.0.1. SDK retries are off so each
assertion sees exactly one request's outcome.
"""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fakes_support import (
    WORDS,
    ask,
    client_for,
    user,
    words,
)
from workers.harness.fakes import (
    DefaultResponder,
    FakeOpenAIServer,
)


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
    # the server's message from the body: the SDK's ``.message`` wraps it (a repr of the
    # whole body before openai 3.x, the message alone after)
    body = caught.value.body
    assert isinstance(body, dict)
    assert body["message"].endswith(
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
        reply = ask(_shared_client(), messages)
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
    _shared_fake(window)
    try:
        reply = ask(_shared_client(), messages, **extra)
        assert prompt + (max_tokens or 0) <= window
        assert reply.usage.prompt_tokens == prompt
    except openai.BadRequestError as exc:
        assert prompt + (max_tokens or 0) > window
        assert f"maximum context length is {window} tokens" in exc.message
        assert f"{prompt}" in exc.message


_FAKES: dict[int, FakeOpenAIServer] = {}
_CLIENTS: dict[int, openai.OpenAI] = {}


def _shared_fake(window: int) -> FakeOpenAIServer:
    """One server for all hypothesis examples (its window is set per example)."""
    fake = _FAKES.get(0)
    if fake is None:
        fake = _FAKES[0] = FakeOpenAIServer(counter=WORDS).start()
    fake.window = window
    return fake


def _shared_client() -> openai.OpenAI:
    """One client of that server too (making a client costs ~50 ms: its TLS context)."""
    if 0 not in _CLIENTS:
        _CLIENTS[0] = client_for(_FAKES[0])
    return _CLIENTS[0]


def teardown_module() -> None:
    for client in _CLIENTS.values():
        client.close()
    for fake in _FAKES.values():
        fake.stop()


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
