"""``recover`` against provider errors as real SDKs raise them: a retry is smaller than
the refused request and fits, or there is none; what one session's refusal teaches does
not shrink the window of other sessions."""

from __future__ import annotations

import base64
import inspect
import json
import os
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from shared.core.errors import StoreUnavailable
from shared.core.messages import FilePart, ImagePart, Message, TextPart
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


def history(store: SessionStore, session_id: str, turns: int, chars: int) -> None:
    for i in range(turns):
        store.append(session_id, [Message(role="user", content=f"step {i} " + "x " * chars),
                                  Message(role="assistant", content=f"done {i} " + "y " * chars)])


TOOLS = [{"type": "function", "function": {
    "name": f"tool_{i}", "description": "Does a thing, described at length. " * 30,
    "parameters": {"type": "object", "properties": {"p": {"type": "string"}}}}}
    for i in range(20)]


def test_max_tokens_above_the_output_cap_is_capped_and_truncates_nothing(
        make_guard: Callable[..., Any], store: SessionStore) -> None:
    """gpt-4o answers at most 16,384 tokens: a max_tokens of 118,000 (refused by the
    provider anyway) reserves that cap, and the conversation is not truncated for it,
    on this call or the next."""
    guard = make_guard(store)
    history(store, "s", 40, 600)
    asked = guard.prepare("s", "sys", max_tokens=118_000, model="gpt-4o",
                          pending=[Message(role="user", content="next")]).report
    assert asked.budget.reserve == 16_384 and not asked.truncated
    after = guard.prepare("s", "sys", max_tokens=2000, model="gpt-4o",
                          pending=[Message(role="user", content="next")])
    assert len(after.messages) == 1 + 80 + 1 and not after.report.truncated
    assert store.state("s").summary_kind == ""


def test_max_tokens_that_leaves_no_room_reserves_less_for_this_call_only(
        make_guard: Callable[..., Any], store: SessionStore) -> None:
    """A model whose output cap is a guess, asked for more than its window: the reserve
    leaves room for the system prompt, the tools and the newest message (no
    IrreducibleOverflow for tools a 1,024-token input budget could not hold), and the
    truncation that reserve forces is this call's: the session's state keeps its whole
    conversation for the next call."""
    guard = make_guard(store)
    history(store, "s", 10, 600)
    user = [Message(role="user", content="next")]
    view = guard.prepare("s", "sys", tools=TOOLS, max_tokens=200_000, model="my-llama-32k",
                         pending=user)
    budget = view.report.budget
    assert budget.within_budget and budget.tools > 1024
    assert budget.reserve <= 32_000 - budget.tools - budget.system
    assert store.state("s").summary_kind == "" and store.summaries("s") == []
    after = guard.prepare("s", "sys", tools=TOOLS, max_tokens=1000, model="my-llama-32k",
                          pending=user)
    assert len(after.messages) == 1 + 20 + 1 and not after.report.truncated


VLLM = ("'max_tokens' or 'max_completion_tokens' is too large: {out}. This model's maximum "
        "context length is {window} tokens and your request has {prompt} input tokens "
        "({out} > {window} - {prompt}).")


def test_an_output_reserve_overflow_compacts_the_history_to_keep_the_answer(
        make_guard: Callable[..., Any], store: SessionStore) -> None:
    """prompt + max_tokens over the window, with history to drop: the retry keeps the
    max_tokens the caller sends (the README's loops send their own), the history makes room."""
    guard = make_guard(store)
    history(store, "s", 6, 200)
    user = [Message(role="user", content="summarise " + "word " * 1200)]
    refused = guard.prepare("s", "sys", max_tokens=2000, model="qwen-local", pending=user)
    sent = refused.report.estimated_prompt_tokens
    error = sdk_error(400, {"object": "error", "type": "BadRequestError", "code": 400,
                            "message": VLLM.format(out=2000, window=4096, prompt=sent - 50)})
    view = guard.recover("s", error, "sys", max_tokens=2000, model="qwen-local",
                         pending=user)
    assert view is not None and view.report.budget.window == 4096
    assert view.report.budget.within_budget and view.report.dropped_messages > 0
    assert view.report.estimated_prompt_tokens + view.report.budget.reserve <= 4096
    assert view.report.estimated_prompt_tokens + 2000 <= 4096  # what the caller sends fits
    assert view.messages[-1].text() == user[0].text()  # the newest message whole


def tool_turn(lines: tuple[int, ...]) -> list[Message]:
    """A user's request and one assistant step calling a tool per entry of ``lines``,
    with their results of that many lines each, not recorded yet."""
    calls = [{"id": f"c{i}", "name": "bash", "arguments": '{"arg": "make"}'}
             for i in range(len(lines))]
    return [Message(role="user", content="fix it"),
            Message(role="assistant", content="Checking.", tool_calls=calls),
            *(Message(role="tool", tool_call_id=f"c{i}", content="".join(
                f"line {k}: def f(x): return x + {k}  # output\n" for k in range(n)))
              for i, n in enumerate(lines))]


@pytest.mark.parametrize("over", [1.0, 1.1, 1.15, 1.2, 1.24])
def test_an_output_reserve_overflow_counted_over_the_estimate_fits_by_that_count(
        make_guard: Callable[..., Any], store: SessionStore, over: float) -> None:
    """The provider's tokenizer counts the refused prompt up to 25% above the guard's
    estimate (a model family the guard has no prior for, before any usage report), and
    states it: the retry must fit by that count, not only by the guard's. Filling what
    the answer leaves to ANSWER_HEADROOM (0.9) by the guard's count, an over-count below
    COUNTED_OVER (1.25) taken for the estimate's usual error, sent a retry the provider
    refused again: at 1.15, 3,836 tokens by the guard, 4,408 by the provider, + 800 over
    5,000 (found by the stateful test)."""
    guard = make_guard(store)
    turn = tool_turn((40, 150))
    refused = guard.prepare("s", "sys", max_tokens=800, model="qwen-local", pending=turn)
    sent = refused.report.estimated_prompt_tokens
    prompt = round(sent * over)
    window = min(prompt + 700, 6000)  # the prompt fits, prompt + max_tokens does not
    error = sdk_error(400, {"object": "error", "type": "BadRequestError", "code": 400,
                            "message": VLLM.format(out=800, window=window, prompt=prompt)})
    view = guard.recover("s", error, "sys", max_tokens=800, model="qwen-local", pending=turn)
    assert view is not None and view.report.budget.window == window
    counted = view.report.estimated_prompt_tokens * prompt / sent  # the provider's count
    assert counted + view.report.budget.reserve <= window, (counted, view.report.budget)
    assert view.messages[-4].text() == "fix it"  # the user's request whole


def test_an_output_reserve_overflow_with_nothing_to_drop_lowers_the_reserve(
        make_guard: Callable[..., Any], store: SessionStore) -> None:
    """The prompt fits the server's window, prompt + max_tokens does not, nothing but the
    newest message is left, and the error says both: the retry is the same conversation
    with a reserve that fits, by the provider's count and the guard's, not an
    IrreducibleOverflow."""
    guard = make_guard(store)
    history(store, "s", 1, 20)  # a turn too small to make room by dropping it
    user = [Message(role="user", content="summarise " + "word " * 2500)]
    refused = guard.prepare("s", "sys", max_tokens=2000, model="qwen-local", pending=user)
    sent = refused.report.estimated_prompt_tokens
    prompt = sent - 50  # the provider counts a little less than the guard
    error = sdk_error(400, {"object": "error", "type": "BadRequestError", "code": 400,
                            "message": VLLM.format(out=2000, window=4096, prompt=prompt)})
    view = guard.recover("s", error, "sys", max_tokens=2000, model="qwen-local",
                         pending=user)
    assert view is not None and view.report.budget.window == 4096
    assert view.report.budget.within_budget
    assert view.report.budget.reserve + prompt <= 4096
    assert view.report.budget.reserve + view.report.estimated_prompt_tokens <= 4096
    assert view.report.budget.reserve >= 4096 - max(prompt, sent) - 1  # all that fits
    assert view.report.budget.reserve >= 1000  # at least half the answer asked for
    assert view.messages[-1].text() == user[0].text()  # not clipped


def test_a_retry_with_less_room_for_the_answer_names_the_max_tokens_asked_for(
        make_guard: Callable[..., Any], store: SessionStore,
        caplog: pytest.LogCaptureFixture) -> None:
    """The retry of an output-reserve overflow with nothing to drop sends less than the
    caller's max_tokens: the warning names the figure the caller asked for and the room
    left (it said "max_tokens 1460 leaves no input budget" for a caller who asked 2000,
    the recovery's own figure)."""
    guard = make_guard(store)
    history(store, "s", 1, 20)
    user = [Message(role="user", content="summarise " + "word " * 2500)]
    refused = guard.prepare("s", "sys", max_tokens=2000, model="qwen-local", pending=user)
    prompt = refused.report.estimated_prompt_tokens - 50
    error = sdk_error(400, {"object": "error", "type": "BadRequestError", "code": 400,
                            "message": VLLM.format(out=2000, window=4096, prompt=prompt)})
    caplog.clear()
    with caplog.at_level("WARNING", logger="shared.guard"):
        view = guard.recover("s", error, "sys", max_tokens=2000, model="qwen-local",
                             pending=user)
    assert view is not None and view.report.budget.reserve < 2000
    said = [r.getMessage() for r in caplog.records if "max_tokens" in r.getMessage()]
    assert said == [f"session s: the retry leaves room for {view.report.budget.reserve} "
                    "tokens of answer, not the max_tokens 2000 asked for: send "
                    "view.report.budget.reserve as max_tokens"]


REQUEST_TOO_LARGE = {"type": "error", "error": {
    "type": "request_too_large", "message": "Request exceeds the maximum allowed number of bytes."}}


def photo_turn(i: int) -> Message:
    data = base64.b64encode(bytes([i]) * 16 + os.urandom(1_000_000)).decode()
    return Message(role="user", content=[TextPart(text=f"look at image {i}"),
                                         ImagePart(data=data, media_type="image/png")])


def wire_bytes(view: Any) -> int:
    return len(json.dumps(view.openai()))


def test_a_body_size_refusal_drops_the_oldest_media_until_the_body_fits(
        make_guard: Callable[..., Any], store: SessionStore) -> None:
    """Four inline images in the log and a fifth in the new turn: ~7 MB of base64 that is
    a few thousand tokens. The provider refuses the body's bytes (HTTP 413, no figure);
    a share of the window in tokens drops nothing, so the retry is sized by the refused
    body's bytes: the oldest images go, the newest turn stays, and the body shrinks by
    the recovery share."""
    guard = make_guard(store)
    for i in range(4):
        store.append("s", [photo_turn(i), Message(role="assistant", content=f"seen {i}")])
    user = [photo_turn(4)]
    refused = guard.prepare("s", "sys", max_tokens=500, model="gpt-4o", pending=user)
    sent = wire_bytes(refused)
    assert sent > 6_000_000 and refused.report.estimated_prompt_tokens < 20_000
    view = guard.recover("s", sdk_error(413, REQUEST_TOO_LARGE), "sys", max_tokens=500,
                         model="gpt-4o", pending=user)
    assert view is not None and view.report.dropped_messages > 0
    assert wire_bytes(view) <= 0.5 * sent
    assert view.openai()[-1] == refused.openai()[-1]  # the newest turn, image and all
    later = guard.prepare("s", "sys", max_tokens=500, model="gpt-4o", pending=user)
    assert wire_bytes(later) <= 0.5 * sent  # the cut is the session's from now on


def test_a_window_learned_while_its_write_failed_is_written_by_the_next_recovery(
        make_guard: Callable[..., Any], store: SessionStore,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The window is learned in the process, then written to the session's state for the
    workers and other processes. When that write failed (Redis down, the call cancelled),
    the next overflow stating the same window found it known and wrote nothing: the
    session stayed at the default window everywhere else."""
    guard = make_guard(store)
    history(store, "s", 6, 200)
    target = getattr(guard, "astore", None) or guard.store
    real, fails = target.update_state, [1]

    def failing() -> None:
        if fails[0]:
            fails[0] -= 1
            raise StoreUnavailable("redis unavailable during update_state: Timeout")

    if inspect.iscoroutinefunction(real):
        async def flaky(*args: Any, **kwargs: Any) -> Any:
            failing()
            return await real(*args, **kwargs)
    else:
        def flaky(*args: Any, **kwargs: Any) -> Any:  # type: ignore[misc]
            failing()
            return real(*args, **kwargs)

    user = [Message(role="user", content="next step")]
    error = ("This model's maximum context length is 3000 tokens. However, your messages "
             "resulted in 3500 tokens. Please reduce the length of the messages.")
    guard.prepare("s", "sys", max_tokens=200, model="qwen-local", pending=user)
    monkeypatch.setattr(target, "update_state", flaky)
    with pytest.raises(StoreUnavailable):
        guard.recover("s", error, "sys", max_tokens=200, model="qwen-local", pending=user)
    assert store.state("s").learned_window == 0
    assert guard.recover("s", error, "sys", max_tokens=200, model="qwen-local",
                         pending=user) is not None
    assert store.state("s").learned_window == 3000
