"""The async guard when the agent's task is cancelled in the middle of a call.

Agents cancel all the time (``asyncio.wait_for(guard.prepare(...), 0.01)``, a
framework cancelling a run, an ``asyncio.timeout`` block). Each test here cancels a
call at every socket step it takes (the command not yet sent, then each reply not yet
read: a gate on redis.asyncio's connection), then uses the same guard on the same loop
again: its views must be a fresh guard's, a retried turn recorded exactly once, and
no connection may answer a command with the previous command's reply.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio.connection

from shared import AsyncContextGuard
from shared.core.config import CompactionPolicy, StoreConfig
from shared.store.aio import AsyncSessionStore, connect_async
from shared.store.own_writes import own_writes_for
from shared.store.own_writes_aio import AsyncOwnWrites
from shared.store.sessions import SessionStore
from tests.test_guard import SYSTEM, coding_turn

pytestmark = pytest.mark.redis

WINDOW = {"m": 8_000}
POLICY = CompactionPolicy(clear_keep_recent_turns=1)  # each turn's prepare adds a decision


class Gate:
    """Holds the ``at``-th socket send or read of the calls made while armed (the
    command reached Redis for a read: its reply is unread), until the task is cancelled."""

    def __init__(self) -> None:
        self.armed, self.seen, self.at, self.held = False, 0, -1, ""
        self.only = ""  # "read": only the reads are counted and held

    async def passing(self, what: str) -> None:
        if not self.armed or self.only not in ("", what):
            return
        self.seen += 1
        if self.seen - 1 == self.at:
            self.held = what
            await asyncio.Event().wait()


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[Gate]:
    """The gate on every redis.asyncio connection: before a send, and inside
    ``read_response`` (where a real cancellation lands: redis-py closes the connection
    there; held before it, a pool connection went back with its reply unread, which no
    real cancellation does)."""
    held = Gate()
    conn = redis.asyncio.connection.AbstractConnection
    read, send = conn._read_response_from_parser, conn.send_packed_command

    async def gated_read(self: Any, *args: Any, **kwargs: Any) -> Any:
        await held.passing("read")
        return await read(self, *args, **kwargs)

    async def gated_send(self: Any, *args: Any, **kwargs: Any) -> Any:
        await held.passing("send")
        return await send(self, *args, **kwargs)

    monkeypatch.setattr(conn, "_read_response_from_parser", gated_read)
    monkeypatch.setattr(conn, "send_packed_command", gated_send)
    yield held


async def cancelled_at(gate: Gate, at: int, call: Callable[[], Any]) -> str:
    """Run ``call()`` with its ``at``-th socket step held, cancel it there; what was
    held ("": the call finished without reaching that step)."""
    gate.armed, gate.seen, gate.at, gate.held = True, 0, at, ""
    task = asyncio.ensure_future(call())
    for _ in range(500):
        await asyncio.sleep(0.001)
        if task.done() or gate.held:
            break
    gate.armed = False
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return gate.held


async def cancelled_after_steps(call: Awaitable[Any], steps: int) -> str:
    """``call`` run as a task and cancelled after ``steps`` passes of the event loop:
    "done" (it ended first), "cancelled", or "ignored" (it returned although cancelled)."""
    task = asyncio.ensure_future(call)
    for _ in range(steps):
        await asyncio.sleep(0)
    if task.done():
        await task
        return "done"
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        return "cancelled"
    return "ignored"


def views_equal(a: Any, b: Any) -> bool:
    return [m.model_dump() for m in a.messages] == [m.model_dump() for m in b.messages]


async def cached(guard: AsyncContextGuard, session_id: str) -> tuple[Any, ...]:
    snap = await guard.snapshot(session_id)
    return snap.start, snap.end, sorted(snap.cheap), snap.state.version


async def sent(view: Any) -> int:
    return len(view.messages)


def the_call(guard: AsyncContextGuard, what: str, sid: str, new: list[dict[str, Any]],
             rid: str | None) -> Callable[[], Any]:
    """The call under test, to make again for the agent's retry."""
    if what == "record_turn":
        return functools.partial(guard.record_turn, sid, new, {"prompt_tokens": 1500},
                                 request_id=rid)
    if what == "call":
        return functools.partial(guard.call, sid, sent, system_prompt=SYSTEM, model="m",
                                 pending=new[:1])
    return functools.partial(guard.prepare, sid, SYSTEM, model="m", pending=new[:1])


def run_cancelled(redis_url: str, key_prefix: str, gate: Gate, what: str,
                  request_id: bool = True) -> list[str]:
    """Cancel ``what`` at each of its socket steps in turn (one session per step), on
    one guard; after each, the call again, checked. Returns the steps held."""
    config = StoreConfig(key_prefix=key_prefix)
    sync = SessionStore(redis.Redis.from_url(redis_url), config)

    async def main() -> list[str]:
        store = AsyncSessionStore(connect_async(redis_url), config)
        guard = AsyncContextGuard(store, overrides=WINDOW, policy=POLICY)
        await guard.warm_up()
        held: list[str] = []
        for at in range(40):
            sid = f"s{at}"
            for i in range(4):
                turn = coding_turn(i, 3000)
                await guard.prepare(sid, SYSTEM, model="m", pending=turn[:1])
                await guard.record_turn(sid, turn)
            new = coding_turn(9, 3000)
            if what == "record_turn":
                await guard.prepare(sid, SYSTEM, model="m", pending=new[:1])
            call = the_call(guard, what, sid, new, f"r{at}" if request_id else None)
            step = await cancelled_at(gate, at, call)
            if not step:
                break
            held.append(step)
            again = await call()  # the agent's retry
            fresh = AsyncContextGuard(AsyncSessionStore(connect_async(redis_url), config),
                                      overrides=WINDOW, policy=POLICY)
            # nothing cached that Redis does not hold (read before the fresh guard writes)
            assert await cached(guard, sid) == await cached(fresh, sid), (at, step)
            if what == "record_turn":
                assert again == 25, (at, step)
                users = [m.content for m in sync.messages(sid) if m.role == "user"]
                assert users == [coding_turn(i)[0]["content"] for i in (0, 1, 2, 3, 9)]
                assert sync.state(sid).calibration_samples == 1, (at, step)  # its usage
                pending: list[Any] = []
            else:
                pending = new[:1]
            view = await guard.prepare(sid, SYSTEM, model="m", pending=pending)
            assert views_equal(view, await fresh.prepare(sid, SYSTEM, model="m",
                                                         pending=pending)), (at, step)
            assert (await guard.record_turn(sid, coding_turn(10, 100))) == sync.length(sid)
            await fresh.aclose()
            await fresh.store.aclose()
        await guard.aclose()
        await store.aclose()
        return held

    try:
        return asyncio.run(main())
    finally:
        for key in sync.redis.scan_iter(match=f"{key_prefix}:*"):
            sync.redis.delete(key)
        sync.redis.close()


@pytest.mark.parametrize("what", ["prepare", "call"])
def test_a_prepare_cancelled_at_any_step_leaves_the_guard_as_a_fresh_one(
        redis_url: str, key_prefix: str, gate: Gate, what: str) -> None:
    """Cancelled before its writes reached Redis, a prepare that planned cheap-stage
    decisions kept them in the cached view: Redis never got them (the next prepare of
    the view planned nothing new), a fresh guard's read did not show them."""
    held = run_cancelled(redis_url, key_prefix, gate, what)
    assert held[:1] == ["send"] and "read" in held  # the writes' send and their replies


@pytest.mark.parametrize("request_id", [True, False], ids=["request_id", "no_request_id"])
def test_a_turn_cancelled_at_any_step_and_retried_is_recorded_once(
        redis_url: str, key_prefix: str, gate: Gate, request_id: bool) -> None:
    """Cancelled after its script reached Redis, before the reply was read: the turn is
    in the log, and the agent's retry of the same messages records it once, with or
    without a request id (the guard re-uses the unanswered append's own); cancelled
    before, the retry's usage report is still learned from."""
    held = run_cancelled(redis_url, key_prefix, gate, "record_turn", request_id)
    assert held[:2] == ["send", "read"]


@pytest.mark.parametrize("what", ["prepare", "record_turn", "recall"])
def test_a_cancellation_requested_in_flight_is_never_ignored(
        redis_url: str, key_prefix: str, what: str) -> None:
    """Python 3.11's ``asyncio.wait_for``, which redis-py sends each command through,
    returns the inner result when the cancellation lands as the send completes: the
    request was lost (the call went on and returned, ``task.cancelling()`` left at 1;
    an ``asyncio.timeout`` block overran, a framework's cancelled run kept going), at 6
    of 12 loop iterations of a cold prepare. The guard raises it itself after the step."""
    config = StoreConfig(key_prefix=key_prefix)
    sync = SessionStore(redis.Redis.from_url(redis_url), config)

    async def main() -> list[int]:
        store = AsyncSessionStore(connect_async(redis_url), config)
        guard = AsyncContextGuard(store, overrides={"m": 400_000})
        await guard.warm_up()
        ignored = []
        for n in range(20):
            sid = f"s{n}"
            sync.append(sid, coding_turn(0, 100))
            call = (guard.prepare(sid, SYSTEM, model="m") if what == "prepare"
                    else guard.recall(sid, "failing test output") if what == "recall"
                    else guard.record_turn(sid, coding_turn(1, 100)))
            outcome = await cancelled_after_steps(call, n)
            if outcome == "done":
                break
            if outcome == "ignored":
                ignored.append(n)
            assert (await guard.record_turn(sid, coding_turn(1, 100))) == 10  # once
            view = await guard.prepare(sid, SYSTEM, model="m")
            assert [m.content for m in view.messages if m.role == "user"] == [
                coding_turn(i)[0]["content"] for i in (0, 1)]
        await guard.aclose()
        await store.aclose()
        return ignored

    try:
        assert asyncio.run(main()) == []
    finally:
        for key in sync.redis.scan_iter(match=f"{key_prefix}:*"):
            sync.redis.delete(key)
        sync.redis.close()


@pytest.mark.parametrize("edit", ["truncate_after", "rewind", "delete_session", "append"])
def test_a_cancellation_of_an_async_store_call_is_never_ignored(
        redis_url: str, key_prefix: str, edit: str) -> None:
    """The asyncio store's own calls (an agent's history edits, its appends) lost the
    cancellation Python 3.11's ``asyncio.wait_for`` swallowed in redis-py's send (as the
    guard's flows did): cancelled at 14 of 35 loop counts, ``truncate_after`` went on and
    returned, and the agent's cancelled task ran its remaining turns (its ``cancelling()``
    count left at 1, the guard's next calls saw no new request). After each, the guard's
    view is a fresh guard's."""
    config = StoreConfig(key_prefix=key_prefix)
    sync = SessionStore(redis.Redis.from_url(redis_url), config)

    async def main() -> list[int]:
        store = AsyncSessionStore(connect_async(redis_url), config)
        guard = AsyncContextGuard(store, overrides=WINDOW, policy=POLICY)
        await guard.warm_up()
        ignored = []
        for n in range(40):
            sid = f"s{n}"
            for i in range(3):
                await guard.record_turn(sid, coding_turn(i, 1000))
            await guard.prepare(sid, SYSTEM, model="m")
            call = (store.truncate_after(sid, 7) if edit == "truncate_after"
                    else store.rewind(sid, 0) if edit == "rewind"
                    else store.delete_session(sid) if edit == "delete_session"
                    else store.append(sid, coding_turn(3, 100), request_id=f"r{n}"))
            outcome = await cancelled_after_steps(call, n)
            if outcome == "done":
                break
            if outcome == "ignored":
                ignored.append(n)
            fresh = AsyncContextGuard(AsyncSessionStore(connect_async(redis_url), config),
                                      overrides=WINDOW, policy=POLICY)
            view = await guard.prepare(sid, SYSTEM, model="m")
            assert views_equal(view, await fresh.prepare(sid, SYSTEM, model="m")), n
            await fresh.aclose()
            await fresh.store.aclose()
        assert n > 2, "the call ended before any cancellation landed"
        await guard.aclose()
        await store.aclose()
        return ignored

    try:
        assert asyncio.run(main()) == []
    finally:
        for key in sync.redis.scan_iter(match=f"{key_prefix}:*"):
            sync.redis.delete(key)
        sync.redis.close()


@pytest.mark.parametrize("only", ["read", ""], ids=["in_read", "at_any_step"])
def test_an_own_writes_connect_cancelled_at_any_step_leaves_no_connection_open(
        redis_url: str, key_prefix: str, gate: Gate, monkeypatch: pytest.MonkeyPatch,
        only: str) -> None:
    """Cancelled while it probed the server (a guard's first call, and every call after
    a cancelled probe), the own-writes connection being made was left open: no one held
    it, redis-py closed it only when the garbage collector got to it (a ResourceWarning,
    a client on the server meanwhile). ``in_read``: held inside ``read_response``, where
    a real cancellation lands (redis-py closes the connection that reads, not the other
    one the probe uses)."""
    made: list[Any] = []
    new = AsyncOwnWrites._new

    def recorded(self: AsyncOwnWrites) -> Any:
        made.append(new(self))
        return made[-1]

    monkeypatch.setattr(AsyncOwnWrites, "_new", recorded)
    config = StoreConfig(key_prefix=key_prefix)

    async def main() -> list[tuple[int, str]]:
        client = connect_async(redis_url, config)
        left: list[tuple[int, str]] = []
        for at in range(40):
            own = own_writes_for(client, f"{key_prefix}:")
            assert isinstance(own, AsyncOwnWrites)
            made.clear()
            gate.only = only
            step = await cancelled_at(gate, at, own.warm_up)
            if not step:
                break
            left += [(at, step) for conn in made if conn is not own._conn and conn.is_connected]
            assert await own.warm_up() or own._conn is None  # usable again (or backing off)
            await own.aclose()
        assert at > 5, "the connect ended before any cancellation landed"
        await client.aclose()
        return left

    assert asyncio.run(main()) == []


def test_a_call_cancelled_on_the_own_writes_connection_is_not_taken_for_an_outage(
        redis_url: str, key_prefix: str, gate: Gate) -> None:
    """redis-py closes a connection whose read is cancelled; the own-writes connection's
    next call found it closed and counted a failure of the server: logged as unavailable,
    and the appends went through the store for 0.5 s, longer after each cancellation
    (the backoff of an outage). It is replaced at once instead."""
    config = StoreConfig(key_prefix=key_prefix)
    sync = SessionStore(redis.Redis.from_url(redis_url), config)

    async def main() -> None:
        store = AsyncSessionStore(connect_async(redis_url), config)
        guard = AsyncContextGuard(store, overrides=WINDOW)
        await guard.warm_up()
        own = guard.own
        assert isinstance(own, AsyncOwnWrites)
        await guard.record_turn("s", coding_turn(0, 100))
        for n in range(1, 4):
            gate.only = "read"
            step = await cancelled_at(gate, 0, functools.partial(
                guard.record_turn, "s", coding_turn(n, 100), request_id=f"r{n}"))
            assert step == "read"
            assert (await guard.record_turn("s", coding_turn(n, 100),
                                            request_id=f"r{n}")) == 5 * (n + 1)
            assert own.state.failures == 0 and own._conn is not None, n
        await guard.aclose()
        await store.aclose()

    try:
        asyncio.run(main())
    finally:
        for key in sync.redis.scan_iter(match=f"{key_prefix}:*"):
            sync.redis.delete(key)
        sync.redis.close()
