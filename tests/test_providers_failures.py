"""What a failed summarizer call was, as the provider clients report it.

The real openai and google-genai SDKs against the fake servers: each error is
tagged with a bounded class, the HTTP status and the wait the provider asked
for (``retry-after-ms`` / ``Retry-After``; Google's ``RetryInfo``), and one call
is one HTTP request (the SDKs' own retries are off: only Celery retries).
"""

from __future__ import annotations

import email.utils
import json
import time
from typing import Any

import pytest

from shared.core.errors import BadSummary, SummarizerError, SummarizerUnavailable
from workers.harness.fakes import FakeOpenAIServer, Fault
from workers.harness.fakes.gemini_server import FakeGeminiServer
from workers.summarizer.failures import failure_of, wait_from_headers, wait_from_retry_info
from workers.summarizer.providers import GeminiClient, OpenAIClient

REQUEST = [{"role": "system", "content": "You summarize."},
           {"role": "user", "content": "<transcript>\nuser: hello\n</transcript>"}]
BAD_REQUEST = Fault.http_error(400, json.dumps({"error": {
    "message": "Unrecognized request argument supplied: foo", "type": "invalid_request_error"}}))
NO_KEY = Fault.http_error(401, json.dumps({"error": {
    "message": "Incorrect API key provided", "type": "invalid_request_error"}}))
NO_MODEL = Fault.http_error(404, json.dumps({"error": {
    "message": "The model `x` does not exist", "type": "invalid_request_error"}}))


def _chats(server: Any) -> list[Any]:
    return [r for r in server.requests if r.method == "POST"]


@pytest.mark.parametrize(("fault", "error", "kind", "status"), [
    (Fault.rate_limit(2.5), SummarizerUnavailable, "rate_limited", 429),
    (Fault.server_error(), SummarizerUnavailable, "server_error", 500),
    (Fault.unavailable(), SummarizerUnavailable, "server_error", 503),
    (Fault.overloaded(), SummarizerUnavailable, "server_error", 529),
    (Fault.garbage(), SummarizerUnavailable, "bad_response", None),
    (Fault.reset(), SummarizerUnavailable, "connection", None),
    (Fault.stall(3), SummarizerUnavailable, "timeout", None),
    (BAD_REQUEST, SummarizerError, "bad_request", 400),
    (NO_KEY, SummarizerError, "auth", 401),
    (NO_MODEL, SummarizerError, "not_found", 404),
    (Fault.endless(), BadSummary, "truncated", None),
], ids=lambda v: v if isinstance(v, str) else None)
def test_openai_errors_carry_their_class_status_and_wait(
        fault: Fault, error: type[Exception], kind: str, status: int | None) -> None:
    with FakeOpenAIServer() as server:
        server.faults.always(fault)
        client = OpenAIClient("gpt-4o-mini", api_key="k", base_url=server.base_url, timeout=1)
        with pytest.raises(SummarizerError) as caught:
            client.complete(REQUEST, 300)
        # no SDK retry under Celery's (a stalled request is logged only once answered)
        sent = len(_chats(server))
        assert sent <= 1 if fault.kind == "stall" else sent == 1
    assert type(caught.value) is error
    failure = failure_of(caught.value)
    assert failure is not None and (failure.error_class, failure.http_status) == (kind, status)
    # retry-after-ms (2500) wins over the rounded Retry-After header (3)
    assert failure.retry_after == (2.5 if kind == "rate_limited" else None)


def test_a_content_filter_stop_is_classed_as_such() -> None:
    def filtered(request: dict[str, Any]) -> dict[str, Any]:
        return {"content": "## Goal\npartial", "finish_reason": "content_filter"}

    with FakeOpenAIServer(responder=filtered) as server:
        client = OpenAIClient("gpt-4o-mini", api_key="k", base_url=server.base_url, timeout=5)
        with pytest.raises(BadSummary) as caught:
            client.complete(REQUEST, 300)
    failure = failure_of(caught.value)
    assert failure is not None and failure.error_class == "content_filter"


@pytest.mark.parametrize("vertex", [False, True], ids=["gemini", "vertex"])
def test_a_gemini_rate_limit_carries_its_retry_delay(vertex: bool) -> None:
    """Gemini's API states RetryInfo's retryDelay in the body; Vertex only a header."""
    with FakeGeminiServer() as server:
        server.faults.always(Fault.rate_limit(7))
        if vertex:
            client = GeminiClient("gemini-2.5-flash-lite", vertexai=True, project="p",
                                  location="us-central1", base_url=server.base_url, timeout=5,
                                  credentials=server.credentials())
        else:
            client = GeminiClient("gemini-2.5-flash-lite", vertexai=False, api_key="k",
                                  base_url=server.base_url, timeout=5)
        with pytest.raises(SummarizerUnavailable) as caught:
            client.complete(REQUEST, 100)
        assert len(_chats(server)) == 1  # google-genai's retries are off too
    failure = failure_of(caught.value)
    assert failure is not None
    assert (failure.error_class, failure.http_status, failure.retry_after) == (
        "rate_limited", 429, 7.0)


def test_gemini_server_errors_and_bad_requests_are_classed() -> None:
    with FakeGeminiServer() as server:
        client = GeminiClient("gemini-2.5-flash-lite", vertexai=False, api_key="k",
                              base_url=server.base_url, timeout=5)
        server.faults.always(Fault.unavailable())
        with pytest.raises(SummarizerUnavailable) as unavailable:
            client.complete(REQUEST, 100)
        server.faults.always(Fault.http_error(400, json.dumps({"error": {
            "code": 400, "message": "Request contains an invalid argument.",
            "status": "INVALID_ARGUMENT"}})))
        with pytest.raises(SummarizerError) as bad:
            client.complete(REQUEST, 100)
    first, second = failure_of(unavailable.value), failure_of(bad.value)
    assert first is not None and (first.error_class, first.http_status) == ("server_error", 503)
    assert second is not None and (second.error_class, second.http_status) == (
        "bad_request", 400)


def test_stated_waits_are_read_in_every_form() -> None:
    soon = email.utils.formatdate(time.time() + 20, usegmt=True)
    assert wait_from_headers({"retry-after": "30"}) == 30.0
    assert wait_from_headers({"retry-after-ms": "1500", "retry-after": "2"}) == 1.5
    date_wait = wait_from_headers({"retry-after": soon})
    assert date_wait is not None and 15 < date_wait <= 20
    assert wait_from_headers({"retry-after": "soon"}) is None
    assert wait_from_headers({"retry-after": "-3"}) is None
    assert wait_from_headers({}) is None and wait_from_headers(None) is None
    assert wait_from_headers({"retry-after": "1e12"}) == 86_400.0  # read up to a day
    info = {"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "details": [
        {"@type": "type.googleapis.com/google.rpc.QuotaFailure"},
        {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "12.5s"}]}}
    assert wait_from_retry_info(info) == 12.5
    assert wait_from_retry_info({"error": {"details": []}}) is None
    assert wait_from_retry_info(["not", "a", "dict"]) is None
