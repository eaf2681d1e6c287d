"""A thread-safe LRU map bounded twice: by entries and by the sizes its entries declare.

The guard keeps per-session state between calls (a turn's validated messages, say)
for sessions it may never hear from again: an agent that stopped mid-turn leaves
its turn behind. A bound on entries alone lets a few huge entries hold gigabytes,
so each entry states a size (messages, usually) and the total is bounded too.
:meth:`BoundedLRU.scoped` gives several namespaces (a server's tenants) one bound
between them, each namespace's keys its own.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

V = TypeVar("V")


@dataclass(slots=True)
class _Book(Generic[V]):
    """What the scopes of one map share."""

    max_entries: int
    max_size: int
    entries: OrderedDict[Hashable, tuple[V, int]] = field(default_factory=OrderedDict)
    size: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class BoundedLRU(Generic[V]):
    """At most ``max_entries`` entries and ``max_size`` in all (an entry larger than
    that is not kept); least recently used out first."""

    __slots__ = ("_book", "_scope")

    def __init__(self, max_entries: int, max_size: int) -> None:
        if max_entries < 0 or max_size < 0:
            raise ValueError("the bounds of a BoundedLRU cannot be negative")
        self._book: _Book[V] = _Book(max_entries, max_size)
        self._scope = ""

    def scoped(self, scope: str) -> BoundedLRU[V]:
        """This map as one namespace sees it: its keys its own, bounds and order shared."""
        if not scope:
            raise ValueError("a scope of a BoundedLRU needs a name")
        view: BoundedLRU[V] = BoundedLRU.__new__(BoundedLRU)
        view._book, view._scope = self._book, scope
        return view

    def _key(self, key: str) -> Hashable:
        return (self._scope, key) if self._scope else key

    def get(self, key: str) -> V | None:
        """The entry (now the most recently used), or None."""
        book, k = self._book, self._key(key)
        with book.lock:
            found = book.entries.get(k)
            if found is None:
                return None
            book.entries.move_to_end(k)
            return found[0]

    def peek(self, key: str) -> V | None:
        """The entry, leaving the order as it is."""
        found = self._book.entries.get(self._key(key))
        return None if found is None else found[0]

    def put(self, key: str, value: V, size: int = 1) -> bool:
        """Keep ``value`` (replacing any entry of ``key``) as the most recently used;
        False when it is larger than the whole bound and so not kept."""
        book, k = self._book, self._key(key)
        with book.lock:
            old = book.entries.pop(k, None)
            if old is not None:
                book.size -= old[1]
            if size > book.max_size or not book.max_entries:
                return False
            book.entries[k] = (value, size)
            book.size += size
            while len(book.entries) > book.max_entries or book.size > book.max_size:
                _, (_, evicted) = book.entries.popitem(last=False)
                book.size -= evicted
            return True

    def pop(self, key: str) -> V | None:
        book = self._book
        with book.lock:
            found = book.entries.pop(self._key(key), None)
            if found is None:
                return None
            book.size -= found[1]
            return found[0]

    @property
    def max_entries(self) -> int:
        return self._book.max_entries

    @property
    def max_size(self) -> int:
        return self._book.max_size

    @property
    def size(self) -> int:
        """The sizes of every scope's entries, summed."""
        return self._book.size

    def __len__(self) -> int:
        """Entries of every scope."""
        return len(self._book.entries)


__all__ = ["BoundedLRU"]
