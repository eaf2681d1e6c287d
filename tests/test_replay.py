"""compaction replay: loading real and broken sessions, the agent loop, and the end-to-end proof.

The end-to-end tests replay sessions against the window-enforcing fake
provider with a real Redis and a real Celery worker subprocess, and assert
what the issue asks: zero failed turns and compactions that happened.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.core.config import CompactionPolicy, StoreConfig
from shared.core.errors import InvalidInput
from shared.core.messages import Message
from shared.core.tokens import DEFAULT_COUNTER
from shared.core.wire import to_openai
from shared.enqueue import QUEUE, CallbackEnqueuer, NullEnqueuer
from shared.store.keys import validate_session_id
from shared.store.sessions import SessionStore
from tests.strategies import any_conversations
from workers.cli import replay as replay_command
from workers.compactor import Compactor
from workers.harness.demo_session import SYSTEM_PROMPT, TOOLS, generate_session
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
    replay_sessions,
    resolve_counter,
    run_replay,
)
from workers.harness.replay.sessions import load_sessions, parse_session, session_key
from workers.harness.stack.services import Services
from workers.harness.stack.worker_process import parse_job_lines
from workers.settings import load_settings
from workers.summarizer.engine import SummaryEngine
from workers.urls import with_db

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "transcripts.dev.jsonl"
CI_SESSIONS = ("sphinx-doc__sphinx-9229", "django__django-14349", "pytest-dev__pytest-5787")


def write_jsonl(path: Path, items: list[Any]) -> Path:
    path.write_text("\n".join(i if isinstance(i, str) else json.dumps(i) for i in items) + "\n")
    return path


def synthetic_session(turns: int, seed: int) -> dict[str, Any]:
    """A long coding session from the demo generator, in the transcripts' format."""
    messages = generate_session(turns, seed=seed)
    return {"id": f"synthetic-{seed}", "messages": messages, "tools": TOOLS}


def counter() -> Any:
    return resolve_counter()[0]


# -- loading ------------------------------------------------------------------------------
def test_malformed_lines_are_skipped_with_their_reason(tmp_path: Path) -> None:
    good = {"id": "ok", "messages": [{"role": "user", "content": "hi"},
                                     {"role": "assistant", "content": "hello"}]}
    path = write_jsonl(tmp_path / "s.jsonl", [
        "{not json", json.dumps([1, 2]), {"id": "no-messages"}, {"id": "empty", "messages": []},
        {"id": "no-assistant", "messages": [{"role": "user", "content": "hi"}]},
        {"id": "bad-tool", "messages": [{"role": "tool", "content": "x"},
                                        {"role": "assistant", "content": "y"}]},
        {"id": "bad-role", "messages": [{"role": "robot", "content": "x"}]},
        "", good])
    loaded = load_sessions(path)
    assert [s.source_id for s in loaded.sessions] == ["ok"]
    reasons = {s.source_id: s.reason for s in loaded.skipped}
    assert set(reasons) == {"line-1", "line-2", "no-messages", "empty", "no-assistant",
                            "bad-tool", "bad-role"}
    assert "messages" in reasons["no-messages"]
    assert "no assistant message" in reasons["no-assistant"]
    assert "tool_call_id" in reasons["bad-tool"]
    assert "robot" in reasons["bad-role"]


def test_repairs_keep_the_meaning_and_are_noted() -> None:
    session = parse_session({"id": "weird id/with spaces", "messages": [
        {"role": "user", "content": "go", "timestamp": 3},
        {"role": "assistant", "content": None, "tool_calls": [
            {"name": "bash", "arguments": "ls -la {"},
            {"id": "c2", "name": "read", "arguments": {"path": "a.py"}}]},
        {"role": "tool", "tool_call_id": "call_replay_1", "content": {"files": ["a.py"]}},
        {"role": "tool", "tool_call_id": "c2", "content": "print(1)"},
        {"role": "assistant", "content": "done"}]}, line=1, position=7)
    assert session.key == "0007-weird_id_with_spaces"
    assert session.system_prompt == ""
    calls = session.messages[1].tool_calls
    assert calls[0].id == "call_replay_1"
    assert json.loads(calls[0].arguments) == {"raw_arguments": "ls -la {"}
    assert json.loads(calls[1].arguments) == {"path": "a.py"}
    assert json.loads(session.messages[2].text()) == {"files": ["a.py"]}
    assert len(session.repairs) == 4  # dropped key, generated id, wrapped args, JSON content
    assert session.tools_source == "derived"
    assert session.tools is not None
    names = [t["function"]["name"] for t in session.tools]
    assert names == ["bash", "read"]
    assert session.tools[1]["function"]["parameters"]["properties"] == {"path": {"type": "string"}}


def test_system_prompt_tools_reused_ids_and_turns() -> None:
    call = {"id": "c", "name": "bash", "arguments": "{}"}
    raw = {"messages": [
        {"role": "system", "content": "be brief"}, {"role": "developer", "content": "really"},
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c", "content": "1"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c", "content": "2"},
        {"role": "assistant", "content": "ok"}, {"role": "user", "content": "trailing"}],
        "tools": [{"type": "function", "function": {"name": "bash"}}]}
    session = parse_session(raw, line=3, position=0)
    assert session.source_id == "line-3"
    assert session.system_prompt == "be brief\n\nreally"
    assert session.tools_source == "recorded"
    assert session.reused_tool_ids == 1
    turns = session.turns()
    assert [t.index for t in turns] == [1, 3, 5]
    assert [len(t.pending) for t in turns] == [1, 1, 1]
    no_tools = parse_session({"messages": [{"role": "assistant", "content": "x"}]}, 1, 1)
    assert no_tools.tools is None and no_tools.tools_source == "none"


def test_limit_select_and_max_messages(tmp_path: Path) -> None:
    items = [synthetic_session(3, seed) for seed in range(4)]
    path = write_jsonl(tmp_path / "s.jsonl", items)
    assert len(load_sessions(path, limit=2).sessions) == 2
    chosen = load_sessions(path, select=["-2", "-3"]).sessions
    assert [s.source_id for s in chosen] == ["synthetic-2", "synthetic-3"]
    cut = load_sessions(path, max_messages=5).sessions
    assert all(len(s.messages) == 5 for s in cut)
    with pytest.raises(InvalidInput, match="path"):
        load_sessions(tmp_path / "missing.jsonl")
    with pytest.raises(InvalidInput, match="sessions"):
        load_sessions(path, limit=0)


@given(st.text(max_size=300), st.integers(0, 9999))
def test_session_keys_are_always_valid_store_ids(source_id: str, position: int) -> None:
    assert validate_session_id(session_key(position, source_id))


@settings(max_examples=60, deadline=None)
@given(any_conversations(max_turns=5))
def test_turns_partition_the_body_up_to_the_last_reply(messages: list[Message]) -> None:
    if not any(m.role == "assistant" for m in messages):
        return
    session = parse_session({"messages": to_openai(messages)}, line=1, position=0)
    rebuilt: list[Message] = []
    for turn in session.turns():
        assert turn.reply.role == "assistant"
        assert all(m.role != "assistant" for m in turn.pending)
        rebuilt += [*turn.pending, turn.reply]
    last = max(i for i, m in enumerate(session.messages) if m.role == "assistant")
    assert rebuilt == list(session.messages[: last + 1])


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


# -- the agent loop without workers (fakeredis, nothing enqueued) -------------------------
def services_without_workers() -> Services:
    return Services(mode="in-process", description="fakeredis, no workers",
                    store_client=fakeredis.FakeRedis(), enqueuer=NullEnqueuer(),
                    worker_settings=load_settings())


def replay_offline(sessions: list[Any], **options: Any) -> list[SessionReport]:
    opts = ReplayOptions(**{"window": 8000, "drain_timeout": 0, **options})
    reports, _ = replay_sessions(sessions, opts, services=services_without_workers(),
                                 counter=counter(), policy=CompactionPolicy(),
                                 store_config=StoreConfig(), tenant="t")
    return reports


def test_guard_alone_keeps_every_turn_inside_the_window() -> None:
    session = parse_session(synthetic_session(25, 3), line=1, position=0)
    [report] = replay_offline([session])
    assert report.turns == len(session.turns())
    assert report.failed_turns == 0, report.failures
    assert report.proactive_truncations > 0  # no workers: only the guard can make it fit
    assert report.turns_over_window_without_compaction > 0
    assert report.tokens_sent < report.tokens_full
    assert 0 < report.max_request_ratio <= 1.0


def test_unknown_window_is_learned_from_the_first_overflow() -> None:
    session = parse_session(synthetic_session(25, 4), line=1, position=0)
    [report] = replay_offline([session], learn_window=True)
    assert report.rejections >= 1 and report.reactive_recoveries >= 1
    assert report.recovered_turns == report.reactive_recoveries
    assert report.failed_turns == 0, report.failures


def oversized_newest(session: Any, turn: int, window: int, reserve: int) -> bool:
    """The guard's floor (system, tools, reserve, newest pending message) exceeds the window."""
    pending = session.turns()[turn].pending
    system = Message(role="system", content=session.system_prompt)
    floor = (DEFAULT_COUNTER.message(system) if session.system_prompt else 0) + reserve
    floor += DEFAULT_COUNTER.tools(session.tools or []) + DEFAULT_COUNTER.messages([])
    return bool(pending) and floor + DEFAULT_COUNTER.message(pending[-1]) > window


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(any_conversations(max_turns=6, max_words=400))
def test_any_conversation_replays_without_failed_or_invalid_requests(
        messages: list[Message]) -> None:
    """Valid or damaged (orphans, reused ids, moved results...): the provider accepts every call.

    The one tolerated failure is the guard's IrreducibleOverflow when the
    newest pending *user* message alone exceeds the window (a tool result
    that large is clipped instead: the test below).
    """
    if not any(m.role == "assistant" for m in messages):
        return
    session = parse_session({"messages": to_openai(messages)}, line=1, position=0)
    [report] = replay_offline([session], window=2048, max_tokens=256)
    unexplained = [f for f in report.failures if not (
        f.stage == "prepare" and f.error.startswith("IrreducibleOverflow")
        and oversized_newest(session, f.turn, 2048, 256))]
    assert unexplained == [], report.failures
    assert report.other_errors == 0


def test_a_reply_with_no_input_is_recorded_without_a_call() -> None:
    session = parse_session({"messages": [
        {"role": "assistant", "content": "Hello, how can I help?"},
        {"role": "user", "content": "Book a flight."},
        {"role": "assistant", "content": "Where to?"}]}, line=1, position=0)
    [report] = replay_offline([session])
    assert (report.turns, report.calls_without_input, report.failed_turns) == (2, 1, 0)
    assert report.tokens_sent > 0


def test_a_tool_result_larger_than_the_window_is_clipped_not_fatal() -> None:
    call = {"id": "c1", "name": "bash", "arguments": json.dumps({"command": "pylint ."})}
    session = parse_session({"messages": [
        {"role": "user", "content": "Lint the repository."},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "W0611 unused import os\n" * 2500},
        {"role": "assistant", "content": "Mostly unused imports."}]}, line=1, position=0)
    [report] = replay_offline([session], window=8000)
    assert report.failed_turns == 0, report.failures
    assert report.clipped_turns == 1


def inline_services() -> Services:
    """fakeredis, and an offline compactor that runs each job the moment it is enqueued."""
    client = fakeredis.FakeRedis()
    store = SessionStore(client, StoreConfig(), tenant="t")
    compactor = Compactor(store, SummaryEngine(None))

    def job(tenant: str, session_id: str) -> None:
        store.clear_pending(session_id)
        compactor.run(session_id)

    return Services(mode="in-process", description="fakeredis, inline offline jobs",
                    store_client=client, enqueuer=CallbackEnqueuer(job),
                    worker_settings=load_settings())


def test_workers_that_keep_up_leave_the_guard_nothing_to_truncate() -> None:
    """A huge tool output in a short turn: the guard must clip it while it is the pending
    input, but the next compaction must not keep it (the guard would clip every turn)."""
    body = synthetic_session(12, 6)
    call = {"id": "lint", "type": "function",
            "function": {"name": "bash", "arguments": json.dumps({"command": "pylint src"})}}
    lint = "".join(f"src/mod{i}.py:{i}:0: W0611: Unused import os\n" for i in range(700))
    body["messages"] += [
        {"role": "user", "content": "Lint the package."},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "lint", "content": lint},
        {"role": "assistant", "content": "700 unused imports of os."}]
    body["messages"] += synthetic_session(8, 7)["messages"][1:]
    session = parse_session(body, line=1, position=0)
    answer = next(i for i, m in enumerate(session.messages) if m.text().startswith("700 "))
    opts = ReplayOptions(window=8000, drain_timeout=0)
    rows: list[dict[str, Any]] = []
    [report], _ = replay_sessions([session], opts, services=inline_services(),
                                  counter=counter(), policy=CompactionPolicy(),
                                  store_config=StoreConfig(), tenant="t", trace=rows.append)
    assert report.failed_turns == 0 and report.rejections == 0, report.failures
    turn = next(r["turn"] for r in rows if r["index"] == answer)
    truncated = [r["turn"] for r in rows if r["prepare"]["truncated"]]
    assert turn in truncated and report.clipped_turns == 1  # the output as pending input
    assert turn + 1 not in truncated  # the compaction after it did not keep it
    # Any other truncation is a large pending input arriving below the trigger.
    assert all(rows[t - 1]["prepare"]["usage_ratio"] < 0.8 for t in truncated), truncated


# -- end to end: real Redis, real worker subprocess ---------------------------------------
@pytest.fixture
def configured(redis_url: str, key_prefix: str) -> Iterator[dict[str, str]]:
    urls = {"redis_url": with_db(redis_url, 9), "broker_url": with_db(redis_url, 10)}
    broker = redis.Redis.from_url(urls["broker_url"])
    broker.delete(QUEUE, "unacked", "unacked_index")
    yield {**urls, "key_prefix": key_prefix}
    broker.delete(QUEUE, "unacked", "unacked_index")
    broker.close()


def run_e2e(path: Path, urls: dict[str, str], **kwargs: Any) -> RunReport:
    settings = load_settings(**urls)
    return run_replay(path, ReplayOptions(window=kwargs.pop("window", 16_000), drain_timeout=60),
                      settings, base_env={"PATH": "/usr/bin:/bin"}, configured=True, **kwargs)


def assert_proof(report: RunReport, sessions: int) -> None:
    t = report.totals
    failures = [f for s in report.sessions for f in s.failures]
    assert t["sessions"] == sessions
    assert t["failed_turns"] == 0, failures
    assert t["summaries"].get("llm", 0) >= 1, (t, report.worker_logs)
    assert t["jobs"].get("compacted", 0) == t["summaries"]["llm"]
    assert t["tokens_sent"] < t["tokens_full"]
    assert t["max_request_ratio"] <= 1.0
    assert report.drained and report.infrastructure.startswith("configured Redis")


@pytest.mark.celery
@pytest.mark.slow
def test_real_sessions_end_to_end(configured: dict[str, str]) -> None:
    if not DATA.exists():
        pytest.skip(f"real sessions not found at {DATA} (the ../shared/data kit); "
                    "test_synthetic_sessions_end_to_end covers the harness")
    report = run_e2e(DATA, configured, max_messages=40, select=CI_SESSIONS)
    assert_proof(report, 3)
    assert report.counter.startswith("o200k")


@pytest.mark.celery
@pytest.mark.slow
def test_synthetic_sessions_end_to_end(tmp_path: Path, configured: dict[str, str]) -> None:
    path = write_jsonl(tmp_path / "s.jsonl",
                       [synthetic_session(30, seed) for seed in (1, 2)] + ["{broken"])
    report = run_e2e(path, configured, window=8000)
    assert_proof(report, 2)
    assert [s.reason[:20] for s in report.skipped] == ["Expecting property n"]
    assert all(s.tools_source == "recorded" for s in report.sessions)
    assert SYSTEM_PROMPT  # the sessions carry the demo's system prompt


@pytest.mark.slow
def test_in_process_fallback(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "s.jsonl", [synthetic_session(20, 5)])
    report = run_replay(path, ReplayOptions(window=8000, drain_timeout=30), load_settings(),
                        base_env={}, force_in_process=True)
    assert report.infrastructure.startswith("in-process")
    assert report.totals["failed_turns"] == 0
    assert report.totals["summaries"].get("llm", 0) >= 1, report.totals


@pytest.mark.celery
@pytest.mark.slow
def test_command_writes_json_and_exit_status(tmp_path: Path, configured: dict[str, str],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = write_jsonl(tmp_path / "s.jsonl", [synthetic_session(8, 9)])
    parser = argparse.ArgumentParser()
    replay_command.add_arguments(parser)
    out = tmp_path / "report.json"
    args = parser.parse_args([str(path), "--window", "8000", "--json", str(out), "--quiet",
                              "--summarizer", "offline", "--per-session"])
    code = replay_command.run(args, load_settings(**configured))
    assert code == 0
    printed = capsys.readouterr().out
    assert "### Replay: window 8,000 tokens, 1 sessions" in printed
    assert "- proactive truncations (" in printed and "- rejections" in printed
    data = json.loads(out.read_text())
    assert data["totals"]["failed_turns"] == 0 and data["sessions"][0]["turns"] > 0
    assert data["summarizer"].startswith("offline")
