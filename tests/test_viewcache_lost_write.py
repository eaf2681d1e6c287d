"""A warm guard whose cached view holds a turn a failover lost reads the stored one.

Replication is asynchronous: a replica promoted after a failover may lack an append the
old master acknowledged. When another writer then appends a batch of exactly the same
token count, the log has the guard's length and running total again, but not its turn.
The lost write is made here as a replica that never got it would hold the session: every
key of the session put back as it was before the append (DUMP / RESTORE), on a real Redis.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

from shared.core.config import StoreConfig
from shared.store.sessions import SessionStore
from tests.guard_shells import SHELLS, make
from tests.test_guard import SYSTEM

GO = [{"role": "user", "content": "go on"}]
MODEL = {"m": 1_000_000}


def _turn(word: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"Please pick the {word} one."},
            {"role": "assistant", "content": f"I picked the {word} one."}]


@pytest.fixture
def stores(real_redis: redis.Redis, redis_url: str,
           key_prefix: str) -> Iterator[tuple[SessionStore, SessionStore]]:
    """The guard's store and another writer's, each with a client of its own."""
    other = redis.Redis.from_url(redis_url, socket_timeout=5)
    config = StoreConfig(key_prefix=key_prefix)
    yield SessionStore(real_redis, config), SessionStore(other, config)
    other.close()


def _snapshot(client: redis.Redis, prefix: str) -> dict[bytes, tuple[bytes, int]]:
    """Every key of the test's sessions, dumped with its TTL (what a replica holds)."""
    return {key: (client.dump(key), max(client.pttl(key), 0))
            for key in client.scan_iter(match=f"{prefix}:*")}


def _lose_writes_since(client: redis.Redis, prefix: str,
                       kept: dict[bytes, tuple[bytes, int]]) -> None:
    """The keys as a promoted replica that never got the writes since ``kept`` has them."""
    for key in client.scan_iter(match=f"{prefix}:*"):
        if key not in kept:
            client.delete(key)
    for key, (dumped, ttl) in kept.items():
        client.restore(key, ttl, dumped, replace=True)


def _contents(view: Any) -> list[str]:
    return [m["content"] for m in view.openai() if isinstance(m.get("content"), str)]


def _cold(shell_name: str, store: SessionStore) -> list[str]:
    return _contents(make(shell_name, store, overrides=MODEL).prepare(
        "s", SYSTEM, model="m", pending=GO))


def _lost_and_replaced(shell_name: str, store: SessionStore, other: SessionStore,
                       replacement: list[dict[str, Any]]) -> Any:
    """A warm guard whose acknowledged turn ("apple") is lost, then ``replacement``
    appended by another writer; returns the guard."""
    client, prefix = store.redis, store.config.key_prefix
    guard = make(shell_name, store, overrides=MODEL)
    guard.record_turn("s", _turn("first"))
    guard.prepare("s", SYSTEM, model="m", pending=GO)
    kept = _snapshot(client, prefix)
    guard.record_turn("s", _turn("apple"))  # acknowledged: the guard's cache holds it
    assert "I picked the apple one." in _contents(
        guard.prepare("s", SYSTEM, model="m", pending=GO))
    cum = store.keys("s").cum
    total, length = client.lindex(cum, -1), client.llen(cum)
    _lose_writes_since(client, prefix, kept)
    assert client.llen(cum) == length - 2
    other.append("s", replacement)
    if replacement[1]["content"] != "I picked the apple one.":
        assert client.lindex(cum, length - 1) == total  # the same running total there
    return guard


@pytest.mark.parametrize("shell_name", SHELLS)
def test_a_lost_turn_replaced_by_a_batch_of_its_token_count_is_read_again(
        shell_name: str, stores: tuple[SessionStore, SessionStore]) -> None:
    store, other = stores
    guard = _lost_and_replaced(shell_name, store, other, _turn("grape"))
    assert store.length("s") == guard.views.get("s").end  # the guard's length too
    got = _contents(guard.prepare("s", SYSTEM, model="m", pending=GO))
    assert "I picked the grape one." in got and "I picked the apple one." not in got
    assert got == _cold(shell_name, store)


@pytest.mark.parametrize("shell_name", SHELLS)
def test_the_guards_next_append_does_not_vouch_for_the_lost_turn(
        shell_name: str, stores: tuple[SessionStore, SessionStore]) -> None:
    store, other = stores
    guard = _lost_and_replaced(shell_name, store, other, _turn("grape"))
    guard.record_turn("s", _turn("third"))  # its reply: the log ended at the guard's total
    got = _contents(guard.prepare("s", SYSTEM, model="m", pending=GO))
    assert "I picked the grape one." in got and "I picked the apple one." not in got
    assert got == _cold(shell_name, store)


@pytest.mark.parametrize("shell_name", SHELLS)
def test_more_appends_after_the_replacement_are_read_with_it(
        shell_name: str, stores: tuple[SessionStore, SessionStore]) -> None:
    store, other = stores
    guard = _lost_and_replaced(shell_name, store, other, _turn("grape"))
    other.append("s", _turn("later"))  # the log now runs past the guard's end
    got = _contents(guard.prepare("s", SYSTEM, model="m", pending=GO))
    assert "I picked the grape one." in got and "I picked the apple one." not in got
    assert got == _cold(shell_name, store)


@pytest.mark.parametrize("shell_name", SHELLS)
def test_a_longer_replacement_batch_is_read_with_what_it_replaced(
        shell_name: str, stores: tuple[SessionStore, SessionStore]) -> None:
    """One batch: a turn of the lost one's token count, then more (the log runs past the
    guard's end, with the guard's running total at it)."""
    store, other = stores
    guard = _lost_and_replaced(shell_name, store, other,
                               [*_turn("grape"), {"role": "user", "content": "And now?"}])
    got = _contents(guard.prepare("s", SYSTEM, model="m", pending=GO))
    assert "I picked the grape one." in got and "I picked the apple one." not in got
    assert got == _cold(shell_name, store)


def _read_sizes(shell_name: str, guard: Any) -> list[int]:
    """How many messages each later store read of ``guard`` brings back."""
    inner = guard.inner.store if shell_name == "async" else guard.store
    sizes: list[int] = []
    original = inner.read_view

    if shell_name == "async":
        async def read_view(*args: Any, **kwargs: Any) -> Any:
            raw = await original(*args, **kwargs)
            sizes.append(len(raw.messages))
            return raw
    else:
        def read_view(*args: Any, **kwargs: Any) -> Any:
            raw = original(*args, **kwargs)
            sizes.append(len(raw.messages))
            return raw
    inner.read_view = read_view
    return sizes


@pytest.mark.parametrize("shell_name", SHELLS)
def test_a_byte_identical_replacement_followed_by_more_keeps_the_cached_view(
        shell_name: str, stores: tuple[SessionStore, SessionStore]) -> None:
    """The same turn appended again (an agent's retry after the failover), then another:
    the entry that ends the guard's view is what it holds, and its view continues with
    an incremental read of the turn after it."""
    store, other = stores
    guard = _lost_and_replaced(shell_name, store, other, _turn("apple"))
    other.append("s", _turn("later"))
    sizes = _read_sizes(shell_name, guard)
    got = _contents(guard.prepare("s", SYSTEM, model="m", pending=GO))
    assert sizes == [2]  # only the turn after it: the cached view continued
    assert got == _cold(shell_name, store)


@pytest.mark.parametrize("shell_name", SHELLS)
def test_a_byte_identical_replacement_alone_is_read_again(
        shell_name: str, stores: tuple[SessionStore, SessionStore]) -> None:
    """Nothing appended after it: another append's token ends the log, which is enough
    to read the view again (its earlier messages could differ at the same total)."""
    store, other = stores
    guard = _lost_and_replaced(shell_name, store, other, _turn("apple"))
    sizes = _read_sizes(shell_name, guard)
    got = _contents(guard.prepare("s", SYSTEM, model="m", pending=GO))
    assert sizes == [store.length("s")]  # read whole
    assert got == _cold(shell_name, store)
