"""``compaction doctor``'s summarizer check against servers that do not list models.

The workers only call chat completions; a gateway (LiteLLM, vLLM behind a proxy)
may answer ``GET /models`` with 404, 405 or 501 while completions work. That is a
WARN (the list cannot be verified), not a FAIL; a refused key and an unreachable
host stay FAILs. The real openai SDK talks to the fake server.
"""

from __future__ import annotations

import pytest

from workers.cli.doctor import check_summarizer
from workers.harness.fakes.http_base import Exchange, Outcome
from workers.harness.fakes.openai_server import FakeOpenAIServer, openai_error
from workers.settings import Settings


class NoModelList(FakeOpenAIServer):
    """Serves chat completions; ``GET /models`` answers ``status``."""

    def __init__(self, status: int) -> None:
        super().__init__(model="summary-model")
        self.status = status

    def route(self, exchange: Exchange) -> Outcome:
        if exchange.method == "GET" and exchange.path.rstrip("/").startswith("/v1/models") \
                and exchange.headers.get("authorization", "").strip():
            return openai_error(self.status, "listing models is not supported here")
        return super().route(exchange)


def _settings(base_url: str) -> Settings:
    return Settings(summarizer="openai", summarizer_base_url=base_url,
                    summarizer_api_key="k", summarizer_model="summary-model")


@pytest.mark.parametrize("status", [404, 405, 501])
def test_a_server_without_a_model_list_is_a_warning_not_a_failure(status: int) -> None:
    with NoModelList(status) as server:
        check = check_summarizer(_settings(server.base_url), 2.0)
        chats = [r for r in server.requests if r.path.endswith("/chat/completions")]
    assert check.verdict == "WARN", check
    assert "cannot verify the model list" in check.detail and f"HTTP {status}" in check.detail
    assert not chats  # no billed call to find out


def test_a_refused_key_and_an_unreachable_host_still_fail() -> None:
    with NoModelList(401) as server:
        refused = check_summarizer(_settings(server.base_url), 2.0)
    with NoModelList(403) as server:
        forbidden = check_summarizer(_settings(server.base_url), 2.0)
    with NoModelList(500) as server:
        broken = check_summarizer(_settings(server.base_url), 2.0)
    gone = check_summarizer(_settings("http://127.0.0.1:1/v1"), 0.5)
    assert refused.verdict == "FAIL" and "API key rejected" in refused.detail, refused
    assert forbidden.verdict == "FAIL" and "HTTP 403" in forbidden.detail, forbidden
    assert broken.verdict == "FAIL" and "HTTP 500" in broken.detail, broken
    assert gone.verdict == "FAIL" and "cannot connect" in gone.detail, gone
