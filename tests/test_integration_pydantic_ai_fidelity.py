"""pydantic-ai round trips: a response compaction changed keeps what it did not change.

An untouched response goes back as the original object. One the guard changed (its text
clipped by emergency truncation, a tool call id made unique) used to be rebuilt from the
neutral message alone: its thinking (Anthropic's signed blocks, OpenAI's encrypted
reasoning), native tool parts, generated files, part ids and the response's own fields
(``provider_name``, ``provider_response_id``, ``usage``...) were gone. Anthropic answers
400 to a tool_use turn without its signed thinking; pydantic-ai sends provider data back
only to the provider the response names. Property tests over every response part kind,
the guard's own truncation, and a real ``Agent`` with ``OpenAIResponsesModel`` against a
fake Responses endpoint (``httpx.MockTransport``; the ``anthropic`` SDK is not installed).
"""

from __future__ import annotations

import dataclasses
import json
import secrets
from datetime import UTC, datetime
from typing import Any

import fakeredis
import pytest

pytest.importorskip("pydantic_ai")

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic_ai import messages as pm
from pydantic_ai._tool_search import ToolSearchCallPart, ToolSearchReturnPart
from pydantic_ai.usage import RequestUsage

from shared.core.config import StoreConfig
from shared.core.messages import Message
from shared.core.prepared import PreparedView
from shared.core.truncation import CLIP_MARKER
from shared.guard import ContextGuard
from shared.integrations.pydantic_ai import from_view, to_neutral
from shared.store.sessions import SessionStore
from tests.fakes_support import words

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16
WHEN = datetime(2026, 11, 29, 12, 0, 0, 123456, tzinfo=UTC)


def view_of(messages: list[Message]) -> PreparedView:
    """A view holding ``messages`` (``from_view`` reads only the messages)."""
    return PreparedView.model_construct(messages=messages)


def response_fields(**changes: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "model_name": "claude-sonnet-4-5", "provider_name": "anthropic",
        "provider_url": "https://api.anthropic.com", "provider_response_id": "msg_01abc",
        "finish_reason": "tool_call", "provider_details": {"stop_reason": "tool_use"},
        "usage": RequestUsage(input_tokens=1200, output_tokens=340), "timestamp": WHEN}
    return {**fields, **changes}


def history_of(response: pm.ModelResponse) -> list[Any]:
    """A turn around ``response``: the prompt, the response, the results of its calls."""
    calls = [p for p in response.parts if isinstance(p, pm.ToolCallPart)]
    out: list[Any] = [pm.ModelRequest(parts=[pm.UserPromptPart("go", timestamp=WHEN)]),
                      response]
    if calls:
        out.append(pm.ModelRequest(parts=[
            pm.ToolReturnPart(c.tool_name, f"result of {c.tool_call_id}",
                              tool_call_id=c.tool_call_id, timestamp=WHEN) for c in calls]))
    return out


def clipped(message: Message, keep_head: int, keep_tail: int) -> Message:
    """``message`` with its text cut as emergency truncation cuts it (head, marker, tail)."""
    text = message.text()
    head, tail = text[:keep_head], text[len(text) - keep_tail:] if keep_tail else ""
    marker = CLIP_MARKER.format(removed=len(text) - len(head) - len(tail))
    return message.model_copy(update={"content": f"{head}\n{marker}\n{tail}"})


def renamed(message: Message, k: int) -> Message:
    """``message`` with its k-th call id made unique, as the store does for a repeated id."""
    calls = list(message.tool_calls)
    calls[k] = calls[k].model_copy(update={"id": f"{calls[k].id}-r7q1"})
    return message.model_copy(update={"tool_calls": calls})


def not_text(parts: list[Any]) -> list[Any]:
    return [p for p in parts if not isinstance(p, pm.TextPart | pm.SpeechPart)]


# -- the defect, plainly ---------------------------------------------------------------------
def anthropic_turn() -> pm.ModelResponse:
    return pm.ModelResponse(parts=[
        pm.ThinkingPart("I should look the order up first.", signature="EqQBCkYIBxgCKkD" * 8,
                        provider_name="anthropic"),
        pm.ThinkingPart("", id="redacted_thinking", signature="EmwKAhgB" * 8,
                        provider_name="anthropic"),
        pm.TextPart("Let me check. " + words(3000)),
        pm.ToolCallPart("lookup", {"order": 42}, tool_call_id="toolu_01",
                        provider_name="anthropic")], **response_fields())


def test_a_clipped_response_keeps_its_signed_thinking_and_its_fields() -> None:
    response = anthropic_turn()
    history = history_of(response)
    neutral = to_neutral(history)
    neutral[1] = clipped(neutral[1], 200, 100)
    out = from_view(view_of(neutral), history, "", "")
    rebuilt = out[1]
    assert isinstance(rebuilt, pm.ModelResponse) and rebuilt is not response
    assert rebuilt.parts[:2] == response.parts[:2]  # both thinking blocks, signatures and all
    assert rebuilt.parts[3] is response.parts[3]
    text = rebuilt.parts[2]
    assert isinstance(text, pm.TextPart) and text.content == neutral[1].text()
    assert dataclasses.replace(rebuilt, parts=response.parts) == response  # every field


def test_a_renamed_call_keeps_its_kind_signature_and_loses_only_its_item_id() -> None:
    call = pm.ToolCallPart("lookup", {"q": "x"}, tool_call_id="call_0", id="fc_9",
                           provider_name="google-gla",
                           provider_details={"thought_signature": "c2lnbmVk"})
    search = ToolSearchCallPart(args={"queries": ["db"]}, tool_call_id="call_1",
                                provider_name="google-gla")
    response = pm.ModelResponse(parts=[call, search], **response_fields(
        provider_name="google-gla", model_name="gemini-2.5-pro"))
    history = history_of(response)
    neutral = to_neutral(history)
    neutral[1] = renamed(renamed(neutral[1], 0), 1)
    rebuilt = from_view(view_of(neutral), history, "", "")[1]
    assert rebuilt.parts[0] == dataclasses.replace(call, tool_call_id="call_0-r7q1", id=None)
    assert isinstance(rebuilt.parts[1], ToolSearchCallPart)
    assert rebuilt.parts[1].tool_call_id == "call_1-r7q1"
    assert rebuilt.provider_name == "google-gla" and rebuilt.timestamp == WHEN


def test_calls_the_view_does_not_pair_in_order_are_paired_by_id() -> None:
    """No stage adds or removes a call of a kept message; were one to, the originals are
    paired by id: one the view lacks is left out, one it adds goes after the last call."""
    first = pm.ToolCallPart("a", {"n": 1}, tool_call_id="c1", id="fc_1", provider_name="openai")
    second = pm.ToolCallPart("b", {"n": 2}, tool_call_id="c2", id="fc_2", provider_name="openai")
    response = pm.ModelResponse(parts=[pm.ThinkingPart("t", signature="s", provider_name="openai"),
                                       first, second, pm.TextPart("after")],
                                **response_fields(provider_name="openai"))
    history = history_of(response)
    neutral = to_neutral(history)
    calls = [neutral[1].tool_calls[1],
             neutral[1].tool_calls[0].model_copy(update={"id": "c9", "name": "z"}),
             neutral[1].tool_calls[0].model_copy(update={"id": "c8", "name": "y"})]
    neutral[1] = neutral[1].model_copy(update={"tool_calls": calls})
    rebuilt = from_view(view_of(neutral[:2]), history, "", "")[1]
    kinds = [(type(p).__name__, getattr(p, "tool_call_id", None)) for p in rebuilt.parts]
    assert kinds == [("ThinkingPart", None), ("ToolCallPart", "c2"), ("ToolCallPart", "c9"),
                     ("ToolCallPart", "c8"), ("TextPart", None)]
    assert rebuilt.parts[1] is second and rebuilt.parts[0] is response.parts[0]


def test_a_cleared_tool_result_keeps_its_fields() -> None:
    found = pm.ToolReturnPart("lookup", {"rows": ["x" * 40] * 50}, tool_call_id="c1",
                              metadata={"seen": 1}, timestamp=WHEN, outcome="failed")
    searched = ToolSearchReturnPart(content={"discovered_tools": []}, tool_call_id="c2",
                                    timestamp=WHEN)
    history: list[Any] = [
        pm.ModelRequest(parts=[pm.UserPromptPart("go", timestamp=WHEN)]),
        pm.ModelResponse(parts=[
            pm.ToolCallPart("lookup", {"q": 1}, tool_call_id="c1"),
            ToolSearchCallPart(args={"queries": ["db"]}, tool_call_id="c2")], timestamp=WHEN),
        pm.ModelRequest(parts=[found, searched])]
    neutral = to_neutral(history)
    neutral[2] = neutral[2].model_copy(update={"content": "[cleared: 4,000 chars]"})
    neutral[3] = neutral[3].model_copy(update={"content": "[cleared: 300 chars]"})
    out = from_view(view_of(neutral), history, "", "")
    assert out[2].parts[0] == dataclasses.replace(found, content="[cleared: 4,000 chars]")
    plain = out[2].parts[1]  # typed content a text cannot be: a plain return
    assert type(plain) is pm.ToolReturnPart and plain.content == "[cleared: 300 chars]"
    assert plain.tool_call_id == "c2"
    assert out[0].parts[0] is history[0].parts[0] and out[1] is history[1]


def test_a_changed_message_whose_history_moved_on_is_rebuilt_from_the_view_alone() -> None:
    """The framework index points at another message now (a different stamp): nothing of
    it is copied."""
    response = anthropic_turn()
    history = history_of(response)
    neutral = to_neutral(history)
    neutral[1] = clipped(neutral[1], 50, 0)
    other = [history[0], dataclasses.replace(response, timestamp=datetime(2020, 1, 1, tzinfo=UTC)),
             history[2]]
    rebuilt = from_view(view_of(neutral), other, "", "")[1]
    assert not any(isinstance(p, pm.ThinkingPart) for p in rebuilt.parts)
    assert rebuilt.provider_name is None


# -- properties over every response part kind ------------------------------------------------
text_parts = st.builds(
    lambda text, n: pm.TextPart(text, id=f"msg_{n}", provider_name="openai",
                                provider_details={"phase": "final_answer"}),
    st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=60),
    st.integers(0, 99))
speech = st.builds(lambda t: pm.SpeechPart(speaker="assistant", transcript=t),
                   st.text(max_size=20))
thinking = st.builds(lambda t, n: pm.ThinkingPart(t, id=f"rs_{n}", signature=f"sig{n}" * 4,
                                                  provider_name="openai"),
                     st.text(max_size=30), st.integers(0, 99))
native = st.integers(0, 99).map(lambda n: [
    pm.NativeToolCallPart("web_search", {"query": f"q{n}"}, tool_call_id=f"ws_{n}",
                          provider_name="openai"),
    pm.NativeToolReturnPart("web_search", {"status": "completed"}, tool_call_id=f"ws_{n}",
                            provider_name="openai", timestamp=WHEN)])
other = st.sampled_from([
    pm.FilePart(pm.BinaryContent(PNG, media_type="image/png"), id="ig_1",
                provider_name="openai"),
    pm.CompactionPart("earlier turns, summarized", id="cmp_1", provider_name="openai"),
    pm.CompactionPart(None, id="cmp_2", provider_name="openai",
                      provider_details={"encrypted_content": "gAAAA"})])
calls = st.integers(0, 3).map(lambda k: [
    pm.ToolCallPart("lookup", {"q": k}, tool_call_id=f"call_{k}", id=f"fc_{k}",
                    provider_name="openai")])


@st.composite
def responses(draw: st.DrawFn) -> pm.ModelResponse:
    pieces = draw(st.lists(st.one_of(text_parts.map(lambda p: [p]), speech.map(lambda p: [p]),
                                     thinking.map(lambda p: [p]), native,
                                     other.map(lambda p: [p])), max_size=8))
    parts = [p for piece in pieces for p in piece]
    tail = draw(st.lists(calls, max_size=3, unique_by=lambda c: c[0].tool_call_id))
    return pm.ModelResponse(parts=[*parts, *(c for cs in tail for c in cs)],
                            **response_fields(provider_name="openai", model_name="gpt-5"))


@given(response=responses(), head=st.integers(0, 400), tail=st.integers(0, 400),
       rename=st.booleans())
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_changed_response_equals_its_original_but_for_the_change(
        response: pm.ModelResponse, head: int, tail: int, rename: bool) -> None:
    history = history_of(response)
    neutral = to_neutral(history)
    before = neutral[1]
    text = before.text()
    changed = clipped(before, min(head, len(text)), min(tail, max(0, len(text) - head)))
    if rename and changed.tool_calls:
        changed = renamed(changed, 0)
    neutral[1] = changed
    out = from_view(view_of(neutral), history, "", "")
    rebuilt = out[1]
    assert isinstance(rebuilt, pm.ModelResponse)
    # the response's own fields: the original's
    assert dataclasses.replace(rebuilt, parts=response.parts) == response
    # what it says is what the view says (the round trip gives the changed message back)
    again = to_neutral([history[0], rebuilt])[1]
    assert (again.text(), again.tool_calls, again.reasoning) == \
        (changed.text(), changed.tool_calls, changed.reasoning)
    # every part but the text and a renamed call: the original, in its order
    kept = not_text(rebuilt.parts)
    originals = not_text(response.parts)
    assert len(kept) == len(originals)
    for new, old in zip(kept, originals, strict=True):
        if isinstance(old, pm.ToolCallPart) and new.tool_call_id != old.tool_call_id:
            assert new == dataclasses.replace(old, tool_call_id=new.tool_call_id, id=None)
        else:
            assert new is old
    # a text part is the original unless the change touched it; a touched one has no id
    for part in rebuilt.parts:
        if isinstance(part, pm.TextPart) and part not in response.parts:
            assert part.id is None and part.citations is None
    # the request parts around it, untouched: the originals
    assert out[0].parts[0] is history[0].parts[0]


@given(response=responses())
@settings(max_examples=100, deadline=None)
def test_an_untouched_response_is_the_original(response: pm.ModelResponse) -> None:
    history = history_of(response)
    out = from_view(view_of(to_neutral(history)), history, "", "")
    assert out[1] is response


# -- through the guard: emergency truncation clips the response ------------------------------
@pytest.fixture
def store() -> SessionStore:
    return SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="t" + secrets.token_hex(4)))


def test_the_guards_truncation_keeps_the_signed_thinking_of_the_turn(
        store: SessionStore) -> None:
    response = anthropic_turn()
    history = history_of(response)
    guard = ContextGuard(store, overrides={"claude-sonnet-4-5": 1500})
    view = guard.prepare("pai-fid", "be brief", pending=to_neutral(history), max_tokens=200,
                         model="claude-sonnet-4-5")
    assert view.report.truncated
    out = from_view(view, history, "be brief", "be brief")
    rebuilt = next(m for m in out if isinstance(m, pm.ModelResponse))
    assert rebuilt is not response  # clipped
    text = rebuilt.parts[2]
    assert isinstance(text, pm.TextPart) and CLIP_MARKER.split("{")[0] in text.content
    assert rebuilt.parts[:2] == response.parts[:2] and rebuilt.parts[3] is response.parts[3]
    assert dataclasses.replace(rebuilt, parts=response.parts) == response


# -- end to end: a real Agent, OpenAI Responses with encrypted reasoning ---------------------
class FakeResponses:
    """``POST /v1/responses``: a reasoning item (encrypted), a long answer and a call, then,
    once the call is answered, a short final answer. Keeps every request body."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.bodies.append(body)
        answered = any(i.get("type") == "function_call_output" for i in body["input"])
        output: list[dict[str, Any]] = [{"type": "message", "id": "msg_2", "role": "assistant",
                                         "status": "completed", "content": [{
                                             "type": "output_text", "text": "Order 42 ships.",
                                             "annotations": []}]}]
        if not answered:
            output = [
                {"type": "reasoning", "id": "rs_1", "encrypted_content": "gAAAAenc" * 20,
                 "summary": [{"type": "summary_text", "text": "Look the order up."}]},
                {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                 "content": [{"type": "output_text", "text": "Checking. " + words(3000),
                              "annotations": []}]},
                {"type": "function_call", "id": "fc_1", "call_id": "call_1",
                 "name": "lookup", "arguments": '{"order": 42}', "status": "completed"}]
        return httpx.Response(200, json={
            "id": f"resp_{len(self.bodies)}", "object": "response", "created_at": 1764417600,
            "model": "gpt-5", "status": "completed", "output": output,
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
            "usage": {"input_tokens": 100, "output_tokens": 50, "total_tokens": 150,
                      "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens_details": {"reasoning_tokens": 20}}})


def test_a_compacted_run_sends_the_encrypted_reasoning_with_its_call(
        store: SessionStore) -> None:
    from openai import AsyncOpenAI
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIResponsesModel
    from pydantic_ai.providers.openai import OpenAIProvider

    from shared.integrations.pydantic_ai import ContextGuardCapability

    fake = FakeResponses()
    client = AsyncOpenAI(base_url="http://fake.test/v1", api_key="sk-test", max_retries=0,
                         http_client=httpx.AsyncClient(transport=httpx.MockTransport(fake)))
    guard = ContextGuard(store, overrides={"gpt-5": 1500})  # the long answer does not fit
    agent = Agent(OpenAIResponsesModel("gpt-5", provider=OpenAIProvider(openai_client=client)),
                  instructions="be brief",
                  capabilities=[ContextGuardCapability(guard, recall=False, max_tokens=200)])

    @agent.tool_plain
    def lookup(order: int) -> str:
        """Look an order up."""
        return f"order {order}: shipped"

    result = agent.run_sync("Where is order 42?", conversation_id="pai-e2e")
    assert result.output == "Order 42 ships."
    assert len(fake.bodies) == 2
    items = fake.bodies[1]["input"]
    kinds = [i.get("type", i.get("role")) for i in items]
    reasoning = next(i for i in items if i.get("type") == "reasoning")
    assert reasoning["id"] == "rs_1" and reasoning["encrypted_content"] == "gAAAAenc" * 20
    call = next(i for i in items if i.get("type") == "function_call")
    assert call["call_id"] == "call_1" and call["name"] == "lookup"
    assert kinds.index("reasoning") < kinds.index("function_call")  # the call's reasoning
    said = json.dumps(items)
    assert "characters removed by emergency truncation" in said  # the answer was clipped
    assert '"msg_1"' not in said  # its edited text goes without the stored item's id
