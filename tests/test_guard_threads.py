"""One sync guard shared by many threads (a gthread server, a pool of agents), on a real
Redis: different sessions at once, two requests of one session racing, a worker's
summaries landing meanwhile, the caches at their bounds."""

from __future__ import annotations

import re
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from shared.core.config import StoreConfig
from shared.core.messages import Message
from shared.core.repair import validate_view
from shared.core.tokens import HeuristicCounter
from shared.core.view import ViewCache
from shared.guard import ContextGuard
from shared.guard._pending import PendingTurns
from shared.store.sessions import SessionStore

SYSTEM = "be brief"
M = {"model": "m"}


@pytest.fixture
def fine_switching() -> Iterator[None]:
    """Threads switch every microsecond: a race window of a few bytecodes gets hit."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def user(tag: str) -> dict[str, Any]:
    """A user message whose stored JSON the pending turn keeps (not plain ASCII)."""
    return {"role": "user", "content": f"{tag} é " + "mot " * 40}


class GatedCounter(HeuristicCounter):
    """Counts as the default does, but the first count of a message holding ``hold``
    waits until ``release`` is set: a thread paused in the middle of its prepare."""

    def __init__(self, hold: str) -> None:
        super().__init__()
        self.hold, self.paused, self.release = hold, threading.Event(), threading.Event()

    def message(self, message: Message) -> int:
        if self.hold in str(message.content) and not self.paused.is_set():
            self.paused.set()
            assert self.release.wait(10)
        return super().message(message)


def test_a_turn_recorded_after_two_racing_prepares_holds_its_own_messages(
        real_redis: redis.Redis, key_prefix: str) -> None:
    """Two requests of one session prepare at once, each with its own new user message; the
    first is paused while it counts its message (between the pending turn's fields), the
    second prepares whole, then records its turn: the log holds the second's message, not
    the first's (the pending turn's fields were updated in place by both: the record took
    its messages from one request and their stored JSON from the other)."""
    counter = GatedCounter(hold="first")
    store = SessionStore(real_redis, StoreConfig(key_prefix=key_prefix), counter=counter)
    guard = ContextGuard(store, overrides={"m": 1_000_000})
    guard.record_turn("s", [user("zero"), {"role": "assistant", "content": "a0"}])
    guard.prepare("s", SYSTEM, pending=[user("earlier")], **M)  # a turn in progress

    first = threading.Thread(target=guard.prepare, args=("s", SYSTEM),
                             kwargs={"pending": [user("first")], **M})
    first.start()
    assert counter.paused.wait(10)
    second = [user("second")]
    view = guard.prepare("s", SYSTEM, pending=second, **M)
    assert view.messages[-1].content == second[0]["content"]
    counter.release.set()
    first.join(10)
    guard.record_turn("s", [*second, {"role": "assistant", "content": "a2"}])

    stored = [str(m.content).split()[0] for m in store.messages("s")]
    assert stored == ["zero", "a0", "second", "a2"]


def test_racing_prepares_of_one_session_keep_a_consistent_pending_turn(
        fine_switching: None) -> None:
    """Threads passing different pending turns for one session at once: what the turn
    record gives back for a recording is each message with its own count and JSON."""
    counter = HeuristicCounter()
    turns = PendingTurns(counter, *ViewCache().pending())
    n, rounds = 4, 1500
    start, done = threading.Barrier(n), threading.Barrier(n)
    mixed: list[str] = []

    def check(given: list[dict[str, Any]]) -> None:
        known, counts, rows, _, _ = turns.recorded("s", given)
        for message in known:
            if message.content != given[0]["content"] \
                    or counts[id(message)] != counter.message(message) \
                    or rows[id(message)][0] != message.to_json_bytes():
                mixed.append(str(given[0]["content"])[:10])

    def agent(t: int) -> None:
        for k in range(rounds):
            given = [{"role": "user", "content": f"u{t}-{k} é " + "mot " * (40 * (t + 1))}]
            start.wait()
            turns.rows("s", given)
            done.wait()
            check(given)
            if done.wait() == 0:
                turns.forget("s")

    threads = [threading.Thread(target=agent, args=(t,)) for t in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert mixed == []


def fresh_guard(store: SessionStore) -> ContextGuard:
    """A guard that caches nothing and reads every call: what a view should be."""
    reader = SessionStore(store.redis, store.config, tenant=store.tenant, counter=store.counter)
    return ContextGuard(reader, overrides={"m": 1_000_000}, view_cache=ViewCache(0, 0),
                        watch_changes=False, warm_up=False)


def tagged_turn(tag: str) -> list[dict[str, Any]]:
    """A five-message tool-call turn whose every message names ``tag``; its call ids its
    own (an id a session used before is renamed as the guard's hints of the session's ids
    say: a guard of its own would send another name, as valid)."""
    return [{"role": "user", "content": f"{tag}: fix it é"},
            {"role": "assistant", "content": f"{tag}: reading", "tool_calls": [
                {"id": f"call_{tag}_1", "name": "read", "arguments": '{"p": 1}'}]},
            {"role": "tool", "tool_call_id": f"call_{tag}_1",
             "content": f"{tag}: " + "x = 1\n" * 40},
            {"role": "assistant", "content": f"{tag}: more", "tool_calls": [
                {"id": f"call_{tag}_2", "name": "bash", "arguments": '{"c": "pytest"}'}]},
            {"role": "tool", "tool_call_id": f"call_{tag}_2", "content": f"{tag}: 1 failed"}]


ROUNDS = 30
RENAMED = re.compile(r"-r(p\d+_|[0-9a-f]+)\d+$")


def unrenamed(wire: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A view's wire form with each call id as the provider gave it. Which ids a view
    renames is a hint of the guard's (:class:`shared.core.callids.KnownIds`, and the ids
    its pair scans saw: a turn prepared on a view another agent then extended sees its own
    ids as taken), either choice valid: a guard of its own may choose otherwise."""
    out = []
    for message in wire:
        message = dict(message)
        if message.get("tool_call_id"):
            message["tool_call_id"] = RENAMED.sub("", message["tool_call_id"])
        if message.get("tool_calls"):
            message["tool_calls"] = [{**c, "id": RENAMED.sub("", c["id"])}
                                     for c in message["tool_calls"]]
        out.append(message)
    return out


def test_threads_on_many_sessions_see_the_views_a_fresh_guard_builds(
        real_redis: redis.Redis, key_prefix: str, fine_switching: None) -> None:
    """Eight agents on sixteen sessions through one guard whose view cache holds four
    (every few calls an eviction races another thread's get or put), each turn a tool
    chain of prepares with its pending messages, and a worker committing summaries into
    the sessions meanwhile: every view is the one a guard that caches nothing builds
    from Redis at that point, and the log holds each turn once."""
    store = SessionStore(real_redis, StoreConfig(key_prefix=key_prefix))
    guard = ContextGuard(store, overrides={"m": 1_000_000},
                         view_cache=ViewCache(4, 2_000, pending_turns=6))
    sessions = [f"s{i}" for i in range(16)]
    locks = {sid: threading.Lock() for sid in sessions}  # no write between view and check
    stop = threading.Event()
    errors: list[BaseException] = []
    commits = [0]

    def agent(a: int) -> None:
        check = fresh_guard(store)
        try:
            for k in range(ROUNDS):
                sid = sessions[(3 * a + k) % 16]  # two agents on one session, now and then
                turn = tagged_turn(f"{sid}-{a}-{k}")
                for n in (1, 3, 5):
                    with locks[sid]:
                        view = guard.prepare(sid, SYSTEM, pending=turn[:n], **M)
                        want = check.prepare(sid, SYSTEM, pending=turn[:n], **M)
                    assert validate_view(list(view.messages), "openai") == []
                    assert unrenamed(view.openai()) == unrenamed(want.openai()), (sid, a, k, n)
                    assert view.report.length == want.report.length
                with locks[sid]:
                    guard.record_turn(sid, turn)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def worker() -> None:
        from shared.core.records import SummaryRecord

        while not stop.is_set():
            for sid in sessions:
                with locks[sid]:
                    state, length = store.state(sid), store.length(sid)
                    target = length - length % 5 - 5  # a turn boundary, the last turn kept
                    if target > state.watermark:
                        record = SummaryRecord(watermark=target, kind="llm",
                                               text=f"summary of {sid} up to {target}",
                                               tokens=12)
                        commits[0] += store.commit_summary(sid, record, state.version).ok

    agents = [threading.Thread(target=agent, args=(a,)) for a in range(8)]
    summarizer = threading.Thread(target=worker)
    for thread in [*agents, summarizer]:
        thread.start()
    for thread in agents:
        thread.join(300)
    stop.set()
    summarizer.join(60)
    assert not errors, errors[:3]
    assert commits[0] > 0
    users = [str(m.content) for sid in sessions for m in store.messages(sid)
             if m.role == "user"]
    assert sorted(users) == sorted(tagged_turn(f"{sessions[(3 * a + k) % 16]}-{a}-{k}")[0]
                                   ["content"] for a in range(8) for k in range(ROUNDS))
    for sid in sessions:
        assert unrenamed(guard.prepare(sid, SYSTEM, **M).openai()) == \
            unrenamed(fresh_guard(store).prepare(sid, SYSTEM, **M).openai())
