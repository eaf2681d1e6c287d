"""A history edit's id-map fixes, read outside its script (shared/store/edits.py)."""

from __future__ import annotations

from typing import Any

import fakeredis
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shared.store.edits as edits_module
from shared.core.config import StoreConfig
from shared.core.errors import InvalidInput, StoreUnavailable
from shared.store.commands import ids_key
from shared.store.edits import stored_calls
from shared.store.sessions import SessionStore
from tests.guard_shells import SHELLS, store_shell


@pytest.fixture(params=SHELLS)
def edits(request: pytest.FixtureRequest, store: SessionStore) -> Any:
    """Where the edit runs: the sync store, or the asyncio store on the same server (the
    same sans-I/O steps, :func:`shared.store.edits.truncate_steps`)."""
    return store_shell(request.param, store)


def call_turn(text: str, call_ids: list[str]) -> list[dict[str, Any]]:
    calls = [{"id": c, "name": "ls", "arguments": "{}"} for c in call_ids]
    return [{"role": "user", "content": text},
            {"role": "assistant", "content": "", "tool_calls": calls},
            *({"role": "tool", "tool_call_id": c, "content": "a.py"} for c in call_ids)]


def id_map(store: SessionStore, sid: str) -> dict[str, str]:
    raw = store.redis.hgetall(ids_key(store.keys(sid)))
    return {a.decode(): b.decode() for a, b in raw.items()}


def expected_map(store: SessionStore, sid: str) -> dict[str, str]:
    """Every provider id in the log -> the stored id of its newest call."""
    out: dict[str, str] = {}
    for raw in store.redis.lrange(store.keys(sid).log, 0, -1):
        for provider, stored in stored_calls(raw):
            out[provider] = stored
    return out


def test_stored_calls_reads_provider_ids_through_wire_ids() -> None:
    raw = (b'{"role":"assistant","tool_calls":[{"id":"c1-rx1","name":"ls"},{"id":"c2"},'
           b'{"name":"no id"}],"metadata":{"wire_ids":{"c1-rx1":"c1"}}}')
    assert stored_calls(raw) == [("c1", "c1-rx1"), ("c2", "c2")]
    assert stored_calls(raw, only=b"c9") == []
    assert stored_calls(b'{"role":"user","content":"tool_calls"}') == []
    assert stored_calls(b'{"tool_calls": oops') == []


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(turns=st.lists(st.lists(st.sampled_from(["c0", "c1", "c2", "call_x"]), min_size=1,
                               max_size=3, unique=True), min_size=1, max_size=8),
       cut=st.floats(0, 1), second=st.floats(0, 1))
def test_edits_keep_the_map_on_each_providers_newest_call(
        monkeypatch: pytest.MonkeyPatch, turns: list[list[str]], cut: float,
        second: float) -> None:
    """Whatever was appended and cut (ids repeating across turns, reads in chunks of 3),
    the map sends each provider id in the log to its newest call, and holds no other."""
    monkeypatch.setattr(edits_module, "READ_CHUNK", 3)
    store = SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="e"))
    for n, ids in enumerate(turns):
        store.append("s", call_turn(f"turn {n}", ids))
    for fraction in (cut, second):
        store.truncate_after("s", int(store.length("s") * fraction))
        assert id_map(store, "s") == expected_map(store, "s")
    store.append("s", call_turn("again", ["c0"]))
    assert id_map(store, "s") == expected_map(store, "s")


def test_fixes_read_before_an_append_are_refused_and_read_again(
        store: SessionStore, edits: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """An append between the edit's reads and its script: the script refuses fixes made
    for the shorter log (LOG_MOVED), the edit reads again and removes the new call too."""
    store.append("s", call_turn("first", ["c1"]))
    store.append("s", call_turn("second", ["c1"]))
    real = edits_module.id_fixes
    calls = {"n": 0}

    def with_an_append(*args: Any, **kwargs: Any) -> Any:
        out = yield from real(*args, **kwargs)
        calls["n"] += 1
        if calls["n"] == 1:
            store.append("s", call_turn("late", ["c1", "c7"]))
        return out

    monkeypatch.setattr(edits_module, "id_fixes", with_an_append)
    edit = edits.truncate_after("s", 3)
    assert calls["n"] == 2 and edit.length == 3
    assert id_map(store, "s") == {"c1": "c1"} == expected_map(store, "s")


def test_a_log_that_never_stops_moving_fails_the_edit_typed(
        store: SessionStore, edits: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    store.append("s", call_turn("first", ["c1"]))
    real = edits_module.id_fixes

    def always_an_append(*args: Any, **kwargs: Any) -> Any:
        out = yield from real(*args, **kwargs)
        store.append("s", [{"role": "user", "content": "more"}])
        return out

    monkeypatch.setattr(edits_module, "id_fixes", always_an_append)
    with pytest.raises(StoreUnavailable, match="kept changing"):
        edits.truncate_after("s", 1)
    assert store.length("s") == 3 + edits_module.EDIT_ATTEMPTS  # nothing was cut


def test_an_edit_reads_the_log_in_bounded_chunks(store: SessionStore, edits: Any,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The log before the edit is read newest first, only as far as the removed call's
    earlier holder; no read takes more than READ_CHUNK messages."""
    monkeypatch.setattr(edits_module, "READ_CHUNK", 4)
    store.append("s", call_turn("old", ["c1"]))
    store.append("s", [{"role": "user", "content": f"filler {i}"} for i in range(40)])
    store.append("s", call_turn("mid", ["c1"]))
    store.append("s", call_turn("new", ["c1"]))
    ranges: list[tuple[int, int]] = []
    real = edits_module._read

    def spy(*call: Any) -> Any:
        if call[0] == "LRANGE":
            ranges.append((call[2], call[3]))
        return real(*call)

    monkeypatch.setattr(edits_module, "_read", spy)
    length = store.length("s")
    edits.truncate_after("s", length - 3)
    assert ranges and all(end - start + 1 <= 4 for start, end in ranges)
    assert min(start for start, _ in ranges) >= 40  # stopped at the "mid" turn's call
    monkeypatch.undo()
    assert id_map(store, "s") == expected_map(store, "s")
    assert id_map(store, "s")["c1"] != "c1"  # the "mid" call, renamed at its append


def test_an_edit_removing_hundreds_of_mapped_calls_fixes_each(store: SessionStore,
                                                              edits: Any) -> None:
    """More fixes than the script applies at once (200): every one lands."""
    ids = [f"c{i}" for i in range(450)]
    store.append("s", call_turn("old", ids[:300]))
    store.append("s", call_turn("old too", ids[300:]))
    length = store.length("s")
    store.append("s", call_turn("repeat", ids[::2]))  # renamed: the map moves to them
    store.append("s", call_turn("new", [f"n{i}" for i in range(250)]))
    assert id_map(store, "s")["c0"] != "c0"
    edits.truncate_after("s", length)
    assert id_map(store, "s") == expected_map(store, "s") == {c: c for c in ids}


@pytest.mark.parametrize("other", ["later", "earlier", "same"])
def test_an_edit_racing_another_applies_each_fix_once(
        store: SessionStore, edits: Any, monkeypatch: pytest.MonkeyPatch, other: str) -> None:
    """Another edit between this edit's reads and its script (not an append: the length may
    come back the same): refused on the generation (LOG_MOVED), read again against the
    edited log, or out of range when that log is now shorter; the map is the log's."""
    for n in range(6):
        store.append("s", call_turn(f"turn {n}", ["c1", f"u{n}"]))  # 4 messages a turn
    real = edits_module.id_fixes
    calls = {"n": 0}
    at = {"later": 20, "earlier": 8, "same": 12}[other]

    def with_another_edit(*args: Any, **kwargs: Any) -> Any:
        out = yield from real(*args, **kwargs)
        calls["n"] += 1
        if calls["n"] == 1:
            monkeypatch.setattr(edits_module, "id_fixes", real)
            store.truncate_after("s", at)
            if other == "same":  # back to the length this edit read, other calls
                store.append("s", call_turn("other", ["c1", "x1", "x2"]) * 2
                             + [{"role": "user", "content": "end"}] * 2)
                assert store.length("s") == 24
            monkeypatch.setattr(edits_module, "id_fixes", with_another_edit)
        return out

    monkeypatch.setattr(edits_module, "id_fixes", with_another_edit)
    if other == "earlier":
        with pytest.raises(InvalidInput):
            edits.truncate_after("s", 12)
        assert calls["n"] == 1 and store.length("s") == 8
    else:
        assert edits.truncate_after("s", 12).length == 12
        assert calls["n"] == 2
    assert id_map(store, "s") == expected_map(store, "s")


def test_an_edit_under_steady_appends_reads_only_what_was_appended(
        store: SessionStore, edits: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """An append after every third read of the log (an agent appending while a long edit
    reads): each attempt read the whole removed range again (10 reads here), saw the log
    move and failed the edit after EDIT_ATTEMPTS (an edit at 0 of 10k messages, ~90 ms of
    reads, failed under an append every 50 ms). A retry reads only the appended messages."""
    monkeypatch.setattr(edits_module, "READ_CHUNK", 4)
    store.append("s", call_turn("old", ["c1"]))
    for n in range(12):
        store.append("s", call_turn(f"turn {n}", ["c1", f"u{n}"]))
    real = edits_module._read
    reads = {"n": 0}

    def spy(*call: Any) -> Any:
        if call[0] == "LRANGE":
            reads["n"] += 1
            if reads["n"] % 3 == 0:
                store.append("s", call_turn("late", ["c1", "late"]))
        return real(*call)

    monkeypatch.setattr(edits_module, "_read", spy)
    assert edits.truncate_after("s", 3).length == 3
    monkeypatch.undo()
    assert id_map(store, "s") == expected_map(store, "s") == {"c1": "c1"}
