"""Cheap stages on hosted tool parts: an old assistant message's bulky hosted result (code
interpreter logs, web search results the adapters send back with it, counted as its
``extra_tokens``) is cleared like a bulky tool result, not paid for on every call until a
summary lands. Messages are made by the real Agents SDK item mapping (no SDK needed)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fakeredis
import pytest

from shared.core.cheap import plan_cheap_stages, without_notes
from shared.core.config import CompactionPolicy, StoreConfig
from shared.core.messages import Message
from shared.core.records import CheapDecision, stored_decision
from shared.core.tokens import DEFAULT_COUNTER, EXTRA_TOKENS, extra_tokens
from shared.core.view import apply_cheap
from shared.integrations.agents_items import items_to_messages, messages_to_items
from shared.integrations.notes import provider_note
from shared.store.sessions import SessionStore
from tests.test_guard import SYSTEM

ROOT = Path(__file__).resolve().parents[1]
LOGS = "row,value\n" + "".join(f"{n},{n * n}\n" for n in range(3000))


def hosted_turn() -> list[dict[str, Any]]:
    """A user request answered by the provider's code interpreter (~20k tokens of logs)."""
    return [
        {"role": "user", "content": "Compute the squares table."},
        {"type": "reasoning", "id": "rs_1", "summary": [
            {"type": "summary_text", "text": "I will run code."}]},
        {"type": "code_interpreter_call", "id": "ci_1", "status": "completed",
         "code": "print(table)", "container_id": "cntr_1",
         "outputs": [{"type": "logs", "logs": LOGS}]},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "Done: 3000 rows.", "annotations": []}]},
    ]


def chat_turn(i: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"question {i}"},
            {"role": "assistant", "content": f"answer {i}"}]


def conversation(turns: int = 4) -> list[Message]:
    items = hosted_turn()
    for i in range(turns):
        items += chat_turn(i)
    return items_to_messages(items)


def test_an_old_bulky_hosted_result_is_cleared_and_not_sent() -> None:
    messages = conversation()
    hosted = messages[1]
    assert extra_tokens(hosted) > 9_000 and "code_interpreter_call" in (hosted.reasoning or "")
    plan = plan_cheap_stages(messages, 0, {}, policy=CompactionPolicy())
    assert [d.index for d in plan] == [1]
    decision = plan[0]
    assert decision.stage == "clear_tool_output" and decision.placeholder == hosted.content
    view = apply_cheap(messages, 0, {1: decision})
    cleared = view[1]
    assert cleared.content == "Done: 3000 rows."  # the answer stays
    assert EXTRA_TOKENS not in cleared.metadata and extra_tokens(cleared) == 0
    assert cleared.reasoning is not None
    assert cleared.reasoning.startswith("I will run code.\n\n[hosted tool output cleared")
    assert "code_interpreter_call" in cleared.reasoning and "message #1" in cleared.reasoning
    assert "0,0" not in cleared.reasoning
    saved = DEFAULT_COUNTER.message(hosted) - DEFAULT_COUNTER.message(cleared)
    assert decision.saved_tokens == saved > 9_000
    # what the Agents SDK adapter sends: the call item (and its turn's reasoning) gone
    sent = [i.get("type", i.get("role")) for i in messages_to_items(view)]
    before = [i.get("type", i.get("role")) for i in messages_to_items(messages)]
    assert "code_interpreter_call" in before and "code_interpreter_call" not in sent
    assert sent.count("message") == before.count("message")  # the answer still goes
    # deterministic: planned again, the same bytes
    assert plan_cheap_stages(messages, 0, {}) == plan


def test_a_recent_or_small_hosted_result_is_kept() -> None:
    messages = conversation(turns=2)  # within the 3 protected turns
    assert plan_cheap_stages(messages, 0, {}) == []
    small = conversation()
    small[1] = small[1].model_copy(update={"metadata": {**small[1].metadata,
                                                        EXTRA_TOKENS: 300}})
    assert plan_cheap_stages(small, 0, {}) == []


def test_a_hosted_decision_is_stored_so_an_older_reader_keeps_the_message_whole() -> None:
    """Stored: ``placeholder`` is the content and ``saved_tokens`` leaves the hosted saving
    out (``hosted_tokens``): a version without this field replaces the content only, so it
    shows and counts the message as it was. This version reads the full saving back."""
    messages = conversation()
    decision = plan_cheap_stages(messages, 0, {})[0]
    raw = decision.model_dump_json()
    stored = json.loads(raw)
    assert stored["saved_tokens"] == 0 and stored["hosted_tokens"] == decision.saved_tokens
    assert stored["placeholder"] == messages[1].content
    assert stored_decision(raw) == decision
    plain = CheapDecision(index=3, stage="clear_tool_output", placeholder="[cleared]",
                          saved_tokens=7)
    assert json.loads(plain.model_dump_json())["saved_tokens"] == 7
    assert stored_decision(plain.model_dump_json()) == plain


OLD = "02f23f1"  # the build tests/test_upgrade_compat.py runs beside this one


def test_yesterdays_build_applies_a_stored_hosted_decision_as_nothing(tmp_path: Path) -> None:
    """The REAL old code (its shared/ from git) reads the stored decision: no error, the
    message shown as recorded, nothing counted as saved."""
    # .ci/run tests a copy of the tracked files (no .git): it names the checkout
    repo = Path(os.environ.get("UPGRADE_CHECK_REPO", ROOT))
    if subprocess.run(["git", "-C", str(repo), "cat-file", "-e", f"{OLD}^{{commit}}"],
                      capture_output=True).returncode:
        pytest.fail(f"commit {OLD} is not in the history of {repo}: clone with history, "
                    "or name a clone that has it in UPGRADE_CHECK_REPO", pytrace=False)
    archive = subprocess.run(["git", "-C", str(repo), "archive", OLD, "shared"],
                             capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(tmp_path, filter="data")
    messages = conversation()
    decision = plan_cheap_stages(messages, 0, {})[0]
    script = """
import json, sys
from shared.core.messages import Message
from shared.core.records import current_decisions
from shared.core.view import apply_cheap, cheap_savings
data = json.load(sys.stdin)
messages = [Message.model_validate(m) for m in data["messages"]]
decisions = current_decisions({1: data["decision"]})
view = apply_cheap(messages, 0, decisions)
print(json.dumps({"same": view == messages, "saved": cheap_savings(decisions, 0, 99)}))
"""
    payload = json.dumps({"messages": [m.model_dump(mode="json") for m in messages],
                          "decision": decision.model_dump_json()})
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", script], input=payload, env=env, cwd=tmp_path,
                         capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == {"same": True, "saved": 0}


def test_the_guard_clears_an_old_hosted_result_in_the_view_it_sends(
        make_guard: Callable[..., Any]) -> None:
    """Through the real guard (fakeredis): over the trigger, the view's old hosted message
    loses its notes and figure, the view's count drops with them, and the decision is
    recorded (a fresh guard applies the same)."""
    store = SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="h"))
    messages = conversation()
    store.append("s", [m.model_dump(exclude_none=True) for m in messages])
    tokens = store.range_tokens("s", 0, store.length("s"))
    policy = CompactionPolicy()
    guard = make_guard(store, overrides={"m": int(tokens / 0.9) + 500}, policy=policy)
    view = guard.prepare("s", SYSTEM, max_tokens=500, model="m")
    assert view.report.cheap_applied
    hosted = next(m for m in view.messages if m.text() == "Done: 3000 rows.")
    assert EXTRA_TOKENS not in hosted.metadata
    assert (hosted.reasoning or "").startswith("I will run code.\n\n[hosted tool output")
    assert view.report.budget.history < tokens - 9_000
    assert set(store.load_view("s").cheap) == {1}
    fresh = make_guard(store, overrides={"m": int(tokens / 0.9) + 500}, policy=policy)
    again = fresh.prepare("s", SYSTEM, max_tokens=500, model="m")
    assert [m.model_dump() for m in again.messages] == [m.model_dump() for m in view.messages]


def test_without_notes_takes_out_each_adapters_note_form() -> None:
    note = provider_note("web_search_call", {"action": {"query": "x"}})
    reasoning = "\n".join(["thinking A", "", note, "", "[web_search result: line 1",
                           "line 2]", "[provider compaction (opaque)]", "[Step 1 is done",
                           "thinking B"])
    text, kinds = without_notes(reasoning)
    assert kinds == ["web_search_call", "web_search result", "provider compaction"]
    assert text == "thinking A\n\n[Step 1 is done\nthinking B"
    assert without_notes("just thinking") == ("just thinking", [])
