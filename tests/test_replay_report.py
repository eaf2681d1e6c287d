"""compaction replay: the provider's responder, the report, the job log, the counter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.core.errors import InvalidInput
from workers.harness.fakes.counting import DEFAULT_TOKENIZER_PATH, char_counter
from workers.harness.replay.report import (
    Distribution,
    RunReport,
    SessionReport,
    percentile,
    render_causes,
    render_comparison,
    render_markdown,
    trace_causes,
)
from workers.harness.replay.run import (
    ReplayOptions,
    ReplayResponder,
    resolve_counter,
)
from workers.harness.replay.sessions import parse_session
from workers.harness.stack.worker_process import parse_job_lines


# -- the responder, the report, the job log -----------------------------------------------
def test_responder_answers_each_session_in_order_and_caps_usage() -> None:
    sessions = [parse_session({"messages": [
        {"role": "user", "content": "q"}, {"role": "assistant", "content": f"{name} one"},
        {"role": "user", "content": "q"}, {"role": "assistant", "content": "long " * 400}]},
        1, i) for i, name in enumerate(["a", "b"])]
    responder = ReplayResponder(char_counter())
    for s in sessions:
        responder.add(s.key, s.turns())
    first = responder({"prompt_cache_key": sessions[1].key, "max_tokens": 50})
    assert first["content"] == "b one" and "completion_tokens" not in first
    long = responder({"prompt_cache_key": sessions[1].key, "max_tokens": 50})
    assert long["completion_tokens"] == 50 and long["content"] == "long " * 400
    assert responder.over_max_tokens[sessions[1].key] == 1
    responder.align(sessions[0].key, 1)  # turn 0 failed without consuming its reply
    assert responder({"prompt_cache_key": sessions[0].key})["content"].startswith("long")
    with pytest.raises(InvalidInput):
        responder({"prompt_cache_key": "nobody"})


def test_percentiles_and_distribution() -> None:
    assert percentile([], 50) == 0.0
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([float(i) for i in range(1, 101)], 99) == 99.0
    d = Distribution.of([1.0, 5.0, 2.0])
    assert (d.count, d.p50, d.max) == (3, 2.0, 5.0)


@given(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=50))
def test_percentile_is_a_sample_between_min_and_max(values: list[float]) -> None:
    for q in (1, 50, 99, 100):
        p = percentile(values, q)
        assert p in values and min(values) <= p <= max(values)
    assert percentile(values, 50) <= percentile(values, 99)


def test_report_totals_and_rendering() -> None:
    a = SessionReport(key="0000-a", source_id="a", line=1, messages=10, turns=5, rejections=1,
                      rejected_truncated=1, summaries_over_truncation=2, tokens_sent=100,
                      tokens_full=400, summaries={"llm": 2, "truncation": 1},
                      jobs={"compacted": 2, "skipped": 3}, prepare_ms=[1.0, 2.0],
                      lag_turns=[1, 3], max_prompt_ratio=0.8)
    b = SessionReport(key="0001-b", source_id="b", line=2, messages=4, turns=2,
                      tokens_sent=50, tokens_full=100, summaries={"llm": 1})
    b.fail(1, "retry", ValueError("still too long"))
    report = RunReport(window=8000, max_tokens=512, model="m", source="x.jsonl",
                       infrastructure="test", counter="chars/4", summarizer="offline",
                       sessions=[a, b])
    t = report.totals
    assert (t["turns"], t["failed_turns"], t["rejections"]) == (7, 1, 1)
    assert t["summaries"] == {"llm": 3, "truncation": 1}
    assert t["tokens_saved_ratio"] == pytest.approx(0.7)
    text = render_markdown(report, per_session=True)
    assert "**1**" in text and "still too long" in text and "`a`" in text
    assert "| of which views the guard had truncated | 1 |" in text
    assert "lost their swap to a truncation and replaced it | 2 |" in text
    dumped = report.model_dump(mode="json")
    assert dumped["totals"]["turns"] == 7 and "prepare_ms" not in dumped["sessions"][0]
    assert "| 8,000 | 8,000 |" in render_comparison([report, report])


def test_trace_causes_classify_truncations_by_the_turn_before_and_rejections() -> None:
    def row(session: str, usage: float, truncated: bool = False,
            rejected: str | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"session": session, "prepare": {
            "usage_ratio": usage, "truncated": truncated, "estimated": 1000}}
        if rejected is not None:
            out["rejected"] = rejected
        return out

    over = ("Error code: 400 - This model's maximum context length is 8000 tokens. However, "
            "you requested 8030 tokens (1006 in the messages, 1024 in the completion).")
    rows = [row("a", 0.5, truncated=True), row("b", 0.3),  # a's first turn
            row("a", 0.9), row("b", 0.85, truncated=True),  # b: new input
            row("a", 0.95, truncated=True), row("a", 0.94, truncated=True),  # late, chain
            row("b", 0.99, rejected=over), row("a", 0.96, truncated=True, rejected=over)]
    causes = trace_causes(rows, trigger_ratio=0.8)
    assert causes.truncations == {"worker late": 1, "after a truncation": 2, "new input": 1,
                                  "first turn": 1}
    assert (causes.rejected_truncated, causes.rejected_untruncated) == (1, 1)
    assert causes.excess == [0.006, 0.006] and causes.usage_at_rejection == [0.99, 0.96]
    text = render_causes(causes)
    assert "proactive truncations (5)" in text and "1 of truncated views" in text
    assert "+0.6%" in text
    assert render_causes(trace_causes([], 0.8)).endswith("rejections: none\n")


def test_job_log_lines_are_parsed_and_noise_ignored() -> None:
    lines = ['[x: INFO] compaction.end {"session_id": "s", "status": "compacted"}',
             "[x: INFO] Task received", "compaction.end {broken", "compaction.end [1]"]
    assert parse_job_lines(lines) == [{"session_id": "s", "status": "compacted"}]


def test_resolve_counter(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="tokenizer"):
        resolve_counter(str(tmp_path / "nope.tiktoken"))
    found, name = resolve_counter(None, [tmp_path])
    if DEFAULT_TOKENIZER_PATH.is_file():
        assert name.startswith("o200k") and found.text("hello world") == 2
    else:
        assert name.startswith("chars/4")


def test_options_are_validated() -> None:
    with pytest.raises(InvalidInput, match="window"):
        ReplayOptions(window=100)
    with pytest.raises(InvalidInput, match="max_tokens"):
        ReplayOptions(window=8000, max_tokens=5000)
    with pytest.raises(InvalidInput, match="parallel"):
        ReplayOptions(window=8000, parallel=0)
