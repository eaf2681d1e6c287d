"""One sync guard shared by many threads (a gthread server, a pool of agents), on a real
Redis: different sessions at once, two requests of one session racing, a worker's
summaries landing meanwhile, the caches at their bounds."""

from __future__ import annotations

import re
import sys
import threading
import traceback
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
    assert not errors, "".join("".join(traceback.format_exception(e)) for e in errors[:3])
    assert commits[0] > 0
    users = [str(m.content) for sid in sessions for m in store.messages(sid)
             if m.role == "user"]
    assert sorted(users) == sorted(tagged_turn(f"{sessions[(3 * a + k) % 16]}-{a}-{k}")[0]
                                   ["content"] for a in range(8) for k in range(ROUNDS))
    for sid in sessions:
        assert unrenamed(guard.prepare(sid, SYSTEM, **M).openai()) == \
            unrenamed(fresh_guard(store).prepare(sid, SYSTEM, **M).openai())


def test_threads_racing_on_one_session_keep_the_log_and_the_cache_right(
        real_redis: redis.Redis, key_prefix: str, fine_switching: None) -> None:
    """Four requests of one session at once, each a tool chain of prepares with its own
    pending turn, then its record, while a worker commits summaries: each turn stored
    once and whole (its five messages together, none of another turn's), each view valid
    and holding its own pending messages, and afterwards the guard's view and cached
    entry are what Redis holds."""
    from shared.core.records import SummaryRecord
    from tests.test_own_writes import assert_cached_is_fresh

    store = SessionStore(real_redis, StoreConfig(key_prefix=key_prefix))
    guard = ContextGuard(store, overrides={"m": 1_000_000})
    n, rounds = 4, 25
    stop = threading.Event()
    errors: list[BaseException] = []

    def agent(a: int) -> None:
        try:
            for k in range(rounds):
                turn = tagged_turn(f"t{a}-{k}")
                for size in (1, 3, 5):
                    view = guard.prepare("s", SYSTEM, pending=turn[:size], **M)
                    assert validate_view(list(view.messages), "openai") == []
                    assert [m.content for m in view.messages[-size:]] == \
                        [m["content"] for m in turn[:size]]
                guard.record_turn("s", turn)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def worker() -> None:
        while not stop.is_set():
            state, length = store.state("s"), store.length("s")
            target = length - length % 5 - 10
            if target > state.watermark:
                store.commit_summary("s", SummaryRecord(
                    watermark=target, kind="llm", text=f"up to {target}", tokens=9),
                    state.version)

    threads = [threading.Thread(target=agent, args=(a,)) for a in range(n)]
    summarizer = threading.Thread(target=worker)
    for thread in [*threads, summarizer]:
        thread.start()
    for thread in threads:
        thread.join(300)
    stop.set()
    summarizer.join(60)
    assert not errors, "".join("".join(traceback.format_exception(e)) for e in errors[:3])
    log = [str(m.content).split(":")[0] for m in store.messages("s")]
    turns = [log[i:i + 5] for i in range(0, len(log), 5)]
    assert all(len(set(t)) == 1 for t in turns), [t for t in turns if len(set(t)) > 1][:3]
    assert sorted(t[0] for t in turns) == sorted(f"t{a}-{k}" for a in range(n)
                                                 for k in range(rounds))
    assert store.state("s").watermark > 0
    assert unrenamed(guard.prepare("s", SYSTEM, **M).openai()) == \
        unrenamed(fresh_guard(store).prepare("s", SYSTEM, **M).openai())
    assert_cached_is_fresh(guard, store)


def test_threads_sharing_the_own_connection_and_the_feed_each_read_their_own_replies(
        real_redis: redis.Redis, key_prefix: str, fine_switching: None) -> None:
    """The guard's own connections used by eight threads at once (each with its keys,
    written meanwhile by another client so that pushes arrive): every batch that ran on
    the own-writes connection got its own replies, in order (a reply read by the wrong
    thread would show another thread's value), the others were refused (busy: the
    caller uses the store), and the change feed answered every check."""
    from shared.store.changes import ChangeFeed, feed_for
    from shared.store.own_writes_sync import OwnWrites

    kwargs = real_redis.connection_pool.connection_kwargs
    own = OwnWrites(kwargs, probe_key=f"{key_prefix}:")
    feed = feed_for(real_redis, f"{key_prefix}:{{")
    assert isinstance(feed, ChangeFeed)
    ran, wrong = [0], []
    stop = threading.Event()

    def thread(t: int) -> None:
        base = f"{key_prefix}:{{t{t}}}"
        for k in range(300):
            value = f"{t}-{k}"
            done = own.run_many(base, [("SET", f"{base}:v", value), ("GET", f"{base}:v"),
                                       ("ECHO", value)])
            if done is not None:
                ran[0] += 1
                got = [r.decode() if isinstance(r, bytes) else r for r in done[0]]
                if got != ["OK", value, value]:
                    wrong.append((value, got))
            mark = feed.mark()
            if mark is None or feed.tally(base) is None:
                wrong.append((value, "feed could not vouch"))

    def writer() -> None:
        other = redis.Redis(host=kwargs.get("host", "127.0.0.1"), port=kwargs.get("port", 6379),
                            db=kwargs.get("db", 0))
        while not stop.is_set():
            for t in range(8):
                other.set(f"{key_prefix}:{{t{t}}}:log", "x")

    threads = [threading.Thread(target=thread, args=(t,)) for t in range(8)]
    noise = threading.Thread(target=writer)
    for th in [*threads, noise]:
        th.start()
    for th in threads:
        th.join(120)
    stop.set()
    noise.join(10)
    own.close()
    feed.close()
    assert wrong == []
    assert ran[0] > 0
    print(f"own-writes batches run: {ran[0]} of 2400 (the others found it busy)")


def test_bounded_caches_keep_their_books_under_threads(fine_switching: None) -> None:
    """Threads getting, putting and dropping entries of one view cache and one bounded
    map at their bounds (an eviction on every put): the totals they keep are the sums of
    what they hold, within the bounds, and every entry read is the one put for its key."""
    from types import SimpleNamespace

    from shared.core.boundedlru import BoundedLRU

    lru: BoundedLRU[str] = BoundedLRU(8, 40)
    views = ViewCache(6, 30)
    wrong: list[Any] = []

    def thread(t: int) -> None:
        for k in range(3000):
            key = f"k{(t * 7 + k) % 13}"
            lru.put(key, key, size=k % 9)
            got = lru.get(f"k{k % 13}")
            if got is not None and got != f"k{k % 13}":
                wrong.append(got)
            if k % 5 == 0:
                lru.pop(key)
            views.put(key, SimpleNamespace(epoch=object(), gen=0, version=0, end=0, key=key,
                                            history=[None] * (k % 7)))  # type: ignore[arg-type]
            seen = views.get(f"k{k % 13}")
            if seen is not None and seen.key != f"k{k % 13}":
                wrong.append(seen.key)

    threads = [threading.Thread(target=thread, args=(t,)) for t in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert wrong == []
    book = lru._book
    assert book.size == sum(size for _, size in book.entries.values()) <= 40
    assert len(book.entries) <= 8
    shelf = views._shelf
    assert shelf.messages == sum(len(v.history) for v in shelf.entries.values()) <= 30
    assert len(shelf.entries) <= 6
