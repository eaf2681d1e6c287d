"""The summarizer's OpenAI client sends what the SDK's typed call would send.

``OpenAIClient.complete`` posts its body through the SDK's request method
instead of ``chat.completions.create`` (which spends ~0.5 ms validating a
body of plain strings); these tests pin that nothing else changes: URL,
JSON body, headers, the parsed reply and the error mapping.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest

from shared.core.errors import BadSummary, SummarizerError, SummarizerUnavailable
from workers.harness.fakes import FakeOpenAIServer, Fault
from workers.summarizer.engine import SummarizerOverflow
from workers.summarizer.providers import SDK_RETRIES, OpenAIClient

REQUEST = [{"role": "system", "content": "You summarize."},
           {"role": "user", "content": "<transcript>\nuser: ünïcödé \"quotes\" \\ 日本\n"
                                       "</transcript>"}]
# Headers that differ between any two requests, whoever sends them.
VOLATILE = {"x-stainless-retry-count", "x-stainless-read-timeout", "content-length",
            "x-stainless-timeout"}


def _completions(server: FakeOpenAIServer) -> list[Any]:
    return [r for r in server.requests if r.path.endswith("/chat/completions")]


def test_the_request_is_the_one_the_typed_sdk_call_sends() -> None:
    with FakeOpenAIServer() as server:
        ours = OpenAIClient("gpt-4o-mini", api_key="k", base_url=server.base_url, timeout=5)
        completion = ours.complete(REQUEST, 300)
        typed = openai.OpenAI(api_key="k", base_url=server.base_url, timeout=5,
                              max_retries=SDK_RETRIES)
        reply = typed.chat.completions.create(
            model="gpt-4o-mini", messages=REQUEST,  # type: ignore[arg-type]
            max_tokens=300, temperature=0)
        first, second = _completions(server)
    assert first.path == second.path and first.method == second.method == "POST"
    assert first.body == second.body
    assert first.body["messages"] == REQUEST
    assert {k: v for k, v in first.headers.items() if k not in VOLATILE} == \
        {k: v for k, v in second.headers.items() if k not in VOLATILE}
    assert completion.text == reply.choices[0].message.content
    assert completion.input_tokens == (reply.usage.prompt_tokens if reply.usage else -1)
    assert completion.output_tokens == (reply.usage.completion_tokens if reply.usage else -1)
    assert completion.model == reply.model


@pytest.mark.parametrize(("fault", "error"), [
    (Fault.server_error(), SummarizerUnavailable),
    (Fault.rate_limit(0.1), SummarizerUnavailable),
    (Fault.garbage(), SummarizerUnavailable),
    (Fault.http_error(401, '{"error": {"message": "Incorrect API key provided", '
                           '"type": "invalid_request_error"}}'), SummarizerError),
], ids=["500", "429", "garbage", "401"])
def test_errors_keep_their_classes(fault: Fault, error: type[Exception]) -> None:
    with FakeOpenAIServer() as server:
        server.faults.always(fault)
        client = OpenAIClient("gpt-4o-mini", api_key="k", base_url=server.base_url, timeout=5)
        with pytest.raises(error) as caught:
            client.complete(REQUEST, 300)
        assert len(_completions(server)) == 1  # the SDK does not retry: Celery does
    assert type(caught.value) is error


def test_an_overflow_is_read_from_the_error() -> None:
    with FakeOpenAIServer(window=20) as server:
        client = OpenAIClient("gpt-4o-mini", api_key="k", base_url=server.base_url, timeout=5)
        with pytest.raises(SummarizerOverflow) as caught:
            client.complete(REQUEST, 300)
    assert caught.value.limit == 20


SUMMARY_TEXT = "## Goal\nwork on the project\n## Constraints\nnone\n## Progress"


@pytest.mark.parametrize("finish", ["content_filter", "tool_calls", "length"])
def test_a_reply_that_did_not_end_normally_is_a_bad_summary(finish: str) -> None:
    """Cut off by a content filter (or anything but a normal stop): partial, never stored."""
    reply = {"role": "assistant", "content": SUMMARY_TEXT, "finish_reason": finish}
    with FakeOpenAIServer(responder=[reply]) as server:
        client = OpenAIClient("gpt-4o-mini", api_key="k", base_url=server.base_url, timeout=5)
        with pytest.raises(BadSummary, match=finish if finish != "length" else "cut off"):
            client.complete(REQUEST, 300)


@pytest.mark.parametrize("finish", ["SAFETY", "RECITATION", "MAX_TOKENS"])
def test_a_gemini_reply_stopped_for_safety_or_recitation_is_a_bad_summary(
        finish: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from workers.harness.fakes import gemini_server
    from workers.summarizer.providers import GeminiClient

    monkeypatch.setitem(gemini_server.FINISH, finish.lower(), finish)
    reply = {"role": "assistant", "content": SUMMARY_TEXT, "finish_reason": finish.lower()}
    with gemini_server.FakeGeminiServer(responder=[reply]) as server:
        client = GeminiClient("gemini-2.5-flash-lite", vertexai=False, api_key="k",
                              base_url=server.base_url, timeout=5)
        with pytest.raises(BadSummary):
            client.complete(REQUEST, 300)


def test_a_normal_stop_is_accepted_by_both_clients() -> None:
    from workers.harness.fakes.gemini_server import FakeGeminiServer
    from workers.summarizer.providers import GeminiClient

    reply = {"role": "assistant", "content": SUMMARY_TEXT, "finish_reason": "stop"}
    with FakeOpenAIServer(responder=[reply]) as server:
        client = OpenAIClient("gpt-4o-mini", api_key="k", base_url=server.base_url, timeout=5)
        assert client.complete(REQUEST, 300).text == SUMMARY_TEXT
    with FakeGeminiServer(responder=[reply]) as gserver:
        gclient = GeminiClient("gemini-2.5-flash-lite", vertexai=False, api_key="k",
                               base_url=gserver.base_url, timeout=5)
        assert gclient.complete(REQUEST, 300).text == SUMMARY_TEXT
