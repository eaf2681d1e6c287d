"""Call ids made unique at append, and the per-session mapping a guard remembers."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shared.core.callids import Claims, KnownIds, disambiguate
from shared.core.messages import validate_messages


def _turn(cid: str) -> list[dict[str, object]]:
    return [{"role": "assistant", "content": "", "tool_calls": [
                {"id": cid, "name": "bash", "arguments": "{}"}]},
            {"role": "tool", "tool_call_id": cid, "content": "out"}]


def test_a_known_id_is_renamed_and_its_result_follows() -> None:
    out, claims = disambiguate(validate_messages(_turn("call_0")), "ab",
                               known={"call_0": "call_0"})
    stored = out[0].tool_calls[0].id
    assert stored != "call_0" and out[1].tool_call_id == stored
    assert claims.calls == (("call_0", stored),) and claims.results == ()


def test_one_message_calling_an_id_twice_gets_its_results_in_order() -> None:
    """Each result answers the first call of its id still waiting in the newest message
    that calls it (before, both went to the last call: one result lost, one call
    answered with a placeholder)."""
    batch = validate_messages([
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "t1", "name": "f", "arguments": "{}"},
            {"id": "t1", "name": "f", "arguments": '{"b": 2}'}]},
        {"role": "tool", "tool_call_id": "t1", "content": "one"},
        {"role": "tool", "tool_call_id": "t1", "content": "two"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "t1", "name": "f", "arguments": '{"c": 3}'}]},
        {"role": "tool", "tool_call_id": "t1", "content": "three"}])
    out, _ = disambiguate(batch, "ab")
    first, second = (c.id for c in out[1].tool_calls)
    third = out[4].tool_calls[0].id
    assert len({first, second, third}) == 3
    assert [(m.tool_call_id, m.text()) for m in out if m.role == "tool"] == [
        (first, "one"), (second, "two"), (third, "three")]


def test_known_ids_keep_the_newest_call_of_each_id() -> None:
    ids = KnownIds()
    ids.learn("s", Claims(calls=(("call_0", "call_0"),)))
    ids.learn("s", Claims(calls=(("call_0", "call_0-rab0"),), results=(("x", "x"),)))
    assert ids.of("s", ["call_0", "x", "y"]) == {"call_0": "call_0-rab0", "x": "x"}
    assert ids.of("other", ["call_0"]) == {}
    ids.forget("s")
    assert ids.of("s", ["call_0"]) == {}


@given(st.lists(st.tuples(st.sampled_from("abcdefgh"), st.integers(0, 50)), max_size=200))
def test_known_ids_stay_within_their_bounds(writes: list[tuple[str, int]]) -> None:
    ids = KnownIds(sessions=3, per_session=5)
    for session, n in writes:
        ids.learn(session, Claims(calls=((f"id{n}", f"id{n}-s"),)))
    assert len(ids._maps) <= 3
    assert all(len(found) <= 5 for found in ids._maps.values())
    if writes:  # the last write is always remembered
        session, n = writes[-1]
        assert ids.of(session, [f"id{n}"]) == {f"id{n}": f"id{n}-s"}


def test_no_sessions_kept_means_nothing_learned() -> None:
    ids = KnownIds(sessions=0)
    ids.learn("s", Claims(calls=(("a", "a"),)))
    assert ids.of("s", ["a"]) == {}


@given(st.lists(st.tuples(st.sampled_from(["", "t1", "t2"]), st.sampled_from("abcd"),
                          st.integers(0, 50)), max_size=200))
def test_scoped_known_ids_share_their_bounds_and_keep_sessions_apart(
        writes: list[tuple[str, str, int]]) -> None:
    ids = KnownIds(sessions=3, per_session=5)
    scopes = {"": ids, "t1": ids.scoped("t1"), "t2": ids.scoped("t2")}
    for scope, session, n in writes:
        scopes[scope].learn(session, Claims(calls=((f"id{n}", f"{scope}:id{n}"),)))
    assert len(ids._maps) <= 3  # one bound for every scope
    for scope, view in scopes.items():  # a scope sees only what it learned
        for session in "abcd":
            assert all(stored.startswith(f"{scope}:")
                       for stored in view.of(session, [f"id{n}" for n in range(51)]).values())
    if writes:
        scope, session, n = writes[-1]
        assert scopes[scope].of(session, [f"id{n}"]) == {f"id{n}": f"{scope}:id{n}"}
        scopes[scope].forget(session)
        assert scopes[scope].of(session, [f"id{n}"]) == {}
