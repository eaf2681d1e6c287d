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
], ids=["prepare-surrogate"])
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
