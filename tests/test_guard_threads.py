"""One sync guard shared by many threads (a gthread server, a pool of agents), on a real
Redis: different sessions at once, two requests of one session racing, a worker's
summaries landing meanwhile, the caches at their bounds."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from shared.core.config import StoreConfig
from shared.core.messages import Message
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
