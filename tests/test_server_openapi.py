"""/openapi.json says what each operation really answers: every status a request below
observes is declared for its operation (and every declared one is observed: nothing
impossible is declared), and every JSON body validates against the declared schema."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("jsonschema")

import jsonschema
from fastapi.testclient import TestClient

from shared.core.config import StoreConfig
from shared.core.errors import StoreUnavailable
from shared.store.sessions import SessionStore
from workers.server.app import ServerState, create_app
from workers.server.config import ServerConfig
from workers.server.schemas import StatsOut

pytestmark = pytest.mark.redis

TOKEN = "openapi-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
JSON = {**AUTH, "Content-Type": "application/json"}
TURN = [
    {"role": "user", "content": "What is in /src? " + "src/app/main.py ERR_CONN_RESET " * 60},
    {"role": "assistant", "content": None,
     "tool_calls": [{"id": "c1", "type": "function",
                     "function": {"name": "ls", "arguments": "{\"path\": \"/src\"}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "a.py b.py " * 80},
    {"role": "assistant", "content": "Two files: a.py and b.py."},
]
OVERFLOW = ("This model's maximum context length is 4000 tokens. However, your messages "
            "resulted in 9000 tokens. Please reduce the length of the messages.")
HUGE_SYSTEM = "You are a careful agent. " * 400  # alone over the tiny model's window

# what each operation can answer (besides its success status)
EXPECTED = {
    ("post", "prepare"): {400, 401, 409, 413, 422, 500, 503},
    ("post", "record"): {400, 401, 413, 422, 500, 503},
    ("post", "recover"): {400, 401, 413, 422, 500, 503},  # no smaller view: recovered false
    ("post", "recall"): {400, 401, 404, 413, 422, 500, 503},
    ("get", "stats"): {401, 404, 422, 500, 503},
    ("post", "compact"): {400, 401, 404, 413, 422, 500, 503},
    ("get", "history"): {401, 404, 422, 500, 503},
    ("get", "healthz"): {503},
}


class Observed:
    def __init__(self, client: TestClient) -> None:
        self.client = client
        self.seen: list[tuple[str, str, int, Any]] = []

    def __call__(self, method: str, path: str, status: int, **kw: Any) -> Any:
        kw.setdefault("headers", AUTH)
        response = self.client.request(method.upper(), path, **kw)
        assert response.status_code == status, (method, path, response.text)
        body = response.json() if response.headers.get("content-type", "").startswith(
            "application/json") else None
        self.seen.append((method, path, response.status_code, body))
        return body


@pytest.fixture
def app_client(real_redis: Any, key_prefix: str) -> Iterator[TestClient]:
    store = SessionStore(real_redis, StoreConfig(key_prefix=key_prefix), tenant="acme")
    app = create_app(ServerConfig(max_body_bytes=64 * 1024), store, tokens={TOKEN: "acme"},
                     overrides={"tiny": 1200}, compact=lambda *a: "task-1")
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


def _operation(spec: dict[str, Any], method: str, path: str) -> tuple[str, dict[str, Any]]:
    for template, ops in spec["paths"].items():
        if re.fullmatch(re.sub(r"\{[^}]+\}", "[^/]+", template), path) and method in ops:
            return template, ops[method]
    raise AssertionError(f"{method} {path}: no operation in the schema")


def test_every_observed_status_and_body_is_declared(
        app_client: TestClient, real_redis: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    call = Observed(app_client)
    s = "/v1/sessions/s1"
    big = b'{"pad": "' + b"x" * 70_000 + b'"}'
    # successes
    call("post", f"{s}/record", 200, json={"messages": TURN})
    view = call("post", f"{s}/prepare", 200, json={"pending": [{"role": "user", "content": "hi"}],
                                                   "max_tokens": 100})
    assert isinstance(view["report"]["estimated_prompt_tokens"], int)  # the TypeScript read
    call("post", f"{s}/prepare", 200, json={"format": "anthropic"})
    call("post", f"{s}/prepare", 200, json={"model": "tiny", "max_tokens": 100})  # truncates
    call("post", f"{s}/recover", 200, json={"error": "rate limit exceeded", "status": 429})
    call("post", f"{s}/recover", 200, json={"error": OVERFLOW, "status": 400, "format": "gemini"})
    call("post", f"{s}/recall", 200, json={"query": "ERR_CONN_RESET", "limit": 2})
    call("get", f"{s}/stats", 200, headers=AUTH)
    state = app_client.app.state.server  # type: ignore[attr-defined]
    assert set(state.guard("acme").stats("s1")) == set(StatsOut.model_fields)  # no drift
    call("post", f"{s}/compact", 202, json={"keep_recent": 100}, headers=AUTH)
    call("post", f"{s}/compact", 202, headers=AUTH)
    call("get", f"{s}/history", 200, headers=AUTH)
    call("get", "/healthz", 200, headers={})
    # errors of the request
    for method, path in (("post", "prepare"), ("post", "record"), ("post", "recover"),
                         ("post", "recall"), ("post", "compact")):
        call(method, f"{s}/{path}", 400, content=b"{oops", headers=JSON)
        call(method, f"{s}/{path}", 413, content=big, headers=JSON)
        call(method, f"{s}/{path}", 401, json={}, headers={})
        call(method, f"{s}/{path}", 422, json={"surprise": 1}, headers=AUTH)
    for path in ("stats", "history"):
        call("get", f"{s}/{path}", 401, headers={})
        call("get", f"/v1/sessions/bad%20id/{path}", 422, headers=AUTH)
    for method, path, body in (("get", "stats", None), ("get", "history", None),
                               ("post", "compact", {}), ("post", "recall", {"query": "x1"})):
        call(method, f"/v1/sessions/nobody/{path}", 404, json=body, headers=AUTH)
    overflow = call("post", f"{s}/prepare", 409, json={"model": "tiny",
                                                       "system_prompt": HUGE_SYSTEM})
    assert overflow["error"]["fixed_tokens"] > overflow["error"]["window"]
    hopeless = call("post", f"{s}/recover", 200, json={
        "model": "tiny", "system_prompt": HUGE_SYSTEM, "error": OVERFLOW, "status": 400})
    assert hopeless == {"recovered": False, "view": None}
    # the server's own failures, on every operation
    routes = [("post", "prepare", {}), ("post", "record", {"messages": TURN[:1]}),
              ("post", "recover", {"error": OVERFLOW}), ("post", "recall", {"query": "x1"}),
              ("get", "stats", None), ("post", "compact", {}), ("get", "history", None)]
    for status, fault in ((500, RuntimeError("boom")), (503, StoreUnavailable("Redis down"))):
        def broken(self: ServerState, tenant: str, fault: Exception = fault) -> Any:
            raise fault
        with monkeypatch.context() as patch:
            patch.setattr(ServerState, "guard", broken)
            for method, path, body in routes:
                call(method, f"{s}/{path}", status, json=body, headers=AUTH)

    class Down:
        def ping(self) -> None:
            raise ConnectionError("refused")

    with monkeypatch.context() as patch:
        patch.setattr(state.store, "redis", Down())
        call("get", "/healthz", 503, headers={})

    spec = app_client.get("/openapi.json").json()
    components = spec["components"]
    observed: dict[tuple[str, str], set[int]] = {}
    for method, path, status, body in call.seen:
        template, op = _operation(spec, method, path)
        declared = op["responses"]
        assert str(status) in declared, f"{method} {template}: {status} not declared"
        schema = declared[str(status)]["content"]["application/json"]["schema"]
        jsonschema.Draft202012Validator({**schema, "components": components}).validate(body)
        if status >= 400:
            observed.setdefault((method, template.rsplit("/", 1)[-1]), set()).add(status)
    assert observed == EXPECTED
    for (method, name), codes in EXPECTED.items():  # nothing impossible is declared
        path = next(p for p in spec["paths"] if p.endswith(f"/{name}"))
        declared = {int(c) for c in spec["paths"][path][method]["responses"] if c[0] in "45"}
        assert declared == codes, (method, name)


def test_stats_and_report_are_typed_in_the_schema(app_client: TestClient) -> None:
    spec = app_client.get("/openapi.json").json()
    comps = spec["components"]["schemas"]
    report = comps["PreparedOut"]["properties"]["report"]
    ref = report.get("$ref") or report["allOf"][0]["$ref"]
    view_report = comps[ref.rsplit("/", 1)[-1]]
    assert view_report["properties"]["estimated_prompt_tokens"]["type"] == "integer"
    stats = spec["paths"]["/v1/sessions/{session_id}/stats"]["get"]["responses"]["200"]
    assert stats["content"]["application/json"]["schema"]["$ref"].endswith("/StatsOut")
    assert set(comps["OverflowErrorBody"]["properties"]) >= {"fixed_tokens", "window"}
    assert "HTTPValidationError" not in comps  # 422 is the server's own error body
