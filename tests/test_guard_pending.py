"""Recording a turn re-uses what its prepares validated and counted, with the same result."""

from __future__ import annotations

from typing import Any

import fakeredis
import pytest

from shared.core.config import StoreConfig
from shared.core.errors import InvalidInput, LimitExceeded
from shared.core.messages import Message, validate_messages
from shared.core.tokens import DEFAULT_COUNTER
from shared.core.viewcache import ViewCache
from shared.guard._pending import _plain_ascii
from shared.store.sessions import SessionStore
from tests.guard_shells import SHELLS, make
from tests.test_guard import SYSTEM, coding_turn


class CountingCounter:
    """The default counter, counting how many messages it was asked to count."""

    def __init__(self) -> None:
        self.messages_counted = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(DEFAULT_COUNTER, name)

    def message(self, message: Any) -> int:
        self.messages_counted += 1
        return DEFAULT_COUNTER.message(message)


def _chain() -> list[dict[str, Any]]:
    return coding_turn(0, 3000) + coding_turn(1, 3000)[1:] + coding_turn(2, 3000)[1:]


def _stored_counts(store: SessionStore) -> list[int]:
    totals = [int(t) for t in store.redis.lrange(store.keys("s").cum, 0, -1)]
    return [b - a for a, b in zip([0, *totals], totals, strict=False)]


@pytest.mark.parametrize("shell_name", SHELLS)
def test_a_recorded_chain_is_counted_once_and_stored_as_a_plain_append(
        shell_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    counter = CountingCounter()
    store = SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="p"), counter=counter)
    guard = make(shell_name, store, overrides={"m": 1_000_000})
    turn = _chain()
    turn[1] = {**turn[1], "metadata": {"trace": "t1"}}  # JSON made at prepare: metadata
    turn[2] = {**turn[2], "content": turn[2]["content"] + " (café)"}  # and non-ASCII text
    for i in [i for i, m in enumerate(turn) if m["role"] == "assistant"]:
        guard.prepare("s", SYSTEM, model="m", pending=turn[:i])
    before = counter.messages_counted
    encoded: list[Message] = []
    to_json_bytes = Message.to_json_bytes
    monkeypatch.setattr(Message, "to_json_bytes",
                        lambda self: encoded.append(self) or to_json_bytes(self))
    guard.record_turn("s", turn)
    monkeypatch.undo()
    assert counter.messages_counted - before == 1  # only the last message was new
    # encoded now: the last message, and those whose JSON cannot fail (ASCII text, no
    # metadata), which the prepares did not make; the others' JSON is the prepares'
    made = [m for m in validate_messages(turn[:-1]) if not _plain_ascii(m)]
    assert [m.model_dump() for m in made] == [validate_messages(turn[1:3])[k].model_dump()
                                              for k in (0, 1)]
    assert not any(m.model_dump() in [x.model_dump() for x in made] for m in encoded)
    assert len(encoded) == len(turn) - 2 and encoded[-1].content == turn[-1]["content"]

    plain = SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="p"))
    plain.append("s", turn)
    assert _stored_counts(store) == _stored_counts(plain)
    assert [m.to_json() for m in store.messages("s")] == \
        [m.to_json() for m in plain.messages("s")]
    assert _stored_counts(store) == [DEFAULT_COUNTER.message(m)
                                     for m in validate_messages(turn)]


@pytest.mark.parametrize("shell_name", SHELLS)
def test_a_pending_message_changed_in_place_is_stored_as_recorded(shell_name: str) -> None:
    """A Message is frozen, but its metadata dict is not: an agent that annotates its
    message after the call has the annotation stored (its JSON is made anew; a message
    given as a mapping is compared by value and its prepare's JSON re-used)."""
    store = SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="p"))
    guard = make(shell_name, store, overrides={"m": 1_000_000})
    first = Message(role="user", content="go", metadata={"trace": "a"})
    turn = [first, {"role": "assistant", "content": "ok", "metadata": {"trace": "c"}}]
    guard.prepare("s", SYSTEM, model="m", pending=turn)
    first.metadata["trace"] = "b"
    guard.record_turn("s", [*turn, {"role": "user", "content": "thanks"}])
    assert [m.metadata for m in store.messages("s")] == [{"trace": "b"}, {"trace": "c"}, {}]


@pytest.mark.parametrize("shell_name", SHELLS)
def test_a_prepared_message_over_the_size_limit_is_refused_when_recorded(
        shell_name: str) -> None:
    """The prepares' stored JSON is re-used by the record, and its size still checked."""
    store = SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="p",
                                                            max_message_bytes=2_000))
    guard = make(shell_name, store, overrides={"m": 1_000_000})
    turn = [{"role": "user", "content": "x" * 3_000}, {"role": "assistant", "content": "ok"}]
    guard.prepare("s", SYSTEM, model="m", pending=turn[:1])
    with pytest.raises(LimitExceeded, match="the limit is 2000 bytes") as raised:
        guard.record_turn("s", turn)
    assert raised.value.field == "messages[0]" and store.length("s") == 0


@pytest.mark.parametrize("shell_name", SHELLS)
def test_a_bad_message_after_the_prepared_ones_is_named_by_its_place(shell_name: str) -> None:
    store = SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="p"))
    guard = make(shell_name, store, overrides={"m": 1_000_000})
    turn = coding_turn(0, 100)
    guard.prepare("s", SYSTEM, model="m", pending=turn[:3])
    bad = [*turn[:3], {"role": "wizard", "content": "x"}]
    with pytest.raises(InvalidInput) as raised:
        guard.record_turn("s", bad)
    assert raised.value.field is not None and raised.value.field.startswith("messages[3]")
    assert store.length("s") == 0


def _scripts_sent(guard: Any) -> list[str]:
    """The names of the store scripts ``guard`` runs from now on, in order."""
    inner = guard.inner if hasattr(guard, "inner") else guard
    sent: list[str] = []
    execute = inner.store.execute

    def spy(cmd: Any) -> Any:
        sent.append(cmd.script)
        return execute(cmd)

    inner.store.execute = spy
    return sent


def _fed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many messages each :meth:`Renaming.feed` call renames from now on."""
    import shared.core.callids as callids

    fed: list[int] = []
    feed = callids.Renaming.feed

    def counting(self: callids.Renaming, messages: Any) -> list[Any]:
        fed.append(len(messages))
        return feed(self, messages)

    monkeypatch.setattr(callids.Renaming, "feed", counting)
    return fed


def _store_with_a_call(call_id: str) -> SessionStore:
    """A session holding one answered call with ``call_id``."""
    store = SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="p"))
    store.append("s", [{"role": "user", "content": "before"},
                       {"role": "assistant", "content": "", "tool_calls": [
                           {"id": call_id, "name": "bash", "arguments": "{}"}]},
                       {"role": "tool", "tool_call_id": call_id, "content": "old"}])
    return store


def _repeating_chain(calls: int) -> list[dict[str, Any]]:
    """A tool chain whose call ids repeat (an OpenAI-compatible server numbering its
    calls per response) and reuse one the session already stored."""
    out: list[dict[str, Any]] = [{"role": "user", "content": "fix it"}]
    for k in range(calls):
        cid = "stored" if k == 3 else f"call_{k % 2}"
        out += [{"role": "assistant", "content": "", "tool_calls": [
                    {"id": cid, "name": "bash", "arguments": f'{{"step": {k}}}'}]},
                {"role": "tool", "tool_call_id": cid, "content": f"output {k}"}]
    return [*out, {"role": "assistant", "content": "done"}]


@pytest.mark.parametrize("shell_name", SHELLS)
def test_a_chain_with_repeated_ids_is_renamed_once_per_message(
        shell_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each call of the chain renames only the messages added since the last one, keeps
    their wire forms, and sends what a guard seeing the turn for the first time sends."""
    fed = _fed(monkeypatch)
    store = _store_with_a_call("stored")
    guard = make(shell_name, store, overrides={"m": 1_000_000})
    turn = _repeating_chain(12)
    calls = [i for i, m in enumerate(turn) if m["role"] == "assistant"]
    renamed = 0
    for i in calls:
        fed.clear()
        view = guard.prepare("s", SYSTEM, model="m", pending=turn[:i])
        wire = view.wire("openai")
        renamed += sum(fed)
        fresh = make(shell_name, store, overrides={"m": 1_000_000}).prepare(
            "s", SYSTEM, model="m", pending=turn[:i])
        assert wire == fresh.wire("openai")
        assert view.report.estimated_prompt_tokens == fresh.report.estimated_prompt_tokens
        ids = [c["id"] for m in wire for c in m.get("tool_calls", [])]
        assert len(ids) == len(set(ids))  # sent paired, each call its own id
    assert renamed == calls[-1]  # each pending message renamed once, by the first call with it
    guard.record_turn("s", turn)  # the cached view extended with the models it holds
    view = guard.prepare("s", SYSTEM, model="m")
    fresh = make(shell_name, store, overrides={"m": 1_000_000}).prepare("s", SYSTEM, model="m")
    assert view.report.length == 3 + len(turn)
    for fmt in ("openai", "openai+reasoning"):
        assert view.wire(fmt) == fresh.wire(fmt)
    assert view.anthropic() == fresh.anthropic() and view.gemini() == fresh.gemini()


@pytest.mark.parametrize("shell_name", SHELLS)
def test_an_id_the_view_holds_is_renamed_before_the_first_attempt(shell_name: str) -> None:
    """A turn re-using a call id the cached view shows stored is renamed at once: one
    append script call, not a refused one and a second."""
    store = SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="p"))
    guard = make(shell_name, store, overrides={"m": 1_000_000})
    chain = _repeating_chain(2)  # call_0, call_1
    guard.record_turn("s", chain)
    guard.prepare("s", SYSTEM, model="m")
    sent = _scripts_sent(guard)
    guard.record_turn("s", chain)
    assert sent == ["append"]
    ids = [c.id for m in store.messages("s") for c in m.tool_calls]
    assert len(ids) == len(set(ids)) == 4


@pytest.mark.parametrize("shell_name", SHELLS)
def test_a_message_renamed_at_append_is_not_sent_with_its_pending_wire_form(
        shell_name: str) -> None:
    """A call id stored before the view's start (compacted away) is new to the view, so
    the turn's prepares send it as given; the append renames it. The next view must
    send the stored id, as a fresh read does, not the form the prepares made."""
    from shared.core.records import SummaryRecord

    store = SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="p"))
    store.append("s", [{"role": "user", "content": "before"},
                       {"role": "assistant", "content": "", "tool_calls": [
                           {"id": "old", "name": "bash", "arguments": "{}"}]},
                       {"role": "tool", "tool_call_id": "old", "content": "out"},
                       {"role": "assistant", "content": "ok"}])
    assert store.commit_summary("s", SummaryRecord(watermark=4, kind="offline", text="S",
                                                   tokens=3), 0).ok
    guard = make(shell_name, store, overrides={"m": 1_000_000})
    turn = [{"role": "user", "content": "again"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "old", "name": "bash", "arguments": '{"n": 2}'}]},
            {"role": "tool", "tool_call_id": "old", "content": "out 2"},
            {"role": "assistant", "content": "done"}]
    for i in (1, 3):
        assert guard.prepare("s", SYSTEM, model="m", pending=turn[:i]).wire("openai")
    guard.record_turn("s", turn)
    stored = [c.id for m in store.messages("s") for c in m.tool_calls]
    assert stored[0] == "old" and stored[1] != "old"
    view = guard.prepare("s", SYSTEM, model="m")
    fresh = make(shell_name, store, overrides={"m": 1_000_000}).prepare("s", SYSTEM, model="m")
    assert view.wire("openai") == fresh.wire("openai")


@pytest.mark.parametrize("shell_name", SHELLS)
def test_an_id_this_guard_stored_is_renamed_at_once_after_it_left_the_view(
        shell_name: str) -> None:
    """A provider that numbers calls per response (``call_0`` every turn): once the turn
    that first used an id is summarized away the view no longer shows it, but the
    guard's own appends told it the session's mapping, so the next turn is renamed
    before its first attempt and its result is claimed under the newest call."""
    from shared.core.records import SummaryRecord

    store = SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="p"))
    guard = make(shell_name, store, overrides={"m": 1_000_000})
    guard.record_turn("s", _repeating_chain(1))
    guard.record_turn("s", _repeating_chain(1))  # renamed: call_0 is in the view
    length = len(store.messages("s"))
    assert store.commit_summary("s", SummaryRecord(watermark=length, kind="offline", text="S",
                                                   tokens=3), store.state("s").version).ok
    guard.prepare("s", SYSTEM, model="m")  # the view now starts after every call_0
    sent = _scripts_sent(guard)
    guard.record_turn("s", _repeating_chain(1))
    assert sent == ["append"]
    stored = store.messages("s")
    ids = [c.id for m in stored for c in m.tool_calls]
    assert len(ids) == len(set(ids)) == 3
    results = [m.tool_call_id for m in stored if m.role == "tool"]
    assert results[-1] == ids[-1]  # paired with its own call, not an older call_0


@pytest.mark.parametrize("shell_name", SHELLS)
def test_a_pending_message_changed_in_place_is_counted_again(shell_name: str) -> None:
    """The turn's messages are compared by value with copies of what the last call got:
    a dict the agent edits in place between calls (flat or nested) is not taken as seen."""
    store = SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="p"))
    guard = make(shell_name, store, overrides={"m": 1_000_000})
    turn = _chain()
    first = guard.prepare("s", SYSTEM, model="m", pending=turn[:1]).report
    turn[0]["content"] = turn[0]["content"] + " Also add a regression test." * 40
    grown = guard.prepare("s", SYSTEM, model="m", pending=turn[:1]).report
    assert grown.estimated_prompt_tokens > first.estimated_prompt_tokens + 100
    assert guard.prepare("s", SYSTEM, model="m", pending=turn[:1]).wire("openai")[-1][
        "content"] == turn[0]["content"]
    call = next(m for m in turn if m.get("tool_calls"))
    at = turn.index(call)
    before = guard.prepare("s", SYSTEM, model="m", pending=turn[:at + 1]).report
    call["tool_calls"][0]["arguments"] = '{"path": "' + "x" * 2000 + '"}'
    after = guard.prepare("s", SYSTEM, model="m", pending=turn[:at + 1]).report
    assert after.estimated_prompt_tokens > before.estimated_prompt_tokens + 100


@pytest.mark.parametrize("shell_name", SHELLS)
def test_a_chain_s_wire_is_extended_and_follows_a_replaced_earlier_message(
        shell_name: str) -> None:
    """Each call of a chain extends the wire list the last call made; a message the
    caller replaced earlier in the turn is converted anew, and so is everything after."""
    from shared.core.wire import to_openai

    store = SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="p"))
    guard = make(shell_name, store, overrides={"m": 1_000_000})
    turn = validate_messages(_chain())
    calls = [i for i, m in enumerate(turn) if m.role == "assistant"]
    for i in calls[:3]:
        view = guard.prepare("s", SYSTEM, model="m", pending=turn[:i])
        assert list(view.wire("openai"))[1:] == to_openai(turn[:i])
    guard.prepare("s", SYSTEM, model="m", pending=turn[:calls[3]])  # no wire made this call
    turn = [turn[0].model_copy(update={"content": "replaced"}), *turn[1:]]
    for i in calls[3:5]:
        view = guard.prepare("s", SYSTEM, model="m", pending=turn[:i])
        assert list(view.wire("openai"))[1:] == to_openai(turn[:i])
    assert list(view.wire("openai"))[1]["content"] == "replaced"


@pytest.mark.parametrize("shell_name", SHELLS)
def test_a_renamed_turn_is_stored_with_the_ids_its_prepares_sent(
        shell_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The append stores the ids the turn's prepares renamed and sent (a prompt cache of
    the provider keeps matching the next turn), renaming only what came after them, in
    one append script call."""
    store = _store_with_a_call("stored")
    guard = make(shell_name, store, overrides={"m": 1_000_000})
    turn = _repeating_chain(6)
    last = len(turn) - 1
    wire = guard.prepare("s", SYSTEM, model="m", pending=turn[:last]).wire("openai")
    sent = [c["id"] for m in wire[-last:] for c in m.get("tool_calls", [])]
    assert len(set(sent)) == len(sent) == 6 and sent != [c["tool_calls"][0]["id"]
                                                          for c in turn[1:last:2]]
    fed = _fed(monkeypatch)
    scripts = _scripts_sent(guard)
    guard.record_turn("s", turn)
    assert fed == [1] and scripts == ["append"]  # only the final answer was new
    stored = [c.id for m in store.messages("s")[3:] for c in m.tool_calls]
    assert stored == sent
    view = guard.prepare("s", SYSTEM, model="m")
    fresh = make(shell_name, store, overrides={"m": 1_000_000}).prepare("s", SYSTEM, model="m")
    assert view.wire("openai") == fresh.wire("openai")
    assert [c["id"] for m in view.wire("openai")[-len(turn):]
            for c in m.get("tool_calls", [])] == sent


@pytest.mark.parametrize("shell_name", SHELLS)
def test_ids_repeated_across_several_turns_are_stored_as_sent(shell_name: str) -> None:
    """OpenAI-compatible servers that number calls per reply (call_0 every turn): each turn
    renames its call_0 at prepare, and the append stores the name that was sent, however
    many earlier turns used call_0 (after two, the guard's record of the newest stored name
    differs from the view's first, which the turn's own result does not depend on)."""
    from shared.core.wire import from_openai

    def turn(q: str) -> list[Any]:
        return [*from_openai([
            {"role": "user", "content": q},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_0", "type": "function",
                 "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_0", "content": "r"}])]

    store = SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="p"))
    guard = make(shell_name, store, overrides={"m": 1_000_000})
    for i in range(4):
        pending = turn(f"q{i}")
        view = guard.prepare("s", SYSTEM, model="m", pending=pending)
        sent = [c["id"] for m in view.wire("openai") for c in m.get("tool_calls", [])][-1]
        guard.record_turn("s", [*pending, {"role": "assistant", "content": "done"}])
        assert [c.id for m in store.messages("s") for c in m.tool_calls][-1] == sent, i


@pytest.mark.parametrize("shell_name", SHELLS)
def test_a_turn_renamed_for_a_position_another_append_took_is_renamed_again(
        shell_name: str) -> None:
    """Ids renamed for the log position the turn was prepared at are unique only there:
    when another writer appended first, the append refuses them and the turn is renamed
    afresh; every stored call id stays unique."""
    store = SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="p"))
    store.append("s", _repeating_chain(1))  # call_0 stored: the turn's call_0 is renamed
    first = make(shell_name, store, overrides={"m": 1_000_000})
    second = make(shell_name, store, overrides={"m": 1_000_000})
    turn = _repeating_chain(1)
    sent = []
    for guard in (first, second):  # both prepared at the same position, renamed alike
        wire = guard.prepare("s", SYSTEM, model="m", pending=turn[:-1]).wire("openai")
        sent.append(wire[-2]["tool_calls"][0]["id"])
    assert sent[0] == sent[1] != "call_0"
    first.record_turn("s", turn)
    second.record_turn("s", turn)  # no id kept as given: only the position tells
    ids = [c.id for m in store.messages("s") for c in m.tool_calls]
    assert len(ids) == 3 and len(set(ids)) == 3 and ids[1] == sent[0]
    results = [m.tool_call_id for m in store.messages("s") if m.role == "tool"]
    assert results == ids  # each result paired with its own call


@pytest.mark.parametrize("shell_name", SHELLS)
def test_a_turn_renamed_from_its_middle_converts_each_message_once(
        shell_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A turn whose ids start repeating half way is renamed from then on; the messages
    the renaming leaves as they are keep the wire forms the earlier calls made, so each
    message of the turn is converted once, whenever its renaming began."""
    import shared.core.wireview as wireview

    converted: list[int] = []
    convert = wireview.convert

    def counting(fmt: str, messages: Any, *rest: Any) -> Any:
        converted.append(len(messages))
        return convert(fmt, messages, *rest)

    store = _store_with_a_call("stored")
    guard = make(shell_name, store, overrides={"m": 1_000_000})
    turn = _repeating_chain(8)  # call_0 and call_1 repeat from the third call on
    guard.prepare("s", SYSTEM, model="m").wire("openai")  # the stored view, converted
    monkeypatch.setattr(wireview, "convert", counting)
    for i in [i for i, m in enumerate(turn) if m["role"] == "assistant"]:
        wire = guard.prepare("s", SYSTEM, model="m", pending=turn[:i]).wire("openai")
    monkeypatch.setattr(wireview, "convert", convert)
    fresh = make(shell_name, store, overrides={"m": 1_000_000}).prepare(
        "s", SYSTEM, model="m", pending=turn[:-1])
    assert wire == fresh.wire("openai")
    assert sum(converted) == len(turn) - 1  # every pending message once, none again


@pytest.mark.parametrize("shell_name", SHELLS)
def test_a_turn_over_the_pending_bound_is_not_kept_and_its_views_are_the_same(
        shell_name: str) -> None:
    """The bound on remembered turns costs a long turn its re-use, never its view."""
    turn = _chain()
    calls = [i for i, m in enumerate(turn) if m["role"] == "assistant"]
    views, counted = {}, {}
    for tokens in (10_000_000, 5):  # the default; less than the chain's first message
        counter = CountingCounter()
        store = SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="p"), counter=counter)
        cache = ViewCache(pending_tokens=tokens)
        guard = make(shell_name, store, overrides={"m": 1_000_000}, view_cache=cache)
        views[tokens] = [guard.prepare("s", SYSTEM, model="m", pending=turn[:i]).openai()
                         for i in calls]
        counted[tokens] = counter.messages_counted
        turns, _ = cache.pending()
        assert len(turns) == (1 if tokens > 5 else 0) and turns.size <= tokens
    assert views[5] == views[10_000_000]
    # kept, each pending message was counted once; not kept, at every call
    assert counted[5] - counted[10_000_000] == sum(calls) - calls[-1]


@pytest.mark.parametrize("shell_name", SHELLS)
def test_the_guards_of_one_cache_share_its_bound_on_remembered_turns(shell_name: str) -> None:
    """A server's tenants: each tenant's turns its own, one bound between them."""
    turn = _chain()[:4]  # whole pairs: nothing repaired (a placeholder result is counted too)
    cache = ViewCache(pending_turns=1)
    counters = {name: CountingCounter() for name in ("alpha", "beta")}
    guards = {name: make(shell_name, SessionStore(fakeredis.FakeRedis(), StoreConfig(
        key_prefix=name), counter=counters[name]), view_cache=cache.scoped(name))
        for name in ("alpha", "beta")}

    def counted(name: str, pending: list[dict[str, Any]]) -> int:
        before = counters[name].messages_counted
        guards[name].prepare("s", SYSTEM, pending=pending)
        return counters[name].messages_counted - before

    for name in guards:
        counted(name, [])  # the system prompt, counted once
    assert counted("alpha", turn[:1]) == 1
    assert counted("alpha", turn) == 3  # only its new messages
    assert counted("beta", turn) == 4  # the same session id, another tenant's turn
    assert counted("alpha", turn) == 4  # pushed out by beta's: all four again
    assert len(cache.pending()[0]) == 1
