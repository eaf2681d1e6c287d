"""Inputs that once passed the doors of the guard, the converters or the HTTP server and
failed later, far from their cause (each test failed before its fix):

- a pending message no JSON holds (a lone surrogate, absurd nesting) was taken into the
  view: the provider's SDK could not encode it, the server answered 500 after writing
  the session's state, and the turn's record was refused afterwards;
- tool-call arguments with ``NaN``, ``Infinity`` or ``1e999`` were stored from neutral
  messages (the wire converters refuse them): every later Anthropic or Gemini view of
  the session held a float no SDK writes; arguments nested too deeply, or holding an
  object JSON cannot write, raised RecursionError or TypeError instead of InvalidInput;
- a model name with a lone surrogate failed the state's write as StoreUnavailable
  (as if Redis were down); NUL or 10 kB names were stored and logged.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from shared.core.errors import InvalidInput
from shared.core.messages import Message, validate_message
from shared.core.wire import from_anthropic, from_gemini, from_openai
from shared.store.sessions import SessionStore


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"k": value}
    return value


def keys_and_values(store: SessionStore) -> dict[bytes, Any]:
    """Every key of the test's prefix with its value (what a refused call must not touch)."""
    client = store.redis
    out: dict[bytes, Any] = {}
    for key in client.scan_iter(match=f"{store.config.key_prefix}:*"):
        kind = client.type(key)
        kind = kind.decode() if isinstance(kind, bytes) else kind
        out[key] = (client.lrange(key, 0, -1) if kind == "list" else client.hgetall(key)
                    if kind == "hash" else client.get(key) if kind == "string" else kind)
    return out


def refused(call: Callable[[], Any], field: str) -> InvalidInput:
    with pytest.raises(InvalidInput) as caught:
        call()
    assert caught.value.field == field, str(caught.value)
    return caught.value


def call_turn(arguments: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": "go"},
            {"role": "assistant", "content": "",
             "tool_calls": [{"id": "c1", "name": "f", "arguments": arguments}]},
            {"role": "tool", "tool_call_id": "c1", "content": "done"}]


# -- pending messages the view could not carry ------------------------------------------------
@pytest.mark.parametrize("message", [
    {"role": "user", "content": "a\ud800b"},
    {"role": "user", "content": "x", "name": "\udcff"},
    {"role": "user", "content": [{"type": "image", "url": "https://example.com/\ud800.png"}]},
    {"role": "user", "content": "x", "metadata": {"deep": nested(3000)}},
], ids=["content", "name", "image-url", "deep-metadata"])
def test_a_pending_message_no_json_holds_is_refused_by_field(
        guard: Any, store: SessionStore, message: dict[str, Any]) -> None:
    guard.record_turn("s", [{"role": "user", "content": "hi"},
                            {"role": "assistant", "content": "hello"}])
    guard.prepare("s", "sys", max_tokens=100, model="gpt-4o")
    before = keys_and_values(store)
    ok = {"role": "user", "content": "fine"}
    refused(lambda: guard.prepare("s", "sys", max_tokens=100, model="gpt-4o",
                                  pending=[ok, message]), "pending[1]")
    refused(lambda: guard.prepare("s", "sys", max_tokens=100, model="gpt-4o",
                                  pending=[ok, message]), "pending[1]")  # after a cached turn
    assert keys_and_values(store) == before
    view = guard.prepare("s", "sys", max_tokens=100, model="gpt-4o", pending=[ok])
    assert json.dumps(view.openai()).encode("utf-8")  # the guard still works


# -- tool-call arguments no provider reads ------------------------------------------------------
class Unwritable:
    pass


@pytest.mark.parametrize("arguments", [
    {"x": float("nan")}, {"x": float("inf")}, '{"x": NaN}', '{"x": -Infinity}', '{"x": 1e999}',
    {"x": Unwritable()}, nested(5000), "[" * 5000 + "]" * 5000,
], ids=["dict-nan", "dict-inf", "str-nan", "str-infinity", "str-1e999", "dict-object",
        "dict-deep", "str-deep"])
def test_arguments_no_provider_reads_are_refused_and_nothing_is_written(
        guard: Any, store: SessionStore, arguments: Any) -> None:
    guard.record_turn("s", [{"role": "user", "content": "hi"}])
    before = keys_and_values(store)
    field = "messages[1].tool_calls.0.arguments"
    refused(lambda: guard.record_turn("s", call_turn(arguments)), field)
    refused(lambda: guard.prepare("s", model="gpt-4o", pending=call_turn(arguments)),
            field.replace("messages", "pending"))
    assert keys_and_values(store) == before


def test_finite_arguments_are_kept_byte_for_byte_and_sendable_to_every_provider(
        guard: Any) -> None:
    text = '{"x": 1.5e300, "y": -0.0, "z": 12345678901234567890123}'
    guard.record_turn("s", call_turn(text))
    view = guard.prepare("s", model="gpt-4o")
    assert view.openai()[1]["tool_calls"][0]["function"]["arguments"] == text
    json.dumps(view.anthropic(), allow_nan=False)  # what httpx writes: no NaN, no Infinity
    json.dumps(view.gemini(), allow_nan=False, default=str)


def test_arguments_stored_before_the_check_are_still_read() -> None:
    stored = ('{"role":"assistant","tool_calls":[{"id":"c","name":"f",'
              '"arguments":"{\\"x\\": NaN}"}]}')
    assert Message.from_json(stored).tool_calls[0].arguments == '{"x": NaN}'
    with pytest.raises(InvalidInput):  # ...but a caller's message is checked
        validate_message(json.loads(stored))


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_a_view_of_arguments_stored_before_the_check_can_be_sent(
        number: str, make_guard: Callable[..., Any]) -> None:
    """An older version stored them: every format's view of the session is still JSON an
    API takes (a non-finite number goes out as null where arguments are an object), from
    the cold read's stored JSON and from the messages alike."""
    import fakeredis

    from shared.core.config import StoreConfig
    from shared.core.wire import to_anthropic, to_gemini

    store = SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="legacy"))
    arguments = '{"x": %s, "y": 2.5, "z": 12345678901234567890123}'
    store.append("s", call_turn(arguments % "1"))
    stored = json.loads(store.redis.lindex(store.keys("s").log, 1))
    stored["tool_calls"][0]["arguments"] = arguments % number  # as an older version wrote it
    store.redis.lset(store.keys("s").log, 1, json.dumps(stored))
    guard = make_guard(store, overrides={"m": 100_000})
    view = guard.prepare("s", "sys", model="m", pending=[{"role": "user", "content": "next"}])
    history = list(view.messages)
    for messages in (view.anthropic()[1], view.gemini()[1], to_anthropic(history)[1],
                     to_gemini(history)[1]):
        sent = json.dumps(messages, allow_nan=False)
        assert '"x": null, "y": 2.5, "z": 12345678901234567890123' in sent


# -- the wire converters ----------------------------------------------------------------------
@pytest.mark.parametrize(("convert", "messages", "field"), [
    (from_openai, [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function",
         "function": {"name": "f", "arguments": "[" * 5000 + "]" * 5000}}]}],
     "messages[0].tool_calls[0].function.arguments"),
    (from_anthropic, [{"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": nested(5000)}]}],
     "messages[0].content[0].input"),
    (from_anthropic, [{"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": {"x": Unwritable()}}]}],
     "messages[0].content[0].input"),
    (from_gemini, [{"role": "user", "parts": [
        {"function_response": {"name": "f", "response": nested(5000)}}]}],
     "contents[0].parts[0].function_response.response"),
    (from_gemini, [{"role": "user", "parts": [
        {"function_response": {"name": "f", "response": {"x": float("nan")}}}]}],
     "contents[0].parts[0].function_response.response"),
], ids=["openai-deep-arguments", "anthropic-deep-input", "anthropic-object-input",
        "gemini-deep-response", "gemini-nan-response"])
def test_converters_name_what_no_json_holds(convert: Callable[[Any], Any], messages: Any,
                                            field: str) -> None:
    refused(lambda: convert(messages), field)


def test_gemini_deep_call_arguments_are_invalid_input() -> None:
    with pytest.raises(InvalidInput):
        from_gemini([{"role": "model", "parts": [
            {"function_call": {"name": "f", "args": nested(5000)}}]}])


# -- model names ------------------------------------------------------------------------------
@pytest.mark.parametrize("model", ["\ud800", "gpt-4o\x00", "gpt-4o\n", "m" * 10_000],
                         ids=["surrogate", "nul", "newline", "10k"])
def test_a_model_name_no_provider_uses_is_refused_by_field(
        guard: Any, store: SessionStore, model: str) -> None:
    guard.record_turn("s", [{"role": "user", "content": "hi"}])
    before = keys_and_values(store)
    refused(lambda: guard.prepare("s", "sys", model=model), "model")
    refused(lambda: guard.recover("s", "maximum context length is 4000 tokens", "sys",
                                  model=model), "model")
    assert keys_and_values(store) == before
    assert guard.prepare("s", "sys", model="gpt-4o").report.length == 1


def test_long_real_model_names_are_taken(guard: Any) -> None:
    arn = ("arn:aws:bedrock:us-east-1:123456789012:inference-profile/"
           "us.anthropic.claude-3-5-sonnet-20241022-v2:0")
    guard.record_turn("s", [{"role": "user", "content": "hi"}])
    assert guard.prepare("s", model=arn).report.model == arn


# -- the HTTP server --------------------------------------------------------------------------
@pytest.fixture
def client(store: SessionStore) -> Iterator[Any]:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from workers.server.app import create_app
    from workers.server.config import ServerConfig

    app = create_app(ServerConfig(), store, tokens={"edges-token-0123456789": store.tenant})
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


AUTH = {"Authorization": "Bearer edges-token-0123456789", "Content-Type": "application/json"}


@pytest.mark.parametrize(("path", "body", "field"), [
    ("prepare", b'{"pending": [{"role": "user", "content": "\\ud800"}]}', "pending[0]"),
    ("record", b'{"messages": [{"role": "assistant", "content": null, "tool_calls": [{"id": '
               b'"c", "type": "function", "function": {"name": "f", "arguments": "'
               + b"[" * 5000 + b"]" * 5000 + b'"}}]}]}',
     "messages[0].tool_calls[0].function.arguments"),
    ("record", b'{"format": "neutral", "messages": [{"role": "assistant", "tool_calls": [{"id": '
               b'"c", "name": "f", "arguments": "{\\"x\\": NaN}"}]}]}',
     "messages[0].tool_calls.0.arguments"),
], ids=["prepare-surrogate", "record-deep-arguments", "record-nan-arguments"])
def test_the_server_answers_422_naming_the_field_and_writes_nothing(
        client: Any, store: SessionStore, path: str, body: bytes, field: str) -> None:
    assert client.post("/v1/sessions/s/record", headers=AUTH,
                       json={"messages": [{"role": "user", "content": "hi"}]}).status_code == 200
    assert client.post("/v1/sessions/s/prepare", headers=AUTH, json={}).status_code == 200
    before = keys_and_values(store)
    response = client.post(f"/v1/sessions/s/{path}", headers=AUTH, content=body)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == field
    assert keys_and_values(store) == before
