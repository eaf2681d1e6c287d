"""Views in wire format, maintained incrementally per session (pure, no I/O).

Converting a 10,000-message view to OpenAI's format costs tens of
milliseconds, every call. The guard's cached view (:mod:`shared.core.viewcache`)
keeps the converted history instead, per format asked for, and carries it
along with the view: new messages are converted once, when they arrive; a
placeholder replaces one converted message; a summary drops a prefix. A
prepared view is ``head + history + pending``, the history shared, not copied.

OpenAI's format is one wire message per message, so it is maintained this
way. Anthropic and Gemini merge neighbours (tool results into one user
message), so their views are converted whole on request (their adapters'
``to_*``); see the README's performance notes.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from shared.core.chunks import Chunks
from shared.core.messages import Message
from shared.core.wire.openai import to_openai

INCREMENTAL = ("openai", "openai+reasoning")


def convert(fmt: str, messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Messages in one of the incremental formats, one wire message each."""
    if fmt not in INCREMENTAL:
        raise ValueError(f"no incremental wire format {fmt!r}")
    return to_openai(messages, include_reasoning=fmt == "openai+reasoning")


def carry(wire: Mapping[str, Chunks[dict[str, Any]]], drop: int, changes: Mapping[int, Message],
          new: Sequence[Message], _start_new: int = 0) -> dict[str, Chunks[dict[str, Any]]]:
    """The wire forms of the next view: ``drop`` first messages gone, ``changes``
    (index after the drop -> message) replaced, ``new`` appended."""
    out: dict[str, Chunks[dict[str, Any]]] = {}
    for fmt, chunks in wire.items():
        items = list(changes.items())
        replaced = dict(zip((i for i, _ in items), convert(fmt, [m for _, m in items]),
                            strict=True))
        out[fmt] = chunks.drop(drop).replace(replaced).extend(convert(fmt, new))
    return out


def history_wire(wire: dict[str, Any], fmt: str,
                 applied: Chunks[Message]) -> Chunks[dict[str, Any]]:
    """The cached wire form of ``applied`` in ``fmt``, converted (once) if absent."""
    found = wire.get(fmt)
    if found is None or len(found) != len(applied):
        found = wire[fmt] = Chunks.of(convert(fmt, applied))
    return found


def flatten(*parts: Sequence[Any]) -> list[Any]:
    """One list from several sequences (a pointer copy at C speed, no conversion)."""
    pieces: list[Any] = []
    for part in parts:
        pieces.extend(part.chunks if isinstance(part, Chunks) else (part,))
    return list(itertools.chain.from_iterable(pieces))


__all__ = ["INCREMENTAL", "carry", "convert", "flatten", "history_wire"]
