"""No write brings back the keys of a session deleted just before it.

A session's keys go with ``delete_session`` (the agent's delete) or their TTL. A writer
acting on what it read before the delete (a worker's failure record, the guard's cheap
decisions or truncation, an operator's rewind or edit, a flag cleared after a prepare)
must not make them again: a hash it makes alone has no TTL (none is configured by
default, and an HSET/HINCRBY gives none), so nothing would ever delete it. Only the turn's
append starts a session (and the prepare's figures, which the guard writes with the
session's TTL, see ``test_guard_recover_audit``). Each test deletes the session just before
the write, on fakeredis (with Lua) and on the real Redis.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from shared.core.config import StoreConfig
from shared.core.errors import InvalidInput
from shared.core.guard_state import Plan
from shared.core.records import CheapDecision, SummaryRecord
from shared.guard._flow import GuardFlow
from shared.guard._fresh import FreshViews
from shared.store import commands
from shared.store.requests import Request
from shared.store.sessions import SessionStore
from tests.guard_shells import SHELLS, store_shell

TURN = [{"role": "user", "content": f"m{i} " + "word " * 40} for i in range(8)]


def _keys(store: SessionStore) -> list[str]:
    prefix = store.config.key_prefix
    return sorted(k.decode() for k in store.redis.scan_iter(match=f"{prefix}:*"))


def _deleted(store: SessionStore, sid: str = "s") -> None:
    """A session that existed, deleted: nothing of it is left."""
    store.append(sid, TURN)
    store.delete_session(sid)
    assert _keys(store) == []


def _decision(index: int = 1) -> CheapDecision:
    return CheapDecision(index=index, stage="clear_tool_output", placeholder="[cleared]",
                         saved_tokens=10)


# -- record_request_failure (shared/store/lease.py) -------------------------------------

def test_a_failure_recorded_for_a_deleted_session_makes_no_state(store: SessionStore) -> None:
    """A job gave up on requests of a session the agent had just deleted: the count went
    into a state of its own (HINCRBY in a MULTI), with no TTL, for ever."""
    _deleted(store)
    store.record_request_failure("s", [Request(manual=True).encode()], "StoreUnavailable: gone")
    assert _keys(store) == []


def test_a_failure_of_a_live_session_is_counted_with_its_detail(any_redis: Any,
                                                                key_prefix: str) -> None:
    store = SessionStore(any_redis, StoreConfig(key_prefix=key_prefix, ttl_seconds=600))
    store.append("s", TURN)
    store.record_request_failure("s", [], "StoreUnavailable: first")
    store.record_request_failure("s", ["{}", "{}", "{}"], "RuntimeError: second")
    state = store.state("s")
    assert state.requests_failed == 4
    assert "RuntimeError: second" in state.last_request_failure
    assert 0 < any_redis.ttl(store.keys("s").state) <= 600  # the session's TTL kept


# -- the guard's writes: cheap decisions, its truncation -----------------------------------

def test_cheap_decisions_for_a_deleted_session_are_not_recorded(store: SessionStore) -> None:
    """The guard planned decisions at version 0 and the agent deleted the session: the
    version check passed (an absent state reads as version 0), the decisions came back,
    and the state with a ``cheap_gen`` of its own and no TTL."""
    _deleted(store)
    assert store.record_cheap("s", [_decision()], expected_version=0) == -1
    assert store.record_cheap("s", [_decision()]) == -1
    assert _keys(store) == []


def test_cheap_decisions_of_a_live_session_are_recorded(store: SessionStore) -> None:
    store.append("s", TURN)
    assert store.record_cheap("s", [_decision()], expected_version=0) == 1
    assert store.redis.hget(store.keys("s").state, "cheap_gen") == b"1"


def test_a_commit_on_a_deleted_session_is_refused(store: SessionStore) -> None:
    """Only a commit at watermark 0 and version 0 got past the checks (the log is gone,
    so any other watermark is beyond it): it made the summary keys and a state."""
    _deleted(store)
    record = SummaryRecord(watermark=0, kind="truncation", text="x", tokens=1)
    result = store.commit_summary("s", record, 0)
    assert not result.ok and result.reason == "gone"
    assert _keys(store) == []


# -- an operator's rewind, a history edit ---------------------------------------------------

@pytest.mark.parametrize("shell", SHELLS)
def test_a_rewind_of_a_deleted_session_writes_nothing(store: SessionStore, shell: str) -> None:
    """Watermark 0 needs no kept summary: the rewind made a state (version 1)."""
    edits = store_shell(shell, store)
    _deleted(store)
    assert edits.rewind("s", 0).version == 0
    with pytest.raises(InvalidInput, match="no kept summary"):
        edits.rewind("s", 4)
    assert _keys(store) == []


@pytest.mark.parametrize("shell", SHELLS)
def test_an_edit_of_a_deleted_session_writes_nothing(store: SessionStore, shell: str) -> None:
    """``truncate_after(s, 0)`` of a session deleted since: an empty log, so index 0 was
    in range, and the edit made a state (version and generation 1)."""
    _deleted(store)
    edit = store_shell(shell, store).truncate_after("s", 0)
    assert (edit.version, edit.watermark, edit.length) == (0, 0, 0)
    assert _keys(store) == []


@pytest.mark.parametrize("shell", SHELLS)
def test_an_edit_of_a_session_deleted_while_it_read_writes_nothing(
        store: SessionStore, monkeypatch: pytest.MonkeyPatch, shell: str) -> None:
    """The delete lands between the edit's reads of the log and its script: the script
    says the log moved, the edit reads again and finds no session."""
    from shared.store import edits

    store.append("s", TURN)
    read = edits.read_log_at
    deleted: list[bool] = []

    def read_then_delete(*args: Any, **kwargs: Any) -> Any:
        found = yield from read(*args, **kwargs)
        if not deleted:
            deleted.append(True)
            store.delete_session("s")
        return found

    monkeypatch.setattr(edits, "read_log_at", read_then_delete)
    assert store_shell(shell, store).truncate_after("s", 0).version == 0
    assert deleted and _keys(store) == []


def test_edits_and_rewinds_of_a_live_session_still_write(store: SessionStore) -> None:
    store.append("s", TURN)
    assert store.truncate_after("s", 4).version == 1
    assert store.rewind("s", 0).version == 2
    assert store.truncate_after("s", 0).length == 0  # the state stays: the session is kept


# -- the guard's flag writes --------------------------------------------------------------

def _plan(**kwargs: Any) -> Plan:
    return Plan(view=None, sent=None, **kwargs)  # type: ignore[arg-type]


def _run_own(store: SessionStore, steps: list[Any]) -> None:
    """The own-writes connection's batch, sent one step after the other."""
    for step in steps:
        if isinstance(step, commands.Command):
            store.execute(step)
        else:
            store.redis.execute_command(*step)


def test_the_guard_clears_recover_next_without_making_a_state(store: SessionStore) -> None:
    """The recovery flag was cleared with ``HSET recover_next 0`` (both shells): on a
    session deleted since the prepare read it, a state of one field and no TTL."""
    _deleted(store)
    steps, _ = FreshViews.own_steps(None, store, "s",  # type: ignore[arg-type,misc]
                                    _plan(clear_recover_next=True), None, False, False)
    _run_own(store, steps)
    assert _keys(store) == []
    shell = SimpleNamespace(touched=lambda session_id: None)  # the store's shell (both)
    ios = list(GuardFlow._perform(shell, "s", _plan(clear_recover_next=True)))  # type: ignore[arg-type]
    assert [(io.method, io.args) for io in ios] == [("clear_state_flags", ("s", "recover_next"))]
    getattr(store, ios[0].method)(*ios[0].args)
    assert _keys(store) == []


def test_the_guard_clears_recover_next_of_a_live_session(store: SessionStore) -> None:
    store.append("s", TURN)
    store.update_state("s", recover_next=1)
    steps, _ = FreshViews.own_steps(None, store, "s",  # type: ignore[arg-type,misc]
                                    _plan(clear_recover_next=True), None, False, False)
    _run_own(store, steps)
    assert store.state("s").recover_next == 0


def test_a_forced_prepares_flag_takes_the_sessions_ttl(any_redis: Any, key_prefix: str) -> None:
    """The own-writes batch set ``force_requested`` after the figures' EXPIRE, and without
    figures none at all: on a session deleted since the prepare's read, a state that never
    expired although the store has a session TTL."""
    store = SessionStore(any_redis, StoreConfig(key_prefix=key_prefix, ttl_seconds=600))
    _deleted(store)
    steps, _ = FreshViews.own_steps(None, store, "s",  # type: ignore[arg-type,misc]
                                    _plan(), None, True, True)
    _run_own(store, steps)
    state = store.keys("s").state
    assert any_redis.hget(state, "force_requested") == b"1"
    assert 0 < any_redis.ttl(state) <= 600
    assert any_redis.ttl(store.keys("s").pending) > 0


def test_the_async_store_clears_flags_without_making_a_state() -> None:
    """The async guard's recovery flag goes through the async store's HDEL too."""
    import asyncio

    import fakeredis

    from shared.store.aio import AsyncSessionStore

    async def run() -> tuple[list[Any], dict[Any, Any]]:
        client = fakeredis.FakeAsyncRedis()
        store = AsyncSessionStore(client, StoreConfig(key_prefix="a"))
        await store.clear_state_flags("gone", "recover_next")
        await store.append("live", TURN)
        await store.update_state("live", recover_next=1)
        await store.clear_state_flags("live", "recover_next")
        keys = [k async for k in client.scan_iter(match="a:{default:gone}*")]
        return keys, await client.hgetall(store.keys("live").state)

    keys, live = asyncio.run(run())
    assert keys == [] and b"recover_next" not in live and b"version" in live
