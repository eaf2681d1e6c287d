"""Usage reports against what was sent: calibration, and silent truncation upstream.

A server that keeps only the last ``num_ctx`` tokens and says nothing (Ollama) reports a
count that stops growing while the request keeps growing. Each such report, compared with
the calibrated estimate, pulled the ratio down a little, so a gradually growing session
never looked truncated: the guard learned the server's ceiling as the tokenizer's density.
"""

from __future__ import annotations

from typing import Any

from shared.core.tokens import DEFAULT_COUNTER
from tests.test_guard import SYSTEM

MODEL = "qwen2.5-coder:7b"  # no stated window: 128k assumed
CEILING = 4096


def _question(i: int) -> dict[str, Any]:
    return {"role": "user", "content": f"Question {i}: " + "why does the build break? " * 30}


def _run(guard: Any, sid: str, turns: int) -> list[int]:
    """``turns`` turns against a server that truncates to its last CEILING tokens; the
    sizes of the requests it truncated."""
    truncated: list[int] = []
    for i in range(turns):
        user = _question(i)
        view = guard.prepare(sid, SYSTEM, max_tokens=500, model=MODEL, pending=[user])
        real = DEFAULT_COUNTER.messages(list(view.messages))
        if real >= CEILING:
            truncated.append(real)
        reply = {"role": "assistant", "content": f"Answer {i}: " + "the lock file moved. " * 20}
        guard.record_turn(sid, [user, reply],
                          usage={"prompt_tokens": min(real, CEILING - 1)})
    return truncated


def test_a_server_that_silently_keeps_its_last_tokens_is_detected(guard: Any) -> None:
    truncated = _run(guard, "s", 30)
    assert len(truncated) >= 3  # the server truncated requests: the guard must notice
    state = guard.store.state("s")
    assert state.silent_truncation_flags >= 1
    # the ceiling is learned as the window; the ceiling's reports did not drag the ratio
    assert 0 < state.learned_window < CEILING
    assert state.calibration_ratio > 0.8
    view = guard.prepare("s", SYSTEM, max_tokens=500, model=MODEL, pending=[_question(99)])
    real = DEFAULT_COUNTER.messages(list(view.messages))
    assert real < CEILING  # what is sent next fits what the server keeps
    assert view.report.estimated_prompt_tokens >= real * 0.8


def test_a_growing_session_within_the_window_is_not_flagged(guard: Any) -> None:
    """Reports that grow with the request (a tokenizer a little denser than the
    heuristic) are calibration, never a ceiling."""
    for i in range(20):
        user = _question(i)
        view = guard.prepare("g", SYSTEM, max_tokens=500, model=MODEL, pending=[user])
        real = DEFAULT_COUNTER.messages(list(view.messages))
        reply = {"role": "assistant", "content": f"Answer {i}: " + "the lock file moved. " * 20}
        guard.record_turn("g", [user, reply], usage={"prompt_tokens": int(real * 0.7)})
    state = guard.store.state("g")
    assert state.silent_truncation_flags == 0 and state.learned_window == 0
    assert abs(state.calibration_ratio - 0.7) < 0.05


def test_erratic_reports_that_fall_behind_teach_no_window(guard: Any) -> None:
    """Counts that drop while the request grows (a caller passing only the uncached part
    of Anthropic's usage) are suspected, but are no steady ceiling: no window is learned
    from them."""
    shares = iter([1.0, 1.0, 1.0, 0.5, 0.9, 0.3, 0.7, 0.4] * 3)
    for i in range(20):
        user = _question(i)
        view = guard.prepare("e", SYSTEM, max_tokens=500, model=MODEL, pending=[user])
        real = DEFAULT_COUNTER.messages(list(view.messages))
        reply = {"role": "assistant", "content": f"Answer {i}: " + "the lock file moved. " * 20}
        guard.record_turn("e", [user, reply], usage={"prompt_tokens": int(real * next(shares))})
    state = guard.store.state("e")
    assert state.silent_truncation_flags >= 1 and state.learned_window == 0
