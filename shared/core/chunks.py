"""A persistent list: immutable, shared between versions, cheap at both ends.

The guard keeps each session's view (messages, and their wire form) as a
:class:`Chunks`: a tuple of immutable chunks. Appending copies at most one
chunk (``CHUNK`` items) plus what is appended; dropping a prefix (a summary
moved the watermark) copies at most one chunk and re-uses the rest;
replacing one item (a cheap-stage placeholder) copies one chunk. Old and new
versions share every untouched chunk, so a view handed to a caller stays
valid (and unchanged) whatever happens to the session next.

Indexing is O(log chunks) (bisect over the chunk offsets); iteration is a
plain walk. Slices return a list (callers index and compare them).
"""

from __future__ import annotations

import bisect
import itertools
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")
CHUNK = 512
_DECODE_LOCK = threading.Lock()


class Lazy(Sequence[T], Generic[T]):
    """One chunk whose items are decoded on first access, all at once, then kept.

    ``raw`` holds the stored form of each item (``bytes``: the stored JSON)
    or an item already decoded (a placeholder put in by ``replace``);
    ``decode`` turns the raw tuple into items. Until something reads it, a
    chunk holds only ``bytes``, which the garbage collector does not track.
    Decoded once under a lock, so an item's identity is stable (the guard's
    known-counts map is keyed by it).
    """

    __slots__ = ("_decoded", "decode", "raw")

    def __init__(self, raw: tuple[Any, ...], decode: Callable[[tuple[Any, ...]], tuple[T, ...]],
                 decoded: tuple[T, ...] | None = None) -> None:
        self.raw, self.decode, self._decoded = raw, decode, decoded

    @property
    def decoded(self) -> bool:
        return self._decoded is not None

    def items(self) -> tuple[T, ...]:
        found = self._decoded
        if found is None:
            with _DECODE_LOCK:
                if self._decoded is None:
                    self._decoded = self.decode(self.raw)
                found = self._decoded
        return found

    def __len__(self) -> int:
        return len(self.raw)

    def __iter__(self) -> Iterator[T]:
        return iter(self.items())

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> Lazy[T]: ...

    def __getitem__(self, index: int | slice) -> T | Lazy[T]:
        if isinstance(index, slice):
            found = self._decoded
            return Lazy(self.raw[index], self.decode, None if found is None else found[index])
        return self.items()[index]

    def __add__(self, other: Sequence[Any]) -> Lazy[T]:
        """The chunk followed by ``other`` (raw items, or items already decoded)."""
        return self.joined(other)

    def joined(self, other: Sequence[Any], decoded: Sequence[T] | None = None) -> Lazy[T]:
        """``self + other``; ``decoded``: ``other``'s items as decoded already, item for item
        (used only if this chunk was read: its new items are then needed decoded)."""
        extra = other.raw if isinstance(other, Lazy) else tuple(other)
        found = self._decoded  # already read: decode the (few) new items now, keep identities
        if found is not None:
            found += tuple(decoded) if decoded is not None else self.decode(extra)
        return Lazy(self.raw + extra, self.decode, found)

    def __repr__(self) -> str:
        return f"Lazy({len(self.raw)} items, decoded={self.decoded})"


class Peeked(Sequence[T], Generic[T]):
    """``chunks`` indexed with :meth:`Chunks.peek` (iterating reads every chunk as usual)."""

    __slots__ = ("chunks",)
    slices_peeked = False  # slices read chunks as usual (see PeekedSlices)

    def __init__(self, chunks: Chunks[T]) -> None:
        self.chunks = chunks

    def __len__(self) -> int:
        return len(self.chunks)

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> list[T]: ...

    def __getitem__(self, index: int | slice) -> T | list[T]:
        if isinstance(index, slice):
            if self.slices_peeked:
                start, stop, step = index.indices(len(self.chunks))
                if step == 1:
                    return self.chunks.peek_range(start, stop)
            return self.chunks[index]
        return self.chunks.peek(index if index >= 0 else index + len(self.chunks))


class PeekedSlices(Peeked[T]):
    """``chunks`` sliced with :meth:`Chunks.peek_range` too: a reader of a few short runs of
    a long view (a fold joining the groups around a placeholder again) decodes those runs
    alone, not their chunks."""

    __slots__ = ()
    slices_peeked = True


class Chunks(Sequence[T], Generic[T]):
    """An immutable sequence of items stored in shared chunks."""

    __slots__ = ("_chunks", "_len", "_offsets")

    def __init__(self, chunks: tuple[Sequence[T], ...] = ()) -> None:
        self._chunks = tuple(c for c in chunks if c)
        self._offsets = list(itertools.accumulate((len(c) for c in self._chunks), initial=0))
        self._len = self._offsets[-1]

    @classmethod
    def _joined(cls, head: tuple[Sequence[T], ...], offsets: list[int],
                tail: Iterable[Sequence[T]]) -> Chunks[T]:
        """``head`` (non-empty chunks starting at ``offsets``, which ends at their total)
        followed by ``tail``: the head's offsets are copied, not re-measured (a chunk's
        length is a Python call for a lazy one; a long view has hundreds of chunks)."""
        new = cls.__new__(cls)
        chunks, at = list(head), offsets.copy()
        total = at[-1]
        for chunk in tail:
            if chunk:
                total += len(chunk)
                chunks.append(chunk)
                at.append(total)
        new._chunks, new._offsets, new._len = tuple(chunks), at, total
        return new

    @classmethod
    def of(cls, items: Iterable[T]) -> Chunks[T]:
        flat = tuple(items)
        return cls(tuple(flat[i:i + CHUNK] for i in range(0, len(flat), CHUNK)))

    @classmethod
    def lazy(cls, raw: Sequence[Any],
             decode: Callable[[tuple[Any, ...]], tuple[T, ...]]) -> Chunks[T]:
        """Items kept in their stored form (``raw``) and decoded a chunk at a time, when read."""
        flat = tuple(raw)
        return cls(tuple(Lazy(flat[i:i + CHUNK], decode) for i in range(0, len(flat), CHUNK)))

    @property
    def chunks(self) -> tuple[Sequence[T], ...]:
        return self._chunks

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[T]:
        for chunk in self._chunks:
            yield from chunk

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> list[T]: ...

    def __getitem__(self, index: int | slice) -> T | list[T]:
        if isinstance(index, slice):
            start, stop, step = index.indices(self._len)
            if step != 1:
                return list(self)[index]
            return list(itertools.islice(self._from(start), max(0, stop - start)))
        if index < 0:
            index += self._len
        if not 0 <= index < self._len:
            raise IndexError("Chunks index out of range")
        at = bisect.bisect_right(self._offsets, index) - 1
        return self._chunks[at][index - self._offsets[at]]

    def peek(self, index: int) -> T:
        """``self[index]``, made alone where its chunk was not read yet (and not kept): a
        caller that reads a few items of a long cold view decodes no chunk for them."""
        if not 0 <= index < self._len:
            raise IndexError("Chunks index out of range")
        at = bisect.bisect_right(self._offsets, index) - 1
        chunk, offset = self._chunks[at], index - self._offsets[at]
        if isinstance(chunk, Lazy) and not chunk.decoded:
            made: T = chunk.decode((chunk.raw[offset],))[0]
            return made
        return chunk[offset]

    def peek_range(self, start: int, stop: int) -> list[T]:
        """``self[start:stop]``, the items of chunks not read yet made for this call alone
        (those chunks stay unread, as :meth:`peek`)."""
        stop = min(stop, self._len)
        out: list[T] = []
        at = bisect.bisect_right(self._offsets, start) - 1
        while start < stop:
            chunk, base = self._chunks[at], self._offsets[at]
            a, b = start - base, min(stop - base, len(chunk))
            if isinstance(chunk, Lazy) and not chunk.decoded:
                out.extend(chunk.decode(chunk.raw[a:b]))
            else:
                out.extend(chunk[a:b])
            start, at = base + b, at + 1
        return out

    def _from(self, start: int) -> Iterator[T]:
        if start >= self._len:
            return
        at = bisect.bisect_right(self._offsets, start) - 1
        first = self._chunks[at]
        if isinstance(first, Lazy):  # decode the shared chunk (kept), not a throwaway slice
            first = first.items()
        yield from first[start - self._offsets[at]:]
        for chunk in self._chunks[at + 1:]:
            yield from chunk

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(other) == self._len and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Chunks({list(self)!r})"

    def extend(self, items: Sequence[T]) -> Chunks[T]:
        """A new list with ``items`` at the end; copies at most one chunk plus ``items``."""
        if not items:
            return self
        head = self._chunks
        tail: Sequence[T] = ()
        if head and len(head[-1]) < CHUNK:
            head, tail = head[:-1], head[-1]
        flat: Sequence[T] = (tail + items if isinstance(tail, Lazy)
                             else tuple(tail) + tuple(items))
        return Chunks._joined(head, self._offsets[:len(head) + 1],
                              (flat[i:i + CHUNK] for i in range(0, len(flat), CHUNK)))

    def plus(self, items: Sequence[T]) -> Chunks[T]:
        """``concat(self, items)``: ``items`` one chunk of their own after this list's,
        whose chunks and offsets are copied at C speed, not walked (a view's pending turn
        after its cached history, on every call of a tool chain)."""
        if not items:
            return self
        return Chunks._joined(self._chunks, self._offsets, (tuple(items),))

    def extend_lazy(self, raw: Sequence[Any],
                    decode: Callable[[tuple[Any, ...]], tuple[T, ...]],
                    decoded: Sequence[T] | None = None) -> Chunks[T]:
        """:meth:`extend` with items in their stored form, decoded when read (see :meth:`lazy`).

        ``raw`` may mix stored items and decoded ones; ``decoded``: all of them decoded
        already, item for item (what the caller holds), kept where the last chunk was read
        instead of decoding them again."""
        if not raw:
            return self
        head = self._chunks
        tail = head[-1] if head and len(head[-1]) < CHUNK else None
        if decoded is not None and len(decoded) != len(raw):
            decoded = None
        if isinstance(tail, Lazy) and not tail.decoded and decoded is not None:
            # Items the caller holds decoded go in a chunk of their own: joined to a chunk
            # nobody read, their models would be dropped and made again, with that whole
            # chunk, by the first read of it (a truncation reads every message).
            tail = None
        if tail is None:
            flat: Lazy[T] = Lazy(tuple(raw), decode,
                                 tuple(decoded) if decoded is not None else None)
        else:
            head = head[:-1]
            if isinstance(tail, Lazy):
                flat = tail.joined(raw, decoded)
            else:  # items already decoded (a replaced chunk): with the new ones if held
                items = tuple(tail)
                flat = Lazy(items + tuple(raw), decode,
                            items + tuple(decoded) if decoded is not None else None)
        return Chunks._joined(head, self._offsets[:len(head) + 1],
                              (flat[i:i + CHUNK] for i in range(0, len(flat), CHUNK)))

    def drop(self, n: int) -> Chunks[T]:
        """A new list without its first ``n`` items; copies at most one chunk."""
        if n <= 0:
            return self
        if n >= self._len:
            return Chunks()
        at = bisect.bisect_right(self._offsets, n) - 1
        first = self._chunks[at][n - self._offsets[at]:]
        # offsets[at] <= n < offsets[at + 1]: ``first`` is not empty
        return Chunks._joined((first, *self._chunks[at + 1:]),
                              [0, *(o - n for o in self._offsets[at + 1:])], ())

    def replace(self, changes: dict[int, T]) -> Chunks[T]:
        """A new list with items at the given indexes replaced; copies only their chunks."""
        if not changes:
            return self
        chunks = list(self._chunks)
        by_chunk: dict[int, list[tuple[int, T]]] = {}
        for index, item in changes.items():
            if 0 <= index < self._len:
                at = bisect.bisect_right(self._offsets, index) - 1
                by_chunk.setdefault(at, []).append((index - self._offsets[at], item))
        for at, edits in by_chunk.items():
            old = chunks[at]
            lazy = old if isinstance(old, Lazy) and not old.decoded else None
            chunk = list(lazy.raw if lazy is not None else old)
            for offset, item in edits:
                chunk[offset] = item
            # a chunk not read yet stays so: the new items go in its raw, decoded already
            chunks[at] = Lazy(tuple(chunk), lazy.decode) if lazy is not None else tuple(chunk)
        return Chunks._joined(tuple(chunks), self._offsets, ())  # same lengths


def concat(*parts: Sequence[Any]) -> Chunks[Any]:
    """Chunks of several sequences, re-using the chunks (and offsets) of those that are
    Chunks."""
    out: list[Sequence[Any]] = []
    offsets = [0]
    total = 0
    for part in parts:
        if isinstance(part, Chunks):
            if part._len:
                out.extend(part._chunks)
                offsets.extend([total + o for o in part._offsets[1:]])
                total += part._len
        elif part:
            out.append(tuple(part))
            total += len(part)
            offsets.append(total)
    return Chunks._joined(tuple(out), offsets, ())


__all__ = ["CHUNK", "Chunks", "Lazy", "Peeked", "PeekedSlices", "concat"]
