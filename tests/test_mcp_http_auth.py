"""``compaction mcp --transport http`` requires a bearer token (the tokens of
``compaction serve``), driven by the real MCP client over streamable HTTP: with a token
it works, without one or with a wrong one it is refused (401, ``WWW-Authenticate``),
a token's tenant is the tenant served, and the server refuses to start without tokens."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

pytest.importorskip("mcp")

from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from shared.core.config import StoreConfig
from shared.core.errors import ConfigError
from shared.store.sessions import SessionStore
from tests.mcp_support import mcp_http_server
from workers.cli import main as cli
from workers.cli.mcp import http_tokens
from workers.server.bearer import bearer_token

ROOT = str(Path(__file__).resolve().parents[1])
ACME = "tok-acme-0123456789abcdef"
OTHER = "tok-other-0123456789abcdef"
TOKENS = json.dumps({ACME: "acme", OTHER: "other"})


def _no_token_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("COMPACTION_SERVER_"):
            monkeypatch.delenv(name)


def test_http_transport_refuses_to_start_without_a_token(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _no_token_env(monkeypatch)
    monkeypatch.setenv("COMPACTION_REDIS_URL", "redis://127.0.0.1:1/0")  # never reached
    code = cli.main(["mcp", "--transport", "http", "--host", "0.0.0.0", "--tenant", "acme"])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert "COMPACTION_SERVER_TOKENS_FILE" in err and "refusing" in err


def test_http_tokens_are_the_servers_and_tenant_restricts_them(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _no_token_env(monkeypatch)
    with pytest.raises(ConfigError, match="COMPACTION_SERVER_TOKENS_FILE"):
        http_tokens()
    path = tmp_path / "tokens.json"
    path.write_text(TOKENS)
    monkeypatch.setenv("COMPACTION_SERVER_TOKENS_FILE", str(path))
    book = http_tokens()
    assert book.tenant(ACME) == "acme" and book.tenant(OTHER) == "other"
    only = http_tokens("acme")
    assert only.tenant(ACME) == "acme" and only.tenant(OTHER) is None
    with pytest.raises(ConfigError, match="no token of that tenant"):
        http_tokens("nobody")
    monkeypatch.setenv("COMPACTION_SERVER_TOKENS_FILE", str(tmp_path / "missing.json"))
    with pytest.raises(ConfigError, match="COMPACTION_SERVER_TOKENS_FILE"):
        http_tokens()


def test_bearer_token_parsing() -> None:
    assert bearer_token(f"Bearer {ACME}") == ACME
    assert bearer_token(f"bearer  {ACME} ") == ACME
    assert bearer_token("Basic Zm9vOmJhcg==") is None
    assert bearer_token("Bearer ") is None
    assert bearer_token(None) is None


def test_mcp_help_documents_the_token(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["mcp", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "Authorization: Bearer <token>" in out and "COMPACTION_SERVER_TOKENS_FILE" in out


def _messages() -> list[dict[str, Any]]:
    return [m for i in range(6) for m in (
        {"role": "user", "content": f"step {i}: open src/mod{i}/handler_{i}.py"},
        {"role": "assistant", "content": f"saw ERR_STEP_{i}_FAILED at line {i}"})]


@pytest.fixture
def mcp_http(redis_url: str, key_prefix: str) -> Iterator[str]:
    """``python -m workers.cli.mcp --transport http`` with two tenants' tokens; its URL."""
    with mcp_http_server(redis_url, key_prefix, json.loads(TOKENS)) as url:
        yield url


def _call(url: str, token: str | None, name: str, args: dict[str, Any]) -> Any:
    import httpx2

    headers = {"Authorization": f"Bearer {token}"} if token else {}

    async def main() -> Any:
        async with httpx2.AsyncClient(headers=headers, timeout=30) as http, \
                Client(streamable_http_client(url, http_client=http)) as client:
            return await client.call_tool(name, args)

    return anyio.run(main)


@pytest.mark.redis
@pytest.mark.slow
def test_mcp_http_requires_a_token_and_binds_its_tenant(
        mcp_http: str, real_redis: Any, key_prefix: str) -> None:
    acme = SessionStore(real_redis, StoreConfig(key_prefix=key_prefix), tenant="acme")
    acme.append("s1", _messages())

    stats = _call(mcp_http, ACME, "context_stats", {"session_id": "s1"})
    assert not stats.is_error, stats.content
    assert stats.structured_content["tenant"] == "acme"
    assert stats.structured_content["length"] == 12

    # the other tenant's token reaches the other tenant's (empty) namespace only
    theirs = _call(mcp_http, OTHER, "context_stats", {"session_id": "s1"})
    assert theirs.is_error and "no session" in json.dumps(theirs.model_dump(mode="json"))
    assert "'other'" in json.dumps(theirs.model_dump(mode="json"))

    for token in (None, "tok-wrong-0123456789abcdef"):
        with pytest.raises(Exception):  # noqa: B017 - the client fails to connect at all
            _call(mcp_http, token, "context_stats", {"session_id": "s1"})

    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "probe", "version": "0"}}}
    headers = {"Accept": "application/json, text/event-stream"}
    for auth in ({}, {"Authorization": "Bearer tok-wrong-0123456789abcdef"},
                 {"Authorization": "Basic Zm9vOmJhcg=="}):
        answer = httpx.post(mcp_http, json=init, headers={**headers, **auth}, timeout=10)
        assert answer.status_code == 401, answer.text
        assert answer.headers["www-authenticate"] == "Bearer"
        assert answer.json()["error"]["code"] == "unauthorized"
    ok = httpx.post(mcp_http, json=init, headers={**headers, "Authorization": f"Bearer {ACME}"},
                    timeout=10)
    assert ok.status_code == 200, ok.text
