"""``recover`` against provider errors as real SDKs raise them: a retry is smaller than
the refused request and fits, or there is none; what one session's refusal teaches does
not shrink the window of other sessions."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import httpx
import openai

from shared.core.messages import FilePart, Message, TextPart
from shared.store.sessions import SessionStore

HAIKU = "claude-3-5-haiku-20241022"  # a registry window of 200,000


def sdk_error(status: int, body: dict[str, Any]) -> openai.APIStatusError:
    """The error the OpenAI SDK raises for ``body`` (a gateway in front of the provider)."""
    request = httpx.Request("POST", "http://x/v1/chat/completions")
    response = httpx.Response(status, request=request, json=body)
    if status == 400:
        return openai.BadRequestError("refused", response=response, body=body)
    return openai.APIStatusError("refused", response=response, body=body)


BEDROCK = {"message": "Input is too long for requested model."}  # states no numbers


def pdfs(count: int) -> Message:
    data = base64.b64encode(b"%PDF-1.4 " + bytes(300)).decode()
    return Message(role="user", content=[TextPart(text="compare these"), *(
        FilePart(data=data, media_type="application/pdf", filename=f"r{i}.pdf")
        for i in range(count))])


def test_an_overflow_stating_no_numbers_is_not_retried_unchanged_nor_taught_to_others(
        make_guard: Callable[..., Any], store: SessionStore) -> None:
    """One user turn of 9 PDFs: the provider counts far more than the guard's estimate and
    refuses without a figure. Nothing older can be dropped, so there is no smaller view to
    retry (None, not the same request with a made-up "compacted" block), and the refused
    estimate, a bound for this session only, does not become the window of the model's
    other sessions: the registry knows that window."""
    guard = make_guard(store)
    for _ in range(3):
        turn = [Message(role="user", content="hello " * 3000)]
        guard.prepare("other", "sys", max_tokens=4000, model=HAIKU, pending=turn)
        guard.record_turn("other", [*turn, Message(role="assistant", content="ok")])
    before = guard.prepare("other", "sys", max_tokens=4000, model=HAIKU).report
    assert before.budget.window == 200_000 and before.limits_source == "registry"

    user = [pdfs(9)]
    refused = guard.prepare("big", "sys", max_tokens=4000, model=HAIKU, pending=user).report
    assert refused.budget.within_budget and refused.estimated_prompt_tokens < 100_000
    retry = guard.recover("big", sdk_error(400, BEDROCK), "sys", max_tokens=4000, model=HAIKU,
                          pending=user)
    assert retry is None
    assert store.summaries("big") == []
    assert guard.limits.get(HAIKU) is None
    after = guard.prepare("other", "sys", max_tokens=4000, model=HAIKU).report
    assert after.budget.window == 200_000 and after.limits_source == "registry"
    assert not after.truncated


def test_a_forced_view_that_loses_nothing_says_nothing_was_compacted(
        make_guard: Callable[..., Any], store: SessionStore) -> None:
    """A recovery forced on the next prepare (``recover_next``) whose newest message alone
    is over the recovery target: nothing can be dropped or clipped, and the view fits the
    window. It is sent as it is, with no block telling the model that an earlier part of a
    conversation that has none was compacted."""
    guard = make_guard(store, overrides={"m": 20_000})
    store.update_state("s", recover_next=1, model="m")
    big = [pdfs(3)]
    view = guard.prepare("s", "sys", max_tokens=1000, model="m", pending=big)
    assert view.report.recovery and view.report.budget.within_budget
    assert view.report.dropped_messages == 0 and view.report.note == ""
    assert [m.role for m in view.messages] == ["system", "user"]
    assert view.messages[0].text() == "sys"
    assert store.summaries("s") == []
