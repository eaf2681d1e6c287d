"""``POST /v1/sessions/{id}/recall`` in-process (FastAPI's TestClient) over a real Redis,
after the real compaction job summarized the fact away and indexed it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient

from shared.core.config import StoreConfig
from shared.store.sessions import SessionStore
from tests.recall_adapters_support import (
    CODE,
    FACT,
    PATH,
    QUERY,
    assert_recalled,
    compact,
    fact_index,
    opening,
)
from workers.server.app import create_app
from workers.server.config import ServerConfig

TOKENS = {"alpha-token-0123456789": "alpha", "beta-token-01234567890": "beta"}
A = {"Authorization": "Bearer alpha-token-0123456789"}
B = {"Authorization": "Bearer beta-token-01234567890"}


@pytest.fixture
def store(real_redis: Any, key_prefix: str) -> SessionStore:
    return SessionStore(real_redis, StoreConfig(key_prefix=key_prefix), tenant="alpha")


@pytest.fixture
def client(store: SessionStore) -> Iterator[TestClient]:
    app = create_app(ServerConfig(), store, tokens=TOKENS)
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def seed(client: TestClient, sid: str, headers: dict[str, str] = A, turns: int = 5) -> None:
    for i in range(turns):
        messages = [{"role": "user", "content": opening(i)},
                    {"role": "assistant", "content": f"Noted, turn {i}."}]
        response = client.post(f"/v1/sessions/{sid}/record", json={"messages": messages},
                               headers=headers)
        assert response.status_code == 200, response.text


def recall(client: TestClient, sid: str, body: dict[str, Any],
           headers: dict[str, str] = A) -> Any:
    return client.post(f"/v1/sessions/{sid}/recall", json=body, headers=headers)


@pytest.mark.redis
def test_recall_returns_the_compacted_fact_verbatim(client: TestClient,
                                                    store: SessionStore) -> None:
    seed(client, "h1")
    compact(store, "h1")
    response = recall(client, "h1", {"query": QUERY, "limit": 2})
    assert response.status_code == 200, response.text
    body = response.json()
    index = fact_index(store, "h1")
    assert body["session_id"] == "h1" and len(body["hits"]) <= 2
    assert body["hits"][0] == {**body["hits"][0], "index": index, "role": "user", "text": FACT}
    assert_recalled(body["text"], index)  # the text a model gets as the tool result
    ranged = recall(client, "h1", {"query": PATH, "start": index + 1}).json()
    assert all(h["index"] > index for h in ranged["hits"])
    assert recall(client, "h1", {"query": "zebra_quokka"}).json()["hits"] == []


@pytest.mark.redis
def test_recall_is_per_tenant(client: TestClient, store: SessionStore) -> None:
    seed(client, "shared-name")
    compact(store, "shared-name")
    response = recall(client, "shared-name", {"query": CODE}, headers=B)
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "session_not_found"
    seed(client, "shared-name", headers=B, turns=1)  # beta's own session of that name
    assert recall(client, "shared-name", {"query": CODE}, headers=B).json()["hits"] == []
    assert recall(client, "shared-name", {"query": CODE}).json()["hits"]
    assert recall(client, "nobody", {"query": CODE}).status_code == 404
    for headers in ({}, {"Authorization": "Bearer nope-nope-nope"}):
        assert recall(client, "shared-name", {"query": CODE}, headers).status_code == 401


@pytest.mark.redis
def test_bad_arguments_are_422_naming_the_field(client: TestClient,
                                                store: SessionStore) -> None:
    seed(client, "h2", turns=2)
    for body, field in (({"query": ""}, "query"), ({"query": "x" * 5000}, "query"),
                        ({"query": "the and of"}, "query"), ({"limit": 3}, "query"),
                        ({"query": CODE, "limit": 0}, "limit"),
                        ({"query": CODE, "limit": 51}, "limit"),
                        ({"query": CODE, "start": -1}, "start"),
                        ({"query": CODE, "start": 9, "end": 2}, "end"),
                        ({"query": CODE, "path": "x"}, "path")):
        response = recall(client, "h2", body)
        assert response.status_code == 422, (body, response.text)
        assert response.json()["error"]["code"] == "invalid_input"
        assert response.json()["error"]["field"] == field, body
    response = client.post("/v1/sessions/bad%20id/recall", json={"query": CODE}, headers=A)
    assert response.status_code == 422 and response.json()["error"]["field"] == "session_id"


def test_recall_is_in_the_openapi_schema(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    post = schema["paths"]["/v1/sessions/{session_id}/recall"]["post"]
    assert post["security"] == [{"HTTPBearer": []}]
    assert {"200", "401", "404", "422", "503"} <= set(post["responses"])
    request = schema["components"]["schemas"]["RecallRequest"]
    assert request["required"] == ["query"]
    assert set(request["properties"]) == {"query", "limit", "start", "end"}
    assert {"session_id", "hits", "text"} <= set(schema["components"]["schemas"]["RecallOut"]
                                                 ["properties"])
