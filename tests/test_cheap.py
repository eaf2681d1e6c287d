"""Cheap stages (shared.core.cheap): incremental planning equals planning from scratch.

A :class:`CheapScan` fed a conversation in random slices, deciding after each
slice with the decisions so far as the recorded ones, makes exactly the
decisions a plan from scratch of the same prefix makes, and keeps the turn
starts :func:`shared.core.turns.turn_starts` finds (damaged conversations
included: moved, duplicated and orphaned results, reused ids). On valid
conversations both equal the reference below: the planner as first written,
reading the whole view on every plan. A guard over the trigger reads only
the messages stored since its last plan.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import fakeredis
from hypothesis import given, settings
from hypothesis import strategies as st

import shared.core.cheap as cheap_module
from shared.core.cheap import CheapScan, plan_cheap_stages
from shared.core.config import CompactionPolicy, StoreConfig
from shared.core.fileops import read_scope
from shared.core.messages import Message
from shared.core.records import CheapDecision, stored_decision
from shared.core.turns import turn_starts
from shared.store.sessions import SessionStore
from tests.strategies import CharCounter, conversations, damaged_conversations
from tests.test_guard import SYSTEM, coding_turn

COUNTER = CharCounter()


def reference_plan(messages: Sequence[Message], offset: int,
                   existing: Mapping[int, CheapDecision],
                   policy: CompactionPolicy) -> list[CheapDecision]:
    """The whole view read on every plan (the planner before it was incremental)."""
    starts = turn_starts(messages)
    keep = policy.clear_keep_recent_turns
    protect = (len(messages) if keep <= 0 else 0 if len(starts) < keep else starts[-keep])
    calls: dict[str, tuple[str, Any]] = {}
    for m in messages:
        for tc in m.tool_calls:
            try:
                calls[tc.id] = (tc.name, json.loads(tc.arguments))
            except ValueError:
                calls[tc.id] = (tc.name, {})

    reads = {i: read_scope(*calls[m.tool_call_id]) for i, m in enumerate(messages)
             if m.role == "tool" and m.tool_call_id in calls}
    plan = []
    for i, m in enumerate(messages[:protect]):
        if m.role != "tool" or offset + i in existing or m.tool_call_id not in calls:
            continue
        name = calls[m.tool_call_id][0]
        tokens = COUNTER.message(m)
        read = reads[i]
        # the newest later read that holds all it held: the newest whole read, or the
        # newest same read, unless it holds far less (a failed read)
        later = i
        if read is not None:
            for kind in (read, (read[0], "")):
                j = max((j for j, r in reads.items() if j > i and r == kind), default=i)
                if j > later and 2 * COUNTER.message(messages[j]) >= tokens:
                    later = j
        stage: Literal["clear_tool_output", "dedupe_read"]
        if read is not None and later > i:
            if reads[later] == (read[0], ""):
                text = (f"[earlier read of {read[0]} omitted: the file was read again at "
                        f"message #{offset + later}, which has the current content]")
            else:
                text = (f"[earlier read of {read[0]} omitted: the same read was run again "
                        f"at message #{offset + later}, which has its current output]")
            stage, refers = "dedupe_read", offset + later
        elif tokens > policy.clear_tool_outputs_over_tokens:
            text = (f"[tool output cleared to save context: {name} returned "
                    f"{len(m.text())} characters (~{tokens} tokens). The full output is kept "
                    f"in the session log as message #{offset + i}; call {name} again with "
                    f"the same arguments if you need it.]")
            stage, refers = "clear_tool_output", None
        else:
            continue
        saved = tokens - COUNTER.message(m.model_copy(update={"content": text}))
        if saved > 0:
            plan.append(CheapDecision(index=offset + i, stage=stage, placeholder=text,
                                      saved_tokens=saved, refers_to=refers))
    return plan


def _policy(keep: int, threshold: int) -> CompactionPolicy:
    return CompactionPolicy(clear_keep_recent_turns=keep, clear_tool_outputs_over_tokens=threshold)


def _in_slices(messages: list[Message], cuts: list[int], offset: int, policy: CompactionPolicy,
               reference: bool, stored: Sequence[bool] = ()) -> None:
    """``stored``: which messages the scan reads as their stored JSON (a cold view's
    chunks not decoded yet), the rest as models."""
    items: list[Message | bytes] = [
        m.to_json().encode() if j < len(stored) and stored[j] else m
        for j, m in enumerate(messages)]
    scan = CheapScan.for_policy(offset, policy)
    existing: dict[int, CheapDecision] = {}
    for end in [*sorted(set(cuts)), len(messages)]:
        done = scan.end - offset
        scan.advance(items[done:end], None, COUNTER)
        relative = [s - offset for s in scan.starts]
        assert relative == turn_starts(messages[:end])
        made = scan.decide(messages[:end], existing, COUNTER)
        assert made == plan_cheap_stages(messages[:end], offset, existing, policy=policy,
                                         counter=COUNTER)
        if reference:
            assert made == reference_plan(messages[:end], offset, existing, policy)
        existing.update({d.index: d for d in made})


_cuts = st.lists(st.integers(0, 60), max_size=6)


@settings(max_examples=150, deadline=None)
@given(conversations(max_turns=8), _cuts, st.integers(0, 3), st.sampled_from([5, 60, 400]),
       st.integers(0, 50), st.lists(st.booleans(), max_size=60))
def test_slices_decide_as_the_reference_on_valid_conversations(
        messages: list[Message], cuts: list[int], keep: int, threshold: int,
        offset: int, stored: list[bool]) -> None:
    _in_slices(messages, [c for c in cuts if c <= len(messages)], offset,
               _policy(keep, threshold), reference=True, stored=stored)


@settings(max_examples=150, deadline=None)
@given(damaged_conversations(max_turns=8), _cuts, st.integers(0, 3),
       st.sampled_from([5, 60, 400]), st.lists(st.booleans(), max_size=60))
def test_slices_decide_as_from_scratch_on_damaged_conversations(
        messages: list[Message], cuts: list[int], keep: int, threshold: int,
        stored: list[bool]) -> None:
    _in_slices(messages, [c for c in cuts if c <= len(messages)], 0,
               _policy(keep, threshold), reference=False, stored=stored)


def test_a_guard_over_the_trigger_reads_only_what_was_stored_since(
        monkeypatch: Any, make_guard: Callable[..., Any]) -> None:
    read: list[str] = []
    real = cheap_module._read_path

    def counting(name: str, arguments: str) -> tuple[str, str] | None:
        read.append(arguments)
        return real(name, arguments)

    monkeypatch.setattr(cheap_module, "_read_path", counting)
    store = SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="c"))
    for i in range(60):
        store.append("s", coding_turn(i, 400))
    policy = CompactionPolicy(clear_tool_outputs_over_tokens=10**9)  # reads deduped only
    tokens = store.range_tokens("s", 0, store.length("s"))
    deduped = make_guard(store, overrides={"m": int(tokens / 0.9) + 500}, policy=policy
                           ).prepare("s", SYSTEM, max_tokens=500, model="m").report
    assert deduped.cheap_applied  # recorded: the guards below find them applied
    window = int(deduped.budget.total_input / 0.9) + 500  # still over the trigger
    read.clear()
    guard = make_guard(store, overrides={"m": window}, policy=policy)
    assert guard.prepare("s", SYSTEM, max_tokens=500, model="m").report.budget.should_compact
    assert len(read) == 120  # every call of the view, once
    for i in range(60, 66):
        read.clear()
        guard.record_turn("s", coding_turn(i, 400))
        view = guard.prepare("s", SYSTEM, max_tokens=500, model="m")
        assert view.report.budget.should_compact
        assert len(read) == 2, "only the new turn's two calls"
        folds = view.anthropic(shared=True), view.gemini(shared=True)  # kept across batches
    assert view.report.cheap_applied, "the new reads made earlier ones redundant"
    fresh = make_guard(store, overrides={"m": window}, policy=policy)
    again = fresh.prepare("s", SYSTEM, max_tokens=500, model="m")
    assert list(again.wire("openai")) == list(view.wire("openai")), \
        "the same view as a guard planning from scratch"
    assert (folds[0][0], list(folds[0][1])) == again.anthropic()
    assert (folds[1][0], list(folds[1][1])) == again.gemini()


@settings(max_examples=100, deadline=None)
@given(conversations(max_turns=8), st.integers(0, 3), st.sampled_from([5, 60, 400]))
def test_a_cold_view_is_planned_from_its_stored_json_without_decoding_a_chunk(
        messages: list[Message], keep: int, threshold: int) -> None:
    """The guard plans a cold view from its lazy chunks: the stored JSON read for the
    scan, each decided message decoded alone (:class:`Peeked`): the same decisions as
    from the models, and no chunk decoded for them."""
    from shared.core.chunks import Chunks, Lazy, Peeked
    from shared.core.wireview import decode_stored, raw_items

    policy = _policy(keep, threshold)
    counts = [COUNTER.message(m) for m in messages]
    history = Chunks.lazy([m.to_json().encode() for m in messages], decode_stored)
    scan = CheapScan.for_policy(0, policy)
    scan.advance(raw_items(history), counts, COUNTER)
    made = scan.decide(Peeked(history), {}, COUNTER)
    assert made == plan_cheap_stages(messages, 0, {}, policy=policy, counter=COUNTER)
    assert not any(isinstance(c, Lazy) and c.decoded for c in history.chunks)
    if messages:
        assert Peeked(history)[-1] == messages[-1] and Peeked(history)[0] == messages[0]


_READS = ("cat src/app.py", "cat -n src/app.py", "sed -n 1,40p src/app.py",
          "sed -n '1909,2000p' src/app.py", "grep GENERATING src/app.py",
          "nl -ba src/app.py | grep -C 20 alias", "head -n 5 src/app.py", "wc -l src/app.py",
          "cd src && sed -n 1,40p app.py", "cat src/other.py", "grep -n x src/other.py",
          "sed -i s/a/b/ src/app.py", "python src/app.py")


def _shell_turn(i: int, command: str, output: str) -> list[Message]:
    arguments = json.dumps({"command": command})
    return [Message(role="user", content=f"step {i}"),
            Message(role="assistant", content="", tool_calls=[
                {"id": f"c{i}", "name": "bash", "arguments": arguments}]),
            Message(role="tool", tool_call_id=f"c{i}", content=output)]


def _outputs(commands: list[str]) -> list[Message]:
    """A turn per command; every output differs and is long enough to be worth a pointer."""
    return [m for i, c in enumerate(commands)
            for m in _shell_turn(i, c, f"output {i} of {c}\n" + "line of code\n" * (40 + i))]


def _pointer_targets(plan: Sequence[CheapDecision], commands: list[str]) -> list[tuple[str, str]]:
    return [(commands[d.index // 3], commands[(d.refers_to or 0) // 3])
            for d in plan if d.stage == "dedupe_read"]


def test_a_read_is_never_replaced_by_a_pointer_to_a_partial_read_of_another_kind() -> None:
    """Session 0012 of the real transcripts: whole reads, ranges and greps of one file, then
    an empty grep of it; every earlier read pointed at the empty grep."""
    commands = ["cat src/app.py", "sed -n '1909,2000p' src/app.py",
                "nl -ba src/app.py | grep -C 20 alias", "sed -n 1,40p src/app.py",
                "head -n 5 src/app.py", "wc -l src/app.py", "grep GENERATING src/app.py",
                "echo a", "echo b"]
    plan = plan_cheap_stages(_outputs(commands), 0, {}, policy=_policy(2, 10**9),
                             counter=COUNTER)
    assert _pointer_targets(plan, commands) == []


def test_a_read_points_at_a_later_whole_read_or_at_the_same_read_again() -> None:
    commands = ["sed -n 1,40p src/app.py", "grep GENERATING src/app.py", "cat src/app.py",
                "sed -n '1909,2000p' src/app.py", "grep -n x src/other.py",
                "cd src && sed -n 1909,2000p ./app.py", "grep -n x src/other.py",
                "cat -n src/app.py", "echo a", "echo b"]
    plan = plan_cheap_stages(_outputs(commands), 0, {}, policy=_policy(2, 10**9),
                             counter=COUNTER)
    assert _pointer_targets(plan, commands) == [
        ("sed -n 1,40p src/app.py", "cat -n src/app.py"),
        ("grep GENERATING src/app.py", "cat -n src/app.py"),
        ("cat src/app.py", "cat -n src/app.py"),
        ("sed -n '1909,2000p' src/app.py", "cat -n src/app.py"),
        ("grep -n x src/other.py", "grep -n x src/other.py"),
        ("cd src && sed -n 1909,2000p ./app.py", "cat -n src/app.py")]
    by_index = {d.index: d.placeholder for d in plan}
    assert "the file was read again at message #23" in by_index[2]
    assert by_index[14] == ("[earlier read of src/other.py omitted: the same read was run "
                            "again at message #20, which has its current output]")


def test_a_failed_read_again_stands_for_nothing() -> None:
    """A whole read of a file, then the same file read again and failing ("No such file",
    "permission denied"): the first read kept its content, not a pointer to the failure."""
    commands = ["cat src/app.py", "cat src/app.py", "echo a", "echo b"]
    messages = _outputs(commands)
    messages[5] = messages[5].model_copy(
        update={"content": "cat: src/app.py: No such file or directory"})
    plan = plan_cheap_stages(messages, 0, {}, policy=_policy(2, 10**9), counter=COUNTER)
    assert _pointer_targets(plan, commands) == []
    messages += _outputs(["cat src/app.py", "echo c", "echo d"])  # read whole again
    plan = plan_cheap_stages(messages, 0, {}, policy=_policy(2, 10**9), counter=COUNTER)
    assert ("cat src/app.py", "cat src/app.py") in _pointer_targets(
        plan, [*commands, "cat src/app.py", "echo c", "echo d"])


@st.composite
def _read_sessions(draw: st.DrawFn) -> list[Message]:
    """Turns of whole and partial reads of two files, edits and runs among them."""
    return _outputs(draw(st.lists(st.sampled_from(_READS), max_size=24)))


@settings(max_examples=150, deadline=None)
@given(_read_sessions(), _cuts, st.integers(0, 3), st.sampled_from([5, 60, 400]))
def test_slices_decide_as_the_reference_on_whole_and_partial_reads(
        messages: list[Message], cuts: list[int], keep: int, threshold: int) -> None:
    _in_slices(messages, [c for c in cuts if c <= len(messages)], 0,
               _policy(keep, threshold), reference=True)
    calls = {c.id: c for m in messages for c in m.tool_calls}
    for d in plan_cheap_stages(messages, 0, {}, policy=_policy(keep, threshold)):
        if d.stage == "dedupe_read":
            earlier, later = (json.loads(calls[messages[j].tool_call_id or ""].arguments)
                              for j in (d.index, d.refers_to or 0))
            assert later["command"].startswith("cat ") or later == earlier \
                or later["command"].replace("cd src && ", "").replace(" app.py", " src/app.py") \
                == earlier["command"].replace("cd src && ", "").replace(" app.py", " src/app.py")


def _reads_then_an_empty_grep(store: SessionStore) -> str:
    """Session "s": a file read whole twice, a range of it, an empty grep of it, then six
    turns of other work (message #2, #5, #8, #11 the reads' results). Returns the file."""
    code = "\n".join(f"    def method_{n}(self): return {n}" for n in range(120))
    commands = ["cat src/app.py", "cat src/app.py", "sed -n '1909,2000p' src/app.py",
                "grep GENERATING src/app.py"] + [f"echo {n}" for n in range(6)]
    outputs = [code, code, code[:2000], "<returncode>1</returncode><output></output>"]
    for i, command in enumerate(commands):
        store.append("s", [m.model_dump(exclude_none=True) for m in _shell_turn(
            i, command, outputs[i] if i < len(outputs) else "ok")])
    return code


def test_the_guard_keeps_a_range_read_when_a_later_grep_finds_nothing(
        make_guard: Callable[..., Any]) -> None:
    """Through the real guard (fakeredis): the view sent keeps an old range read of a file
    whose later read is an empty grep, and still points an old whole read at a newer one."""
    store = SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="c"))
    code = _reads_then_an_empty_grep(store)
    policy = CompactionPolicy(clear_keep_recent_turns=2, clear_tool_outputs_over_tokens=10**9)
    tokens = store.range_tokens("s", 0, store.length("s"))
    guard = make_guard(store, overrides={"m": int(tokens / 0.9) + 500}, policy=policy)
    view = guard.prepare("s", SYSTEM, max_tokens=500, model="m")
    assert view.report.cheap_applied
    results = [m.text() for m in view.messages if m.role == "tool"]
    assert results[0].startswith("[earlier read of src/app.py omitted: the file was read "
                                 "again at message #5,")
    assert results[1] == code
    assert results[2] == code[:2000], "the range read must stay: no later read holds it"


def test_pointers_stored_by_the_old_rule_are_not_applied_and_give_way(
        make_guard: Callable[..., Any]) -> None:
    """Decisions stored before reads were checked for holding what they replace (no
    ``rule``: 1) pointed whole and range reads at an empty grep. A guard of today shows
    such a read whole; where today's rule decides the same message otherwise, its decision
    replaces the stored one (so every reader, workers included, agrees); a clearing of
    rule 1 stays (that rule did not change)."""
    client = fakeredis.FakeRedis()
    store = SessionStore(client, StoreConfig(key_prefix="c"))
    code = _reads_then_an_empty_grep(store)
    key = store.keys("s").cheap
    old = {2: 11, 8: 11}  # the first whole read and the range read, both at the empty grep
    for index, later in old.items():
        client.hset(key, str(index), json.dumps({
            "index": index, "stage": "dedupe_read", "saved_tokens": 100,
            "refers_to": later, "placeholder": f"[earlier read of src/app.py omitted: the "
                                               f"file was read again at message #{later}]"}))
    cleared = CheapDecision(index=14, stage="clear_tool_output", placeholder="[cleared]",
                            saved_tokens=1).model_dump_json(exclude={"rule"})
    client.hset(key, "14", cleared)  # rule 1 as well, by omission
    assert not store.load_view("s").cheap.keys() & old.keys()  # workers apply neither
    assert 14 in store.load_view("s").cheap
    policy = CompactionPolicy(clear_keep_recent_turns=2, clear_tool_outputs_over_tokens=10**9)
    tokens = store.range_tokens("s", 0, store.length("s"))
    guard = make_guard(store, overrides={"m": int(tokens / 0.9) + 500}, policy=policy)
    view = guard.prepare("s", SYSTEM, max_tokens=500, model="m")
    results = [m.text() for m in view.messages if m.role == "tool"]
    assert results[0].startswith("[earlier read of src/app.py omitted: the file was read "
                                 "again at message #5,")  # today's decision, not the grep
    assert results[2] == code[:2000], "the range read is shown whole"
    assert results[4] == "[cleared]"
    stored = {int(i): stored_decision(v) for i, v in client.hgetall(key).items()}
    assert stored[2].rule == 2 and stored[2].refers_to == 5
    assert stored[8].rule == 1 and not stored[8].current  # nothing replaced it; not applied
    assert stored[14].rule == 1 and stored[14].current
    fresh = make_guard(store, overrides={"m": int(tokens / 0.9) + 500}, policy=policy)
    again = fresh.prepare("s", SYSTEM, max_tokens=500, model="m")
    assert [m.text() for m in again.messages if m.role == "tool"] == results
