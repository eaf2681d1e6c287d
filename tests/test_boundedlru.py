"""The LRU map bounded by entries and by declared sizes, alone and shared between scopes."""

from __future__ import annotations

from collections import OrderedDict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.core.boundedlru import BoundedLRU


def test_the_least_recently_used_leaves_first_by_entries_and_by_size() -> None:
    lru: BoundedLRU[str] = BoundedLRU(max_entries=2, max_size=10)
    lru.put("a", "A", 3)
    lru.put("b", "B", 3)
    assert lru.get("a") == "A"  # now b is the oldest
    lru.put("c", "C", 3)
    assert lru.peek("b") is None and len(lru) == 2 and lru.size == 6
    lru.put("c", "C2", 8)  # replaced, 11 in all: a goes
    assert lru.peek("a") is None and lru.peek("c") == "C2" and lru.size == 8


def test_an_entry_larger_than_the_bound_is_not_kept_and_replaces_nothing_it_cannot() -> None:
    lru: BoundedLRU[str] = BoundedLRU(max_entries=4, max_size=5)
    lru.put("a", "A", 2)
    assert lru.put("a", "huge", 6) is False
    assert lru.peek("a") is None and lru.size == 0  # the old entry of that key is gone too
    assert BoundedLRU[str](0, 10).put("a", "A", 1) is False


def test_peek_leaves_the_order_and_pop_gives_the_size_back() -> None:
    lru: BoundedLRU[str] = BoundedLRU(max_entries=2, max_size=100)
    lru.put("a", "A", 1)
    lru.put("b", "B", 1)
    assert lru.peek("a") == "A"  # still the oldest
    lru.put("c", "C", 1)
    assert lru.peek("a") is None
    assert lru.pop("b") == "B" and lru.pop("b") is None and lru.size == 1


def test_scopes_keep_keys_apart_and_share_the_bound() -> None:
    lru: BoundedLRU[str] = BoundedLRU(max_entries=2, max_size=100)
    alpha, beta = lru.scoped("alpha"), lru.scoped("beta")
    alpha.put("s", "a")
    beta.put("s", "b")
    assert alpha.get("s") == "a" and beta.get("s") == "b" and lru.get("s") is None
    lru.put("s", "plain")  # a third namespace: alpha's entry, the oldest, leaves
    assert alpha.peek("s") is None and len(beta) == 2


def test_bad_bounds_and_nameless_scopes_are_refused() -> None:
    with pytest.raises(ValueError, match="negative"):
        BoundedLRU[str](-1, 10)
    with pytest.raises(ValueError, match="needs a name"):
        BoundedLRU[str](1, 1).scoped("")


OPS = st.lists(st.tuples(st.sampled_from(["put", "get", "pop"]), st.sampled_from("abc"),
                         st.sampled_from(["k1", "k2", "k3"]), st.integers(0, 9)), max_size=80)


@settings(max_examples=300, deadline=None)
@given(ops=OPS, max_entries=st.integers(0, 4), max_size=st.integers(0, 15))
def test_it_behaves_as_a_reference_lru(ops: list[tuple[str, str, str, int]], max_entries: int,
                                       max_size: int) -> None:
    lru: BoundedLRU[int] = BoundedLRU(max_entries, max_size)
    scopes = {name: lru.scoped(name) for name in "abc"}
    model: OrderedDict[tuple[str, str], tuple[int, int]] = OrderedDict()
    for n, (op, scope, key, size) in enumerate(ops):
        k = (scope, key)
        if op == "put":
            model.pop(k, None)
            if size <= max_size and max_entries:
                model[k] = (n, size)
                while len(model) > max_entries or sum(s for _, s in model.values()) > max_size:
                    model.popitem(last=False)
            scopes[scope].put(key, n, size)
        elif op == "get":
            expected = model.get(k)
            if expected is not None:
                model.move_to_end(k)
            assert scopes[scope].get(key) == (None if expected is None else expected[0])
        else:
            expected = model.pop(k, None)
            assert scopes[scope].pop(key) == (None if expected is None else expected[0])
        assert len(lru) == len(model) <= max_entries
        assert lru.size == sum(s for _, s in model.values()) <= max_size
