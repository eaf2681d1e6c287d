"""The synchronous guard: view, budget, truncation, coalesced enqueue, recovery."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

import fakeredis
import httpx
import openai
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.core.config import CompactionPolicy, StoreConfig
from shared.core.errors import IrreducibleOverflow, StoreUnavailable
from shared.core.messages import Message
from shared.core.records import AppendResult, CheapDecision, SummaryRecord
from shared.core.repair import repair_tool_pairs, validate_view
from shared.core.view import ViewCache, apply_cheap, cheap_savings, pairs_intact, scan_pairs
from shared.core.wire import to_openai
from shared.enqueue import CallbackEnqueuer
from shared.guard import ContextGuard
from shared.store.sessions import SessionStore, connect
from tests.guard_shells import SHELLS, make
from tests.redis_server import ReplyDroppingProxy
from tests.strategies import any_conversations, conversations, damaged_conversations
from workers.harness.fakes.openai_server import FakeOpenAIServer

SYSTEM = "You are a careful coding agent."


def coding_turn(i: int, output_chars: int = 4000) -> list[dict[str, Any]]:
    path = f"src/module_{i % 7}.py"
    return [
        {"role": "user", "content": f"Step {i}: look at {path} and fix the failing test."},
        {"role": "assistant", "content": "Reading the file.", "tool_calls": [
            {"id": f"call_{i}_a", "name": "read_file", "arguments": f'{{"path": "{path}"}}'},
            {"id": f"call_{i}_b", "name": "bash", "arguments": '{"command": "pytest -q"}'}]},
        {"role": "tool", "tool_call_id": f"call_{i}_a",
         "content": f"# {path}\n" + ("def f(x):\n    return x + 1\n" * (output_chars // 28))},
        {"role": "tool", "tool_call_id": f"call_{i}_b", "content": "1 failed, 41 passed"},
        {"role": "assistant", "content": f"Fixed the off-by-one in {path} (step {i})."},
    ]


class Recorder:
    def __init__(self) -> None:
        self.jobs: list[tuple[str, str]] = []

    def __call__(self, tenant: str, session_id: str) -> None:
        self.jobs.append((tenant, session_id))


@pytest.fixture
def jobs() -> Recorder:
    return Recorder()


@pytest.fixture(params=SHELLS)
def shell(request: pytest.FixtureRequest) -> str:
    """Every test that builds its guard through ``make_guard`` runs on both shells."""
    return str(request.param)


@pytest.fixture
def make_guard(shell: str) -> Callable[..., Any]:
    return functools.partial(make, shell)


@pytest.fixture
def guard(store: SessionStore, jobs: Recorder, make_guard: Callable[..., Any]) -> Any:
    return make_guard(store, CallbackEnqueuer(jobs), overrides={"small-model": 8000})


def test_empty_session_view(guard: ContextGuard) -> None:
    view = guard.prepare("s", SYSTEM, max_tokens=500, model="small-model",
                         pending=[{"role": "user", "content": "hi"}])
    assert [m.role for m in view.messages] == ["system", "user"]
    assert view.report.budget.within_budget and not view.report.truncated
    assert view.report.limits_source == "override"


def test_record_turn_burst_enqueues_once(guard: ContextGuard, jobs: Recorder) -> None:
    for i in range(100):
        guard.record_turn("s", coding_turn(i, 100))
    assert jobs.jobs == [("default", "s")]
    guard.store.clear_pending("s")  # what the worker does when it starts
    guard.record_turn("s", coding_turn(100, 100))
    assert len(jobs.jobs) == 2


def test_over_budget_truncates_records_and_enqueues(guard: ContextGuard,
                                                    jobs: Recorder) -> None:
    for i in range(12):  # recent turns alone overflow: cheap stages cannot save it
        guard.store.append("s", coding_turn(i, 12_000))
    view = guard.prepare("s", SYSTEM, max_tokens=1000, model="small-model",
                         pending=[{"role": "user", "content": "continue"}])
    report = view.report
    assert report.truncated and report.dropped_messages > 0
    assert report.budget.within_budget
    assert jobs.jobs, "a job must be enqueued to replace the truncation"
    state = guard.store.state("s")
    assert state.summary_kind == "truncation" and state.watermark == report.watermark > 0
    assert state.force_requested == 1
    for provider in ("openai", "anthropic", "gemini"):
        assert validate_view(view.messages, provider) == []
    assert "dropped" in view.messages[0].text()
    # The next call starts from the recorded truncation: no new truncation needed.
    again = guard.prepare("s", SYSTEM, max_tokens=1000, model="small-model")
    assert not again.report.truncated and again.report.watermark == report.watermark


def test_irreducible_floor_is_a_clear_error(guard: ContextGuard) -> None:
    guard.store.append("s", coding_turn(0))
    with pytest.raises(IrreducibleOverflow, match="window"):
        guard.prepare("s", SYSTEM * 2000, max_tokens=1000, model="small-model")


def test_recover_learns_limit_and_compacts_to_a_fifth(make_guard: Callable[..., Any],
        store: SessionStore,
                                                      jobs: Recorder) -> None:
    guard = make_guard(store, CallbackEnqueuer(jobs), overrides={"m": 100_000})
    for i in range(12):
        store.append("s", coding_turn(i))
    request = httpx.Request("POST", "http://x/v1/chat/completions")
    body = {"error": {"message": "This model's maximum context length is 16000 tokens. "
                      "However, your messages resulted in 17000 tokens.",
                      "type": "invalid_request_error", "param": "messages",
                      "code": "context_length_exceeded"}}
    error = openai.BadRequestError("overflow", response=httpx.Response(
        400, request=request, json=body), body=body["error"])
    view = guard.recover("s", error, SYSTEM, max_tokens=1000, model="m")
    assert view is not None and view.report.recovery and view.report.truncated
    assert view.report.budget.window == 16000
    assert view.report.estimated_prompt_tokens <= 0.2 * 16000 + 200
    assert guard.model_limits("m").context_window == 16000
    rate = openai.RateLimitError("slow down", response=httpx.Response(
        429, request=request, json={"error": {"message": "Rate limit reached",
                                              "type": "requests", "code": "rate_limit_exceeded"}}),
        body=None)
    assert guard.recover("s", rate, SYSTEM, model="m") is None


def test_call_wrapper_recovers_once_against_a_real_sdk(make_guard: Callable[..., Any],
        store: SessionStore,
                                                       jobs: Recorder) -> None:
    guard = make_guard(store, CallbackEnqueuer(jobs), overrides={"gpt-4o": 128_000},
                         policy=CompactionPolicy(proactive=False))
    for i in range(10):
        store.append("s", coding_turn(i))
    with FakeOpenAIServer(window=6000) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0, timeout=10)

        def send(view: Any) -> Any:
            return client.chat.completions.create(model="gpt-4o", messages=view.openai(),
                                                  max_tokens=500)

        response, view = guard.call("s", send, system_prompt=SYSTEM, max_tokens=500,
                                    model="gpt-4o",
                                    pending=[{"role": "user", "content": "go on"}])
        statuses = [r.status for r in server.requests]
    assert statuses == [400, 200]
    assert view.report.recovery and response.choices[0].message.content is not None
    assert guard.model_limits("gpt-4o").context_window == 6000


def test_cheap_stages_keep_the_prefix_stable(make_guard: Callable[..., Any],
        store: SessionStore, jobs: Recorder) -> None:
    """Prefix changes per 100 turns: only when a batch of decisions (or compaction) lands."""
    guard = make_guard(store, CallbackEnqueuer(jobs), overrides={"m": 60_000})
    changes = 0
    previous: list[Any] | None = None
    for i in range(100):
        user = coding_turn(i, 2000)
        view = guard.prepare("s", SYSTEM, max_tokens=1000, model="m", pending=user[:1])
        sent = view.messages[:-1]
        if previous is not None and sent[: len(previous)] != previous:
            changes += 1
        previous = sent
        guard.record_turn("s", user, usage=None)
    assert 0 < changes <= 10, f"{changes} prefix changes in 100 turns"
    assert any(d.stage == "clear_tool_output"
               for d in guard.store.load_view("s").cheap.values()) or \
        guard.store.state("s").watermark > 0


def test_stats_reports_regions(guard: ContextGuard) -> None:
    guard.prepare("s", SYSTEM, max_tokens=500, model="small-model")
    guard.record_turn("s", coding_turn(0, 200))
    stats = guard.stats("s")
    assert stats["length"] == 5 and stats["regions"]["history"] > 0
    assert stats["regions"]["system"] > 0 and 0 < stats["usage_ratio"] < 1
    assert stats["pending_job"] is True


def test_redis_down_is_typed_and_bounded_with_local_fallback(
        make_guard: Callable[..., Any]) -> None:
    cfg = StoreConfig(socket_timeout=0.2, connect_timeout=0.2)
    guard = make_guard(SessionStore(connect("redis://127.0.0.1:1/0", cfg), cfg),
                         overrides={"small-model": 8000})
    started = time.monotonic()
    with pytest.raises(StoreUnavailable):
        guard.prepare("s", SYSTEM, model="small-model")
    assert time.monotonic() - started < 2
    history = [m for i in range(12) for m in coding_turn(i)]
    view = guard.prepare("s", SYSTEM, max_tokens=1000, model="small-model",
                         fallback_messages=history)
    assert view.report.degraded and view.report.truncated
    assert view.report.budget.within_budget
    assert validate_view(view.messages, "openai") == []


def test_silent_truncation_is_flagged(guard: ContextGuard) -> None:
    for i in range(3):
        guard.store.append("s", coding_turn(i))
    view = guard.prepare("s", SYSTEM, max_tokens=500, model="small-model")
    assert view.report.estimated_prompt_tokens > 2000
    guard.record_turn("s", [{"role": "assistant", "content": "ok"}], usage={"prompt_tokens": 300})
    state = guard.store.state("s")
    assert state.silent_truncation_flags == 1 and state.recover_next == 1
    nxt = guard.prepare("s", SYSTEM, max_tokens=500, model="small-model")
    assert nxt.report.recovery


# -- record_turn: at most once, bounded, never raising after the turn is stored -------------
class LostReply(SessionStore):
    """A store whose first append is applied but answered with a timeout."""

    lose = 1

    def append_encoded(self, *args: Any, **kwargs: Any) -> AppendResult:
        result = super().append_encoded(*args, **kwargs)
        if self.lose:
            self.lose -= 1
            raise StoreUnavailable("redis unavailable during append: timed out")
        return result


def test_record_turn_retries_a_lost_append_without_duplicating(any_redis: Any,
                                                              key_prefix: str) -> None:
    recorder = Recorder()
    store = LostReply(any_redis, StoreConfig(key_prefix=key_prefix))
    guard = ContextGuard(store, CallbackEnqueuer(recorder))
    assert guard.record_turn("s", coding_turn(0, 100)) == 5
    assert store.length("s") == 5
    # The first attempt set the pending flag; the caller only learns it from the retry.
    assert recorder.jobs == [("default", "s")]
    assert guard.record_turn("s", coding_turn(1, 100), request_id="turn-1") == 10
    assert guard.record_turn("s", coding_turn(1, 100), request_id="turn-1") == 10
    assert store.length("s") == 10


def test_record_turn_through_a_proxy_that_loses_the_reply(make_guard: Callable[..., Any],
        redis_url: str,
                                                           key_prefix: str) -> None:
    upstream = redis.Redis.from_url(redis_url)
    kwargs = upstream.connection_pool.connection_kwargs
    cfg = StoreConfig(key_prefix=key_prefix, socket_timeout=0.3, connect_timeout=0.3)
    with ReplyDroppingProxy(kwargs["port"]) as proxy:
        store = SessionStore(connect(proxy.url(kwargs.get("db", 0)), cfg), cfg)
        guard = make_guard(store)
        guard.record_turn("s", coding_turn(0, 100))  # scripts loaded, connection made
        proxy.drop_next = 1  # the next reply (the append's) is lost
        started = time.monotonic()
        assert guard.record_turn("s", coding_turn(1, 100)) == 10
        assert time.monotonic() - started < 2 * (cfg.socket_timeout + cfg.connect_timeout) + 0.5
        assert proxy.dropped_bytes > 0
        assert [m.text() for m in store.messages("s") if m.role == "user"] == [
            coding_turn(0)[0]["content"], coding_turn(1)[0]["content"]]
    SessionStore(upstream, cfg).delete_session("s")


def test_record_turn_with_redis_down_is_typed_and_bounded(make_guard: Callable[..., Any]) -> None:
    cfg = StoreConfig(socket_timeout=0.2, connect_timeout=0.2)
    guard = make_guard(SessionStore(connect("redis://127.0.0.1:1/0", cfg), cfg))
    started = time.monotonic()
    with pytest.raises(StoreUnavailable):
        guard.record_turn("s", coding_turn(0, 100))
    assert time.monotonic() - started < 2 * (0.2 + 0.2) + 0.5


def test_a_failed_publish_after_the_append_unmarks_and_does_not_raise(
        make_guard: Callable[..., Any], store: SessionStore) -> None:
    def broken(tenant: str, session_id: str) -> None:
        raise ConnectionError("broker down")

    guard = make_guard(store, CallbackEnqueuer(broken))
    assert guard.record_turn("s", coding_turn(0, 100)) == 5
    assert store.length("s") == 5 and not store.is_pending("s")  # the next turn retries


# -- the view cache agrees with the store -------------------------------------------------------
OPS = st.lists(st.tuples(st.sampled_from(["turn", "turn", "turn", "commit", "commit", "truncate",
                                          "rewind", "delete", "cheap", "prepare", "prepare"]),
                         st.integers(0, 10_000)), min_size=1, max_size=20)


@pytest.mark.parametrize("shell_name", SHELLS)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS)
def test_cached_views_equal_fresh_reads(shell_name: str, ops: list[tuple[str, int]]) -> None:
    """Whatever happens to a session, the warm guard's view is the store's view."""
    store = SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="c"))
    warm = make(shell_name, store, overrides={"m": 1_000_000})
    cold = make(shell_name, store, overrides={"m": 1_000_000}, view_cache=ViewCache(0, 0))
    step = 0
    for i, (op, n) in enumerate(ops):
        length = store.length("s")
        state = store.state("s")
        if op == "turn":  # one to three turns of five messages
            for _ in range(1 + n % 3):
                warm.record_turn("s", coding_turn(step, 200))
                step += 1
        elif op == "commit" and length > state.watermark:
            boundaries = range(state.watermark + 5, length + 1, 5)  # turns are 5 messages
            w = boundaries[n % len(boundaries)] if boundaries else length
            assert store.commit_summary("s", SummaryRecord(watermark=w, kind="llm",
                                                           text=f"s{n}", tokens=3),
                                        state.version).ok
        elif op == "truncate":
            store.truncate_after("s", n % (length + 1))
        elif op == "rewind":
            kept = [0] + [r.watermark for r in store.summaries("s")]
            store.rewind("s", kept[n % len(kept)])
        elif op == "delete":
            store.delete_session("s")
        elif op == "cheap" and length > state.watermark:
            index = state.watermark + n % (length - state.watermark)
            store.record_cheap("s", [CheapDecision(index=index, stage="clear_tool_output",
                                                   placeholder=f"[cleared {n}]",
                                                   saved_tokens=1)])
        if op != "prepare" and i < len(ops) - 1:
            continue  # several changes between two reads, as between two agent calls
        cached, fresh = warm.load("s"), store.load_view("s")
        assert cached.history == fresh.history
        assert (cached.summary, dict(cached.cheap), cached.state, cached.end) == \
            (fresh.summary, fresh.cheap, fresh.state, fresh.length)
        assert cached.history_tokens == fresh.history_tokens
        w = fresh.state.watermark
        assert cached.applied == apply_cheap(fresh.history, w, fresh.cheap)
        assert cached.saved == cheap_savings(fresh.cheap, w, fresh.length)
        a = warm.prepare("s", SYSTEM, model="m", pending=[{"role": "user", "content": "go"}])
        b = cold.prepare("s", SYSTEM, model="m", pending=[{"role": "user", "content": "go"}])
        assert a.messages == b.messages
        assert a.openai() == b.openai() == to_openai(list(a.messages), include_reasoning=False)
        assert a.report.estimated_prompt_tokens == b.report.estimated_prompt_tokens


def test_view_cache_is_bounded(make_guard: Callable[..., Any]) -> None:
    store = SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="c"))
    guard = make_guard(store, view_cache=ViewCache(max_sessions=3, max_messages=12))
    for i in range(5):
        store.append(f"s{i}", coding_turn(i, 50))
        guard.prepare(f"s{i}", SYSTEM)
    assert len(guard.views) == 2  # 5 messages each, 12 at most
    store.append("big", [m for i in range(3) for m in coding_turn(i, 50)])
    guard.prepare("big", SYSTEM)
    assert guard.views.get("big") is None  # larger than the whole cache: not kept
    off = make_guard(store, view_cache=ViewCache(0, 0))
    off.prepare("s0", SYSTEM)
    assert len(off.views) == 0


# -- skipping repair is only ever a shortcut ------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(messages=any_conversations())
def test_pairs_intact_means_repair_is_the_identity(messages: list[Message]) -> None:
    if pairs_intact(messages):
        assert repair_tool_pairs(messages) == messages
    repaired = repair_tool_pairs(messages)
    assert pairs_intact(repaired), "too strict: a repaired view must count as intact"


@settings(max_examples=100, deadline=None)
@given(messages=conversations())
def test_valid_conversations_skip_repair(messages: list[Message]) -> None:
    assert pairs_intact(messages)


@settings(max_examples=200, deadline=None)
@given(messages=any_conversations(), data=st.data())
def test_the_pair_scan_resumes_where_it_stopped(messages: list[Message],
                                                data: st.DataObject) -> None:
    """A view that grew at its end is checked from the last check's state, same answer."""
    cut = data.draw(st.integers(0, len(messages)))
    assert scan_pairs(messages[cut:], scan_pairs(messages[:cut])).intact == \
        pairs_intact(messages)


@settings(max_examples=200, deadline=None)
@given(messages=damaged_conversations())
def test_damage_is_detected_or_harmless(messages: Sequence[Message]) -> None:
    assert pairs_intact(messages) == (repair_tool_pairs(messages) == list(messages))


# -- a truncation that loses its swap ---------------------------------------------------------
def test_a_truncation_that_loses_its_swap_is_rebuilt_from_the_winner(
        make_guard: Callable[..., Any], store: SessionStore, jobs: Recorder) -> None:
    guard = make_guard(store, CallbackEnqueuer(jobs), overrides={"small-model": 8000})
    for i in range(12):
        store.append("s", coding_turn(i, 12_000))
    raced: list[int] = []

    def worker_commits(snap: Any) -> Any:
        if not raced:  # a worker's summary lands between the guard's read and its swap
            record = SummaryRecord(watermark=50, kind="llm", text="worker summary", tokens=20)
            raced.append(store.commit_summary("s", record, snap.state.version).version)
        return snap

    if isinstance(guard, ContextGuard):
        real_read = guard.snapshot
        guard.snapshot = lambda sid: worker_commits(real_read(sid))  # type: ignore[method-assign]
    else:
        real_aread = guard.inner.snapshot

        async def aread(sid: str) -> Any:
            return worker_commits(await real_aread(sid))

        guard.inner.snapshot = aread
    view = guard.prepare("s", SYSTEM, max_tokens=1000, model="small-model",
                         pending=[{"role": "user", "content": "continue"}])
    assert raced == [1]
    assert view.report.version >= 1  # built from the worker's summary, not the lost read
    assert view.report.budget.within_budget
    assert "worker summary" in view.messages[0].text()
    state = store.state("s")
    assert state.watermark >= 50 and state.watermark == view.report.watermark


def test_a_view_that_needs_repair_is_still_repaired(guard: ContextGuard) -> None:
    """The log ends in a tool call whose result was never recorded: a placeholder is sent."""
    turn = coding_turn(0, 100)
    guard.store.append("s", turn[:2])  # the call, without its results
    view = guard.prepare("s", SYSTEM, max_tokens=500, model="small-model")
    for provider in ("openai", "anthropic", "gemini"):
        assert validate_view(view.messages, provider) == []
    assert [m.role for m in view.messages] == ["system", "user", "assistant", "tool", "tool"]


# -- issue 17: cheap decisions past a history edit, repeated ids, usage after a summary -------
def test_an_edit_never_leaves_a_pointer_to_a_removed_read(make_guard: Callable[..., Any],
        store: SessionStore) -> None:
    """A dedupe_read placeholder points at a later read; an edit that removes that read
    must bring the earlier copy back (it is now the only one)."""
    from shared.core.cheap import plan_cheap_stages

    for i in range(10):  # module_0 is read at turns 0 and 7
        store.append("s", coding_turn(i, 400))
    data = store.load_view("s")
    plan = plan_cheap_stages(data.history, 0, {}, policy=CompactionPolicy(
        clear_keep_recent_turns=1, clear_tool_outputs_over_tokens=10**9))
    dedupe = [d for d in plan if d.stage == "dedupe_read" and d.index == 2]
    assert dedupe and dedupe[0].refers_to == 37
    store.record_cheap("s", plan)
    store.truncate_after("s", 35)  # turn 7 (and its read of module_0) is gone
    view = make_guard(store).prepare("s", SYSTEM, max_tokens=500, model="gpt-4o")
    first_read = view.messages[1 + 2]
    assert first_read.tool_call_id == "call_0_a"
    assert first_read.text().startswith("# src/module_0.py"), first_read.text()[:120]
    assert 2 not in store.load_view("s").cheap


def gemini_turn(i: int, path: str, chars: int = 3000) -> list[Message]:
    """One turn as an agent converts it: from_gemini on this turn's contents only, so the
    adapter's positional ids (gemini-<content>-<part>) repeat every turn."""
    from shared.core.wire import from_gemini

    return from_gemini([
        {"role": "user", "parts": [{"text": f"step {i}: check {path}"}]},
        {"role": "model", "parts": [{"function_call": {"name": "read_file",
                                                       "args": {"path": path}}}]},
        {"role": "user", "parts": [{"function_response": {
            "name": "read_file",
            "response": {"content": f"# {path} v{i}\n" + "x = 1\n" * chars}}}]},
        {"role": "model", "parts": [{"text": f"done {i}"}]},
    ])


def test_repeated_provider_ids_pair_calls_and_results(make_guard: Callable[..., Any],
        store: SessionStore) -> None:
    from shared.core.cheap import plan_cheap_stages
    from shared.core.wire import to_gemini

    guard = make_guard(store)
    paths = ["a.py", "b.py", "a.py", "c.py", "b.py", "d.py", "e.py"]
    for i, path in enumerate(paths):
        turn = gemini_turn(i, path)
        assert turn[1].tool_calls[0].id == "gemini-1-0"  # the same id every turn
        guard.record_turn("s", turn)
    data = store.load_view("s")
    ids = [c.id for m in data.history for c in m.tool_calls]
    assert len(set(ids)) == len(ids) and pairs_intact(data.history)
    assert data.history[5].metadata["wire_ids"] == {ids[1]: "gemini-1-0"}
    plan = plan_cheap_stages(data.history, 0, {}, policy=CompactionPolicy(
        clear_keep_recent_turns=1, clear_tool_outputs_over_tokens=10**9))
    by_id = {c.id: c for m in data.history for c in m.tool_calls}
    assert {d.index for d in plan} == {2, 6}  # the earlier reads of a.py and b.py
    for d in plan:
        result = data.history[d.index]
        path = json.loads(by_id[result.tool_call_id or ""].arguments)["path"]
        assert f"earlier read of {path} " in d.placeholder
        later = data.history[d.refers_to or 0]
        assert f"# {path} v" in later.text()[:40]
    view = guard.prepare("s", SYSTEM, max_tokens=500, model="gemini-2.5-flash")
    assert validate_view(view.messages, "gemini") == []
    _, contents = to_gemini(view.messages)  # synthetic ids stay off the wire
    assert all("id" not in p["function_call"] for c in contents for p in c["parts"]
               if "function_call" in p)


def test_a_correct_usage_report_never_triggers_recovery(guard: Any) -> None:
    """A summary lands between prepare and the usage report; the provider reports what was
    actually sent (its tokenizer 20% denser than the heuristic): no alarm, no recovery."""
    for i in range(6):
        guard.store.append("s", coding_turn(i, 3000))
    user = {"role": "user", "content": "next"}
    for step in range(3):
        view = guard.prepare("s", SYSTEM, max_tokens=500, model="gpt-4o", pending=[user])
        state = guard.store.state("s")
        summary = SummaryRecord(watermark=guard.store.length("s") - 5, kind="llm",
                                text="the story so far " * (20 + step), tokens=120)
        assert guard.store.commit_summary("s", summary, state.version).ok
        sent = int(guard.counter.messages(list(view.messages)) * 0.8)
        guard.record_turn("s", [user, *coding_turn(10 + step, 3000)[1:]],
                          usage={"prompt_tokens": sent})
        state = guard.store.state("s")
        assert state.silent_truncation_flags == 0 and state.recover_next == 0
        assert not guard.prepare("s", SYSTEM, max_tokens=500, model="gpt-4o").report.recovery


def test_usage_is_compared_with_the_estimate_of_what_was_sent() -> None:
    """Like with like: a usage-anchored estimate far below the raw heuristic (a provider
    that counts images or a dense script as few tokens) is what the report is held to."""
    from shared.core.guard_state import Sent, usage_fields
    from shared.core.records import SessionState

    state = SessionState(version=3, calibration_ratio=0.5, calibration_samples=4)
    sent = Sent(heuristic=12_000, estimate=5_400, end=40, window=128_000, version=3,
                state=state)
    fields = usage_fields(5_500, sent)
    assert "recover_next" not in fields and fields["anchor_version"] == 3
    assert usage_fields(1_000, sent)["recover_next"] == 1  # a fifth of what was sent: truncated
    assert usage_fields(200_000, sent)["recover_next"] == 1  # more than the window
