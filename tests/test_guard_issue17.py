"""Regressions of issue 17: cheap decisions past an edit, repeated provider ids, usage."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from shared.core.config import CompactionPolicy
from shared.core.messages import Message
from shared.core.records import SummaryRecord
from shared.core.repair import validate_view
from shared.core.view import pairs_intact
from shared.store.sessions import SessionStore
from tests.test_guard import SYSTEM, coding_turn


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
    """Like with like: the report is held to the calibrated heuristic of the request
    that was sent (a provider that counts a dense script as few tokens has taught the
    calibration so), not to the estimate anchored on the previous report."""
    from shared.core.records import SessionState
    from shared.core.usage_learning import Sent, usage_fields

    state = SessionState(version=3, calibration_ratio=0.5, calibration_samples=4)
    sent = Sent(heuristic=12_000, estimate=5_400, end=40, window=128_000, version=3,
                state=state)
    fields = usage_fields(5_500, sent)
    assert "recover_next" not in fields and fields["anchor_version"] == 3
    assert usage_fields(1_000, sent)["recover_next"] == 1  # a fifth of what was sent: truncated
    assert usage_fields(200_000, sent)["recover_next"] == 1  # more than the window


def test_a_provider_that_keeps_under_reporting_cannot_vouch_for_itself(guard: Any) -> None:
    """Every report says 900 tokens while the requests grow past the window: the anchored
    estimate would believe it turn after turn; the calibrated heuristic does not."""
    for i in range(12):
        pending = coding_turn(i, 1500)
        guard.prepare("s", SYSTEM, max_tokens=500, model="gpt-4o", pending=pending[:1])
        guard.record_turn("s", pending, usage={"prompt_tokens": 900})
    assert guard.store.state("s").silent_truncation_flags > 0
