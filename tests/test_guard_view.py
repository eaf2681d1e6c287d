"""The guard's cached views agree with the store; skipping repair is only a shortcut."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import fakeredis
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from shared.core.chunks import Chunks
from shared.core.config import StoreConfig
from shared.core.messages import ImagePart, Message, TextPart, ToolCall
from shared.core.records import CheapDecision, SummaryRecord
from shared.core.repair import repair_tool_pairs
from shared.core.tokens import DEFAULT_COUNTER
from shared.core.truncation import emergency_truncate
from shared.core.view import ViewCache, apply_cheap, cheap_savings, pairs_intact, scan_pairs
from shared.core.wire import from_anthropic, from_gemini, to_anthropic, to_gemini, to_openai
from shared.core.wireview import history_fold
from shared.store.sessions import SessionStore
from tests.guard_shells import SHELLS, make
from tests.strategies import any_conversations, conversations, damaged_conversations
from tests.test_guard import SYSTEM, coding_turn

# -- the view cache agrees with the store -------------------------------------------------------
OPS = st.lists(st.tuples(st.sampled_from(["turn", "turn", "turn", "commit", "commit", "truncate",
                                          "rewind", "delete", "cheap", "prepare", "prepare"]),
                         st.integers(0, 10_000)), min_size=1, max_size=20)


@pytest.mark.parametrize("shell_name", SHELLS)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS)
# a log edited to end on two user messages: the pending one joins the last (Gemini)
@example(ops=[("turn", 0), ("turn", 1), ("truncate", 11), ("turn", 0), ("truncate", 250)])
def test_cached_views_equal_fresh_reads(shell_name: str, ops: list[tuple[str, int]]) -> None:
    """Whatever happens to a session, the warm guard's view is the store's view."""
    check_cached_views(SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="c")),
                       shell_name, ops)


@pytest.mark.parametrize("shell_name", SHELLS)
@settings(max_examples=40, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_cached_views_equal_fresh_reads_with_the_change_feed(
        shell_name: str, ops: list[tuple[str, int]], real_redis: Any) -> None:
    """The same on a real Redis, where the warm guard skips reads the change feed
    (client tracking) says are unneeded: the writes go around the guard, to the store."""
    import secrets

    from shared.store.sessions import connect

    prefix = "t" + secrets.token_hex(5)
    url = "redis://{host}:{port}/{db}".format(**real_redis.connection_pool.connection_kwargs)
    # a connect or a read waits out a stall of the machine or of the test process (CI saw
    # "Timeout connecting to server" and "Timeout reading from" here, hundreds of tests in)
    # instead of the product's 0.5 s: this test is about cached views, not timeouts
    config = StoreConfig(key_prefix=prefix, connect_timeout=5.0, socket_timeout=5.0)
    try:
        check_cached_views(SessionStore(connect(url, config), config),
                           shell_name, ops, feed=True)
    finally:
        for key in real_redis.scan_iter(match=f"{prefix}:*", count=1000):
            real_redis.delete(key)


def check_cached_views(store: SessionStore, shell_name: str, ops: list[tuple[str, int]],
                       feed: bool = False) -> None:
    warm = make(shell_name, store, overrides={"m": 1_000_000})
    assert (warm.feed is not None) == feed
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
        cached, fresh = warm.load("s"), store.load_view("s", with_counts=True)
        assert cached.counts is not None and list(cached.counts) == fresh.history_counts
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
        # Anthropic and Gemini: the warm guard's folds, carried through every change (and
        # used: a view the fold leaves to the whole conversion would pass unseen)
        assert a.anthropic() == b.anthropic() == to_anthropic(list(a.messages))
        assert a.gemini() == b.gemini() == to_gemini(list(a.messages))
        if a._wire is not None:  # built from the cached parts (not repaired whole)
            assert a._folded("anthropic") is not None and a._folded("gemini") is not None
        for fmt in ("anthropic", "gemini"):  # the shared form: the same, not a copy
            system, shared = getattr(a, fmt)(shared=True)
            assert (system, list(shared)) == getattr(a, fmt)()
            if a._wire is not None and a._applied is not None:
                fold = history_fold(a._wire, fmt, a._applied)
                again = getattr(a, fmt)(shared=True)[1]
                if fold.ok and len(fold.done):  # the finished turns: the fold's, twice
                    assert isinstance(shared, Chunks) and isinstance(again, Chunks)
                    done, ids = fold.done.chunks, set(map(id, shared.chunks)) & set(
                        map(id, again.chunks))
                    assert set(map(id, done[:-1])) <= ids
                    # the last one's chunk is copied only where the next message joins its
                    # last content (same role: Gemini's contents alternate)
                    last = len(fold.done) - 1
                    assert id(done[-1]) in ids or list(shared)[last] != fold.done[last]
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


# -- the persistent list behind every view ----------------------------------------------------
CHUNK_OPS = st.lists(st.tuples(st.sampled_from(["extend", "drop", "replace"]),
                               st.integers(0, 1500)), max_size=25)


@settings(max_examples=150, deadline=None)
@given(ops=CHUNK_OPS)
def test_chunks_behave_like_a_list_and_never_change_under_a_holder(
        ops: list[tuple[str, int]]) -> None:
    from shared.core.chunks import Chunks, concat

    model: list[int] = []
    chunks: Chunks[int] = Chunks()
    held: list[tuple[Chunks[int], list[int]]] = []
    for op, n in ops:
        if op == "extend":
            items = list(range(len(model), len(model) + n % 700))
            model, chunks = model + items, chunks.extend(items)
        elif op == "drop":
            k = n % (len(model) + 1)
            model, chunks = model[k:], chunks.drop(k)
        elif model:
            i = n % len(model)
            model = [*model[:i], -n, *model[i + 1:]]
            chunks = chunks.replace({i: -n})
        held.append((chunks, list(model)))
        assert list(chunks) == model and len(chunks) == len(model) and chunks == model
        if model:
            i = n % len(model)
            assert chunks[i] == model[i] and chunks[-1] == model[-1]
            assert chunks[i:i + 7] == model[i:i + 7]
        joined = concat([1], chunks, [2], chunks)
        assert list(joined) == [1, *model, 2, *model]
        assert joined[len(model) + 1] == 2 and len(joined) == 2 * len(model) + 2
        for c in (chunks, joined):  # offsets carried along equal offsets measured
            assert c._offsets == list(itertools.accumulate(map(len, c.chunks), initial=0))
    for version, expected in held:  # earlier versions are untouched by later edits
        assert list(version) == expected


def test_openai_wire_from_stored_json_matches_to_openai() -> None:
    """The wire form made from stored JSON (no model) is to_openai's, message for message."""
    from shared.core.messages import Message
    from shared.core.pairs import shape, stored_shape
    from shared.core.wire.openai import to_openai
    from shared.core.wireview import convert, decode_stored

    messages = [
        Message(role="user", content="hi"),
        Message(role="user", content="   "),
        Message(role="user", content=[{"type": "text", "text": "a"},
                                      {"type": "text", "text": " "}]),
        Message(role="user", content=[{"type": "text", "text": "look"},
                                      {"type": "image", "url": "https://x/y.png"}]),
        Message(role="assistant", content="", tool_calls=[
            {"id": "c1", "name": "read", "arguments": {"path": "a"}}], reasoning="think"),
        Message(role="assistant", content="both", tool_calls=[{"id": "c2", "name": "ls"}]),
        Message(role="tool", content="out", tool_call_id="c1", name="read"),
        Message(role="system", content="dev", metadata={"openai_role": "developer"}),
        Message(role="assistant", content="no", metadata={"openai_refusal": "r", "k": 1}),
        Message(role="assistant", content="", metadata={"usage": {"x": 1}}),
    ]
    raw = [m.to_json().encode() for m in messages]
    for fmt, reasoning in (("openai", False), ("openai+reasoning", True)):
        assert convert(fmt, raw) == to_openai(messages, include_reasoning=reasoning)
    assert decode_stored(tuple(raw)) == tuple(messages)
    import json
    assert [stored_shape(json.loads(r)) for r in raw] == [shape(m) for m in messages]


def test_lazy_chunks_decode_once_and_keep_identity() -> None:
    from shared.core.chunks import CHUNK, Chunks, Lazy, concat

    calls = []

    def decode(raw: tuple[object, ...]) -> tuple[object, ...]:
        calls.append(len(raw))
        return tuple(("d", r) if isinstance(r, bytes) else r for r in raw)

    raw = [str(i).encode() for i in range(CHUNK + 10)]
    lazy: Chunks[object] = Chunks.lazy(raw, decode)
    assert not calls and len(lazy) == CHUNK + 10
    assert all(isinstance(c, Lazy) for c in lazy.chunks)
    assert lazy[CHUNK + 1] == ("d", str(CHUNK + 1).encode()) and calls == [10]
    first = lazy[CHUNK + 1]
    grown = lazy.extend_lazy([b"x", "y"], decode)
    assert grown[CHUNK + 1] is first and grown[-2:] == [("d", b"x"), "y"]
    dropped = lazy.drop(3)
    assert list(dropped) == [("d", r) for r in raw[3:]]
    replaced = dropped.replace({0: "z"})
    assert replaced[0] == "z" and replaced[1:] == dropped[1:]
    assert list(concat(["h"], lazy, ["t"])) == ["h", *[("d", r) for r in raw], "t"]


def test_items_the_caller_holds_decoded_are_kept_not_decoded_again() -> None:
    """An append the guard made extends its view with the models it holds: joined to an
    end that was read, or in a chunk of their own after an end nobody read (which stays
    stored until read), never dropped to be decoded again with that end."""
    from shared.core.chunks import Chunks, Lazy

    calls: list[int] = []

    def decode(raw: tuple[object, ...]) -> tuple[object, ...]:
        calls.append(len(raw))
        return tuple(("d", r) for r in raw)

    held = [("held", 1), ("held", 2), ("held", 3)]
    read: Chunks[object] = Chunks.lazy([b"a", b"b"], decode)
    assert read[-1] == ("d", b"b") and calls == [2]
    grown = read.extend_lazy([b"x", b"y"], decode, held[:2])
    assert grown[2] is held[0] and grown[3] is held[1] and calls == [2]
    assert grown.extend_lazy([b"z"], decode)[-1] == ("d", b"z") and calls == [2, 1]
    unread: Chunks[object] = Chunks.lazy([b"a"], decode)
    later = unread.extend_lazy([b"x"], decode, held[:1]).extend_lazy([b"y"], decode, held[1:2])
    assert later[1] is held[0] and later[2] is held[1] and calls == [2, 1]  # "a" not read
    assert [isinstance(c, Lazy) and c.decoded for c in later.chunks] == [False, True]
    assert list(later) == [("d", b"a"), *held[:2]] and calls == [2, 1, 1]
    replaced: Chunks[object] = Chunks.of(["p", "q"])  # a chunk edited in place: a tuple
    joined = replaced.extend_lazy([b"z"], decode, held[2:])
    assert list(joined) == ["p", "q", held[2]] and joined[2] is held[2] and calls == [2, 1, 1]


@pytest.mark.parametrize("shell_name", SHELLS)
@pytest.mark.parametrize("watermark", [1, 2])
def test_a_summary_leads_a_history_that_opens_with_an_interrupted_call(
        shell_name: str, watermark: int) -> None:
    """A summary cut that leaves the history opening with an assistant's call whose result
    never came (a process killed while the tool ran) leads as the user message, as it does
    for a history that needs no repair. The repair put its "the conversation opens with the
    assistant's message that follows" first instead, and the summary went into the system
    message: the model was told the conversation starts where a summary says it did not
    (found by tests/test_guard_stateful.py)."""
    from shared.core.repair import CONVERSATION_START_TEXT, validate_view

    def call(cid: str) -> dict[str, Any]:
        return {"role": "assistant", "content": "",
                "tool_calls": [{"id": cid, "name": "run", "arguments": "{}"}]}

    store = SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="c"))
    # watermark 1: the stored part is repaired once and kept (two calls, then a turn);
    # watermark 2: only the open call is stored, repaired with the pending turn
    store.append("s", [{"role": "user", "content": "build it"}, call("c1"), call("c2"),
                       *([{"role": "user", "content": "and?"},
                          {"role": "assistant", "content": "it was cut off"}]
                         if watermark == 1 else [])])
    assert store.commit_summary("s", SummaryRecord(watermark=watermark, kind="offline",
                                                   text="the user asked for a build",
                                                   tokens=6), store.state("s").version).ok
    warm = make(shell_name, store, overrides={"m": 1_000_000})
    cold = make(shell_name, store, overrides={"m": 1_000_000}, view_cache=ViewCache(0, 0))
    for guard in (warm, warm, cold):
        view = guard.prepare("s", SYSTEM, model="m", pending=[{"role": "user", "content": "go"}])
        messages = list(view.messages)
        assert [m.role for m in messages[:3]] == ["system", "user", "assistant"]
        assert messages[0].text() == SYSTEM
        assert messages[1].metadata == {"compaction": "summary"}
        assert "the user asked for a build" in messages[1].text()
        assert not any(m.text() == CONVERSATION_START_TEXT for m in messages)
        for provider in ("openai", "anthropic", "gemini"):
            assert validate_view(messages, provider) == []
        assert view.openai() == to_openai(messages, include_reasoning=False)
        assert view.anthropic() == to_anthropic(messages)
        assert view.gemini() == to_gemini(messages)


@pytest.mark.parametrize("shell_name", SHELLS)
def test_a_summary_leads_a_truncated_view_that_opens_past_an_interrupted_call(
        shell_name: str) -> None:
    """The same when an emergency cut keeps the head of a history that needed repair: the
    cut repaired it before it knew a note (a summary) would open the view, and its
    "the conversation opens with ..." message went first, the summary into the system
    message. Its tokens leave the estimate with it."""
    from shared.core.repair import CONVERSATION_START_TEXT, validate_view

    store = SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="c"))
    store.append("s", [{"role": "user", "content": "build it"},
                       {"role": "assistant", "content": "",
                        "tool_calls": [{"id": "c1", "name": "run", "arguments": "{}"}]}])
    assert store.commit_summary("s", SummaryRecord(watermark=1, kind="offline",
                                                   text="the user asked for a build",
                                                   tokens=6), store.state("s").version).ok
    guard = make(shell_name, store, overrides={"m": 6000})
    # one turn with no user message: the cut keeps its opening and clips the answer
    view = guard.prepare("s", SYSTEM, model="m", max_tokens=1000,
                         pending=[{"role": "assistant", "content": "word " * 8000}])
    messages = list(view.messages)
    assert view.report.truncated and view.report.budget.within_budget
    assert [m.role for m in messages] == ["system", "user", "assistant"]
    assert messages[0].text() == SYSTEM and messages[1].metadata == {"compaction": "summary"}
    assert "the user asked for a build" in messages[1].text()
    assert not any(m.text() == CONVERSATION_START_TEXT for m in messages)
    assert view.report.budget.history == DEFAULT_COUNTER.message(messages[2])
    for provider in ("openai", "anthropic", "gemini"):
        assert validate_view(messages, provider) == []
    assert view.openai() == to_openai(messages, include_reasoning=False)
    assert view.anthropic() == to_anthropic(messages)


@pytest.mark.parametrize("shell_name", SHELLS)
def test_a_cut_inside_a_turn_needs_no_repair_per_prepare(shell_name: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A summary cut inside a long turn leaves the history starting at an assistant
    message; the summary leads as a user message, so the view is valid as it is and the
    warm prepares of the turn do not repair the whole view again (they once did)."""
    import shared.core.guard_state as guard_state
    from shared.core.repair import validate_view

    store = SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="c"))
    turn = [{"role": "user", "content": "fix the build"}]
    for k in range(6):
        turn += [{"role": "assistant", "content": "",
                  "tool_calls": [{"id": f"c{k}", "name": "run", "arguments": "{}"}]},
                 {"role": "tool", "tool_call_id": f"c{k}", "content": f"output {k}"}]
    store.append("s", turn)
    version = store.state("s").version
    assert store.commit_summary("s", SummaryRecord(watermark=5, kind="offline", text="did 2",
                                                   tokens=4), version).ok
    guard = make(shell_name, store, overrides={"m": 1_000_000})
    repairs: list[int] = []
    real = guard_state.repair_tool_pairs
    monkeypatch.setattr(guard_state, "repair_tool_pairs",
                        lambda ms: repairs.append(len(ms)) or real(ms))
    pending: list[dict[str, Any]] = []
    for k in range(3):
        view = guard.prepare("s", SYSTEM, model="m", pending=pending)
        for provider in ("openai", "anthropic", "gemini"):
            assert validate_view(list(view.messages), provider) == []
        assert view.messages[1].role == "user" and "did 2" in str(view.messages[1].content)
        pending = [*pending,
                   {"role": "assistant", "content": "",
                    "tool_calls": [{"id": f"p{k}", "name": "run", "arguments": "{}"}]},
                   {"role": "tool", "tool_call_id": f"p{k}", "content": "ok"}]
    assert repairs == []


@pytest.mark.parametrize("shell_name", SHELLS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stored=conversations(min_turns=1, max_turns=3, system=False),
       turn=any_conversations(min_turns=1, max_turns=2, system=False))
def test_a_turn_prepared_call_by_call_equals_a_fresh_prepare(
        shell_name: str, stored: list[Message], turn: list[Message]) -> None:
    """A tool chain's calls re-use the last call's validation, counts, wire forms and pair
    scan; each call's view is still the one a guard seeing the turn for the first time
    builds (ids shared with the stored log, damaged turns and repairs included)."""
    store = SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="c"))
    store.append("s", stored)
    warm = make(shell_name, store, overrides={"m": 1_000_000})
    pending = [m.model_dump(exclude_none=True) for m in turn[1:]]
    cold = make(shell_name, store, overrides={"m": 1_000_000}, view_cache=ViewCache(0, 0))
    for end in range(len(pending) + 1):  # one call per message, as a tool chain makes
        given = pending[:end]
        a = warm.prepare("s", SYSTEM, model="m", pending=given)
        b = cold.prepare("s", SYSTEM, model="m", pending=given)
        assert list(a.messages) == list(b.messages)
        assert a.openai() == b.openai()


# -- a turn's truncation resumes where its last call left it ---------------------------------
@settings(max_examples=300, deadline=None)
@given(messages=any_conversations(), data=st.data())
def test_units_dropped_by_bisection_cut_as_the_walk_over_them(messages: list[Message],
                                                              data: st.DataObject) -> None:
    """A cut finds how many units to drop by bisecting prefix sums; walking the units one
    by one, as it did, drops the same ones."""
    import shared.core.truncation as truncation
    from tests.strategies import CharCounter

    count = CharCounter()
    source = truncation.TruncationInput.build(messages, count)
    for budget in data.draw(st.lists(st.integers(0, 3000), min_size=1, max_size=4)):
        fraction = data.draw(st.sampled_from([0.25, 0.5, 1.0]))
        bisected = source.cut(budget, count, drop_fraction=fraction)
        truncation._FAST_DROP = False
        try:
            walked = truncation.TruncationInput.build(messages, count).cut(
                budget, count, drop_fraction=fraction)
        finally:
            truncation._FAST_DROP = True
        assert bisected == walked


@settings(max_examples=300, deadline=None)
@given(messages=any_conversations(), data=st.data())
def test_an_extended_truncation_input_cuts_as_a_fresh_one(messages: list[Message],
                                                         data: st.DataObject) -> None:
    """The truncation input of a turn's calls is built once and extended by each call's
    new messages (or rebuilt when it cannot be); every cut equals a fresh truncation."""
    from shared.core.truncation import TruncationInput, emergency_truncate
    from tests.strategies import CharCounter

    count = CharCounter()
    cuts = sorted(data.draw(st.lists(st.integers(0, len(messages)), max_size=6)))
    source = TruncationInput.build(messages[:cuts[0]] if cuts else messages, count)
    for end in [*cuts[1:], len(messages)]:
        new = messages[len(source.messages):end]
        grown = source.extend(new, [count.message(m) for m in new])
        source = grown if grown is not None else TruncationInput.build(messages[:end], count)
        assert source.messages == messages[:end]
        for budget in data.draw(st.lists(st.integers(0, 3000), min_size=1, max_size=3)):
            fraction = data.draw(st.sampled_from([0.25, 0.5, 1.0]))
            assert source.cut(budget, count, drop_fraction=fraction) == \
                emergency_truncate(messages[:end], budget, count, drop_fraction=fraction)


def _same_input(a: Any, b: Any) -> bool:
    """Two truncation inputs hold the same (their pair scans compared by what they say)."""
    import dataclasses

    ids = {c.id for m in b.messages for c in m.tool_calls} | {
        m.tool_call_id for m in b.messages if m.tool_call_id}
    fields = [f.name for f in dataclasses.fields(a) if f.name != "scan"]
    return (all(getattr(a, f) == getattr(b, f) for f in fields)
            and (a.scan.ok, a.scan.begun, a.scan.position, a.scan.open_calls)
            == (b.scan.ok, b.scan.begun, b.scan.position, b.scan.open_calls)
            and all(a.scan.taken(i) == b.scan.taken(i) for i in ids))


@settings(max_examples=300, deadline=None)
@given(messages=any_conversations(system=False), data=st.data())
def test_a_truncation_input_without_its_first_messages_is_a_fresh_one(
        messages: list[Message], data: st.DataObject) -> None:
    """A watermark moved past the first messages: the input drops them (or declines, and
    the rest is built); either way it equals a fresh input over the rest and cuts as one."""
    from shared.core.truncation import TruncationInput, emergency_truncate
    from tests.strategies import CharCounter

    count = CharCounter()
    source = TruncationInput.build(messages, count)
    gone = data.draw(st.integers(0, len(messages)))
    dropped = source.drop(gone)
    if dropped is None:
        return
    assert _same_input(dropped, TruncationInput.build(messages[gone:], count))
    budget = data.draw(st.integers(0, 3000))
    assert dropped.cut(budget, count) == emergency_truncate(messages[gone:], budget, count)


def test_a_watermark_at_a_turn_start_drops_without_a_rebuild() -> None:
    from shared.core.truncation import TruncationInput

    turns = [[Message(role="user", content=f"step {k}"),
              Message(role="assistant", content="", tool_calls=[
                  {"id": f"c{k}", "name": "run", "arguments": "{}"}]),
              Message(role="tool", tool_call_id=f"c{k}", content="x" * 400),
              Message(role="assistant", content="ok")] for k in range(4)]
    messages = [m for t in turns for m in t]
    source = TruncationInput.build(messages, DEFAULT_COUNTER)
    dropped = source.drop(8)
    assert dropped is not None
    assert _same_input(dropped, TruncationInput.build(messages[8:], DEFAULT_COUNTER))
    assert source.drop(2) is None  # between a call and its result


def test_a_valid_turn_extends_its_truncation_input() -> None:
    """The resume is taken (not rebuilt) for a valid turn that grows call by call."""
    from shared.core.truncation import TruncationInput

    history = [Message(role="user", content="go")]
    source = TruncationInput.build(history, DEFAULT_COUNTER)
    for k in range(5):
        new = [Message(role="assistant", content="", tool_calls=[
                   {"id": f"c{k}", "name": "run", "arguments": "{}"}]),
               Message(role="tool", tool_call_id=f"c{k}", content="x" * 400)]
        grown = source.extend(new, [DEFAULT_COUNTER.message(m) for m in new])
        assert grown is not None
        source = grown
    assert source.cut(300) == emergency_truncate(source.messages, 300)


@pytest.mark.parametrize("shell_name", SHELLS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stored=conversations(min_turns=1, max_turns=4, system=False),
       turn=conversations(min_turns=1, max_turns=1, max_steps=8, system=False),
       window=st.integers(300, 3000))
def test_a_truncating_turn_prepared_call_by_call_equals_a_fresh_prepare(
        shell_name: str, stored: list[Message], turn: list[Message], window: int) -> None:
    """A turn that overflows the window truncates on its calls; each call resumes the
    last call's truncation input, and its view, report and wire form are still those a
    guard seeing the session for the first time builds (on a twin store, since a
    truncation commits a summary)."""
    stores = [SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="c")) for _ in "ab"]
    for store in stores:
        store.append("s", stored)
    warm = make(shell_name, stores[0], overrides={"m": window})
    pending = [m.model_dump(exclude_none=True) for m in turn]
    truncated = 0
    for end in range(1, len(pending) + 1):  # one call per message, as a tool chain makes
        cold = make(shell_name, stores[1], overrides={"m": window}, view_cache=ViewCache(0, 0))
        given = pending[:end]
        views: list[Any] = []
        for guard in (warm, cold):
            try:
                views.append(guard.prepare("s", SYSTEM, model="m", max_tokens=50,
                                           pending=given))
            except Exception as exc:  # both refuse alike (e.g. nothing left to drop)
                views.append(type(exc))
        a, b = views
        if isinstance(a, type) or isinstance(b, type):
            assert a == b
            continue
        assert list(a.messages) == list(b.messages)
        assert a.openai() == b.openai()
        assert a.report.model_dump(exclude={"elapsed_ms"}) == \
            b.report.model_dump(exclude={"elapsed_ms"})
        truncated += a.report.truncated
        assert stores[0].state("s") == stores[1].state("s")


def test_a_tool_result_holding_an_image_keeps_the_session_usable(
        make_guard: Callable[..., Any], store: SessionStore) -> None:
    """A screenshot returned by a tool (Anthropic's tool_result image, an Agents SDK
    input_image output): recorded, then prepared by this guard and a new one. The
    Anthropic view sends the image; the OpenAI view, which every cached view keeps and
    whose chat format has no place for it, says what it leaves out."""
    shot = ImagePart(data="iVBORw0KGgo=", media_type="image/png")
    turn = [Message(role="user", content="take a screenshot"),
            Message(role="assistant", content="", tool_calls=[ToolCall(id="t1", name="shot")]),
            Message(role="tool", tool_call_id="t1", content=[TextPart(text="screen:"), shot]),
            Message(role="assistant", content="I see the screen.")]
    guard = make_guard(store)
    guard.prepare("s", "SYS", model="claude-sonnet-4-5", pending=turn[:1])
    assert guard.record_turn("s", turn) == 4
    for g in (guard, make_guard(store)):
        view = g.prepare("s", "SYS", model="claude-sonnet-4-5",
                         pending=[Message(role="user", content="next")])
        _, messages = view.anthropic()
        result = messages[2]["content"][0]
        assert result["type"] == "tool_result" and result["content"][1]["type"] == "image"
        tool = view.openai()[3]
        assert tool["role"] == "tool" and "image/png image not sent" in tool["content"][1]["text"]


def test_what_only_anthropic_and_gemini_read_survives_a_recorded_turn(
        make_guard: Callable[..., Any], store: SessionStore) -> None:
    """A Gemini 3 call's thought signature (refused without it), its made-up id (never
    sent), an Anthropic tool result's is_error: stored with the turn, and in the views
    this guard and a new one make of it, however those views are built."""
    gemini = from_gemini([
        {"role": "user", "parts": [{"text": "q"}]},
        {"role": "model", "parts": [{"function_call": {"name": "f", "args": {}},
                                     "thought_signature": "SIGCALL"}]},
        {"role": "user", "parts": [{"function_response": {"name": "f",
                                                          "response": {"r": 1}}}]},
        {"role": "model", "parts": [{"text": "ok"}]}])
    anthropic = from_anthropic([
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_9", "name": "f",
                                           "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9",
                                      "content": "err", "is_error": True}]},
        {"role": "assistant", "content": "failed"}])
    guard = make_guard(store)
    guard.record_turn("g", gemini)
    guard.record_turn("a", anthropic)
    nxt = [Message(role="user", content="next")]
    for g in (guard, make_guard(store)):
        _, contents = g.prepare("g", "SYS", model="gemini-3-pro-preview", pending=nxt).gemini()
        assert contents[1]["parts"][0] == {"function_call": {"name": "f", "args": {}},
                                           "thought_signature": "SIGCALL"}
        _, messages = g.prepare("a", "SYS", model="claude-sonnet-4-5", pending=nxt).anthropic()
        assert messages[2]["content"][0]["is_error"] is True


def test_a_stored_turn_of_tool_calls_alone_goes_to_openai_without_content(
        make_guard: Callable[..., Any], store: SessionStore) -> None:
    turn = from_anthropic([
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f",
                                           "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                      "content": "r"}]},
        {"role": "assistant", "content": "done"}])
    make_guard(store).record_turn("s", turn)
    view = make_guard(store).prepare("s", "SYS", pending=[Message(role="user", content="n")])
    assert view.openai()[2]["content"] is None and view.openai()[2]["tool_calls"]


def test_the_results_standing_in_for_interrupted_gemini_calls_carry_no_made_up_id(
        make_guard: Callable[..., Any], store: SessionStore) -> None:
    """Gemini sent the calls without ids (the guard made some up, never sent); the
    placeholder results of the calls that were interrupted go without ids too."""
    guard = make_guard(store)
    guard.record_turn("s", from_gemini([
        {"role": "user", "parts": [{"text": "q1"}]},
        {"role": "model", "parts": [{"functionCall": {"name": "w", "args": {"c": "paris"}}},
                                    {"functionCall": {"name": "w", "args": {"c": "rome"}}}]}]))
    _, contents = guard.prepare("s", "sys").gemini()
    responses = [p["function_response"] for p in contents[2]["parts"]]
    assert len(responses) == 2 and all("id" not in r for r in responses)
    assert all("id" not in p["function_call"] for p in contents[1]["parts"])


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("provider", ["openai", "anthropic", "gemini"])
@pytest.mark.parametrize("lead", [False, True])
def test_a_summary_is_estimated_as_the_head_it_makes(shell: str, provider: str,
                                                     lead: bool) -> None:
    """The estimate of a summarized view is its recount, whichever way the summary is
    placed: joined to the system prompt it costs the line break between them, not a
    message's framing (the head was estimated 3 tokens over, and the provider's usage
    taught the calibration ratio that gap as the tokenizer's, so a later, larger view was
    estimated under its count); leading the history as a user message, a message's
    framing. One token over at most: the margin rounds each part up on its own."""
    from shared.core.tokens import HeuristicCounter
    from shared.core.view import summary_block

    counter = HeuristicCounter(provider)
    store = SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="h"), counter=counter)
    guard = make(shell, store, counter=counter, overrides={"m": 100_000})
    turns = [m for i in range(6) for m in coding_turn(i, 400)]
    if lead:  # the cut falls inside a turn: the history opens with an assistant message
        turns = turns[:5] + turns[6:]
    guard.record_turn("s", turns)
    cut = 5
    record = SummaryRecord(watermark=cut, kind="llm", text="The agent fixed module 0. " * 20,
                           tokens=0)
    record = record.model_copy(update={"tokens": counter.text(summary_block(record))})
    assert store.commit_summary("s", record, store.state("s").version).ok
    view = guard.prepare("s", SYSTEM, model="m", max_tokens=500,
                         pending=[{"role": "user", "content": "go on"}])
    messages = list(view.messages)
    assert (messages[1].role == "user" and messages[1].metadata.get("compaction") ==
            "summary") is lead
    assert 0 <= view.report.estimated_prompt_tokens - counter.messages(messages) <= 1


@pytest.mark.parametrize("shell", SHELLS)
def test_a_truncated_view_is_estimated_as_the_head_it_makes(shell: str) -> None:
    """The same for the summary an emergency cut makes: the view it leaves, the
    truncation's note joined to the system prompt, is estimated as it is recounted (it
    was 3 tokens over: 923 against 919 in the stateful model's run)."""
    store = SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="t"))
    guard = make(shell, store, overrides={"m": 6_000})
    for i in range(40):
        guard.record_turn("s", coding_turn(i, 2000))
    view = guard.prepare("s", SYSTEM, model="m", max_tokens=500,
                         pending=[{"role": "user", "content": "go on"}])
    messages = list(view.messages)
    assert view.report.truncated and messages[0].role == "system" and messages[1].role == "user"
    assert "<conversation_summary>" in str(messages[0].content)
    assert 0 <= view.report.estimated_prompt_tokens - DEFAULT_COUNTER.messages(messages) <= 1
