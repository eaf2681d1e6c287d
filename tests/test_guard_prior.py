"""A model family's tokenizer before its first usage report (``prior_ratio``): the guard and
the worker estimate a new Gemini or Claude session as those tokenizers count it, not at the
o200k baseline the stored counts use."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from shared.core.calibration import prior_ratio
from shared.core.tokens import DEFAULT_COUNTER, PROVIDERS, HeuristicCounter
from shared.core.tokens_exact import TiktokenCounter
from shared.store.sessions import SessionStore
from tests.test_guard import SYSTEM, coding_turn
from workers.compactor import Compactor
from workers.summarizer.counting import job_counter
from workers.summarizer.engine import SummaryEngine

GEMINI, CLAUDE = "gemini-2.5-pro", "claude-sonnet-4-5"


def chat_turn(i: int) -> list[dict[str, Any]]:
    """A turn without tool outputs: nothing for the cheap stages to clear."""
    return [{"role": "user", "content": f"Question {i}: " + "why does the cache miss? " * 40},
            {"role": "assistant", "content": f"Answer {i}: " + "the key changes per call. " * 60}]


@pytest.mark.parametrize(("model", "ratio"), [
    (GEMINI, PROVIDERS["gemini"].factor), ("vertex_ai/gemini-3-pro-preview", 1.18),
    ("google/gemma-3-27b-it", 1.18),
    (CLAUDE, PROVIDERS["anthropic"].factor), ("anthropic.claude-3-5-sonnet-v2:0", 1.30),
    ("gpt-4o", 1.0), ("o3-mini", 1.0), ("llama-3.1-70b-instruct", 1.0), ("", 1.0),
])
def test_the_prior_is_the_family_against_the_counters_baseline(model: str, ratio: float) -> None:
    assert prior_ratio(model, DEFAULT_COUNTER) == pytest.approx(ratio)
    assert prior_ratio(model, job_counter(DEFAULT_COUNTER)) == pytest.approx(ratio)


def test_a_counter_of_the_family_or_of_unknown_baseline_gets_no_prior() -> None:
    assert prior_ratio(GEMINI, HeuristicCounter("gemini")) == 1.0
    assert prior_ratio(CLAUDE, HeuristicCounter("anthropic")) == 1.0
    assert TiktokenCounter.provider == "openai"  # exact OpenAI counts: other families scale

    class Exact:  # a user's own counter may count that model exactly: left alone
        def text(self, text: str) -> int:
            return len(text)

    assert prior_ratio(GEMINI, Exact()) == 1.0


def _estimate(guard: Any, model: str, sid: str) -> int:
    view = guard.prepare(sid, SYSTEM, max_tokens=500, model=model)
    return int(view.report.estimated_prompt_tokens)


def test_a_new_session_is_estimated_as_its_family_counts(guard: Any) -> None:
    for sid in ("g", "o"):
        for i in range(4):
            guard.store.append(sid, coding_turn(i, 2000))
    gemini, openai = _estimate(guard, GEMINI, "g"), _estimate(guard, "gpt-4o", "o")
    assert gemini == pytest.approx(openai * 1.18, abs=2)
    # the first report replaces the prior: the provider's count is the truth
    user = {"role": "user", "content": "next"}
    view = guard.prepare("g", SYSTEM, max_tokens=500, model=GEMINI, pending=[user])
    heuristic = guard.counter.messages(list(view.messages))
    guard.record_turn("g", [user, {"role": "assistant", "content": "ok"}],
                      usage={"prompt_tokens": heuristic})
    state = guard.store.state("g")
    assert state.calibration_samples == 1 and state.calibration_ratio == pytest.approx(1.0,
                                                                                      abs=0.02)
    assert _estimate(guard, GEMINI, "g") < gemini * 0.9


def test_a_gemini_view_fits_as_gemini_counts_it(make_guard: Callable[..., Any],
                                                store: SessionStore) -> None:
    """At 92% of the budget by the o200k heuristic a Gemini request is 109% by Gemini's own
    count: it would be refused; the guard cuts it to fit the family's count."""
    for i in range(8):
        store.append("s", chat_turn(i))
    heuristic = make_guard(store).prepare("s", SYSTEM, max_tokens=500,
                                          model="gpt-4o").report.estimated_prompt_tokens
    window = int(heuristic / 0.92) + 500
    guard = make_guard(store, overrides={GEMINI: window, "gpt-4o": window})
    plain = guard.prepare("s", SYSTEM, max_tokens=500, model="gpt-4o")
    assert not plain.report.truncated
    view = guard.prepare("s", SYSTEM, max_tokens=500, model=GEMINI)
    assert view.report.truncated
    sent = guard.counter.messages(list(view.messages))
    assert sent * PROVIDERS["gemini"].factor + 500 <= window


def test_the_worker_estimates_with_the_same_prior(make_guard: Callable[..., Any],
                                                  store: SessionStore) -> None:
    """Below the trigger by the o200k heuristic, above it as Gemini counts: the guard asks
    for a summary and the worker, estimating alike, does not skip it as not due."""
    for i in range(8):
        store.append("s", chat_turn(i))
    heuristic = make_guard(store).prepare("s", SYSTEM, max_tokens=500,
                                          model="gpt-4o").report.estimated_prompt_tokens
    window = int(heuristic / 0.74) + 500  # 0.74 of the budget; x1.18 = 0.87, over the 0.8
    for model, due in (("gpt-4o", False), (GEMINI, True)):
        guard = make_guard(store, overrides={model: window})
        report = guard.prepare("s", SYSTEM, max_tokens=500, model=model).report
        assert report.budget.should_compact is due
        outcome = Compactor(store, SummaryEngine(None)).run("s")
        assert (outcome.status != "skipped") is due, outcome.reason


def test_stats_show_the_estimate_the_guard_uses(guard: Any) -> None:
    for i in range(4):
        guard.store.append("g", coding_turn(i, 2000))
    estimate = _estimate(guard, GEMINI, "g")
    stats = guard.stats("g")
    assert stats["estimated_prompt_tokens"] == pytest.approx(estimate, abs=2)
    assert stats["calibration_ratio"] == pytest.approx(1.18) and stats["calibration_samples"] == 0


def test_a_fallback_to_another_family_is_estimated_by_its_prior(guard: Any) -> None:
    """Reports taught the ratio for GPT; the session falls back to Claude: neither that ratio
    nor its anchor describes Claude's tokenizer, so the prior does until Claude reports."""
    for i in range(4):
        guard.store.append("f", coding_turn(i, 2000))
    user = {"role": "user", "content": "next"}
    view = guard.prepare("f", SYSTEM, max_tokens=500, model="gpt-4o", pending=[user])
    heuristic = guard.counter.messages(list(view.messages))
    guard.record_turn("f", [user, {"role": "assistant", "content": "ok"}],
                      usage={"prompt_tokens": int(heuristic * 0.9)})
    state = guard.store.state("f")
    assert state.calibration_family == "openai" and state.calibration_samples == 1
    gpt = _estimate(guard, "gpt-4o", "f")
    claude = _estimate(guard, CLAUDE, "f")
    assert claude == pytest.approx(gpt / 0.9 * 1.30, rel=0.02)
    view = guard.prepare("f", SYSTEM, max_tokens=500, model=CLAUDE, pending=[user])
    heuristic = guard.counter.messages(list(view.messages))
    guard.record_turn("f", [user, {"role": "assistant", "content": "ok"}],
                      usage={"input_tokens": int(heuristic * 1.25)})
    state = guard.store.state("f")  # Claude's first report starts the ratio afresh
    assert state.calibration_family == "anthropic" and state.calibration_samples == 1
    assert state.calibration_ratio == pytest.approx(1.25, abs=0.01)
