"""``recover`` decides whether its view will be sent before it writes it, judges a provider's
over-count by what the cut dropped, and knows the refused request's size in a process that
did not prepare it (both guard shells; fakeredis and a real Redis)."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import pytest

from shared.core.messages import FilePart, Message, TextPart
from shared.store.sessions import SessionStore

MODEL = "gpt-4o"  # a registry window of 128,000
SYSTEM = "You are a support agent."
FIG: dict[str, Any] = {"system_prompt": "You are terse.", "model": "gpt-4o-2024-11-20",
                       "max_tokens": 500}
LEARNING = {"learned_window", "learned_model", "model", "last_overflow_at"}
OVER_COUNTED = ("This model's maximum context length is 128000 tokens. However, your "
                "messages resulted in 131000 tokens.")
ZAI = "model_context_window_exceeded"  # states no numbers


def stored(store: SessionStore, session_id: str) -> tuple[dict[bytes, bytes], list[Any], int]:
    """What a recovery may not change when it sends nothing: the state (but what it learns
    of the window), the summaries and the log."""
    raw = store.redis.hgetall(store.keys(session_id).state)
    state = {k: v for k, v in raw.items() if k.decode() not in LEARNING}
    return state, store.summaries(session_id), store.length(session_id)


def steep_turn(guard: Any, first: list[dict[str, Any]]) -> tuple[list[dict[str, str]], int]:
    """docs/server.md's flow: one turn recorded with the provider's 812 prompt tokens (a steep
    calibration); the next turn's pending message and the estimate of its view."""
    guard.prepare("d", pending=first[:1], **FIG)
    guard.record_turn("d", first, usage={"prompt_tokens": 812, "completion_tokens": 9})
    pending = [{"role": "user", "content": "And /lib?"}]
    return pending, guard.prepare("d", pending=pending, **FIG).report.estimated_prompt_tokens


PLAIN = [{"role": "user", "content": "What is in /src?"},
         {"role": "assistant", "content": "a.py and b.py."}]


@pytest.mark.parametrize("error", [
    "This model's maximum context length is 128000 tokens",  # the window known: none learned
    "This model's maximum context length is 1024 tokens",  # a window stated
    "context_length_exceeded",  # none stated: the refused request bounds it
])
def test_a_recovery_that_gives_up_writes_nothing_but_the_window_it_learned(
        make_guard: Callable[..., Any], store: SessionStore, error: str) -> None:
    """No retry (the cut's notice outweighs the short turn it drops: no smaller view that
    fits), yet the recovery had written its plan: its truncation (the session's summary and
    watermark moved, the version too, and every later view lost the turn for a request
    that was never sent), or the request figures of a view never sent. The window the
    error states or implies is kept; nothing else is written."""
    guard = make_guard(store)
    pending, refused = steep_turn(guard, PLAIN)
    before = stored(store, "d")
    view = guard.recover("d", error, pending=pending, **FIG)
    assert view is None
    assert stored(store, "d") == before
    learned = {"1024": 1024, "context_length_exceeded": refused}
    assert store.state("d").learned_window == next(
        (v for k, v in learned.items() if k in error), 0)
    if store.state("d").learned_window:
        return  # the next prepares budget for the window learned: their own cuts
    for fresh in (guard, make_guard(store)):  # this process, and another one
        later = fresh.prepare("d", pending=pending, **FIG)
        assert [m.text() for m in later.messages[1:]] == [
            "What is in /src?", "a.py and b.py.", "And /lib?"]


TOOL_TURN = [
    {"role": "user", "content": "ls"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "name": "ls",
                                                         "arguments": "{}"}]},
    {"role": "tool", "tool_call_id": "c1", "content": '["a.py"]'},
    {"role": "assistant", "content": "a.py"}]


def test_an_over_count_that_dropped_a_tool_output_is_retried(
        make_guard: Callable[..., Any], store: SessionStore) -> None:
    """The provider counted 131000 tokens of a ~850-token view (as in
    tests/test_guard_recover_audit.py, where the first turn is plain text and the view
    without it is not sent), and the first turn is a tool call and its JSON output, which
    the estimate may measure far off (the guard never sees how the provider renders
    them): the view without them is sent, though the guard counts it larger."""
    guard = make_guard(store)
    pending, refused = steep_turn(guard, TOOL_TURN)
    view = guard.recover("d", OVER_COUNTED, pending=pending, **FIG)
    assert view is not None and view.report.dropped_messages == 4
    assert view.report.estimated_prompt_tokens >= refused  # the exception this test is about
    assert [m.text() for m in view.messages[1:]] == ["And /lib?"]
    assert store.state("d").watermark == 4  # this one is the session's cut


def long_session(guard: Any, session_id: str) -> tuple[list[Message], int]:
    """A session of ~10k tokens; its next turn's pending message and view's estimate."""
    for i in range(40):
        guard.record_turn(session_id, [
            Message(role="user", content=f"question {i} " + "detail " * 120),
            Message(role="assistant", content=f"answer {i} " + "detail " * 120)])
    pending = [Message(role="user", content="and now?")]
    return pending, int(guard.prepare(session_id, SYSTEM, max_tokens=1000, model=MODEL,
                                      pending=pending).report.estimated_prompt_tokens)


def test_another_process_does_not_resend_the_refused_view(
        make_guard: Callable[..., Any], store: SessionStore) -> None:
    """One guard (an HTTP server process) prepared the ~10k-token view, another recovers
    from its numberless overflow without ``prepared_tokens``: it did not know how large the
    refused request was, compacted to a fifth of the 128k window (more than the whole view)
    and returned the refused view again. It now finds the refused size from the session."""
    preparing, recovering = make_guard(store), make_guard(store)
    pending, refused = long_session(preparing, "s")
    assert 8_000 < refused < 0.2 * 128_000
    view = recovering.recover("s", ZAI, SYSTEM, max_tokens=1000, model=MODEL,
                              pending=pending)
    assert view is not None and view.report.dropped_messages > 0
    assert view.report.estimated_prompt_tokens < refused / 2
    assert view.messages[-1].text() == "and now?"


def pdfs(count: int) -> Message:
    data = base64.b64encode(b"%PDF-1.4 " + bytes(300)).decode()
    return Message(role="user", content=[TextPart(text="compare these"), *(
        FilePart(data=data, media_type="application/pdf", filename=f"r{i}.pdf")
        for i in range(count))])


def test_another_process_gives_up_where_nothing_can_be_dropped(
        make_guard: Callable[..., Any], store: SessionStore) -> None:
    """A first turn of 9 PDFs refused without a figure: nothing older to drop. The process
    that prepared it gives up; another one, not knowing the refused size, returned the
    very same request for a retry."""
    preparing, recovering = make_guard(store), make_guard(store)
    user = [pdfs(9)]
    haiku = "claude-3-5-haiku-20241022"
    preparing.prepare("big", "sys", max_tokens=4000, model=haiku, pending=user)
    error = {"message": "Input is too long for requested model.", "status_code": 400}
    assert recovering.recover("big", error, "sys", max_tokens=4000, model=haiku,
                              pending=user) is None
    assert store.summaries("big") == []


@pytest.mark.parametrize(("estimate", "cut", "unsure", "sent"), [
    (999, False, False, True),  # smaller: sent
    (1000, True, False, False),  # QA: as large, a plain turn cut: refused again (was sent)
    (1000, True, True, True),  # as large, but what it cut may hold the provider's excess
    (1001, True, False, False),
    (1000, False, True, False),  # nothing cut: the same request
])
def test_a_retry_no_smaller_than_the_refused_one_is_sent_only_for_an_unsure_cut(
        estimate: int, cut: bool, unsure: bool, sent: bool) -> None:
    from types import SimpleNamespace

    from shared.guard._recover_flow import _unsendable

    report = SimpleNamespace(budget=SimpleNamespace(within_budget=True),
                             estimated_prompt_tokens=estimate,
                             dropped_messages=2 if cut else 0, note="")
    assert (_unsendable(report, 1000, lambda: unsure) == "") is sent  # type: ignore[arg-type]
