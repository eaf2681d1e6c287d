"""Chunks read a few items at a time without decoding the chunks they sit in."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from shared.core.chunks import Chunks, Lazy, PeekedSlices


def decode(raw: tuple[object, ...]) -> tuple[object, ...]:
    return tuple(("d", r) if isinstance(r, bytes) else r for r in raw)


def layout(sizes: list[int], read: list[bool]) -> tuple[Chunks[object], list[object]]:
    """Chunks of the given sizes, lazy ones (some read already) and plain tuples."""
    chunks: list[object] = []
    expected: list[object] = []
    n = 0
    for k, size in enumerate(sizes):
        raw = tuple(str(n + i).encode() for i in range(size))
        n += size
        expected += decode(raw)
        if k % 3 == 2:
            chunks.append(decode(raw))
            continue
        lazy = Lazy(raw, decode)
        if read[k % len(read)]:
            lazy.items()
        chunks.append(lazy)
    return Chunks(tuple(chunks)), expected  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(1, 6), max_size=8), read=st.lists(st.booleans(), min_size=1),
       bounds=st.tuples(st.integers(-3, 50), st.integers(-3, 50)))
def test_peek_range_is_the_slice_and_reads_no_chunk(sizes: list[int], read: list[bool],
                                                    bounds: tuple[int, int]) -> None:
    chunks, expected = layout(sizes, read)
    unread = [c for c in chunks.chunks if isinstance(c, Lazy) and not c.decoded]
    start, stop = bounds
    assert PeekedSlices(chunks)[start:stop] == expected[start:stop]
    assert not any(c.decoded for c in unread)
    if expected:
        assert PeekedSlices(chunks)[len(expected) - 1] == expected[-1]
