"""The view cache's bounds, alone and shared between scopes (a server's tenants)."""

from __future__ import annotations

import itertools
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.core.viewcache import ViewCache

_EPOCHS = itertools.count()


def entry(messages: int, *, epoch: str | None = None, gen: int = 0, version: int = 1,
          end: int = 0) -> Any:
    """A cached view as the cache sees it: its history's length, and where in the log it
    was read (a log of its own unless ``epoch`` is given)."""
    return SimpleNamespace(history=[None] * messages, epoch=epoch or f"e{next(_EPOCHS)}",
                           gen=gen, version=version, end=end)


def test_a_view_read_before_the_kept_one_does_not_replace_it() -> None:
    """Two requests of one session finishing out of order (a threaded server): the
    prepare that read before the other's append puts its view last."""
    cache = ViewCache(8, 100)
    appended = entry(3, epoch="e", version=4, end=12)
    cache.put("s", appended)
    for older in (entry(2, epoch="e", version=4, end=10), entry(3, epoch="e", version=3, end=12),
                  entry(2, epoch="e", version=3, end=10)):
        cache.put("s", older)
        assert cache.get("s") is appended and cache.messages == 3
    for newer in (entry(3, epoch="e", version=4, end=12),  # the same read: its later plan
                  entry(4, epoch="e", version=5, end=12),  # a summary landed
                  entry(1, epoch="e", gen=1, version=6, end=8),  # an edit cut the log
                  entry(1, epoch="f", version=1, end=2),  # deleted, then a new session
                  entry(2, epoch="f", version=2, end=1)):  # not behind on both: kept
        cache.put("s", newer)
        assert cache.get("s") is newer and cache.messages == len(newer.history)
    cache.discard("s")
    assert cache.get("s") is None and cache.messages == 0


def test_scopes_keep_the_same_session_id_apart() -> None:
    cache = ViewCache(8, 100)
    alpha, beta = cache.scoped("alpha"), cache.scoped("beta")
    a, b = entry(3), entry(4)
    alpha.put("s1", a)
    beta.put("s1", b)
    assert alpha.get("s1") is a and beta.get("s1") is b
    assert cache.get("s1") is None  # the unscoped cache is a scope of its own
    beta.discard("s1")
    assert alpha.get("s1") is a and beta.get("s1") is None
    assert len(cache) == 1 and cache.messages == 3


def test_scopes_share_one_bound_and_one_order() -> None:
    cache = ViewCache(max_sessions=2, max_messages=10)
    alpha, beta = cache.scoped("alpha"), cache.scoped("beta")
    alpha.put("s1", entry(2))
    beta.put("s1", entry(2))
    alpha.get("s1")  # used last: beta's leaves first
    beta.put("s2", entry(2))
    assert alpha.get("s1") is not None and beta.get("s1") is None
    assert len(alpha) == len(beta) == 2 and alpha.max_sessions == beta.max_sessions == 2
    alpha.put("s3", entry(7))  # 11 messages in all: the oldest goes
    assert beta.get("s2") is None and cache.messages == 9


def test_a_scope_needs_a_name() -> None:
    with pytest.raises(ValueError, match="needs a name"):
        ViewCache().scoped("")


OPS = st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from(["s1", "s2", "s3"]),
                         st.one_of(st.none(), st.integers(0, 12))), max_size=60)


@settings(max_examples=300, deadline=None)
@given(ops=OPS, max_sessions=st.integers(0, 4), max_messages=st.integers(0, 20))
def test_the_bounds_hold_across_scopes_and_a_kept_view_is_the_last_put(
        ops: list[tuple[str, str, int | None]], max_sessions: int, max_messages: int) -> None:
    cache = ViewCache(max_sessions, max_messages)
    scopes = {name: cache.scoped(name) for name in "abc"}
    last: dict[tuple[str, str], Any] = {}
    for scope, sid, size in ops:
        put = None if size is None else entry(size)
        scopes[scope].put(sid, put)
        last[scope, sid] = put
        assert len(cache) <= max_sessions and cache.messages <= max_messages
    kept = [(scope, sid) for (scope, sid) in last if scopes[scope].get(sid) is not None]
    for scope, sid in kept:
        assert scopes[scope].get(sid) is last[scope, sid]  # never another scope's
    assert len(cache) == len(kept)
    assert cache.messages == sum(len(scopes[s].get(i).history) for s, i in kept)


def test_the_id_hints_of_a_scope_are_its_own_and_bounded_with_the_cache() -> None:
    from shared.core.callids import Claims

    cache = ViewCache(max_sessions=2)
    alpha, beta = cache.scoped("alpha").known_ids(), cache.scoped("beta").known_ids()
    alpha.learn("s1", Claims(calls=(("c1", "c1-alpha"),)))
    beta.learn("s1", Claims(calls=(("c1", "c1-beta"),)))
    assert alpha.of("s1", ["c1"]) == {"c1": "c1-alpha"}
    assert beta.of("s1", ["c1"]) == {"c1": "c1-beta"}
    assert cache.known_ids().of("s1", ["c1"]) == {}  # the unscoped cache: a scope of its own
    beta.learn("s2", Claims(calls=(("c2", "c2"),)))  # a third session: the oldest goes
    assert alpha.of("s1", ["c1"]) == {} and beta.of("s2", ["c2"]) == {"c2": "c2"}
