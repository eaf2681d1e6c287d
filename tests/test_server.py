"""The HTTP API in-process (FastAPI's TestClient) over a real Redis."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("fastapi")

import redis
from fastapi.testclient import TestClient

from shared.core.config import StoreConfig
from shared.enqueue import CallbackEnqueuer
from shared.store.sessions import SessionStore, connect
from workers.server.app import create_app
from workers.server.config import ServerConfig, TokenBook, load_server_config

ALPHA, BETA = "alpha-token-0123456789", "beta-token-01234567890"
TOKENS = {ALPHA: "alpha", BETA: "beta"}
A = {"Authorization": f"Bearer {ALPHA}"}
B = {"Authorization": f"Bearer {BETA}"}
TURN = [
    {"role": "user", "content": "What is in /src?"},
    {"role": "assistant", "content": None,
     "tool_calls": [{"id": "c1", "type": "function",
                     "function": {"name": "ls", "arguments": "{\"path\": \"/src\"}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "a.py b.py"},
    {"role": "assistant", "content": "Two files: a.py and b.py."},
]
OVERFLOW = ("This model's maximum context length is 4000 tokens. However, your messages "
            "resulted in 9000 tokens. Please reduce the length of the messages.")


class Recorder:
    def __init__(self) -> None:
        self.jobs: list[tuple[str, str]] = []
        self.compactions: list[tuple[str, str, int | None, bool]] = []

    def compact(self, tenant: str, sid: str, keep: int | None, force: bool) -> str:
        self.compactions.append((tenant, sid, keep, force))
        return f"task-{len(self.compactions)}"


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def store(real_redis: Any, key_prefix: str) -> SessionStore:
    return SessionStore(real_redis, StoreConfig(key_prefix=key_prefix), tenant="alpha")


@pytest.fixture
def client(store: SessionStore, recorder: Recorder) -> Iterator[TestClient]:
    config = ServerConfig(max_body_bytes=64 * 1024)
    app = create_app(config, store, CallbackEnqueuer(lambda t, s: recorder.jobs.append((t, s))),
                     overrides={"tiny": 1200}, compact=recorder.compact, tokens=TOKENS)
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def record(client: TestClient, sid: str, messages: list[Any] = TURN,
           headers: dict[str, str] = A, **kw: Any) -> Any:
    response = client.post(f"/v1/sessions/{sid}/record", json={"messages": messages, **kw},
                           headers=headers)
    return response


def error(response: Any) -> dict[str, Any]:
    body: dict[str, Any] = response.json()["error"]
    return body


# -- contract ------------------------------------------------------------------------------
def test_openapi_schema_lists_every_endpoint_with_bearer_auth(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    paths = set(schema["paths"])
    for name in ("prepare", "record", "recover", "recall", "stats", "compact", "history"):
        assert f"/v1/sessions/{{session_id}}/{name}" in paths
    assert schema["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    assert "ErrorOut" in schema["components"]["schemas"]


def test_record_then_prepare_in_every_wire_format(client: TestClient, recorder: Recorder,
                                                  store: SessionStore) -> None:
    response = record(client, "s1", usage={"prompt_tokens": 120})
    assert response.status_code == 200, response.text
    assert response.json() == {"session_id": "s1", "length": 4}
    assert recorder.jobs == [("alpha", "s1")]  # enqueued off the hot path
    assert store.length("s1") == 4

    body = {"system_prompt": "Be brief.", "pending": [{"role": "user", "content": "And /lib?"}],
            "max_tokens": 500}
    out = client.post("/v1/sessions/s1/prepare", json=body, headers=A).json()
    assert out["format"] == "openai"
    assert out["messages"][0] == {"role": "system", "content": "Be brief."}
    assert out["messages"][1:] == [*TURN, {"role": "user", "content": "And /lib?"}]
    assert out["report"]["budget"]["within_budget"] is True
    assert out["report"]["length"] == 4

    out = client.post("/v1/sessions/s1/prepare", json={**body, "format": "anthropic",
                                                       "pending": []}, headers=A).json()
    assert out["system"] == "Be brief."
    assert out["messages"][1]["content"][0]["type"] == "tool_use"

    out = client.post("/v1/sessions/s1/prepare", json={**body, "format": "gemini",
                                                       "pending": []}, headers=A).json()
    assert out["system"] == {"parts": [{"text": "Be brief."}]}
    assert "function_call" in json.dumps(out["messages"])


def test_record_accepts_anthropic_and_is_idempotent(client: TestClient) -> None:
    turn = [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "text", "text": "hello"}]}]
    first = record(client, "s2", turn, format="anthropic", request_id="req-1")
    again = record(client, "s2", turn, format="anthropic", request_id="req-1")
    assert first.json()["length"] == again.json()["length"] == 2


def test_a_request_id_reused_for_another_turn_is_422_naming_it(client: TestClient,
                                                                store: SessionStore) -> None:
    assert record(client, "s2b", TURN, request_id="req-1").json()["length"] == 4
    other = [{"role": "user", "content": "another question"},
             {"role": "assistant", "content": "another answer"}]
    response = record(client, "s2b", other, request_id="req-1")
    assert response.status_code == 422, response.text
    assert error(response)["code"] == "invalid_input"
    assert error(response)["field"] == "request_id"
    assert "different turn" in error(response)["message"]
    assert store.length("s2b") == 4


# -- auth and tenants -------------------------------------------------------------------------
@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer nope-not-a-token-at-all"},
                                     {"Authorization": f"Basic {ALPHA}"},
                                     {"Authorization": ALPHA}])
def test_401_without_a_valid_bearer_token(client: TestClient, headers: dict[str, str]) -> None:
    response = client.get("/v1/sessions/s1/stats", headers=headers)
    assert response.status_code == 401
    assert error(response)["code"] == "unauthorized"
    assert response.headers["www-authenticate"] == "Bearer"


def test_a_tenant_reaches_only_its_own_sessions(client: TestClient, store: SessionStore) -> None:
    record(client, "shared-name")
    assert client.get("/v1/sessions/shared-name/stats", headers=A).status_code == 200
    response = client.get("/v1/sessions/shared-name/stats", headers=B)
    assert response.status_code == 404 and error(response)["code"] == "session_not_found"
    record(client, "shared-name", TURN[:1], headers=B)
    assert store.length("shared-name") == 4  # alpha's log untouched
    assert store.for_tenant("beta").length("shared-name") == 1


def test_token_book_compares_every_token() -> None:
    book = TokenBook(TOKENS)
    assert book.tenant(ALPHA) == "alpha" and book.tenant(BETA) == "beta"
    assert book.tenant(ALPHA[:-1]) is None and book.tenant("") is None


def test_config_reads_tokens_from_a_secret_file(tmp_path: Any) -> None:
    secret = tmp_path / "tokens.json"
    secret.write_text(json.dumps(TOKENS))
    assert load_server_config(tokens_file=secret).token_map() == TOKENS
    secret.write_text('{"short": "alpha"}')
    with pytest.raises(ValueError, match="COMPACTION_SERVER_TOKENS_FILE: token #1 is shorter"):
        load_server_config(tokens_file=secret)
    with pytest.raises(ValueError, match="no bearer token configured"):
        create_app(ServerConfig(), SessionStore(redis.Redis()))


# -- size limit and bad input ---------------------------------------------------------------------
def test_413_over_the_byte_limit_before_parsing(client: TestClient, store: SessionStore) -> None:
    big = [{"role": "user", "content": "x" * 70_000}]
    response = record(client, "big", big)
    assert response.status_code == 413 and error(response)["code"] == "payload_too_large"

    def chunks() -> Iterator[bytes]:  # streamed: no Content-Length, counted as it arrives
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(20):
            yield b"y" * 4096
        yield b'"}]}'

    response = client.post("/v1/sessions/big/record", content=chunks(),
                           headers={**A, "Content-Type": "application/json"})
    assert response.status_code == 413
    assert store.length("big") == 0


def test_malformed_bodies_name_what_was_wrong(client: TestClient, store: SessionStore) -> None:
    response = client.post("/v1/sessions/s3/record", content=b"{not json",
                           headers={**A, "Content-Type": "application/json"})
    assert response.status_code == 400 and error(response)["code"] == "invalid_json"

    bad = [TURN[0], {"role": "tool", "content": "orphan"}]
    response = record(client, "s3", bad)
    assert response.status_code == 422
    assert error(response) == {"code": "invalid_input", "field": "messages[1].tool_call_id",
                               "message": "required"}
    response = client.post("/v1/sessions/s3/prepare", json={"pending": [{"role": "robot"}]},
                           headers=A)
    assert response.status_code == 422 and error(response)["field"] == "pending[0].role"
    response = client.post("/v1/sessions/s3/prepare", json={"max_tokens": 0}, headers=A)
    assert response.status_code == 422 and error(response)["field"] == "max_tokens"
    response = client.post("/v1/sessions/s3/prepare", json={"surprise": 1}, headers=A)
    assert response.status_code == 422 and error(response)["field"] == "surprise"
    response = client.get("/v1/sessions/bad%20id/stats", headers=A)
    assert response.status_code == 422 and error(response)["field"] == "session_id"
    assert store.length("s3") == 0  # nothing half-written


@pytest.mark.parametrize(("body", "reason"), [
    (b'{"messages":[{"role":"user","content":"\xff\xfe"}]}', "can't decode byte 0xff"),
    (b"[" * 50_000, "recursion"),  # under the 64 kB limit of this app
])
def test_a_body_that_cannot_be_decoded_is_invalid_json_with_the_reason(
        client: TestClient, store: SessionStore, body: bytes, reason: str) -> None:
    """Invalid UTF-8 or nesting too deep for the parser: not JSON either (400 invalid_json,
    as documented), with what the parser said, not a generic bad_request."""
    response = client.post("/v1/sessions/s3/record", content=body,
                           headers={**A, "Content-Type": "application/json"})
    assert response.status_code == 400
    assert error(response)["code"] == "invalid_json"
    assert reason in error(response)["message"]
    assert store.length("s3") == 0


# -- recover, stats, compact, history ------------------------------------------------------------
def test_recover_gives_a_compacted_view_only_for_overflows(client: TestClient) -> None:
    for i in range(30):
        record(client, "long", [{"role": "user", "content": f"step {i} " + "word " * 200},
                                {"role": "assistant", "content": "ok " * 50}])
    response = client.post("/v1/sessions/long/recover",
                           json={"error": OVERFLOW, "status": 400, "model": "gpt-4o"}, headers=A)
    out = response.json()
    assert response.status_code == 200 and out["recovered"] is True
    assert out["view"]["report"]["recovery"] is True
    assert out["view"]["report"]["estimated_prompt_tokens"] <= 4000  # the learned window
    body = {"error": {"error": {"message": "Rate limit reached for requests",
                                "type": "requests", "code": "rate_limit_exceeded"}},
            "status": 429}
    assert client.post("/v1/sessions/long/recover", json=body, headers=A).json() == {
        "recovered": False, "view": None}


def test_a_numberless_overflow_recovered_by_another_process_uses_the_prepared_size(
        client: TestClient, store: SessionStore) -> None:
    """Two server processes (two apps on one store): the one that recovers did not make the
    prepare; the error states no window. Without ``prepared_tokens`` it plans the view the
    prepare made of the same session and arguments (it writes none); with it, the
    client's figure."""
    for i in range(30):
        record(client, "other", [{"role": "user", "content": f"step {i} " + "word " * 200},
                                 {"role": "assistant", "content": "ok " * 50}])
    prepared = client.post("/v1/sessions/other/prepare", json={"model": "gpt-4o"},
                           headers=A).json()["report"]["estimated_prompt_tokens"]
    assert prepared > 5_000
    quiet = {"error": "the request exceeds the available context size, try increasing it",
             "status": 400, "model": "gpt-4o"}
    with TestClient(create_app(ServerConfig(), store, tokens=TOKENS)) as second:
        before = second.post("/v1/sessions/other/recover", json=quiet, headers=A).json()
        assert before["view"]["report"]["budget"]["window"] == prepared  # the same bound
        store.update_state("other", learned_window=0)  # as if the bound was never learned
        bad = second.post("/v1/sessions/other/recover", json={**quiet, "prepared_tokens": 0},
                          headers=A)
        assert bad.status_code == 422 and error(bad)["field"] == "prepared_tokens"
    with TestClient(create_app(ServerConfig(), store, tokens=TOKENS)) as third:
        out = third.post("/v1/sessions/other/recover",
                         json={**quiet, "prepared_tokens": prepared}, headers=A).json()
        assert out["view"]["report"]["budget"]["window"] == prepared
    assert store.state("other").learned_window == prepared


def test_a_turn_recorded_by_another_process_is_in_the_view_given_its_length(
        client: TestClient, store: SessionStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two server processes: the second served the session before, and Redis's notice of
    the first one's record has not reached it yet; the client passes the length its record
    returned, and the view holds the turn."""
    import shared.store.changes as changes

    record(client, "handed")
    with TestClient(create_app(ServerConfig(), store, tokens=TOKENS)) as second:
        for _ in range(2):
            second.post("/v1/sessions/handed/prepare", json={"model": "gpt-4o"}, headers=A)
        monkeypatch.setattr(changes._Seen, "since",  # every notice still in flight
                            lambda self, base, epoch, seq: changes.NOTHING)
        length = record(client, "handed", [{"role": "user", "content": "the new question"},
                                           {"role": "assistant", "content": "its answer"}]
                        ).json()["length"]
        stale = second.post("/v1/sessions/handed/prepare", json={"model": "gpt-4o"},
                            headers=A).json()
        assert stale["messages"][-1]["content"] != "its answer"  # without the length
        view = second.post("/v1/sessions/handed/prepare",
                           json={"model": "gpt-4o", "min_length": length}, headers=A).json()
        assert view["messages"][-1]["content"] == "its answer"
        bad = second.post("/v1/sessions/handed/prepare", json={"min_length": -1}, headers=A)
        assert bad.status_code == 422 and error(bad)["field"] == "min_length"


def test_irreducible_overflow_is_409(client: TestClient) -> None:
    response = client.post("/v1/sessions/s4/prepare",
                           json={"model": "tiny", "system_prompt": "rule " * 2000}, headers=A)
    assert response.status_code == 409
    body = error(response)
    assert body["code"] == "irreducible_overflow" and body["window"] == 1200


def test_stats_compact_history(client: TestClient, recorder: Recorder) -> None:
    for name in ("stats", "history"):
        response = client.get(f"/v1/sessions/none/{name}", headers=A)
        assert response.status_code == 404 and error(response)["code"] == "session_not_found"
    assert client.post("/v1/sessions/none/compact", headers=A).status_code == 404
    record(client, "s5")
    stats = client.get("/v1/sessions/s5/stats", headers=A).json()
    assert stats["length"] == 4 and stats["tenant"] == "alpha"
    response = client.post("/v1/sessions/s5/compact", json={"keep_recent": 100, "force": True},
                           headers=A)
    assert response.status_code == 202
    assert response.json() == {"session_id": "s5", "task_id": "task-1",
                               "task": "compaction.compact"}
    assert recorder.compactions == [("alpha", "s5", 100, True)]
    history = client.get("/v1/sessions/s5/history", headers=A).json()
    assert history == {"session_id": "s5", "watermark": 0, "summaries": []}


def test_store_unavailable_is_503(key_prefix: str) -> None:
    # The client the server builds (connect: no silent retries); a hand-made redis.Redis
    # retries with backoff, about 4 s per call to a dead port, for the same outcome.
    config = StoreConfig(key_prefix=key_prefix, socket_timeout=0.2, connect_timeout=0.2)
    dead = connect("redis://127.0.0.1:1/0", config)
    app = create_app(ServerConfig(), SessionStore(dead, config), tokens=TOKENS)
    with TestClient(app, raise_server_exceptions=False) as c:
        response = c.post("/v1/sessions/s/prepare", json={}, headers=A)
        assert response.status_code == 503
        assert error(response)["code"] == "store_unavailable"
        assert c.get("/healthz").status_code == 503


def test_healthz_needs_no_token(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}


# -- the CLI command ---------------------------------------------------------------------------
def test_serve_imports_fastapi_only_when_run() -> None:
    code = ("import sys, workers.cli.serve; "
            "assert 'fastapi' not in sys.modules and 'uvicorn' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_serve_without_the_extra_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ConfigError, which the CLI prints as its one error line (``compaction: error:
    ...``, exit 2; the no-extras install test runs it whole)."""
    import argparse

    from shared.core.errors import ConfigError
    from workers.cli import serve
    from workers.settings import load_settings

    monkeypatch.setitem(sys.modules, "uvicorn", None)  # import uvicorn -> ImportError
    args = argparse.Namespace(host=None, port=None, workers=None, log_level="info")
    with pytest.raises(ConfigError, match=r"^serve needs the 'server' extra: pip install "
                                          r"'context-compaction\[server\]'$"):
        serve.run(args, load_settings())


def test_tenants_share_one_bounded_view_cache(store: SessionStore) -> None:
    """One cache per process, bounded by the server's settings, whatever the tenants; a
    session id two tenants use stays two sessions."""
    config = ServerConfig(max_body_bytes=64 * 1024, cache_sessions=1, cache_messages=1000)
    app = create_app(config, store, tokens=TOKENS)
    body = {"system_prompt": "Be brief.", "max_tokens": 500}
    with TestClient(app, raise_server_exceptions=False) as c:
        record(c, "same", headers=A)
        record(c, "same", TURN[:1], headers=B)
        alpha = c.post("/v1/sessions/same/prepare", json=body, headers=A).json()
        beta = c.post("/v1/sessions/same/prepare", json=body, headers=B).json()
        again = c.post("/v1/sessions/same/prepare", json=body, headers=A).json()
        for headers in (A, B):  # a turn in progress each: one bound holds both
            c.post("/v1/sessions/same/prepare", json={**body, "pending": TURN[:1]},
                   headers=headers).raise_for_status()
    assert alpha["messages"][1:] == again["messages"][1:] == TURN
    assert beta["messages"][1:] == TURN[:1]
    server = app.state.server
    views = server.guard("alpha").views
    assert views is not server.guard("beta").views and views.max_sessions == 1
    assert len(views) == 1  # the bound is the process's, not each tenant's
    turns, _ = views.pending()
    assert turns.max_size == config.cache_pending_tokens and len(turns) == 2


def test_cache_bounds_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPACTION_SERVER_TOKENS", json.dumps(TOKENS))
    monkeypatch.setenv("COMPACTION_SERVER_CACHE_SESSIONS", "5000")
    monkeypatch.setenv("COMPACTION_SERVER_CACHE_MESSAGES", "1000000")
    monkeypatch.setenv("COMPACTION_SERVER_CACHE_PENDING_TOKENS", "2000")
    config = load_server_config()
    assert (config.cache_sessions, config.cache_messages, config.cache_pending_tokens) == \
        (5000, 1_000_000, 2000)
    monkeypatch.setenv("COMPACTION_SERVER_CACHE_SESSIONS", "-1")
    with pytest.raises(ValueError, match="COMPACTION_SERVER_CACHE_SESSIONS"):
        load_server_config()


def test_start_up_errors_are_configuration_errors_naming_their_source(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """No token is a ConfigError (one line from the CLI, exit 2), not a bare ValueError; a
    bad value given as an option is named by the option, from the environment by the
    variable."""
    from shared.core.errors import ConfigError
    from workers.server.config import require_tokens

    for name in ("COMPACTION_SERVER_TOKENS", "COMPACTION_SERVER_TOKENS_FILE",
                 "COMPACTION_SERVER_PORT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError, match="no bearer token configured"):
        create_app(ServerConfig(), SessionStore(redis.Redis()))
    with pytest.raises(ConfigError, match="no bearer token configured"):
        require_tokens(load_server_config())
    with pytest.raises(ConfigError, match=r"invalid configuration: --port=99999: .*65535"):
        load_server_config(flags={"port": "--port"}, port=99999)
    monkeypatch.setenv("COMPACTION_SERVER_PORT", "99999")
    with pytest.raises(ConfigError, match=r"COMPACTION_SERVER_PORT='99999': .*65535"):
        load_server_config(flags={"port": "--port"})
