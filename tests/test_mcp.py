"""``compaction mcp``: the real MCP server, driven in-process by the SDK's own client
over memory streams (no mocks): tool listing, recall, context_stats, compact, errors."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

pytest.importorskip("mcp")

from mcp import Client

from shared.core.config import StoreConfig
from shared.store.recall_index import drop_index
from shared.store.sessions import SessionStore
from tests.mcp_support import mcp_http_server
from workers.cli.mcp import build_server
from workers.settings import Settings

pytestmark = pytest.mark.redis


def _messages() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(60):
        out.append({"role": "user", "content": f"step {i}: open src/mod{i}/handler_{i}.py "
                                               + "context " * 40})
        out.append({"role": "assistant", "content": f"saw ERR_STEP_{i}_FAILED at line {i}"})
    return out


def _run(settings: Settings, store: SessionStore, calls: list[tuple[str, dict[str, Any]]]
         ) -> tuple[list[str], list[Any]]:
    server = build_server(store, settings)

    async def main() -> tuple[list[str], list[Any]]:
        async with Client(server) as client:
            tools = await client.list_tools()
            results = [await client.call_tool(name, args) for name, args in calls]
            return sorted(t.name for t in tools.tools), results

    return anyio.run(main)


def test_mcp_tools_end_to_end(redis_url: str, real_redis: Any, key_prefix: str) -> None:
    settings = Settings(redis_url=redis_url, key_prefix=key_prefix, tenant="acme")
    store = SessionStore(real_redis, StoreConfig(key_prefix=key_prefix), tenant="acme")
    store.append("s1", _messages())
    names, results = _run(settings, store, [
        ("compact", {"session_id": "s1", "keep_recent": 300}),
        ("recall", {"session_id": "s1", "query": "ERR_STEP_4_FAILED", "limit": 2}),
        ("context_stats", {"session_id": "s1"}),
        ("recall", {"session_id": "s1", "query": ""}),
        ("recall", {"session_id": "nobody", "query": "x1"}),
        ("compact", {"session_id": "s1", "keep_recent": -1}),
    ])
    assert names == ["compact", "context_stats", "recall"]
    compacted, found, stats, empty, unknown, bad = results
    assert not compacted.is_error, compacted.content
    outcome = compacted.structured_content
    assert outcome["status"] == "compacted" and outcome["watermark_after"] > 9
    assert outcome["recall_index"]["indexed_until"] == outcome["watermark_after"]
    assert not found.is_error
    hits = found.structured_content["hits"]
    assert hits[0]["index"] == 9 and "ERR_STEP_4_FAILED" in hits[0]["text"]
    assert found.content[0].text.startswith("[message 9, assistant")  # the rendered hits
    figures = stats.structured_content
    assert figures["tenant"] == "acme" and figures["length"] == 120
    assert figures["recall_index"]["indexed_until"] == figures["watermark"]
    assert empty.is_error and "query" in json.dumps(empty.model_dump(mode="json"))
    assert unknown.is_error and "nobody" in json.dumps(unknown.model_dump(mode="json"))
    assert bad.is_error and "keep_recent" in json.dumps(bad.model_dump(mode="json"))
    drop_index(store, "s1")


def test_mcp_server_is_bound_to_its_tenant(redis_url: str, real_redis: Any,
                                           key_prefix: str) -> None:
    settings = Settings(redis_url=redis_url, key_prefix=key_prefix, tenant="other")
    acme = SessionStore(real_redis, StoreConfig(key_prefix=key_prefix), tenant="acme")
    acme.append("s1", _messages())
    other = SessionStore(real_redis, StoreConfig(key_prefix=key_prefix), tenant="other")
    _, (result,) = _run(settings, other, [("recall", {"session_id": "s1",
                                                      "query": "ERR_STEP_4_FAILED"})])
    assert result.is_error and "no session" in json.dumps(result.model_dump(mode="json"))


@pytest.mark.slow
def test_mcp_over_stdio_in_a_subprocess(redis_url: str, real_redis: Any,
                                        key_prefix: str) -> None:
    """The stdio transport, as an MCP client launches it (``python -m workers.cli.mcp``)."""
    import os
    import sys
    from pathlib import Path

    from mcp import StdioServerParameters

    store = SessionStore(real_redis, StoreConfig(key_prefix=key_prefix))
    store.append("s1", _messages())
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": root, "COMPACTION_REDIS_URL": redis_url,
           "COMPACTION_KEY_PREFIX": key_prefix}
    params = StdioServerParameters(command=sys.executable, args=["-m", "workers.cli.mcp"],
                                   env=env, cwd=root)

    async def main() -> Any:
        async with Client(params) as client:
            await client.call_tool("compact", {"session_id": "s1", "keep_recent": 300})
            return await client.call_tool("recall", {"session_id": "s1",
                                                     "query": "src/mod2/handler_2.py"})

    result = anyio.run(main)
    assert not result.is_error, result.content
    assert result.structured_content["hits"][0]["index"] == 4
    drop_index(store, "s1")


@pytest.mark.slow
def test_mcp_over_streamable_http(redis_url: str, real_redis: Any, key_prefix: str) -> None:
    """``--transport http``: a real HTTP server process, the SDK's client by URL."""
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    store = SessionStore(real_redis, StoreConfig(key_prefix=key_prefix))
    store.append("s1", _messages())
    token = "tok-default-0123456789abcdef"

    async def main(url: str) -> Any:
        auth = {"Authorization": f"Bearer {token}"}  # the HTTP transport needs a token
        async with httpx2.AsyncClient(headers=auth, timeout=30) as http, \
                Client(streamable_http_client(url, http_client=http)) as client:
            await client.call_tool("compact", {"session_id": "s1", "keep_recent": 300})
            return await client.call_tool("recall", {"session_id": "s1",
                                                     "query": "ERR_STEP_7_FAILED"})

    try:
        with mcp_http_server(redis_url, key_prefix, {token: "default"}) as url:
            result = anyio.run(main, url)
        assert not result.is_error, result.content
        assert result.structured_content["hits"][0]["index"] == 15
    finally:
        drop_index(store, "s1")
