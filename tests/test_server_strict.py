"""Request bodies are strict about numbers and booleans (a string where an integer is
declared is 422 naming the field), while what the documented clients send still works;
and a non-numeric Content-Length that an ASGI server passes on is counted, not trusted."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient

from shared.core.config import StoreConfig
from shared.store.sessions import SessionStore
from workers.server.app import BodyLimit, create_app
from workers.server.config import ServerConfig

TOKEN = "strict-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
USER = {"role": "user", "content": "What is in /src?"}
REPLY = {"role": "assistant", "content": "a.py and b.py."}


@pytest.fixture
def client(real_redis: Any, key_prefix: str) -> Iterator[TestClient]:
    store = SessionStore(real_redis, StoreConfig(key_prefix=key_prefix), tenant="acme")
    app = create_app(ServerConfig(), store, tokens={TOKEN: "acme"},
                     compact=lambda *a: "task-1")
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


@pytest.mark.redis
@pytest.mark.parametrize(("path", "body", "field"), [
    ("prepare", {"max_tokens": "100"}, "max_tokens"),
    ("prepare", {"max_tokens": 100.5}, "max_tokens"),
    ("prepare", {"min_length": "2"}, "min_length"),
    ("recover", {"error": "x", "status": "400"}, "status"),
    ("recover", {"error": "x", "prepared_tokens": "812"}, "prepared_tokens"),
    ("recall", {"query": "src", "limit": "3"}, "limit"),
    ("recall", {"query": "src", "start": "0"}, "start"),
    ("compact", {"keep_recent": "100"}, "keep_recent"),
    ("compact", {"force": "true"}, "force"),
    ("compact", {"force": 1}, "force"),
    ("prepare", {"system_prompt": 5}, "system_prompt"),
])
def test_a_lax_number_or_bool_is_422_naming_the_field(
        client: TestClient, path: str, body: dict[str, Any], field: str) -> None:
    assert client.post("/v1/sessions/s1/record", json={"messages": [USER, REPLY]},
                       headers=AUTH).status_code == 200
    response = client.post(f"/v1/sessions/s1/{path}", json=body, headers=AUTH)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == "invalid_input"
    assert response.json()["error"]["field"] == field


@pytest.mark.redis
def test_what_the_documented_clients_send_still_works(client: TestClient) -> None:
    """docs/server.md's curl and TypeScript bodies (JSON.stringify drops an undefined
    ``min_length``; integers are sent as integers)."""
    s = "/v1/sessions/demo-1"
    figures = {"system_prompt": "You are terse.", "model": "gpt-4o", "max_tokens": 500,
               "pending": [USER]}
    view = client.post(f"{s}/prepare", json=figures, headers=AUTH)
    assert view.status_code == 200, view.text
    recorded = client.post(f"{s}/record", json={
        "messages": [USER, REPLY], "usage": {"prompt_tokens": 812, "completion_tokens": 9}},
        headers=AUTH)
    assert recorded.status_code == 200, recorded.text
    figures = {**figures, "pending": [{"role": "user", "content": "And /lib?"}],
               "min_length": recorded.json()["length"]}
    assert client.post(f"{s}/prepare", json=figures, headers=AUTH).status_code == 200
    recover = client.post(f"{s}/recover", json={
        **figures, "status": 400, "prepared_tokens":
            view.json()["report"]["estimated_prompt_tokens"],
        "error": "This model's maximum context length is 128000 tokens. However, your "
                 "messages resulted in 131000 tokens."}, headers=AUTH)
    assert recover.status_code == 200, recover.text
    recall = client.post(f"{s}/recall", json={"query": "src/billing/ledger_v2.py", "limit": 3},
                         headers=AUTH)
    assert recall.status_code == 200, recall.text
    compact = client.post(f"{s}/compact", json={"keep_recent": 100, "force": True},
                          headers=AUTH)
    assert compact.status_code == 202, compact.text


def _asgi(limit: int, headers: list[tuple[bytes, bytes]], body: bytes
          ) -> tuple[list[dict[str, Any]], bytes | None]:
    """BodyLimit over an app that reads the body: what was sent back, what the app read."""
    seen: list[bytes] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        message = await receive()
        seen.append(message["body"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    sent: list[dict[str, Any]] = []
    chunks = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return chunks.pop(0) if chunks else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/", "headers": headers}
    asyncio.run(BodyLimit(app, limit)(scope, receive, send))  # type: ignore[arg-type]
    return sent, (seen[0] if seen else None)


def test_a_non_numeric_content_length_is_counted_not_trusted() -> None:
    """uvicorn answers ``Content-Length: abc`` itself (400, plain text) before any app;
    a server that passes it on gets the bytes counted like a streamed body."""
    sent, read = _asgi(1024, [(b"content-length", b"abc")], b'{"a": 1}')
    assert sent[0]["status"] == 200 and read == b'{"a": 1}'
    sent, read = _asgi(1024, [(b"content-length", b"abc")], b"x" * 2000)
    assert sent[0]["status"] == 413 and read is None
    sent, read = _asgi(1024, [(b"content-length", b"2000")], b"x" * 2000)
    assert sent[0]["status"] == 413 and read is None


@pytest.mark.redis
@pytest.mark.parametrize(("path", "body"), [
    ("prepare", {"max_tokens": 2000.0}),
    ("prepare", {"max_tokens": 2e3, "min_length": 2.0}),
    ("recover", {"error": "context_length_exceeded", "status": 400.0,
                 "prepared_tokens": 812.0}),
    ("recall", {"query": "src", "limit": 5.0, "start": 0.0}),
    ("compact", {"keep_recent": 100.0}),
])
def test_a_whole_number_written_as_a_float_is_that_integer(
        client: TestClient, path: str, body: dict[str, Any]) -> None:
    """Python's json.dumps writes a figure computed in floats as ``2000.0``: it was
    accepted before the bodies were strict, and is an integer by JSON Schema's own
    definition (the server's OpenAPI declares these fields integers)."""
    assert client.post("/v1/sessions/s1/record", json={"messages": [USER, REPLY]},
                       headers=AUTH).status_code == 200
    response = client.post(f"/v1/sessions/s1/{path}", json=body, headers=AUTH)
    assert response.status_code < 300, response.text


@pytest.mark.redis
@pytest.mark.parametrize("error", [5, [1], True, None])
def test_recover_error_of_neither_type_is_422_naming_error(client: TestClient,
                                                          error: Any) -> None:
    """``error`` is a string or an object: a value of neither names the field ``error``
    (not pydantic's union member, ``error.str``) and says what it may be."""
    response = client.post("/v1/sessions/s1/recover", json={"error": error}, headers=AUTH)
    assert response.status_code == 422, response.text
    body = response.json()["error"]
    assert body["code"] == "invalid_input"
    assert body["field"] == "error"
    assert "string" in body["message"] and "object" in body["message"]


@pytest.mark.redis
@pytest.mark.parametrize("path", ["prepare", "record", "recover", "recall", "compact"])
@pytest.mark.parametrize("raw", [b"null", b"5", b"[]", b'"x"'])
def test_a_body_that_is_not_a_json_object_is_422_naming_body(
        client: TestClient, path: str, raw: bytes) -> None:
    """Valid JSON of the wrong shape: the field at fault is the body itself (compact's
    body is optional: ``null`` there is no body, so it is not in this list)."""
    if path == "compact" and raw == b"null":
        return
    response = client.post(f"/v1/sessions/s1/{path}", content=raw,
                           headers={**AUTH, "Content-Type": "application/json"})
    assert response.status_code == 422, response.text
    body = response.json()["error"]
    assert body["code"] == "invalid_input"
    assert body["field"] == "body"
    assert "JSON object" in body["message"]
