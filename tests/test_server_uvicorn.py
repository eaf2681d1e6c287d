"""The HTTP API through a real socket: a uvicorn process, and httpx's ASGI transport."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

import httpx

from shared.core.config import StoreConfig
from shared.store.sessions import SessionStore
from workers.harness.stack.redis_server import RedisServer
from workers.server.app import create_app
from workers.server.config import ServerConfig
from workers.server.process import ServerProcess

TOKEN = "uvicorn-test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_a_real_uvicorn_process(redis_url: str, real_redis: Any, key_prefix: str) -> None:
    env = {"COMPACTION_REDIS_URL": redis_url, "COMPACTION_KEY_PREFIX": key_prefix,
           "COMPACTION_BROKER_URL": "memory://",  # jobs go nowhere: no worker here
           "COMPACTION_SERVER_TOKENS": json.dumps({TOKEN: "acme"}),
           "COMPACTION_SERVER_MAX_BODY_BYTES": "65536"}
    with ServerProcess(env) as server, httpx.Client(base_url=server.url, timeout=10) as http:
        turn = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
        response = http.post("/v1/sessions/u1/record", json={"messages": turn}, headers=AUTH)
        assert response.status_code == 200, response.text
        assert response.json()["length"] == 2
        view = http.post("/v1/sessions/u1/prepare", json={"format": "gemini"},
                         headers=AUTH).json()
        assert view["messages"] == [{"role": "user", "parts": [{"text": "hi"}]},
                                    {"role": "model", "parts": [{"text": "hello"}]}]
        assert http.get("/v1/sessions/u1/stats").status_code == 401
        big = http.post("/v1/sessions/u1/record", content=b"x" * 70_000, headers=AUTH)
        assert big.status_code == 413
        assert http.get("/openapi.json").json()["info"]["title"] == "context-compaction"
        metrics = http.get("/metrics")  # served at the path itself: no 307 to /metrics/
        assert metrics.status_code == 200, metrics.headers
        assert 'compaction_guard_prepare_duration_seconds_count{path="prepare"} 1.0' \
            in metrics.text
        compact = http.post("/v1/sessions/u1/compact", headers=AUTH)
        assert compact.status_code == 202 and compact.json()["task_id"]
    store = SessionStore(real_redis, StoreConfig(key_prefix=key_prefix), tenant="acme")
    assert store.length("u1") == 2  # in the tenant the token names


@pytest.mark.redis
def test_a_server_that_logs_a_lot_keeps_answering(own_redis: RedisServer) -> None:
    """Every request the server cannot serve logs a warning (Redis down: 503). Its stderr
    is drained while it runs: a pipe nobody reads fills at 64 kB, and the next log line
    blocked the server's event loop, so every request after ~300 failures hung."""
    env = {"COMPACTION_REDIS_URL": own_redis.url, "COMPACTION_KEY_PREFIX": "flood",
           "COMPACTION_BROKER_URL": "memory://",
           "COMPACTION_SERVER_TOKENS": json.dumps({TOKEN: "acme"})}
    sid = "s" * 128  # long log lines: the pipe's 64 kB in fewer requests
    with ServerProcess(env) as server, httpx.Client(base_url=server.url, timeout=5) as http:
        own_redis.stop()
        codes = {http.post(f"/v1/sessions/{sid}/prepare", json={}, headers=AUTH).status_code
                 for _ in range(600)}  # ~150 kB of warnings
        assert codes == {503}
        assert http.get("/healthz").status_code == 503
        assert len(server.stderr_tail()) > 1000
        assert "redis unavailable" in server.stderr_tail()


def test_httpx_asgi_transport(real_redis: Any, key_prefix: str) -> None:
    store = SessionStore(real_redis, StoreConfig(key_prefix=key_prefix))
    app = create_app(ServerConfig(), store, tokens={TOKEN: "default"})

    async def scenario() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            turn = [{"role": "user", "content": "hi"}]
            r = await http.post("/v1/sessions/a1/record", json={"messages": turn,
                                                                "format": "neutral"},
                                headers=AUTH)
            assert r.status_code == 200
            r = await http.post("/v1/sessions/a1/prepare", json={"format": "anthropic"},
                                headers=AUTH)
            assert r.json()["messages"] == [{"role": "user", "content": "hi"}]
            r = await http.get("/v1/sessions/a1/history", headers=AUTH)
            assert r.json()["summaries"] == []

    asyncio.run(scenario())
