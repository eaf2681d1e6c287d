"""Views in wire format, maintained incrementally per session (pure, no I/O).

Converting a 10,000-message view to OpenAI's format costs tens of
milliseconds, every call. The guard's cached view (:mod:`shared.core.viewcache`)
keeps the converted history instead, per format asked for, and carries it
along with the view: new messages are converted once, when they arrive; a
placeholder replaces one converted message; a summary drops a prefix. A
prepared view is ``head + history + pending``, the history shared, not copied.

OpenAI's format is one wire message per message, so it is maintained this
way. Anthropic and Gemini join neighbours (tool results into one user
message): their histories are kept as folds (:mod:`shared.core.wirefold`),
finished groups plus the last group's messages, carried the same way.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from shared.core import fastjson
from shared.core.chunks import CHUNK, Chunks, Lazy, PeekedSlices
from shared.core.messages import Message
from shared.core.records import decode_messages
from shared.core.wire.openai import to_openai
from shared.core.wirefold import FOLDED, AnthropicFold, Fold, GeminiFold, fold_of_stored

INCREMENTAL = ("openai", "openai+reasoning")

def _loads(raw: bytes) -> Any:
    return fastjson.loads_message(raw)


class ReadWire(Chunks[dict[str, Any]]):
    """A full read's OpenAI wire forms, with ``made``: per message, the wire form made from
    its JSON in place (a plain message: text, tool calls, no metadata but the store's
    ``wire_ids``), else None. What such a form says is all its stored JSON says to a fold
    (:func:`stored_of_openai`): the view's first Anthropic or Gemini fold does not parse the
    view again. Any change to the view carries it into plain :class:`Chunks` (no hint)."""

    __slots__ = ("made",)
    made: list[dict[str, Any] | None]

    @classmethod
    def of_read(cls, items: Sequence[dict[str, Any]],
                made: list[dict[str, Any] | None]) -> ReadWire:
        out = cls(tuple(tuple(items[i:i + CHUNK]) for i in range(0, len(items), CHUNK)))
        out.made = made
        return out


def stored_of_openai(wire: Mapping[str, Any]) -> dict[str, Any]:
    """A plain stored message's JSON as plain data, back from the OpenAI wire form made of
    it in place (see :class:`ReadWire`; the store's ``wire_ids`` and a response's ``usage``
    left out: no fold reads them)."""
    calls = wire.get("tool_calls") or ()
    data: dict[str, Any] = {
        "role": wire["role"], "content": wire["content"] or "",
        "tool_calls": [{"id": c["id"], "name": c["function"]["name"],
                        "arguments": c["function"]["arguments"]} for c in calls],
        "metadata": {}}
    if "tool_call_id" in wire:
        data["tool_call_id"] = wire["tool_call_id"]
    return data


def load_stored(raw: Sequence[bytes]) -> list[dict[str, Any]]:
    """Stored messages (their JSON) as plain data, without building models."""
    return [_loads(r) for r in raw]


def decode_stored(raw: tuple[Any, ...]) -> tuple[Message, ...]:
    """Items of a lazy history chunk as messages: stored JSON decoded in one pass, messages
    (placeholders) kept."""
    todo = [r for r in raw if isinstance(r, bytes)]
    if not todo:
        return raw
    found = iter(decode_messages(b"[" + b",".join(todo) + b"]"))
    return tuple(next(found) if isinstance(r, bytes) else r for r in raw)


def openai_of_stored(data: Mapping[str, Any], include_reasoning: bool) -> dict[str, Any] | None:
    """The OpenAI wire message of a stored message from its JSON as plain data, exactly as
    :func:`to_openai` would make it; None when that needs the model (media, passthrough
    metadata: the caller converts the message then)."""
    metadata = data.get("metadata")
    if metadata and any(k.startswith("openai_") for k in metadata):
        return None
    role = data["role"]
    content = data.get("content")
    if content is None:
        content = ""
    calls = data.get("tool_calls")
    out: dict[str, Any] = {"role": role}
    if role == "assistant" and calls and content == "":
        out["content"] = None
    elif isinstance(content, str):
        out["content"] = content
    else:
        if any(p.get("type") != "text" for p in content):
            return None
        out["content"] = [{"type": "text", "text": p["text"]} for p in content]
    name = data.get("name")
    if name is not None:
        out["name"] = name
    if calls:
        out["tool_calls"] = [
            {"id": c["id"], "type": "function",
             "function": {"name": c["name"], "arguments": c.get("arguments", "{}")}}
            for c in calls]
    call_id = data.get("tool_call_id")
    if call_id is not None:
        out["tool_call_id"] = call_id
    reasoning = data.get("reasoning")
    if include_reasoning and reasoning is not None:
        out["reasoning_content"] = reasoning
    return out


def convert(fmt: str, messages: Sequence[Any],
            loaded: Sequence[Mapping[str, Any] | None] | None = None) -> list[dict[str, Any]]:
    """Messages in one of the incremental formats, one wire message each.

    Items may be messages or stored JSON (``bytes``, converted without a model
    when it can be; ``loaded``: the same already parsed, index for index)."""
    if fmt not in INCREMENTAL:
        raise ValueError(f"no incremental wire format {fmt!r}")
    reasoning = fmt == "openai+reasoning"
    if not any(isinstance(m, bytes) for m in messages):
        return to_openai(messages, include_reasoning=reasoning)
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        if isinstance(m, bytes):
            data = loaded[i] if loaded is not None else None
            found = openai_of_stored(data if data is not None else _loads(m), reasoning)
            if found is None:
                found = to_openai(decode_stored((m,)), include_reasoning=reasoning)[0]
            out.append(found)
        else:
            out.extend(to_openai([m], include_reasoning=reasoning))
    return out


class Slots(list[dict[str, Any]]):
    """The wire-form slots of a turn in progress, one per message, and the lists
    :func:`convert_kept` made of them so far, per format: the next call of the chain
    starts from that list (a prefix of its own) and looks at its new messages alone."""

    __slots__ = ("made",)

    def __init__(self, slots: Iterable[dict[str, Any]] = (),
                 made: dict[str, list[dict[str, Any]]] | None = None) -> None:
        super().__init__(slots)
        self.made = made if made is not None else {}

    def continued(self, keep: int, new: int) -> Slots:
        """The slots of the turn's next call: this turn's first ``keep`` (and what was
        made of them), then ``new`` empty ones."""
        made = {fmt: found if len(found) <= keep else found[:keep]
                for fmt, found in list(self.made.items())}  # a snapshot, as in carry
        out = Slots((), made)
        out += self if keep == len(self) else self[:keep]
        out += [{} for _ in range(new)]
        return out


def convert_kept(fmt: str, messages: Sequence[Message],
                 kept: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """:func:`convert`, each message's wire form kept in its slot of ``kept`` (the turn in
    progress: a tool chain's prepares convert each of its messages once, not every call;
    with :class:`Slots`, the list the last call made is extended, not walked again)."""
    if len(kept) != len(messages) or fmt not in INCREMENTAL:
        return convert(fmt, messages)
    made = kept.made.get(fmt) if isinstance(kept, Slots) else None
    prefix: list[Any] = made if made is not None and len(made) <= len(messages) else []
    start = len(prefix)
    out = prefix + list(map(dict.get, kept[start:], itertools.repeat(fmt)))  # C speed
    if None in out:  # the new messages of this call: converted once (together), kept
        todo = [i for i in range(start, len(out)) if out[i] is None]
        for i, made_one in zip(todo, convert(fmt, [messages[i] for i in todo]), strict=True):
            out[i] = kept[i][fmt] = made_one
    if isinstance(kept, Slots):
        kept.made[fmt] = out
    return out


def raw_items(chunks: Chunks[Any], start: int = 0) -> list[Any]:
    """The items of ``chunks`` (from ``start`` on) in their stored form where not decoded
    yet (see :class:`Lazy`)."""
    out: list[Any] = []
    at = 0
    for chunk in chunks.chunks:
        size = len(chunk)
        if at + size > start:
            items = chunk.raw if isinstance(chunk, Lazy) and not chunk.decoded else chunk
            out.extend(items[start - at:] if start > at else items)
        at += size
    return out


def carry(wire: Mapping[str, Any], drop: int, changes: Mapping[int, Message],
          new: Sequence[Any], _start_new: int = 0, *,
          kept: Sequence[dict[str, Any]] | None = None,
          history: Sequence[Message] | None = None) -> dict[str, Any]:
    """The wire forms of the next view: ``drop`` first messages gone, ``changes``
    (index after the drop -> message) replaced, ``new`` appended (messages, or their
    stored JSON; ``kept``: their wire forms already made, slot for slot, see
    :func:`convert_kept`). ``history``: the view's messages with the changes made (before
    ``new``), which Anthropic's and Gemini's folds join again around a change."""
    out: dict[str, Any] = {}
    # a snapshot: another thread's view of this session may add a format meanwhile (its
    # lazy conversion); what it adds is made again from this view, when asked
    for fmt, chunks in list(wire.items()):
        if fmt in FOLDED:  # Anthropic, Gemini: extended, the groups of a placeholder joined
            # again, the first ones dropped after a summary; else made again (once) at the
            # next request
            if history is None:
                if drop or changes:
                    continue
                history = ()
            fold = chunks
            if drop:
                fold = fold.drop(drop, history)
            if fold is not None and changes:  # the runs around a change, read alone
                fold = fold.replace(PeekedSlices(history) if isinstance(history, Chunks)
                                    else history, changes)
            if fold is not None:
                slots = (kept if kept is not None and len(kept) == len(new)
                         and not any(isinstance(m, bytes) for m in new) else None)
                out[fmt] = fold.extend(decode_stored(tuple(new)), tuple(slots) if slots else None)
            continue
        items = list(changes.items())
        replaced = dict(zip((i for i, _ in items), convert(fmt, [m for _, m in items]),
                            strict=True))
        made = (convert_kept(fmt, new, kept) if kept is not None and len(kept) == len(new)
                and not any(isinstance(m, bytes) for m in new) else convert(fmt, new))
        out[fmt] = chunks.drop(drop).replace(replaced).extend(made)
    return out


def history_wire(wire: dict[str, Any], fmt: str,
                 applied: Chunks[Message]) -> Chunks[dict[str, Any]]:
    """The cached wire form of ``applied`` in ``fmt``, converted (once) if absent: from the
    stored JSON of messages not decoded yet."""
    found = wire.get(fmt)
    if found is None or len(found) != len(applied):
        found = wire[fmt] = Chunks.of(convert(fmt, raw_items(applied)))
    return found


def history_fold(wire: dict[str, Any], fmt: str, applied: Chunks[Message]) -> Fold:
    """The cached fold of ``applied`` for Anthropic or Gemini (:mod:`shared.core.wirefold`),
    made (once: every message decoded, then dropped) if absent."""
    found = wire.get(fmt)
    if found is None or found.size != len(applied):
        # made from the stored JSON as plain data (the wire forms a full read made in place
        # where it can: not parsed again), the few messages the fold keeps decoded: the
        # cache's chunks stay as they are
        read = wire.get("openai")
        made = read.made if isinstance(read, ReadWire) and len(read) == len(applied) else None
        raw = raw_items(applied)

        def load(i: int) -> Any:
            item, hint = raw[i], made[i] if made is not None else None
            if not isinstance(item, bytes):
                return None
            return _loads(item) if hint is None else stored_of_openai(hint)

        found = wire[fmt] = fold_of_stored(fmt, raw, load, decode_stored)
    assert isinstance(found, AnthropicFold | GeminiFold)
    return found


def flatten(*parts: Sequence[Any]) -> list[Any]:
    """One list from several sequences (a pointer copy at C speed, no conversion)."""
    pieces: list[Any] = []
    for part in parts:
        pieces.extend(part.chunks if isinstance(part, Chunks) else (part,))
    return list(itertools.chain.from_iterable(pieces))


__all__ = ["INCREMENTAL", "ReadWire", "Slots", "carry", "convert", "convert_kept", "decode_stored",
           "flatten", "history_fold", "history_wire", "load_stored", "openai_of_stored",
           "raw_items", "stored_of_openai"]
