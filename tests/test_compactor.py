"""One job's decisions and effects: trigger, cut, incremental merge, ledger, CAS."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shared.core.config import CompactionPolicy
from shared.core.errors import BadSummary, StoreUnavailable, SummarizerUnavailable
from shared.core.ledger import Ledger
from shared.core.messages import Message, ToolCall
from shared.core.records import SummaryRecord
from shared.core.repair import validate_view
from shared.core.tokens import DEFAULT_COUNTER
from shared.core.turns import turn_starts
from shared.core.wire import from_openai
from shared.guard import ContextGuard
from shared.store.sessions import SessionStore
from workers.compactor import FALLBACK_STAGE, MAX_ATTEMPTS, Compactor
from workers.harness.demo_session import SYSTEM_PROMPT, TOOLS, generate_session
from workers.harness.fakes.behaviour import Fault
from workers.harness.fakes.openai_server import FakeOpenAIServer
from workers.harness.fakes.summaries import SummarizerResponder
from workers.summarizer.engine import SummaryEngine
from workers.summarizer.providers import OpenAIClient


def turns_of(messages: list[Message]) -> list[list[Message]]:
    starts = turn_starts(messages)
    return [messages[a:b] for a, b in zip(starts, [*starts[1:], len(messages)], strict=True)]


@pytest.fixture
def demo_turns() -> list[list[Message]]:
    return turns_of(from_openai(generate_session(40))[1:])


def feed(store: SessionStore, turns: list[list[Message]], window: int = 32_000) -> ContextGuard:
    guard = ContextGuard(store, overrides={"gpt-4o": window})
    for t in turns:
        guard.prepare("s", SYSTEM_PROMPT, TOOLS, 2000, "gpt-4o", pending=t[:1])
        guard.record_turn("s", t)
    return guard


@pytest.fixture
def llm_server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(window=128_000, responder=SummarizerResponder()) as server:
        yield server


def llm_engine(server: FakeOpenAIServer, **kw: Any) -> SummaryEngine:
    client = OpenAIClient("gpt-4o-mini", base_url=server.base_url, api_key="k", timeout=5)
    return SummaryEngine(client, **kw)


def test_not_due_exits_fast(store: SessionStore, demo_turns: list[list[Message]]) -> None:
    feed(store, demo_turns[:2])
    started = time.perf_counter()
    outcome = Compactor(store, SummaryEngine(None)).run("s")
    assert outcome.status == "skipped" and "below trigger" in outcome.reason
    # no summarizer call, no retry wait: a bound that load on a shared machine cannot
    # reach (the job's CPU is in BENCHMARKS.md's workers table, not here)
    assert (time.perf_counter() - started) < 1.0


def test_a_window_no_model_can_have_is_not_taken_from_the_state(
        store: SessionStore, demo_turns: list[list[Message]]) -> None:
    """A learned window an older guard stored from a misparse (a "128k" read as 128) would
    make every session due and cut it to nothing: the worker ignores it, as the guard does."""
    feed(store, demo_turns[:2])
    store.update_state("s", learned_window=128, model="gpt-4o", learned_model="gpt-4o")
    outcome = Compactor(store, SummaryEngine(None)).run("s")
    assert outcome.status == "skipped" and "below trigger" in outcome.reason
    store.update_state("s", learned_window=1_000)  # credible: used
    assert Compactor(store, SummaryEngine(None)).run("s").status != "skipped"


def test_a_model_the_guard_was_given_a_window_for_does_not_warn_in_the_worker(
        store: SessionStore, demo_turns: list[list[Message]],
        caplog: pytest.LogCaptureFixture) -> None:
    """The guard stored the window its caller gave for a model no registry knows; the
    worker sizes the job by it and does not log that it guessed one ("pass overrides to
    the guard": the caller did)."""
    model = "in-house-model-9k"  # a name stating a window other than the one given
    guard = ContextGuard(store, overrides={model: 20_000})
    for t in demo_turns[:12]:
        guard.prepare("s", SYSTEM_PROMPT, TOOLS, 2000, model, pending=t[:1])
        guard.record_turn("s", t)
    with caplog.at_level("WARNING"):
        outcome = Compactor(store, SummaryEngine(None)).run("s")
    assert outcome.status == "compacted", outcome.reason
    assert not [r for r in caplog.records if "unknown model" in r.getMessage()]
    assert Compactor(store, SummaryEngine(None))._window(store.state("s"))[0] == 20_000


def test_offline_compaction_cuts_on_a_turn_boundary(store: SessionStore,
                                                    demo_turns: list[list[Message]]) -> None:
    guard = feed(store, demo_turns[:12])
    before = store.messages("s")
    outcome = Compactor(store, SummaryEngine(None)).run("s")
    assert outcome.status == "compacted", outcome.reason
    w = outcome.watermark_after
    # A turn boundary, or a unit boundary inside a long turn (split turn).
    assert 0 < w < len(before) and before[w].role in ("user", "assistant")
    assert before[w].role == "user" or "turn_prefix_summary" in outcome.stages \
        or outcome.summary_kind == "offline"
    assert outcome.tokens_after < outcome.tokens_before * 0.7
    assert outcome.summary_kind == "offline"
    record = store.load_view("s").summary
    assert record is not None and "## Goal" in record.text
    assert record.ledger_json and not Ledger.from_json(record.ledger_json).is_empty()
    view = guard.prepare("s", SYSTEM_PROMPT, TOOLS, 2000, "gpt-4o")
    for provider in ("openai", "anthropic", "gemini"):
        assert validate_view(view.messages, provider) == []
    # Right after a compaction nothing is due: hysteresis.
    assert Compactor(store, SummaryEngine(None)).run("s").status == "skipped"


def test_a_summary_records_the_tokens_of_what_the_guard_injects(
        store: SessionStore, demo_turns: list[list[Message]]) -> None:
    """A committed summary's tokens are those of the block the guard injects (its framing
    and ledger included), as the guard's own truncation records count them: 40 more were
    added for a framing the block already holds, so every view with a worker's summary was
    estimated 40 tokens over its recount, and the provider's reports taught the calibration
    ratio that gap as the tokenizer's."""
    from shared.core.view import summary_block

    guard = feed(store, demo_turns[:12])
    assert Compactor(store, SummaryEngine(None)).run("s").status == "compacted"
    record = store.load_view("s").summary
    assert record is not None and record.tokens == DEFAULT_COUNTER.text(summary_block(record))
    view = guard.prepare("s", SYSTEM_PROMPT, None, 2000, "gpt-4o",
                         pending=[{"role": "user", "content": "go on"}])
    assert 0 <= view.report.estimated_prompt_tokens - DEFAULT_COUNTER.messages(
        list(view.messages)) <= 1


def test_incremental_merge_sends_only_new_messages(store: SessionStore,
                                                   demo_turns: list[list[Message]],
                                                   llm_server: FakeOpenAIServer) -> None:
    compactor = Compactor(store, llm_engine(llm_server))
    feed(store, demo_turns[:12])
    first = compactor.run("s")
    assert first.status == "compacted" and first.summary_kind == "llm"
    sent_before = len(llm_server.requests)
    feed(store, demo_turns[12:24])
    second = compactor.run("s", manual=True)
    assert second.status == "compacted", second.reason
    prompts = [r.body["messages"][1]["content"] for r in llm_server.requests[sent_before:]]
    updates = [p for p in prompts if "<previous_summary>" in p]
    assert len(updates) == 1 and "Update an existing summary" in updates[0]
    shown = [int(i) for p in prompts for i in re.findall(r'<message index="(\d+)"', p)]
    assert min(shown) == first.watermark_after  # nothing before the watermark is re-sent
    assert max(shown) < second.watermark_after


def test_bad_llm_reply_is_never_stored(store: SessionStore, demo_turns: list[list[Message]],
                                       llm_server: FakeOpenAIServer) -> None:
    feed(store, demo_turns[:12])
    compactor = Compactor(store, llm_engine(llm_server))
    llm_server.faults.next(Fault.refusal())
    with pytest.raises(BadSummary):
        compactor.run("s")
    llm_server.faults.next(Fault.server_error())
    with pytest.raises(SummarizerUnavailable):
        compactor.run("s")
    llm_server.faults.next(Fault.empty())
    with pytest.raises(BadSummary):
        compactor.run("s")
    assert store.state("s").watermark == 0 and store.summaries("s") == []
    fallback = compactor.run("s", use_llm=False)
    assert fallback.status == "compacted" and fallback.summary_kind == "offline"
    upgraded = compactor.run("s")  # an LLM is back: the offline summary is rebuilt
    assert upgraded.status == "compacted" and upgraded.summary_kind == "llm"


def test_a_fallback_after_the_llm_failed_on_its_range_is_merged_onto_not_rebuilt(
        store: SessionStore, demo_turns: list[list[Message]],
        llm_server: FakeOpenAIServer) -> None:
    """The model refused this range: rebuilding the fallback every job would send it the
    same, ever longer range again (from message 0 while no LLM summary exists). It is not
    rebuilt; a truncation over it is rebuilt from its watermark on, not from message 0."""
    feed(store, demo_turns[:12])
    compactor = Compactor(store, llm_engine(llm_server))
    llm_server.faults.next(Fault.refusal())
    with pytest.raises(BadSummary):
        compactor.run("s")
    fallback = compactor.run("s", use_llm=False, llm_failed=True)
    assert fallback.summary_kind == "offline" and FALLBACK_STAGE in fallback.stages
    assert FALLBACK_STAGE in store.summaries("s")[-1].stages
    sent = len(llm_server.requests)
    assert compactor.run("s").status == "skipped"  # not due: nothing sent
    assert len(llm_server.requests) == sent
    feed(store, demo_turns[12:20])
    state = store.state("s")
    truncation = SummaryRecord(watermark=state.watermark + 4, kind="truncation",
                               text="(truncated)", tokens=5, covers_from=state.watermark,
                               source_version=state.version)
    assert store.commit_summary("s", truncation, state.version).ok
    rebuilt = compactor.run("s")
    assert rebuilt.status == "compacted" and rebuilt.summary_kind == "llm"
    prompts = [r.body["messages"][1]["content"] for r in llm_server.requests[sent:]]
    shown = [int(i) for p in prompts for i in re.findall(r'<message index="(\d+)"', p)]
    assert min(shown) == fallback.watermark_after  # from the fallback on, not from 0
    # unreachable, not refused: that fallback is rebuilt once the LLM answers
    feed(store, demo_turns[20:28])
    assert compactor.run("s", use_llm=False, manual=True).summary_kind == "offline"
    assert compactor.run("s").summary_kind == "llm"


def test_a_turn_is_kept_whole_when_the_room_is_smaller_than_one_turn(
        store: SessionStore) -> None:
    """An 8k window, long two-message turns and a job after each: the kept part may hold
    less than one turn. The newest turn is kept whole (the session stays under its
    trigger) rather than split after its question, whose answer would then open the view."""
    guard = ContextGuard(store)
    compactor = Compactor(store, SummaryEngine(None))
    splits = compacted = 0
    for i in range(24):
        words = " ".join(f"word{i}_{j}" for j in range(150))
        turn = [Message(role="user", content=f"question {i}: {words}"),
                Message(role="assistant", content=f"answer {i}: {words}")]
        guard.prepare("s", "You are helpful.", max_tokens=1000, model="gpt-4",
                      pending=turn[:1])
        guard.record_turn("s", turn)
        outcome = compactor.run("s")
        if outcome.status == "compacted":
            compacted += 1
            splits += store.messages("s", outcome.watermark_after,
                                     outcome.watermark_after + 1)[0].role != "user"
    assert compacted >= 10 and splits <= compacted // 4, (compacted, splits)


def test_edit_during_summarization_loses_the_swap(store: SessionStore,
                                                  demo_turns: list[list[Message]]) -> None:
    feed(store, demo_turns[:12])
    engine = SummaryEngine(None)
    compactor = Compactor(store, engine)
    original = engine.summarize

    def edit_then_summarize(*args: Any, **kw: Any) -> Any:
        store.truncate_after("s", store.length("s") - 3)  # the user edited a message
        engine.summarize = original  # type: ignore[method-assign]
        return original(*args, **kw)

    engine.summarize = edit_then_summarize  # type: ignore[method-assign]
    outcome = compactor.run("s")
    state = store.state("s")
    assert state.version >= 2  # the edit, then the retried commit
    assert outcome.status == "compacted" and state.watermark == outcome.watermark_after
    assert state.watermark <= store.length("s")


def test_facts_survive_twenty_compactions(store: SessionStore, data_dir: Path) -> None:
    """A lossy model keeps half of the facts; the ledger keeps all of them in the view."""
    rows = [json.loads(line) for line in (data_dir / "transcripts.dev.jsonl").open()]
    session = max(rows, key=lambda r: len(r["messages"]))
    messages = from_openai(session["messages"])
    system, body = messages[0].text(), messages[1:]
    units = [body[i:i + 6] for i in range(0, len(body), 6)]  # one agent step at a time
    policy = CompactionPolicy(max_ledger_chars=3000, max_summary_tokens=1500)
    with FakeOpenAIServer(window=200_000,
                          responder=SummarizerResponder(keep_facts=0.5)) as server:
        compactor = Compactor(store, llm_engine(server, max_summary_tokens=1500), policy=policy)
        guard = ContextGuard(store, policy=policy)
        compactions = 0
        for unit in units:
            guard.record_turn("s", unit)
            outcome = compactor.run("s", manual=True, keep_recent=200)
            if outcome.status == "compacted":
                compactions += 1
                record = store.load_view("s").summary
                assert record is not None and record.ledger_json
                ledger = Ledger.from_json(record.ledger_json)
                view = guard.prepare("s", system, max_tokens=1000, model="gpt-4o")
                text = "\n".join(m.text() for m in view.messages)
                assert ledger.missing_from(text).is_empty()
                assert len(record.injected_text()) < 1500 * 4 + 3000 + 500
            if compactions >= 20:
                break
    assert compactions >= 20


# -- a job that loses its swap to the guard's emergency truncation ----------------------
def truncation_at(store: SessionStore, watermark: int, note: str = "[context truncated]"
                  ) -> None:
    """Commit what the guard's emergency truncation commits: a note moving the watermark."""
    state = store.state("s")
    record = SummaryRecord(watermark=watermark, kind="truncation", text=note, tokens=20,
                           covers_from=state.watermark, source_version=state.version,
                           stages=["emergency_truncation"])
    assert store.commit_summary("s", record, state.version).ok


def during_summary(engine: SummaryEngine, action: Any, times: int = 1) -> list[int]:
    """Run ``action(call_number)`` while the first ``times`` summaries are being written."""
    original = engine.summarize
    calls: list[int] = []

    def summarize(*args: Any, **kw: Any) -> Any:
        calls.append(len(calls))
        draft = original(*args, **kw)
        if len(calls) <= times:
            action(len(calls))
        return draft

    engine.summarize = summarize  # type: ignore[method-assign]
    return calls


def test_a_truncation_behind_the_cut_is_replaced_by_the_lost_summary(
        store: SessionStore, demo_turns: list[list[Message]],
        llm_server: FakeOpenAIServer) -> None:
    feed(store, demo_turns[:12])
    engine = llm_engine(llm_server)
    calls = during_summary(engine, lambda _: truncation_at(store, 4))
    outcome = Compactor(store, engine).run("s")
    assert outcome.status == "compacted" and outcome.over_truncation, outcome
    assert outcome.attempts == 2 and "replaced_truncation" in outcome.stages
    assert len(calls) == 1  # the summary was written once and kept
    current = store.load_view("s").summary
    assert current is not None and current.kind == "llm"
    assert current.watermark == outcome.watermark_after > 4
    assert store.state("s").force_requested == 0


def test_a_truncation_past_the_cut_gets_the_dropped_range_merged_on(
        store: SessionStore, demo_turns: list[list[Message]],
        llm_server: FakeOpenAIServer) -> None:
    feed(store, demo_turns[:12])
    length = store.length("s")
    engine = llm_engine(llm_server)
    cuts: list[int] = []
    original_commit = store.commit_summary

    def commit(session_id: str, record: SummaryRecord, expected: int) -> Any:
        cuts.append(record.watermark)
        return original_commit(session_id, record, expected)

    store.commit_summary = commit  # type: ignore[method-assign,assignment]
    during_summary(engine, lambda _: truncation_at(store, length - 2))
    sent_before = len(llm_server.requests)
    outcome = Compactor(store, engine).run("s")
    assert outcome.status == "compacted" and outcome.over_truncation, outcome
    assert "merged_over_truncation" in outcome.stages
    first_cut = cuts[1]  # cuts[0] is the test's own truncation
    assert first_cut < length - 2 <= outcome.watermark_after
    current = store.load_view("s").summary
    assert current is not None and current.kind == "llm" and current.covers_from == first_cut
    # the second request merges onto the lost summary: only the dropped range is sent
    prompts = [r.body["messages"][1]["content"] for r in llm_server.requests[sent_before:]]
    merged = [p for p in prompts if f'<message index="{first_cut}"' in p]
    assert merged and "<previous_summary>" in merged[-1]
    shown = [int(i) for i in re.findall(r'<message index="(\d+)"', merged[-1])]
    assert min(shown) == first_cut


def test_a_newer_real_summary_is_never_overwritten(store: SessionStore,
                                                   demo_turns: list[list[Message]]) -> None:
    feed(store, demo_turns[:12])
    other = Compactor(store, SummaryEngine(None))
    engine = SummaryEngine(None)
    newer: list[int] = []

    def another_worker(_: int) -> None:
        done = other.run("s", manual=True, keep_recent=200)
        assert done.status == "compacted"
        newer.append(done.watermark_after)

    during_summary(engine, another_worker)
    outcome = Compactor(store, engine).run("s")
    assert outcome.status == "covered" and not outcome.over_truncation
    assert store.state("s").watermark == newer[0]
    assert [s.kind for s in store.summaries("s")] == ["offline"]


def test_a_lost_summary_is_dropped_after_a_history_edit(store: SessionStore,
                                                        demo_turns: list[list[Message]]) -> None:
    feed(store, demo_turns[:12])
    engine = SummaryEngine(None)
    length = store.length("s")

    def truncate_then_edit(_: int) -> None:
        truncation_at(store, 4)
        store.truncate_after("s", length - 6)  # the user edited a message: log shrinks

    during_summary(engine, truncate_then_edit)
    outcome = Compactor(store, engine).run("s", force=True)
    assert not outcome.over_truncation
    state = store.state("s")
    assert state.watermark <= store.length("s") == length - 6
    assert all(s.watermark <= length - 6 for s in store.summaries("s"))


def test_a_job_that_keeps_losing_to_truncations_gives_up_without_moving_back(
        store: SessionStore, demo_turns: list[list[Message]]) -> None:
    """A truncation to the end of a growing log during every attempt: each merge loses."""
    feed(store, demo_turns[:12])
    engine = SummaryEngine(None)
    marks: list[int] = []

    def agent_turn_then_truncation(_: int) -> None:
        store.append("s", [Message(role="user", content="Continue."),
                           Message(role="assistant", content="Continuing.")])
        marks.append(store.length("s"))
        truncation_at(store, marks[-1])

    calls = during_summary(engine, agent_turn_then_truncation, times=MAX_ATTEMPTS)
    outcome = Compactor(store, engine).run("s", force=True)
    assert (outcome.status, outcome.attempts, len(calls)) == ("covered", MAX_ATTEMPTS,
                                                              MAX_ATTEMPTS)
    state = store.state("s")
    assert state.watermark == marks[-1] and state.summary_kind == "truncation"
    watermarks = [r.watermark for r in sorted(store.summaries("s"),
                                              key=lambda r: r.source_version)]
    assert watermarks == sorted(watermarks)


# -- the kept part fits the target --------------------------------------------------------
def test_a_huge_recent_tool_output_does_not_survive_the_compaction(
        store: SessionStore, demo_turns: list[list[Message]],
        llm_server: FakeOpenAIServer) -> None:
    """A short last turn with a huge tool result: snapping back to its start kept it whole."""
    feed(store, demo_turns[:8])
    call = ToolCall(id="lint", name="bash", arguments={"command": "pylint src"})
    output = "".join(f"src/mod{i}.py:{i}:0: W0611: Unused import os (unused-import)\n"
                     for i in range(1200))
    last = [Message(role="user", content="Lint the package."),
            Message(role="assistant", tool_calls=[call]),
            Message(role="tool", tool_call_id="lint", content=output),
            Message(role="assistant", content="1,200 unused imports, all of os.")]
    feed(store, [last])
    compactor = Compactor(store, llm_engine(llm_server))
    data = store.load_view("s")
    budget = compactor._estimate(data)[2]
    target = int(CompactionPolicy().target_ratio * budget)
    assert DEFAULT_COUNTER.message(last[2]) > target  # kept whole, no cut could reach it
    outcome = compactor.run("s")
    assert outcome.status == "compacted", outcome.reason
    kept = store.messages("s", outcome.watermark_after)
    assert [m.text() for m in kept] == [last[3].text()]  # the call and its output compacted
    assert outcome.tokens_after <= target
    # the turn is split after 3 messages: merged into the summary, not a prefix summary
    assert outcome.stages == ["fresh_summary"] and len(llm_server.requests) == 1
    assert store.load_view("s").summary.kind == "llm"  # type: ignore[union-attr]


def test_reported_view_after_equals_a_fresh_read(store: SessionStore,
                                                 demo_turns: list[list[Message]],
                                                 llm_server: FakeOpenAIServer) -> None:
    """tokens_after / messages_after are derived from the job's read, not read again:
    they must equal what a fresh read of the committed session says."""
    feed(store, demo_turns[:14])
    for engine in (SummaryEngine(None), llm_engine(llm_server)):
        compactor = Compactor(store, engine)
        outcome = compactor.run("s", force=True)
        assert outcome.status == "compacted", outcome.reason
        fresh = store.load_view("s")
        assert outcome.tokens_after == compactor._estimate(fresh)[0]
        assert outcome.messages_after == fresh.length - fresh.state.watermark
        assert outcome.watermark_after == fresh.state.watermark


def test_a_commit_redis_did_not_answer_is_sent_again_not_thrown_away(
        store: SessionStore, demo_turns: list[list[Message]], llm_server: FakeOpenAIServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A pause of Redis (a fork for BGSAVE, a failover) at the commit: the summary the LLM
    already wrote is committed when Redis answers again, not summarized a second time."""
    import workers.compactor as compactor_module

    feed(store, demo_turns[:12])
    for t in demo_turns[:12]:  # a twin session: what summarizing it takes
        store.append("twin", t)
    store.update_state("twin", **{k: getattr(store.state("s"), k)
                                  for k in ("model", "window", "system_tokens", "tool_tokens",
                                            "max_tokens")})
    clean = Compactor(store, llm_engine(llm_server)).run("twin", force=True, manual=True)
    calls = len(llm_server.requests)
    assert clean.status == "compacted" and calls >= 1
    monkeypatch.setattr(compactor_module, "COMMIT_RETRY_DELAYS", (0.01, 0.01, 0.01))
    real, failures = store.commit_summary, [2]

    def paused(*args: Any, **kwargs: Any) -> Any:
        if failures[0]:
            failures[0] -= 1
            raise StoreUnavailable("redis unavailable during commit_summary: Timeout")
        return real(*args, **kwargs)

    monkeypatch.setattr(store, "commit_summary", paused)
    outcome = Compactor(store, llm_engine(llm_server), policy=CompactionPolicy()).run(
        "s", force=True, manual=True)
    assert outcome.status == "compacted" and outcome.summary_kind == "llm"
    assert len(llm_server.requests) == 2 * calls and failures == [0]
    assert store.state("s").watermark == outcome.watermark_after > 0


def test_a_job_for_a_session_it_cannot_find_says_which_keys_it_read(
        store: SessionStore, caplog: pytest.LogCaptureFixture) -> None:
    """Workers on another key prefix, tenant or db than the agent find nothing: said, with
    what to check (it read as an empty session 'below trigger', forever)."""
    with caplog.at_level("WARNING", logger="compaction.job"):
        outcome = Compactor(store, SummaryEngine(None)).run("elsewhere")
        in_tenant = Compactor(store.for_tenant("t2"), SummaryEngine(None)).run("elsewhere")
    assert outcome.status == in_tenant.status == "skipped"
    assert "tenant 't2'" in in_tenant.reason  # a tenant's handle holds no raw client
    assert "Redis db" not in in_tenant.reason  # so its db is not guessed
    assert "no session 'elsewhere' under key prefix" in outcome.reason
    assert "COMPACTION_KEY_PREFIX" in outcome.reason
    assert any("no session 'elsewhere'" in r.getMessage() for r in caplog.records)


def test_a_session_deleted_as_its_summary_commits_leaves_no_key(
        store: SessionStore, demo_turns: list[list[Message]]) -> None:
    """A job whose session is deleted right after its commit (the agent's delete landing
    between the commit and the job's last write) left the state hash behind: clearing the
    guard's force request with HSET made a state of one field, which no delete would
    come for (no TTL by default). Found by the soak run (1 of 444 deleted sessions)."""
    feed(store, demo_turns[:12])
    store.update_state("s", force_requested=1)
    commit = store.commit_summary

    def commit_then_delete(*args: Any, **kwargs: Any) -> Any:
        result = commit(*args, **kwargs)
        store.delete_session("s")
        return result

    store.commit_summary = commit_then_delete  # type: ignore[method-assign]
    assert Compactor(store, SummaryEngine(None)).run("s").status == "compacted"
    prefix = store.config.key_prefix
    assert [k for k in store.redis.scan_iter(match=f"{prefix}:*")] == []
